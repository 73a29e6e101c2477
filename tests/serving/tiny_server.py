"""A tiny real HTTP server for lifecycle tests: ``python tiny_server.py PORT MODE [DELAY]``.

Modes: ok (healthy after DELAY s), never (never healthy), exit (exits with code 3 at once),
oom / gated (prints a failure line then exits 1), crash (healthy, then OOM after
DELAY s), stubborn (ignores SIGTERM), metrics (serves
canned TensorRT-LLM iteration stats at /metrics), prometheus (text metrics, like vLLM).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, MODE = int(sys.argv[1]), sys.argv[2]
DELAY = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
STARTED = time.monotonic()

STATS = [
    {"iter": 1, "specDecodingStats": {"numDraftTokens": 0, "numAcceptedTokens": 0,
                                       "numRequestsWithDraftTokens": 0, "acceptanceLength": 0.0}},
    {"iter": 2, "specDecodingStats": {"numDraftTokens": 6, "numAcceptedTokens": 4,
                                       "numRequestsWithDraftTokens": 2, "acceptanceLength": 3.0}},
    json.dumps({"iter": 3, "specDecodingStats": {"numDraftTokens": 3, "numAcceptedTokens": 1,
                                                  "numRequestsWithDraftTokens": 1,
                                                  "acceptanceLength": 2.0}}),
    {"iter": 4},
]  # fmt: skip


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            healthy = MODE != "never" and time.monotonic() - STARTED >= DELAY
            self._send(200 if healthy else 503, b"")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "tiny"}]}).encode())
        elif self.path == "/metrics" and MODE == "metrics":
            self._send(200, json.dumps(STATS).encode())
        elif self.path == "/metrics":
            self._send(200, b"# HELP vllm:num_requests_running\nvllm:num_requests_running 0\n")
        else:
            self._send(404, b"")

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


if MODE == "exit":
    print("tiny server: giving up", flush=True)
    sys.exit(3)
if MODE == "oom":
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
    sys.exit(1)
if MODE == "gated":
    print(
        "huggingface_hub.errors.GatedRepoError: 401 Client Error. Cannot access gated repo",
        flush=True,
    )
    sys.exit(1)
if MODE == "crash":  # healthy at once, then dies of OOM after DELAY s
    import os
    import threading

    def die() -> None:
        print("torch.OutOfMemoryError: CUDA out of memory while serving", flush=True)
        os._exit(1)

    threading.Timer(DELAY, die).start()
    DELAY = 0.0
if MODE == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"tiny server listening on {PORT}", flush=True)
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
