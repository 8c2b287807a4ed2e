"""Inputs (Parquet files, folders/prefixes of them, OpenAI-Batch JSONL) and result shards.

Global row numbers count rows across the input files in the order the manifest lists them.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.batch_input import read_batch
from jobs.errors import InputError
from jobs.manifest import InputFile, InputPlan
from jobs.settings import Settings, get_settings
from jobs.storage import ObjectStore, open_store, split_url
from jobs.storage.local import LocalStore

RESULT_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("completion", pa.string()),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("cached_tokens", pa.int32(), nullable=False),
        pa.field("completion_tokens", pa.int32(), nullable=False),
        pa.field("error", pa.string()),
    ]
)
# Likelihood scoring (spec.continuation_column set) appends these two columns.
LIKELIHOOD_FIELDS = [
    pa.field("continuation_logprob", pa.float64()),
    pa.field("continuation_tokens", pa.int32()),
]
TOKEN_LOGPROB = pa.struct(
    [pa.field("token", pa.string()), pa.field("token_id", pa.int32()), pa.field("logprob", pa.float32())]
)
# A parsed tool call (OpenAI's message.tool_calls[i], its function flattened): arguments is JSON text
TOOL_CALL = pa.struct([pa.field("id", pa.string()), pa.field("type", pa.string()), pa.field("name", pa.string()),
                       pa.field("arguments", pa.string())])  # fmt: skip
# Then, in every result: the request's endpoint and what n > 1, logprobs, embeddings and JSON
# constraints add (null where the row did not ask for them). README "Result schema" documents each.
REQUEST_FIELDS = [
    pa.field("endpoint", pa.string(), nullable=False),  # /v1/chat/completions | /v1/completions | /v1/embeddings | /v1/responses
    pa.field("completions", pa.list_(pa.string())),  # n > 1: every choice's text, in index order
    pa.field("finish_reasons", pa.list_(pa.string())),  # n > 1: every choice's finish reason
    pa.field(  # logprobs asked: per choice, per generated token
        "logprobs",
        pa.list_(pa.list_(pa.struct([*TOKEN_LOGPROB, pa.field("top_logprobs", pa.list_(TOKEN_LOGPROB))]))),
    ),
    pa.field("embedding", pa.list_(pa.float32())),  # embeddings rows
    pa.field("parsed", pa.string()),  # JSON constraint, choice 0 finished "stop": the value, compact JSON
    pa.field("parsed_choices", pa.list_(pa.string())),  # n > 1 with a JSON constraint: each choice's
    pa.field("reasoning", pa.string()),  # a thinking chat row: choice 0's thinking (completion: its answer)
    pa.field("reasoning_tokens", pa.int32()),  # thinking tokens of every choice (null: the row cannot think)
    pa.field("reasoning_choices", pa.list_(pa.string())),  # n > 1: each choice's reasoning
    pa.field("tool_calls", pa.list_(TOOL_CALL)),  # a row with tools: choice 0's calls
    pa.field("tool_calls_choices", pa.list_(pa.list_(TOOL_CALL))),  # n > 1 with tools: each choice's
    # served from the result cache (docs/design/result-cache.md): "exact" | "semantic", the job and row
    # that computed the answer, and a semantic hit's cosine similarity
    pa.field("cached", pa.string()),
    pa.field("cached_from_job", pa.string()),
    pa.field("cached_from_row", pa.string()),
    pa.field("cached_similarity", pa.float32()),
    pa.field("response_fields", pa.string()),  # /v1/responses rows: the request fields the response repeats (JSON)
    pa.field("adapter", pa.string()),  # the LoRA adapter that answered (a --lora name); null: the model itself
]
# Per-row sampling columns of a Parquet input (a JSONL body's names and rules): read when present.
SAMPLING_COLUMNS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "n",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "min_tokens",
    "logit_bias",
    "reasoning_budget",
    "reasoning_effort",
    "chat_template_kwargs",
    # a messages row's function tools (worker/row_tools.py), as a chat body's fields
    "tools",
    "tool_choice",
    "parallel_tool_calls",
)
# Per-row structured-output columns (contracts/row_constraint.py; at most one per row): read only when
# the job opts in (JobSpec.row_constraints, --row-constraints), else plain data: a dataset's `choice`
# or `regex` column is as likely to be a quiz answer as a constraint.
CONSTRAINT_COLUMNS = ("response_format", "json_schema", "regex", "choice")


def result_schema(likelihood: bool, id_type: str = "string") -> pa.Schema:
    """The result columns; `id` is int64 when the input's ids are integers (InputPlan.id_type)."""
    fields = list(RESULT_SCHEMA) + (LIKELIHOOD_FIELDS if likelihood else []) + REQUEST_FIELDS
    if id_type == "int64":
        fields[0] = pa.field("id", pa.int64(), nullable=False)
    return pa.schema(fields)


