"""Peak memory stays bounded by the model, not by the input: a job whose JSONL holds a 50 MB prompt,
a line nested 100k deep and a 100,000-entry choice list among good rows runs in a child process
whose peak RSS stays under 2 GiB (the demo model's normal run peaks near 1.2 GiB on the CPU; the
50 MB prompt alone took 10.5 GB when every text was tokenized before the length check)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

BOUND_MIB = 2048
WRAPPER = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
           "print('PEAK_RSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
           "sys.exit(code)")  # fmt: skip


def _line(custom_id: str, prompt: str, **body: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                       "body": {"prompt": prompt, "max_tokens": 3, "temperature": 0, **body}})  # fmt: skip


def test_hostile_input_runs_in_bounded_memory(tmp_path: Path, demo_model_dir: Path) -> None:
    data = tmp_path / "in.jsonl"
    with data.open("w") as f:
        f.write(_line("good-1", "def add(a, b):") + "\n")
        f.write(_line("huge", "a " * 25_000_000) + "\n")  # 50 MB
        f.write('{"custom_id": "deep", "body": {"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}}\n")
        f.write(_line("many", "x", guided_choice=[f"c{i}" for i in range(100_000)]) + "\n")
        f.write(_line("good-2", "def sub(a, b):") + "\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", WRAPPER, sys.executable, "-c", "from freight_cli import main; main()",
           "run", str(data), "--model", str(demo_model_dir), "--output", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    peak_mib = next(int(s.split()[1]) for s in done.stderr.splitlines() if s.startswith("PEAK_RSS_KIB")) / 1024
    assert peak_mib < BOUND_MIB, f"peak RSS {peak_mib:.0f} MiB"
    rows = {r["id"]: r for r in pq.read_table(out / "shards").to_pylist()}
    assert rows["good-1"]["error"] is None and rows["good-2"]["error"] is None
    assert rows["huge"]["error"].startswith("prompt has 50000000 characters")
    assert "nested deeper than 128 levels" in rows["line-3"]["error"]
    assert "100,000 choices" in rows["many"]["error"]
