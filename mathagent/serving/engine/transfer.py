"""Host values onto the device without waiting for the work already queued there."""

from __future__ import annotations

import torch


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` as a tensor on ``device``. On CUDA through pinned memory and a non-blocking
    copy: ``torch.tensor(values, device=cuda)`` copies from pageable memory and waits for the
    stream, so it would stall behind a decode step launched ahead."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
