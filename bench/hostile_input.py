"""Hostile and careless input against the demo model: each case runs `freight` in a child process and
prints its exit code, the rows it kept (rows with a result, of the rows the input has), its first
error line (the command's, or the first failed row's) and the child's peak RSS.

    .venv/bin/python bench/hostile_input.py                  # every case
    .venv/bin/python bench/hostile_input.py --case prompt-50mb --case gzip-bomb

Nothing connects anywhere but 127.0.0.1: the webhook cases are refused at submit (no connection is
made to refuse them), and the Redis case points at a closed loopback port.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "examples" / "models" / "pycoder-tiny"
# The child's command runs under a wrapper that reports its own children's peak RSS (ru_maxrss, KiB).
WRAPPER = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
           "print('PEAK_RSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
           "sys.exit(code)")  # fmt: skip


@dataclass
class Result:
    case: str
    code: int
    kept: str
    error: str
    peak_mib: float


def _line(custom_id: str, prompt: str, **body: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                       "body": {"prompt": prompt, "max_tokens": 4, "temperature": 0, **body}})  # fmt: skip


def _jsonl(work: Path, *hostile: str) -> Path:
    path = work / "in.jsonl"
    with path.open("w", encoding="utf-8") as f:
        f.write(_line("good-1", "def add(a, b):") + "\n")
        for line in hostile:
            f.write(line + "\n")
        f.write(_line("good-2", "def sub(a, b):") + "\n")
    return path


def _parquet(work: Path, **columns: pa.Array) -> Path:
    path = work / "in.parquet"
    n = len(next(iter(columns.values()))) if columns else 3
    pq.write_table(pa.table({"prompt": ["def add(a, b):", "def sub(a, b):", "def mul(a, b):"][:n] or [], **columns}), path)
    return path


def _model(work: Path, **config: object) -> Path:
    # lazy: worker.demo_model pulls torch, which only the runs' own processes need
    from worker.demo_model import with_config

    return with_config(MODEL, work / "model", **config)


def _unknown_dtype(work: Path) -> Path:
    model = _model(work)
    data = (model / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = data[8 : 8 + n].decode().replace('"dtype":"F16"', '"dtype":"Q7X"', 1)
    (model / "model.safetensors").write_bytes(data[:8] + header.encode() + data[8 + n :])
    return model


def _deep_schema() -> str:
    schema: dict = {"type": "string"}
    for _ in range(300):
        schema = {"type": "object", "properties": {"a": schema}}
    return json.dumps(schema)


def _run_args(data: Path, out: Path, *extra: str, model: Path = MODEL) -> list[str]:
    return ["run", str(data), "--model", str(model), "--output", str(out), "--max-tokens", "4", *extra]


# case -> (what it is, a function of the work folder giving the freight arguments and extra environment)
CASES: dict[str, tuple[str, Callable[[Path], tuple[list[str], dict[str, str]]]]] = {
    "schema-300-deep": ("a row's json_schema 300 levels deep (Parquet, --row-constraints)", lambda w: (
        _run_args(_parquet(w, json_schema=pa.array([None, _deep_schema(), None])), w / "out", "--row-constraints"), {})),
    "line-100k-deep": ("a JSONL line nested 100k lists deep", lambda w: (
        _run_args(_jsonl(w, '{"custom_id": "deep", "body": {"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}}"),
                  w / "out"), {})),
    "lone-surrogate": ("a prompt and a custom_id holding \\ud800", lambda w: (
        _run_args(_jsonl(w, '{"custom_id": "s\\ud800", "url": "/v1/completions", "body": {"prompt": "x\\ud800"}}'),
                  w / "out"), {})),
    "webhook-metadata": ("--notify http://169.254.169.254/latest/meta-data/", lambda w: (
        _run_args(_jsonl(w), w / "out", "--notify", "http://169.254.169.254/latest/meta-data/"), {})),
    "webhook-redis": ("--notify http://127.0.0.1:6379/", lambda w: (
        _run_args(_jsonl(w), w / "out", "--notify", "http://127.0.0.1:6379/"), {})),
    "prompt-50mb": ("one 50 MB prompt among good rows", lambda w: (
        _run_args(_jsonl(w, _line("huge", "a " * 25_000_000)), w / "out"), {})),
    "gzip-bomb": ("a 300 KB .jsonl.gz that expands to 300 MB", lambda w: (
        _run_args(_gzip_bomb(w), w / "out"), {})),
    "max-positions-1e7": ("config.json max_position_embeddings 10^7", lambda w: (
        _run_args(_jsonl(w), w / "out", model=_model(w, max_position_embeddings=10**7)), {})),
    "max-positions-1e12": ("config.json max_position_embeddings 10^12", lambda w: (
        _run_args(_jsonl(w), w / "out", model=_model(w, max_position_embeddings=10**12)), {})),
    "intermediate-1e9": ("config.json intermediate_size 10^9", lambda w: (
        _run_args(_jsonl(w), w / "out", model=_model(w, intermediate_size=10**9)), {})),
    "unknown-dtype": ("a safetensors tensor of dtype Q7X", lambda w: (
        _run_args(_jsonl(w), w / "out", model=_unknown_dtype(w)), {})),
    "output-in-input": ("--output inside the input folder, run twice", lambda w: (
        _run_args(_input_folder(w), w / "data" / "out", "--shard-rows", "2"), {})),
    "regex-1e6": ("--regex 'a{1000000}'", lambda w: (_run_args(_jsonl(w), w / "out", "--regex", "a{1000000}"), {})),
    "choice-100k": ("a row's guided_choice of 100,000 entries", lambda w: (
        _run_args(_jsonl(w, _line("many", "x", guided_choice=[f"c{i}" for i in range(100_000)])), w / "out"), {})),
    "logit-bias-5000-digits": ("a logit_bias key of 5000 digits", lambda w: (
        _run_args(_jsonl(w, _line("bias", "x", logit_bias={"9" * 5000: 1})), w / "out"), {})),
    "redis-password-query": ("FREIGHT_REDIS_URL with ?password= (a closed loopback port)", lambda w: (
        ["submit", str(_jsonl(w)), "--model", str(MODEL), "--output", str(w / "out")],
        {"FREIGHT_REDIS_URL": "redis://127.0.0.1:1/0?password=hunter2", "FREIGHT_SUBMIT_REDIS_RETRY_S": "0"})),
}  # fmt: skip


def _gzip_bomb(work: Path) -> Path:
    path = work / "in.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write((_line("good-1", "def add(a, b):") + "\n").encode())
        f.write(b" " * (300 << 20))
    return path


def _input_folder(work: Path) -> Path:
    folder = work / "data"
    folder.mkdir()
    pq.write_table(pa.table({"prompt": ["def add(a, b):", "def sub(a, b):", "def mul(a, b):"]}), folder / "a.parquet")
    return folder


def _freight(args: list[str], env: dict[str, str]) -> tuple[int, str, float]:
    cmd = [sys.executable, "-c", WRAPPER, sys.executable, "-c", "from freight_cli import main; main()", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, cwd=REPO)
    peak = next((int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("PEAK_RSS_KIB")), 0)
    said = [line for line in (done.stdout + done.stderr).splitlines() if line.strip() and "PEAK_RSS_KIB" not in line]
    error = next((line for line in said if line.startswith("error")), "")
    if "Traceback (most recent call last):" in done.stderr:
        error = "TRACEBACK: " + said[-1]
    return done.returncode, error, peak / 1024


def _kept(out: Path) -> tuple[str, str]:
    """("kept/total", the first failed row's error) from OUT's shards."""
    shards = out / "shards"
    if not shards.is_dir() or not any(shards.glob("*.parquet")):
        return "-", ""
    rows = pq.read_table(shards).to_pylist()
    failed = [r for r in rows if r["error"] is not None]
    return f"{len(rows) - len(failed)}/{len(rows)}", (failed[0]["error"] if failed else "")


def run_case(name: str, work: Path) -> Result:
    args, env = CASES[name][1](work)
    out = Path(args[args.index("--output") + 1])
    code, error, peak = _freight(args, env)
    if name == "output-in-input" and code == 0:  # the rerun, which must not read the job's own shards
        (out / "_SUCCESS").unlink()
        code, error, peak2 = _freight(args, env)
        peak = max(peak, peak2)
    kept, row_error = _kept(out)
    return Result(name, code, kept, (error or row_error)[:160], peak)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="run only these (repeatable)")
    names = parser.parse_args().case or list(CASES)
    env_allow = os.environ.pop("FREIGHT_NOTIFY_ALLOW", None)  # the webhook cases show the default refusal
    print(f"{'case':<24} {'exit':>4} {'kept':>6} {'peak RSS':>10}  error line")
    try:
        for name in names:
            with tempfile.TemporaryDirectory(prefix=f"hostile-{name}-") as tmp:
                r = run_case(name, Path(tmp))
            print(f"{r.case:<24} {r.code:>4} {r.kept:>6} {r.peak_mib:>7.0f} MiB  {r.error}", flush=True)
    finally:
        if env_allow is not None:
            os.environ["FREIGHT_NOTIFY_ALLOW"] = env_allow


if __name__ == "__main__":
    main()
