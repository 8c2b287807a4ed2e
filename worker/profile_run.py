"""`freight profile`'s measurement: a short synthetic job, fitted into a Profile.

The job runs as `freight run` in a fresh process, so its cost report holds what a real run pays
(the torch import and the model load included); a load in this process first builds the CPU
kernels and warms the page cache (one-time costs a later run does not pay). The dataset mixes
prompt lengths (a few to ~150 tokens) with no shared long prefixes, so prefill and decode are both
measured.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.errors import FreightError
from jobs.manifest import COST_KEY, read_manifest
from jobs.profile_store import Profile, fit_profile
from jobs.settings import Settings
from jobs.storage import open_store
from worker.local import load_model_engine

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
         "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango"]  # fmt: skip


def synthetic_prompts(rows: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"{i} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 120))) for i in range(rows)]


def run_profile(model: str, workdir: Path, settings: Settings, *, instance_type: str = "cpu-local",
                quantization: str | None = None, rows: int = 64, max_tokens: int = 32,
                price_per_hour: float | None = None) -> Profile:  # fmt: skip
    """Run the synthetic job on this machine and fit its cost report (FreightError if it cannot)."""
    engine, _ = load_model_engine(model, quantization, settings)  # kernels built, files cached
    del engine
    data, out = workdir / "profile.parquet", workdir / "out"
    pq.write_table(pa.table({"prompt": synthetic_prompts(rows)}), data)
    args = ["run", str(data), "--model", model, "--output", str(out), "--max-tokens", str(max_tokens),
            "--shard-rows", str(max(1, rows // 4)), "--instance-type", instance_type]  # fmt: skip
    args += ["--quantization", quantization] if quantization else []
    args += ["--price-per-hour", repr(price_per_hour)] if price_per_hour is not None else []
    cmd = [sys.executable, "-c", "from jobs.cli import main; main()", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "FREIGHT_LOG_LEVEL": "warning"})
    if proc.returncode != 0:
        raise FreightError(f"the profiling run of {model} failed: {proc.stderr.strip()[-500:]}")
    store = open_store(str(out), settings)
    profile = fit_profile(json.loads(store.get(COST_KEY)), read_manifest(store))
    if profile is None:
        raise FreightError(f"the profiling run of {model} measured no prefill or decode time: raise --rows")
    return profile
