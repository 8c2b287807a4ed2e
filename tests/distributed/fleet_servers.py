"""Real servers for the distributed tests: a private redis-server on a free port, a fake IMDSv2."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """redis-server on 127.0.0.1:<free port>, persisting to an append-only file so a restart keeps
    the queue (as a production Redis with AOF does)."""

    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed: apt-get install redis-server")
        self.exe = exe
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
                "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "no"]  # fmt: skip
        log = open(self.workdir / "redis.log", "ab")  # noqa: SIM115 - the server owns it
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 20
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: redis flushes the AOF and exits
            self.proc.wait(20)
        self.proc = None

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)


class FakeImds:
    """IMDSv2 on 127.0.0.1: token required; 404 until `announce()` is called."""

    TOKEN = "test-token-123"

    def __init__(self) -> None:
        self.action: dict | None = None
        self.rebalance: dict | None = None
        self.requests: list[str] = []
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_PUT(self) -> None:
                imds.requests.append("PUT " + self.path)
                if self.path == "/latest/api/token" and self.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"
                ):
                    self._send(200, imds.TOKEN)
                else:
                    self._send(400, "")

            def do_GET(self) -> None:
                imds.requests.append("GET " + self.path)
                if self.headers.get("X-aws-ec2-metadata-token") != imds.TOKEN:
                    self._send(401, "")
                elif self.path == "/latest/meta-data/spot/instance-action" and imds.action:
                    self._send(200, json.dumps(imds.action))
                elif self.path == "/latest/meta-data/events/recommendations/rebalance" and imds.rebalance:
                    self._send(200, json.dumps(imds.rebalance))
                elif self.path == "/latest/meta-data/instance-id":
                    self._send(200, "i-0123456789abcdef0")
                else:
                    self._send(404, "")

            def _send(self, code: int, body: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FakeImds:
        self._thread.start()
        return self

    def announce(self, action: str = "terminate") -> None:
        self.action = {"action": action, "time": "2026-11-29T16:00:00Z"}

    def recommend_rebalance(self) -> None:
        self.rebalance = {"noticeTime": "2026-11-29T15:58:00Z"}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class WorkerProcess:
    """`freight worker` as a real subprocess (its own Celery main process + one pool child)."""

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        queue: str | None,
        logdir: Path,
        poison_shard: int | None = None,
        poison_kind: str = "kill",
        model: str | None = None,
    ) -> None:
        """queue None: `freight worker` with neither --queues nor --model serves every queue (or, with
        `model`, `--model MODEL`: its queue, preloaded)."""
        self.name = name
        self.log_path = logdir / f"worker-{name}.log"
        exe = Path(sys.executable).with_name("freight")
        chosen = ["--queues", queue] if queue else ["--model", model] if model else []
        args = [str(exe), "worker", *chosen, "--hostname", f"{name}@test", "--loglevel", "WARNING"]
        if poison_shard is not None:  # the test-only worker of tests/distributed/fleet_poison_worker.py
            script = Path(__file__).with_name("fleet_poison_worker.py")
            args = [sys.executable, str(script), str(poison_shard), poison_kind, *args[1:]]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(args, env={**os.environ, **env}, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=Path(__file__).resolve().parents[2])  # fmt: skip

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def kill_all(self) -> None:
        """SIGKILL the main process and its pool children: a machine that vanished. The main process
        is frozen first (SIGSTOP), so it cannot fork a replacement for a child killed before it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGSTOP)
        for pid in [*self.children(), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill_all()
        for pid in self.children():  # orphans of a killed main process
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._log.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):  # noqa: ANN001, ANN201
    """Poll `predicate` until truthy; return its value or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