def _open_input(url: str, settings: Settings | None) -> tuple[ObjectStore, str]:
    parent, name = split_url(url)
    return open_store(parent or ".", settings), name


def list_input_files(
    url: str, settings: Settings | None = None, exclude: str | None = None
) -> tuple[str, list[str]]:
    """(format, file urls) for a file, folder or prefix; nothing is downloaded (see fetch_input).
    `exclude`: a job's OUT, whose files are never its input (an OUT inside the input folder: its
    result shards would be read as input by a rerun).

    Raises InputError when nothing readable is there.
    """
    fmt = "jsonl" if url.endswith((".jsonl", ".jsonl.gz")) else "parquet"
    store, name = _open_input(url, settings)
    local = store.local_path(name) if name else None
    if local is not None:
        if local.is_file():
            return fmt, [str(local)]
        if local.is_dir():
            folder = open_store(str(local), settings)
            skip = _inside(folder, exclude, settings)
            keys = [k for k in folder.list() if k.endswith(".parquet") and not _hidden(k) and not skip(k)]
            if not keys:
                raise InputError(f"input folder {url} holds no .parquet files")
            return "parquet", [folder.url_of(k) for k in keys]
        raise InputError(f"input {url} does not exist")
    if name and store.exists(name):
        return fmt, [url]
    folder = open_store(url, settings)
    skip = _inside(folder, exclude, settings)
    keys = [k for k in folder.list() if k.endswith(".parquet") and not _hidden(k) and not skip(k)]
    if not keys:
        raise InputError(f"input {url} does not exist (no such object and no .parquet files under it)")
    return "parquet", [folder.url_of(k) for k in keys]


def _inside(folder: ObjectStore, out: str | None, settings: Settings | None) -> Callable[[str], bool]:
    """Whether a key of `folder` lies under `out` (a local folder or an s3:// prefix)."""
    if out is None:
        return lambda key: False
    out_store = open_store(out, settings)
    if isinstance(out_store, LocalStore) and isinstance(folder, LocalStore):
        out_path, here = out_store.root.resolve(), folder.root.resolve()
        return lambda key: (here / key).resolve().is_relative_to(out_path)
    prefix = out_store.url.rstrip("/") + "/"
    return lambda key: folder.url_of(key).startswith(prefix)


def fetch_input(url: str, settings: Settings | None = None) -> bytes | None:
    """An input file's bytes from object storage, or None for a local file (read in place).
    Callers hold one file at a time: a dataset may be far larger than memory."""
    store, name = _open_input(url, settings)
    return None if store.local_path(name) is not None else store.get(name)


def _hidden(key: str) -> bool:
    return any(part.startswith((".", "_")) for part in key.split("/"))


def _source(url: str, data: bytes | None) -> Any:
    return pa.BufferReader(data) if data is not None else url


