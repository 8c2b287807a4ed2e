"""Rich tables a person reads at a glance: the cost report, the job status, the first results."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from rich.table import Table

from jobs.status import JobStatus


def _usd(v: float | None) -> str:
    if v is None:
        return "-"
    if v == 0 or v >= 0.01:
        return f"${v:,.4f}"
    return f"${v:.6f}" if v >= 1e-6 else f"${v:.2e}"


def _num(v: float | int | None, digits: int = 1) -> str:
    if v is None:
        return "-"
    return f"{v:,}" if isinstance(v, int) else f"{v:,.{digits}f}"


def cost_table(report: dict[str, Any], provisional: bool = False) -> Table:
    title = f"freight job {report['job_id']}" + (" (so far: not finalized)" if provisional else "")
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    rows = [
        ("rows (failed)", f"{report['rows']:,} ({report['rows_failed']:,})"),
        ("prompt tokens (cached)", f"{report['prompt_tokens']:,} ({report['cached_tokens']:,})"),
        ("completion tokens", f"{report['completion_tokens']:,}"),
        ("prefix cache hit rate", f"{report['cache_hit_rate']:.1%}"),
        ("tokens / s (engine busy)", _num(report["tokens_per_second"])),
        (
            "busy / billed / wall s",
            f"{report['busy_seconds']:.1f} / {report['billed_seconds']:.1f} / {report['wall_seconds']:.1f}",
        ),
        (  # cost.json written before the split lacks these keys
            "engine s: prefill / decode",
            f"{report.get('prefill_seconds', 0.0):.1f} / {report.get('decode_seconds', 0.0):.1f}",
        ),
        ("instance (market)", f"{report['instance_type']} ({report['market']})"),
        ("price / hour", _usd(report["price_per_hour"])),
        ("cost", _usd(report["cost_usd"])),
        ("$ / 1M input tokens", _usd(report["usd_per_million_input_tokens"])),
        ("$ / 1M output tokens", _usd(report["usd_per_million_output_tokens"])),
        ("on-demand cost", _usd(report["on_demand_cost_usd"])),
        ("wasted (interruptions)", _usd(report["wasted_cost_usd"])),
        ("shards", f"{len(report['shards']):,}"),
    ]
    if report.get("constrained_rows"):  # structured output: the rows and the mask filling time
        rows.insert(
            7, ("constrained rows (mask s)", f"{report['constrained_rows']:,} ({report.get('mask_seconds', 0.0):.2f})")
        )
    if report.get("deduplicated_rows"):  # duplicate rows computed once: the copies and what they saved
        rows.insert(
            len(rows) - 1,
            ("deduplicated rows (tokens, saved)", f"{report['deduplicated_rows']:,} ({report['deduplicated_tokens']:,}, "
             f"{_usd(report['deduplicated_usd_saved'])})"),
        )  # fmt: skip
    if "state" in report:  # cost.json from before the key: no line
        state = report["state"]
        if report.get("shards_missing"):
            state += f" ({report['shards_missing']:,} shards never ran)"
        rows.insert(0, ("state", state))
    for what, value in rows:
        t.add_row(what, value)
    return t


def status_table(status: JobStatus) -> Table:
    t = Table(title=f"freight job {status.job_id}", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    t.add_row("state", status.state)
    t.add_row("shards committed / total", f"{status.shards_committed:,} / {status.shards_total:,}")
    t.add_row("rows done / total", f"{status.rows_done:,} / {status.rows_total:,}")
    t.add_row("rows failed", f"{status.rows_failed:,}")
    t.add_row("uncommitted attempts", f"{status.interrupted_attempts:,}")
    t.add_row("output", status.output)
    return t


HEADERS = {
    "finish_reason": "finish",
    "prompt_tokens": "prompt tok",
    "cached_tokens": "cached tok",
    "completion_tokens": "compl tok",
    "continuation_logprob": "cont logprob",
    "continuation_tokens": "cont tok",
}


def results_table(table: pa.Table, width: int = 60) -> Table:
    """One line per row; the completion (newlines shown as \\n) last, cut to fit the terminal."""
    rows = table.to_pylist()
    # no all-empty column (error, embedding, ...); the completion stays unless rows are embeddings
    shown = [c for c in table.column_names if table.column(c).null_count < table.num_rows]
    embeddings = "embedding" in shown
    last = "embedding" if embeddings else "completion"  # the long column, last, cut to fit
    names = [c for c in shown if c not in ("completion", "embedding")]
    names += [last] if last in table.column_names else []
    cells = [[_cell(r[c], width) for c in names] for r in rows]
    t = Table(title=f"first {table.num_rows} results", title_justify="left")
    for k, name in enumerate(names):
        header = HEADERS.get(name, name)
        if name == last:
            t.add_column(header, no_wrap=True, overflow="ellipsis", min_width=12, ratio=1)
            continue
        fit = min(max([len(header)] + [len(c[k]) for c in cells]), 24)
        t.add_column(
            header,
            no_wrap=True,
            overflow="ellipsis",
            min_width=fit,
            justify="right" if name.endswith(("tokens", "logprob")) else "left",
        )
    for c in cells:
        t.add_row(*c)
    return t


def _cell(v: Any, width: int) -> str:
    if v is None:
        return "-"
    if isinstance(v, list) and v and isinstance(v[0], float):  # an embedding: its first values and size
        return f"({len(v)}) [" + ", ".join(f"{x:.4f}" for x in v[:8]) + (", ...]" if len(v) > 8 else "]")
    s = repr(v)[1:-1] if isinstance(v, str) else (f"{v:.3f}" if isinstance(v, float) else str(v))
    return s if len(s) <= width else s[: width - 1] + "…"
