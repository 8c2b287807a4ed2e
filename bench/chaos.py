"""Fleet recovery under chaos: one job on 3 real `freight worker` processes, with freight's default
settings, while the bench SIGKILLs workers, sends spot notices, restarts Redis and flushes its queue.

    .venv/bin/python bench/chaos.py                       # 20 kills, 5 notices, 1 restart, 1 flush
    .venv/bin/python bench/chaos.py --rows 240 --kills 6 --notices 2 --seed 3 --min-undisturbed-s 0

First the same job runs undisturbed on 3 workers (its wall time and its rows are the reference);
if it takes under --min-undisturbed-s (90 s) the rows grow in proportion and it runs again, so the
chaos plan fits inside the job on a fast machine too.
Then the chaos run: the events, in a random order (seeded), one every --gap seconds (default: spread
over the first 60% of the undisturbed wall time, at least 3 s apart), while the job has work left:
- kill: SIGKILL of a busy worker's main and pool process (a vanished machine), a new worker started
  at once (3 workers stay); the killed shard (the worker's latest start in `freight:started` without
  a result) comes back through the lease reaper (60 s without its node's beat);
- notice: a spot interruption notice from that worker's fake IMDS (tests/distributed/fleet_servers.py):
  it hands its shard back and stops; a new worker is started;
- redis restart: SIGTERM (append-only file kept), 2 s down, back on the same port;
- flush: the queue lists and kombu's unacked keys deleted (queued shards lost from Redis; the
  workers' reconciler queues them again from storage).
Nothing resubmits and nothing waits on the job: it must finish on its own. Checks: every row
exactly once, results equal to the undisturbed run's. Prints the time from each kill (and notice) to
the start of its shard's next attempt (workers' JSON log lines) and the wall-time overhead.

Starts its own redis-server (AOF on) on a free port; workers run with OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "distributed"))  # the real servers of the distributed tests

from fleet_jobs import RESULT_COLUMNS, make_input  # noqa: E402
from fleet_servers import FakeImds, RedisServer, WorkerProcess  # noqa: E402

FREIGHT = str(Path(sys.executable).with_name("freight"))


@dataclass
class Event:
    kind: str  # kill | notice | redis_restart | flush
    at: float  # unix seconds
    worker: str | None = None
    shard: int | None = None
    attempt: int | None = None
    requeued_after_s: float | None = None  # to the shard's message back on its queue
    restarted_after_s: float | None = None  # to the start of the shard's next attempt


@dataclass
class ChaosReport:
    rows: int
    shards: int
    undisturbed_s: float
    chaos_s: float
    events: list[Event] = field(default_factory=list)
    rows_exactly_once: bool = False
    equal_to_undisturbed: bool = False
    attempts: int = 0
    lost_attempts_billed: int = 0

    @property
    def overhead(self) -> float:
        return self.chaos_s / self.undisturbed_s - 1.0


class Fleet:
    """3 workers with their own fake IMDS each, replaced when one dies."""

    def __init__(self, root: Path, redis: RedisServer, queue: str) -> None:
        self.root, self.redis, self.queue = root, redis, queue
        self.workers: dict[str, tuple[WorkerProcess, FakeImds]] = {}
        self.count = 0
        self.noticed: set[str] = set()  # noticed workers hand their shard back and stop: not a target
        self.live = redis.client()

    def start(self) -> str:
        self.count += 1
        name = f"w{self.count}"
        imds = FakeImds().start()
        env = {"FREIGHT_REDIS_URL": self.redis.url, "FREIGHT_LOG_FORMAT": "json", "FREIGHT_IMDS_URL": imds.url,
               "FREIGHT_METRICS_PORT": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # fmt: skip
        self.workers[name] = (WorkerProcess(name, env, self.queue, self.root), imds)
        return name

    def busy(self) -> list[tuple[str, dict]]:
        """(name, heartbeat) of workers whose process runs an attempt now."""
        out = []
        for name, (proc, _) in self.workers.items():
            raw = self.live.hget("freight:workers", f"{name}@test#0")
            beat = json.loads(raw) if raw else {}
            if proc.alive() and name not in self.noticed and beat.get("shard") is not None and beat.get("busy"):
                out.append((name, beat))
        return out

    def retire(self, name: str) -> None:
        proc, imds = self.workers.pop(name)
        proc.stop(timeout=90)
        imds.stop()

    def retire_stopped(self) -> None:
        """Drop workers that exited (a noticed worker stops on its own once its shard is handed back)."""
        for name in [n for n, (proc, _) in self.workers.items() if not proc.alive()]:
            self.retire(name)

    def stop(self) -> None:
        for name in list(self.workers):
            self.retire(name)
        self.live.close()


def _submit(redis_url: str, inp: Path, model: Path, out: Path, shard_rows: int, max_tokens: int) -> str:
    proc = subprocess.run([FREIGHT, "submit", str(inp), "--model", str(model), "--output", str(out),
                           "--shard-rows", str(shard_rows), "--max-tokens", str(max_tokens), "--seed", "7"],
                          env={**os.environ, "FREIGHT_REDIS_URL": redis_url}, capture_output=True, text=True,
                          cwd=REPO, timeout=300)  # fmt: skip
    if proc.returncode:
        raise SystemExit(proc.stderr)
    return proc.stdout.strip().splitlines()[-1]


def _wait_success(out: Path, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while not (out / "_SUCCESS").exists():
        if (out / "failures.json").exists():  # a shard failed for good: the job will never succeed
            raise SystemExit(f"the job in {out} failed: {(out / 'failures.json').read_text()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"the job in {out} did not finish within {timeout:.0f} s")
        time.sleep(0.5)
    return time.time()


def _rows(out: Path) -> list[dict]:
    from jobs import datasets
    from jobs.storage import open_store

    rows = datasets.read_results(open_store(str(out))).select(RESULT_COLUMNS).to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _attempt_starts(logs: list[Path], job_id: str) -> dict[int, list[tuple[int, float]]]:
    """shard -> [(attempt, first log time of that attempt)] from every worker's JSON lines."""
    first: dict[tuple[int, int], float] = {}
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError):
                e = json.loads(line)
                if e.get("job_id") == job_id and e.get("attempt") is not None and e.get("shard") is not None:
                    key = (int(e["shard"]), int(e["attempt"]))
                    first[key] = min(first.get(key, float("inf")), _ts(e["timestamp"]))
    starts: dict[int, list[tuple[int, float]]] = {}
    for (shard, attempt), at in first.items():
        starts.setdefault(shard, []).append((attempt, at))
    return starts


