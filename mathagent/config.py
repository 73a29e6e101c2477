"""Every knob of mathagent, defined once.

Values come from (in order of precedence) explicit arguments, ``MATHAGENT_*`` environment
variables, and the defaults below. Nested sections use ``__`` in the variable name, e.g.
``MATHAGENT_SANDBOX__POOL_SIZE=8``. Build a :class:`Settings` once at the edge (CLI, app factory)
and pass the relevant section down explicitly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mathagent.serving.engine.spec_config import EMBEDDED_METHODS

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

# Contract ports (DESIGN.md): the embedded server sits where trtllm-serve would.
ENGINE_PORT = 8000
SANDBOX_PORT = 6000
API_PORT = 8080


class EngineSettings(BaseModel):
    """The embedded PyTorch engine."""

    device: str = Field("auto", description="'auto', 'cpu' or 'cuda[:N]'")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    quantization: Literal["none", "int4", "fp8"] = Field(
        "none",
        description="int4: CPU weight-only int4 blocks + int8 head, bf16 activations; fp8: CUDA "
        "(Hopper+) e4m3 weights per output channel, activations per token (or an FP8 "
        "checkpoint's static input scales)",
    )
    fp8_head: bool = Field(
        False,
        description="fp8: the vocabulary head in e4m3 too (per row, as SGLang's "
        "SGLANG_QUANTIZE_LM_HEAD_FP8); off = the head in bf16, as published FP8 checkpoints keep it",
    )
    fp8_activation_scales: Literal["auto", "calibrate"] = Field(
        "auto",
        description="fp8 with weights quantised at load: auto = each token's own activation "
        "scale; calibrate = one static scale per product from a calibration forward at load "
        "(ModelOpt's max calibration). FP8 checkpoints keep their own scheme",
    )
    max_batch_size: int = Field(8, ge=1, le=1024, description="KV-cache slots")
    max_seq_len: int = Field(4096, ge=64, description="context length per slot")
    prefix_caching: bool = Field(
        True,
        description="reuse K/V of a prompt prefix another slot holds (freed slots keep theirs)",
    )
    speculative: str = Field("none", description=EMBEDDED_METHODS)
    tokenizer: str | None = Field(
        None,
        description="tokenizer folder or .gguf used instead of the model's own (vLLM's "
        "--tokenizer); a random: shape has none, so text and chat requests need one",
    )
    draft_len: int = Field(3, ge=1, le=16)
    draft_beams: int | None = Field(
        None,
        ge=1,
        le=64,
        description="draft beams (greedy); unset = 4, 1 with CPU int4 or EAGLE-3 on CUDA",
    )
    eager: bool | Literal["auto"] = Field(
        "auto",
        description="skip torch.compile / CUDA graphs; auto = graphs on CUDA, eager on CPU "
        "(a CPU stays eager: compiled, its steps ran 30-100x slower)",
    )
    compiled_prefill: bool = Field(
        False,
        description="CUDA graphs on: run the steps the graphs do not take (a prefill, a window "
        "wider than 16 tokens) through torch.compile'd blocks, one graph for every layer and "
        "length, compiled on first use; off = eager blocks (~45 launches a layer: 13 ms of host "
        "time per prefill of the default model on an H100, 4.6 ms on the device; compiled "
        "measured no faster: 13.7-19.3 ms, run 121)",
    )
    lookup_branch: bool | Literal["auto"] = Field(
        "auto",
        description="EAGLE-3 greedy chains verify a prompt-lookup (n-gram) chain beside them, "
        "as a second branch of one tree, the longer accepted branch kept; auto = on CUDA only "
        "(a CPU's int4 verify costs in proportion to its rows)",
    )
    lookup_len: Annotated[int, Field(ge=1, le=15)] | Literal["auto"] = Field(
        "auto",
        description="drafts of that prompt-lookup chain (at least the EAGLE-3 chain's; its "
        "extra drafts add verify rows, not draft steps); auto = on CUDA as many as fill a "
        "row's verify to 16 tokens (15 - the chain's), elsewhere the chain's length",
    )
    adaptive_draft: bool = Field(
        True,
        description="choose the draft length per step (0 = plain decode) from measured "
        "acceptance and step times, so speculation never runs slower than plain decoding",
    )
    pack_weights: bool = Field(
        True,
        description="CPU float32: also keep MKL-packed weights for 4-16-row steps (3x weight memory)",
    )
    threads: int | None = Field(None, ge=1, description="torch CPU threads; None = torch default")


class SandboxSettings(BaseModel):
    """The Docker sandbox: image, warm pool and per-container limits."""

    image: str = "mathagent-sandbox"
    pool_size: int = Field(4, ge=0, le=256, description="warm containers kept ready")
    max_sessions: int = Field(64, ge=1, description="concurrent sessions (containers) at most")
    memory_mb: int = Field(512, ge=32)
    pids_limit: int = Field(64, ge=8)
    cpus: float = Field(1.0, gt=0)
    tmpfs_mb: int = Field(64, ge=1)
    idle_timeout_s: float = Field(300.0, gt=0, description="a session unused this long is closed")
    timeout_s: float = Field(10.0, gt=0, description="default per-cell time limit")
    max_output_chars: int = Field(1000, ge=1, description="default output cap per stream")
    max_request_bytes: int = Field(1_000_000, ge=1024)
    max_timeout_s: float = Field(300.0, gt=0, description="largest per-cell time limit accepted")
    kill_grace_s: float = Field(1.0, gt=0, description="host deadline = timeout + this")
    start_timeout_s: float = Field(60.0, gt=0, description="a container must be ready by then")
    preload: str = Field("numpy,sympy", description="modules each worker imports while warm")
    debian_mirror: str | None = Field(None, description="Debian mirror; unset = apt's own")


class AgentSettings(BaseModel):
    """The tool-integrated reasoning loop.

    Knobs left unset (None) take the recipe's value, then the model family's default
    (``mathagent/agent/families.py``): a reasoning model gets its long budget, the small default
    model today's 2048 tokens at temperature 0.
    """

    prompt_format: str = Field(
        "auto", description="auto | openmath | openmath-kaggle | qwen | qwen3 | gpt-oss | fewshot"
    )
    recipe: Literal["none", "aimo2"] = Field(
        "none", description="aimo2 = the AIMO-2 Kaggle setup (Kaggle prompt, 6 calls, 2 s, ...)"
    )
    reasoning_effort: Literal["low", "medium", "high"] | None = Field(
        None, description="gpt-oss reasoning effort; unset = the family's (high)"
    )
    conversation_date: str | None = Field(
        None, description="gpt-oss system message date (YYYY-MM-DD); unset = today"
    )
    max_tool_calls: int | None = Field(None, ge=0)
    code_timeout_s: float | None = Field(None, gt=0)
    max_output_chars: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1, description="unset = the family's default")
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    samples: int | None = Field(None, ge=1)
    wall_time_s: float | None = Field(None, gt=0, description="time budget per problem")
    request_timeout_s: float = Field(300.0, gt=0)
    retries: int = Field(3, ge=0)
    backoff_s: float = Field(0.5, ge=0, description="first retry delay; doubles each retry")
    seed: int | None = Field(None, description="sampling seed; sample i uses seed + i")
    early_stop: int | None = Field(
        None, ge=0, description="cancel other samples once this many agree"
    )
    remaining_notice: bool | None = Field(
        None, description="'Remaining code executions' notices; unset = the family's"
    )
    stop_on_answer: bool = Field(True, description="end a generation at its first final \\boxed{}")
    api_mode: Literal["auto", "completions", "chat"] = Field(
        "auto", description="auto = completions when the prompt can be rendered locally"
    )
    tokenizer: str | None = Field(
        None, description="tokenizer folder, .gguf file or cached name for the chat template"
    )
    max_problem_chars: int = Field(20_000, ge=1, description="/solve rejects longer problems")
    max_samples: int = Field(64, ge=1, description="/solve rejects more samples")
    max_concurrency: int = Field(64, ge=1, description="/solve requests in flight, then 429")


class Settings(BaseSettings):
    """All configuration, read from ``MATHAGENT_*`` environment variables."""

    model_config = SettingsConfigDict(
        env_prefix="MATHAGENT_", env_nested_delimiter="__", extra="ignore"
    )

    base_url: str | None = Field(
        None,
        description="OpenAI-compatible endpoint, or replicas of one as a comma-separated list; "
        "unset = start the embedded engine",
    )
    model: str | None = Field(
        None, description="model name at base_url, or a model path for the embedded engine"
    )
    # repr=False: a logged or printed Settings never shows a key.
    llm_api_key: str = Field("EMPTY", repr=False, description="API key sent to base_url")
    sandbox_url: str | None = Field(
        None, description="sandbox service URL; unset = in-process container pool"
    )
    api_key: str | None = Field(
        None, repr=False, description="bearer token required by the /solve API"
    )
    host: str = Field("127.0.0.1", description="bind address of the services")
    cache_dir: Path = Field(Path.home() / ".cache" / "mathagent")
    data_dir: Path | None = Field(None, description="folder of <name>.jsonl datasets")

    engine: EngineSettings = EngineSettings()
    sandbox: SandboxSettings = SandboxSettings()
    agent: AgentSettings = AgentSettings()

    @field_validator("base_url")
    @classmethod
    def _urls_listed(cls, value: str | None) -> str | None:
        if value is not None and not any(u.strip() for u in value.split(",")):
            raise ValueError("lists no URL (give one, or several separated by commas)")
        return value

    @property
    def base_urls(self) -> list[str]:
        """The endpoints of ``base_url`` (one, or the replicas of a comma-separated list)."""
        return [u.strip() for u in (self.base_url or "").split(",") if u.strip()]

    @property
    def model_dir(self) -> Path:
        """Where fetched and converted models live."""
        return self.cache_dir / "models"
