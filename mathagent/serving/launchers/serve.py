"""``mathagent serve`` for external engines: preset + overrides → launch plan → run or print.

The CLI builds one :class:`ServeRequest`; :func:`resolve_preset` applies its overrides to the
named preset (or builds a custom one from ``--model`` and ``--speculative``) and re-validates
it, :func:`build_plan` renders it for the engine, :func:`run_plan` runs it in the foreground.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from mathagent.serving.engine.spec_config import SpecMethod, SpecMethodError
from mathagent.serving.launchers import releases, sglang, trtllm, vllm
from mathagent.serving.launchers.plan import LaunchPlan, run_steps, server_process
from mathagent.serving.launchers.presets import Method, ServePreset, get_preset
from mathagent.serving.launchers.process import ServeError, install_hint, serve_foreground


class ServeRequest(BaseModel):
    """Everything ``mathagent serve --engine trtllm|vllm|sglang`` was asked for."""

    engine: Literal["trtllm", "vllm", "sglang"]
    preset: str | None = None
    model: str | None = None
    speculative: str | None = None
    tp_size: int | None = Field(None, ge=1)
    max_draft_len: int | None = Field(None, ge=1)
    host: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    nodes: list[str] = []
    interfaces: list[str] = []
    iter_stats: bool = False
    trtllm_version: str | None = None
    launcher: Literal["native", "docker"] = "native"
    image: str | None = None
    examples_dir: str = trtllm.DEFAULT_EXAMPLES
    calib_dataset: str | None = None
    out: Path
    health_timeout_s: float = Field(1800.0, gt=0)


def resolve_preset(req: ServeRequest) -> ServePreset:
    """The preset with the request's overrides applied, validated again as a whole."""
    if req.preset is not None:
        data = get_preset(req.preset).model_dump()
    elif req.model is None:
        raise ValueError("name a --preset, or a --model to serve (with --speculative)")
    else:
        data = {"name": "custom", "summary": f"{req.model} as asked on the command line"}
        data["model"] = req.model
    if req.model is not None:
        data["model"] = req.model
        if data.get("build") and Path(req.model).is_dir():
            data["build"]["model_dir"] = req.model  # a local checkpoint needs no download
    for key in ("tp_size", "host", "port"):
        if getattr(req, key) is not None:
            data[key] = getattr(req, key)
    if req.speculative is not None:
        _apply_speculative(data, req.speculative)
    spec = data.get("speculation")
    if spec is not None and req.max_draft_len is not None:
        spec["max_draft_len"] = req.max_draft_len
    if req.iter_stats and data.get("backend", "pytorch") == "pytorch":
        data.setdefault("options", {})["enable_iter_perf_stats"] = True
    _apply_cluster(data, req)
    if data.get("build") and req.calib_dataset:
        data["build"]["calib_dataset"] = str(Path(req.calib_dataset).expanduser().resolve())
    if data.get("build") and not data["build"].get("calib_dataset"):
        raise ValueError(
            "a ReDrafter build needs --calib-dataset PATH: the FP8 calibration set, either a "
            "dataset folder or a JSONL of problem/generated_solution rows (OpenMathReasoning "
            "'tir', as the recipe uses) that a first step turns into one"
        )
    return ServePreset.model_validate(data)


