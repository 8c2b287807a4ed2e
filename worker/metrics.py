"""Prometheus metrics of one worker process (prometheus-client, its own registry)."""

from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

SHARD_SECONDS_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600)


class WorkerMetrics:
    """Counters a worker updates per shard; `serve(port)` exposes them at http://host:port/metrics."""

    def __init__(self, *, window_s: float = 60.0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rows = Counter("freight_rows", "result rows committed", registry=r)
        self.tokens = Counter("freight_tokens", "tokens processed", ["kind"], registry=r)
        self.tokens_per_second = Gauge(
            "freight_tokens_per_second", "prompt+completion tokens per second, last minute", registry=r
        )
        self.prefix_hit_rate = Gauge(
            "freight_prefix_hit_rate", "cached / prompt tokens over this process's shards", registry=r
        )
        self.shard_seconds = Histogram(
            "freight_shard_duration_seconds", "wall time of one shard attempt", ["outcome"],
            buckets=SHARD_SECONDS_BUCKETS, registry=r,
        )  # fmt: skip
        self.attempts = Counter("freight_shard_attempts", "shard attempts started", registry=r)
        # outcome: run_shard's status (committed, already_committed, lost_race, interrupted), error (the
        # attempt raised: a strike), storage_outage (it raised because storage did not answer: no
        # strike, worker/outages.py), failed (the shard given up for good)
        self.outcomes = Counter(
            "freight_shard_outcomes", "shard attempts by outcome", ["outcome"], registry=r
        )
        self.interruptions = Counter("freight_spot_interruptions", "spot notices seen", ["kind"], registry=r)
        self.wasted_seconds = Counter(
            "freight_wasted_busy_seconds", "engine time thrown away (interrupted or lost races)", registry=r
        )
        self.busy = Gauge("freight_busy", "1 while a shard runs", registry=r)
        self._window_s = window_s
        # (monotonic time, prompt + completion tokens, completion tokens): appended by the task
        # thread, read by the heartbeat thread
        self._recent: deque[tuple[float, int, int]] = deque()
        self._recent_tokens = 0  # sums over the window, kept as rows come and go
        self._recent_completion = 0
        self._lock = threading.Lock()
        self._prompt_total = 0
        self._cached_total = 0

    def serve(self, port: int) -> int:
        """Start the HTTP endpoint; returns the port (0 asks the OS for a free one)."""
        server, _ = start_http_server(port, registry=self.registry)
        return int(server.server_address[1])

    def record_tokens(self, *, prompt: int, cached: int, completion: int) -> None:
        self.tokens.labels("prompt").inc(prompt)
        self.tokens.labels("cached").inc(cached)
        self.tokens.labels("completion").inc(completion)
        self._prompt_total += prompt
        self._cached_total += cached
        if self._prompt_total:
            self.prefix_hit_rate.set(self._cached_total / self._prompt_total)
        now = time.monotonic()
        with self._lock:
            self._recent.append((now, prompt + completion, completion))
            self._recent_tokens += prompt + completion
            self._recent_completion += completion
        self.tokens_per_second.set(self.current_tokens_per_second(now))

    def _window_sums(self, now: float | None) -> tuple[int, int]:
        """(prompt + completion, completion) tokens of the rows finished within the last window."""
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._recent and now - self._recent[0][0] > self._window_s:
                _, tokens, completion = self._recent.popleft()
                self._recent_tokens -= tokens
                self._recent_completion -= completion
            return self._recent_tokens, self._recent_completion

    def current_tokens_per_second(self, now: float | None = None) -> float:
        """Prompt + completion tokens per second over the last window; safe from any thread."""
        return self._window_sums(now)[0] / self._window_s

    def current_completion_tokens_per_second(self, now: float | None = None) -> float:
        """Completion tokens per second over the last window; safe from any thread.

        The heartbeat's `tokens_per_second`: the autoscaler divides the queued completion-token
        estimate (rows x max_tokens) by it, so both count completion tokens only.
        """
        return self._window_sums(now)[1] / self._window_s
