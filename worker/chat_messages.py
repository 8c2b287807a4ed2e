"""Chat messages as OpenAI's API takes them -> the dicts a chat template renders.

Roles: system, user, assistant, tool; developer (OpenAI's newer name for system instructions) is
rendered as system, since chat templates know only system. Content: a string, or a list of text
parts [{"type": "text", "text": ...}] joined with "\\n" (as vLLM joins them); other part types
(image_url, input_audio, file, refusal) are refused. A null field counts as absent.

A multi-turn tool transcript is a row:
- an assistant message may carry `tool_calls` ([{"id", "type": "function", "function": {"name",
  "arguments"}}], arguments a JSON object's text, as OpenAI writes it) and then null content; the
  arguments reach the template as an object (templates write them with `tojson`, as vLLM passes
  them); its `reasoning_content` (vLLM's name; `reasoning` too) reaches the template as
  `reasoning_content` and `thinking` (gpt-oss's name), as transformers passes it;
- a tool message {"role": "tool", "tool_call_id", "content"} answers an earlier call of the
  transcript by its id (an id no assistant message called, or answered twice, is refused).
Function messages (OpenAI's deprecated role) and other message fields are refused by name.
"""

from __future__ import annotations

import json
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
_FIELDS = {
    "system": ("role", "content", "name"),
    "developer": ("role", "content", "name"),
    "user": ("role", "content", "name"),
    "assistant": ("role", "content", "name", "tool_calls", "reasoning_content", "reasoning", "refusal"),
    "tool": ("role", "content", "tool_call_id", "name"),
}


def chat_messages(value: Any, field: str = "messages") -> list[dict[str, Any]]:
    """Checked, normalised messages. ValueError naming the message and field ("messages[1].role ...";
    `field`: the request field that holds them)."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"{field}: must be a non-empty list of {{role, content}}")
    out = [_message(f"{field}[{i}]", m) for i, m in enumerate(value)]
    _check_call_ids(out)
    return out


def _message(where: str, m: Any) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise ValueError(f"{where}: must be an object {{role, content}}")
    role = m.get("role")
    if role == "function":
        raise ValueError(f"{where}.role 'function': function messages are deprecated; answer a tool call with "
                         '{"role": "tool", "tool_call_id": ..., "content": ...}')  # fmt: skip
    if role not in ROLES:
        raise ValueError(f"{where}.role {role!r}: must be one of {', '.join(ROLES)}")
    for key, v in m.items():
        if key not in _FIELDS[role] and v is not None:  # null = absent (Parquet structs hold every field)
            raise ValueError(f"{where}: unknown field {key!r} (a {role} message takes {', '.join(_FIELDS[role])})")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role}
    calls = m.get("tool_calls")
    if role == "assistant" and calls is not None:
        out["tool_calls"] = _tool_calls(where, calls)
    content = m.get("content")
    if content is None and "tool_calls" in out:
        out["content"] = ""  # templates test and concatenate it
    else:
        out["content"] = _content(where, content)
    name = m.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise ValueError(f"{where}.name {name!r}: must be a string")
        out["name"] = name
    if role == "assistant":
        reasoning = m.get("reasoning_content", m.get("reasoning"))
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise ValueError(f"{where}.reasoning_content: must be a string")
            out["reasoning_content"] = out["thinking"] = reasoning
        if m.get("refusal") is not None and not isinstance(m["refusal"], str):
            raise ValueError(f"{where}.refusal: must be a string")
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise ValueError(f"{where}.tool_call_id: is required (the id of the call this message answers)")
        out["tool_call_id"] = call_id
    return out


def _tool_calls(where: str, calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, list) or not calls:
        raise ValueError(f'{where}.tool_calls: must be a non-empty list of {{"id", "type": "function", "function"}}')
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function":
            raise ValueError(f'{at}: must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}')
        extra = sorted(set(call) - {"id", "type", "function"})
        if extra:
            raise ValueError(f"unknown field '{at}.{extra[0]}': a tool call takes id, type and function")
        call_id, function = call.get("id"), call.get("function")
        if not isinstance(call_id, str) or not call_id:
            raise ValueError(f"{at}.id: is required (a tool message answers the call by it)")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f'{at}.function: must be {{"name": ..., "arguments": "<JSON object>"}}')
        extra = sorted(set(function) - {"name", "arguments"})
        if extra:
            raise ValueError(f"unknown field '{at}.function.{extra[0]}': takes name and arguments")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError as exc:
                raise ValueError(f"{at}.function.arguments: not JSON ({exc})") from None
        if not isinstance(arguments, dict):
            raise ValueError(f"{at}.function.arguments: must be a JSON object (as text)")
        out.append({"id": call_id, "type": "function", "function": {"name": function["name"], "arguments": arguments}})
    return out


def _check_call_ids(messages: list[dict[str, Any]]) -> None:
    """Every tool message answers a call made before it, once."""
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        for call in m.get("tool_calls", ()):
            open_calls.add(call["id"])
        if m["role"] == "tool":
            call_id = m["tool_call_id"]
            if call_id not in open_calls:
                raise ValueError(f"messages[{i}].tool_call_id {call_id!r}: no earlier assistant message made a call "
                                 "with this id (or it was answered already)")  # fmt: skip
            open_calls.discard(call_id)


def _content(where: str, content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise ValueError(f"{where}.content: must be a string or a non-empty list of text parts")
    texts: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise ValueError(
                f"{where}.content[{j}].type {kind!r}: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                "are supported"
            )
        text = part.get("text")
        if not isinstance(text, str) or set(part) - {"type", "text"}:
            raise ValueError(f"{where}.content[{j}]: a text part is {{\"type\": \"text\", \"text\": a string}}")
        texts.append(text)
    return "\n".join(texts)
