#!/usr/bin/env python3
"""Golden fixtures for the agent's model formats, produced by running the reference code itself.

Issue 14: what a model sees (first request, second request after one code call, sandbox
feedback) must be byte-identical to what the reference produces. This script imports and runs
the references and writes what they return under ``tests/agent/fixtures/``; the tests compare
against those files. It is not run by CI (the fixtures are committed); anyone with the same
checkouts can run it again and get the same bytes (the sandbox cells print nothing that varies).

References (pass their checkouts; fetch them, never vendor them):

- ``--nemo-skills``: NVIDIA/NeMo-Skills at its newest commit (prompt utilities, code tags,
  ``CodeExecutionWrapper``, ``VLLMModel``, the local sandbox server and client).
- ``--nemo-skills-release``: NVIDIA/NeMo-Skills at the OpenMathReasoning release commit
  (2025-04-23, "Release docs (#438)"), the era OpenMath-Nemotron was trained and evaluated in.
- ``--gpt-oss``: openai/gpt-oss (its python tool's response message).
- ``--encodings``: a folder holding ``o200k_base.tiktoken`` (sha256 446a9538...); the
  ``openai-harmony`` package reads it through ``TIKTOKEN_ENCODINGS_BASE`` and checks the hash.
- ``--templates``: a folder of chat templates (``*.jinja``) to render completions-mode text.

Run it with a Python that has the references' dependencies (a separate venv, see
``tests/agent/fixtures/README.md``)::

    /work/ref/venv/bin/python scripts/reference_fixtures.py --nemo-skills /work/ref/nemo-skills \
        --nemo-skills-release /work/ref/nemo-skills-2025-04 --gpt-oss /work/ref/gpt-oss \
        --encodings /work/ref/encodings --templates /work/ref/llamacpp-templates

Both NeMo-Skills checkouts define the package ``nemo_skills``, so each part runs in its own
subprocess with its checkout first on ``sys.path``. Two import-time dependencies that the
paths used here never call (``nemo_run`` and ``mcp``, pulled in by cluster and tool-calling
modules) are replaced by empty stand-ins, as is ``nemo_skills.pipeline`` (cluster utilities).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import subprocess
import sys
import tempfile
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXED_DATE = "2025-11-14"  # the newest NeMo-Skills commit's date; pins strftime_now and harmony

# The problem every family is asked, and the model's scripted code call.
PROBLEM = "What is $12 \\cdot 9 - 4$?"
CODE = "print(12 * 9 - 4)\n"

# Canonical sandbox cells, run in this order in one session.
CELLS: list[tuple[str, str]] = [
    ("print", "print('hello')"),
    ("bare_expression", "x = 21\nx * 2"),
    ("zero_division", "1 / 0"),
    ("name_error_in_function", "def f():\n    return undefined_name\n\nf()"),
    ("syntax_error", "print('unclosed'"),
    ("stdout_and_stderr", "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)"),
    ("long_output", "print('x' * 1500)"),
    ("state_kept", "print(x)"),
    ("timeout", "import time\nwhile True:\n    time.sleep(0.1)"),
    ("state_after_timeout", "print(x)"),
]


def git_commit(path: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    if out.returncode == 0:
        return out.stdout.strip()
    return (path / "COMMIT").read_text().strip()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Shared helpers (run inside the part subprocesses)


class _Stub(types.ModuleType):
    __path__: list[str] = []  # noqa: RUF012 - a package, so submodules import

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        return _Stub("call")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty stand-ins for modules the exercised code paths import but never call."""

    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in ("nemo_run", "mcp") or name.startswith("nemo_skills.pipeline"):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Stub(spec.name)

    def exec_module(self, module):
        pass


def use_checkout(path: str) -> None:
    sys.meta_path.insert(0, _StubFinder())
    sys.path.insert(0, path)


