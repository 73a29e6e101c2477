"""Starting the embedded engine's OpenAI server: in the foreground, or in a background thread.

The engine is built in its own thread (:meth:`AsyncEngine.launch`), so a caller's process can
do other work (start a sandbox, say) while the model loads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import uvicorn

from mathagent.serving.engine.async_engine import AsyncEngine
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.openai_server import create_app

# What builds the engine, called in the engine's own thread (the runtime makes these).
EngineBuilder = Callable[[], LLMEngine]


def _front(engine: LLMEngine | EngineBuilder) -> AsyncEngine:
    return AsyncEngine(engine) if isinstance(engine, LLMEngine) else AsyncEngine.launch(engine)


def serve(engine: LLMEngine | EngineBuilder, host: str, port: int) -> None:
    """Run the server in the foreground until interrupted (a builder runs in the engine thread)."""
    uvicorn.run(create_app(_front(engine)), host=host, port=port, log_level="warning")


class EmbeddedServer:
    """The embedded engine's OpenAI server on 127.0.0.1 in a background thread.

    ``with EmbeddedServer(build) as srv:`` then point an OpenAI client at ``srv.base_url``
    with model ``srv.model_name``. ``port=0`` picks a free port. A builder is called in the
    engine's own thread (see :meth:`AsyncEngine.launch`); an engine already built is served as is.
    """

    def __init__(self, engine: LLMEngine | EngineBuilder, port: int = 0) -> None:
        front = _front(engine)
        self.engine = front.engine
        self.model_name = self.engine.model_name
        config = uvicorn.Config(create_app(front), host="127.0.0.1", port=port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="mathagent-server")
        self.port = port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> EmbeddedServer:
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the embedded server failed to start")
            time.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
