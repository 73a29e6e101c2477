"""The one composition root: settings in, the wired parts a command needs out.

Every caller that solves problems (``mathagent solve``, ``api``, ``eval``, the benchmarks) gets
its :class:`~mathagent.agent.solver.Solver` from :func:`open_solver`: the configured endpoint
or the embedded engine started here, the sandbox when tools are on, and the chat template the
agent renders prompts with. The sandbox's pool starts warming before the engine loads, so the
two overlap; the embedded engine's own tokenizer renders the prompts (the agent never searches
for a tokenizer, and nothing parses the model a second time).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mathagent.agent.llm import LLMError, open_llm
from mathagent.agent.model_card import ModelCard, model_card
from mathagent.agent.plan import plan_for, planned_samples
from mathagent.agent.prompts import ChatTemplate
from mathagent.agent.solver import Solver
from mathagent.config import DEFAULT_MODEL_NAME, EngineSettings, Settings
from mathagent.model_store import SHIPPED_EAGLE3
from mathagent.sandbox import Sandbox, open_sandbox

if TYPE_CHECKING:
    from mathagent.evals.eval_command import EvalRequest
    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.llm_engine import LLMEngine

# Steps of at least this many rows are where the engine's packed CPU weights pay (DESIGN:
# batched decode and speculative verify); a job with fewer concurrent rows skips packing.
PACKED_ROWS = 4


@dataclass
class SolverRuntime:
    """A ready solver and what it talks to."""

    solver: Solver
    base_url: str  # the first endpoint (the only one unless replicas were given)
    model: str
    embedded: bool
    base_urls: list[str]


def v1_root(base_url: str) -> str:
    """The OpenAI client wants the ``/v1`` root; users give either form."""
    root = base_url.rstrip("/")
    return root if root.endswith("/v1") else f"{root}/v1"


def engine_settings_for(
    engine: EngineSettings, concurrent_rows: int, model: str | None = None
) -> EngineSettings:
    """The engine settings for a job running ``concurrent_rows`` sequences at once on ``model``
    (``None``: the default model). What the user set stays; the rest is chosen for the job.

    The default model gets its own defaults (:func:`default_model_engine`). Packing (3x the
    float32 weight memory, ~2 s of load) is on only where the job runs multi-row steps:
    several sequences, or speculation.
    """
    if model is None:
        engine = default_model_engine(engine)
    if "pack_weights" in engine.model_fields_set:
        return engine
    pack = concurrent_rows >= PACKED_ROWS or engine.speculative != "none"
    return engine.model_copy(update={"pack_weights": pack})


def default_model_engine(engine: EngineSettings) -> EngineSettings:
    """The default model's settings where the user chose none (README "Speculation by
    default" has the measurements): on a CPU it runs as what it is, its GGUF's own Q4_1 codes
    (int4, unless a quantization or dtype was chosen); on a CPU and on CUDA (no quantization
    chosen) it speculates with its shipped EAGLE-3 head. CPU int4, batch 1, 16 GSM8K agent
    prompts x 128 tokens, chains of 3: 2.05x / 2.03x plain against the shipped ReDrafter's
    1.68x / 1.65x in two runs (benchmarks/spec_bench_cpu_int4_len3_run13_*.json); 8 and 32 rows
    at a time 1.59x / 1.76x against 1.55x / 1.56x. H200, bf16, batch 1: chains of 4 beside a
    lookup of 11, 2.63x plain on 64 prompts (GPU_NOTES run 110). A chosen speculative method,
    ``none`` included, wins, and so do a chosen draft length and beam count."""
    import torch

    on_cpu = engine.device == "cpu" or (engine.device == "auto" and not torch.cuda.is_available())
    chosen = engine.model_fields_set
    update: dict[str, object] = {}
    if on_cpu and not chosen & {"quantization", "dtype"}:
        update["quantization"] = "int4"
    if "speculative" not in chosen and (on_cpu or engine.quantization == "none"):
        update["speculative"] = f"eagle3:{SHIPPED_EAGLE3}"
    return engine.model_copy(update=update) if update else engine


@asynccontextmanager
async def open_solver(
    settings: Settings, *, tools: bool, concurrent_rows: int | None = None
) -> AsyncIterator[SolverRuntime]:
    """The agent over ``settings.base_url``, or over the embedded engine started here.

    ``concurrent_rows`` (default: the engine's slots) sizes the embedded engine's choices.
    """
    async with AsyncExitStack() as stack:
        sandbox: Sandbox | None = None
        if tools:
            sandbox = await stack.enter_async_context(open_sandbox(settings))
        template: ChatTemplate | None = None
        if settings.base_url is None:
            rows = concurrent_rows or settings.engine.max_batch_size
            server = await asyncio.to_thread(_start_embedded, settings, rows)
            stack.callback(server.__exit__, None, None, None)
            urls = [server.base_url]
            card = await _card(urls[0], settings, server.model_name)
            if server.engine.tokenizer:
                template = ChatTemplate(server.engine.tokenizer)
        else:
            urls = [v1_root(u) for u in settings.base_urls]
            if not urls:
                raise ValueError("the base URL lists no endpoint")
            card = await _first_card(urls, settings)
        family = plan_for(settings.agent, card.id).family
        if family.harmony is not None and settings.agent.api_mode == "chat":
            raise LLMError(
                f"{card.id} ({family.name}) runs over /v1/completions only: a chat endpoint "
                "renders harmony itself and declares no python tool (vLLM, TensorRT-LLM), so "
                "the model could not call code; use api_mode auto or completions"
            )
        if template is None and family.harmony is None:
            template = chat_template_for(settings, card.id)
        llm = open_llm(
            urls,
            card.id,
            settings.agent,
            settings.llm_api_key,
            template,
            context_len=card.max_model_len,
            renders_itself=family.harmony is not None,
        )
        stack.push_async_callback(llm.replicas.aclose)
        solver = Solver(llm, sandbox, settings.agent)
        yield SolverRuntime(solver, urls[0], card.id, settings.base_url is None, urls)


async def _card(base_url: str, settings: Settings, model: str | None) -> ModelCard:
    """The served model's name and context; a named model whose card is unreadable still runs."""
    try:
        return await model_card(base_url, settings.llm_api_key, model)
    except LLMError as exc:
        if model is None:
            raise RuntimeError(f"{exc} (give --model)") from exc
        return ModelCard(model)


async def _first_card(urls: list[str], settings: Settings) -> ModelCard:
    """The card of the first replica that answers (a replica down at the start is skipped)."""
    for url in urls[:-1]:
        try:
            return await model_card(url, settings.llm_api_key, settings.model)
        except LLMError:
            continue
    return await _card(urls[-1], settings, settings.model)


def _start_embedded(settings: Settings, rows: int) -> Any:
    from mathagent.serving.embedded import EmbeddedServer

    build = engine_builder(
        settings, engine=engine_settings_for(settings.engine, rows, settings.model)
    )
    return EmbeddedServer(build).__enter__()


def engine_config(
    settings: Settings, model: str | None = None, engine: EngineSettings | None = None
) -> EngineConfig:
    """The embedded engine's config, its model resolved here (the one caller of the model store).

    ``model`` (else ``settings.model``) is a path or ``random:SHAPE``; none means the default
    model, fetched into the cache on first use.
    """
    from mathagent.model_store import resolve_model
    from mathagent.serving.engine.config import EngineConfig

    spec = resolve_model(model or settings.model, settings.model_dir)
    return EngineConfig.from_settings(engine or settings.engine, spec)


def engine_builder(
    settings: Settings, model: str | None = None, engine: EngineSettings | None = None
) -> Callable[[], LLMEngine]:
    """What builds the embedded engine when called: in the engine's own thread, so the model
    is resolved, fetched and loaded there while the caller goes on."""

    def build() -> LLMEngine:
        from mathagent.serving.engine.llm_engine import LLMEngine

        return LLMEngine(engine_config(settings, model, engine), settings.model_dir)

    return build


def chat_template_for(settings: Settings, model: str) -> ChatTemplate | None:
    """The chat template for a model behind an external endpoint, from local files only.

    Looks at ``agent.tokenizer``, then the configured model path, then the default model's
    cached copy, then ``model`` itself (a folder or a cached Hugging Face name). ``None`` when
    nothing is found and the API mode allows chat; an error when completions were demanded.
    """
    mode = settings.agent.api_mode
    if mode == "chat":
        return None
    source = settings.agent.tokenizer or _local_tokenizer(settings, model) or model
    try:
        return ChatTemplate.load(source)
    except (OSError, ValueError) as exc:
        if mode == "completions":
            raise LLMError(f"no chat template for {source!r}: {exc}") from exc
        return None


def _local_tokenizer(settings: Settings, model: str) -> str | None:
    if settings.model and Path(settings.model).expanduser().exists():
        return settings.model
    if model == DEFAULT_MODEL_NAME:
        from mathagent.model_store import default_gguf_path

        gguf = default_gguf_path(settings.model_dir)
        converted = gguf.parent / gguf.stem  # the engine's converted copy, when it exists
        return str(converted if (converted / "tokenizer_config.json").is_file() else gguf)
    return None


async def run_eval(request: EvalRequest, settings: Settings) -> dict[str, Any]:
    """``mathagent eval``: problems checked first, then the solver, then the resumable run."""
    from mathagent.evals.eval_command import evaluate, load_problems

    problems = load_problems(request, settings.data_dir)
    rows = request.concurrency * (request.samples or planned_samples(settings.agent))
    async with open_solver(settings, tools=request.tools, concurrent_rows=rows) as rt:
        plan = rt.solver.plan
        meta = {
            "dataset": request.dataset,
            "tools": request.tools,
            "model": rt.model,
            "base_url": "embedded" if rt.embedded else ",".join(rt.base_urls),
            "temperature": plan.temperature,
            "max_tokens": plan.max_tokens,
            "prompt_format": plan.family.name,
            "recipe": settings.agent.recipe,
        }
        return await evaluate(request, problems, rt.solver, rt.base_url, meta)
