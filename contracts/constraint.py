"""Constraint: the structured-output rule one request's text must follow (SamplingParams.constraint).

Torch-free and hashable: the engine compiles each distinct Constraint once per process and shares
the compiled grammar between every row that carries an equal one. What the fields hold:

- kind "json_schema": `spec` is the schema as JSON text (Constraint.json_schema canonicalizes it,
  so equal schemas written with other key orders or spacing are one cache entry; the order of a
  `properties` map is kept: it is the order the generated object's keys come in);
- kind "json_object": any JSON object; `spec` is empty;
- kind "regex": `spec` is the pattern the whole output must match;
- kind "choice": `choices` are the strings the output must equal one of;
- kind "grammar": `spec` is a context-free grammar in the grammar library's syntax (Lark).

Only shape is checked here (a known kind, the right field filled, a non-empty choice list): whether
a schema, pattern or grammar compiles is found by the engine, once per distinct constraint, and is
the error of every row that carries it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from contracts.json_nesting import nesting_depth

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
# A choice list compiles to one grammar alternative a choice, and llguidance's grammar holds under
# 65,525 symbols, finding out slowly when a list is too long (bench/hostile_input.py --case choice-100k
# shows a row with 100,000 refused); a schema nests at
# most MAX_SCHEMA_DEPTH objects and arrays (canonicalizing and compiling recurse per level).
MAX_CHOICES = 10_000
MAX_SCHEMA_DEPTH = 64


def _canonical(value: Any, ordered: bool = False) -> Any:
    """JSON with every object's keys sorted, except a `properties` map's (`ordered`): their order is
    the generated object's key order, so it is part of the schema's meaning."""
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if not isinstance(value, dict):
        return value
    keys = list(value) if ordered else sorted(value)
    return {k: _canonical(value[k], ordered=(k == "properties" and not ordered)) for k in keys}


def schema_object(schema: dict[str, Any] | str) -> dict[str, Any]:
    """A JSON schema given as a dict or as JSON text, as a dict; ValueError when the text is not
    JSON, the value not an object, or it nests deeper than MAX_SCHEMA_DEPTH."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"json_schema is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"json_schema must be a JSON object, got {type(schema).__name__}")
    if nesting_depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise ValueError(f"json_schema nests more than {MAX_SCHEMA_DEPTH} levels of objects and arrays; "
                         "flatten it (or use $defs and $ref)")  # fmt: skip
    return schema


@dataclass(frozen=True)
class Constraint:
    kind: str
    spec: str = ""
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"constraint kind {self.kind!r} is not one of {', '.join(KINDS)}")
        object.__setattr__(self, "choices", tuple(self.choices))
        if self.kind == "choice":
            if not self.choices:
                raise ValueError("choice: the list of choices is empty; give at least one string")
            if len(self.choices) > MAX_CHOICES:
                raise ValueError(f"choice: {len(self.choices):,} choices, more than the {MAX_CHOICES:,} a "
                                 "constraint takes; use a regex or a JSON schema enum")  # fmt: skip
            bad = [c for c in self.choices if not isinstance(c, str) or not c]
            if bad:
                raise ValueError(f"choice: every choice must be a non-empty string, got {bad[0]!r}")
            if self.spec:
                raise ValueError("choice: the choices go in `choices`, not `spec`")
        elif self.choices:
            raise ValueError(f"{self.kind}: only a choice constraint takes `choices`")
        if self.kind in ("json_schema", "regex", "grammar") and not (isinstance(self.spec, str) and self.spec):
            raise ValueError(f"{self.kind}: empty {'schema' if self.kind == 'json_schema' else self.kind}")
        if self.kind == "json_object" and self.spec:
            raise ValueError("json_object takes no spec (use json_schema for a schema)")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str) -> Constraint:
        """From a schema (a dict, or JSON text that must parse to an object), canonicalized."""
        return cls("json_schema", json.dumps(_canonical(schema_object(schema)), separators=(",", ":")))

    @property
    def is_json(self) -> bool:
        """The output is a JSON value (results carry it parsed)."""
        return self.kind in ("json_schema", "json_object")