def pin_template_date() -> None:
    """transformers' ``strftime_now`` (used by the gpt-oss template) returns FIXED_DATE."""
    import transformers.utils.chat_template_utils as ctu

    fixed = _dt.datetime.fromisoformat(FIXED_DATE)

    class _Fixed(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return fixed

    ctu.datetime = _Fixed


def hf_tokenizer(template_file: Path, bos: str | None, eos: str | None):
    """A transformers tokenizer carrying only a chat template: enough for apply_chat_template."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")),
        bos_token=bos,
        eos_token=eos,
        unk_token="<unk>",
    )
    tok.chat_template = template_file.read_text()
    return tok


class Recorder:
    """An OpenAI-compatible endpoint that records request bodies and answers from a script.

    Each scripted answer is a vLLM-style non-streaming completion choice: ``text`` (the stop
    string or stop token already removed, as vLLM removes it), ``finish_reason``, and
    ``stop_reason`` (the stop string, a token id, or None).
    """

    def __init__(self, script: list[dict]):
        self.script = list(script)
        self.requests: list[dict] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                recorder.requests.append({"path": self.path, "body": body})
                turn = recorder.script.pop(0)
                chat = self.path.endswith("/chat/completions")
                if body.get("stream"):
                    self._stream(turn, chat, body)
                    return
                choice = {"index": 0, "finish_reason": turn["finish_reason"], "logprobs": None}
                choice["stop_reason"] = turn.get("stop_reason")
                if chat:
                    choice["message"] = {"role": "assistant", "content": turn["text"]}
                else:
                    choice["text"] = turn["text"]
                payload = {
                    "id": "cmpl-fixture",
                    "object": "chat.completion" if chat else "text_completion",
                    "created": 0,
                    "model": body.get("model", "model"),
                    "choices": [choice],
                    "usage": {
                        "prompt_tokens": 100,
                        "completion_tokens": turn.get("completion_tokens", 10),
                        "total_tokens": 110,
                    },
                }
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, turn, chat, body):
                """vLLM-style SSE: the text in two pieces, then the finishing chunk."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                text = turn["text"]
                half = len(text) // 2
                pieces = [(text[:half], None), (text[half:], None), ("", turn["finish_reason"])]
                for piece, finish in pieces:
                    choice = {"index": 0, "logprobs": None, "finish_reason": finish}
                    choice["stop_reason"] = turn.get("stop_reason") if finish else None
                    if chat:
                        choice["delta"] = {"content": piece}
                    else:
                        choice["text"] = piece
                    chunk = {
                        "id": "cmpl-fixture",
                        "object": "chat.completion.chunk" if chat else "text_completion",
                        "created": 0,
                        "model": body.get("model", "model"),
                        "choices": [choice],
                    }
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def serve_wsgi(app) -> int:
    """Run a Flask app (the reference sandbox server) on a loopback port in a thread."""
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_port


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------
# Part 1: NeMo-Skills, newest commit


def _newest_scripts() -> dict[str, list[dict]]:
    """vLLM-style answers for each family's first two turns (see Recorder)."""
    return {
        "openmath": [
            {
                "text": "I'll compute it.\n<tool_call>\n" + CODE,
                "finish_reason": "stop",
                "stop_reason": "</tool_call>",
                "completion_tokens": 12,
            },
            {"text": "So the answer is $\\boxed{104}$.", "finish_reason": "stop"},
        ],
        "qwen": [
            {
                "text": "Let's compute it.\n```python\n" + CODE,
                "finish_reason": "stop",
                "stop_reason": "```\n",
                "completion_tokens": 12,
            },
            {"text": "The answer is $\\boxed{104}$.", "finish_reason": "stop"},
        ],
        "gpt-oss": [
            {
                # vLLM with gpt-oss' generation config: <|call|> (200012) is a stop token id,
                # so it ends generation with stop_reason 200012 and its text dropped.
                "text": "<|channel|>analysis<|message|>Compute it with python.<|end|>"
                "<|start|>assistant<|channel|>analysis to=python code<|message|>" + CODE,
                "finish_reason": "stop",
                "stop_reason": 200012,
                "completion_tokens": 20,
            },
            {
                "text": "<|channel|>final<|message|>The answer is $\\boxed{104}$.",
                "finish_reason": "stop",
                "stop_reason": None,
            },
        ],
        "gpt-oss-trtllm": [
            {
                # trtllm-serve: the request's stop string "<|call|>" is matched as its token and
                # reported by the string (tensorrt_llm/executor/result.py _handle_sequence).
                "text": "<|channel|>analysis<|message|>Compute it with python.<|end|>"
                "<|start|>assistant<|channel|>analysis to=python code<|message|>" + CODE,
                "finish_reason": "stop",
                "stop_reason": "<|call|>",
                "completion_tokens": 20,
            },
            {
                "text": "<|channel|>final<|message|>The answer is $\\boxed{104}$.",
                "finish_reason": "stop",
                "stop_reason": None,
            },
        ],
        "gpt-oss-first-message-call": [
            {
                "text": "<|channel|>analysis to=python code<|message|>" + CODE,
                "finish_reason": "stop",
                "stop_reason": 200012,
                "completion_tokens": 12,
            },
        ],
    }


NEWEST_CASES: list[dict] = [
    {
        "name": "openmath_tir",
        "models": "nvidia/OpenMath-Nemotron-1.5B, -7B, -14B, -32B",
        "prompt_config": "openmath/tir",
        "code_tags": "openmath",
        "template": "Qwen-Qwen2.5-7B-Instruct.jinja",
        "script": "openmath",
        "system_message": None,
        "data": {"problem": PROBLEM, "total_code_executions": 8},
        "code_execution": {"max_code_executions": 8, "add_remaining_code_executions": True},
        "inference": {"temperature": 0.6, "tokens_to_generate": 32768},
        "source": "docs/releases/openmathreasoning/evaluation.md (Run TIR evaluations)",
    },
    {
        "name": "openmath_tir_empty_system",
        "models": "nvidia/OpenMath-Nemotron-1.5B, -7B, -14B, -32B (training-data layout)",
        "prompt_config": "openmath/tir",
        "code_tags": "openmath",
        "template": "Qwen-Qwen2.5-7B-Instruct.jinja",
        "script": "openmath",
        "system_message": "",
        "data": {"problem": PROBLEM, "total_code_executions": 8},
        "code_execution": {"max_code_executions": 8, "add_remaining_code_executions": True},
        "inference": {"temperature": 0.6, "tokens_to_generate": 32768},
        "source": "docs/releases/openmathreasoning/training.md: get_prompt(..., "
        "tokenizer='Qwen/Qwen2.5-32B-Instruct', code_tags='openmath', system_message='')",
    },
    {
        "name": "openmath_kaggle",
        "models": "nvidia/OpenMath-Nemotron-14B-Kaggle",
        "prompt_config": "generic/math",
        "code_tags": "openmath",
        "template": "Qwen-Qwen2.5-7B-Instruct.jinja",
        "script": "openmath",
        "system_message": None,
        "data": {"problem": PROBLEM},
        "code_execution": {"max_code_executions": 8},
        "inference": {"temperature": 0.6, "tokens_to_generate": 32768},
        "source": "docs/releases/openmathreasoning/evaluation.md (the Kaggle exception)",
    },
    {
        "name": "openmath_tir_chat",
        "models": "nvidia/OpenMath-Nemotron-14B over /v1/chat/completions",
        "prompt_config": "openmath/tir",
        "code_tags": "openmath",
        "template": None,
        "script": "openmath",
        "system_message": None,
        "data": {"problem": PROBLEM, "total_code_executions": 8},
        "code_execution": {"max_code_executions": 8, "add_remaining_code_executions": True},
        "inference": {"temperature": 0.6, "tokens_to_generate": 32768},
        "source": "nemo_skills/inference/model/code_execution.py (is_openai_format branch)",
    },
    {
        "name": "qwen25_math_tir",
        "models": "Qwen/Qwen2.5-Math-7B-Instruct (and -1.5B, -72B)",
        "prompt_config": "qwen/math-tir",
        "code_tags": "qwen",
        "template": "Qwen-Qwen2.5-7B-Instruct.jinja",
        "script": "qwen",
        "system_message": None,
        "data": {"problem": PROBLEM},
        "code_execution": {"max_code_executions": 8},
        "inference": {"temperature": 0.0, "tokens_to_generate": 4096},
        "source": "nemo_skills/prompt/config/qwen/math-tir.yaml + code_tags/qwen.yaml",
    },
    {
        "name": "qwen3_think",
        "models": "Qwen/Qwen3-* (thinking)",
        "prompt_config": "qwen3/math-cot-think",
        "code_tags": "qwen",
        "template": "Qwen-Qwen3-0.6B.jinja",
        "script": "qwen",
        "system_message": None,
        "data": {"problem": PROBLEM},
        "code_execution": {"max_code_executions": 8},
        "inference": {"temperature": 0.6, "tokens_to_generate": 32768},
        "source": "nemo_skills/prompt/config/qwen3/math-cot-think.yaml (NeMo-Skills has no "
        "Qwen3 TIR config; paired here with its qwen code tags)",
    },
    {
        "name": "gpt_oss_tir",
        "models": "openai/gpt-oss-120b (and -20b)",
        "prompt_config": "gpt-oss/math",
        "code_tags": "gpt-oss",
        "template": "openai-gpt-oss-120b.jinja",
        "chat_template_kwargs": {"reasoning_effort": "high", "builtin_tools": ["python"]},
        "script": "gpt-oss",
        "system_message": None,
        "data": {"problem": PROBLEM},
        "code_execution": {"max_code_executions": 100},
        "inference": {"temperature": 1.0, "top_p": 1.0, "tokens_to_generate": 120000},
        "source": "docs/tutorials/posts/gpt-oss-python.md (with python)",
    },
    {
        "name": "gpt_oss_tir_trtllm_answers",
        "models": "openai/gpt-oss-120b behind trtllm-serve (stop reported as the string)",
        "prompt_config": "gpt-oss/math",
        "code_tags": "gpt-oss",
        "template": "openai-gpt-oss-120b.jinja",
        "chat_template_kwargs": {"reasoning_effort": "high", "builtin_tools": ["python"]},
        "script": "gpt-oss-trtllm",
        "system_message": None,
        "data": {"problem": PROBLEM},
        "code_execution": {"max_code_executions": 100},
        "inference": {"temperature": 1.0, "top_p": 1.0, "tokens_to_generate": 120000},
        "source": "docs/tutorials/posts/gpt-oss-python.md (with python)",
    },
    {
        "name": "openmath_kaggle_aimo_notebook",
        "models": "nvidia/OpenMath-Nemotron-14B-Kaggle as the AIMO notebook drives it",
        "prompt_config": "generic/math",
        "code_tags": "openmath",
        "template": None,
        "script": "openmath",
        "system_message": None,
        "data": {"problem": PROBLEM},
        "code_execution": {"max_code_executions": 2, "sandbox_traceback_verbosity": "plain"},
        # The notebook's own call: generate_async(prompt=prompt_obj.fill({"problem": ...}),
        # stream=True, random_seed=request_id, temperature=0.7, tokens_to_generate=20000,
        # **prompt_obj.get_code_execution_args()); fill() returns messages, so chat endpoint.
        "call": {"stream": True, "random_seed": 0, "temperature": 0.7, "tokens_to_generate": 20000},
        "server_type": "trtllm",
        "source": "docs/tutorials/notebooks/demo_aimo_inference.ipynb",
    },
    {
        "name": "gpt_oss_tir_first_message_call",
        "models": "openai/gpt-oss-120b: a call as the model's first message",
        "prompt_config": "gpt-oss/math",
        "code_tags": "gpt-oss",
        "template": "openai-gpt-oss-120b.jinja",
        "chat_template_kwargs": {"reasoning_effort": "high", "builtin_tools": ["python"]},
        "script": "gpt-oss-first-message-call",
        "system_message": None,
        "data": {"problem": PROBLEM},
        "code_execution": {"max_code_executions": 100},
        "inference": {"temperature": 1.0, "top_p": 1.0, "tokens_to_generate": 120000},
        "source": "docs/tutorials/posts/gpt-oss-python.md (with python)",
    },
]

TEMPLATE_TOKENS = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": (None, "<|im_end|>"),
    "Qwen-Qwen3-0.6B.jinja": (None, "<|im_end|>"),
    "openai-gpt-oss-120b.jinja": ("<|startoftext|>", "<|return|>"),
}