def _requeues(logs: list[Path], job_id: str) -> dict[int, list[float]]:
    """shard -> log times its message went back on the queue: the reaper's `lease.restored`, the
    reconciler's `shards_requeued`, a hand-back's `shard_stopped`."""
    back: dict[int, list[float]] = {}
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if not line.startswith("{") or job_id not in line:
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError):
                e = json.loads(line)
                if e.get("job_id") != job_id:
                    continue
                if e["event"] in ("lease.restored", "shard_stopped"):
                    back.setdefault(int(e["shard"]), []).append(_ts(e["timestamp"]))
                elif e["event"] == "shards_requeued":
                    for shard in e["shards"]:
                        back.setdefault(int(shard), []).append(_ts(e["timestamp"]))
    return back


def run_job(root: Path, redis: RedisServer, model: Path, inp: Path, args: argparse.Namespace, *,
            chaos: bool) -> tuple[float, Path, list[Event], list[Path], str]:  # fmt: skip
    from jobs.client import queue_for_model

    out = root / ("out-chaos" if chaos else "out-calm")
    fleet = Fleet(root / ("chaos" if chaos else "calm"), redis, queue_for_model(str(model)))
    fleet.root.mkdir(exist_ok=True)
    for _ in range(3):
        fleet.start()
    events: list[Event] = []
    try:
        deadline = time.monotonic() + 300
        while len(fleet.live.hgetall("freight:workers")) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        start = time.time()
        job_id = _submit(redis.url, inp, model, out, args.shard_rows, args.max_tokens)
        if chaos:
            events = _make_chaos(fleet, redis, out, job_id, args)
        end = _wait_success(out, args.timeout)
        return end - start, out, events, sorted(fleet.root.glob("worker-*.log")), job_id
    finally:
        fleet.stop()


