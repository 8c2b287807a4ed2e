"""Per-attempt deadlines: a hung engine (a CUDA hang, a deadlock) must not keep its shard forever.

Each pool process publishes the attempt it runs in `AttemptSlots`, shared memory the main process
creates before the pool forks (one slot per pool index): its pid, job, shard, attempt, the time of
its last engine step and its deadline. `DeadlineWatch`, a main-process thread, SIGKILLs a pool
process whose attempt is past its deadline. Celery then sees the worker lost and requeues the
message (`task_reject_on_worker_lost`); the attempt keeps the strike it took at its start, so a
shard that hangs every time fails after FREIGHT_MAX_SHARD_ATTEMPTS, and the next attempt bills the
killed one as lost.

The deadline (`attempt_deadline`): until the engine is ready (model load included),
FREIGHT_SHARD_DEADLINE_UNMEASURED_S; then max(FREIGHT_SHARD_DEADLINE_FLOOR_S, FREIGHT_SHARD_DEADLINE_MARGIN
x the shard's completion-token estimate (rows x max_tokens) / the model's measured completion
tokens per engine-second), or the unmeasured allowance while the model has no measured rate.
Progress moves it (`ProgressDeadline`): each finished row sets it to no earlier than the same
allowance for the rows still to do, counted from that row, so an attempt that keeps finishing rows
is never killed for being slower than the estimate; one that stops finishing rows (a hang, or steps
that never end a row) is killed that allowance after its last row. After the last row the commit
gets one row's allowance, at least the floor, which is above the S3 client's own bound on a storage
call: a commit that hangs ends as a storage outage, not a kill.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.sharedctypes import RawArray

from jobs.log import get_logger
from jobs.settings import Settings

log = get_logger(__name__)

MAX_SLOTS = 64  # pool processes per worker (concurrency) covered
_F = 3  # floats per slot: deadline, last_step, started (unix seconds; deadline 0 = no attempt)
_I = 4  # ints per slot: pid, job id (16 hex digits as an unsigned 64-bit int), shard, attempt


def attempt_deadline(
    settings: Settings, now: float, est_tokens: float | None, tokens_per_second: float | None
) -> float | None:
    """Unix time by which an attempt whose engine is ready at `now` must end; None: no deadline."""
    if settings.shard_deadline_margin <= 0:
        return None
    if not est_tokens or not tokens_per_second or tokens_per_second <= 0:
        return now + max(settings.shard_deadline_floor_s, settings.shard_deadline_unmeasured_s)
    expected = est_tokens / tokens_per_second
    return now + max(settings.shard_deadline_floor_s, settings.shard_deadline_margin * expected)


class ProgressDeadline:
    """Called as each row of an attempt finishes (its `on_row`): moves the attempt's deadline, through
    `extend` (never earlier), to the allowance `attempt_deadline` gives the rows still to do, counted
    from now. `rows`: the shard's rows (rows done by earlier attempts are not reported, so this
    over-counts what is left: a later deadline, never an earlier one)."""

    def __init__(self, settings: Settings, rows: int, max_tokens: int, tokens_per_second: float | None,
                 extend: Callable[[float], None], clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.settings, self.rows_left, self.max_tokens = settings, rows, max_tokens
        self.tokens_per_second, self.extend, self.clock = tokens_per_second, extend, clock

    def __call__(self) -> None:
        self.rows_left = max(self.rows_left - 1, 1)  # after the last row: one row's allowance to commit
        deadline = attempt_deadline(self.settings, self.clock(), self.rows_left * self.max_tokens,
                                    self.tokens_per_second)  # fmt: skip
        if deadline is not None:
            self.extend(deadline)


@dataclass(frozen=True)
class SlotAttempt:
    index: int
    pid: int
    job_id: str
    shard: int
    attempt: int
    deadline: float
    last_step: float | None
    started: float


class AttemptSlots:
    """Shared memory: created in the main process before fork, written by pool processes."""

    def __init__(self, slots: int = MAX_SLOTS) -> None:
        self.slots = slots
        self._f = RawArray("d", slots * _F)
        self._i = RawArray("Q", slots * _I)

    def begin(self, index: int, *, pid: int, job_id: str, shard: int, attempt: int, deadline: float) -> None:
        if not 0 <= index < self.slots:
            return
        i, f = index * _I, index * _F
        self._i[i : i + _I] = [pid, int(job_id, 16), shard, attempt]
        self._f[f + 1], self._f[f + 2] = 0.0, time.time()
        self._f[f] = deadline  # last: the watch reads the deadline first

    def set_deadline(self, index: int, deadline: float) -> None:
        if 0 <= index < self.slots and self._f[index * _F] > 0:
            self._f[index * _F] = deadline

    def extend(self, index: int, deadline: float) -> None:
        """Move the running attempt's deadline to `deadline` if that is later (ProgressDeadline)."""
        if 0 <= index < self.slots and 0 < self._f[index * _F] < deadline:
            self._f[index * _F] = deadline

    def step(self, index: int, now: float) -> None:
        """An engine step of the slot's attempt started at `now` (unix seconds)."""
        if 0 <= index < self.slots:
            self._f[index * _F + 1] = now

    def end(self, index: int) -> None:
        if 0 <= index < self.slots:
            self._f[index * _F] = 0.0

    def get(self, index: int) -> SlotAttempt | None:
        f, i = index * _F, index * _I
        deadline = self._f[f]
        if deadline <= 0:
            return None
        pid, job, shard, attempt = self._i[i : i + _I]
        last = self._f[f + 1]
        return SlotAttempt(index, int(pid), f"{job:016x}", int(shard), int(attempt), deadline,
                           last if last > 0 else None, self._f[f + 2])  # fmt: skip

    def expired(self, now: float) -> list[SlotAttempt]:
        return [a for a in (self.get(i) for i in range(self.slots)) if a is not None and now > a.deadline]


class DeadlineWatch:
    """Main-process thread: every `interval_s`, SIGKILL the pool processes past their attempt deadline."""

    def __init__(self, slots: AttemptSlots, *, interval_s: float = 1.0) -> None:
        self.slots = slots
        self.interval_s = interval_s
        self._stop = threading.Event()

    def check(self, now: float) -> list[SlotAttempt]:
        killed = []
        for late in self.slots.expired(now):
            current = self.slots.get(late.index)
            if current is None or current.pid != late.pid or current.attempt != late.attempt:
                continue  # it ended (or the next one began) since the scan
            if now <= current.deadline:
                continue  # a finished row moved its deadline since the scan
            if not _is_child(late.pid):
                self.slots.end(late.index)
                continue
            log.error(
                "attempt_deadline_exceeded", job_id=late.job_id, shard=late.shard, attempt=late.attempt,
                pid=late.pid, ran_s=round(now - late.started, 1), over_s=round(now - late.deadline, 1),
                last_step_age_s=round(now - late.last_step, 1) if late.last_step else None,
            )  # fmt: skip
            with contextlib.suppress(ProcessLookupError):
                os.kill(late.pid, signal.SIGKILL)
            self.slots.end(late.index)
            killed.append(late)
        return killed

    def run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check(time.time())
            except Exception:  # the watch must outlive any bug
                log.exception("deadline_watch_error")

    def start(self) -> DeadlineWatch:
        threading.Thread(target=self.run, name="freight-deadline-watch", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()


def _is_child(pid: int) -> bool:
    """True when `pid` is a live process whose parent is this process (Linux /proc; elsewhere: alive)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            # "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'
            return int(fh.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