def part_newest(args: dict) -> None:
    use_checkout(args["nemo_skills"])
    pin_template_date()
    from nemo_skills.code_execution.local_sandbox import local_sandbox_server
    from nemo_skills.code_execution.sandbox import get_sandbox
    from nemo_skills.code_execution.utils import format_code_output
    from nemo_skills.inference.chat_interface.core import AppConfig
    from nemo_skills.inference.generate import InferenceConfig
    from nemo_skills.inference.model import get_code_execution_model
    from nemo_skills.prompt.utils import get_prompt, load_config

    out = Path(args["out"])
    commit = args["nemo_skills_commit"]
    templates = Path(args["templates"])
    sandbox_port = serve_wsgi(local_sandbox_server.app)
    scripts = _newest_scripts()

    # 1. Which prompt each OpenMath-Nemotron variant gets: the chat interface's autodetection.
    mapping = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in [
            "nvidia/OpenMath-Nemotron-1.5B",
            "nvidia/OpenMath-Nemotron-7B",
            "nvidia/OpenMath-Nemotron-14B",
            "nvidia/OpenMath-Nemotron-32B",
            "nvidia/OpenMath-Nemotron-14B-Kaggle",
        ]:
            cfg_path = Path(tmp) / "config.json"
            cfg_path.write_text(json.dumps({"_name_or_path": name}))
            cfg = AppConfig(model_config_path=str(cfg_path))
            mapping[name] = {
                "supported_modes": cfg.supported_modes,
                "code_prompt_config": cfg.code_prompt_config,
                "base_prompt_config": cfg.base_prompt_config,
                "code_tags": cfg.code_tags,
                "add_remaining_code_executions": cfg.add_remaining_code_executions,
                "max_code_executions": cfg.max_code_executions,
                "initial_code_execution_state": cfg.initial_code_execution_state,
            }
    write_json(
        out / "nemo_skills" / "openmath_variants.json",
        {
            "reference": "NVIDIA/NeMo-Skills",
            "commit": commit,
            "function": "nemo_skills/inference/chat_interface/core.py: AppConfig.__post_init__ "
            "(model autodetection from config.json _name_or_path)",
            "variants": mapping,
        },
    )

    # 2. Code tags and prompt configs, as loaded by the reference.
    tags = {
        name: load_config(name, str(Path(args["nemo_skills"]) / "nemo_skills/prompt/code_tags"))
        for name in ("openmath", "qwen", "gpt-oss")
    }
    configs = {
        name: load_config(name)
        for name in (
            "openmath/tir",
            "generic/math",
            "qwen/math-tir",
            "qwen3/math-cot-think",
            "gpt-oss/math",
        )
    }
    inference_defaults = InferenceConfig()
    write_json(
        out / "nemo_skills" / "prompt_configs.json",
        {
            "reference": "NVIDIA/NeMo-Skills",
            "commit": commit,
            "function": "nemo_skills/prompt/utils.py: load_config; "
            "nemo_skills/inference/generate.py: InferenceConfig() defaults",
            "code_tags": tags,
            "prompt_configs": configs,
            "inference_defaults": {
                k: getattr(inference_defaults, k)
                for k in (
                    "temperature",
                    "top_k",
                    "top_p",
                    "min_p",
                    "random_seed",
                    "tokens_to_generate",
                    "repetition_penalty",
                    "timeout",
                )
            },
        },
    )

    # 3. First and second requests per family, through the real model client and wrapper.
    for case in NEWEST_CASES:
        recorder = Recorder(scripts[case["script"]])
        tokenizer = None
        if case["template"]:
            bos, eos = TEMPLATE_TOKENS[case["template"]]
            tokenizer = hf_tokenizer(templates / case["template"], bos, eos)
        prompt = get_prompt(
            case["prompt_config"],
            tokenizer=tokenizer,
            code_tags=case["code_tags"],
            system_message=case["system_message"],
        )
        text_mode = case["template"] is not None
        filled = prompt.fill(
            dict(case["data"]),
            chat_template_kwargs=case.get("chat_template_kwargs") if text_mode else None,
            format_as_string=text_mode,
        )
        sandbox = get_sandbox(host="127.0.0.1", port=str(sandbox_port))
        llm = get_code_execution_model(
            server_type=case.get("server_type", "vllm"),
            model="model",
            base_url=f"http://127.0.0.1:{recorder.port}/v1",
            sandbox=sandbox,
            code_execution=case["code_execution"],
        )
        if "call" in case:
            params = dict(case["call"])

            async def run(llm=llm, filled=filled, params=params, prompt=prompt):
                stream = await llm.generate_async(
                    prompt=filled, **params, **prompt.get_code_execution_args()
                )
                text = ""
                async for chunk in stream:
                    text += chunk["generation"]
                return {"generation": text, "code_rounds_executed": None}

        else:
            inference = InferenceConfig(
                endpoint_type="text" if text_mode else "chat", **case["inference"]
            )
            params = {k: getattr(inference, k) for k in inference.__dataclass_fields__}
            params.pop("extra_body")
            params["extra_body"] = dict(inference.extra_body)

            async def run(llm=llm, filled=filled, params=params, prompt=prompt):
                return await llm.generate_async(
                    prompt=filled,
                    stop_phrases=None,
                    **params,
                    **prompt.get_code_execution_args(),
                )

        result = asyncio.run(run())
        write_json(
            out / "requests" / f"{case['name']}.json",
            {
                "reference": "NVIDIA/NeMo-Skills",
                "commit": commit,
                "functions": [
                    "nemo_skills/prompt/utils.py: get_prompt, Prompt.fill",
                    "nemo_skills/inference/model/code_execution.py: "
                    "CodeExecutionWrapper.generate_async",
                    "nemo_skills/inference/model/vllm.py: VLLMModel "
                    "(through litellm, recorded at the HTTP endpoint)",
                    "nemo_skills/code_execution/sandbox.py: LocalSandbox + "
                    "local_sandbox/local_sandbox_server.py (run in-process)",
                ],
                "models": case["models"],
                "source": case["source"],
                "inputs": {
                    k: case.get(k)
                    for k in (
                        "prompt_config",
                        "code_tags",
                        "system_message",
                        "data",
                        "code_execution",
                        "chat_template_kwargs",
                    )
                },
                "server_type": case.get("server_type", "vllm"),
                "generate_async_kwargs": params,
                "chat_template": case["template"],
                "chat_template_sha256": sha256(templates / case["template"])
                if case["template"]
                else None,
                "code_tags": prompt.get_code_execution_args(),
                "scripted_server_answers": scripts[case["script"]],
                "first_prompt": filled,
                "requests": recorder.requests,
                "generation": result["generation"],
                "code_rounds_executed": result["code_rounds_executed"],
            },
        )
        recorder.server.shutdown()

    # 4. Sandbox feedback: the canonical cells through the real client and server.
    sandbox = get_sandbox(host="127.0.0.1", port=str(sandbox_port))
    cells = asyncio.run(_run_cells_newest(sandbox, format_code_output, tags))
    write_json(
        out / "sandbox" / "nemo_skills_newest.json",
        {
            "reference": "NVIDIA/NeMo-Skills",
            "commit": commit,
            "functions": [
                "nemo_skills/code_execution/sandbox.py: LocalSandbox.execute_code "
                "(language='ipython', timeout=10.0, max_output_characters=1000, "
                "traceback_verbosity='plain', one session for all cells)",
                "nemo_skills/code_execution/local_sandbox/local_sandbox_server.py: app "
                "(run in-process on a loopback port)",
                "nemo_skills/code_execution/utils.py: format_code_output",
            ],
            "environment": _env(),
            "cells": cells,
        },
    )


