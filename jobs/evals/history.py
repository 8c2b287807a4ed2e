"""Run history in object storage: one JSON record per (suite, model, run), never rewritten.

Key: `<suite>/<entry key>/<run_id>.json` under the suite file's `history` location. run ids start
with a UTC timestamp, so the keys of one suite and model sort oldest first.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from jobs.storage import ObjectStore

RECORD_VERSION = 1


def model_key(model: str) -> str:
    """A short, readable, unique folder name for a model path or URL."""
    tail = re.sub(r"[^A-Za-z0-9_.\-]+", "-", model.rstrip("/").rsplit("/", 1)[-1]).strip("-.") or "model"
    return f"{tail[:40]}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


def entry_key(model: str, adapter: str | None = None) -> str:
    """The folder of a model's results and history, or of one LoRA adapter of it (a suite's
    `adapters` name): "<model key>+<adapter key>", so each adapter keeps its own history."""
    return model_key(model) if adapter is None else f"{model_key(model)}+{model_key(adapter)}"


class MetricResult(BaseModel):
    """Score of one metric column and its interval (jobs/evals/intervals.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    score: float
    low: float
    high: float
    confidence: float
    method: str = "bootstrap"  # wilson | bootstrap | wilson-fallback (records before: bootstrap)


class RunRecord(BaseModel):
    """What one run of a suite on a model scored."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: int = RECORD_VERSION
    suite: str
    model: str
    run_id: str
    started_at: str  # ISO 8601, UTC
    finished_at: str
    output: str  # the run's OUT
    dataset: str
    dataset_sha256: str
    sampling: dict[str, Any]
    rows: int
    rows_failed: int
    cost_usd: float
    metrics: dict[str, MetricResult]
    # rows of the suite's jobs (generation, likelihood options), and of those the rows whose answers
    # were reused: from the result cache, or an equal row of the same job
    job_rows: int = 0
    job_rows_reused: int = 0
    # the checkpoint's content fingerprint the suite's jobs ran (jobs/model_fingerprint.py: their shard
    # records carry it when the jobs used a result cache, as suites do by default); None: not known
    model_fingerprint: str | None = None
    adapter: str | None = None  # the LoRA adapter of `model` that ran the suite; None: the model itself

    @property
    def key(self) -> str:
        return f"{self.suite}/{entry_key(self.model, self.adapter)}/{self.run_id}.json"


class History:
    """The run records under one history location."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def record(self, record: RunRecord) -> bool:
        """Store `record` unless this run already has one; True if this call wrote it."""
        data = record.model_dump_json(indent=2).encode()  # metrics keep the suite's order
        return self.store.put_if_absent(record.key, data)

    def runs(self, suite: str, model: str, adapter: str | None = None) -> list[RunRecord]:
        """Every record of `suite` on `model` (or its LoRA `adapter`), oldest first."""
        prefix = f"{suite}/{entry_key(model, adapter)}/"
        keys = [k for k in self.store.list(prefix) if k.endswith(".json")]
        return [RunRecord.model_validate_json(self.store.get(k)) for k in keys]

    def previous(self, record: RunRecord, runs: list[RunRecord] | None = None) -> RunRecord | None:
        """The latest record of the same suite and model before `record`'s run (`runs`: that
        suite and model's records when the caller has them already, saving a second listing)."""
        runs = self.runs(record.suite, record.model, record.adapter) if runs is None else runs
        earlier = [r for r in runs if r.run_id < record.run_id]
        return earlier[-1] if earlier else None
