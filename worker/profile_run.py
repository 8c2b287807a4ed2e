"""`freight profile`'s measurement: a short synthetic job, fitted into a Profile.

The job runs as `freight run` in a fresh process, so its cost report holds what a real run pays
(the torch import and the model load included), after a 4-row warm-up run in another process that
builds the CPU kernels and warms the page cache (one-time costs a later run does not pay). The dataset mixes
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
from jobs.model_cache import resolve_model
from jobs.profile_store import Profile, fit_profile
from jobs.settings import Settings
from jobs.storage import open_store
from worker.engine.tokenizer import Tokenizer
from worker.estimate_tokens import count_tokens

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
         "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango"]  # fmt: skip


def synthetic_prompts(rows: int, seed: int = 0) -> list[str]:
    """Four quarters of rising prompt length (4-8, 20-40, 60-100, 150-250 words): one shard each, so
    the shards' decode times separate per-token work from attention over the context."""
    rng = random.Random(seed)
    spans = ((4, 8), (20, 40), (60, 100), (150, 250))
    quarter = max(1, rows // 4)
    return [f"{i} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(*spans[min(i // quarter, 3)])))
            for i in range(rows)]  # fmt: skip


def _freight_run(args: list[str], model: str) -> None:
    cmd = [sys.executable, "-c", "from freight_cli import main; main()", "run", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "FREIGHT_LOG_LEVEL": "warning"})
    if proc.returncode != 0:
        said = proc.stderr.strip()[-500:].removeprefix("error: ")  # the child's own one-line error
        raise FreightError(f"the profiling run of {model} failed: {said}")


def fit_decode(shards: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """Least squares of decode_seconds = tokens / r_tok + context / r_ctx over (tokens, context,
    seconds) per shard; (r_tok, r_ctx), or None when the shards do not separate the two."""
    gg = sum(g * g for g, _, _ in shards)
    gc = sum(g * c for g, c, _ in shards)
    cc = sum(c * c for _, c, _ in shards)
    gd = sum(g * d for g, _, d in shards)
    cd = sum(c * d for _, c, d in shards)
    det = gg * cc - gc * gc
    if det <= 1e-9 * gg * cc:
        return None
    a, b = (gd * cc - cd * gc) / det, (cd * gg - gd * gc) / det
    return (1.0 / a, 1.0 / b) if a > 0 and b > 0 else None


def run_profile(model: str, workdir: Path, settings: Settings, *, instance_type: str = "cpu-local",
                quantization: str | None = None, quant_group: int | None = None, rows: int = 64,
                max_tokens: int = 64, price_per_hour: float | None = None) -> Profile:  # fmt: skip
    """Run the synthetic job on this machine and fit its cost report (FreightError if it cannot)."""
    data = workdir / "profile.parquet"
    pq.write_table(pa.table({"prompt": synthetic_prompts(rows)}), data)
    common = ["--model", model, "--instance-type", instance_type]
    common += ["--quantization", quantization] if quantization else []
    common += ["--quant-group", str(quant_group)] if quant_group is not None else []
    common += ["--price-per-hour", repr(price_per_hour)] if price_per_hour is not None else []
    # a warm-up run first: kernels built, weights in the page cache (one-time costs a later run does
    # not pay), in its own process, so the measured run shares the machine with no loaded engine
    warm = workdir / "warm.parquet"
    pq.write_table(pa.table({"prompt": synthetic_prompts(4)}), warm)
    _freight_run([str(warm), *common, "--output", str(workdir / "warm-out"), "--max-tokens", "1"], model)
    out = workdir / "out"
    _freight_run([str(data), *common, "--output", str(out), "--max-tokens", str(max_tokens),
                  "--shard-rows", str(max(1, rows // 4))], model)  # fmt: skip
    store = open_store(str(out), settings)
    report, manifest = json.loads(store.get(COST_KEY)), read_manifest(store)
    profile = fit_profile(report, manifest)
    if profile is None:
        raise FreightError(f"the profiling run of {model} measured no prefill or decode time: raise --rows")
    counts = count_tokens(manifest, Tokenizer(Path(resolve_model(model, settings))), settings,
                          stop_hazard=profile.stop_hazard)  # fmt: skip
    by_shard = {int(s["shard"]): s for s in report["shards"]}
    points = [(g, c, float(by_shard[i]["decode_seconds"])) for i, (g, c) in enumerate(counts.shard_decode)
              if i in by_shard and g > 0]  # fmt: skip
    rates = fit_decode(points)
    if rates is not None:
        profile = profile.model_copy(update={"decode_tokens_per_s": rates[0], "decode_context_tokens_per_s": rates[1]})
    return profile
