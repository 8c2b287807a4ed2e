"""A row's value that may come as JSON text: a Parquet string column holds a list or an object as
its JSON, where a request body holds the value itself."""

from __future__ import annotations

import json
from typing import Any


def parse_json_text(value: Any, field: str, hint: str = "") -> Any:
    """`value`, or the JSON value it holds when it is text; ValueError `<field>: not JSON (<why>)`,
    followed by `; <hint>` (what to give instead) when there is one."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{field}: not JSON ({exc.msg})" + (f"; {hint}" if hint else "")) from None
