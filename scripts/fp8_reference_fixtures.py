#!/usr/bin/env python3
"""Golden FP8 checkpoints written by the producers of the published layouts, run here.

Issue 18: the engine loads ``nvidia/*-FP8`` (ModelOpt) and compressed-tensors FP8 checkpoints
as published. This script makes one tiny random Llama, has each producer quantise and export
it with its own code, and records the producer's own forward pass of the quantised model on
fixed tokens (the logits its fake-quantised model computes). The tests
(``tests/serving/engine/test_fp8_reference_checkpoints.py``) load the folders with the engine's
loader and compare. CI does not run this (the fixtures are committed).

Each producer needs its own environment (their pinned transformers versions differ), so one
part runs per call:

- ``--part compressed-tensors``: PyPI ``llmcompressor==0.14.0.1`` (with ``compressed-tensors
  0.19.0``, ``transformers 5.17.0``): ``oneshot`` with ``QuantizationModifier(scheme=...,
  ignore=["lm_head"])`` for the schemes FP8_DYNAMIC (per-channel weights, dynamic per-token
  activations: the "FP8-dynamic" models), FP8 (per-tensor weights, static input scales,
  calibrated) and FP8_BLOCK (128 x 128 weight blocks), then ``save_pretrained(...,
  save_compressed=True)``; the reference logits come from ``transformers`` loading the saved
  folder (compressed-tensors' quantizer: weights decompressed, activations fake-quantised).
- ``--part modelopt``: PyPI ``nvidia-modelopt==0.47.0``: ``mtq.quantize`` with FP8_DEFAULT_CFG
  (per-tensor weights and static input scales), FP8_PER_CHANNEL_PER_TOKEN_CFG, and
  FP8_DEFAULT_CFG with the KV cache quantised and calibrated (``hf_ptq.py --qformat fp8
  --kv_cache_qformat fp8``), calibrated on random tokens, then ``export_hf_checkpoint``; the
  reference logits are the quantised model's own forward before export.

Run (see ``tests/serving/engine/fixtures/fp8/README.md`` for the environments)::

    /tmp/ref/venv/bin/python scripts/fp8_reference_fixtures.py --part compressed-tensors
    PYTHONPATH=/tmp/modelopt/site .venv/bin/python scripts/fp8_reference_fixtures.py --part modelopt
"""

from __future__ import annotations

import argparse
import json
import shutil
from importlib.metadata import version
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

OUT = Path(__file__).resolve().parents[1] / "tests" / "serving" / "engine" / "fixtures" / "fp8"
TOKENS = [5, 17, 99, 3, 42, 7, 64, 120]  # the reference logits' input, one sequence
CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              tie_word_embeddings=False, initializer_range=0.1)  # fmt: skip
# initializer_range 0.1 (not 0.02): logits with real margins between the top two, so a
# comparison of argmaxes is not decided by rounding at near-ties
KEEP = ("config.json", "hf_quant_config.json", "model.safetensors")  # what the tests read


def base_model(folder: Path) -> Path:
    """The tiny random Llama every export starts from (bf16, seed 0)."""
    base = folder / "base"
    if not base.exists():
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(**CONFIG)
        transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(base)
    return base


def logits(model: torch.nn.Module) -> torch.Tensor:
    """The producer's forward (``model`` in float32: its fake-quantised weights and activations),
    so a comparison is of quantisation rules, not of bfloat16 rounding along the way."""
    with torch.no_grad():
        return model(torch.tensor([TOKENS])).logits[0].float().contiguous()


