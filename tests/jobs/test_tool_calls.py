"""Tool calls per family: freight's chat template rendering of tools and tool transcripts equals
transformers' `apply_chat_template(tools=...)`; each family's format round-trips (an assistant
message's calls rendered by the family's own template parse back to the same calls); a forced call's
grammar accepts exactly what the template writes; message and tool checks name their field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import pytest
from harmony_tokenizer import GPT_OSS_TEMPLATE, write_harmony_tokenizer

from contracts.reasoning import HARMONY, HARMONY_TOKENS, split_output
from worker.chat_messages import chat_messages
from worker.demo_model import QWEN3_TEMPLATE, make_demo_model
from worker.engine.tokenizer import Tokenizer
from worker.tool_formats import detect_tool_format, forced_calls, parse_calls
from worker.tool_request import tool_request

transformers = pytest.importorskip("transformers")
DATA = Path(__file__).resolve().parents[1] / "data"
TEMPLATES = {
    "hermes": QWEN3_TEMPLATE.read_text(encoding="utf-8"),
    "harmony": GPT_OSS_TEMPLATE.read_text(encoding="utf-8"),
    "llama3_json": (DATA / "llama3_1_json_chat_template.jinja").read_text(encoding="utf-8"),
    "mistral": (DATA / "mistral_parallel_chat_template.jinja").read_text(encoding="utf-8"),
}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"]}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time now",
                                           "parameters": {"type": "object", "properties": {}}}}]  # fmt: skip
CALLS = [{"id": "call_000000001", "type": "function",
          "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'}}]  # fmt: skip
USER = {"role": "user", "content": "Weather in Oslo?"}
VOCAB = {t: 2000 + i for i, t in enumerate([*HARMONY_TOKENS, "<tool_call>", "</tool_call>"])}


@pytest.fixture(scope="module")
def harmony_tokenizer(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo tokenizer with harmony's special tokens and gpt-oss's template."""
    return write_harmony_tokenizer(model_dir, tmp_path_factory.mktemp("harmony"))


def _assistant_part(text: str) -> str:
    """A rendered assistant turn as the model writes it: without the turn's role header and end, and
    after its (empty) think block."""
    for head in ("<|im_start|>assistant\n", "<|start_header_id|>assistant<|end_header_id|>\n\n"):
        text = text.removeprefix(head)
    for end in ("<|im_end|>\n", "<|eot_id|>", "</s>"):
        text = text.removesuffix(end)
    return text.split("</think>")[-1].lstrip("\n")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_model(tmp_path_factory.mktemp("m") / "qwen3", "qwen3")


def _with_template(model_dir: Path, tmp: Path, template: str) -> Path:
    """The qwen3 demo tokenizer's files with another chat template."""
    out = tmp / "tok"
    out.mkdir()
    (out / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return out


@pytest.mark.parametrize("family", ["hermes", "harmony", "llama3_json", "mistral"])
def test_tools_render_as_transformers_does(model_dir: Path, tmp_path: Path, family: str) -> None:
    """Tools, a transcript with an assistant's calls and the tool's answer, and template variables:
    freight's rendering is transformers'."""
    path = _with_template(model_dir, tmp_path, TEMPLATES[family])
    ours, hf = Tokenizer(path), transformers.AutoTokenizer.from_pretrained(path)
    transcript = chat_messages([USER, {"role": "assistant", "content": None, "tool_calls": CALLS},
                                {"role": "tool", "tool_call_id": "call_000000001", "content": '{"temp": 3}'}])  # fmt: skip
    for messages, variables in (([USER], {}), (transcript, {}), ([USER], {"reasoning_effort": "high"})):
        expected = hf.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True, **variables)
        assert ours.apply_chat_template(messages, tools=TOOLS, **variables) == expected


