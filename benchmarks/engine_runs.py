"""The engine configurations the benchmarks name: one table from a run's name to its settings.

``fp32`` and ``bf16`` (``none``: bf16, as fp8_bench.py's JSON names it), ``fp8`` (per-token
activation scales), ``fp8-static`` (static input scales calibrated at load) and
``fp8-static-head`` (and the vocabulary head in FP8). In-process benchmarks build an
``LLMEngine`` from them (:func:`engine`); server rows put them in the environment (:func:`env`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mathagent.serving.engine.llm_engine import LLMEngine

_BF16 = {"dtype": "bfloat16", "quantization": "none"}
_STATIC = {"dtype": "bfloat16", "quantization": "fp8", "fp8_activation_scales": "calibrate"}
RUNS: dict[str, dict[str, str | bool]] = {
    "fp32": {"dtype": "float32", "quantization": "none"},
    "bf16": _BF16,
    "none": _BF16,
    "fp8": {"dtype": "bfloat16", "quantization": "fp8"},
    "fp8-static": _STATIC,
    "fp8-static-head": {**_STATIC, "fp8_head": True},
}


def settings(run: str) -> dict[str, str | bool]:
    """The ``EngineSettings`` fields ``run`` sets."""
    if run not in RUNS:
        raise SystemExit(f"run {run!r}: must be one of {', '.join(RUNS)}")
    return RUNS[run]


def env(run: str) -> dict[str, str]:
    """``run``'s settings as a server reads them: ``MATHAGENT_ENGINE__*`` variables."""
    return {
        f"MATHAGENT_ENGINE__{key.upper()}": str(value).lower() if isinstance(value, bool) else value
        for key, value in settings(run).items()
    }


def engine(run: str, shape: str, max_batch_size: int = 1, max_seq_len: int = 1024) -> LLMEngine:
    """An ``LLMEngine`` on the GPU for ``run`` over the random-weight model ``shape``."""
    from mathagent.config import EngineSettings
    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.llm_engine import LLMEngine

    engine_settings = EngineSettings(device="cuda", max_batch_size=max_batch_size,
                                     max_seq_len=max_seq_len, eager=False, **settings(run))  # fmt: skip
    return LLMEngine(EngineConfig.from_settings(engine_settings, f"random:{shape}"), Path("/tmp"))
