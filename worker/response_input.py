"""A /v1/responses request's `input` as OpenAI's Responses API takes it -> the chat messages it renders.

`input` is a string (one user message) or a list of message items: `{"role", "content"}` (the SDK's
EasyInputMessage), optionally with `"type": "message"`, `status`, `phase`, and `id` on an assistant
message (an earlier response's output item sent back). Roles: user, system, developer, assistant.
Content: a string, or a list of text parts: `input_text` (any role) and `output_text` (an assistant
message's earlier output; its `annotations` and `logprobs` describe that output and do not change the
prompt), joined with "\\n" as chat text parts are. Images, files and audio are refused, as is every other
item type (tool calls and their outputs, which freight runs in chat requests; reasoning items; item
references). The messages then go through worker/chat_messages.py like a chat request's.
"""

from __future__ import annotations

from typing import Any

from worker.chat_messages import chat_messages

_ITEM_FIELDS = ("type", "role", "content", "id", "status", "phase")
_ROLES = ("user", "system", "developer", "assistant")
_PART_FIELDS = {"input_text": ("type", "text"), "output_text": ("type", "text", "annotations", "logprobs")}
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")
# item types a Responses input may hold that freight does not run, with the reason
_TOOLS = "tool calls are chat requests' (/v1/chat/completions: assistant tool_calls and tool messages)"
_NOT_RUN = {
    "function_call": _TOOLS,
    "function_call_output": _TOOLS,
    "custom_tool_call": _TOOLS,
    "custom_tool_call_output": _TOOLS,
    "reasoning": "reasoning items are not supported (send the earlier answer as an assistant message)",
    "item_reference": "freight keeps no earlier items: send the item's content itself",
}


def response_messages(value: Any) -> list[dict[str, str]]:
    """The chat messages of `input`; ValueError naming the item and field ("input[1].content[0].type ...")."""
    if isinstance(value, str):
        if not value:
            raise ValueError("input: must not be empty")
        return chat_messages([{"role": "user", "content": value}], "input")
    if not isinstance(value, list) or not value:
        raise ValueError("input: must be a string or a non-empty list of message items {role, content}")
    return chat_messages([_message(i, item) for i, item in enumerate(value)], "input")


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
