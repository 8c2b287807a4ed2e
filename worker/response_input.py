"""A /v1/responses request's `input` as OpenAI's Responses API takes it -> the chat messages it renders.

`input` is a string (one user message) or a list of message items: `{"role", "content"}` (the SDK's
EasyInputMessage), optionally with `"type": "message"`, `status`, `phase`, and `id` on an assistant
message (an earlier response's output item sent back). Roles: user, system, developer, assistant.
Content: a string, or a list of text parts: `input_text` (any role) and `output_text` (an assistant
message's earlier output; its `annotations` and `logprobs` describe that output and do not change the
prompt), joined with "\\n" as chat text parts are. Images, files and audio are refused.

A tool transcript is an input too: a `function_call` item (an earlier output item sent back:
`call_id`, `name`, `arguments` as JSON text; `id` and `status` describe it) is an assistant tool call,
consecutive calls (and the assistant message just before them) one assistant turn; a
`function_call_output` item (`call_id`, `output`: text, or input_text parts) is the tool message
answering it. Every other item type is refused (custom tool calls, reasoning items, item
references). The messages then go through worker/chat_messages.py like a chat request's, which
refuses an output whose call_id no earlier call has.
"""

from __future__ import annotations

import json
from typing import Any

from worker.chat_messages import chat_messages

_ITEM_FIELDS = ("type", "role", "content", "id", "status", "phase")
_ROLES = ("user", "system", "developer", "assistant")
_PART_FIELDS = {"input_text": ("type", "text"), "output_text": ("type", "text", "annotations", "logprobs")}
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")
_CALL_FIELDS = ("type", "call_id", "name", "arguments", "id", "status")
_OUTPUT_FIELDS = ("type", "call_id", "output", "id", "status")
# item types a Responses input may hold that freight does not run, with the reason
_CUSTOM = "freight parses function tools' calls only (function_call and function_call_output items)"
_NOT_RUN = {
    "custom_tool_call": _CUSTOM,
    "custom_tool_call_output": _CUSTOM,
    "reasoning": "reasoning items are not supported (send the earlier answer as an assistant message)",
    "item_reference": "freight keeps no earlier items: send the item's content itself",
}


def response_messages(value: Any) -> list[dict[str, Any]]:
    """The chat messages of `input`; ValueError naming the item and field ("input[1].content[0].type ...")."""
    if isinstance(value, str):
        if not value:
            raise ValueError("input: must not be empty")
        return chat_messages([{"role": "user", "content": value}], "input")
    if not isinstance(value, list) or not value:
        raise ValueError("input: must be a string or a non-empty list of message items {role, content}")
    messages: list[dict[str, Any]] = []
    open_calls: set[str] = set()  # call_ids made and not answered yet
    for i, item in enumerate(value):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "function_call":
            call = _call(f"input[{i}]", item)
            open_calls.add(call["id"])
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # one assistant turn: its text, then its calls
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(_call_output(f"input[{i}]", item))
            if messages[-1]["tool_call_id"] not in open_calls:
                raise ValueError(f"input[{i}].call_id {messages[-1]['tool_call_id']!r}: no earlier function_call item "
                                 "has this call_id (or it was answered already)")  # fmt: skip
            open_calls.discard(messages[-1]["tool_call_id"])
        else:
            messages.append(_message(i, item))
    return chat_messages(messages, "input")


def _call(where: str, item: dict[str, Any]) -> dict[str, Any]:
    """A function_call item as a chat tool call (arguments: a JSON object's text)."""
    _known(where, item, _CALL_FIELDS, "a function_call item")
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise ValueError(f"{where}.{key}: must be a string")
    try:
        arguments = json.loads(item["arguments"])
    except ValueError as exc:
        raise ValueError(f"{where}.arguments: not JSON ({exc})") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"{where}.arguments: must be a JSON object (as text)")
    return {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}


def _call_output(where: str, item: dict[str, Any]) -> dict[str, Any]:
    """A function_call_output item as the tool message answering its call."""
    _known(where, item, _OUTPUT_FIELDS, "a function_call_output item")
    if not isinstance(item.get("call_id"), str):
        raise ValueError(f"{where}.call_id: must be a string")
    output = item.get("output")
    if isinstance(output, list):
        output = [_part(f"{where}.output[{j}]", part, "tool") for j, part in enumerate(output)]
    elif not isinstance(output, str):
        raise ValueError(f"{where}.output: must be a string or a list of input_text parts")
    return {"role": "tool", "tool_call_id": item["call_id"], "content": output}


def _known(where: str, item: dict[str, Any], fields: tuple[str, ...], what: str) -> None:
    for key, v in item.items():
        if key not in fields and v is not None:
            raise ValueError(f"{where}: unknown field {key!r} ({what} takes {', '.join(fields)})")


def _message(i: int, item: Any) -> dict[str, Any]:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise ValueError(f"{where}: must be a message item {{role, content}}")
    kind = item.get("type", "message")
    if kind != "message":
        reason = _NOT_RUN.get(kind, "only message items are supported") if isinstance(kind, str) else "must be a string"
        shown = f" {kind!r}" if isinstance(kind, str) and len(kind) <= 40 else ""
        raise ValueError(f"{where}.type{shown}: {reason}")
    for key, v in item.items():
        if key not in _ITEM_FIELDS and v is not None:
            raise ValueError(f"{where}: unknown field {key!r} (a message item takes {', '.join(_ITEM_FIELDS)})")
    role = item.get("role")
    if role not in _ROLES:
        shown = f" {role!r}" if isinstance(role, str) and len(role) <= 40 else ""
        raise ValueError(f"{where}.role{shown}: must be one of {', '.join(_ROLES)}")
    content = item.get("content")
    if isinstance(content, list):
        content = [_part(f"{where}.content[{j}]", part, role) for j, part in enumerate(content)]
    return {"role": role, "content": content}


def _part(where: str, part: Any, role: Any) -> dict[str, str]:
    """A content part as the chat text part worker/chat_messages.py takes."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in _MEDIA_PARTS:
        raise ValueError(f"{where}.type {kind!r}: only text input is supported (input_text parts)")
    if kind not in _PART_FIELDS or (kind == "output_text" and role != "assistant"):
        shown = f" {kind!r}" if isinstance(kind, str) and len(kind) <= 40 else ""
        raise ValueError(f"{where}.type{shown}: a part is input_text, or output_text in an assistant message")
    assert isinstance(part, dict)
    extra = sorted(set(part) - set(_PART_FIELDS[kind]))
    if extra:
        raise ValueError(f"{where}: unknown field {extra[0]!r} (an {kind} part takes {', '.join(_PART_FIELDS[kind])})")
    if not isinstance(part.get("text"), str):
        raise ValueError(f"{where}.text: must be a string")
    return {"type": "text", "text": part["text"]}
