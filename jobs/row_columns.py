"""The per-row columns a Parquet job reads (sampling settings, and constraints with --row-constraints):
which of the input's columns they are, and whether their Parquet types can hold a valid value (the
values themselves are checked per row by the worker, as a JSONL body's fields are)."""

from __future__ import annotations

import pyarrow as pa

from jobs import datasets
from jobs.errors import InputError
from jobs.log import get_logger
from jobs.spec import JobSpec

log = get_logger(__name__)
ADAPTER_COLUMN = "adapter"  # a row's LoRA adapter, by its --lora name (null: the model itself)


def override_columns(spec: JobSpec, names: list[str]) -> tuple[str, ...]:
    """The per-row columns a Parquet job reads: its sampling columns present (none for an embed job,
    which samples nothing), its constraint columns only with --row-constraints (without it a
    column named like one is plain data; InputError for the flag without any of them), and the
    `adapter` column only for a job with --lora adapters (plain data otherwise)."""
    generates = spec.task != "embed"
    sampling = [c for c in datasets.SAMPLING_COLUMNS if c in names and c != spec.id_column and generates]
    constraint = [c for c in datasets.CONSTRAINT_COLUMNS if c in names and c != spec.id_column]
    if spec.row_constraints and not constraint:
        raise InputError(
            f"--row-constraints: {spec.input} has none of the columns "
            f"{', '.join(datasets.CONSTRAINT_COLUMNS)}; add one (a constraint per row) or drop the flag"
        )
    adapter = [ADAPTER_COLUMN] if spec.loras and ADAPTER_COLUMN in names and spec.id_column != ADAPTER_COLUMN else []
    if spec.loras and not adapter:
        log.warning("no_adapter_column", adapters=sorted(spec.adapters),
                    note=f"the input has no '{ADAPTER_COLUMN}' column: every row runs the model itself")  # fmt: skip
    return tuple(sampling + (constraint if spec.row_constraints else []) + adapter)


def note_row_sampling(overrides: tuple[str, ...]) -> None:
    """Say which of the input's columns set each row's sampling (README "Sampling"): a dataset whose
    column merely shares such a name (an `n`, a `seed`, a `temperature` of its own) would otherwise
    change every row's sampling unnoticed."""
    sampling = [c for c in overrides if c in datasets.SAMPLING_COLUMNS]
    if sampling:
        log.info(
            "row_sampling_columns",
            columns=sampling,
            note="each row's value overrides the job's setting; rename a column that is plain data",
        )


def warn_unread_constraints(spec: JobSpec, names: list[str]) -> None:
    """A generation job over columns named like constraint columns, without --row-constraints: say so."""
    unread = [c for c in datasets.CONSTRAINT_COLUMNS if c in names and c != spec.id_column]
    if unread and not spec.row_constraints and spec.task != "embed" and spec.continuation_column is None:
        log.warning(
            "constraint_columns_not_read",
            columns=unread,
            note=f"plain data; pass --row-constraints to hold each row's output to its {' / '.join(unread)}",
        )


# Parquet types each per-row sampling column may have (values are then checked per row, as a JSONL
# body's fields are: a bad value is that row's error).
_INTEGER_COLUMNS = ("max_tokens", "seed", "top_k", "n", "top_logprobs", "min_tokens", "reasoning_budget")


def check_override_types(schema: pa.Schema, overrides: tuple[str, ...]) -> None:
    """InputError naming the column and the types it may have, for a per-row sampling column whose
    type can never hold a valid value (e.g. temperature as text)."""
    for column in overrides:
        t = schema.field(column).type
        if column in _INTEGER_COLUMNS:
            ok, expected = pa.types.is_integer(t), "integers"
        elif column == "stop":
            ok = is_string(t) or (is_list(t) and is_string(t.value_type))
            expected = "a string or a list of strings"
        elif column == "logprobs":
            ok, expected = pa.types.is_boolean(t) or pa.types.is_integer(t), "true/false or an integer (top count)"
        elif column == "reasoning_effort":
            ok, expected = is_string(t), "strings (low, medium or high)"
        elif column == "chat_template_kwargs":
            ok, expected = is_string(t) or pa.types.is_struct(t), "JSON text or a struct of template variables"
        elif column == "tools":
            ok = is_string(t) or (is_list(t) and pa.types.is_struct(t.value_type))
            expected = 'JSON text of the tools list, or a list of structs {"type", "function"}'
        elif column == "tool_choice":
            ok, expected = is_string(t) or pa.types.is_struct(t), 'strings (none, auto, required, or JSON text of {"type": "function", ...}) or a struct'
        elif column == "parallel_tool_calls":
            ok, expected = pa.types.is_boolean(t), "true/false"
        elif column in ("json_schema", "regex", ADAPTER_COLUMN):
            ok, expected = is_string(t), "strings" + (" (JSON text of a schema)" if column == "json_schema" else
                                                      " (--lora names)" if column == ADAPTER_COLUMN else "")  # fmt: skip
        elif column == "response_format":
            ok, expected = is_string(t) or pa.types.is_struct(t), 'JSON text or a struct ({"type": ...})'
        elif column == "choice":
            ok = is_string(t) or (is_list(t) and is_string(t.value_type))
            expected = "a list of strings (or its JSON text)"
        elif column == "logit_bias":
            ok = is_string(t) or (
                pa.types.is_map(t)
                and (is_string(t.key_type) or pa.types.is_integer(t.key_type))
                and (pa.types.is_integer(t.item_type) or pa.types.is_floating(t.item_type))
            )
            expected = 'JSON text ({"token id": bias}) or a map of token id to number'
        else:
            ok, expected = pa.types.is_integer(t) or pa.types.is_floating(t), "numbers"
        if not ok:
            keep_out = (
                "drop --row-constraints to read it as plain data"
                if column in datasets.CONSTRAINT_COLUMNS
                else "rename the column: with --lora it names each row's adapter"
                if column == ADAPTER_COLUMN
                else "rename the column to keep it out of sampling"
            )
            raise InputError(
                f"column '{column}' sets {column} per row but has type {t}; expected {expected} (or {keep_out})"
            )


def is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
