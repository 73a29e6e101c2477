"""The fake servers behave as vLLM and TensorRT-LLM do; each test names the source it pins.

The real ``openai`` client talks to the fakes over HTTP, as the agent's client does.
Citations: see the module docstring of ``fake_servers`` (file @ commit).
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.agent.conformance.fake_servers import (
    HARMONY,
    QWEN_IM_END,
    QWEN_TOOL_CALL,
    QWEN_TOOL_CALL_END,
    FakeServer,
    ServedModel,
    Token,
    gpt_oss_model,
    harmony_tokens,
    qwen_model,
    run_engine,
    text_tokens,
)

CALL = "<|channel|>analysis to=python code<|message|>print(1)\n"


def client(server: FakeServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


def openmath_turn() -> list[Token]:
    """'Hi.\\n<tool_call>\\nprint(1)\\n</tool_call>\\nmore<|im_end|>' as Qwen tokens."""
    return [
        *text_tokens("Hi.\n"),
        QWEN_TOOL_CALL,
        *text_tokens("\nprint(1)\n", 2000),
        QWEN_TOOL_CALL_END,
        *text_tokens("\nmore", 3000),
        QWEN_IM_END,
    ]


def complete(server: FakeServer, **kw) -> openai.types.Completion:
    kw.setdefault("max_tokens", 1000)
    return client(server).completions.create(model=server.model.name, prompt="p", **kw)


def choice_extra(choice) -> dict:
    return choice.model_extra or {}


# -- vLLM ---------------------------------------------------------------------------------------


def test_vllm_strips_special_tokens_unless_asked():
    """detokenizer.py @ e372329d: special tokens decode to nothing with skip_special_tokens
    (protocol.py @ ec3b890c: default True); ``"skip_special_tokens": false`` keeps them."""
    turn = [*harmony_tokens("<|channel|>final<|message|>Hi"), HARMONY["<|return|>"]]
    with FakeServer([turn, turn], "vllm", gpt_oss_model()) as server:
        stripped = complete(server)
        kept = complete(server, extra_body={"skip_special_tokens": False})
    assert stripped.choices[0].text == "finalHi"
    assert kept.choices[0].text == "<|channel|>final<|message|>Hi"
    assert server.requests[1]["skip_special_tokens"] is False


def test_vllm_stop_string_is_dropped_and_reported():
    """StopChecker.check_stop_strings: text cut before the stop string, finish_reason "stop",
    stop_reason = the string; include_stop_str_in_output keeps it."""
    with FakeServer([openmath_turn(), openmath_turn()], "vllm", qwen_model()) as server:
        dropped = complete(server, stop=["</tool_call>"])
        kept = complete(
            server, stop=["</tool_call>"], extra_body={"include_stop_str_in_output": True}
        )
    c = dropped.choices[0]
    assert c.text == "Hi.\n<tool_call>\nprint(1)\n"
    assert (c.finish_reason, choice_extra(c)["stop_reason"]) == ("stop", "</tool_call>")
    assert kept.choices[0].text == "Hi.\n<tool_call>\nprint(1)\n</tool_call>"
    # Every generated token counts, the one that completed the stop string included:
    # "Hi.\n" 4 + <tool_call> 1 + "\nprint(1)\n" 10 + </tool_call> 1.
    assert dropped.usage.completion_tokens == 16


def test_vllm_eos_reports_no_stop_reason_and_drops_its_text():
    """check_stop @ 018d5dc7: the tokenizer's EOS -> "stop", stop_reason None; the stopping
    token is not detokenized, even with skip_special_tokens false."""
    turn = [*text_tokens("done"), QWEN_IM_END]
    with FakeServer([turn], "vllm", qwen_model()) as server:
        res = complete(server, extra_body={"skip_special_tokens": False})
    c = res.choices[0]
    assert (c.text, c.finish_reason, choice_extra(c)["stop_reason"]) == ("done", "stop", None)


def test_vllm_generation_config_eos_is_a_stop_token_reported_by_id():
    """update_from_generation_config: gpt-oss' extra EOS ids (<|call|> 200012) become
    stop_token_ids; check_stop reports stop_reason = 200012 and the token's text is dropped,
    although the request asked for the stop *string* "<|call|>" and to keep special tokens."""
    turn = harmony_tokens("<|channel|>analysis<|message|>x<|end|><|start|>assistant" + CALL)
    turn += [HARMONY["<|call|>"], *harmony_tokens("<|start|>assistant")]
    with FakeServer([turn], "vllm", gpt_oss_model()) as server:
        res = complete(server, stop=["<|call|>"], extra_body={"skip_special_tokens": False})
    c = res.choices[0]
    assert c.text.endswith(CALL)
    assert "<|call|>" not in c.text
    assert (c.finish_reason, choice_extra(c)["stop_reason"]) == ("stop", 200012)


def test_vllm_request_stop_token_ids():
    """check_stop: a stop_token_ids member -> stop_reason = its id (an int)."""
    turn = [*text_tokens("ab"), Token("<sep>", 77, special=True), *text_tokens("cd")]
    with FakeServer([turn], "vllm", ServedModel()) as server:
        res = complete(server, extra_body={"stop_token_ids": [77]})
    c = res.choices[0]
    assert (c.text, choice_extra(c)["stop_reason"]) == ("ab", 77)


def test_vllm_max_tokens_gives_length_and_completions_default_is_16():
    """check_stop: max_tokens reached -> "length"; protocol.py: completions max_tokens=16."""
    with FakeServer([text_tokens("x" * 40)] * 2, "vllm", ServedModel()) as server:
        capped = complete(server, max_tokens=5)
        default = client(server).completions.create(model=server.model.name, prompt="p")
    assert (capped.choices[0].text, capped.choices[0].finish_reason) == ("xxxxx", "length")
    assert len(default.choices[0].text) == 16
    assert default.choices[0].finish_reason == "length"


def test_vllm_refuses_a_max_tokens_past_the_context():
    """serving_engine.py @ 7ded96b3 _validate_input: prompt + max_tokens (chat: max_completion_
    tokens first; completions: 16 when unset) > max_model_len is a 400; chat without either gets
    the rest of the context."""
    model = ServedModel(max_model_len=100)
    with FakeServer([text_tokens("y" * 300)] * 2, "vllm", model) as server:
        with pytest.raises(openai.BadRequestError, match="maximum context length is 100"):
            complete(server, max_tokens=100)  # a 1-token prompt: 99 fit
        with pytest.raises(openai.BadRequestError, match="101 tokens"):
            client(server).chat.completions.create(
                model=model.name, messages=[{"role": "user", "content": "hi"}],
                max_tokens=10, max_completion_tokens=93,
            )  # fmt: skip  # the messages' JSON counts 8 tokens here: 8 + 93 = 101
        fits = complete(server, max_tokens=99)
        rest = client(server).chat.completions.create(
            model=model.name, messages=[{"role": "user", "content": "hi"}]
        )
    assert fits.usage.completion_tokens == 99
    assert rest.choices[0].finish_reason == "length"
    assert rest.usage.prompt_tokens + rest.usage.completion_tokens == 100
    assert len(server.requests) == 4


def test_vllm_stream_holds_back_stop_strings_and_reports_usage():
    """detokenizer.py: while streaming, max(len(stop)) - 1 chars are held back, so no delta ever
    carries part of the stop string; include_usage adds a last chunk with choices []."""
    with FakeServer([openmath_turn()], "vllm", qwen_model()) as server:
        stream = complete(
            server, stop=["</tool_call>"], stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == "Hi.\n<tool_call>\nprint(1)\n"
    finishing = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1
    assert choice_extra(finishing[0])["stop_reason"] == "</tool_call>"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16


def test_vllm_stream_hold_back_on_a_partial_match():
    """get_next_output_text: each step releases text up to len - (len(stop) - 1); the rest
    comes with the finishing step."""
    turn = text_tokens("a</tool_cal!b")
    engine = run_engine(
        turn, {"stop": ["</tool_call>"], "max_tokens": 100}, ServedModel(), "vllm", 1, chat=False
    )
    assert engine.deltas == ["a", "<", "/tool_cal!b"]
    assert engine.finish_reason == "stop" and engine.stop_reason is None


def test_vllm_rejects_stream_options_without_stream():
    """protocol.py validate_stream_options: a 400."""
    with FakeServer([text_tokens("x")], "vllm") as server, pytest.raises(openai.BadRequestError):
        complete(server, stream_options={"include_usage": True})


def test_vllm_chat_stream_and_models():
    """Chat streams start with the role; /v1/models lists max_model_len (vLLM's ModelCard)."""
    with FakeServer([[*text_tokens("ok"), QWEN_IM_END]], "vllm", qwen_model()) as server:
        c = client(server)
        chunks = list(
            c.chat.completions.create(
                model=server.model.name,
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        models = httpx.get(server.base_url + "/models").json()
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "ok"
    assert chunks[-1].usage is not None
    assert models["data"][0]["id"] == "nvidia/OpenMath-Nemotron-14B"
    assert models["data"][0]["max_model_len"] == 32768
    assert server.requests[0]["messages"] == [{"role": "user", "content": "hi"}]


# -- TensorRT-LLM -------------------------------------------------------------------------------


def test_trtllm_stop_string_matched_as_tokens():
    """sampling_params.py @ 000a01de: stop strings are tokenized alone and matched as ids;
    result.py @ 005bc848: STOP_WORDS -> "stop", stop_reason = the string, tokens cut."""
    with FakeServer([openmath_turn()], "trtllm", qwen_model()) as server:
        res = complete(server, stop=["</tool_call>"])
    c = res.choices[0]
    assert c.text == "Hi.\n<tool_call>\nprint(1)\n"
    assert (c.finish_reason, choice_extra(c)["stop_reason"]) == ("stop", "</tool_call>")


def test_trtllm_stop_string_spelled_differently_does_not_stop():
    """Token-level matching: a stop string whose own tokenization differs from how the model
    spelled it never matches (vLLM, matching text, would stop)."""
    model = qwen_model(tokenization={"```\n": [9001]})
    turn = [*text_tokens("```"), *text_tokens("\n", 5000), *text_tokens("after", 6000), QWEN_IM_END]
    with FakeServer([turn, turn], "trtllm", model) as trt:
        t = complete(trt, stop=["```\n"])
    with FakeServer([turn], "vllm", model) as vllm:
        v = complete(vllm, stop=["```\n"])
    assert t.choices[0].text == "```\nafter"
    assert choice_extra(t.choices[0])["stop_reason"] is None
    assert (v.choices[0].text, choice_extra(v.choices[0])["stop_reason"]) == ("", "```\n")


def test_trtllm_does_not_fold_generation_config_eos():
    """sampling_params.py _setup: end_id is the tokenizer's EOS only; gpt-oss' <|call|> stops
    only when the request names it, and is then reported as the string it was asked by."""
    turn = [*harmony_tokens(CALL), HARMONY["<|call|>"], *harmony_tokens("<|start|>assistant")]
    turn += [HARMONY["<|return|>"]]
    with FakeServer([turn, turn, turn], "trtllm", gpt_oss_model()) as server:
        unasked = complete(server, extra_body={"skip_special_tokens": False})
        by_string = complete(server, stop=["<|call|>"], extra_body={"skip_special_tokens": False})
        by_id = complete(
            server, extra_body={"skip_special_tokens": False, "stop_token_ids": [200012]}
        )
    assert unasked.choices[0].text == CALL + "<|call|><|start|>assistant"
    assert choice_extra(unasked.choices[0])["stop_reason"] is None
    assert (by_string.choices[0].text, choice_extra(by_string.choices[0])["stop_reason"]) == (
        CALL,
        "<|call|>",
    )
    assert choice_extra(by_id.choices[0])["stop_reason"] == 200012


def test_trtllm_strips_special_tokens_by_default():
    """openai_protocol.py @ 0076e939: skip_special_tokens defaults to True."""
    turn = [*harmony_tokens(CALL), HARMONY["<|return|>"]]
    with FakeServer([turn], "trtllm", gpt_oss_model()) as server:
        res = complete(server)
    assert res.choices[0].text == "analysis to=python codeprint(1)\n"


def test_trtllm_stream_leaks_the_head_of_a_multi_token_stop_word():
    """result.py: the stop word is cut on the final response; earlier tokens of a multi-token
    stop word were already streamed. A one-token stop word never is."""
    model = ServedModel(tokenization={"END": [ord("E"), ord("N"), ord("D")]})
    turn = [Token(ch, ord(ch)) for ch in "abEND"]
    with FakeServer([turn, [*turn]], "trtllm", model) as server:
        stream = complete(server, stop=["END"], stream=True)
        streamed = "".join(c.choices[0].text for c in stream if c.choices)
        whole = complete(server, stop=["END"]).choices[0].text
    assert whole == "ab"
    assert streamed == "abEN"


def test_trtllm_max_tokens_defaults_to_the_rest_of_the_context():
    """openai_protocol.py: max_tokens None -> not 16 as in vLLM."""
    model = ServedModel(max_model_len=100)
    with FakeServer([text_tokens("y" * 300)], "trtllm", model) as server:
        res = client(server).completions.create(model=model.name, prompt="p")
    assert res.choices[0].finish_reason == "length"
    assert res.usage.completion_tokens == 99


def test_trtllm_chat_first_chunk_has_a_space_before_the_blank_line():
    """postprocess_handlers.py @ 01bf1923: f"data: {...} \\n\\n" for the role chunk."""
    with FakeServer([[*text_tokens("ok"), QWEN_IM_END]], "trtllm", qwen_model()) as server:
        raw = httpx.post(
            server.base_url + "/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        ).text
    first = raw.split("\n\n")[0]
    assert first.endswith("} ")
    assert json.loads(first[len("data: ") :])["choices"][0]["delta"]["role"] == "assistant"


# -- the bad-input mode -------------------------------------------------------------------------


def test_ignores_skip_special_tokens_mode_strips_whatever_the_request_says():
    turn = [*harmony_tokens("<|channel|>final<|message|>Hi"), HARMONY["<|return|>"]]
    with FakeServer([turn], "ignores-skip-special-tokens", gpt_oss_model()) as server:
        res = complete(server, extra_body={"skip_special_tokens": False})
    assert res.choices[0].text == "finalHi"


def test_exhausted_script_is_a_500_and_requests_are_recorded():
    with FakeServer([], "vllm") as server, pytest.raises(openai.InternalServerError):
        complete(server)
    assert server.requests[0]["prompt"] == "p"


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown mode"):
        FakeServer([], "sglang")


async def test_async_client_streams_as_the_agent_does():
    """The agent's client (AsyncOpenAI, stream + include_usage) against the vLLM fake."""
    with FakeServer([openmath_turn()], "vllm", qwen_model()) as server:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="x") as c:
            stream = await c.completions.create(
                model=server.model.name,
                prompt="p",
                max_tokens=100,
                stop=["</tool_call>"],
                stream=True,
                stream_options={"include_usage": True},
            )
            text, stop_reason = "", "unset"
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].text
                    if chunk.choices[0].finish_reason:
                        stop_reason = choice_extra(chunk.choices[0])["stop_reason"]
    assert text == "Hi.\n<tool_call>\nprint(1)\n"
    assert stop_reason == "</tool_call>"


def test_a_special_stop_string_under_skip_special_tokens():
    """vLLM matches stop strings in the detokenized text (detokenizer.py): with special tokens
    stripped, "<|call|>" never appears, so it cannot stop there (here the model's
    generation_config lists no <|call|>). TensorRT-LLM matches the token (sampling_params.py
    _setup) and stops, reporting the string, whatever skip_special_tokens says."""
    model = gpt_oss_model(generation_eos_ids=(200002,))
    turn = [*harmony_tokens(CALL), HARMONY["<|call|>"], *harmony_tokens("<|start|>assistant")]
    turn.append(HARMONY["<|return|>"])
    with FakeServer([turn], "vllm", model) as vllm:
        v = complete(vllm, stop=["<|call|>"])
    with FakeServer([turn], "trtllm", model) as trt:
        t = complete(trt, stop=["<|call|>"])
    assert v.choices[0].text == "analysis to=python codeprint(1)\nassistant"
    assert choice_extra(v.choices[0])["stop_reason"] is None
    assert t.choices[0].text == "analysis to=python codeprint(1)\n"
    assert choice_extra(t.choices[0])["stop_reason"] == "<|call|>"
