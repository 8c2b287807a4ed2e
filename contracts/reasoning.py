"""Reasoning formats: how a model's chat template marks its thinking, and where each generated token
falls (thinking, answer, harmony message headers), token by token.

Torch-free: the control plane detects a model's format at submit (a flag it cannot honour is
refused), the worker splits each chat row's output into `reasoning` and the answer, and the engine
tracks a row's phase to end its thinking at a budget and to start its grammar where the answer
starts. All three use this one reading of the markers.

Families:
- "think" (Qwen3, QwQ, DeepSeek-R1 and its distills): `<think>` ... `</think>`, then the answer.
  The thinking either opens in the output (Qwen3 writes `<think>` first) or in the prompt (R1's
  template ends its generation prompt with `<think>\\n`); a prompt that ends with a closed, empty
  block (`<think>\\n\\n</think>\\n\\n`, Qwen3's enable_thinking=False) has no thinking to come.
  The text is split as the Qwen3 template splits it: reasoning = the inside with its newlines
  stripped, answer = what follows `</think>` with its leading newlines stripped. Ending the
  thinking writes `</think>\\n\\n`, the text the template puts between the two.
- "harmony" (gpt-oss): messages `<|start|>{header}<|message|>{content}<|end|>`, the last one ended
  by `<|return|>` (an answer) or `<|call|>` (a tool call); the header names the channel
  (`<|channel|>analysis`, `commentary`, `final`), a recipient (`to=functions.NAME`) and a content
  type (`<|constrain|>json`). Thinking is the analysis channel's content; the answer is the final
  channel's (and commentary addressed to no tool: a preamble); commentary to `functions.NAME` is a
  tool call. Ending the thinking writes `<|end|><|start|>assistant<|channel|>final<|message|>`.

A row's reasoning tokens are the thinking's content tokens (markers and headers not counted): the
count `usage.completion_tokens_details.reasoning_tokens` reports and a budget bounds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Family = Literal["think", "harmony"]
THINK_START, THINK_END = "<think>", "</think>"
THINK_SEPARATOR = "\n\n"  # between `</think>` and the answer, as the Qwen3 template writes it
HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
HARMONY_ANSWER_HEADER = "<|start|>assistant<|channel|>final<|message|>"

Phase = Literal["open", "thinking", "answer", "header", "other", "between", "done"]
# What a fed token is: a marker or header token, thinking content, answer content, or other content
# (harmony commentary, text after the last message)
Kind = Literal["marker", "thinking", "answer", "other"]


@dataclass(frozen=True)
class ReasoningFormat:
    """A model's reasoning format (hashable: it is a field of SamplingParams).

    `answer_channel` (harmony): where a constrained answer goes. "final" (an answer): its header is
    written for it; "commentary" (a forced tool call): only `<|start|>assistant` is, and the grammar
    writes the rest of the header (` to=functions.NAME`, the channel, `<|constrain|>json`)."""

    family: Family
    answer_channel: Literal["final", "commentary"] = "final"

    def __post_init__(self) -> None:
        if self.family not in ("think", "harmony"):
            raise ValueError(f"reasoning family {self.family!r} is not one of think, harmony")
        if self.answer_channel not in ("final", "commentary") or (self.family == "think" and self.answer_channel != "final"):
            raise ValueError(f"answer_channel {self.answer_channel!r}: a harmony format's final or commentary")

    @property
    def answer_header(self) -> str:
        """What the answer's text starts after, once the thinking is over (harmony: the next message's
        header, or its start when the grammar writes the header)."""
        if self.family == "think":
            return THINK_SEPARATOR
        return HARMONY_ANSWER_HEADER if self.answer_channel == "final" else "<|start|>assistant"

    @property
    def end_text(self) -> str:
        """The text that ends the thinking and starts the answer (written when a budget runs out)."""
        return (THINK_END if self.family == "think" else "<|end|>") + self.answer_header

    @property
    def markers(self) -> tuple[str, ...]:
        """The tokens the format needs as single tokens of the vocabulary."""
        return (THINK_START, THINK_END) if self.family == "think" else HARMONY_TOKENS


THINK = ReasoningFormat("think")
HARMONY = ReasoningFormat("harmony")


def detect(chat_template: str | None, vocab: Mapping[str, int]) -> ReasoningFormat | None:
    """The reasoning format of a model whose chat template is `chat_template` and whose tokenizer's
    token -> id map (added tokens included) is `vocab`; None: the model does not reason (no template,
    or markers that are not single tokens)."""
    if not chat_template:
        return None
    if all(t in vocab for t in HARMONY_TOKENS) and "<|channel|>" in chat_template:
        return HARMONY
    if THINK_START in vocab and THINK_END in vocab and (THINK_END in chat_template or THINK_START in chat_template):
        return THINK
    return None


@dataclass(frozen=True, eq=False)
class ReasoningTokens:
    """A format's markers as one tokenizer's ids. `decode(ids)` must keep special tokens (harmony's
    headers are read as text); `end_ids` is `end_text` tokenized."""

    format: ReasoningFormat
    ids: dict[str, int]  # marker text -> token id
    end_ids: tuple[int, ...]
    decode: Callable[[Sequence[int]], str] = field(repr=False)
    answer_ids: tuple[int, ...] = ()  # the format's answer_header tokenized
    # harmony: `<|channel|>analysis<|message|>`, the header a constrained row's thinking is held to,
    # and `<|start|>assistant`, the role every header of the output starts with
    analysis_header: tuple[int, ...] = ()
    role_ids: tuple[int, ...] = ()

    @classmethod
    def resolve(cls, fmt: ReasoningFormat, vocab: Mapping[str, int], encode: Callable[[str], Sequence[int]],
                decode: Callable[[Sequence[int]], str]) -> ReasoningTokens:  # fmt: skip
        """`encode(text)`: the bare ids of a text (no BOS; special tokens in it read as such).
        ValueError when a marker is not a single token of this vocabulary."""
        missing = [m for m in fmt.markers if m not in vocab]
        if missing:
            raise ValueError(f"the tokenizer has no single token for {', '.join(missing)}: it cannot carry "
                             f"the {fmt.family} reasoning format")  # fmt: skip
        ids = {m: int(vocab[m]) for m in fmt.markers}
        if fmt.family == "think":
            return cls(fmt, ids, tuple(encode(fmt.end_text)), decode, tuple(encode(fmt.answer_header)))
        return cls(fmt, ids, tuple(encode(fmt.end_text)), decode, tuple(encode(fmt.answer_header)),
                   tuple(encode("<|channel|>analysis<|message|>")), tuple(encode("<|start|>assistant")))  # fmt: skip


@dataclass
class HarmonyMessage:
    """One harmony message of an output: its header's fields and its content's token ids."""

    channel: str | None
    recipient: str | None
    content_type: str | None
    content: list[int] = field(default_factory=list)
    ended: bool = False  # its end token was generated (`<|end|>`, `<|return|>` or `<|call|>`)
    end: str | None = None  # which: end, return, call


_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CONSTRAIN = re.compile(r"<\|constrain\|>\s*([^\s<]+)")


def harmony_header(text: str) -> tuple[str | None, str | None, str | None]:
    """(channel, recipient, content type) of a header's text: "assistant<|channel|>commentary
    to=functions.f <|constrain|>json", or as a template renders a call, "assistant to=functions.f
    <|channel|>commentary json"."""
    channel = m.group(1) if (m := _CHANNEL.search(text)) else None
    recipient = m.group(1) if (m := _RECIPIENT.search(text)) else None
    ctype = m.group(1) if (m := _CONSTRAIN.search(text)) else None
    if ctype is None and channel is not None:  # "<|channel|>commentary json"
        after = text[text.find("<|channel|>") :].split()
        ctype = after[1] if len(after) > 1 and not after[1].startswith(("to=", "<|")) else None
    return channel, recipient, ctype


