"""`freight serve` in a process of its own, for the API tests and the fleet test: start it over a
store on a free loopback port, make keys, poll batches; and the batch files the tests upload."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from openai import OpenAI
from processes import stop_process

from jobs.api.keys import create_key
from jobs.storage import LocalStore, ObjectStore

FREIGHT = str(Path(sys.executable).with_name("freight"))  # the console script of this environment


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def uvicorn_thread(app: object, name: str, **config: Any) -> Iterator[str]:
    """Serves the ASGI `app` with uvicorn on a thread of the test process, at a free loopback port;
    yields its http://127.0.0.1:PORT once it has started, and stops it on exit. config: more of
    uvicorn.Config's keywords."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def batch_line(custom_id: str, content: str = "Say hello", url: str = "/v1/chat/completions", **body: object) -> str:
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


@dataclass
class ServeProcess:
    """`freight serve` in a process of its own: its url, store folder, log file."""

    url: str
    store_dir: Path
    log: Path
    process: subprocess.Popen[bytes]

    def client(self, key: str, **kwargs: object) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=60.0, **kwargs)  # type: ignore[arg-type]

    @property
    def store(self) -> ObjectStore:
        return LocalStore(self.store_dir)

    def key(self, tenant: str) -> str:
        return create_key(self.store, tenant)[0]

    def stop(self) -> None:
        stop_process(self.process)


def start_server(store_dir: Path, env: dict[str, str], *flags: str) -> ServeProcess:
    """Start `freight serve` over `store_dir` on a free port; returns once it answers."""
    import httpx2

    port = free_port()
    log = store_dir.parent / f"serve-{port}.log"
    store_dir.mkdir(parents=True, exist_ok=True)
    command = [FREIGHT, "serve", "--store", str(store_dir), "--port", str(port),
               "--poll", "0.2", *flags]  # fmt: skip
    with log.open("ab") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = ServeProcess(url=f"http://127.0.0.1:{port}", store_dir=store_dir, log=log, process=process)
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"freight serve exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx2.get(f"{server.url}/v1/files", timeout=1.0).status_code == 401:
                return server
        except httpx2.TransportError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"freight serve did not answer: {log.read_text()[-2000:]}")
        time.sleep(0.1)


TERMINAL = ("completed", "failed", "expired", "cancelled")


def wait_batch(client: OpenAI, batch_id: str, until: tuple[str, ...] = TERMINAL, timeout: float = 120.0) -> Any:
    """Poll until the batch's status is one of `until`; returns the Batch; the statuses seen in order."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in until:
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} still {batch.status} after {timeout} s"
        time.sleep(0.1)
