"""Fixtures of the API tests: a real uvicorn server on 127.0.0.1 (a free port) over a fresh store,
keys made the way `freight keys create` makes them, and the official `openai` client."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from openai import OpenAI

from jobs.api.app import create_app
from jobs.api.config import ServeConfig
from jobs.api.keys import create_key
from jobs.settings import get_settings
from jobs.storage import LocalStore, ObjectStore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ThreadServer:
    """An app served by uvicorn on a thread of the test process."""

    url: str  # http://127.0.0.1:PORT
    store: ObjectStore

    def client(self, key: str, **kwargs: object) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=30.0, **kwargs)  # type: ignore[arg-type]


@contextmanager
def thread_server(store: ObjectStore, config: ServeConfig | None = None) -> Iterator[ThreadServer]:
    app = create_app(store, config or ServeConfig(), settings=get_settings())
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield ThreadServer(url=f"http://127.0.0.1:{port}", store=store)
    finally:
        server.should_exit = True
        thread.join(timeout=20)


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return LocalStore(tmp_path / "store")


@pytest.fixture
def make_server(store: ObjectStore) -> Iterator[Callable[..., ThreadServer]]:
    """make_server(**ServeConfig fields) -> a running server over `store` (stopped after the test)."""
    stack: list[object] = []

    def make(**config: object) -> ThreadServer:
        cm = thread_server(store, ServeConfig(**config))  # type: ignore[arg-type]
        stack.append(cm)
        return cm.__enter__()

    yield make
    for cm in reversed(stack):
        cm.__exit__(None, None, None)  # type: ignore[attr-defined]


@pytest.fixture
def key_a(store: ObjectStore) -> str:
    return create_key(store, "team-a")[0]


@pytest.fixture
def key_b(store: ObjectStore) -> str:
    return create_key(store, "team-b")[0]


def batch_line(custom_id: str, content: str = "Say hello", url: str = "/v1/chat/completions", **body: object) -> str:
    import json

    if url == "/v1/chat/completions":
        payload: dict[str, object] = {"messages": [{"role": "user", "content": content}], **body}
    elif url == "/v1/completions":
        payload = {"prompt": content, **body}
    else:
        payload = {"input": content, **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": payload})


def batch_file(path: Path, n: int, **body: object) -> Path:
    path.write_text("".join(batch_line(f"req-{i}", f"Tell me about the number {i}", **body) + "\n" for i in range(n)))
    return path
