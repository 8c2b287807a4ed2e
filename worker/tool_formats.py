"""Tool-call formats: how a model writes a tool call, read from its chat template; parsing a
generated answer into calls, and the grammar that forces calls (tool_choice required or named).

Families (the first whose marker the chat template carries):
- "harmony" (gpt-oss): a commentary message to `functions.NAME`: `<|channel|>commentary
  to=functions.NAME <|constrain|>json<|message|>{arguments}<|call|>`; one call per turn.
- "hermes" (Qwen2, Qwen2.5, Qwen3, Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  one block per call, blocks separated by a newline.
- "mistral": `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` (and the newer
  `[TOOL_CALLS]NAME[ARGS]{...}` when parsing).
- "llama3_json" (Llama 3.1 / 3.2 / 3.3): the answer is `{"name": ..., "parameters": {...}}`
  (optionally after `<|python_tag|>`; several separated by `;`).

A call is kept when its name is one of the request's tools and its arguments are a JSON object;
`arguments` is that object as JSON text (OpenAI's shape). The text around the calls is the
message's content (None when only whitespace). A forced call's grammar holds every call to its
tool's parameters schema, read strictly (contracts/grammar.py's strict_schema, no free whitespace),
so a forced call is always valid JSON that matches its schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from contracts.constraint import Constraint
from contracts.grammar import JSON_OPTIONS, strict_schema
from contracts.reasoning import HarmonyMessage

ToolFormat = Literal["harmony", "hermes", "mistral", "llama3_json"]


def detect_tool_format(chat_template: str | None, vocab: Mapping[str, int]) -> ToolFormat | None:
    """The tool-call format the chat template writes; None: it renders no tools freight can parse."""
    if not chat_template or "tools" not in chat_template:
        return None
    if "<|channel|>" in chat_template and "<|call|>" in vocab:
        return "harmony"
    if "<tool_call>" in chat_template:
        return "hermes"
    if "[TOOL_CALLS]" in chat_template:
        return "mistral"
    if '"parameters"' in chat_template and ("<|start_header_id|>" in chat_template or "ipython" in chat_template):
        return "llama3_json"
    return None


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object as text


def parse_calls(fmt: ToolFormat, text: str, names: Sequence[str],
                messages: Sequence[HarmonyMessage] = (), decode: Any = None) -> tuple[str | None, list[ParsedCall]]:  # fmt: skip
    """(content, calls) of an answer's `text` (special tokens kept); harmony reads `messages` (their
    content decoded with `decode`) instead."""
    known = set(names)
    if fmt == "harmony":
        calls = []
        for m in messages:
            if m.channel == "commentary" and m.recipient and m.recipient.startswith("functions."):
                call = _call(m.recipient.removeprefix("functions."), _json(decode(m.content)), known)
                if call is not None:
                    calls.append(call)
        return _content(text), calls
    if fmt == "hermes":
        return _hermes(text, known)
    if fmt == "mistral":
        return _mistral(text, known)
    return _llama3(text, known)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call(name: Any, arguments: Any, known: set[str]) -> ParsedCall | None:
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        arguments = _json(arguments)
    if not isinstance(name, str) or name not in known or not isinstance(arguments, dict):
        return None
    return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


def _content(text: str) -> str | None:
    return text.strip() or None


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _hermes(text: str, known: set[str]) -> tuple[str | None, list[ParsedCall]]:
    calls, rest, at = [], [], 0
    for m in _HERMES.finditer(text):
        obj = _json(m.group(1))
        call = _call(obj.get("name"), obj.get("arguments", obj.get("parameters")), known) if isinstance(obj, dict) else None
        if call is None:
            continue  # not a call of these tools: stays text
        calls.append(call)
        rest.append(text[at : m.start()])
        at = m.end()
    rest.append(text[at:])
    return _content("".join(rest)), calls


def _objects(text: str, separators: str) -> tuple[list[Any], int]:
    """JSON values one after the other (separated by any of `separators` and whitespace); how far read."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and (text[at].isspace() or text[at] in separators):
            at += 1
        if at >= len(text) or text[at] not in "[{":
            return values, at
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return values, at
        values.append(value)


