"""A tokenizer used instead of the model's own (``MATHAGENT_ENGINE__TOKENIZER``, vLLM's
``--tokenizer``): a random-weight shape, which has none, served over real HTTP to the OpenAI
client with the default model's tokenizer, as the 8B rows of ``benchmarks/bench_table.py`` are."""

from __future__ import annotations

import openai
import pytest

from mathagent.config import EngineSettings, Settings
from mathagent.model_store import fetch_default_model
from mathagent.serving.embedded import EmbeddedServer
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.loader import ModelLoadError


def _engine(shape: str, tokenizer: str) -> LLMEngine:
    settings = EngineSettings(device="cpu", dtype="float32", max_batch_size=2, max_seq_len=256,
                              tokenizer=tokenizer)  # fmt: skip
    model_dir = Settings().model_dir
    return LLMEngine(EngineConfig.from_settings(settings, f"random:{shape}"), model_dir)


@pytest.fixture(scope="module")
def gguf() -> str:
    return str(fetch_default_model(Settings().model_dir))


def test_a_random_shape_serves_chat_with_a_stand_in_tokenizer(gguf):
    engine = _engine("smollm2-135m", gguf)  # the default model's shape: ids share one range
    assert engine.tokenizer is not None and engine.tokenizer.chat_template
    with EmbeddedServer(engine) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="EMPTY", max_retries=0)
        out = client.chat.completions.create(
            model=srv.model_name, messages=[{"role": "user", "content": "What is 2 + 2?"}],
            max_tokens=6, temperature=0, extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert out.usage.completion_tokens == 6 and out.usage.prompt_tokens > 5
        assert isinstance(out.choices[0].message.content, str)
        text = client.completions.create(model=srv.model_name, prompt="1, 2,", max_tokens=3)
        assert text.usage.prompt_tokens == len(engine.tokenizer.encode("1, 2,"))


def test_ids_outside_the_models_vocabulary_are_a_400(gguf):
    engine = _engine("tiny", gguf)  # 1024 ids: the stand-in's chat prompt has larger ones
    with EmbeddedServer(engine) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="EMPTY", max_retries=0)
        with pytest.raises(openai.BadRequestError, match=r"token ids must lie in \[0, 1024\)"):
            client.chat.completions.create(
                model=srv.model_name, messages=[{"role": "user", "content": "Hello"}], max_tokens=2
            )
        ok = client.completions.create(model=srv.model_name, prompt=[1, 2, 3], max_tokens=2)
        assert ok.usage.completion_tokens >= 1  # the server keeps serving


@pytest.mark.parametrize("spec", ["/no/such/tokenizer", __file__])
def test_a_missing_tokenizer_is_a_clear_error(spec):
    with pytest.raises(ModelLoadError, match=r"not a folder or a \.gguf file"):
        _engine("tiny", spec)


def test_a_folder_without_tokenizer_files_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"has none of tokenizer\.json"):
        _engine("tiny", str(tmp_path))


@pytest.mark.parametrize(
    ("model", "dtype", "adaptive", "tokens"),
    [
        ("random:smollm2-135m", "float32", "false", 13),
        # bf16 with the draft-length policy on, as the 8B table rows run (the stable variant's
        # path surviving other rounding is checked in engine/test_random_model.py)
        ("random:smollm2-135m:stable", "bfloat16", "true", 40),
    ],
)
def test_the_replay_server_drafts_at_the_acceptance_it_was_set(
    clean_env, gguf, tmp_path, model, dtype, adaptive, tokens
):
    """``benchmarks/replay_server.py`` (bench_table's ``+replayN`` rows): the project's server
    with the replay as its default method lands ``N - 1`` drafts a step on the prompts it
    recorded, rendered as ``mathagent bench`` sends them, and none on others."""
    from benchmarks.replay_server import builder, parse_args
    from mathagent.evals.bench import PROMPT_SUFFIX

    for key, value in {"MODEL": model, "ENGINE__DEVICE": "cpu", "ENGINE__DTYPE": dtype,
                       "ENGINE__TOKENIZER": gguf, "ENGINE__MAX_SEQ_LEN": "256",
                       "ENGINE__DRAFT_LEN": "4", "ENGINE__ADAPTIVE_DRAFT": adaptive}.items():  # fmt: skip
        clean_env.setenv(f"MATHAGENT_{key}", value)
    problems = tmp_path / "p.jsonl"
    problems.write_text('{"id": "a", "problem": "What is 2 + 3?", "answer": "5"}\n')
    args = parse_args(["--accept", "3", "--prompts", f"{problems}:1", "--max-tokens", str(tokens)])
    with EmbeddedServer(builder(Settings(), args)) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="EMPTY", max_retries=0)

        def acceptance(problem: str) -> float:
            out = client.chat.completions.create(
                model=srv.model_name, max_tokens=tokens, temperature=0,
                extra_body={"ignore_eos": True},
                messages=[{"role": "user", "content": problem + PROMPT_SUFFIX}],
            )  # fmt: skip
            return out.model_extra["speculative"]["acceptance_length"]

        assert acceptance("What is 2 + 3?") == pytest.approx(3.0, abs=0.35)
        assert acceptance("What is 7 + 1?") == pytest.approx(1.0, abs=0.1)
