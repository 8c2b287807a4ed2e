"""`should_stop` of one shard attempt (worker/tasks.py): a spot notice or worker shutdown, the job's
deadline, or its cancel flag in Redis. Checked before every engine step, so it is cheap: local flags
first, Redis at most every CANCEL_CHECK_S."""

from __future__ import annotations

import time
from collections import deque

import redis

from worker.runtime import ProcessRuntime

# How often should_stop asks Redis about cancel: it is asked every engine step, however short, and
# asks Redis at most once a CANCEL_CHECK_S.
CANCEL_CHECK_S = 0.05
REDIS_DOWN_BACKOFF_S = 5.0


class ShardStop:
    """`should_stop` for one shard attempt: a spot notice or shutdown (local, free), the job's
    deadline passed (reason "expired"), or a cancel flag in Redis (asked at most every CANCEL_CHECK_S). Remembers why it stopped and, for a cancel, how
    many engine steps ran after the cancel was requested (`steps_after_cancel`)."""

    def __init__(
        self, rt: ProcessRuntime, job_id: str, *, engine_steps: bool = True, due: float | None = None
    ) -> None:
        self.rt = rt
        self.job_id = job_id
        self.due = due  # the job's deadline (unix s, OUT/lifecycle.json): past it the attempt stops
        self.engine_steps = engine_steps  # False: not called before engine steps (a wait loop)
        self.reason: str | None = None
        self.checks = 0
        self.steps_after_cancel: int | None = None
        self._recent: deque[float] = deque(maxlen=4096)  # unix time of each check (one per engine step)
        self._next_redis = 0.0

    def __call__(self) -> bool:
        self.checks += 1
        if self.reason is not None:
            return True
        now_s = time.time()
        self._recent.append(now_s)
        if self.engine_steps:
            self.rt.note_step(now_s)  # the heartbeat's last engine step
        if self.rt.stopping():
            self.reason = "interrupted"
            return True
        if self.due is not None and now_s >= self.due:
            self.reason = "expired"
            return True
        now = time.monotonic()
        if now >= self._next_redis:
            self._next_redis = now + CANCEL_CHECK_S
            try:
                cancelled_at = self.rt.live_fast.cancelled_at(self.job_id)
            except redis.RedisError:
                cancelled_at = None  # Redis away: keep computing (the commit goes to storage); ask later
                self._next_redis = now + REDIS_DOWN_BACKOFF_S
            if cancelled_at is not None:
                self.reason = "cancelled"
                # checks after the request, minus this one (it stops before its step)
                self.steps_after_cancel = sum(1 for t in self._recent if t >= cancelled_at) - 1
                return True
        return False
