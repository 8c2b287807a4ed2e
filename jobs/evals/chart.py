"""PNG chart of a suite's score over its runs on one model (matplotlib, Agg: no display needed)."""

from __future__ import annotations

import io
from datetime import datetime

from jobs.evals.history import RunRecord


def score_chart(records: list[RunRecord], title: str) -> bytes | None:
    """One line per metric with its 95% interval shaded, x = run start time; None with < 2 runs."""
    if len(records) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure  # a Figure without pyplot keeps no global state

    times = [datetime.fromisoformat(r.started_at) for r in records]
    fig = Figure(figsize=(8, 4), dpi=100)
    ax = fig.add_subplot()
    for name in dict.fromkeys(m for r in records for m in r.metrics):
        points = [(t, r.metrics[name]) for t, r in zip(times, records, strict=True) if name in r.metrics]
        xs = [t for t, _ in points]
        ax.plot(xs, [100 * m.score for _, m in points], marker="o", label=name)
        ax.fill_between(xs, [100 * m.low for _, m in points], [100 * m.high for _, m in points], alpha=0.2)
    ax.set_title(title)
    ax.set_ylabel("score % (95% CI shaded)")
    ax.set_xlabel("run start (UTC)")
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    fig.autofmt_xdate()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()
