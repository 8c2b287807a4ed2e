"""A suite's dataset -> the job inputs of one eval run, frozen in the run's OUT.

The generation input has columns id, prompt (text or chat messages). The likelihood input has one
row per (question, option): id "<question id>#<option index>", prompt (the context) and
continuation (target_delimiter + option). Both are written once per run, so every model of the
suite and every later rescoring sees the same rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from jobs.datasets import fetch_input, list_input_files, read_parquet, write_result
from jobs.errors import InputError
from jobs.evals.metrics import Metric, MultipleChoice
from jobs.evals.suite import Suite

OPTION_SEPARATOR = "#"
ADAPTER_SEPARATOR = "@"  # a job row of an adapter: id "<row id>@<adapter>" (the model's own rows: "<row id>")


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


def per_adapter(table: pa.Table, adapters: Sequence[str]) -> pa.Table:
    """`table` (an id column first) once for the model and once per adapter, with the `adapter`
    column a job with --lora reads: ids "<id>" (null adapter) and "<id>@<adapter>". Without adapters,
    `table` itself."""
    if not adapters:
        return table
    parts = []
    for name in (None, *adapters):
        ids = table.column("id") if name is None else pc.binary_join_element_wise(
            table.column("id"), pa.scalar(f"{ADAPTER_SEPARATOR}{name}"), "")  # fmt: skip
        part = table.set_column(0, "id", ids)
        parts.append(part.append_column("adapter", pa.array([name] * table.num_rows, pa.string())))
    return pa.concat_tables(parts)


def of_adapter(results: pa.Table | None, adapter: str | None) -> pa.Table | None:
    """The rows of a job's `results` that `adapter` answered (None: the model itself), ids back as
    the suite's ("<id>@<adapter>" -> "<id>"). A job without adapters: `results` itself."""
    if results is None or "adapter" not in results.column_names:
        return results
    column = results.column("adapter")
    mine = results.filter(pc.is_null(column) if adapter is None else pc.equal(column, adapter))
    if adapter is None:
        return mine
    suffix = len(ADAPTER_SEPARATOR) + len(adapter)
    ids = pa.array([i[:-suffix] for i in mine.column("id").to_pylist()], pa.string())
    return mine.set_column(mine.column_names.index("id"), "id", ids)


def generation_input(data: SuiteData, adapters: Sequence[str] = ()) -> bytes:
    """Parquet bytes of the generation job's input (every row once per adapter too)."""
    return write_result(per_adapter(data.table.select(["id", "prompt"]), adapters))


def likelihood_input(data: SuiteData, metric: MultipleChoice, adapters: Sequence[str] = ()) -> bytes:
    """Parquet bytes of the scoring job's input: one row per option of every question (each once per
    adapter too).

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
    return write_result(per_adapter(table, adapters))
