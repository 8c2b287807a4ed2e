"""Dashboard under load: 50 browsers' worth of polling clients against a store that a running fleet
keeps changing. Reports the server's CPU and each page's p50 / p99 latency; target p99 <= 200 ms.

The store: 60 finished jobs, 6 running ones whose shards commit while the bench runs (a writer
thread commits one shard somewhere every 100 ms), a 2,000-shard job, and the fleet's Redis (workers'
heartbeats, queues). Each client does what a browser on the jobs page does: /ui/jobs.json every
second; every fifth second it also opens a job's page and its JSON, as a person clicking through.
Besides the latency the clients see, it reports the server's own time of each answer (its
Server-Timing header): the difference is time spent waiting for a CPU or in the clients.

Peer, in the same run, with the same clients: a server that answers the same two questions the
way the CLI does, from storage on every request (`freight jobs --prefix`'s list_jobs for the list;
`freight status` + `freight cost`'s job_status and report_now for a job), with no shared snapshot.

    .venv/bin/python bench/dashboard_load.py [--clients 50] [--seconds 30] [--no-peer]

Talks to 127.0.0.1 only; every loop is bounded by --seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/dashboard/planted.py: jobs as freight writes them

REDIS_URL = "redis://127.0.0.1:6379/10"
TICKS = os.sysconf("SC_CLK_TCK")


def plant(root: Path) -> dict[str, list]:
    """The store; returns the running jobs' (store, manifest, next shard) to commit during the run."""
    from tests.dashboard.planted import commit, finish, lose_attempt, plant_job

    running = []
    for i in range(60):
        store, manifest = plant_job(str(root / "nightly" / f"job-{i:02d}"), shards=8, created_at=time.time() - 86_400 + i)
        finish(store, manifest)
    for i in range(6):
        store, manifest = plant_job(str(root / "live" / f"job-{i}"), shards=400, created_at=time.time() - 600 + i)
        commit(store, manifest, range(40), failed_rows=i % 2)
        lose_attempt(store, manifest, 41)
        running.append([store, manifest, 40])
    big, big_manifest = plant_job(str(root / "big"), shards=2_000, rows_per_shard=1, created_at=time.time() - 300)
    commit(big, big_manifest, range(1_000))
    return {"running": running, "big": [big_manifest.job_id]}


def plant_fleet() -> None:
    import json

    import redis

    from jobs.client import queue_for_model
    from jobs.progress import WorkerBeat

    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    client.flushdb()
    queue = queue_for_model("models/tiny")
    client.sadd("freight:queues", queue)
    client.rpush(queue, *[json.dumps({"shard": i}) for i in range(200)])
    for w in range(16):
        beat = WorkerBeat(worker_id=f"gpu-{w}/1", busy=True, instance_id=f"i-{w:04x}", queue=queue,
                          tokens_per_second=800.0, heartbeat=time.time(), model="models/tiny")  # fmt: skip
        client.hset("freight:workers", beat.worker_id, beat.to_json())
    client.close()


def write_fleet(running: list, every: float, stop: Any, commits: Any) -> None:
    """The fleet, in a process of its own (its Parquet writes must not slow the clients' event loop):
    commits one shard of a running job every `every` seconds until `stop` is set."""
    from tests.dashboard.planted import commit

    while not stop.wait(every):
        job = random.choice(running)
        store, manifest, nxt = job
        if nxt < len(manifest.shards):
            commit(store, manifest, [nxt])
            job[2] += 1
            with commits.get_lock():
                commits.value += 1


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def start(command: list[str], port: int) -> subprocess.Popen[bytes]:
    import httpx2

    env = {**os.environ, "PYTHONPATH": str(REPO), "FREIGHT_LOG_LEVEL": "warning"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/ui/jobs.json", timeout=30).status_code == 200:
                return proc
        except httpx2.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"{command} did not answer: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")


def server_ms(response: Any) -> float | None:
    """The answer's own Server-Timing `app;dur=MS` (jobs/dashboard/headers.py), None without one."""
    for part in response.headers.get("server-timing", "").split(","):
        name, _, rest = part.strip().partition(";dur=")
        if name == "app" and rest:
            return float(rest)
    return None


async def client_loop(base: str, seconds: float, refs: list[str], out: dict[str, list[float]], errors: list[str],
                      served: list[float]) -> None:  # fmt: skip
    import httpx2

    async with httpx2.AsyncClient(base_url=base, timeout=30) as http:
        await asyncio.sleep(random.random())  # browsers do not poll in step
        end = time.monotonic() + seconds
        tick = 0
        while time.monotonic() < end:
            began = time.monotonic()
            paths = [("list", "/ui/jobs.json")]
            if tick % 5 == 4:
                ref = random.choice(refs)
                paths += [("job page", f"/jobs/{ref}"), ("job json", f"/ui/jobs/{ref}.json")]
            for kind, path in paths:
                t0 = time.perf_counter()
                try:
                    response = await http.get(path)
                    if response.status_code != 200:
                        errors.append(f"{path}: {response.status_code}")
                    if (ms := server_ms(response)) is not None:
                        served.append(ms / 1000)
                except httpx2.TransportError as exc:
                    errors.append(f"{path}: {exc!r}")
                out[kind].append(time.perf_counter() - t0)
            tick += 1
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - began)))


