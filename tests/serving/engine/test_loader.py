"""Loaders: clear errors for unknown models, architectures matching transformers, GGUF cache."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from mathagent.config import EngineSettings, Settings
from mathagent.serving.engine.config import EngineConfig, EngineConfigError
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.loader import ModelLoadError, load_model, resolve_folder
from mathagent.serving.engine.model import UnsupportedModelError
from mathagent.serving.engine.sampling_params import SamplingParams

CPU, F32 = torch.device("cpu"), torch.float32


def test_unknown_path_names_what_is_supported(tmp_path):
    with pytest.raises(ModelLoadError) as info:
        load_model(str(tmp_path / "nope"), tmp_path, CPU, F32)
    message = str(info.value)
    assert "LlamaForCausalLM" in message and ".gguf" in message and "random:" in message


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UnsupportedModelError, match="Qwen2ForCausalLM"):
        load_model(str(tmp_path), tmp_path, CPU, F32)


def test_unknown_random_shape(tmp_path):
    with pytest.raises(ModelLoadError, match="llama-3-8b"):
        load_model("random:huge", tmp_path, CPU, F32)


def test_unknown_speculative_method_is_refused():
    with pytest.raises(EngineConfigError, match="ngram"):
        EngineConfig.from_settings(EngineSettings(speculative="medusa"))
    assert EngineConfig.from_settings(EngineSettings(speculative="ngram")).speculative == "ngram"


def test_a_cpu_engine_stays_eager_when_told_to_compile(caplog):
    # compiled, the CPU int4 step took ~0.3-1 s a token against 10 ms eager (2026-12-04)
    with caplog.at_level("WARNING"):
        config = EngineConfig.from_settings(EngineSettings(device="cpu", eager=False))
    assert config.eager and "stays eager" in caplog.text
    assert EngineConfig.from_settings(EngineSettings(device="cpu", eager="auto")).eager


def test_gguf_conversion_is_cached(default_model):
    settings = Settings()
    folder, name = resolve_folder(default_model, settings.model_dir)
    assert name == "SmolLM2-135M-Instruct"
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    start = time.perf_counter()
    assert resolve_folder(default_model, settings.model_dir)[0] == folder
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("arch", ["Llama", "Qwen2", "Qwen3"])
def test_architecture_matches_transformers(tmp_path, arch):
    """A small random HF model of each family: same greedy tokens through our loader."""
    import transformers

    cfg_cls = getattr(transformers, f"{arch}Config")
    model_cls = getattr(transformers, f"{arch}ForCausalLM")
    extra = {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
             "high_freq_factor": 4.0, "original_max_position_embeddings": 64}} if arch == "Llama" else {}  # fmt: skip
    cfg = cfg_cls(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=512, tie_word_embeddings=arch != "Llama", **extra)  # fmt: skip
    torch.manual_seed(0)
    hf = model_cls(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases so every feature is exercised
        for name, p in hf.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.3)
    hf.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), tmp_path, CPU, F32)

    config = EngineConfig.from_settings(EngineSettings(device="cpu", max_seq_len=256), None)
    engine = LLMEngine(config, tmp_path, loaded)
    prompt = [5, 17, 99, 3, 42, 7]
    (ours,) = engine.generate(
        [prompt], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    )
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=20, min_new_tokens=20, do_sample=False)
    assert ours.token_ids == ref[0, len(prompt) :].tolist()


def test_random_shape_runs():
    config = EngineConfig.from_settings(
        EngineSettings(device="cpu", max_seq_len=128),
        "random:tiny",
    )
    engine = LLMEngine(config, Settings().model_dir)
    (res,) = engine.generate(
        [[1, 2, 3]], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    )
    assert len(res.token_ids) == 5 and res.text == ""


def test_cli_generate_json(clean_env):
    clean_env.setenv("MATHAGENT_ENGINE__DEVICE", "cpu")
    clean_env.setenv("MATHAGENT_ENGINE__MAX_SEQ_LEN", "256")
    clean_env.setenv("MATHAGENT_ENGINE__THREADS", "2")
    cmd = [sys.executable, "-m", "mathagent", "generate", "The capital of France is",
           "--max-tokens", "6", "--json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out) == {"text", "tokens", "tokens_per_s", "acceptance_length"}
    assert "Paris" in out["text"] and out["acceptance_length"] == 1.0
    bad = subprocess.run([*cmd[:5], "--model", "/no/such/model"], capture_output=True, text=True)
    assert bad.returncode != 0 and "supported" in bad.stderr
