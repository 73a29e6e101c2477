"""The four production serving presets, as typed and validated configuration.

Values come from the project's source material (NVIDIA's DGX Spark speculative-decoding
playbook, run on ``release:1.3.0rc12``, and the NeMo-Skills AIMO-2 ReDrafter recipe, run on
``tensorrt_llm==1.1.0rc0``); ``openmath-14b-ngram`` is the project's own, for TensorRT-LLM
lines without the engine path. A preset is engine-neutral: the TensorRT-LLM, vLLM and SGLang
launchers each render it in their own spelling, and say so when a method has no equivalent
there. Validation holds the constraints TensorRT-LLM's code enforces.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Method(StrEnum):
    """Speculative decoding methods the presets use."""

    eagle3 = "eagle3"
    draft_target = "draft_target"
    ngram = "ngram"
    redrafter = "redrafter"


# A separate draft network runs beside the target: TensorRT-LLM wants KV block reuse off.
TWO_MODEL_METHODS = frozenset({Method.eagle3, Method.draft_target})


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Speculation(_Frozen):
    """What drafts the tokens and how many per step."""

    method: Method
    max_draft_len: int = Field(ge=1, le=64)
    draft_repo: str | None = Field(None, description="Hugging Face id of the draft")
    draft_dir: str | None = Field(None, description="local folder the engine reads the draft from")
    max_matching_ngram_size: int = Field(0, ge=0, description="NGram: longest suffix matched")
    num_beams: int = Field(1, ge=1, description="ReDrafter: beams explored per step")

    @property
    def draft(self) -> str | None:
        """The draft as TensorRT-LLM reads it: the local folder, else the hub id."""
        return self.draft_dir or self.draft_repo

    @property
    def hub_draft(self) -> str | None:
        """The draft for engines that fetch it themselves (vLLM, SGLang): hub id, else folder."""
        return self.draft_repo or self.draft_dir


class KvCache(_Frozen):
    """``kv_cache_config`` of the LLM API."""

    free_gpu_memory_fraction: float | None = Field(None, gt=0, le=1)
    enable_block_reuse: bool | None = None


class LlmApiOptions(_Frozen):
    """Top-level LLM API switches written to the ``--extra_llm_api_options`` YAML."""

    print_iter_log: bool | None = None
    enable_attention_dp: bool | None = None
    disable_overlap_scheduler: bool | None = None
    enable_autotuner: bool | None = None
    enable_chunked_prefill: bool | None = None
    enable_iter_perf_stats: bool | None = None
    cuda_graph_max_batch_size: int | None = Field(None, ge=1)


class Download(_Frozen):
    """A file fetched before serving (the gpt-oss tokenizer encodings)."""

    url: str
    into: str


class RedrafterBuild(_Frozen):
    """TensorRT-LLM's engine path for ReDrafter: quantize, convert, build, then serve the engine."""

    model_dir: str = Field(description="local folder of the base model's HF weights")
    drafter_dir: str = Field(description="the trained drafter (mathagent train-drafter --out)")
    drafter_layers: int = Field(2, ge=1)
    qformat: Literal["fp8"] = "fp8"
    quantize_dtype: Literal["auto", "bfloat16", "float16"] = "auto"
    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    calib_dataset: str | None = Field(
        None, description="FP8 calibration set: a dataset folder, or a JSONL to build one from"
    )
    calib_size: int = Field(4096, ge=1)
    calib_batch_size: int = Field(4, ge=1)
    max_batch_size: int = Field(32, ge=1)
    max_seq_len: int = Field(32000, ge=1)
    max_input_len: int = Field(32000, ge=1)
    max_num_tokens: int = Field(32000, ge=1)
    max_beam_width: int = Field(1, ge=1)


class Cluster(_Frozen):
    """The nodes of a multi-node launch and the network interfaces their traffic uses."""

    hosts: list[str] = Field(min_length=2)
    interfaces: list[str] = Field(min_length=1)