def _make_chaos(
    fleet: Fleet, redis: RedisServer, out: Path, job_id: str, args: argparse.Namespace
) -> list[Event]:
    rng = random.Random(args.seed)
    plan = ["kill"] * args.kills + ["notice"] * args.notices + ["redis_restart", "flush"]
    rng.shuffle(plan)
    events: list[Event] = []
    for kind in plan:
        time.sleep(args.gap)
        fleet.retire_stopped()
        if (out / "_SUCCESS").exists():
            print(f"  the job finished before the chaos plan did ({len(events)} of {len(plan)} events)")
            break
        if kind in ("kill", "notice"):
            busy: list[tuple[str, dict]] = []
            deadline = time.monotonic() + 60
            while not busy and time.monotonic() < deadline and not (out / "_SUCCESS").exists():
                busy = fleet.busy()
                time.sleep(0.2)
            # a busy worker; none for a minute (all starting, or every shard left waits on the reaper): any
            names = [n for n, _ in busy] or [n for n in fleet.workers if n not in fleet.noticed]
            name = rng.choice(names)
            proc, imds = fleet.workers[name]
            event = Event(kind, time.time(), name)
            if kind == "kill":
                proc.kill_all()
                fleet.retire(name)
                event.shard, event.attempt = _killed_attempt(fleet, out, job_id, name)
            else:
                imds.announce("terminate")  # it hands its shard back and stops within a poll or two
                fleet.noticed.add(name)
            fleet.start()  # the Auto Scaling group's replacement
        elif kind == "redis_restart":
            event = Event(kind, time.time())
            redis.restart(down_s=2.0)
        else:
            event = Event(kind, time.time())
            client = redis.client()
            client.delete(fleet.queue, *(f"{fleet.queue}\x06\x16{p}" for p in range(1, 10)), "unacked",
                          "unacked_index")  # fmt: skip
            client.close()
        events.append(event)
        print(f"  {datetime.now():%H:%M:%S} {event.kind} {event.worker or ''} "
              f"{'' if event.shard is None else f'shard {event.shard} attempt {event.attempt}'}", flush=True)  # fmt: skip
    return events


def _killed_attempt(fleet: Fleet, out: Path, job_id: str, name: str) -> tuple[int | None, int | None]:
    """The attempt a killed worker ran: its latest start in `freight:started` whose shard has no
    result (a shard committed just before the kill was not lost)."""
    started = fleet.live.hgetall(f"freight:started:{job_id}")
    mine = []
    for shard, raw in started.items():
        info = json.loads(raw)
        if info.get("worker") == f"{name}@test#0" and not (out / "shards" / f"{int(shard):05d}.parquet").exists():
            mine.append((float(info["at"]), int(shard), int(info["attempt"])))
    if not mine:
        return None, None
    _, shard, attempt = max(mine)
    return shard, attempt


def _handed_back(log: Path, job_id: str) -> tuple[int | None, int | None]:
    """The shard a noticed worker handed back (its `shard_stopped` line), if any."""
    if log.exists():
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"shard_stopped"' in line:
                with contextlib.suppress(ValueError, KeyError):
                    e = json.loads(line)
                    if e.get("job_id") == job_id:
                        return int(e["shard"]), int(e["attempt"])
    return None, None