@pytest.mark.parametrize("family", ["hermes", "harmony", "llama3_json", "mistral"])
def test_format_round_trips(harmony_tokenizer: Path, family: str) -> None:
    """The family's template writes an assistant's calls; parsing that text gives them back."""
    template = TEMPLATES[family]
    assert detect_tool_format(template, VOCAB) == family
    hf_render = transformers.utils.chat_template_utils.render_jinja_template
    calls = CALLS if family in ("llama3_json", "harmony") else [*CALLS, {**CALLS[0], "id": "call_000000002",
        "function": {"name": "get_time", "arguments": "{}"}}]  # fmt: skip
    messages = chat_messages([USER, {"role": "assistant", "content": None, "tool_calls": calls}])
    before = hf_render([messages[:1]], tools=TOOLS, chat_template=template, bos_token="", eos_token="</s>")[0][0]
    after = hf_render([messages], tools=TOOLS, chat_template=template, bos_token="", eos_token="</s>")[0][0]
    assert after.startswith(before)
    text = _assistant_part(after[len(before):])
    if family == "harmony":  # read as the model's output: its messages, by harmony's special tokens
        tok = Tokenizer(harmony_tokenizer)
        tokens = tok.reasoning_tokens(HARMONY)
        split = split_output(tokens, [], tok.encode(text, add_special_tokens=False), tokens.decode)
        content, parsed = parse_calls(family, split.answer, ["get_weather", "get_time"], split.messages, tokens.decode)
    else:
        content, parsed = parse_calls(family, text, ["get_weather", "get_time"])
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]  # fmt: skip


@pytest.mark.parametrize("family", ["hermes", "llama3_json", "mistral"])
def test_forced_grammar_accepts_what_the_template_writes(model_dir: Path, family: str) -> None:
    """The grammar of a forced call (parallel for hermes and mistral) accepts the family's own
    rendering of the calls, tokenized by the model's tokenizer, and ends there."""
    tok = Tokenizer(model_dir)
    hf_render = transformers.utils.chat_template_utils.render_jinja_template
    calls = CALLS if family == "llama3_json" else [*CALLS, {**CALLS[0], "id": "call_000000002",
        "function": {"name": "get_weather", "arguments": '{"city": "Rome", "unit": "f"}'}}]  # fmt: skip
    messages = chat_messages([USER, {"role": "assistant", "content": None, "tool_calls": calls}])
    render = lambda m: hf_render([m], tools=TOOLS, chat_template=TEMPLATES[family], bos_token="", eos_token="")[0][0]  # noqa: E731
    text = _assistant_part(render(messages)[len(render(messages[:1])):])
    if family == "mistral":  # Mistral's template writes each call's id; a model writes none
        text = text.replace(', "id": "000000001"', "").replace(', "id": "000000002"', "")
    request = tool_request(TOOLS, "required", family != "llama3_json")
    constraint = forced_calls(family, [(t.name, t.parameters) for t in request.forced], request.parallel, tok.vocab())
    lltok = llguidance.LLTokenizer((model_dir / "tokenizer.json").read_text(), n_vocab=tok.vocab_size)
    matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(constraint.spec))
    assert not matcher.is_error(), matcher.get_error()
    ids = tok.encode(text, add_special_tokens=False)
    assert matcher.consume_tokens(ids), (text, matcher.get_error())
    assert matcher.is_accepting()
    wrong = tok.encode(text.replace('"Oslo", "unit": "c"', '"Oslo", "unit": "k"'), add_special_tokens=False)
    assert llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(constraint.spec)).validate_tokens(wrong) < len(wrong)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
           "function": {"name": "f", "arguments": "{bad"}}]}], "messages[0].tool_calls[0].function.arguments: not JSON"),
        ([{"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f"}}]}],
         "messages[0].tool_calls[0].id: is required"),
        ([USER, {"role": "assistant", "content": None, "tool_calls": CALLS},
          {"role": "tool", "tool_call_id": "call_000000001", "content": "a"},
          {"role": "tool", "tool_call_id": "call_000000001", "content": "b"}], "messages[3].tool_call_id 'call_000000001'"),
    ],
)  # fmt: skip
def test_bad_tool_messages_name_their_field(value: list[dict[str, Any]], expected: str) -> None:
    with pytest.raises(ValueError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        chat_messages(value)
