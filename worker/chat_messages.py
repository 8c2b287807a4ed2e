"""Chat messages as OpenAI's API takes them -> the {role, content[, name]} dicts a chat template renders.

Roles: system, user, assistant; developer (OpenAI's newer name for system instructions) is rendered
as system, since chat templates know only system. tool and function messages need tool calling,
which freight does not run: refused, as any other role is. Content: a string, or a list of text
parts [{"type": "text", "text": ...}] joined with "\\n" (as vLLM joins them); other part types
(image_url, input_audio, file, refusal) are refused. An assistant message may carry a `name`; a
message field freight does not run (tool_calls, audio, ...) is refused by name; a null field counts
as absent.
"""

from __future__ import annotations

from typing import Any

ROLES = ("system", "developer", "user", "assistant")
_TOOL_ROLES = ("tool", "function")
_MESSAGE_FIELDS = ("role", "content", "name")


def chat_messages(value: Any) -> list[dict[str, str]]:
    """Checked, normalised messages. ValueError naming the message and field ("messages[1].role ...")."""
    if not isinstance(value, list) or not value:
        raise ValueError("messages: must be a non-empty list of {role, content}")
    return [_message(i, m) for i, m in enumerate(value)]


def _message(i: int, m: Any) -> dict[str, str]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise ValueError(f"{where}: must be an object {{role, content}}")
    role = m.get("role")
    if role in _TOOL_ROLES:
        raise ValueError(f"{where}.role {role!r}: tool messages need tool calling, which freight does not run")
    if role not in ROLES:
        raise ValueError(f"{where}.role {role!r}: must be one of {', '.join(ROLES)}")
    for key, v in m.items():
        if key not in _MESSAGE_FIELDS and v is not None:  # null = absent (Parquet structs hold every field)
            raise ValueError(f"{where}: unknown field {key!r} (a message takes role, content and name)")
    out = {"role": "system" if role == "developer" else role, "content": _content(where, m.get("content"))}
    name = m.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise ValueError(f"{where}.name {name!r}: must be a string")
        out["name"] = name
    return out


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
