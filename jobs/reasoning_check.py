"""The job-wide reasoning flags (--reasoning-budget, --reasoning-effort, --no-thinking) checked at
submit against the model's chat template and vocabulary, read without torch, with the reading the
worker uses (contracts/reasoning.py `detect`): a flag the model cannot honour is refused before
anything is written, rather than failing every row."""

from __future__ import annotations

import json
from typing import Any

from contracts.reasoning import detect
from jobs.errors import FreightError
from jobs.settings import Settings
from jobs.spec import JobSpec
from jobs.storage import open_store


def reasoning_flags(spec: JobSpec) -> list[str]:
    """The reasoning flags the job sets, as written on the command line."""
    s = spec.sampling
    given = [("--reasoning-budget", s.reasoning_budget is not None), ("--reasoning-effort", s.reasoning_effort is not None),
             ("--no-thinking", not s.thinking)]  # fmt: skip
    return [flag for flag, on in given if on]


def chat_template_of(store: Any) -> str | None:
    """A model folder's chat template: tokenizer_config.json's (a string, or the "default" of a list),
    else chat_template.jinja."""
    config = json.loads(store.get("tokenizer_config.json")) if store.exists("tokenizer_config.json") else {}
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    if not template and store.exists("chat_template.jinja"):
        template = store.get("chat_template.jinja").decode("utf-8")
    return template if isinstance(template, str) else None


def check_reasoning(spec: JobSpec, prompt_kind: str, settings: Settings | None = None) -> None:
    """FreightError naming the flag when the model does not reason, its template lacks the switch or
    effort a flag sets, or the job's prompts are text (only chat rows think)."""
    flags = reasoning_flags(spec)
    if not flags or spec.task == "embed":
        return
    if prompt_kind == "text":
        raise FreightError(f"{flags[0]}: only chat rows think, and {spec.input}'s prompt column holds text; give "
                           f"chat messages (or an OpenAI-Batch file), or drop {flags[0]}")  # fmt: skip
    store = open_store(spec.model, settings)
    template = chat_template_of(store)
    tokenizer = json.loads(store.get("tokenizer.json"))
    vocab = tokenizer.get("model", {}).get("vocab")
    tokens = dict(vocab) if isinstance(vocab, dict) else {}
    tokens.update({t.get("content"): t.get("id") for t in tokenizer.get("added_tokens") or [] if isinstance(t, dict)})
    if detect(template, tokens) is None:
        raise FreightError(f"{flags[0]}: model {spec.model} does not reason (its chat template marks no thinking "
                           f"with tokens of its vocabulary); drop {flags[0]}")  # fmt: skip
    if spec.sampling.reasoning_effort is not None and "reasoning_effort" not in (template or ""):
        raise FreightError(f"--reasoning-effort: model {spec.model}'s chat template takes no reasoning effort (it "
                           "thinks or not: use --no-thinking, or bound it with --reasoning-budget)")  # fmt: skip
    if not spec.sampling.thinking and "enable_thinking" not in (template or ""):
        raise FreightError(f"--no-thinking: model {spec.model}'s chat template has no thinking switch (gpt-oss "
                           "always thinks: use --reasoning-effort low, or bound it with --reasoning-budget)")  # fmt: skip