class ReasoningStream:
    """The phase of a generated sequence, fed one token at a time from the prompt's end.

    think: open (the thinking may start: `<think>` as the first token) -> thinking -> answer.
    harmony: header (reading a message header) -> thinking (analysis content) | answer (final
    content) | other (commentary content) -> between (after `<|end|>`) -> header ... -> done (after
    `<|return|>` or `<|call|>`). `thinking_tokens` counts thinking content tokens. With `record`,
    harmony messages are kept (`messages`) for the output's split.
    """

    __slots__ = ("tokens", "phase", "thinking_tokens", "header", "messages", "record")

    def __init__(self, tokens: ReasoningTokens, prompt_ids: Sequence[int], record: bool = False) -> None:
        self.tokens = tokens
        self.thinking_tokens = 0
        self.header: list[int] = []
        self.messages: list[HarmonyMessage] = []
        self.record = record
        self.phase: Phase = self._initial(prompt_ids)
        self.thinking_tokens = 0  # the prompt's own thinking text is not the row's

    def copy(self) -> ReasoningStream:
        out = ReasoningStream.__new__(ReasoningStream)
        out.tokens, out.phase, out.thinking_tokens, out.record = self.tokens, self.phase, self.thinking_tokens, self.record
        out.header = list(self.header)
        out.messages = []  # recording is for a whole output, never for a copy
        return out

    def state(self) -> tuple:
        """A snapshot to restore (`restore`): the engine rolls a speculated run back with it."""
        return self.phase, self.thinking_tokens, tuple(self.header)

    def restore(self, state: tuple) -> None:
        self.phase, self.thinking_tokens, header = state
        self.header = list(header)

    def _initial(self, prompt: Sequence[int]) -> Phase:
        ids = self.tokens.ids
        if self.tokens.format.family == "think":
            start, end = _last(prompt, ids[THINK_START]), _last(prompt, ids[THINK_END])
            if start > end:
                return "thinking"
            if end >= 0 and not self.tokens.decode(list(prompt[end + 1 :])).strip():
                return "answer"  # an empty block closed at the prompt's end: thinking is off
            return "open"
        at = _last(prompt, ids["<|start|>"])
        if at < 0:
            return "between"
        self.phase = "header"
        for token in prompt[at + 1 :]:
            self.feed(token)
        return self.phase

    def feed(self, token: int) -> Kind:
        """Advance by one token; what the token is."""
        ids = self.tokens.ids
        if self.tokens.format.family == "think":
            if self.phase == "open":
                if token == ids[THINK_START]:
                    self.phase = "thinking"
                    return "marker"
                self.phase = "answer"
                return "answer"
            if self.phase == "thinking":
                if token == ids[THINK_END]:
                    self.phase = "answer"
                    return "marker"
                self.thinking_tokens += 1
                return "thinking"
            return "answer"
        phase = self.phase
        if phase == "header":
            if token == ids["<|message|>"]:
                channel, recipient, ctype = harmony_header(self.tokens.decode(self.header))
                self.header = []
                if self.record:
                    self.messages.append(HarmonyMessage(channel, recipient, ctype))
                if channel == "analysis":
                    self.phase = "thinking"
                elif channel == "final" or (channel == "commentary" and recipient is None):
                    self.phase = "answer"
                else:
                    self.phase = "other"
                return "marker"
            self.header.append(token)
            return "marker"
        if phase in ("thinking", "answer", "other"):
            end = {ids["<|end|>"]: "end", ids["<|return|>"]: "return", ids["<|call|>"]: "call"}.get(token)
            if end is not None:
                self.phase = "between" if end == "end" else "done"
                if self.record and self.messages:
                    self.messages[-1].ended, self.messages[-1].end = True, end
                return "marker"
            if self.record and self.messages:
                self.messages[-1].content.append(token)
            if phase == "thinking":
                self.thinking_tokens += 1
                return "thinking"
            return "answer" if phase == "answer" else "other"
        if phase == "between" and token == ids["<|start|>"]:
            self.phase = "header"
            return "marker"
        return "other"


