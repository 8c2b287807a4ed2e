"""A Parquet messages row's tool columns -> the values a chat body gives (worker/tool_request.py
checks them as it checks a body's).

- `tools`: JSON text of the list, as a chat body has it; or a list of structs {"type", "function":
  {"name", "description", "parameters", "strict"}}, Parquet's shape of the same list, where a struct
  holds every field of the column's type: a null field counts as absent, and `parameters` may be a
  struct or the JSON text of the schema (a schema's keys differ from tool to tool, which one struct
  type cannot hold).
- `tool_choice`: "none", "auto", "required", or the named function as JSON text or a struct.
- `parallel_tool_calls`: true or false.
"""

from __future__ import annotations

from typing import Any

from contracts.json_text import parse_json_text

_CHOICES = ("none", "auto", "required")


def column_tools(value: Any) -> Any:
    """The `tools` cell as a chat body's `tools` (None: null)."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_json_text(value, "tools", 'e.g. [{"type": "function", "function": {"name": ...}}]')
    if not isinstance(value, list):
        return value  # tool_request refuses it with its own message
    return [_tool(i, t) for i, t in enumerate(value)]


def column_tool_choice(value: Any) -> Any:
    """The `tool_choice` cell as a chat body's (None: null)."""
    if isinstance(value, str) and value.strip() not in _CHOICES:
        return parse_json_text(value, "tool_choice", 'e.g. {"type": "function", "function": {"name": ...}}')
    if isinstance(value, dict):
        return _without_nulls(value)
    return value.strip() if isinstance(value, str) else value


def _tool(i: int, tool: Any) -> Any:
    if not isinstance(tool, dict):
        return tool
    out = _without_nulls(tool)
    parameters = (out.get("function") or {}).get("parameters") if isinstance(out.get("function"), dict) else None
    if isinstance(parameters, str):
        out["function"]["parameters"] = parse_json_text(parameters, f"tools[{i}].function.parameters", 'e.g. {"type": "object", ...}')
    return out


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
