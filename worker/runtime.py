"""What one worker process keeps between shards: the loaded model, metrics, heartbeats, spot watcher.

Celery calls tasks with ids only, so this per-process state cannot be passed in; it lives in one
`ProcessRuntime`, created on first use in the process that runs tasks (a prefork pool child, or the
main process with --pool solo) and reached through `runtime()`. The main process owns one other
piece, `SHUTDOWN_FLAG`: a shared-memory byte created before the pool forks, raised when the worker
begins to shut down, read by every child's `should_stop`.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
import time
from collections import OrderedDict
from typing import Any

import redis

from jobs.client import queue_for_model
from jobs.live_state import LiveState
from jobs.log import get_logger
from jobs.progress import WorkerBeat
from jobs.settings import Settings, get_settings
from worker.metrics import WorkerMetrics
from worker.model_cache import ModelCache
from worker.node import NodeState
from worker.spot import ImdsClient, SpotNotice, SpotWatcher

log = get_logger(__name__)


class ShutdownFlag:
    """A byte in shared memory: created in the main process before fork, so children see its changes."""

    def __init__(self) -> None:
        self._value = multiprocessing.RawValue("b", 0)

    def raise_(self) -> None:
        self._value.value = 1

    def is_set(self) -> bool:
        return bool(self._value.value)


SHUTDOWN_FLAG = ShutdownFlag()


class ProcessRuntime:
    """Per-process state of a worker. `start()` launches the heartbeat, metrics and spot threads."""

    def __init__(
        self,
        settings: Settings,
        *,
        worker_id: str,
        queues: tuple[str, ...],
        node: NodeState | None = None,
        index: int = 0,
    ) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.queues = queues
        self.node = node
        self.index = index  # the pool index: this process's attempt slot
        # the attempt this process runs now (job_id, shard, attempt), and its last engine step
        self.current: tuple[str, int, int] | None = None
        self.last_step: float | None = None
        self.live = LiveState(settings.redis_url)
        # for checks inside the engine loop (cancel): fail fast instead of stalling the engine
        self.live_fast = LiveState(settings.redis_url, socket_timeout=1.0, retry_for_s=0)
        self.metrics = WorkerMetrics()
        self.models: ModelCache = ModelCache()
        # (job id, OUT) -> the job's result cache (worker/result_cache.py), its index read once per job
        self.job_caches: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.imds = ImdsClient(settings.imds_url)
        self.spot_notice: SpotNotice | None = None
        self.instance_id: str | None = None
        self.busy = False
        self.metrics_port: int | None = None
        self._notice = threading.Event()
        self._closed = threading.Event()
        self._watcher = SpotWatcher(self.imds, self._on_notice, poll_s=settings.spot_poll_s)

    def start(self) -> ProcessRuntime:
        if self.settings.metrics_port:
            port = self.settings.metrics_port + _pool_index()
            try:
                self.metrics_port = self.metrics.serve(port)
            except OSError as exc:
                log.warning("metrics_port_busy", port=port, error=str(exc))
        self._watcher.start()
        # at once: a process that replaces a killed one (same worker id) must not look like it still
        # runs the killed attempt (worker/attempts.py)
        self._beat_now()
        threading.Thread(target=self._heartbeat_loop, name="freight-heartbeat", daemon=True).start()
        if self.node is not None and self.node.preload:
            self.models.expect((self.node.preload, None))
            threading.Thread(target=self._preload, args=(self.node.preload,), name="freight-preload",
                             daemon=True).start()  # fmt: skip
        log.info("worker_process_ready", worker_id=self.worker_id, queues=list(self.queues),
                 metrics_port=self.metrics_port)  # fmt: skip
        return self

    def stopping(self) -> bool:
        """True once this worker must hand its shard back: a spot notice or a shutdown."""
        return self._notice.is_set() or SHUTDOWN_FLAG.is_set()

    def stop_reason(self) -> str:
        return f"spot {self.spot_notice.kind}" if self.spot_notice else "worker shutdown"

    def _on_notice(self, notice: SpotNotice) -> None:
        self.spot_notice = notice
        self._notice.set()
        self.metrics.interruptions.labels(notice.kind).inc()
        # Stop consuming: a warm shutdown of the whole worker. The running shard sees `stopping()`,
        # checkpoints and is handed back before the main process exits.
        os.kill(os.getppid() if _is_pool_child() else os.getpid(), signal.SIGTERM)

    def record_row(self, row: Any) -> None:
        """`on_row` of run_shard: one finished row (a worker.shard.RowProgress)."""
        self.metrics.rows.inc()
        self.metrics.record_tokens(prompt=row.prompt_tokens, cached=row.cached_tokens,
                                   completion=row.completion_tokens)  # fmt: skip

    def _preload(self, model: str) -> None:
        """`freight worker --model M`: load M before any shard asks (not billed to a shard)."""
        from worker.local import load_model_engine

        try:
            self.models.get((model, None), lambda: load_model_engine(model, None, self.settings)[0])
            self.beat()
        except Exception:  # the first shard loads it again and reports the error there
            log.exception("preload_failed", model=model)

    # ----- the running attempt (heartbeat fields, the deadline watch's slot) -----------------------
    def begin_attempt(self, job_id: str, shard: int, attempt: int, deadline: float | None) -> None:
        self.current, self.last_step = (job_id, shard, attempt), None
        if self.node is not None and deadline is not None:
            self.node.slots.begin(self.index, pid=os.getpid(), job_id=job_id, shard=shard, attempt=attempt,
                                  deadline=deadline)  # fmt: skip
        self._beat_now()

    def set_deadline(self, deadline: float | None) -> None:
        if self.node is not None and deadline is not None:
            self.node.slots.set_deadline(self.index, deadline)

    def extend_deadline(self, deadline: float) -> None:
        """Move the running attempt's deadline later (never earlier): a row finished (ProgressDeadline)."""
        if self.node is not None:
            self.node.slots.extend(self.index, deadline)

    def note_step(self, now: float) -> None:
        """Before every engine step of the running attempt (ShardStop)."""
        self.last_step = now
        if self.node is not None:
            self.node.slots.step(self.index, now)

    def end_attempt(self) -> None:
        if self.node is not None:
            self.node.slots.end(self.index)
        self.current, self.last_step = None, None
        self._beat_now()

    def _beat_now(self) -> None:
        try:
            self.beat()
        except redis.RedisError as exc:
            log.warning("heartbeat_failed", error=str(exc))

    def beat(self) -> None:
        job_id, shard, attempt = self.current or (None, None, None)
        key = self.models.loaded_key
        model = str(key[0]) if isinstance(key, tuple) and key else None
        self.live.heartbeat(
            WorkerBeat(
                worker_id=self.worker_id,
                busy=self.busy,
                instance_id=self.instance_id,
                queue=queue_for_model(model) if model else ",".join(self.queues),
                tokens_per_second=round(self.metrics.current_completion_tokens_per_second(), 3),
                heartbeat=time.time(),
                job_id=job_id,
                shard=shard,
                attempt=attempt,
                last_step=self.last_step,
                model=model,
                node=self.node.node_id if self.node is not None else None,
            )
        )

    def _heartbeat_loop(self) -> None:
        self.instance_id = self.imds.instance_id()  # None off EC2 (one 1 s timeout)
        while not self._closed.is_set():
            try:
                self.beat()
            except redis.RedisError as exc:
                log.warning("heartbeat_failed", error=str(exc))
            except Exception:  # the heartbeat must outlive any bug: a silent worker counts as gone
                log.exception("heartbeat_error")
            self._closed.wait(self.settings.heartbeat_s)

    def close(self) -> None:
        self._closed.set()
        self._watcher.stop()
        try:
            self.live.remove_worker(self.worker_id)
        except redis.RedisError as exc:
            log.warning("heartbeat_remove_failed", error=str(exc))


