"""`freight cache stats | prune`: what a result cache holds, and keeping it small
(docs/design/result-cache.md)."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime

import typer
from rich.console import Console
from rich.table import Table

from freight_cli.common import fail
from freight_cli.job_options import absolute
from freight_cli.quantities import parse_size, parse_ttl
from jobs.errors import FreightError
from jobs.settings import get_settings

app = typer.Typer(help="The result cache of `--result-cache` (FREIGHT_RESULT_CACHE).", no_args_is_help=True)

CacheArg = typer.Argument(None, metavar="CACHE", help="the cache folder or s3://bucket/prefix (default: "
                          "FREIGHT_RESULT_CACHE)")  # fmt: skip


def _open(url: str | None):  # type: ignore[no-untyped-def]
    from jobs.result_cache.options import cache_off
    from jobs.result_cache.store import ResultCache

    url = url or get_settings().result_cache
    if not url or cache_off(url):
        raise FreightError("give the cache (CACHE), or set FREIGHT_RESULT_CACHE (it is unset or off)")
    return ResultCache.open(absolute(url), get_settings(), create=False)


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")


@app.command("stats")
def stats(
    cache: str | None = CacheArg,
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Per model and numerics (a space): cached answers, segments, bytes, oldest and newest."""
    from jobs.result_cache.retention import cache_stats

    try:
        opened = _open(cache)
        spaces = cache_stats(opened)
    except (FreightError, ValueError) as exc:
        raise fail(str(exc)) from None
    if as_json:
        sys.stdout.write(json.dumps({"cache": opened.url, "spaces": [vars(s) for s in spaces]}) + "\n")
        return
    t = Table(title=f"result cache {opened.url}", title_justify="left")
    for col in ("model", "quantization", "numerics", "answers (semantic)", "segments", "bytes", "oldest", "newest"):
        t.add_column(col, justify="left" if col in ("model", "numerics") else "right")
    for s in spaces:
        d = s.describe
        t.add_row(str(d.get("model", s.space)), str(d.get("quantization") or "-"), str(d.get("numerics", "-")),
                  f"{s.entries:,} ({s.semantic_entries:,})", f"{s.segments:,}", f"{s.bytes:,}", _when(s.oldest),
                  _when(s.newest))  # fmt: skip
    Console(highlight=False).print(t)
    total = sum(s.entries for s in spaces)
    Console(stderr=True, highlight=False).print(
        f"{total:,} answers, {sum(s.bytes for s in spaces):,} bytes in {len(spaces)} spaces", soft_wrap=True
    )


@app.command("prune")
def prune_cmd(
    cache: str | None = CacheArg,
    older_than: str | None = typer.Option(
        None, metavar="AGE", help="remove answers computed longer ago than AGE (30d, 12h, 90m)"
    ),
    max_bytes: str | None = typer.Option(
        None, metavar="SIZE", help="then remove the oldest until the cache holds at most SIZE (10GB, 500MiB)"
    ),
) -> None:
    """Remove old answers, merge each space's index into one object (fewer reads for the next job),
    and remove segments no index names (a write stopped half way)."""
    from jobs.result_cache.retention import prune

    try:
        if older_than is None and max_bytes is None:
            raise FreightError("say what to remove: --older-than AGE and / or --max-bytes SIZE")
        age = parse_ttl(older_than, "--older-than") if older_than is not None else None
        size = parse_size(max_bytes, "--max-bytes") if max_bytes is not None else None
        result = prune(_open(cache), older_than=age, max_bytes=size, now=time.time())
    except (FreightError, ValueError) as exc:
        raise fail(str(exc)) from None
    Console(stderr=True, highlight=False).print(
        f"removed {result.entries_removed:,} answers in {result.segments_removed:,} segments "
        f"({result.bytes_removed:,} bytes); merged {result.index_objects_merged:,} index objects",
        soft_wrap=True,
    )


def register(main: typer.Typer) -> None:
    """Add the `cache` group to `main`."""
    main.add_typer(app, name="cache")