def keep_files(src: Path, dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in KEEP:
        if (src / name).exists():
            shutil.copy(src / name, dest / name)


def compressed_tensors(work: Path) -> dict[str, torch.Tensor]:
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from tokenizers import Tokenizer, models

    # folder -> (scheme, layers left unquantised beside lm_head)
    exports = {
        "fp8_dynamic": ("FP8_DYNAMIC", []),
        "fp8": ("FP8", []),
        "fp8_block": ("FP8_BLOCK", []),
        "fp8_dynamic_ignore_down": ("FP8_DYNAMIC", ["re:.*down_proj"]),  # a mixed checkpoint
        "fp8_dynamic_ignore_k": ("FP8_DYNAMIC", ["re:.*k_proj"]),  # q/k/v parts differ
    }
    base, out = base_model(work), {}
    for label, (scheme, ignore) in exports.items():
        model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
        kwargs = {}
        if scheme == "FP8":  # static input scales: calibrated on random tokens
            vocab = {f"t{i}": i for i in range(CONFIG["vocab_size"])}
            tokenizer = transformers.PreTrainedTokenizerFast(
                tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
                unk_token="t0", pad_token="t0",
            )  # fmt: skip
            g = torch.Generator().manual_seed(1)
            ids = [
                torch.randint(0, CONFIG["vocab_size"], (16,), generator=g).tolist()
                for _ in range(8)
            ]
            data = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 16] * 8})
            kwargs = dict(processor=tokenizer, dataset=data, num_calibration_samples=8,
                          max_seq_length=16)  # fmt: skip
        recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head", *ignore])
        oneshot(model=model.eval(), recipe=recipe, **kwargs)
        model.save_pretrained(work / label, save_compressed=True)
        name = f"compressed-tensors/{label}"
        keep_files(work / label, OUT / name)
        if scheme != "FP8_BLOCK":  # its 128-wide activation groups do not fit hidden 64
            reloaded = transformers.AutoModelForCausalLM.from_pretrained(
                OUT / name, dtype=torch.float32
            ).eval()
            out[name] = logits(reloaded)
    return out


def modelopt(work: Path) -> dict[str, torch.Tensor]:
    import copy

    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    g = torch.Generator().manual_seed(1234)
    calib = [torch.randint(0, CONFIG["vocab_size"], (2, 16), generator=g) for _ in range(4)]

    def forward_loop(m: torch.nn.Module) -> None:
        with torch.no_grad():
            for ids in calib:
                m(input_ids=ids)

    kv = mtq.update_quant_cfg_with_kv_cache_quant(
        copy.deepcopy(mtq.FP8_DEFAULT_CFG), mtq.FP8_KV_CFG["quant_cfg"]
    )
    recipes = {"fp8_default": mtq.FP8_DEFAULT_CFG,
               "fp8_per_channel": mtq.FP8_PER_CHANNEL_PER_TOKEN_CFG,
               "fp8_default_kv": kv}  # fmt: skip
    base, out = base_model(work), {}
    for label, recipe in recipes.items():
        model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
        model = mtq.quantize(model.eval(), copy.deepcopy(recipe), forward_loop)
        name = f"modelopt/{label}"
        out[name] = logits(copy.deepcopy(model).float())  # the export changes the model
        with torch.inference_mode():
            export_hf_checkpoint(model, export_dir=work / label)
        keep_files(work / label, OUT / name)
    return out


PARTS = {
    "compressed-tensors": (compressed_tensors, ("llmcompressor", "compressed-tensors")),
    "modelopt": (modelopt, ("nvidia-modelopt",)),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=list(PARTS), required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp/fp8-reference-work"))
    args = p.parse_args()
    make, packages = PARTS[args.part]
    found = make(args.work)
    # one logits file and one provenance file for both parts: merge with the other part's
    logits_file, provenance_file = OUT / "reference_logits.safetensors", OUT / "provenance.json"
    merged = load_file(str(logits_file)) if logits_file.exists() else {}
    merged.update(found)
    save_file(merged, str(logits_file), metadata={"tokens": json.dumps(TOKENS)})
    provenance = json.loads(provenance_file.read_text()) if provenance_file.exists() else {}
    provenance["tokens"] = TOKENS
    provenance["model"] = {**CONFIG, "seed": 0, "dtype": "bfloat16"}
    provenance[args.part] = {
        "packages": {name: version(name) for name in (*packages, "transformers", "torch")},
        "folders": [f"{args.part}/{d.name}" for d in sorted((OUT / args.part).iterdir())],
    }
    provenance_file.write_text(json.dumps(provenance, indent=1, sort_keys=True) + "\n")
    print(json.dumps(provenance[args.part], indent=1))


if __name__ == "__main__":
    main()
