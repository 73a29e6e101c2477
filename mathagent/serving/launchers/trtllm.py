"""TensorRT-LLM launcher: the ``--extra_llm_api_options`` YAML and every command line.

What is written depends on the release line (:mod:`releases`): the YAML spelling, the image
and whether the engine path exists. The defaults reproduce the source material: the DGX Spark
playbook's YAML and ``trtllm-serve`` lines on ``release:1.3.0rc12``, and the NeMo-Skills
ReDrafter recipe's quantize / convert / build / serve lines on ``tensorrt_llm==1.1.0rc0``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from mathagent.serving.launchers import calibration, ngc
from mathagent.serving.launchers.plan import LaunchPlan, Step, health_url
from mathagent.serving.launchers.presets import Method, ServePreset
from mathagent.serving.launchers.releases import Release

YAML_NAME = "extra-llm-api-config.yml"
HOSTFILE_NAME = "openmpi-hostfile"
DEFAULT_EXAMPLES = "/app/tensorrt_llm/examples"  # where the NGC release image keeps them
# The recipe serves the engine with the engine path's short backend name (an alias of tensorrt).
_BACKEND_SPELLING = {"pytorch": "pytorch", "tensorrt": "trt"}
# The playbook exports these to the ranks as NAME=VALUE on the mpirun line.
_MPI_EXPORTS = ("CPATH", "TRITON_PTXAS_PATH")


# -- YAML -------------------------------------------------------------------------------------
def llm_api_options(preset: ServePreset, release: Release) -> dict:
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
        out["speculative_config"] = speculative_config(preset, release)
    kv = preset.kv_cache.model_dump(exclude_none=True)
    if kv:
        out["kv_cache_config"] = kv
    return out


def speculative_config(preset: ServePreset, release: Release) -> dict:
    """``speculative_config`` in the release's spelling."""
    spec = preset.speculation
    assert spec is not None
    decoding_type = {
        Method.eagle3: release.eagle_decoding_type,
        Method.draft_target: "DraftTarget",
        Method.ngram: "NGram",
    }[spec.method]
    out: dict = {"decoding_type": decoding_type, "max_draft_len": spec.max_draft_len}
    if spec.method is Method.ngram:
        out["max_matching_ngram_size"] = spec.max_matching_ngram_size
    else:
        out[release.draft_key] = spec.draft
    return out


def render_yaml(preset: ServePreset, release: Release) -> str:
    """The YAML text of :func:`llm_api_options`."""
    return yaml.safe_dump(llm_api_options(preset, release), sort_keys=False, indent=2)


# -- command lines ----------------------------------------------------------------------------
def serve_argv(preset: ServePreset, yaml_path: Path | None, model: str | None = None) -> list[str]:
    """``trtllm-serve MODEL ...`` with the preset's flags, in the source material's order."""
    if preset.build is not None:  # the recipe's line: trtllm-serve serve ENGINE --tokenizer HF
        argv = [
            "trtllm-serve",
            "serve",
            model or preset.model,
            "--tokenizer",
            preset.build.model_dir,
        ]
        argv += ["--backend", _BACKEND_SPELLING[preset.backend], "--tp_size", str(preset.tp_size)]
        flags = (
            ("--kv_cache_free_gpu_memory_fraction", preset.kv_cache_free_gpu_memory_fraction),
            ("--max_batch_size", preset.max_batch_size),
        )
    else:
        argv = ["trtllm-serve", model or preset.model, "--backend", preset.backend]
        argv += ["--tp_size", str(preset.tp_size)]
        flags = (
            ("--max_batch_size", preset.max_batch_size),
            ("--max_num_tokens", preset.max_num_tokens),
            ("--kv_cache_free_gpu_memory_fraction", preset.kv_cache_free_gpu_memory_fraction),
        )
    argv += [a for flag, value in flags if value is not None for a in (flag, str(value))]
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
    """Calibration set (from a JSONL) → FP8 quantize → ReDrafter convert_checkpoint → build."""
    build, spec = preset.build, preset.speculation
    assert build is not None and spec is not None and build.calib_dataset is not None
    base_ckpt, draft_ckpt, engine = _redrafter_dirs(preset, work)
    tp, steps = (
        str(preset.tp_size),
        [
            Step(
                f"download {preset.model}",
                ["hf", "download", preset.model, "--local-dir", build.model_dir],
                skip_if_exists=build.model_dir,
            )
        ],
    )
    calib = build.calib_dataset
    if calibration.is_jsonl(calib):
        made, _, folder = calibration.step(calib, build.model_dir, build.calib_size, work)
        steps.append(made)
        calib = str(folder)
    return [
        *steps,
        Step(
            f"quantize to {build.qformat.upper()} with the calibration set",
            ["python3", f"{examples}/quantization/quantize.py", "--model_dir", build.model_dir,
             "--dtype", build.quantize_dtype, "--qformat", build.qformat,
             "--output_dir", str(base_ckpt), "--calib_size", str(build.calib_size),
             "--calib_dataset", calib, "--batch_size", str(build.calib_batch_size),
             "--tp_size", tp, "--pp_size", "1"],
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
             "--gemm_plugin", build.qformat, "--use_paged_context_fmha=enable",
             "--max_batch_size", str(build.max_batch_size), "--max_seq_len", str(build.max_seq_len),
             "--max_input_len", str(build.max_input_len), "--max_num_tokens", str(build.max_num_tokens),
             "--speculative_decoding_mode", "explicit_draft_tokens",
             "--max_beam_width", str(build.max_beam_width), "--kv_cache_type", "paged"],
            skip_if_exists=str(engine / "config.json"),
        ),
    ]  # fmt: skip


