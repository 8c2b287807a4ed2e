"""A suite's dataset -> the job inputs of one eval run, frozen in the run's OUT.

The generation input has columns id, prompt (text or chat messages). The likelihood input has one
row per (question, option): id "<question id>#<option index>", prompt (the context) and
continuation (target_delimiter + option). Both are written once per run, so every model of the
suite and every later rescoring sees the same rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from jobs.datasets import fetch_input, list_input_files, read_parquet, write_result
from jobs.errors import InputError
from jobs.evals.metrics import Metric, MultipleChoice
from jobs.evals.suite import Suite

OPTION_SEPARATOR = "#"


@dataclass(frozen=True)
class SuiteData:
    """The rows of a suite: ids (strings), references, choices (or None) and the prompts."""

    # columns: id, prompt, reference, reference.<column> per metric reference_column, choices (multiple choice)
    table: pa.Table
    sha256: str  # of the dataset files' bytes, in order: reports say when the data changed

    @property
    def rows(self) -> int:
        return self.table.num_rows


def reference_key(metric: Metric) -> str:
    """Column of the rows table that holds `metric`'s references."""
    return f"reference.{metric.reference_column}" if metric.reference_column else "reference"


def _file_bytes(url: str) -> bytes:
    data = fetch_input(url)
    if data is not None:
        return data
    with open(url, "rb") as f:
        return f.read()


def load_suite_data(suite: Suite) -> SuiteData:
    """Read the whole dataset of `suite` (small: eval sets) and pick the columns the run needs."""
    fmt, files = list_input_files(suite.dataset)
    if fmt != "parquet":
        raise InputError(f"{suite.dataset}: suites read Parquet datasets")
    digest = hashlib.sha256()
    tables = []
    for url in files:
        raw = _file_bytes(url)
        digest.update(raw)
        tables.append(read_parquet(url, raw))
    table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    if table.num_rows == 0:
        raise InputError(f"{suite.dataset} has no rows")
    prompt = table.column(suite.prompt_column or suite.messages_column or "prompt")
    if suite.id_column:
        ids = pc.cast(table.column(suite.id_column), pa.string())
        if ids.null_count or len(pc.unique(ids)) != table.num_rows:
            raise InputError(
                f"{suite.dataset}: id column {suite.id_column!r} has nulls or repeated values; ids must be unique"
            )
    else:
        ids = pa.array([str(i) for i in range(table.num_rows)], pa.string())
    columns = {"id": ids, "prompt": prompt, "reference": table.column(suite.reference_column)}
    for metric in suite.metrics:
        if metric.reference_column:
            columns[reference_key(metric)] = table.column(metric.reference_column)
    choices = [m.choices_column for m in suite.metrics if isinstance(m, MultipleChoice)]
    if choices:
        columns["choices"] = table.column(choices[0])
    return SuiteData(pa.table(columns), digest.hexdigest())


def generation_input(data: SuiteData) -> bytes:
    """Parquet bytes of the generation job's input."""
    return write_result(data.table.select(["id", "prompt"]))


def likelihood_input(data: SuiteData, metric: MultipleChoice) -> bytes:
    """Parquet bytes of the scoring job's input: one row per option of every question.

    A question with no options gets no rows (scored as failed)."""
    ids, prompts, continuations = [], [], []
    for qid, prompt, options in zip(
        data.table.column("id").to_pylist(),
        data.table.column("prompt").to_pylist(),
        data.table.column("choices").to_pylist(),
        strict=True,
    ):
        for k, option in enumerate(options or []):
            ids.append(f"{qid}{OPTION_SEPARATOR}{k}")
            prompts.append(prompt)
            continuations.append(metric.continuation(str(option)))
    table = pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "prompt": pa.array(prompts, pa.string()),
            "continuation": pa.array(continuations, pa.string()),
        }
    )
    return write_result(table)