def measure(name: str, command: list[str], port: int, clients: int, seconds: float, refs: list[str],
            running: list) -> dict:  # fmt: skip
    proc = start(command, port)
    try:
        import httpx2

        for ref in refs:  # the first look at each job reads its records: warm up before measuring
            httpx2.get(f"http://127.0.0.1:{port}/ui/jobs/{ref}.json", timeout=120)
        context = multiprocessing.get_context("fork")
        stop, commits = context.Event(), context.Value("i", 0)
        writer = context.Process(target=write_fleet, args=(running, 0.1, stop, commits), daemon=True)
        writer.start()
        latencies: dict[str, list[float]] = {"list": [], "job page": [], "job json": []}
        errors: list[str] = []
        served: list[float] = []  # the server's own time of each answer that says it (Server-Timing)
        cpu0, wall0 = cpu_seconds(proc.pid), time.monotonic()

        async def run_all() -> None:
            await asyncio.gather(*(client_loop(f"http://127.0.0.1:{port}", seconds, refs, latencies, errors, served)
                                   for _ in range(clients)))  # fmt: skip

        asyncio.run(run_all())
        cpu, wall = cpu_seconds(proc.pid) - cpu0, time.monotonic() - wall0
        stop.set()
        writer.join(30)
    finally:
        proc.terminate()
        proc.wait(30)
    return {"name": name, "latencies": latencies, "errors": errors, "cpu": cpu / wall, "commits": commits.value,
            "requests": sum(len(v) for v in latencies.values()), "served": served}  # fmt: skip


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000 if len(values) > 1 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--serve-peer", metavar="STORE", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=8061, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_peer:
        serve_peer(args.serve_peer, args.port)
        return
    if not 1 <= args.clients <= 500 or not 1 <= args.seconds <= 600:
        raise SystemExit("--clients in [1, 500] and --seconds in [1, 600]")
    with tempfile.TemporaryDirectory(prefix="freight-dashboard-load-") as tmp:
        root = Path(tmp) / "store"
        print(f"planting the store in {root} ...", flush=True)
        planted = plant(root)
        plant_fleet()
        from jobs.dashboard.board import JobBoard
        from jobs.settings import get_settings
        from jobs.storage import LocalStore

        jobs = JobBoard(LocalStore(root), get_settings()).snapshot().jobs
        refs = [j.ref for j in jobs if not j.done] + [j.ref for j in jobs if j.done][:4]
        freight = str(Path(sys.executable).with_name("freight"))
        results = [measure("dashboard", [freight, "dashboard", "--store", str(root), "--redis", REDIS_URL, "--port",
                                         "8060"], 8060, args.clients, args.seconds, refs, planted["running"])]  # fmt: skip
        if not args.no_peer:
            results.append(measure("peer: storage per request", [sys.executable, __file__, "--serve-peer", str(root),
                                                                 "--port", "8061"], 8061, args.clients, args.seconds,
                                   refs, planted["running"]))  # fmt: skip
    print(f"\n{args.clients} clients x {args.seconds:.0f} s; {os.cpu_count()} CPUs (clients and server share them)\n")
    print("| server | requests | list p50 / p99 ms | job page p50 / p99 ms | job json p50 / p99 ms | server's own time "
          "p50 / p99 ms | server CPU (cores) | errors |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        lat = r["latencies"]
        cells = " | ".join(f"{p(lat[k], 50):.1f} / {p(lat[k], 99):.1f}" for k in ("list", "job page", "job json"))
        own = f"{p(r['served'], 50):.1f} / {p(r['served'], 99):.1f}" if len(r["served"]) > 1 else "-"
        print(f"| {r['name']} | {r['requests']} | {cells} | {own} | {r['cpu']:.2f} | {len(r['errors'])} |")
    ours = results[0]
    worst = max(p(ours["latencies"][k], 99) for k in ours["latencies"])
    print(f"\ndashboard: worst p99 {worst:.1f} ms (target <= 200 ms): {'met' if worst <= 200 else 'NOT met'}; "
          f"{ours['commits']} shards committed during the run")  # fmt: skip
    if len(results) > 1:
        peer = results[1]
        peer_worst = max(p(peer["latencies"][k], 99) for k in peer["latencies"])
        print(f"peer / dashboard: worst p99 {peer_worst / worst:.1f}x, server CPU {peer['cpu'] / max(ours['cpu'], 1e-9):.1f}x")
    for r in results:
        if r["errors"]:
            print(f"{r['name']}: {len(r['errors'])} errors, first: {r['errors'][0]}")


def serve_peer(root: str, port: int) -> None:
    """The peer server: each request reads storage as `freight jobs --prefix` / `status` / `cost` do."""
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse, JSONResponse

    from jobs.finalize import committed_shards, report_now
    from jobs.job_list import list_jobs
    from jobs.settings import get_settings
    from jobs.status import job_status, read_cost
    from jobs.storage import open_store

    settings = get_settings()
    app = FastAPI()

    def find(ref: str) -> str:
        return next(r.output for r in list_jobs(settings, prefix=root) if r.job_id == ref)

    @app.get("/ui/jobs.json")
    def jobs() -> JSONResponse:
        return JSONResponse({"jobs": [r.as_dict() for r in list_jobs(settings, prefix=root)]})

    def detail(ref: str) -> dict:
        store = open_store(find(ref), settings)
        status = job_status(store)
        from jobs.manifest import read_manifest

        report = read_cost(store) or report_now(store, read_manifest(store), sorted(committed_shards(store)))
        return {"status": status.as_dict(), "cost": report}

    @app.get("/ui/jobs/{ref}.json")
    def job_json(ref: str) -> JSONResponse:
        return JSONResponse(detail(ref))

    @app.get("/jobs/{ref}")
    def job_page(ref: str) -> HTMLResponse:
        return HTMLResponse(f"<pre>{detail(ref)}</pre>")

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
