"""On a CPU the engine never imports its CUDA path (Triton kernels, graphs, lookahead)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
from pathlib import Path
from mathagent.config import EngineSettings
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.llm_engine import LLMEngine

for eager in (False, True):  # compiled (lazily, never run here), then eager
    settings = EngineSettings(device="cpu", eager=eager, max_batch_size=2, max_seq_len=64,
                              speculative="ngram")
    engine = LLMEngine(EngineConfig.from_settings(settings, "random:tiny"), Path("/nonexistent"))
engine.generate([[1, 2, 3, 1, 2]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
print(sorted(m for m in sys.modules if m.startswith("mathagent.serving.engine.cuda")))
"""


def test_a_cpu_engine_imports_no_cuda_module() -> None:
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