def _last(ids: Sequence[int], token: int) -> int:
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == token:
            return i
    return -1


@dataclass(frozen=True)
class ReasoningSplit:
    """A chat row's output split by its reasoning format."""

    reasoning: str | None  # the thinking's text; None when the output has no thinking
    answer: str  # the answer's text (the `completion`)
    reasoning_tokens: int
    answer_ids: tuple[int, ...] = ()  # the answer's tokens (think: after `</think>`; harmony: final content)
    messages: tuple[HarmonyMessage, ...] = ()  # harmony: every message (tool calls are read from them)


def split_output(tokens: ReasoningTokens, prompt_ids: Sequence[int], output_ids: Sequence[int],
                 decode: Callable[[Sequence[int]], str]) -> ReasoningSplit:  # fmt: skip
    """Split one choice's generated ids; `decode(ids)` makes the text of a part (the row's own
    skip_special_tokens). A thinking that never ended (a budgetless row cut at max_tokens) is all
    reasoning and no answer."""
    stream = ReasoningStream(tokens, prompt_ids, record=True)
    thinking: list[int] = []
    answer: list[int] = []
    opened = stream.phase == "thinking"
    for token in output_ids:
        kind = stream.feed(token)
        if kind == "thinking":
            thinking.append(token)
        elif kind == "answer" and tokens.format.family == "think":
            answer.append(token)
        opened = opened or stream.phase == "thinking"
    if tokens.format.family == "think":
        reasoning = decode(thinking).strip("\n") if opened else None
        return ReasoningSplit(reasoning, decode(answer).lstrip("\n"), stream.thinking_tokens, tuple(answer))
    messages = tuple(stream.messages)
    analysis = [decode(m.content) for m in messages if m.channel == "analysis"]
    said = [m for m in messages if m.channel == "final" or (m.channel == "commentary" and m.recipient is None)]
    return ReasoningSplit("\n\n".join(analysis) if analysis else None, "\n\n".join(decode(m.content) for m in said),
                          stream.thinking_tokens, tuple(t for m in said for t in m.content), messages)  # fmt: skip
