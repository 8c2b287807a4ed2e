"""What `freight serve` costs over `freight run` on the same OpenAI batch file, measured in one run:

1. wall time of a 5,000-request batch through the API (the official `openai` SDK: upload, create,
   poll until completed, download the output file), against `freight run FILE` + `freight results
   --format openai` in processes of their own (the same file, shards, engine and threads); the API
   once on a server that has run nothing yet (it imports torch and loads the model for this batch,
   as `freight run` does) and once on the same server again (the model stays loaded). Target <= 1.05x.
2. upload throughput on loopback: a ~100 MB batch file through `files.create` (streamed to the store,
   its lines counted and checked), against copying the same file into the store's folder. Target
   >= 100 MB/s.
3. `GET /v1/batches/{id}` latency seen by 50 concurrent pollers (each polls every --poll-every s,
   1 by default) while a batch of --poll-requests requests runs on the server, against the same pollers on the idle server, and
   the API process's CPU per GET (what bounds the rate one server answers). Target p99 <= 50 ms.

Every answer of the API's output file is checked against `freight run`'s for the same custom_id.

    .venv/bin/python bench/serve_overhead.py [--requests 5000] [--max-tokens 8] [--shard-rows 256]
        [--threads 1] [--upload-mb 100] [--pollers 50] [--poll-every 1] [--poll-requests 20000]

Talks to 127.0.0.1 only; the model is the tiny random demo checkpoint; everything is written under a
temporary folder that is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# tests/api/serve_harness.py: start `freight serve`, wait for a batch (it imports tests/processes.py)
sys.path[:0] = [str(REPO), str(REPO / "tests")]

TOPICS = ("a list", "a queue", "a tree", "a graph", "a heap", "a trie", "a ring buffer", "a bloom filter")


def batch_file(path: Path, requests: int, max_tokens: int, model: Path) -> Path:
    """`requests` chat requests with distinct prompts (a shared system prompt, as batch files have),
    each naming the checkpoint (a server without --models takes a model's path)."""
    system = {"role": "system", "content": "You are a terse assistant. Answer in one sentence."}
    with path.open("w") as f:
        for i in range(requests):
            user = {"role": "user", "content": f"Explain {TOPICS[i % len(TOPICS)]} to engineer number {i}."}
            body = {"model": str(model), "messages": [system, user], "max_tokens": max_tokens, "temperature": 0}
            f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": body}) + "\n")  # fmt: skip
    return path


def big_file(path: Path, megabytes: int) -> Path:
    """A batch file of about `megabytes` MB in lines of ~2.5 kB (under 50,000 lines: OpenAI's cap)."""
    filler = "lorem ipsum dolor sit amet " * 90
    with path.open("w") as f:
        i = 0
        while f.tell() < megabytes * 1_000_000:
            body = {"messages": [{"role": "user", "content": f"{i}: {filler}"}], "max_tokens": 1}
            f.write(json.dumps({"custom_id": f"u{i}", "url": "/v1/chat/completions", "body": body}) + "\n")
            i += 1
    return path


def answers(lines: bytes) -> dict[str, str]:
    """custom_id -> the chat completion's text, of an OpenAI batch output file."""
    out = {}
    for text in lines.splitlines():
        line = json.loads(text)
        out[line["custom_id"]] = line["response"]["body"]["choices"][0]["message"]["content"]
    return out


def run_peer(freight: str, data: Path, model: Path, work: Path, args: argparse.Namespace, env: dict[str, str]) -> dict:
    out = work / "peer-out"
    t0 = time.perf_counter()
    subprocess.run([freight, "run", str(data), "--model", str(model), "--output", str(out), "--shard-rows",
                    str(args.shard_rows)], check=True, env=env, capture_output=True)  # fmt: skip
    t_run = time.perf_counter() - t0
    export = work / "peer.jsonl"
    subprocess.run([freight, "results", str(out), "--format", "openai", "--to", str(export)], check=True, env=env,
                   capture_output=True)  # fmt: skip
    return {"run_s": t_run, "wall_s": time.perf_counter() - t0, "answers": answers(export.read_bytes())}


def run_api(client: Any, data: Path, wait_batch: Any) -> dict:
    """Upload, create, poll until completed, download: the SDK's calls, timed end to end."""
    t0 = time.perf_counter()
    with data.open("rb") as f:
        upload = client.files.create(file=f, purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_batch(client, batch.id, timeout=3600)
    assert done.status == "completed" and done.request_counts.failed == 0, done
    content = client.files.content(done.output_file_id).read()
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "answers": answers(content), "batch": done}


async def poll(url: str, key: str, batch_id: str, pollers: int, every: float, until: Any) -> list[float]:
    """`pollers` clients, each GETting the batch every `every` s until `until()`; latencies in ms."""
    import httpx2

    latencies: list[float] = []
    limits = httpx2.Limits(max_connections=pollers, max_keepalive_connections=pollers)
    async with httpx2.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, limits=limits,
                                  timeout=30.0) as http:  # fmt: skip

        async def poller(offset: float) -> None:
            await asyncio.sleep(offset)  # spread the clients over one period, as independent clients are
            while not until():
                t0 = time.perf_counter()
                answer = await http.get(f"/v1/batches/{batch_id}")
                latencies.append((time.perf_counter() - t0) * 1000)
                answer.raise_for_status()
                await asyncio.sleep(max(0.0, every - (time.perf_counter() - t0)))

        await asyncio.gather(*(poller(every * i / pollers) for i in range(pollers)))
    return latencies


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description="freight serve against freight run on the same batch file")
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--shard-rows", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each side (OMP_NUM_THREADS)")
    parser.add_argument("--upload-mb", type=int, default=100)
    parser.add_argument("--pollers", type=int, default=50)
    parser.add_argument("--poll-every", type=float, default=1.0, help="seconds between one poller's GETs")
    parser.add_argument("--poll-requests", type=int, default=20_000,
                        help="requests of the batch the pollers watch (long enough for a p99 of its GETs)")
    parser.add_argument("--poll-seconds", type=float, default=30.0, help="how long the idle-server pollers run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="freight-bench-serve-") as tmp:
        measure(args, Path(tmp))


def measure(args: argparse.Namespace, work: Path) -> None:
    from openai import OpenAI

    from jobs.api.keys import create_key
    from jobs.storage import LocalStore
    from tests.api.serve_harness import FREIGHT, start_server, wait_batch
    from worker.demo_model import make_demo_model

    # both sides alike: the same threads, no result cache (each answer computed), the CPU kernels built
    # once in the usual cache before either is timed, speed profiles kept apart from the user's
    kernels = os.environ.get("FREIGHT_KERNEL_CACHE") or str(
        Path(os.environ.get("FREIGHT_CACHE_DIR") or Path.home() / ".cache" / "freight") / "kernels")
    env = {k: v for k, v in os.environ.items() if k != "FREIGHT_RESULT_CACHE"}
    env.update({"OMP_NUM_THREADS": str(args.threads), "FREIGHT_LOG_LEVEL": "warning", "FREIGHT_KERNEL_CACHE": kernels,
                "FREIGHT_CACHE_DIR": str(work / "cache"), "FREIGHT_PROFILES_PATH": str(work / "profiles.json")})
    model = make_demo_model(work / "tiny", "llama")
    warm = batch_file(work / "warm.jsonl", 4, args.max_tokens, model)
    subprocess.run([FREIGHT, "run", str(warm), "--model", str(model), "--output", str(work / "warm-out")], check=True,
                   env=env, capture_output=True)  # fmt: skip
    data = batch_file(work / "batch.jsonl", args.requests, args.max_tokens, model)
    rows: list[tuple[str, str, str, str]] = []  # (measure, freight serve, peer, ratio)

    # 1. wall time of the batch
    peer = run_peer(FREIGHT, data, model, work, args, env)
    # the defaults a user gets (the harness's quicker --poll for tests overridden: the last value counts)
    server = start_server(work / "store", env, "--poll", "1", "--shard-rows", str(args.shard_rows),
                          "--max-upload", "1GiB")  # fmt: skip
    try:
        key = create_key(LocalStore(server.store_dir), "bench")[0]
        client = OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=600.0)
        cold = run_api(client, data, wait_batch)
        warm = run_api(client, data, wait_batch)
        for name, api in (("cold", cold), ("warm", warm)):
            different = [cid for cid, text in peer["answers"].items() if api["answers"].get(cid) != text]
            assert len(api["answers"]) == args.requests and not different, f"{name}: {len(different)} answers differ"
        for name, api in (("first batch (loads the model)", cold), ("next batch (model loaded)", warm)):
            rows.append((f"{args.requests:,}-request batch, {name}: s", f"{api['wall_s']:.2f}",
                         f"{peer['wall_s']:.2f}", f"{api['wall_s'] / peer['wall_s']:.3f}x"))  # fmt: skip

        # 2. upload throughput
        big = big_file(work / "big.jsonl", args.upload_mb)
        size = big.stat().st_size
        cpu0, t0 = process_cpu(server.process.pid), time.perf_counter()
        with big.open("rb") as f:
            uploaded = client.files.create(file=f, purpose="batch")
        upload_s, upload_cpu = time.perf_counter() - t0, process_cpu(server.process.pid) - cpu0
        assert uploaded.bytes == size
        t0 = time.perf_counter()
        shutil.copyfile(big, work / "store" / "copy.jsonl")
        copy_s = time.perf_counter() - t0
        rows.append((f"upload of {size / 1e6:.0f} MB: MB/s", f"{size / 1e6 / upload_s:.0f}",
                     f"{size / 1e6 / copy_s:.0f} (file copy)", f"{copy_s / upload_s:.3f}x"))  # fmt: skip
        rows.append(("upload: MB per CPU-second of the server", f"{size / 1e6 / upload_cpu:.0f}", "", ""))

        # 3. GET /v1/batches/{id} while a batch runs, and on the idle server
        watched = batch_file(work / "watched.jsonl", args.poll_requests, args.max_tokens, model)
        with watched.open("rb") as f:
            upload = client.files.create(file=f, purpose="batch")
        running = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                        completion_window="24h")  # fmt: skip
        state = {"done": False}

        def finished() -> bool:
            return state["done"]

        async def during() -> list[float]:
            async def watch() -> None:
                while True:
                    batch = await asyncio.to_thread(client.batches.retrieve, running.id)
                    if batch.status in ("completed", "failed", "expired", "cancelled"):
                        state["done"] = True
                        return
                    await asyncio.sleep(0.5)

            got, _ = await asyncio.gather(poll(server.url, key, running.id, args.pollers, args.poll_every, finished),
                                          watch())  # fmt: skip
            return got

        cpu0 = process_cpu(server.process.pid)
        busy = asyncio.run(during())
        busy_cpu = (process_cpu(server.process.pid) - cpu0) / len(busy) * 1000
        stop_at = time.monotonic() + args.poll_seconds
        cpu0 = process_cpu(server.process.pid)
        idle = asyncio.run(poll(server.url, key, running.id, args.pollers, args.poll_every,
                                lambda: time.monotonic() >= stop_at))  # fmt: skip
        idle_cpu = (process_cpu(server.process.pid) - cpu0) / len(idle) * 1000
        for q in (50, 99):
            rows.append((f"GET /v1/batches/{{id}}, {args.pollers} pollers, p{q}: ms", f"{pct(busy, q):.1f}",
                         f"{pct(idle, q):.1f} (idle server)", f"{pct(busy, q) / pct(idle, q):.2f}x"))  # fmt: skip
        rows.append(("GETs answered", f"{len(busy):,}", f"{len(idle):,}", ""))
        rows.append(("API process CPU per GET: ms (its batch process apart)", f"{busy_cpu:.2f}", f"{idle_cpu:.2f}", ""))
    finally:
        server.stop()

    print(f"freight serve vs freight run: {args.requests:,} requests, max_tokens {args.max_tokens}, shards of "
          f"{args.shard_rows}, {args.threads} torch thread(s); peer run {peer['run_s']:.2f} s + export "
          f"{peer['wall_s'] - peer['run_s']:.2f} s; every answer equal")  # fmt: skip
    widths = [max(len(r[i]) for r in [("measure", "freight serve", "peer", "serve / peer"), *rows]) for i in range(4)]
    for i, row in enumerate([("measure", "freight serve", "peer", "serve / peer"), *rows]):
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


if __name__ == "__main__":
    main()
