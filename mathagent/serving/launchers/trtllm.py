"""TensorRT-LLM launcher: the ``--extra_llm_api_options`` YAML and every command line.

Two spelling families exist. TensorRT-LLM 1.0/1.1 writes EAGLE-3 as ``decoding_type: Eagle``
with ``speculative_model_dir``; 1.2+ writes ``decoding_type: Eagle3`` with
``speculative_model`` (the old key stays an alias there). The family is the one the user names,
else the one the docker image's tag carries, else the installed ``tensorrt_llm``, else 1.2.
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex
from enum import StrEnum
from pathlib import Path

import yaml

from mathagent.serving.launchers import ngc
from mathagent.serving.launchers.plan import LaunchPlan, Step, health_url
from mathagent.serving.launchers.presets import Method, ServePreset

YAML_NAME = "extra-llm-api-config.yml"
HOSTFILE_NAME = "openmpi-hostfile"
DEFAULT_EXAMPLES = "/app/tensorrt_llm/examples"  # where the NGC release image keeps them


class Family(StrEnum):
    """TensorRT-LLM version families that spell the LLM API YAML differently."""

    v1_0 = "1.0"  # 1.0 and 1.1
    v1_2 = "1.2"  # 1.2 and later


def family_of(version: str) -> Family:
    """The spelling family of a TensorRT-LLM version string such as ``1.1.0`` or ``1.2.0rc6``."""
    match = re.match(r"\s*v?(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a TensorRT-LLM version: {version!r}")
    major, minor = int(match[1]), int(match[2])
    if major < 1:
        raise ValueError(f"TensorRT-LLM {version} is older than 1.0, which these presets need")
    return Family.v1_0 if (major, minor) < (1, 2) else Family.v1_2


def installed_version() -> str | None:
    """The installed ``tensorrt_llm`` version, read from package metadata (no import, no GPU)."""
    for dist in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def resolve_family(requested: str | None, image: str | None = None) -> tuple[Family, str]:
    """The family to render for, and where that choice came from (for the user)."""
    if requested:
        return family_of(requested), f"--trtllm-version {requested}"
    if image and ":" in image:
        tag = image.rsplit(":", 1)[1]
        if re.match(r"\d+\.\d+", tag):
            return family_of(tag), f"image tag {tag}"
    found = installed_version()
    if found:
        return family_of(found), f"installed tensorrt_llm {found}"
    return Family.v1_2, "default (TensorRT-LLM is not installed here)"


# -- YAML -------------------------------------------------------------------------------------
def llm_api_options(preset: ServePreset, family: Family) -> dict:
    """The ``--extra_llm_api_options`` mapping, keys in the source material's order."""
    opts = preset.options
    out: dict = {
        key: value
        for key, value in (
            ("print_iter_log", opts.print_iter_log),
            ("enable_attention_dp", opts.enable_attention_dp),
            ("disable_overlap_scheduler", opts.disable_overlap_scheduler),
            ("enable_autotuner", opts.enable_autotuner),
            ("enable_chunked_prefill", opts.enable_chunked_prefill),
            ("enable_iter_perf_stats", opts.enable_iter_perf_stats),
        )
        if value is not None
    }
    if opts.cuda_graph_max_batch_size is not None:
        out["cuda_graph_config"] = {"max_batch_size": opts.cuda_graph_max_batch_size}
    spec = preset.speculation
    if spec is not None and spec.method is not Method.redrafter:
        out["speculative_config"] = speculative_config(preset, family)
    kv = preset.kv_cache.model_dump(exclude_none=True)
    if kv:
        out["kv_cache_config"] = kv
    return out


def speculative_config(preset: ServePreset, family: Family) -> dict:
    """``speculative_config`` in the family's spelling."""
    spec = preset.speculation
    assert spec is not None
    decoding_type = {
        Method.eagle3: "Eagle" if family is Family.v1_0 else "Eagle3",
        Method.draft_target: "DraftTarget",
        Method.ngram: "NGram",
    }[spec.method]
    out: dict = {"decoding_type": decoding_type, "max_draft_len": spec.max_draft_len}
    if spec.method is Method.ngram:
        out["max_matching_ngram_size"] = spec.max_matching_ngram_size
    else:
        key = "speculative_model_dir" if family is Family.v1_0 else "speculative_model"
        out[key] = spec.draft
    return out


