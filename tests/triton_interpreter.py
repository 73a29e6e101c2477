"""Triton's interpreter for test runs on a host without CUDA.

The CUDA path's Triton kernels (products, attention, the chain step's glue) otherwise run only
on the device machine, a few minutes a session. With ``TRITON_INTERPRET=1`` set before any
kernel is defined (``triton.jit`` reads it then), the same kernels run on CPU tensors, one
program after another in NumPy, so the CPU suite holds them to their PyTorch forms on every
commit. What the interpreter cannot check: speed, the order of memory operations between
programs or threads, CUDA graphs and programmatic dependent launch.

Triton 3.6's interpreter gets three things wrong that the kernels rely on; :func:`enable`
corrects them in this process (torch does the float conversions, as the GPU rounds them).
"""

from __future__ import annotations

import os

import numpy as np
import torch


def enable() -> None:
    """Turn the interpreter on where no CUDA device is; call before any kernel module is
    imported (tests/conftest.py does)."""
    if torch.cuda.is_available():
        return
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        from triton.runtime import interpreter
    except ImportError:  # no Triton installed: the kernel tests skip
        return
    if getattr(interpreter, "corrected_for_mathagent", False):
        return
    _loop_bounds_from_one_element_arrays(interpreter)
    _float_casts_round_to_nearest(interpreter)
    _narrow_float_dots_in_float32(interpreter)
    interpreter.corrected_for_mathagent = True


def interpreting() -> bool:
    """Whether Triton kernels run interpreted, on CPU tensors, in this process."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()


def _loop_bounds_from_one_element_arrays(interpreter) -> None:
    # A scalar kernel argument is a one-element array, given to range() through int(array),
    # which NumPy 2.4 refuses ("only 0-dimensional arrays can be converted to Python
    # scalars"): a loop over a runtime bound failed. Read the element.
    patch = interpreter._patch_lang_tensor

    def patched(tensor, scope) -> None:
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


def _torch_dtypes(tl) -> dict:
    return {tl.float32: torch.float32, tl.bfloat16: torch.bfloat16, tl.float16: torch.float16,
            tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}  # fmt: skip


def _as_torch(handle, dtype: torch.dtype) -> torch.Tensor:
    # the interpreter keeps 8- and 16-bit floats as their unsigned bits
    data = np.ascontiguousarray(handle.data)
    if dtype.itemsize == 4:
        return torch.from_numpy(data.astype(np.float32, copy=False))
    bits = data.view(np.uint8 if dtype.itemsize == 1 else np.int16)
    return torch.from_numpy(bits.copy()).view(dtype)


def _as_data(tensor: torch.Tensor) -> np.ndarray:
    """The interpreter's form of ``tensor``: float32 as it is, narrower floats as their bits."""
    if tensor.dtype == torch.float32:
        return tensor.numpy()
    wide = tensor.dtype.itemsize == 2
    bits = tensor.view(torch.int16 if wide else torch.uint8).numpy()
    return bits.view(np.uint16) if wide else bits


def _float_casts_round_to_nearest(interpreter) -> None:
    # Narrowing casts truncated (float32 -> bfloat16), and the round-to-nearest mode lost the
    # carry into the exponent (0.4999 became 0.25). The kernels round where the eager model
    # does, to give its bits, so every cast between float types goes through torch here.
    builder, tl = interpreter.InterpreterBuilder, interpreter.tl
    types = _torch_dtypes(tl)
    cast, to_fp = builder.cast_impl, builder.create_fp_to_fp

    def converted(src, dst_type):
        a, b = types.get(src.dtype.scalar), types.get(dst_type.scalar)
        if a is None or b is None or a == b:
            return None
        data = _as_data(_as_torch(src, a).to(b)).reshape(np.shape(src.data))
        return interpreter.TensorHandle(data, dst_type.scalar)

    def cast_impl(self, src, dst_type):
        out = converted(src, dst_type)
        return cast(self, src, dst_type) if out is None else out

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        out = converted(src, dst_type)
        return to_fp(self, src, dst_type, rounding_mode) if out is None else out

    builder.cast_impl, builder.create_fp_to_fp = cast_impl, create_fp_to_fp


def _narrow_float_dots_in_float32(interpreter) -> None:
    # tl.dot multiplied bfloat16 operands' bits as integers (fp8 it widened to fp16, through
    # the same faulty conversion): widen every narrow float to float32, what the tensor cores
    # accumulate in.
    builder, tl = interpreter.InterpreterBuilder, interpreter.tl
    types = _torch_dtypes(tl)
    dot = builder.create_dot

    def widened(handle):
        dtype = types.get(handle.dtype.scalar)
        if dtype is None or dtype == torch.float32:
            return handle
        data = _as_torch(handle, dtype).float().numpy().reshape(np.shape(handle.data))
        return interpreter.TensorHandle(data, tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return dot(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot
