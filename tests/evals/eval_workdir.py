"""The folder an end-to-end eval test works in: the demo model at model/, a dataset, and a suite
file whose history goes to history/; and `freight` run in the test process."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from freight_cli import app


def suite_text(name: str, dataset: str, settings: str, *, output: str | None = None) -> str:
    """A suite file that keeps its history in history/ (and its scheduled runs in OUTPUT) with one
    suite NAME over DATASET scoring the model at model/ against the `answer` column; SETTINGS are
    the suite's further lines."""
    head = 'history = "history"\n' + (f'output = "{output}"\n' if output else "")
    suite = (
        f'[[suite]]\nname = "{name}"\ndataset = "{dataset}"\n'
        'models = ["model"]\nreference_column = "answer"\n'
    )
    return f"{head}\n{suite}{settings}"


def make_workdir(root: Path, suites: str, dataset: str, table: pa.Table, *, seed: int = 0) -> Path:
    """ROOT with the demo llama checkpoint of SEED at model/, TABLE at DATASET and SUITES in
    suites.toml; returns ROOT."""
    from worker.demo_model import make_demo_model  # torch loads when a test runs, not at collection

    make_demo_model(root / "model", "llama", seed=seed)
    path = root / dataset
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    (root / "suites.toml").write_text(suites)
    return root


def freight(*args: str) -> tuple[int, str]:
    """(exit code, output) of `freight ARGS` in this process: its stdout, and after a failing exit
    its stderr too (errors and log lines go there; a report compares equal only without them)."""
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout if result.exit_code == 0 else result.stdout + result.stderr