def run(args: argparse.Namespace) -> ChaosReport:
    from worker.demo_model import make_demo_model

    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server not found: apt-get install redis-server")
    root = Path(tempfile.mkdtemp(prefix="freight-chaos-"))
    redis = RedisServer(root / "redis").start()
    try:
        model = Path(make_demo_model(root / "model")).resolve()
        inp = make_input(root / "input.parquet", args.rows, max_tokens=(16, 48, 96, args.max_tokens))
        calm_s, calm_out, _, _, _ = run_job(root, redis, model, inp, args, chaos=False)
        for _ in range(3):  # a fast machine: a longer job, so the chaos plan fits in it (fixed costs such
            if calm_s >= args.min_undisturbed_s:  # as worker start-up do not scale: it may take two rounds)
                break
            scale = 1.1 * args.min_undisturbed_s / calm_s
            args.rows = int(args.rows * scale) // args.shard_rows * args.shard_rows + args.shard_rows
            print(f"undisturbed: {calm_s:.1f} s, under {args.min_undisturbed_s:.0f} s: {args.rows} rows instead",
                  flush=True)  # fmt: skip
            shutil.rmtree(calm_out)
            inp = make_input(root / "input.parquet", args.rows, max_tokens=(16, 48, 96, args.max_tokens))
            calm_s, calm_out, _, _, _ = run_job(root, redis, model, inp, args, chaos=False)
        if args.gap is None:
            args.gap = max(1.0, 0.5 * calm_s / (args.kills + args.notices + 2))
        print(f"undisturbed: {calm_s:.1f} s; chaos events every {args.gap:.1f} s", flush=True)
        chaos_s, chaos_out, events, logs, job_id = run_job(root, redis, model, inp, args, chaos=True)
        starts, back = _attempt_starts(logs, job_id), _requeues(logs, job_id)
        for e in events:
            if e.kind == "notice":
                e.shard, e.attempt = _handed_back(root / "chaos" / f"worker-{e.worker}.log", job_id)
            if e.shard is not None:
                later = [at for attempt, at in starts.get(e.shard, []) if attempt > (e.attempt or 0)]
                e.restarted_after_s = (min(later) - e.at) if later else None
                requeued = [at for at in back.get(e.shard, []) if at >= e.at]
                e.requeued_after_s = (min(requeued) - e.at) if requeued else None
        calm, rows = _rows(calm_out), _rows(chaos_out)
        ids = [r["id"] for r in rows]
        client = redis.client()
        attempts = sum(int(v) for k, v in client.hgetall(f"freight:attempts:{job_id}").items() if int(k) >= 0)
        client.close()
        from jobs.manifest import read_manifest
        from jobs.storage import open_store

        store = open_store(str(chaos_out))
        return ChaosReport(
            rows=args.rows, shards=len(read_manifest(store).shards), undisturbed_s=calm_s, chaos_s=chaos_s,
            events=events, rows_exactly_once=len(ids) == len(set(ids)) == args.rows,
            equal_to_undisturbed=rows == calm, attempts=attempts,
            lost_attempts_billed=sum(1 for k in store.list("waste/") if k.endswith("-lost.json")),
        )  # fmt: skip
    finally:
        redis.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}")


def print_report(r: ChaosReport) -> None:
    print(f"\nfleet recovery under chaos: {r.rows} rows, {r.shards} shards, 3 workers, default settings, "
          f"tiny demo model on the CPU ({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f})")  # fmt: skip
    print(f"{'event':<14} {'worker':<7} {'shard':>5} {'attempt':>7} {'back on queue':>14} {'next attempt':>13}")
    for e in r.events:
        back = "-" if e.requeued_after_s is None else f"{e.requeued_after_s:.1f} s"
        after = "-" if e.restarted_after_s is None else f"{e.restarted_after_s:.1f} s"
        shard = "" if e.shard is None else str(e.shard)
        print(f"{e.kind:<14} {e.worker or '':<7} {shard:>5} {e.attempt or '':>7} {back:>14} {after:>13}")
    for kind in ("kill", "notice"):
        for label, attr in (("back on the queue", "requeued_after_s"), ("restarted", "restarted_after_s")):
            times = [getattr(e, attr) for e in r.events if e.kind == kind and getattr(e, attr) is not None]
            if times:
                print(f"{kind}: {len(times)} shards {label}, median {statistics.median(times):.1f} s, "
                      f"max {max(times):.1f} s after the {kind}")  # fmt: skip
    print(f"undisturbed {r.undisturbed_s:.1f} s, under chaos {r.chaos_s:.1f} s: overhead {r.overhead:+.0%}")
    print(f"every row exactly once: {r.rows_exactly_once}; equal to the undisturbed run: {r.equal_to_undisturbed}; "
          f"{r.attempts} attempts for {r.shards} shards, {r.lost_attempts_billed} billed as lost")  # fmt: skip


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=480, help="rows of the job (more when it runs too fast)")
    ap.add_argument("--min-undisturbed-s", type=float, default=90.0,
                    help="if the undisturbed job is faster, the rows grow to take this long (0: never)")
    ap.add_argument("--shard-rows", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--notices", type=int, default=5)
    ap.add_argument("--gap", type=float, default=None, help="seconds between events (default: see above)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds each run may take")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, outputs)")
    return ap


def main() -> None:
    report = run(parser().parse_args())
    print_report(report)
    ok = report.rows_exactly_once and report.equal_to_undisturbed
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
