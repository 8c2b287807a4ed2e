"""Fixtures of the API tests: a real uvicorn server on 127.0.0.1 (a free port) over a fresh store,
keys made the way `freight keys create` makes them, and the official `openai` client."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import OpenAI

from jobs.api.app import create_app
from jobs.api.config import ServeConfig
from jobs.api.keys import create_key
from jobs.settings import get_settings
from jobs.storage import LocalStore, ObjectStore
from tests.api.serve_harness import ServeProcess, start_server, uvicorn_thread


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
    with uvicorn_thread(app, "the test server", lifespan="on") as url:
        yield ThreadServer(url=url, store=store)


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


@pytest.fixture(scope="session")
def served_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama checkpoint that generates and embeds (a sentence-transformers pooling config)."""
    from worker.demo_model import add_pooling_config, make_demo_model

    path = make_demo_model(tmp_path_factory.mktemp("models") / "tiny", arch="llama")
    add_pooling_config(path)
    return path


@pytest.fixture(scope="session")
def serve_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of every server the suite starts: one kernel build cache for all of them."""
    import os

    base = tmp_path_factory.mktemp("serve-env")
    # the CPU kernels the engine tests build (their default cache): built once, not once per server
    kernels = os.environ.get("FREIGHT_KERNEL_CACHE") or str(
        Path(os.environ.get("FREIGHT_CACHE_DIR") or Path.home() / ".cache" / "freight") / "kernels"
    )
    return {
        # a FREIGHT_RESULT_CACHE of the caller's would give every server a result cache
        **{k: v for k, v in os.environ.items() if k != "FREIGHT_RESULT_CACHE"},
        "FREIGHT_CACHE_DIR": str(base / "cache"),
        "FREIGHT_KERNEL_CACHE": kernels,
        "FREIGHT_PROFILES_PATH": str(base / "profiles.json"),
        "FREIGHT_LOG_FORMAT": "json",
        "FREIGHT_LOG_LEVEL": "info",
    }


@pytest.fixture
def serve_process(tmp_path: Path, serve_env: dict[str, str]) -> Iterator[Callable[..., ServeProcess]]:
    """serve_process(*flags) -> a `freight serve` over tmp_path/store (stopped after the test)."""
    started: list[ServeProcess] = []

    def start(*flags: str, store_dir: Path | None = None) -> ServeProcess:
        server = start_server(store_dir or tmp_path / "store", serve_env, *flags)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