def _is_pool_child() -> bool:
    return multiprocessing.current_process().name != "MainProcess"


def _pool_index() -> int:
    """0 in the main process; the billiard pool index (0..concurrency-1) in a prefork child."""
    from billiard import current_process

    return int(getattr(current_process(), "index", 0) or 0)


class _Holder:
    """The one ProcessRuntime of this process, and the main process's NodeState (module docstring)."""

    def __init__(self) -> None:
        self.runtime: ProcessRuntime | None = None
        self.node: NodeState | None = None
        self.queues: tuple[str, ...] = ()
        self.lock = threading.Lock()


_HOLDER = _Holder()


def configure(node: NodeState, queues: tuple[str, ...]) -> None:
    """Called in the main process before the pool forks (worker_init)."""
    _HOLDER.node, _HOLDER.queues = node, queues


def node_state() -> NodeState | None:
    """The main process's NodeState (a copy from before the fork in a pool process); None outside a worker."""
    return _HOLDER.node


def runtime() -> ProcessRuntime:
    """This process's runtime, created and started on first use."""
    with _HOLDER.lock:
        if _HOLDER.runtime is None or _HOLDER.runtime._closed.is_set():
            hostname = _HOLDER.node.hostname if _HOLDER.node is not None else socket.gethostname()
            index = _pool_index()
            _HOLDER.runtime = ProcessRuntime(
                get_settings(), worker_id=f"{hostname}#{index}", queues=_HOLDER.queues, node=_HOLDER.node,
                index=index,
            ).start()  # fmt: skip
        return _HOLDER.runtime


def close_runtime() -> None:
    with _HOLDER.lock:
        if _HOLDER.runtime is not None:
            _HOLDER.runtime.close()
            _HOLDER.runtime = None
