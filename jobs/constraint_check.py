"""The job-wide structured-output constraint (--json-schema / --regex / --choice), compiled at
planning (run, submit, estimate and eval runs alike) so that a pattern or schema the engine cannot
compile is refused before anything is written, instead of failing every row on a worker.

Submit and worker agree on what is valid because both use the same code: the mapping from
SamplingSpec to a Constraint (`SamplingSpec.constraint`, the one rows get), its grammar text
(contracts/grammar.py `grammar_text`, which the engine compiles), and llguidance's grammar check,
which the engine's compile runs too. The check needs no tokenizer (a grammar's validity does not
depend on the vocabulary), so it reads no model files and stays fast (a millisecond or so). The
grammar modules are imported on the first constraint: a job without one loads no llguidance.

That check does not walk the grammar with the model's vocabulary, and some constraints pass it and
fail only there (`a{1000000}`: llguidance gives up at the second token). So once the model is
checked, `check_constraint_compiles` runs the engine's compile and its first steps on the model's
tokenizer in a child process under a time limit (jobs/constraint_probe.py).

A row's own constraint (a Parquet constraint column, a JSONL body's response_format or guided_*)
is not checked here: a bad one is that row's error, and the job goes on.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from typing import Any

from jobs.errors import FreightError
from jobs.settings import Settings, get_settings
from jobs.spec import SamplingSpec
from jobs.storage import open_store

_LOCATION = re.compile(r'^at \d+\(\d+\): (invalid regex ".*" \(in regex\): )?')
_WHAT_TO_DO = {
    "regex": "fix the pattern (the grammar engine, llguidance, reads Rust regex syntax: no look-around, "
    "\\b or backreferences)",
    "json_schema": "fix the schema (JSON Schema, as OpenAI's structured outputs take it)",
    "choice": "fix the choices",
}


@functools.lru_cache(maxsize=16)
def constraint_problem(sampling: SamplingSpec) -> str | None:
    """Why the job-wide constraint does not compile, in one line (None: it compiles, or there is none).
    Compiled once per distinct spec (the cache): a submit pays for it once, not per row."""
    if sampling.constraint_kind is None:
        return None  # nothing to compile, nothing imported
    import llguidance

    from contracts.grammar import grammar_text

    try:
        constraint = sampling.constraint
        if constraint is None:
            return None
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar_text(constraint))
    except (ValueError, TypeError, RuntimeError) as exc:
        return _reason([str(exc)])
    return _reason(messages) if is_error else None


def check_constraint(sampling: SamplingSpec, flag_value: str | None = None) -> None:
    """FreightError (one line: the flag, what is wrong, what to do) when the job-wide constraint does
    not compile. `flag_value` names what the user gave (e.g. the schema's file); default: the value."""
    problem = constraint_problem(sampling)
    kind = sampling.constraint_kind
    if problem is None or kind is None:
        return
    if flag_value is None:
        value = getattr(sampling, kind)
        flag_value = repr(",".join(value) if kind == "choice" else value)
        if kind == "json_schema" and len(flag_value) > 80:
            flag_value = "(the schema)"
    raise FreightError(f"--{kind.replace('_', '-')} {flag_value} does not compile: {problem}; {_WHAT_TO_DO[kind]}")


def check_constraint_compiles(
    sampling: SamplingSpec, model: str, config: dict[str, Any], settings: Settings | None = None
) -> None:
    """FreightError (one line) unless the job-wide constraint compiles and runs with the model's own
    tokenizer as the engine runs it (jobs/constraint_probe.py), within
    FREIGHT_CONSTRAINT_CHECK_TIMEOUT_S; call after check_model (config: its config.json)."""
    kind = sampling.constraint_kind
    if kind is None:
        return
    from contracts.grammar import grammar_text

    constraint = sampling.constraint
    if constraint is None:
        return
    settings = settings or get_settings()
    eos = config.get("eos_token_id")
    request = {
        "grammar": grammar_text(constraint),
        "tokenizer": open_store(model, settings).get("tokenizer.json").decode("utf-8"),
        "vocab_size": int(config["vocab_size"]),
        "eos": [int(e) for e in (eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])],
    }
    limit = settings.constraint_check_timeout_s
    try:
        done = subprocess.run([sys.executable, "-m", "jobs.constraint_probe"], input=json.dumps(request),
                              capture_output=True, text=True, timeout=limit)  # fmt: skip
    except subprocess.TimeoutExpired:
        problem = f"it did not compile within {limit:g} s (FREIGHT_CONSTRAINT_CHECK_TIMEOUT_S)"
    else:
        try:
            problem = json.loads(done.stdout)["error"] if done.returncode == 0 else None
        except (ValueError, KeyError, TypeError):
            problem = None
        if done.returncode != 0 or problem is None and done.stdout.strip() == "":
            problem = f"the grammar engine crashed compiling it (exit {done.returncode})"
    if problem is not None:
        noun = {"regex": "pattern", "json_schema": "schema", "choice": "choices"}[kind]
        raise FreightError(f"--{kind.replace('_', '-')} {_shown(sampling, kind)} cannot run on {model}: {problem}; "
                           f"simplify the {noun} (a bounded repetition of more than a few thousand is "
                           "too many for the grammar engine)")  # fmt: skip


def _shown(sampling: SamplingSpec, kind: str) -> str:
    value = getattr(sampling, kind)
    shown = repr(",".join(value) if kind == "choice" else value)
    return "(the schema)" if kind == "json_schema" and len(shown) > 80 else shown if len(shown) <= 80 else shown[:77] + "..."


def _reason(messages: list[str]) -> str:
    """The grammar library's message as one line: its `error:` line when it has one (a regex parse
    error), else its first line without the grammar position."""
    text = "\n".join(messages).strip() or "the grammar library refused it"
    for line in text.splitlines():
        if line.startswith("error: "):
            return line.removeprefix("error: ").strip()
    return _LOCATION.sub("", text.splitlines()[0]).strip()
