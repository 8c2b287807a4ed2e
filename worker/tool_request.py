"""A chat request's tools, checked: `tools`, `tool_choice` and `parallel_tool_calls` as OpenAI's
Chat Completions API takes them.

- `tools`: a non-empty list of {"type": "function", "function": {"name", "description"?,
  "parameters"?, "strict"?}}; a name is 1-64 letters, digits, `_` or `-`, unique in the list;
  `parameters` a JSON schema of an object (absent: no parameters) that the grammar engine compiles
  (llguidance reads it as the engine would to force a call).
- `tool_choice`: "none" (calls are not parsed: the answer is text), "auto" (the default with tools:
  the answer's calls are parsed), "required" (one call or more is forced), or {"type": "function",
  "function": {"name"}} (a call to that tool is forced); a named tool must be in `tools`.
- `parallel_tool_calls` (default true): with "required", one call or more; false (and a named
  tool) forces exactly one.

Each problem raises ValueError naming the field (the row's error).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import llguidance

from contracts.constraint import Constraint
from contracts.grammar import grammar_text, strict_schema

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOOL_KEYS = {"type", "function"}
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict[str, Any] | None

    def template_dict(self) -> dict[str, Any]:
        """As a chat template reads it (OpenAI's tool object)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[Tool, ...]
    choice: Literal["none", "auto", "required", "named"]
    named: str | None = None  # choice "named": the tool
    parallel: bool = True

    @property
    def forced(self) -> tuple[Tool, ...]:
        """The tools a forced call may go to (none unless required or named)."""
        if self.choice == "required":
            return self.tools
        if self.choice == "named":
            return tuple(t for t in self.tools if t.name == self.named)
        return ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)


def tool_request(tools: Any, tool_choice: Any, parallel: Any) -> ToolRequest | None:
    """The checked tools of a body (None: it has none)."""
    if tools is None:
        if tool_choice not in (None, "none"):
            raise ValueError(f"tool_choice {_shown(tool_choice)}: needs tools (give the functions the model may call)")
        if parallel is not None:
            raise ValueError("parallel_tool_calls: needs tools")
        return None
    if not isinstance(tools, list) or not tools:
        raise ValueError('tools: must be a non-empty list of {"type": "function", "function": {...}}')
    checked = tuple(_tool(i, t) for i, t in enumerate(tools))
    names = [t.name for t in checked]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ValueError(f"tools: two tools are named {dup!r}; names must be unique")
    if parallel is not None and not isinstance(parallel, bool):
        raise ValueError(f"parallel_tool_calls {_shown(parallel)}: must be true or false")
    choice, named = _choice(tool_choice, names)
    request = ToolRequest(checked, choice, named, True if parallel is None else parallel)
    for i, tool in enumerate(checked):
        if tool in request.forced:
            _compiles(i, tool, strict=True)
    return request


def _tool(i: int, tool: Any) -> Tool:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise ValueError(f'{where}: must be an object {{"type": "function", "function": {{...}}}}')
    extra = sorted(set(tool) - _TOOL_KEYS)
    if extra:
        raise ValueError(f"unknown field '{where}.{extra[0]}': a tool takes type and function")
    if tool.get("type") != "function":
        raise ValueError(f"{where}.type {_shown(tool.get('type'))}: must be \"function\" (the only tool type)")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ValueError(f"{where}.function: must be an object {{name, description?, parameters?}}")
    where += ".function"
    extra = sorted(set(function) - _FUNCTION_KEYS)
    if extra:
        raise ValueError(f"unknown field '{where}.{extra[0]}': a function takes {', '.join(sorted(_FUNCTION_KEYS))}")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{where}.name {_shown(name)}: must be 1-64 letters, digits, _ or -")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ValueError(f"{where}.description: must be a string")
    if function.get("strict") is not None and not isinstance(function["strict"], bool):
        raise ValueError(f"{where}.strict {_shown(function['strict'])}: must be true or false")
    parameters = function.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise ValueError(f"{where}.parameters: must be a JSON schema (an object)")
        if parameters.get("type", "object") != "object":
            raise ValueError(f"{where}.parameters.type {_shown(parameters.get('type'))}: a function's parameters "
                             "are an object (\"type\": \"object\")")  # fmt: skip
    out = Tool(name, description, parameters)
    _compiles(i, out, strict=False)
    return out


def _compiles(i: int, tool: Tool, strict: bool) -> None:
    """The parameters schema must be one the grammar engine compiles: leniently for any tool (a
    malformed schema), strictly (OpenAI's strict reading) for a tool a call is forced to."""
    if tool.parameters is None:
        return
    where = f"tools[{i}].function.parameters"
    try:
        constraint = Constraint.json_schema(tool.parameters)
        if strict:
            text = grammar_text(constraint)
        else:
            text = llguidance.LLMatcher.grammar_from_json_schema(
                strict_schema(json.loads(constraint.spec)), overrides={"lenient": True})  # fmt: skip
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text)
    except (ValueError, TypeError, RuntimeError) as exc:
        is_error, messages = True, [str(exc)]
    if is_error:
        reason = (messages[0] if messages else "the grammar engine refused it").strip().split("\n")[0]
        forced = " (a forced call holds its arguments to it strictly)" if strict else ""
        raise ValueError(f"{where}: not a valid JSON schema{forced}: {reason}")


def _choice(value: Any, names: list[str]) -> tuple[Literal["none", "auto", "required", "named"], str | None]:
    if value is None or value == "auto":
        return "auto", None
    if value in ("none", "required"):
        return value, None
    if isinstance(value, dict):
        function = value.get("function")
        if value.get("type") != "function" or not isinstance(function, dict) or set(value) - {"type", "function"}:
            raise ValueError('tool_choice: an object is {"type": "function", "function": {"name": ...}}')
        name = function.get("name")
        if name not in names:
            raise ValueError(f"tool_choice.function.name {_shown(name)}: no tool of that name in tools "
                             f"({', '.join(names)})")  # fmt: skip
        return "named", name
    raise ValueError(f'tool_choice {_shown(value)}: must be "none", "auto", "required" or '
                     '{"type": "function", "function": {"name": ...}}')  # fmt: skip


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."