def render_yaml(preset: ServePreset, family: Family) -> str:
    """The YAML text of :func:`llm_api_options`."""
    return yaml.safe_dump(llm_api_options(preset, family), sort_keys=False, indent=2)


# -- command lines ----------------------------------------------------------------------------
def serve_argv(preset: ServePreset, yaml_path: Path | None, model: str | None = None) -> list[str]:
    """``trtllm-serve MODEL ...`` with the preset's flags, in the source material's order."""
    argv = ["trtllm-serve", model or preset.model, "--backend", preset.backend]
    if preset.build is not None:
        argv += ["--tokenizer", preset.build.model_dir]
    argv += ["--tp_size", str(preset.tp_size)]
    for flag, value in (
        ("--max_batch_size", preset.max_batch_size),
        ("--max_num_tokens", preset.max_num_tokens),
        ("--kv_cache_free_gpu_memory_fraction", preset.kv_cache_free_gpu_memory_fraction),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if yaml_path is not None:
        argv += ["--extra_llm_api_options", str(yaml_path)]
    if preset.port is not None:
        argv += ["--port", str(preset.port)]
    if preset.host is not None:
        argv += ["--host", preset.host]
    return argv


def cluster_env(preset: ServePreset, hostfile: Path) -> dict[str, str]:
    """The UCX / NCCL / Open MPI variables that pin multi-node traffic to the interfaces."""
    assert preset.cluster is not None
    ifaces = ",".join(preset.cluster.interfaces)
    return {
        "UCX_NET_DEVICES": ifaces,
        "NCCL_SOCKET_IFNAME": ifaces,
        "OMPI_MCA_btl_tcp_if_include": ifaces,
        "OMPI_MCA_orte_default_hostfile": str(hostfile),
        "OMPI_MCA_rmaps_ppr_n_pernode": "1",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "CPATH": "/usr/local/cuda/include",
        "TRITON_PTXAS_PATH": "/usr/local/cuda/bin/ptxas",
    }


def prep_steps(preset: ServePreset) -> list[Step]:
    """Downloads the server needs first: the draft (on every node) and tokenizer encodings."""
    steps: list[Step] = []
    spec = preset.speculation
    if spec is not None and spec.draft_repo and spec.draft_dir:
        fetch = ["hf", "download", spec.draft_repo, "--local-dir", spec.draft_dir]
        if preset.cluster is not None:
            nodes = str(len(preset.cluster.hosts))
            fetch = ["mpirun", "-x", "HF_TOKEN", "-np", nodes, "bash", "-c", shlex.join(fetch)]
        steps.append(
            Step(f"download the draft {spec.draft_repo}", fetch, skip_if_exists=spec.draft_dir)
        )
    for item in preset.downloads:
        target = f"{item.into.rstrip('/')}/{item.url.rsplit('/', 1)[1]}"
        steps.append(
            Step(f"fetch {item.url}", ["wget", "-P", item.into, item.url], skip_if_exists=target)
        )
    return steps


def redrafter_steps(preset: ServePreset, work: Path, examples: str) -> list[Step]:
    """FP8 quantize with calibration → ReDrafter convert_checkpoint → trtllm-build."""
    build, spec = preset.build, preset.speculation
    assert build is not None and spec is not None
    base_ckpt, draft_ckpt, engine = _redrafter_dirs(preset, work)
    tp = str(preset.tp_size)
    return [
        Step(
            f"download {preset.model}",
            ["hf", "download", preset.model, "--local-dir", build.model_dir],
            skip_if_exists=build.model_dir,
        ),
        Step(
            f"quantize to {build.qformat.upper()} with the calibration set",
            ["python3", f"{examples}/quantization/quantize.py", "--model_dir", build.model_dir,
             "--dtype", build.dtype, "--qformat", build.qformat, "--kv_cache_dtype", build.kv_cache_dtype,
             "--output_dir", str(base_ckpt), "--calib_dataset", build.calib_dataset,
             "--calib_size", str(build.calib_size), "--tp_size", tp],
            skip_if_exists=str(base_ckpt / "config.json"),
        ),
        Step(
            "convert base + ReDrafter drafter to a TensorRT-LLM checkpoint",
            ["python3", f"{examples}/redrafter/convert_checkpoint.py",
             "--base_model_checkpoint_dir", str(base_ckpt), "--drafter_model_dir", build.drafter_dir,
             "--output_dir", str(draft_ckpt), "--dtype", build.dtype, "--tp_size", tp,
             "--redrafter_num_beams", str(spec.num_beams),
             "--redrafter_draft_len_per_beam", str(spec.max_draft_len)],
            skip_if_exists=str(draft_ckpt / "config.json"),
        ),
        Step(
            "build the engine (explicit draft tokens)",
            ["trtllm-build", "--checkpoint_dir", str(draft_ckpt), "--output_dir", str(engine),
             "--speculative_decoding_mode", "explicit_draft_tokens", "--gemm_plugin", build.qformat,
             "--use_paged_context_fmha", "enable", "--max_batch_size", str(build.max_batch_size),
             "--max_seq_len", str(build.max_seq_len), "--max_input_len", str(build.max_input_len),
             "--max_num_tokens", str(build.max_num_tokens), "--max_beam_width", str(build.max_beam_width),
             "--kv_cache_type", "paged"],
            skip_if_exists=str(engine / "config.json"),
        ),
    ]  # fmt: skip


def _redrafter_dirs(preset: ServePreset, work: Path) -> tuple[Path, Path, Path]:
    stem = Path(preset.build.model_dir).name if preset.build else preset.name
    return (
        work / f"{stem}-fp8-ckpt",
        work / f"{stem}-fp8-redrafter-ckpt",
        work / f"{stem}-fp8-redrafter-engine",
    )


# -- the plan ---------------------------------------------------------------------------------
def plan(
    preset: ServePreset,
    *,
    family: Family,
    out: Path,
    launcher: str = "native",
    image: str | None = None,
    examples: str = DEFAULT_EXAMPLES,
) -> LaunchPlan:
    """Files, steps and the server command for ``preset`` (native, or inside the NGC image)."""
    out = out.resolve()
    preset = _anchor(preset, out)
    files: dict[Path, str] = {}
    options = llm_api_options(preset, family)
    yaml_path = out / YAML_NAME if options else None
    if yaml_path is not None:
        files[yaml_path] = render_yaml(preset, family)
    steps = prep_steps(preset)
    engine_dir = None
    if preset.build is not None:
        steps += redrafter_steps(preset, out, examples)
        engine_dir = str(_redrafter_dirs(preset, out)[2])
    server = Step("serve", serve_argv(preset, yaml_path, engine_dir), env=dict(preset.env))
    if preset.cluster is not None:
        hostfile = out / HOSTFILE_NAME
        files[hostfile] = "\n".join(preset.cluster.hosts) + "\n"
        env = cluster_env(preset, hostfile)
        steps = [Step(s.name, s.argv, {**env, **s.env}, s.skip_if_exists) for s in steps]
        launch = ["mpirun", "-x", "CPATH", "-x", "TRITON_PTXAS_PATH", "-x", "HF_TOKEN"]
        server = Step(
            f"serve across {len(preset.cluster.hosts)} nodes",
            [*launch, "trtllm-llmapi-launch", *server.argv],
            {**env, **server.env},
        )
    result = LaunchPlan(
        "trtllm", preset.name, files, steps, server, health_url(preset.host, preset.port)
    )
    result.files[out / "launch.sh"] = result.script()
    if preset.build is not None:
        result.notes.append(
            f"train the drafter first: mathagent train-drafter --base {preset.build.model_dir} "
            f"--data ... --out {preset.build.drafter_dir} --draft-len "
            f"{preset.speculation.max_draft_len if preset.speculation else 3} "
            f"--layers {preset.build.drafter_layers}"
        )
        result.notes.append("ReDrafter exists only on TensorRT-LLM's engine path (trtllm-build)")
    if launcher == "docker":
        return ngc.dockerize(result, image or ngc.IMAGES[family.value], out)
    return result


def _anchor(preset: ServePreset, out: Path) -> ServePreset:
    """Relative ReDrafter paths live in the output folder, so docker and native agree."""
    if preset.build is None:
        return preset
    build = preset.build
    fixed = {
        key: str(out / value)
        for key, value in (
            ("model_dir", build.model_dir),
            ("drafter_dir", build.drafter_dir),
            ("calib_dataset", build.calib_dataset),
        )
        if not Path(value).is_absolute()
    }
    return preset.model_copy(update={"build": build.model_copy(update=fixed)})