class ServePreset(_Frozen):
    """One named serving configuration, validated against the engine's documented rules."""

    name: str
    summary: str
    model: str = Field(description="target model: Hugging Face id or local path")
    backend: Literal["pytorch", "tensorrt"] = "pytorch"
    tp_size: int = Field(1, ge=1)
    max_batch_size: int | None = Field(None, ge=1)
    max_num_tokens: int | None = Field(None, ge=1)
    kv_cache_free_gpu_memory_fraction: float | None = Field(None, gt=0, le=1)
    # Each engine's own memory knob (they mean different things; see spelling.py): unset uses
    # that engine's default, never a value carried over from TensorRT-LLM's KV-cache share.
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="vLLM")
    mem_fraction_static: float | None = Field(None, gt=0, le=1, description="SGLang")
    # TensorRT-LLM release lines the preset runs on (None: all), and the one it defaults to.
    trtllm_lines: tuple[str, ...] | None = None
    trtllm_default: str = "1.3"
    host: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    options: LlmApiOptions = LlmApiOptions()
    kv_cache: KvCache = KvCache()
    speculation: Speculation | None = None
    env: dict[str, str] = {}
    downloads: list[Download] = []
    cluster: Cluster | None = None
    build: RedrafterBuild | None = None

    @model_validator(mode="after")
    def _documented_constraints(self) -> ServePreset:
        spec = self.speculation
        if spec is not None:
            _check_speculation(self, spec)
        if self.cluster is not None and self.tp_size % len(self.cluster.hosts):
            raise ValueError(
                f"tp_size {self.tp_size} must be a multiple of the {len(self.cluster.hosts)} nodes"
            )
        return self


def _check_speculation(preset: ServePreset, spec: Speculation) -> None:
    if spec.method is Method.ngram and spec.max_matching_ngram_size <= 0:
        raise ValueError("NGram needs max_matching_ngram_size > 0")
    if spec.method in TWO_MODEL_METHODS:
        if preset.backend != "pytorch":
            raise ValueError(f"{spec.method} needs the pytorch backend")
        if spec.draft is None:
            raise ValueError(f"{spec.method} needs a draft model (draft_repo or draft_dir)")
        if preset.kv_cache.enable_block_reuse is not False:
            raise ValueError(
                f"{spec.method} runs a second model: set kv_cache_config.enable_block_reuse false"
            )
    if spec.method is Method.redrafter and (preset.backend != "tensorrt" or preset.build is None):
        raise ValueError(
            "ReDrafter exists only on TensorRT-LLM's engine path: backend 'tensorrt' with a build"
        )
    if preset.trtllm_lines is not None and preset.trtllm_default not in preset.trtllm_lines:
        raise ValueError(f"trtllm_default {preset.trtllm_default} is not in {preset.trtllm_lines}")


_TIKTOKEN_DIR = "/tmp/harmony-reqs"
_TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"
# The playbooks' EAGLE-3 setup, shared by gpt-oss and Qwen3 (which also turns chunked prefill off).
_EAGLE3_OPTIONS = {
    "enable_attention_dp": False,
    "disable_overlap_scheduler": False,
    "enable_autotuner": False,
    "cuda_graph_max_batch_size": 1,
}
_EAGLE3_KV_CACHE = KvCache(free_gpu_memory_fraction=0.9, enable_block_reuse=False)