async def _run_cells_newest(sandbox, format_code_output, tags) -> list[dict]:
    session = None
    cells = []
    for name, code in CELLS:
        res, session = await sandbox.execute_code(
            generated_code=code,
            language="ipython",
            timeout=10.0,
            max_output_characters=1000,
            session_id=session,
            traceback_verbosity="plain",
        )
        cells.append(_cell_record(name, code, res, format_code_output, tags))
    await sandbox.delete_session(str(session))
    # The client's state restoration after a restart: a cell that succeeded once but fails when
    # replayed makes the restoration fail, and the reference reports that to the model.
    flag = Path(tempfile.gettempdir()) / "reference_fixtures_flag"
    flag.unlink(missing_ok=True)
    session = None
    for name, code in [
        ("replay_fails_first_run", f"open({str(flag)!r}, 'x').close()\ny = 1"),
        ("replay_fails_timeout", "import time\nwhile True:\n    time.sleep(0.1)"),
        ("replay_fails_next_cell", "print(y)"),
    ]:
        res, session = await sandbox.execute_code(
            generated_code=code,
            language="ipython",
            timeout=10.0,
            max_output_characters=1000,
            session_id=session,
            traceback_verbosity="plain",
        )
        cells.append(_cell_record(name, code, res, format_code_output, tags))
    await sandbox.delete_session(str(session))
    flag.unlink(missing_ok=True)
    return cells


