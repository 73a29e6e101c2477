"""Static FP8 activation scales for weights quantised at load (``fp8_activation_scales``
"calibrate"): ModelOpt's "max" calibration.

One forward of the model over :data:`CALIBRATION_TEXT` (where it has a tokenizer) and
:data:`CALIBRATION_RANDOM` random ids, with per-token activation scales meanwhile; each
:class:`~mathagent.serving.engine.quant.Fp8Linear` then takes ``max |input| / 448`` as its one
static input scale, the rule published FP8 checkpoints' ``input_scale`` follows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mathagent.serving.engine import fp8_format
from mathagent.serving.engine.kv_cache import KVCache
from mathagent.serving.engine.model import ForwardContext, Transformer, rope_table
from mathagent.serving.engine.quant import Fp8Linear, QuantizationError

CALIBRATION_TEXT = (
    "Problem: Let x and y be positive real numbers with x + y = 10 and xy = 21. Find x^2 + y^2.\n"
    "Solution: (x + y)^2 = x^2 + 2xy + y^2, so x^2 + y^2 = 100 - 42 = 58. The answer is 58.\n"
    "```python\nfrom sympy import symbols, solve\nx = symbols('x')\n"
    "print(solve(x**2 - 10*x + 21, x))\n```\n```output\n[3, 7]\n```\n"
    "How many integers n with 1 <= n <= 1000 are divisible by 7 but not by 11? Count: 142 - 12 = "
    "130. Therefore the final answer is \\boxed{130}."
)
CALIBRATION_RANDOM = 256  # random token ids (fixed seed), a sequence of their own


def calibrate(model: Transformer, tokenizer: object | None, dtype: torch.dtype) -> int:
    """Give ``model``'s FP8 products static input scales from the calibration forward;
    returns how many were calibrated."""
    device, args = next(model.parameters()).device, model.args
    seqs = [torch.randint(0, args.vocab_size, (CALIBRATION_RANDOM,),
                          generator=torch.Generator().manual_seed(0))]  # fmt: skip
    if tokenizer is not None:
        seqs.insert(0, torch.tensor(tokenizer(CALIBRATION_TEXT)["input_ids"]))

    def forward() -> None:
        for ids in seqs:
            n = len(ids)
            cache = KVCache(args.num_layers, 1, args.num_kv_heads, n, args.head_dim, dtype, device)
            cos, sin = (t.to(device=device, dtype=dtype) for t in rope_table(args, n))
            pos = torch.arange(n, device=device)[None]
            ctx = ForwardContext(cache=cache, rows=cache.rows([0], pos, n), attn_mask=None,
                                 is_causal=True, cos=cos[pos][:, :, None],
                                 sin=sin[pos][:, :, None])  # fmt: skip
            model.logits(model(ids.to(device)[None], ctx))  # the head too (fp8_head)

    return max_calibration(model, forward)


def max_calibration(model: nn.Module, forward: Callable[[], object]) -> int:
    """Give every :class:`Fp8Linear` of ``model`` a static input scale: the largest ``|x|`` its
    input reached while ``forward()`` ran the model (per-token scales meanwhile), over 448.
    Returns how many were calibrated."""
    amax: dict[Fp8Linear, torch.Tensor] = {}

    def record(module: Fp8Linear, args: tuple[torch.Tensor, ...]) -> None:
        seen = args[0].detach().abs().amax().float()
        amax[module] = torch.maximum(amax[module], seen) if module in amax else seen

    linears = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    hooks = [m.register_forward_pre_hook(record) for m in linears]
    try:
        with torch.no_grad():
            for m in linears:
                m.input_scale = None
            forward()
    finally:
        for hook in hooks:
            hook.remove()
    for m in linears:
        if m not in amax:
            raise QuantizationError("fp8 calibration: a quantised linear saw no input")
        m.input_scale = fp8_format.row_scales(amax[m]).reshape(1)
    return len(linears)