PRESETS: dict[str, ServePreset] = {
    p.name: p
    for p in (
        ServePreset(
            name="gpt-oss-120b-eagle3",
            summary="gpt-oss-120b with the long-context EAGLE-3 head, one GPU, batch 1",
            model="openai/gpt-oss-120b",
            max_batch_size=1,
            options=LlmApiOptions(**_EAGLE3_OPTIONS),
            kv_cache=_EAGLE3_KV_CACHE,
            speculation=Speculation(
                method=Method.eagle3,
                max_draft_len=5,
                draft_repo="nvidia/gpt-oss-120b-Eagle3-long-context",
                draft_dir="/opt/gpt-oss-120b-Eagle3/",
            ),
            env={"TIKTOKEN_ENCODINGS_BASE": _TIKTOKEN_DIR},
            downloads=[
                Download(url=_TIKTOKEN_URL.format(name), into=_TIKTOKEN_DIR)
                for name in ("o200k_base", "cl100k_base")
            ],
        ),
        ServePreset(
            name="llama3.3-70b-fp4-draft-target",
            summary="Llama-3.3-70B FP4 drafted by Llama-3.1-8B FP4, one GPU, batch 1",
            model="nvidia/Llama-3.3-70B-Instruct-FP4",
            max_batch_size=1,
            kv_cache_free_gpu_memory_fraction=0.9,
            options=LlmApiOptions(print_iter_log=False, disable_overlap_scheduler=True),
            kv_cache=KvCache(enable_block_reuse=False),
            speculation=Speculation(
                method=Method.draft_target,
                max_draft_len=4,
                draft_repo="nvidia/Llama-3.1-8B-Instruct-FP4",
                draft_dir="/opt/Llama-3.1-8B-Instruct-FP4/",
            ),
        ),
        ServePreset(
            name="qwen3-235b-eagle3-tp2",
            summary="Qwen3-235B-A22B FP4 with its EAGLE-3 head, tensor parallel over two nodes",
            model="nvidia/Qwen3-235B-A22B-FP4",
            tp_size=2,
            max_num_tokens=1024,
            host="0.0.0.0",
            port=8355,
            options=LlmApiOptions(**_EAGLE3_OPTIONS, enable_chunked_prefill=False),
            kv_cache=_EAGLE3_KV_CACHE,
            speculation=Speculation(
                method=Method.eagle3,
                max_draft_len=3,
                draft_repo="nvidia/Qwen3-235B-A22B-Eagle3",
                draft_dir="/opt/Qwen3-235B-A22B-Eagle3/",
            ),
            cluster=Cluster(
                hosts=["192.168.200.12", "192.168.200.13"],
                interfaces=["enp1s0f1np1", "enP2p1s0f1np1"],
            ),
        ),
        ServePreset(
            name="openmath-14b-fp8-redrafter",
            summary="OpenMath-Nemotron-14B-kaggle in FP8 with a ReDrafter head, TensorRT engine, TP 2",
            model="nvidia/OpenMath-Nemotron-14B-kaggle",
            backend="tensorrt",
            tp_size=2,
            max_batch_size=12,
            kv_cache_free_gpu_memory_fraction=0.92,
            speculation=Speculation(method=Method.redrafter, max_draft_len=3, num_beams=1),
            build=RedrafterBuild(
                model_dir="OpenMath-Nemotron-14B-kaggle",
                drafter_dir="redrafter-OpenMath-Nemotron-14B-kaggle",
            ),
            # The engine path (trtllm-build) is deprecated from the 1.3 line on.
            trtllm_lines=("1.0", "1.1", "1.2"),
            trtllm_default="1.1",
        ),
        ServePreset(
            name="openmath-14b-ngram",
            summary="OpenMath-Nemotron-14B-kaggle with prompt-lookup (NGram) drafts, pytorch "
            "backend, TP 2: the ReDrafter preset's model for TensorRT-LLM without the engine path",
            model="nvidia/OpenMath-Nemotron-14B-kaggle",
            tp_size=2,
            max_batch_size=12,
            kv_cache_free_gpu_memory_fraction=0.92,
            speculation=Speculation(
                method=Method.ngram, max_draft_len=3, max_matching_ngram_size=3
            ),
        ),
    )
}

# Offered when a preset's method does not exist on the TensorRT-LLM line asked for.
ALTERNATIVES = {"openmath-14b-fp8-redrafter": "openmath-14b-ngram"}


def get_preset(name: str) -> ServePreset:
    """The preset called ``name``; a ``KeyError`` naming the known presets otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(PRESETS)
        raise KeyError(f"unknown preset {name!r}; known presets: {known}") from None
