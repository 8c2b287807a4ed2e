"""The evals page: each suite's metrics on each model over its runs, with their intervals and the
runs that regressed.

Run records are found in the store's listing (jobs/evals/history.py's keys,
`<history>/<suite>/<model key>/<run id>.json`, wherever a suite file's `history` puts them under
the store). A run's regression flags are its report's (report.json in the run's OUT, which
compares paired rows where it could); a run whose report is not in the store is compared with the
run before it as `freight eval report` compares unpaired runs (jobs/evals/report.py).
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime
from typing import Any

from jobs.dashboard.objects import ObjectCache
from jobs.dashboard.scan import tenant_of
from jobs.errors import ObjectNotFoundError
from jobs.evals.collect import REPORT_JSON
from jobs.evals.history import RunRecord
from jobs.evals.report import MetricComparison, compare
from jobs.log import get_logger
from jobs.storage import ObjectStore

log = get_logger(__name__)


def eval_trends(store: ObjectStore, cache: ObjectCache, keys: tuple[str, ...], tenant: str | None) -> list[dict[str, Any]]:
    """One entry per history location, suite and model: its runs oldest first, each metric's score,
    interval and regression flag, and the metric names. `tenant`: only records under its prefix."""
    groups: dict[tuple[str, str, str], list[RunRecord]] = defaultdict(list)
    for key in keys:
        if tenant is not None and tenant_of(key) != tenant:
            continue
        try:
            record = cache.get(store.url_of(key), lambda key=key: RunRecord.model_validate_json(store.get(key)))
        except (ObjectNotFoundError, ValueError) as exc:  # deleted meanwhile, or not a run record
            log.warning("dashboard_eval_record_skipped", key=key, error=str(exc))
            continue
        history = key[: -len(record.key)].rstrip("/")
        groups[(history, record.suite, record.model)].append(record)
    out = []
    for (history, suite, model), records in sorted(groups.items()):
        records.sort(key=lambda r: r.run_id)
        runs, previous = [], None
        for record in records:
            flags = _reported(store, cache, record) or {m.metric: m for m in compare(record, previous).metrics}
            runs.append(_run(record, flags))
            previous = record
        names = list(dict.fromkeys(name for r in records for name in r.metrics))
        out.append({"history": history, "suite": suite, "model": model, "metrics": names, "runs": runs,
                    "regressed": any(m["regression"] for m in runs[-1]["metrics"].values())})  # fmt: skip
    return out


def _run(record: RunRecord, flags: dict[str, MetricComparison]) -> dict[str, Any]:
    metrics = {}
    for name, result in record.metrics.items():
        flag = flags.get(name)
        metrics[name] = {
            "score": result.score, "low": result.low, "high": result.high, "method": result.method,
            "delta": flag.delta if flag else None, "noise": flag.noise if flag else None,
            "noise_method": flag.noise_method if flag else None, "regression": bool(flag and flag.regression),
        }  # fmt: skip
    return {
        "run_id": record.run_id,
        "t": datetime.fromisoformat(record.started_at).timestamp(),
        "started_at": record.started_at,
        "rows": record.rows,
        "rows_failed": record.rows_failed,
        "cost_usd": record.cost_usd,
        "dataset_sha256": record.dataset_sha256,
        "fingerprint": record.model_fingerprint,
        "output": record.output,
        "metrics": metrics,
    }


def _reported(store: ObjectStore, cache: ObjectCache, record: RunRecord) -> dict[str, MetricComparison] | None:
    """The run's own report's comparisons of this suite and model, when its OUT lies in the store."""
    root = store.url.rstrip("/") + "/"
    if not record.output.startswith(root):
        return None
    key = f"{record.output[len(root) :].strip('/')}/{REPORT_JSON}"
    try:
        report = cache.get(store.url_of(key), lambda: json.loads(store.get(key)))
    except (ObjectNotFoundError, ValueError):
        return None
    for entry in report.get("entries", []):
        if entry.get("suite") == record.suite and entry.get("model") == record.model:
            return {m["metric"]: MetricComparison.model_validate(m) for m in entry.get("metrics", [])}
    return None