def _redrafter_dirs(preset: ServePreset, work: Path) -> tuple[Path, Path, Path]:
    """The recipe's folder names: quantized checkpoint, combined checkpoint, engine."""
    stem = Path(preset.build.model_dir).name if preset.build else preset.name
    return (
        work / f"{stem}-fp8-trtllm-tmp-ckpt",
        work / f"{stem}-fp8-draft-ckpt",
        work / f"{stem}-fp8-redrafter-trtllm",
    )


# -- the plan ---------------------------------------------------------------------------------
def plan(
    preset: ServePreset,
    *,
    release: Release,
    out: Path,
    launcher: str = "native",
    image: str | None = None,
    examples: str = DEFAULT_EXAMPLES,
) -> LaunchPlan:
    """Files, steps and the server command for ``preset`` (native, or inside the NGC image)."""
    out = out.resolve()
    preset = _anchor(preset, out)
    files: dict[Path, str] = {}
    options = llm_api_options(preset, release)
    yaml_path = out / YAML_NAME if options else None
    if yaml_path is not None:
        files[yaml_path] = render_yaml(preset, release)
    steps = prep_steps(preset)
    engine_dir = None
    if preset.build is not None:
        steps += redrafter_steps(preset, out, examples)
        engine_dir = str(_redrafter_dirs(preset, out)[2])
        if preset.build.calib_dataset and calibration.is_jsonl(preset.build.calib_dataset):
            files[out / calibration.SCRIPT_NAME] = calibration.SCRIPT
    server = Step("serve", serve_argv(preset, yaml_path, engine_dir), env=dict(preset.env))
    if preset.cluster is not None:
        hostfile = out / HOSTFILE_NAME
        files[hostfile] = "\n".join(preset.cluster.hosts) + "\n"
        env = cluster_env(preset, hostfile)
        steps = [Step(s.name, s.argv, {**env, **s.env}, s.skip_if_exists) for s in steps]
        launch = ["mpirun", *[a for k in _MPI_EXPORTS for a in ("-x", f"{k}={env[k]}")]]
        server = Step(
            f"serve across {len(preset.cluster.hosts)} nodes",
            [*launch, "-x", "HF_TOKEN", "trtllm-llmapi-launch", *server.argv],
            {**env, **server.env},
        )
    result = LaunchPlan(
        "trtllm", preset.name, files, steps, server, health_url(preset.host, preset.port)
    )
    result.files[out / "launch.sh"] = result.script()
    result.notes += _notes(preset, release)
    if launcher == "docker":
        return ngc.dockerize(result, image or release.image, out)
    return result


def redrafter_engine_dir(preset: ServePreset, out: Path) -> Path:
    """Where the ReDrafter build leaves the engine that ``trtllm-serve`` serves."""
    out = out.resolve()
    return _redrafter_dirs(_anchor(preset, out), out)[2]


def _notes(preset: ServePreset, release: Release) -> list[str]:
    notes = [f"TensorRT-LLM {release.line} (image {release.image})"]
    if preset.build is not None and preset.speculation is not None:
        notes.append(
            f"train the drafter first: mathagent train-drafter --base {preset.build.model_dir} "
            f"--data ... --out {preset.build.drafter_dir} --draft-len "
            f"{preset.speculation.max_draft_len} --layers {preset.build.drafter_layers}"
        )
        lines = ", ".join(preset.trtllm_lines or ())
        notes.append(
            "ReDrafter exists only on TensorRT-LLM's engine path (trtllm-build), which this "
            f"preset runs on TensorRT-LLM {lines}: it is deprecated from 1.3 on"
        )
    return notes


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
        if value is not None and not Path(value).is_absolute()
    }
    return preset.model_copy(update={"build": build.model_copy(update=fixed)})
