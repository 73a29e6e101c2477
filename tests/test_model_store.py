"""The default model fetch yields a GGUF that the gguf package can open."""

from __future__ import annotations

import pytest

from mathagent.config import Settings
from mathagent.model_store import DEFAULT_GGUF_NAME, fetch_default_model


@pytest.fixture(scope="module")
def default_gguf():
    return fetch_default_model(Settings().model_dir)


def test_fetch_is_idempotent(default_gguf):
    again = fetch_default_model(default_gguf.parent)
    assert again == default_gguf
    assert again.name == DEFAULT_GGUF_NAME


def test_gguf_opens_and_is_llama(default_gguf):
    from gguf import GGUFReader

    reader = GGUFReader(default_gguf)
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "llama"
    names = {t.name for t in reader.tensors}
    assert "token_embd.weight" in names
    assert any(n.startswith("blk.29.") for n in names)  # SmolLM2-135M has 30 layers
