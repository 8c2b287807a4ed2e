"""The pages' number and time formats, as Jinja2 filters (static/format.js formats the same way)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import jinja2


def usd(value: float | None) -> str:
    """Dollars with the digits small costs need: $0.000123, $1.23, $1,234.56."""
    if value is None or not math.isfinite(value):
        return "–"
    if value == 0:
        return "$0"
    return f"${value:,.2f}" if abs(value) >= 1 else f"${value:.6f}".rstrip("0")


def num(value: float | None, digits: int = 0) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:,.{digits}f}"


def pct(value: float | None, digits: int = 1) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{100 * value:.{digits}f}%"


def duration(seconds: float | None) -> str:
    """1h 02m, 3m 05s, 42s."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


def utc(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def short_model(model: str) -> str:
    """A checkpoint path's last part (the whole name is in the title)."""
    return model.rstrip("/").rsplit("/", 1)[-1] or model


def install(env: jinja2.Environment) -> None:
    env.filters.update(usd=usd, num=num, pct=pct, duration=duration, utc=utc, short_model=short_model)