def _mistral(text: str, known: set[str]) -> tuple[str | None, list[ParsedCall]]:
    head, marker, tail = text.partition("[TOOL_CALLS]")
    if not marker:
        return _content(text), []
    calls: list[ParsedCall] = []
    if tail.lstrip().startswith("["):  # [TOOL_CALLS] [{"name", "arguments"}, ...]
        values, _ = _objects(tail, "")
        for obj in values[0] if values and isinstance(values[0], list) else []:
            call = _call(obj.get("name"), obj.get("arguments"), known) if isinstance(obj, dict) else None
            if call is not None:
                calls.append(call)
    else:  # [TOOL_CALLS]name[ARGS]{...}[TOOL_CALLS]name[ARGS]{...}
        for part in re.split(r"\[TOOL_CALLS\]", tail):
            name, args_marker, args = part.partition("[ARGS]")
            values, _ = _objects(args, "")
            call = _call(name.split("[CALL_ID]")[0].strip(), values[0] if values else None, known) if args_marker else None
            if call is not None:
                calls.append(call)
    return _content(head), calls


def _llama3(text: str, known: set[str]) -> tuple[str | None, list[ParsedCall]]:
    body = text.strip().removeprefix("<|python_tag|>")
    if not body.startswith("{"):
        return _content(text), []
    values, end = _objects(body, ";")
    calls = []
    for obj in values:
        call = _call(obj.get("name"), obj.get("parameters", obj.get("arguments")), known) if isinstance(obj, dict) else None
        if call is None:
            return _content(text), []  # not (only) calls of these tools: the whole answer is text
        calls.append(call)
    return _content(body[end:]), calls


# ---- forced calls -----------------------------------------------------------------------------------
def _lit(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def _token(text: str, vocab: Mapping[str, int]) -> str:
    """A marker as the grammar names it: the tokenizer's own token when it is one (llguidance matches
    added tokens only by reference), else its text."""
    if text in vocab:
        return f"<[{vocab[text]}]>"
    return _lit(text)


def arguments_schema(parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """A tool's parameters as the grammar holds them: strict (OpenAI's reading), compact JSON."""
    schema = strict_schema(dict(parameters) if parameters else {"type": "object", "properties": {}})
    return {**schema, "x-guidance": JSON_OPTIONS}


def forced_calls(fmt: ToolFormat, tools: Sequence[tuple[str, Mapping[str, Any] | None]], parallel: bool,
                 vocab: Mapping[str, int]) -> Constraint:  # fmt: skip
    """The grammar of one call (or with `parallel`, one or more) to any of `tools` ((name,
    parameters) pairs), written in `fmt`."""
    rules = []
    names = []
    t = {m: _token(m, vocab) for m in ("<|channel|>", "<|constrain|>", "<|message|>", "<tool_call>", "</tool_call>",
                                       "[TOOL_CALLS]")}  # fmt: skip
    for i, (name, parameters) in enumerate(tools):
        args = "%json " + json.dumps(arguments_schema(parameters), ensure_ascii=False)
        head = '{"name": ' + json.dumps(name) + ', "arguments": '
        if fmt == "harmony":
            # ends with the arguments: `<|call|>` is an EOS, which a grammar that stops needs no more
            parts = [t["<|channel|>"], _lit(f"commentary to=functions.{name} "), t["<|constrain|>"], _lit("json"),
                     t["<|message|>"], f"args{i}"]  # fmt: skip
        elif fmt == "hermes":
            parts = [t["<tool_call>"], _lit("\n" + head), f"args{i}", _lit("}\n"), t["</tool_call>"]]
        elif fmt == "mistral":
            parts = [_lit(head), f"args{i}", _lit("}")]
        else:
            parts = [_lit('{"name": ' + json.dumps(name) + ', "parameters": '), f"args{i}", _lit("}")]
        rules += [f"call{i}: " + " ".join(parts), f"args{i}: {args}"]
        names.append(f"call{i}")
    call = "call: " + " | ".join(names)
    several = parallel and fmt != "harmony"  # gpt-oss calls one tool a turn
    if fmt == "mistral":
        more = f"({_lit(', ')} call)*" if several else ""
        start = f"start: {t['[TOOL_CALLS]']} {_lit(' [')} call {more} {_lit(']')}"
    else:
        sep = {"hermes": "\n", "llama3_json": "; "}.get(fmt, "")
        start = f"start: call ({_lit(sep)} call)*" if several else "start: call"
    return Constraint("grammar", "\n".join([start, call, *rules]))
