"""contracts/reasoning.py on its own: each family detected from its chat template and vocabulary, and
a choice's tokens split on its markers: thinking opened by the prompt or the model, closed in the
prompt (thinking off), never ended (cut by max tokens), and harmony's channels."""

from __future__ import annotations

from pathlib import Path

import pytest
from harmony_tokenizer import GPT_OSS_TEMPLATE, write_harmony_tokenizer

from contracts.reasoning import HARMONY, HARMONY_TOKENS, THINK, detect, harmony_header, split_output
from worker.demo_model import QWEN3_TEMPLATE, make_demo_model
from worker.engine.tokenizer import Tokenizer

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_model(tmp_path_factory.mktemp("q") / "qwen3", "qwen3")


@pytest.fixture(scope="module")
def qwen3(qwen3_dir: Path) -> Tokenizer:
    return Tokenizer(qwen3_dir)


@pytest.fixture(scope="module")
def harmony(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """The demo tokenizer with harmony's special tokens and gpt-oss's chat template."""
    return Tokenizer(write_harmony_tokenizer(qwen3_dir, tmp_path_factory.mktemp("h")))


def test_detect() -> None:
    vocab = {"<think>": 1, "</think>": 2, **{t: 10 + i for i, t in enumerate(HARMONY_TOKENS)}}
    assert detect(QWEN3_TEMPLATE.read_text(), vocab) == THINK
    assert detect(GPT_OSS_TEMPLATE.read_text(), vocab) == HARMONY
    assert detect(QWEN3_TEMPLATE.read_text(), {"<think>": 1}) is None  # `</think>` is no token: not a format
    assert detect((DATA / "llama3_1_json_chat_template.jinja").read_text(), vocab) is None
    assert detect(None, vocab) is None


def test_think_split(qwen3: Tokenizer) -> None:
    tokens = qwen3.reasoning_tokens(THINK)
    enc = lambda text: qwen3.encode(text, add_special_tokens=False)  # noqa: E731
    dec = lambda ids: qwen3.decode(list(ids))  # noqa: E731
    chat = enc(qwen3.apply_chat_template([{"role": "user", "content": "hi"}]))
    cases = [
        (chat, "<think>\nabc def\n</think>\n\nthe answer", "abc def", "the answer"),  # opened by the model
        (chat + enc("<think>\n"), "abc</think>\n\nyes", "abc", "yes"),  # opened by the prompt (R1)
        (chat + enc("<think>\n"), "abc def ghi", "abc def ghi", ""),  # never ended: cut by max tokens
        (chat, "no thinking here", None, "no thinking here"),  # the model answered at once
        (enc(qwen3.apply_chat_template([{"role": "user", "content": "hi"}], enable_thinking=False)),
         "<think>not a marker here", None, "<think>not a marker here"),  # thinking off: all answer
    ]  # fmt: skip
    for prompt, output, reasoning, answer in cases:
        split = split_output(tokens, prompt, enc(output), dec)
        assert (split.reasoning, split.answer) == (reasoning, answer), output
        inside = output.split("</think>")[0].removeprefix("<think>") if reasoning is not None else ""
        assert split.reasoning_tokens == len(enc(inside))


def test_harmony_split(harmony: Tokenizer) -> None:
    tokens = harmony.reasoning_tokens(HARMONY)
    enc = lambda text: harmony.encode(text, add_special_tokens=False)  # noqa: E731
    dec = lambda ids: harmony.decode(list(ids))  # noqa: E731
    prompt = enc(harmony.apply_chat_template([{"role": "user", "content": "hi"}], reasoning_effort="low"))
    assert harmony.decode(prompt, skip_special_tokens=False).endswith("<|start|>assistant")
    out = ("<|channel|>analysis<|message|>think a<|end|><|start|>assistant<|channel|>commentary to=functions.f "
           '<|constrain|>json<|message|>{"x": 1}<|call|>')
    split = split_output(tokens, prompt, enc(out), dec)
    assert split.reasoning == "think a" and split.answer == "" and split.reasoning_tokens == len(enc("think a"))
    assert [(m.channel, m.recipient, m.content_type, m.end) for m in split.messages] == [
        ("analysis", None, None, "end"), ("commentary", "functions.f", "json", "call")]  # fmt: skip
    final = "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>42<|return|>"
    split = split_output(tokens, prompt, enc(final), dec)
    assert (split.reasoning, split.answer) == ("hmm", "42")
    cut = split_output(tokens, prompt, enc("<|channel|>analysis<|message|>still thinking"), dec)
    assert (cut.reasoning, cut.answer) == ("still thinking", "")
    assert harmony_header("assistant to=functions.get<|channel|>commentary json") == ("commentary", "functions.get", "json")
