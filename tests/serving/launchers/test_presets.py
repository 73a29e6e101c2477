"""The presets validate, each documented constraint rejects a bad config, overrides apply."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from mathagent.serving.launchers.presets import PRESETS, Cluster, Method, ServePreset, get_preset
from mathagent.serving.launchers.serve import ServeRequest, resolve_preset

NAMES = [
    "gpt-oss-120b-eagle3",
    "llama3.3-70b-fp4-draft-target",
    "qwen3-235b-eagle3-tp2",
    "openmath-14b-fp8-redrafter",
    "openmath-14b-ngram",
]


def _with(name: str, **changes) -> ServePreset:
    """Re-validate a preset with some fields changed (model_copy alone does not validate)."""
    data = PRESETS[name].model_dump()
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        target = data
        for key in parents:
            target = target[key]
        target[leaf] = value
    return ServePreset.model_validate(data)


def test_the_presets_exist_and_validate():
    assert list(PRESETS) == NAMES
    for preset in PRESETS.values():
        assert ServePreset.model_validate(preset.model_dump()) == preset


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(KeyError, match="gpt-oss-120b-eagle3"):
        get_preset("nope")


def test_preset_values():
    redrafter = PRESETS["openmath-14b-fp8-redrafter"]
    assert redrafter.speculation.max_draft_len == 3
    assert redrafter.speculation.num_beams == 1
    assert redrafter.build.drafter_layers == 2
    assert redrafter.tp_size == 2
    qwen = PRESETS["qwen3-235b-eagle3-tp2"]
    assert (qwen.port, qwen.host, qwen.max_num_tokens) == (8355, "0.0.0.0", 1024)


def test_ngram_needs_max_matching_ngram_size():
    ngram = {"method": "ngram", "max_draft_len": 4, "max_matching_ngram_size": 0}
    with pytest.raises(ValidationError, match="max_matching_ngram_size > 0"):
        ServePreset(name="x", summary="x", model="m", speculation=ngram)
    ngram["max_matching_ngram_size"] = 2
    assert (
        ServePreset(name="x", summary="x", model="m", speculation=ngram).speculation.method
        is Method.ngram
    )


def test_draft_target_needs_pytorch_backend():
    with pytest.raises(ValidationError, match="needs the pytorch backend"):
        _with("llama3.3-70b-fp4-draft-target", backend="tensorrt")


def test_draft_target_needs_a_draft_model():
    with pytest.raises(ValidationError, match="needs a draft model"):
        _with(
            "llama3.3-70b-fp4-draft-target",
            speculation__draft_repo=None,
            speculation__draft_dir=None,
        )


@pytest.mark.parametrize("name", ["gpt-oss-120b-eagle3", "llama3.3-70b-fp4-draft-target"])
@pytest.mark.parametrize("reuse", [True, None])
def test_two_model_modes_need_block_reuse_off(name, reuse):
    with pytest.raises(ValidationError, match="enable_block_reuse false"):
        _with(name, kv_cache__enable_block_reuse=reuse)


def test_redrafter_exists_only_on_the_engine_path():
    with pytest.raises(ValidationError, match="only on TensorRT-LLM's engine path"):
        _with("openmath-14b-fp8-redrafter", backend="pytorch")
    with pytest.raises(ValidationError, match="only on TensorRT-LLM's engine path"):
        _with("openmath-14b-fp8-redrafter", build=None)


def test_multi_node_tp_must_cover_the_nodes():
    with pytest.raises(ValidationError, match="multiple of the 2 nodes"):
        _with("qwen3-235b-eagle3-tp2", tp_size=3)
    with pytest.raises(ValidationError):
        Cluster(hosts=["only-one"], interfaces=["eth0"])


def test_limits_are_checked():
    with pytest.raises(ValidationError):
        _with("gpt-oss-120b-eagle3", kv_cache__free_gpu_memory_fraction=1.5)
    with pytest.raises(ValidationError):
        _with("gpt-oss-120b-eagle3", speculation__max_draft_len=0)
    with pytest.raises(ValidationError):
        ServePreset(name="x", summary="x", model="m", unknown_key=1)


# -- overrides from the command line ------------------------------------------------------------
def _request(**kwargs) -> ServeRequest:
    return ServeRequest(engine=kwargs.pop("engine", "trtllm"), out=Path("/tmp/x"), **kwargs)


def test_overrides_apply_and_revalidate():
    preset = resolve_preset(
        _request(
            preset="gpt-oss-120b-eagle3", tp_size=4, max_draft_len=3, port=9000, iter_stats=True
        )
    )
    assert (preset.tp_size, preset.speculation.max_draft_len, preset.port) == (4, 3, 9000)
    assert preset.options.enable_iter_perf_stats is True
    with pytest.raises(ValidationError):
        resolve_preset(_request(preset="gpt-oss-120b-eagle3", max_draft_len=100))


def test_speculative_draft_path_replaces_the_presets_draft():
    preset = resolve_preset(
        _request(preset="gpt-oss-120b-eagle3", speculative="draft:/models/head")
    )
    assert preset.speculation.method is Method.eagle3
    assert (preset.speculation.draft_dir, preset.speculation.draft_repo) == ("/models/head", None)


def test_custom_model_with_each_speculative_kind():
    draft = resolve_preset(_request(model="/m", speculative="draft:/d"))
    assert draft.speculation.method is Method.draft_target
    assert draft.kv_cache.enable_block_reuse is False
    assert draft.options.disable_overlap_scheduler is True
    ngram = resolve_preset(_request(model="/m", speculative="ngram"))
    assert ngram.speculation.max_matching_ngram_size > 0
    with pytest.raises(ValueError, match="--calib-dataset"):
        resolve_preset(_request(model="/m", speculative="redrafter:/r"))
    redrafter = resolve_preset(_request(model="/m", speculative="redrafter:/r", calib_dataset="/c"))
    assert (redrafter.backend, redrafter.build.drafter_dir) == ("tensorrt", "/r")
    assert redrafter.build.calib_dataset == "/c"
    assert resolve_preset(_request(model="/m", speculative="none")).speculation is None


@pytest.mark.parametrize("bad", ["draft", "medusa:/x", "eagle3:"])
def test_bad_speculative_values_are_rejected(bad):
    with pytest.raises(ValueError, match="--speculative"):
        resolve_preset(_request(model="/m", speculative=bad))


@pytest.mark.parametrize("kind", ["none", "ngram", "draft:/d"])
def test_the_redrafter_preset_keeps_redrafter(kind):
    with pytest.raises(ValueError, match="ReDrafter's engine path"):
        resolve_preset(_request(preset="openmath-14b-fp8-redrafter", speculative=kind))
    preset = resolve_preset(
        _request(
            preset="openmath-14b-fp8-redrafter", speculative="redrafter:/r", calib_dataset="/c"
        )
    )
    assert preset.build.drafter_dir == "/r"


def test_redrafter_calibration_set_is_required_and_resolved(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="--calib-dataset PATH"):
        resolve_preset(_request(preset="openmath-14b-fp8-redrafter"))
    monkeypatch.chdir(tmp_path)
    preset = resolve_preset(
        _request(preset="openmath-14b-fp8-redrafter", calib_dataset="omr.jsonl")
    )
    assert preset.build.calib_dataset == str(tmp_path / "omr.jsonl")


def test_preset_or_model_is_required():
    with pytest.raises(ValueError, match="--preset"):
        resolve_preset(_request())


def test_iter_stats_is_not_written_for_the_engine_path():
    preset = resolve_preset(
        _request(preset="openmath-14b-fp8-redrafter", iter_stats=True, calib_dataset="/c.jsonl")
    )
    assert preset.options.enable_iter_perf_stats is None  # the TensorRT backend always keeps them


def test_nodes_and_interfaces_override_the_cluster():
    preset = resolve_preset(
        _request(preset="qwen3-235b-eagle3-tp2", nodes=["a", "b"], interfaces=["eth1"])
    )
    assert preset.cluster == Cluster(hosts=["a", "b"], interfaces=["eth1"])
    with pytest.raises(ValueError, match="--interfaces"):
        resolve_preset(_request(preset="gpt-oss-120b-eagle3", nodes=["a", "b"]))
