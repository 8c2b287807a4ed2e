"""The structured-output flags of `run`, `submit` and `estimate` (the job options --json-schema FILE,
--regex and --choice, jobs/job_options.py) as SamplingSpec fields.
Checked here before anything is written (the file exists and holds a JSON object; the choices are
not empty); SamplingSpec refuses two of them together, jobs/constraint_check.py one that does not
compile. A row's own constraint wins (README "Structured output")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs.errors import FreightError
from jobs.spec import canonical_schema


def constraint_fields(json_schema: Path | None, regex: str | None, choice: str | None) -> dict[str, Any]:
    """The SamplingSpec fields of the flags (only those given); FreightError naming the flag when the
    schema file is missing, unreadable or not a JSON object, or a choice is empty."""
    fields: dict[str, Any] = {}
    if json_schema is not None:
        fields["json_schema"] = read_schema(json_schema)
    if regex is not None:
        fields["regex"] = regex
    if choice is not None:
        fields["choice"] = split_choices(choice)
    return fields


def read_schema(path: Path) -> str:
    """A schema file's JSON object as canonical JSON text."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FreightError(f"--json-schema {path}: no such file (give a file holding a JSON schema)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FreightError(f"--json-schema {path}: cannot read it ({exc})") from None
    try:
        return canonical_schema(text)
    except ValueError as exc:
        raise FreightError(f"--json-schema {path}: {exc}") from None


def split_choices(text: str) -> tuple[str, ...]:
    """'yes, no,maybe' -> ("yes", "no", "maybe"): split on commas, spaces around each dropped."""
    choices = tuple(c.strip() for c in text.split(","))
    if not any(choices):
        raise FreightError(f"--choice {text!r}: no choices; give comma-separated strings, e.g. --choice yes,no")
    if not all(choices):
        raise FreightError(f"--choice {text!r}: an empty choice between commas; e.g. --choice yes,no")
    return choices