def _cell_record(name, code, res, format_code_output, tags) -> dict:
    fed_back = {}
    for tag_name, tag in tags.items():
        fed_back[tag_name] = format_code_output(
            res, tag["code_output_begin"], tag["code_output_end"], tag["code_output_format"]
        )
    tag = tags["openmath"]
    fed_back["openmath_remaining_7"] = format_code_output(
        res, tag["code_output_begin"], tag["code_output_end"], tag["code_output_format"], 7
    )
    fed_back["openmath_remaining_0"] = format_code_output(
        res, tag["code_output_begin"], tag["code_output_end"], tag["code_output_format"], 0
    )
    return {"name": name, "code": code, "execution_dict": res, "fed_back": fed_back}


def _env() -> dict:
    import IPython

    return {
        "python": sys.version.split()[0],
        "ipython": IPython.__version__,
        "note": "the reference sandbox image runs Python 3.10 (tiangolo/uwsgi-nginx-flask:"
        "python3.10) with an unpinned ipython; this run used the versions above",
    }


# ---------------------------------------------------------------------------------------------
# Part 2: NeMo-Skills at the OpenMathReasoning release (2025-04-23)

RELEASE_CASES = [
    {
        "name": "openmath_tir_release",
        "models": "nvidia/OpenMath-Nemotron-1.5B, -7B, -14B, -32B",
        "prompt_config": "openmath/math-tir",
        "prompt_template": "openmath-instruct",
        "data": {"problem": PROBLEM, "total_code_executions": 8},
        "code_execution": {"max_code_executions": 8, "add_remaining_code_executions": True},
        "source": "docs/openmathreasoning1/evaluation.md (Run TIR evaluations)",
    },
    {
        "name": "openmath_kaggle_release",
        "models": "nvidia/OpenMath-Nemotron-14B-Kaggle",
        "prompt_config": "generic/math",
        "prompt_template": "openmath-instruct",
        "data": {"problem": PROBLEM, "total_code_executions": 8},
        "code_execution": {"max_code_executions": 8},
        "source": "docs/openmathreasoning1/evaluation.md (the Kaggle exception)",
    },
    {
        "name": "qwen25_math_tir_release",
        "models": "Qwen/Qwen2.5-Math-7B-Instruct",
        "prompt_config": "qwen/math-tir",
        "prompt_template": "qwen-instruct",
        "data": {"problem": PROBLEM, "total_code_executions": 8},
        "code_execution": {"max_code_executions": 8},
        "source": "nemo_skills/prompt/config/qwen/math-tir.yaml + template/qwen-instruct.yaml",
    },
]