def read_parquet(url: str, data: bytes | None, columns: list[str] | None = None) -> pa.Table:
    """One Parquet file as a table; InputError if it is not Parquet."""
    try:
        return pq.read_table(_source(url, data), columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{url} is not a readable Parquet file ({_first_line(exc)})") from exc


def parquet_schema(url: str, data: bytes | None) -> tuple[pa.Schema, int]:
    try:
        meta = pq.ParquetFile(_source(url, data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{url} is not a readable Parquet file ({_first_line(exc)})") from exc
    return meta.schema_arrow, meta.metadata.num_rows


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class InputReader:
    """Reads a shard's rows. Keeps up to `cache_files` decoded input files per process."""

    def __init__(self, plan: InputPlan, settings: Settings | None = None, cache_files: int = 4):
        self.plan = plan
        self.settings = settings
        self._cache: OrderedDict[str, pa.Table] = OrderedDict()
        self._cache_files = cache_files
        self.columns = needed_columns(plan)

    def _file_table(self, f: InputFile) -> pa.Table:
        table = self._cache.get(f.url)
        if table is None:
            if self.plan.format == "jsonl" and self.plan.requests is not None:  # parsed once, at submit
                table = read_parquet(self.plan.requests, fetch_input(self.plan.requests, self.settings))
            elif self.plan.format == "jsonl":
                store, name = _open_input(f.url, self.settings)
                limit = (self.settings or get_settings()).max_batch_file_bytes
                table = read_batch(f.url, store.get(name), limit).table
            else:
                table = read_parquet(f.url, fetch_input(f.url, self.settings), columns=self.columns)
            if table.num_rows != f.rows:
                raise InputError(
                    f"{f.url} changed since the job was planned ({table.num_rows} rows, was {f.rows})"
                )
            self._cache[f.url] = table
            while len(self._cache) > self._cache_files:
                self._cache.popitem(last=False)
        self._cache.move_to_end(f.url)
        return table

    def read(self, ranges: tuple[tuple[int, int], ...]) -> pa.Table:
        """Rows of the given global half-open ranges, in order, with the needed columns."""
        pieces: list[pa.Table] = []
        offset = 0
        for f in self.plan.files:
            lo, hi = offset, offset + f.rows
            offset = hi
            parts = [(max(s, lo) - lo, min(e, hi) - lo) for s, e in ranges if s < hi and e > lo]
            if not parts:
                continue
            table = self._file_table(f)
            pieces.extend(table.slice(s, e - s) for s, e in parts)
        # files may differ in lossless ways (string / large_string): the planner checked they unify
        return (
            pa.concat_tables(pieces, promote_options="permissive").combine_chunks()
            if pieces
            else pa.table({})
        )


def needed_columns(plan: InputPlan) -> list[str]:
    cols = [plan.prompt_column, *plan.override_columns]
    cols += [c for c in (plan.id_column, plan.continuation_column) if c]
    return cols


def write_result(table: pa.Table) -> bytes:
    """A result shard as Parquet bytes (zstd)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def read_result(data: bytes) -> pa.Table:
    return pq.read_table(pa.BufferReader(data))


def read_result_schema(data: bytes) -> pa.Schema:
    """The schema (with metadata) of a result shard, without reading its rows."""
    return pq.read_schema(pa.BufferReader(data))


def read_results(store: ObjectStore, head: int | None = None) -> pa.Table:
    """The committed result shards as one table, in shard order (the first `head` rows if given)."""
    tables: list[pa.Table] = []
    count = 0
    for key in store.list("shards/"):
        if not key.endswith(".parquet"):
            continue
        table = read_result(store.get(key)).replace_schema_metadata(None)
        tables.append(table)
        count += table.num_rows
        if head is not None and count >= head:
            break
    if not tables:
        return result_schema(likelihood=False).empty_table()
    table = pa.concat_tables(tables, promote_options="default")
    return table.slice(0, head) if head is not None else table


def write_jsonl(table: pa.Table) -> bytes:
    """Rows as JSON lines (UTF-8)."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in table.to_pylist()).encode()
