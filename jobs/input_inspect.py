"""The input check of planning: files, columns, column types and ids, before anything is written.

A folder's files must hold the same columns, and each column the job reads must have one type across
the files, up to what Arrow promotes losslessly (string with large_string, which pandas 3 writes;
narrower with wider integers). Ids (the id column, or JSONL's custom_id) must be present on every
row and unique; string ids stay strings and integer ids stay integers in the results.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from jobs import datasets
from jobs.batch_input import read_batch
from jobs.errors import InputError
from jobs.manifest import InputFile, InputPlan
from jobs.row_columns import (
    check_override_types,
    is_list,
    is_string,
    note_row_sampling,
    override_columns,
    warn_unread_constraints,
)
from jobs.settings import Settings, get_settings
from jobs.spec import JobSpec

SHOW = 5  # offending values named in a message, at most


def inspect_input(
    spec: JobSpec, settings: Settings | None = None
) -> tuple[InputPlan, pa.ChunkedArray, pa.Table | None]:
    """Check the input's files and columns; return its plan, the prompt column (for grouping) and,
    for an OpenAI-Batch file, its parsed requests (jobs/batch_input.py BATCH_COLUMNS)."""
    fmt, urls = datasets.list_input_files(spec.input, settings, exclude=spec.output)
    if fmt == "jsonl":
        if spec.task == "embed":
            raise InputError(
                "OpenAI-Batch JSONL input chooses each line's endpoint by its url (/v1/embeddings for "
                "embeddings): drop --task embed"
            )
        return _inspect_batch(spec, urls, settings)
    id_column = spec.id_column
    files, schema, prompt_column, parts = _inspect_parquet(spec, urls, settings)
    names = schema.names
    kind = _prompt_kind(schema.field(prompt_column))
    if spec.task == "embed" and kind == "messages":
        raise InputError(
            f"--task embed embeds text, but prompt column '{prompt_column}' holds chat messages: give "
            "a column of strings (--prompt-column)"
        )
    if spec.continuation_column and not is_string(schema.field(spec.continuation_column).type):
        raise InputError(
            f"continuation column '{spec.continuation_column}' has type "
            f"{schema.field(spec.continuation_column).type}; expected string"
        )
    overrides = override_columns(spec, names)
    check_override_types(schema, overrides)
    total = sum(f.rows for f in files)
    if total == 0:
        raise InputError(f"input {spec.input} is empty: 0 rows")
    id_type = "string"
    if id_column is not None:
        ids = pa.chunked_array(
            [c for t in parts for c in t.column(id_column).chunks], type=schema.field(id_column).type
        )
        id_type = _check_ids(ids, id_column, spec.input)
    input_plan = InputPlan(
        format="parquet",
        files=tuple(files),
        rows=total,
        prompt_column=prompt_column,
        prompt_kind=kind,
        id_column=id_column,
        id_type=id_type,
        continuation_column=spec.continuation_column,
        override_columns=overrides,
    )
    prompts = pa.chunked_array(
        [c for t in parts for c in t.column(prompt_column).chunks], type=schema.field(prompt_column).type
    )
    if kind == "messages" and not is_string(prompts.type):
        prompts = pa.chunked_array([pa.array([str(v) for v in prompts.to_pylist()], pa.string())])
    warn_unread_constraints(spec, names)
    note_row_sampling(overrides)
    return input_plan, prompts, None


def _inspect_batch(
    spec: JobSpec, urls: list[str], settings: Settings | None
) -> tuple[InputPlan, pa.ChunkedArray, pa.Table]:
    """An OpenAI-Batch file: whole-file checks (jobs/batch_input.py); its rows grouped by prompt text."""
    if spec.id_column is not None or spec.prompt_column != "prompt" or spec.continuation_column:
        raise InputError(
            "OpenAI-Batch JSONL input takes its ids from custom_id and its requests from each line's "
            "body: drop --id-column / --prompt-column / --continuation-column"
        )
    if spec.row_constraints:
        raise InputError(
            "--row-constraints reads Parquet columns; an OpenAI-Batch file's bodies carry their own "
            "response_format / guided_* fields, always read: drop --row-constraints"
        )
    (url,) = urls
    data = datasets.fetch_input(url, settings)
    if data is None:
        data = Path(url).read_bytes()
    batch = read_batch(url, data, (settings or get_settings()).max_batch_file_bytes)
    plan = InputPlan(
        format="jsonl",
        files=(InputFile(url=url, rows=batch.table.num_rows, size=len(data)),),
        rows=batch.table.num_rows,
        prompt_column="body",
        prompt_kind="request",
        id_column="custom_id",
        id_type="string",
    )
    return plan, pa.chunked_array([pa.array(batch.prompt_texts, pa.string())]), batch.table


def _inspect_parquet(
    spec: JobSpec, urls: list[str], settings: Settings | None
) -> tuple[list[InputFile], pa.Schema, str, list[pa.Table]]:
    """(files, the files' unified schema, the prompt column, each file's read columns cast to it)."""
    files: list[InputFile] = []
    schemas: list[pa.Schema] = []
    parts: list[pa.Table] = []
    read: list[str] = []
    prompt_column = spec.prompt_column
    for url in urls:  # one file's bytes in memory at a time
        data = datasets.fetch_input(url, settings)
        file_schema, rows = datasets.parquet_schema(url, data)
        if not schemas:
            names = file_schema.names
            if prompt_column not in names and prompt_column == "prompt" and "messages" in names:
                prompt_column = "messages"
            for label, column in (
                ("prompt", prompt_column),
                ("id", spec.id_column),
                ("continuation", spec.continuation_column),
            ):
                if column is not None and column not in names:
                    raise InputError(
                        f"{label} column '{column}' not found in {spec.input}; columns: {', '.join(names)}"
                    )
            read = list(
                dict.fromkeys(c for c in (prompt_column, spec.id_column, spec.continuation_column) if c)
            )
        elif set(file_schema.names) != set(schemas[0].names):
            raise InputError(
                f"{url} has columns {sorted(file_schema.names)}, unlike {urls[0]} "
                f"({sorted(schemas[0].names)}): every file of the dataset needs the same columns"
            )
        schemas.append(file_schema)
        size = len(data) if data is not None else Path(url).stat().st_size
        files.append(InputFile(url=url, rows=rows, size=size))
        parts.append(datasets.read_parquet(url, data, columns=read).select(read))
    first = schemas[0]
    used = dict.fromkeys([*read, *override_columns(spec, first.names)])
    unified = {c: _unified_type(c, urls, schemas) for c in used}
    schema = pa.schema([pa.field(n, unified.get(n, first.field(n).type)) for n in first.names])
    target = pa.schema([schema.field(c) for c in read])
    return files, schema, prompt_column, [t.cast(target) for t in parts]


def _unified_type(column: str, urls: list[str], schemas: list[pa.Schema]) -> pa.DataType:
    """The one type of `column` across the files (Arrow's lossless promotion), or InputError naming
    the first file whose type cannot join the others'."""
    merged = pa.schema([schemas[0].field(column)])
    for url, schema in zip(urls[1:], schemas[1:], strict=True):
        mine = schema.field(column).type
        try:
            merged = pa.unify_schemas(
                [merged, pa.schema([pa.field(column, mine)])], promote_options="permissive"
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            raise InputError(
                f"{url}: column '{column}' has type {mine}, but {urls[0]} has {schemas[0].field(column).type}: "
                "every file of the dataset needs the same type for a column (string and large_string mix fine)"
            ) from None
    return merged.field(column).type


def _check_ids(ids: pa.ChunkedArray, column: str, where: str) -> str:
    """'string' or 'int64': the ids' type in the results. InputError for another type, a null id, or
    an id that repeats, naming the offending rows or values."""
    if is_string(ids.type):
        id_type = "string"
    elif pa.types.is_integer(ids.type):
        id_type = "int64"
    else:
        raise InputError(
            f"id column '{column}' has type {ids.type}; ids must be strings or integers "
            "(cast the column, or drop --id-column to number the rows)"
        )
    nulls = ids.null_count
    if nulls:
        rows = pc.indices_nonzero(pc.is_null(ids)).to_pylist()[:SHOW]
        raise InputError(
            f"id column '{column}' of {where} has {nulls} null id{'s' if nulls > 1 else ''} (row "
            f"{', '.join(map(str, rows))}{', ...' if nulls > SHOW else ''}, counting from 0): every row needs an id"
        )
    counts = pc.value_counts(ids)
    repeated = pc.filter(counts, pc.greater(counts.field("counts"), 1))
    if len(repeated):
        pairs = sorted(
            zip(repeated.field("values").to_pylist(), repeated.field("counts").to_pylist(), strict=True),
            key=lambda p: (-p[1], str(p[0])),
        )
        shown = ", ".join(f"{v!r} x{n}" for v, n in pairs[:SHOW])
        raise InputError(
            f"id column '{column}' of {where} repeats {len(pairs)} id{'s' if len(pairs) > 1 else ''} "
            f"({shown}{', ...' if len(pairs) > SHOW else ''}): ids must be unique"
        )
    return id_type


def _prompt_kind(field: pa.Field) -> str:
    t = field.type
    if is_string(t):
        return "messages" if field.name == "messages" else "text"
    if is_list(t) and pa.types.is_struct(t.value_type):
        members = {t.value_type.field(i).name for i in range(t.value_type.num_fields)}
        if {"role", "content"} <= members:
            return "messages"
    raise InputError(
        f"prompt column '{field.name}' has type {t}; expected string prompts or chat "
        "messages (list of {role, content})"
    )