def _apply_speculative(data: dict, value: str) -> None:
    """A ``--speculative`` value (the engine's grammar, :mod:`spec_config`) onto the preset data."""
    try:
        method = SpecMethod.parse(value)
    except SpecMethodError as exc:
        raise ValueError(f"--speculative: {exc}") from exc
    kind, path = method.kind, method.path or ""
    current = data.get("speculation") or {}
    if data.get("build") and kind != "redrafter":
        raise ValueError(
            f"{data['name']} is ReDrafter's engine path: pick another preset for {kind}"
        )
    if kind == "none":
        data["speculation"] = None
        return
    draft_len = current.get("max_draft_len", 3)
    if kind == "ngram":
        data["speculation"] = {"method": Method.ngram, "max_draft_len": draft_len}
        data["speculation"]["max_matching_ngram_size"] = 3
        return
    if kind == "redrafter":
        _apply_redrafter(data, path, draft_len)
        return
    methods = {"draft": Method.draft_target, "eagle3": Method.eagle3}
    target = (
        current.get("method")
        if kind == "draft" and current.get("method") in methods.values()
        else methods[kind]
    )
    # A folder the user names replaces the preset's hub id and download target.
    data["speculation"] = {"method": target, "max_draft_len": draft_len, "draft_dir": path}
    data.setdefault("kv_cache", {})["enable_block_reuse"] = False
    if target is Method.draft_target and data["name"] == "custom":
        data.setdefault("options", {})["disable_overlap_scheduler"] = True


def _apply_redrafter(data: dict, path: str, draft_len: int) -> None:
    if data.get("build"):
        data["build"]["drafter_dir"] = path
        return
    model = data["model"]
    data.update(backend="tensorrt", kv_cache={}, options={})
    data["speculation"] = {"method": Method.redrafter, "max_draft_len": draft_len}
    data["build"] = {"model_dir": model, "drafter_dir": path, "calib_dataset": None}


def _apply_cluster(data: dict, req: ServeRequest) -> None:
    if not req.nodes and not req.interfaces:
        return
    cluster = data.get("cluster") or {}
    hosts = req.nodes or cluster.get("hosts")
    interfaces = req.interfaces or cluster.get("interfaces")
    if not hosts or not interfaces:
        raise ValueError("a multi-node launch needs both --nodes and --interfaces")
    data["cluster"] = {"hosts": hosts, "interfaces": interfaces}


def build_plan(req: ServeRequest, preset: ServePreset) -> tuple[LaunchPlan, list[str]]:
    """The engine's plan for ``preset`` plus lines describing the choices made."""
    info: list[str] = []
    if req.engine == "trtllm":
        release, source = releases.resolve(preset, req.trtllm_version, req.image)
        info.append(f"TensorRT-LLM {release.line} ({source}): image {release.image}")
        plan = trtllm.plan(
            preset, release=release, out=req.out, launcher=req.launcher, image=req.image,
            examples=req.examples_dir,
        )  # fmt: skip
    else:
        if req.launcher == "docker":
            raise ValueError(
                "--launcher docker runs the NGC TensorRT-LLM image: use --engine trtllm"
            )
        if req.trtllm_version or req.image:
            raise ValueError("--trtllm-version and --image are for --engine trtllm")
        plan = vllm.plan(preset) if req.engine == "vllm" else sglang.plan(preset)
        plan.files[req.out.resolve() / "launch.sh"] = plan.script()
    if (
        preset.build is not None
        and not (trtllm.redrafter_engine_dir(preset, req.out) / "config.json").exists()
    ):
        plan.requires[preset.build.drafter_dir] = (
            "the ReDrafter drafter is missing: train it with mathagent train-drafter "
            f"--out {preset.build.drafter_dir} (or pass --speculative redrafter:PATH)"
        )
    return plan, info


def run_plan(plan: LaunchPlan, echo: Callable[[str], None], health_timeout_s: float) -> int:
    """Run the steps, start the server, wait for health, serve until Ctrl-C/SIGTERM."""
    if not plan.runnable:
        raise ServeError("this launch spans several machines: use --dry-run and run its commands")
    if plan.server is not None and shutil.which(plan.server.argv[0]) is None:
        # Before any download or build: a missing engine should cost seconds, not hours.
        raise ServeError(
            f"{plan.server.argv[0]} not found on PATH: {install_hint(plan.server.argv[0])}"
        )
    for path, message in plan.requires.items():
        if not Path(path).exists():
            raise ServeError(message)
    run_steps(plan, echo)
    return serve_foreground(server_process(plan, health_timeout_s), echo)