class ScriptedReleaseModel:
    """Stands in for the release-era server model: records each request, returns the script.

    The release-era wrapper calls ``model._generate_single(**request)`` and expects the text
    back with the matched stop phrase included (it tests ``output.endswith(code_end)``).
    """

    def __init__(self, outputs: list[str]):
        self.outputs = list(outputs)
        self.requests: list[dict] = []

    def _generate_single(self, **request):
        self.requests.append(dict(request))
        return {"generation": self.outputs.pop(0), "num_generated_tokens": 10}


def part_release(args: dict) -> None:
    use_checkout(args["nemo_skills_release"])
    from nemo_skills.code_execution.local_sandbox import local_sandbox_server
    from nemo_skills.code_execution.sandbox import get_sandbox
    from nemo_skills.code_execution.utils import format_code_output
    from nemo_skills.inference.server.code_execution_model import (
        CodeExecutionConfig,
        CodeExecutionWrapper,
    )
    from nemo_skills.prompt.utils import get_prompt, load_config

    out = Path(args["out"])
    commit = args["nemo_skills_release_commit"]
    sandbox_port = serve_wsgi(local_sandbox_server.app)
    template_dir = Path(args["nemo_skills_release"]) / "nemo_skills/prompt/template"

    for case in RELEASE_CASES:
        prompt = get_prompt(case["prompt_config"], case["prompt_template"])
        code_args = prompt.get_code_execution_args()
        filled = prompt.fill(dict(case["data"]))
        if case["prompt_template"] == "openmath-instruct":
            outputs = [
                "I'll compute it.\n" + code_args["code_begin"] + CODE + code_args["code_end"],
                "So the answer is $\\boxed{104}$.<|im_end|>",
            ]
        else:
            outputs = [
                "Let's compute it.\n" + code_args["code_begin"] + CODE + code_args["code_end"],
                "The answer is $\\boxed{104}$.<|im_end|>",
            ]
        model = ScriptedReleaseModel(outputs)
        wrapper = CodeExecutionWrapper(
            model=model,
            sandbox=get_sandbox(host="127.0.0.1", port=str(sandbox_port)),
            config=CodeExecutionConfig(**case["code_execution"]),
        )
        stop_phrases = prompt.stop_phrases  # generate.py: combine_stop_phrases(prompt, [])
        result = wrapper._generate_single(
            prompt=filled,
            **code_args,
            tokens_to_generate=32768,
            temperature=0.6,
            top_p=0.95,
            top_k=0,
            min_p=0.0,
            repetition_penalty=1.0,
            random_seed=0,
            stop_phrases=stop_phrases,
        )
        write_json(
            out / "requests" / f"{case['name']}.json",
            {
                "reference": "NVIDIA/NeMo-Skills",
                "commit": commit,
                "functions": [
                    "nemo_skills/prompt/utils.py: get_prompt(prompt_config, prompt_template), "
                    "Prompt.fill, Prompt.stop_phrases, Prompt.get_code_execution_args",
                    "nemo_skills/inference/server/code_execution_model.py: "
                    "CodeExecutionWrapper._generate_single (model scripted, see below)",
                    "nemo_skills/code_execution/sandbox.py: LocalSandbox + "
                    "local_sandbox/local_sandbox_server.py (run in-process)",
                ],
                "models": case["models"],
                "source": case["source"],
                "inputs": {
                    "prompt_config": case["prompt_config"],
                    "prompt_template": case["prompt_template"],
                    "data": case["data"],
                    "code_execution": case["code_execution"],
                },
                "prompt_template_yaml": load_config(case["prompt_template"], str(template_dir)),
                "code_tags": code_args,
                "scripted_model_outputs": outputs,
                "first_prompt": filled,
                "model_requests": model.requests,
                "generation": result["generation"],
                "code_rounds_executed": result["code_rounds_executed"],
            },
        )

    sandbox = get_sandbox(host="127.0.0.1", port=str(sandbox_port))
    # The release-era code tags live in the prompt templates.
    tags = {
        "openmath": load_config("openmath-instruct", str(template_dir)),
        "qwen": load_config("qwen-instruct", str(template_dir)),
    }
    session = None
    cells = []
    for name, code in CELLS:
        res, session = sandbox.execute_code(
            generated_code=code,
            timeout=10.0,
            max_output_characters=1000,
            session_id=session,
            traceback_verbosity="plain",
        )
        cells.append(_cell_record(name, code, res, format_code_output, tags))
    write_json(
        out / "sandbox" / "nemo_skills_release.json",
        {
            "reference": "NVIDIA/NeMo-Skills",
            "commit": commit,
            "functions": [
                "nemo_skills/code_execution/sandbox.py: LocalSandbox.execute_code "
                "(language='python', timeout=10.0, max_output_characters=1000, "
                "traceback_verbosity='plain', one session for all cells)",
                "nemo_skills/code_execution/local_sandbox/local_sandbox_server.py: app "
                "(run in-process on a loopback port)",
                "nemo_skills/code_execution/utils.py: format_code_output",
            ],
            "environment": _env(),
            "cells": cells,
        },
    )


