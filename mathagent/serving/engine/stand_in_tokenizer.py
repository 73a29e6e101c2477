"""A tokenizer used instead of the model's own, as vLLM's ``--tokenizer`` is.

``MATHAGENT_ENGINE__TOKENIZER``: a random-weight shape has no tokenizer, so without one it takes
token ids only; with, it serves text and chat requests (the 8B rows of
``benchmarks/bench_table.py`` use the default model's). Ids the tokenizer does not know (a random
shape's vocabulary may be larger) decode to nothing, and prompt ids outside the model's
vocabulary are refused per request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mathagent.serving.engine.loader import TOKENIZER_FILES, ModelLoadError, resolve_folder


def load_tokenizer(spec: str, model_dir: Path) -> Any:
    """The tokenizer of ``spec``: a folder holding one, or a model folder or .gguf (converted
    into ``model_dir`` as for models)."""
    path = Path(spec).expanduser()
    if not (path.is_dir() or (path.is_file() and path.suffix == ".gguf")):
        raise ModelLoadError(f"tokenizer {spec!r}: not a folder or a .gguf file")
    folder = path if path.is_dir() else resolve_folder(spec, model_dir)[0]
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ModelLoadError(
            f"tokenizer {spec!r}: {folder} has none of {', '.join(TOKENIZER_FILES)}"
        )
    from transformers import AutoTokenizer  # lazily: transformers is slow to import

    return AutoTokenizer.from_pretrained(folder)
