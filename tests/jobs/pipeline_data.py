"""Datasets for the job pipeline tests (imported by the test modules)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SYSTEM = "You are a careful assistant. Answer the question about the Python standard library briefly. "


def prompts_table(n: int, bad: bool = True) -> pa.Table:
    """n rows: half share a long system prefix, half are short; with `bad`, a null, an empty and an over-long prompt."""
    prompts: list[str | None] = []
    for i in range(n):
        prompts.append(SYSTEM + f"What does function number {i} do?" if i % 2 == 0 else f"def f{i}(x):")
    if bad and n >= 6:
        prompts[1] = None
        prompts[3] = ""
        prompts[5] = "word " * 5000  # longer than the demo model's context (2048 tokens)
    return pa.table({"id": [f"row-{i:04d}" for i in range(n)], "prompt": prompts})


def write_parquet(table: pa.Table, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path