# ---------------------------------------------------------------------------------------------
# Part 3: harmony (gpt-oss)


def part_harmony(args: dict) -> None:
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = args["encodings"]
    sys.path.insert(0, args["gpt_oss"])
    from openai_harmony import (
        Conversation,
        DeveloperContent,
        HarmonyEncodingName,
        Message,
        ReasoningEffort,
        Role,
        SystemContent,
        ToolNamespaceConfig,
        load_harmony_encoding,
    )

    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    user_text = args["gpt_oss_user"]

    def text(tokens):
        return enc.decode_utf8(tokens)

    def system(tool: ToolNamespaceConfig | None):
        content = (
            SystemContent.new()
            .with_reasoning_effort(ReasoningEffort.HIGH)
            .with_conversation_start_date(FIXED_DATE)
        )
        return content.with_tools(tool) if tool is not None else content

    python_builtin = ToolNamespaceConfig.python()
    python_tool_jupyter = _gpt_oss_python_tool_config("dangerously_use_local_jupyter")
    python_tool_docker = _gpt_oss_python_tool_config("docker")

    call = (
        Message.from_role_and_content(Role.ASSISTANT, CODE)
        .with_channel("analysis")
        .with_recipient("python")
        .with_content_type("code")
    )
    analysis = Message.from_role_and_content(
        Role.ASSISTANT, "Compute it with python."
    ).with_channel("analysis")
    response = _gpt_oss_tool_response("104\n", "analysis")

    def conversation(sys_content, extra=(), developer=None):
        msgs = [Message.from_role_and_content(Role.SYSTEM, sys_content)]
        if developer is not None:
            msgs.append(Message.from_role_and_content(Role.DEVELOPER, developer))
        msgs.append(Message.from_role_and_content(Role.USER, user_text))
        msgs.extend(extra)
        return Conversation.from_messages(msgs)

    first = {}
    second = {}
    for name, tool in [
        ("builtin_python", python_builtin),
        ("gpt_oss_python_tool_jupyter", python_tool_jupyter),
        ("gpt_oss_python_tool_docker", python_tool_docker),
        ("no_tools", None),
    ]:
        conv = conversation(system(tool))
        first[name] = text(enc.render_conversation_for_completion(conv, Role.ASSISTANT))
        if tool is not None:
            conv2 = conversation(system(tool), [analysis, call, response])
            second[name] = text(enc.render_conversation_for_completion(conv2, Role.ASSISTANT))
    dev = DeveloperContent.new().with_instructions("Put the final answer in \\boxed{}.")
    first["builtin_python_with_developer"] = text(
        enc.render_conversation_for_completion(
            conversation(system(python_builtin), developer=dev), Role.ASSISTANT
        )
    )

    def parse(completion: str, role):
        tokens = enc.encode(completion, allowed_special="all")
        try:
            msgs = enc.parse_messages_from_completion_tokens(tokens, role)
            return {
                "completion": completion,
                "tokens": tokens,
                "messages": [m.to_dict() for m in msgs],
            }
        except Exception as exc:  # the parser's own verdict is the fixture
            return {
                "completion": completion,
                "tokens": tokens,
                "error": f"{type(exc).__name__}: {exc}",
            }

    headers = {
        "recipient_after_channel": "<|start|>assistant<|channel|>analysis to=python code"
        "<|message|>" + CODE + "<|call|>",
        "recipient_before_channel": "<|start|>assistant to=python<|channel|>analysis code"
        "<|message|>" + CODE + "<|call|>",
    }
    parsed = {name: parse(s, None) for name, s in headers.items()}
    parsed["first_message_call"] = parse(
        "<|channel|>analysis to=python code<|message|>" + CODE + "<|call|>", Role.ASSISTANT
    )
    parsed["analysis_then_call"] = parse(
        "<|channel|>analysis<|message|>Compute it with python.<|end|>"
        + headers["recipient_after_channel"],
        Role.ASSISTANT,
    )

    specials = {}
    for tok in [
        "<|startoftext|>",
        "<|endoftext|>",
        "<|return|>",
        "<|constrain|>",
        "<|channel|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|call|>",
    ]:
        ids = enc.encode(tok, allowed_special="all")
        specials[tok] = {"id": ids[0], "special": enc.is_special_token(ids[0])}

    # Cross-checks against harmony's own expected renderings (its repo's test-data, byte for
    # byte): the python tool section, and the token layout of a tool call it parses.
    checks = {}
    if args.get("harmony"):
        data = Path(args["harmony"]) / "test-data"
        expected = (data / "test_browser_and_python_tool.txt").read_text(encoding="utf-8")
        section = first["builtin_python"].split("# Tools\n\n", 1)[1].split("# Valid", 1)[0]
        checks["test_browser_and_python_tool.txt contains our '## python' section"] = (
            section in expected
        )
        tool_call_ids = [int(t) for t in (data / "test_simple_tool_call.txt").read_text().split()]
        checks["test_simple_tool_call.txt decoded"] = text(tool_call_ids)

    write_json(
        Path(args["out"]) / "harmony" / "gpt_oss_harmony.json",
        {
            "reference": "openai/harmony (PyPI openai-harmony " + _harmony_version() + ")",
            "commit": args["harmony_commit"],
            "gpt_oss_commit": args["gpt_oss_commit"],
            "vocabulary": {
                "file": "o200k_base.tiktoken",
                "sha256": sha256(Path(args["encodings"]) / "o200k_base.tiktoken"),
            },
            "functions": [
                "openai_harmony: load_harmony_encoding(HARMONY_GPT_OSS), "
                "render_conversation_for_completion(conv, Role.ASSISTANT), render, "
                "parse_messages_from_completion_tokens, stop_tokens, "
                "stop_tokens_for_assistant_actions",
                "gpt_oss/tools/python_docker/docker_tool.py: PythonTool.tool_config, "
                "PythonTool._make_response (the tool response message)",
            ],
            "inputs": {
                "system": "SystemContent.new().with_reasoning_effort(HIGH)"
                f".with_conversation_start_date({FIXED_DATE!r}).with_tools(<tool>)",
                "user": user_text,
                "analysis": "Compute it with python.",
                "call": {
                    "channel": "analysis",
                    "recipient": "python",
                    "content_type": "code",
                    "text": CODE,
                },
                "tool_output": "104\n",
            },
            "tool_configs": {
                "builtin_python": python_builtin.model_dump(),
                "gpt_oss_python_tool_jupyter": python_tool_jupyter.model_dump(),
                "gpt_oss_python_tool_docker": python_tool_docker.model_dump(),
            },
            "first_prompt": first,
            "second_prompt": second,
            "rendered_messages": {
                "call": text(enc.render(call)),
                "analysis": text(enc.render(analysis)),
                "tool_response": text(enc.render(response)),
            },
            "parsed_completions": parsed,
            "stop_tokens": sorted(
                enc.stop_tokens()
            ),  # a set inside harmony: sorted for stable bytes
            "stop_tokens_for_assistant_actions": sorted(enc.stop_tokens_for_assistant_actions()),
            "special_tokens": specials,
            "harmony_test_data_checks": checks,
        },
    )


