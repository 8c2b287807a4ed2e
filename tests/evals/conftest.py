"""Fixtures for the evaluation tests: small hand-made datasets and suite files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


@pytest.fixture
def qa_dataset(tmp_path: Path) -> Path:
    """Four questions with a prompt, a reference and options."""
    path = tmp_path / "data" / "qa.parquet"
    path.parent.mkdir(parents=True)
    table = pa.table(
        {
            "qid": ["q1", "q2", "q3", "q4"],
            "prompt": ["The capital of France is", "2 + 2 =", "Water is", "The sky is"],
            "answer": ["Paris", "4", "wet", "blue"],
            "options": [["Paris", "Rome"], ["3", "4", "5"], ["dry", "wet"], ["blue", "green"]],
        }
    )
    pq.write_table(table, path)
    return path


@pytest.fixture
def write_suites(tmp_path: Path) -> Callable[[str], Path]:
    """Write a suite file next to the datasets and return its path."""

    def write(text: str, name: str = "suites.toml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


@pytest.fixture(autouse=True)
def _logging_to_real_stderr() -> Iterator[None]:
    """`freight` run by CliRunner points structlog at the runner's (then closed) stderr: reset it."""
    from jobs.log import configure_logging

    yield
    configure_logging("json", "warning")
