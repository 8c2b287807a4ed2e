"""Throughput profiles of (model, instance type, quantization): what `freight estimate` predicts from.

A profile is fitted from a finished job's cost.json (every finalize feeds the store, and `freight
profile MODEL` runs a short synthetic job to make one):

    prefill_tokens_per_s   computed prompt tokens (prompt - cached) / prefill_seconds
    decode_tokens_per_s    completion tokens / decode_seconds; with decode_context_tokens_per_s
                           (fitted by `freight profile` over shards of different prompt lengths):
                           decode_seconds = tokens / decode_tokens_per_s + context / that
    stop_fraction          completion tokens / the rows' max_tokens (rows stop early at EOS / stop)
    stop_hazard            the per-token chance of stopping that gives that mean length, so a job
                           with another max_tokens gets its own expected length
    shard_overhead_s       (billed - load - engine busy) seconds per shard: reading, writing, committing
    load_seconds           the model load a run pays once

Stored as JSON in `Settings.profiles_path` (default `FREIGHT_CACHE_DIR/profiles.json`), one entry
per key `model|instance_type|quantization` (and `fingerprint|<folder>`: a checkpoint's content
fingerprint, jobs/model_fingerprint.py), the latest measurement replacing the previous one (a
profile follows the machine and the code as they change). Without one, DEFAULT_PROFILE
(documented, deliberately rough: confidence "default").
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from jobs.log import get_logger
from jobs.manifest import Manifest
from jobs.settings import Settings

log = get_logger(__name__)


class Profile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    prefill_tokens_per_s: float = Field(gt=0)
    decode_tokens_per_s: float = Field(gt=0)
    stop_fraction: float = Field(ge=0, le=1)
    shard_overhead_s: float = Field(ge=0)
    load_seconds: float = Field(ge=0)
    stop_hazard: float = Field(
        0.0, ge=0, lt=1, description="the chance a row stops (EOS, stop string) at each generated "
        "token, fitted from the run's mean length: a row of max_tokens M generates (1-(1-h)^M)/h"
    )
    decode_context_tokens_per_s: float | None = Field(
        None, gt=0, description="attention's share of decode: context tokens attended per second "
        "(`freight profile` fits it; None: decode time is tokens / decode_tokens_per_s alone)"
    )
    source: Literal["measured", "default"] = "measured"
    job_id: str | None = None
    measured_at: float = 0.0


# A 7-8B model on one 24 GB GPU (g5/g6 class), bf16, batched: rough public figures, for when nothing
# was measured. The estimate says "default" beside them.
DEFAULT_PROFILE = Profile(prefill_tokens_per_s=8000.0, decode_tokens_per_s=1500.0, stop_fraction=1.0,
                          shard_overhead_s=1.0, load_seconds=60.0, source="default")  # fmt: skip


def expected_tokens(max_tokens: int, hazard: float) -> float:
    """Mean generated tokens of a row allowed `max_tokens` when it stops with chance `hazard` per token."""
    if hazard <= 0.0:
        return float(max_tokens)
    return (1.0 - (1.0 - hazard) ** max_tokens) / hazard


def fit_hazard(mean_tokens: float, max_tokens: int) -> float:
    """The hazard whose expected_tokens(max_tokens) is `mean_tokens` (bisection; 0 when rows never stop)."""
    if mean_tokens >= max_tokens - 1e-9:
        return 0.0
    lo, hi = 0.0, 1.0 - 1e-12
    for _ in range(100):
        mid = (lo + hi) / 2
        if expected_tokens(max_tokens, mid) > mean_tokens:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


FINGERPRINT_PREFIX = "fingerprint|"  # a checkpoint's content fingerprint, kept beside its profiles


def profile_key(model: str, instance_type: str, quantization: str | None) -> str:
    return f"{model}|{instance_type}|{quantization or 'none'}"


def fit_profile(report: dict[str, Any], manifest: Manifest) -> Profile | None:
    """A profile from a finished job's cost report; None when it measured too little to fit one
    (no engine time, no tokens) or is not a finished run (expired)."""
    computed = report.get("prompt_tokens", 0) - report.get("cached_tokens", 0)
    completion = report.get("completion_tokens", 0)
    prefill_s, decode_s = report.get("prefill_seconds", 0.0), report.get("decode_seconds", 0.0)
    if report.get("state") not in (None, "succeeded") or computed <= 0 or completion <= 0:
        return None
    if prefill_s <= 0 or decode_s <= 0:
        return None
    rows_ok = report.get("rows", 0) - report.get("rows_failed", 0)
    per_row = manifest.spec.sampling.max_tokens
    # the stop fit needs every row to have asked the job-wide max_tokens once: per-row max_tokens or n
    # (columns, or a JSONL body's fields), n > 1 and embeddings rows are not in the report, so such
    # jobs fit the rates only and leave the stop estimate neutral
    cols = manifest.input.override_columns
    uniform = (manifest.input.format != "jsonl" and manifest.spec.sampling.n == 1
               and "max_tokens" not in cols and "n" not in cols)  # fmt: skip
    stop = min(1.0, completion / max(1, rows_ok * per_row)) if uniform else 1.0
    hazard = fit_hazard(completion / max(1, rows_ok), per_row) if uniform else 0.0
    shards = max(1, len(report.get("shards", [])))
    load = float(report.get("load_seconds", 0.0))
    overhead = max(0.0, report.get("billed_seconds", 0.0) - load - report.get("busy_seconds", 0.0)) / shards
    return Profile(prefill_tokens_per_s=computed / prefill_s, decode_tokens_per_s=completion / decode_s,
                   stop_fraction=stop, stop_hazard=hazard, shard_overhead_s=overhead, load_seconds=load,
                   job_id=report.get("job_id"), measured_at=time.time())  # fmt: skip


class ProfileStore:
    """The JSON file of profiles (see the module docstring). Writes replace the file atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def for_settings(cls, settings: Settings) -> ProfileStore:
        return cls(settings.profiles_path or settings.cache_dir / "profiles.json")

    def _all(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> Profile | None:
        raw = self._all().get(key)
        try:
            return Profile.model_validate(raw) if raw is not None else None
        except ValueError:
            return None

    def put(self, key: str, profile: Profile) -> None:
        self._put(key, profile.model_dump(mode="json"))

    def fingerprint(self, model_dir: str) -> dict[str, Any] | None:
        """The content fingerprint kept for a checkpoint folder (jobs/model_fingerprint.py), raw."""
        raw = self._all().get(FINGERPRINT_PREFIX + model_dir)
        return raw if isinstance(raw, dict) else None

    def put_fingerprint(self, model_dir: str, record: dict[str, Any]) -> None:
        self._put(FINGERPRINT_PREFIX + model_dir, record)

    def _put(self, key: str, value: Any) -> None:
        data = self._all()
        data[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".profiles-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


def record_report(report: dict[str, Any], manifest: Manifest, settings: Settings) -> Profile | None:
    """Feed a finished job's cost report to the store (never fails the job: problems are logged)."""
    try:
        profile = fit_profile(report, manifest)
        if profile is not None:
            spec = manifest.spec
            store = ProfileStore.for_settings(settings)
            key = profile_key(spec.model, spec.instance_type, spec.quantization_label)
            old = store.get(key)
            if old is not None and old.decode_context_tokens_per_s is not None:
                # a job's totals cannot separate decode's two terms: keep `freight profile`'s fit
                profile = profile.model_copy(update={"decode_tokens_per_s": old.decode_tokens_per_s,
                                                     "decode_context_tokens_per_s": old.decode_context_tokens_per_s})  # fmt: skip
            store.put(key, profile)
        return profile
    except (OSError, ValueError) as exc:
        log.warning("profile_not_recorded", job_id=manifest.job_id, error=str(exc))
        return None