def _harmony_version() -> str:
    from importlib.metadata import version

    return version("openai-harmony")


def _gpt_oss_python_tool_config(backend: str):
    from gpt_oss.tools.python_docker.docker_tool import PythonTool

    tool = PythonTool.__new__(PythonTool)  # the instruction text only; no kernel is started
    tool._execution_backend = backend
    tool._jupyter_session = None
    return tool.tool_config


def _gpt_oss_tool_response(output: str, channel: str):
    from gpt_oss.tools.python_docker.docker_tool import PythonTool

    tool = PythonTool.__new__(PythonTool)
    tool._jupyter_session = None
    return tool._make_response(output, channel=channel)


# ---------------------------------------------------------------------------------------------


PARTS = {"newest": part_newest, "release": part_release, "harmony": part_harmony}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] in PARTS:
        PARTS[sys.argv[1]](json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nemo-skills", required=True, type=Path)
    ap.add_argument("--nemo-skills-release", required=True, type=Path)
    ap.add_argument("--gpt-oss", required=True, type=Path)
    ap.add_argument("--harmony", type=Path, help="openai/harmony checkout (for its commit)")
    ap.add_argument("--encodings", required=True, type=Path)
    ap.add_argument("--templates", required=True, type=Path)
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "agent" / "fixtures")
    ap.add_argument("--only", choices=sorted(PARTS), action="append")
    a = ap.parse_args()
    gpt_oss_user = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys, json; sys.path.insert(0, sys.argv[1]);"
                "from nemo_skills.prompt.utils import load_config;"
                "print(json.dumps(load_config('gpt-oss/math')['user'].format(problem=sys.argv[2])))",
                str(a.nemo_skills),
                PROBLEM,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    shared = {
        "out": str(a.out),
        "nemo_skills": str(a.nemo_skills),
        "nemo_skills_commit": git_commit(a.nemo_skills),
        "nemo_skills_release": str(a.nemo_skills_release),
        "nemo_skills_release_commit": git_commit(a.nemo_skills_release),
        "gpt_oss": str(a.gpt_oss),
        "gpt_oss_commit": git_commit(a.gpt_oss),
        "harmony": str(a.harmony) if a.harmony else None,
        "harmony_commit": git_commit(a.harmony) if a.harmony else "unknown",
        "encodings": str(a.encodings),
        "templates": str(a.templates),
        "gpt_oss_user": gpt_oss_user,
    }
    for name in a.only or list(PARTS):
        print(f"== {name}", flush=True)
        subprocess.run([sys.executable, __file__, name, json.dumps(shared)], check=True)


if __name__ == "__main__":
    main()
