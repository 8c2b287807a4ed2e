"""The submit-time compile of a job-wide constraint against the model's own tokenizer, as the engine
compiles it (jobs/constraint_check.py runs it in a child process, under a time limit).

Some constraints pass llguidance's grammar check and even compile, and fail only once the engine
walks them with a real vocabulary: `a{1000000}` builds its lexer lazily and gives up ("too many
expressions constructed") at the second token, which would fail every row of a job that ran and
was billed. So the probe builds the matcher from tokenizer.json as the engine does
(worker/engine/grammar_cache.py), then takes up to WALK_TOKENS steps: it fills the allowed-token mask
the way the engine does and consumes the lowest allowed token that is not an EOS, stopping where
the grammar ends. A matcher error or an empty mask on the way is the constraint's problem.

Protocol: one JSON object on stdin {grammar, tokenizer (tokenizer.json text), vocab_size, eos};
one JSON object on stdout {"error": one line | null}. A child process, so that a constraint whose
compile runs away costs the submit its time limit, not an unbounded wait, and a crash in the
grammar library ends the child, not the submit.
"""

from __future__ import annotations

import json
import sys

WALK_TOKENS = 8


def probe(grammar: str, tokenizer_json: str, vocab_size: int, eos: list[int]) -> str | None:
    """Why the engine could not run `grammar` with this tokenizer (one line), or None."""
    import llguidance
    import numpy as np

    tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos or None)
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    words = np.zeros((vocab_size + 31) // 32, dtype=np.int32)  # the engine's bitmask row
    ends = set(eos)
    for step in range(WALK_TOKENS):
        if matcher.is_error():
            return _first_line(matcher.get_error(), step)
        if matcher.is_stopped():
            return None
        matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        if matcher.is_error():
            return _first_line(matcher.get_error(), step)
        allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size])
        tokens = [int(t) for t in allowed if int(t) not in ends]
        if not tokens:
            if allowed.size or matcher.is_accepting():
                return None  # only an end is allowed: a complete output
            return f"no output can satisfy it with this model's tokenizer (its allowed-token mask is empty at token {step})"
        matcher.consume_token(tokens[0])
    return _first_line(matcher.get_error(), WALK_TOKENS) if matcher.is_error() else None


def _first_line(message: str, step: int) -> str:
    return f"the grammar engine fails at output token {step}: {message.strip().splitlines()[0]}"


def main() -> None:
    request = json.loads(sys.stdin.read())
    error = probe(request["grammar"], request["tokenizer"], int(request["vocab_size"]), list(request["eos"]))
    sys.stdout.write(json.dumps({"error": error}))


if __name__ == "__main__":
    main()
