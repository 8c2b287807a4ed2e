"""CompletionTexts: the text side of sequences: stop strings found as tokens arrive, and the
RequestOutput of a request's finished choices."""

from __future__ import annotations

from worker.engine.outputs import CompletionOutput, RequestOutput
from worker.engine.sequence import Sequence
from worker.engine.tokenizer import Tokenizer


class CompletionTexts:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def stop_hit(self, seq: Sequence) -> bool:
        """Cut seq.text before the earliest stop string, if the completion now contains one.

        Earlier tokens were checked already, so a new match ends in the latest token: decode only a
        tail long enough to hold any stop string (a character is at most 4 bytes, a token at least
        one), and the whole completion only on a hit. Keeps a long completion's checks linear.
        """
        p = seq.params
        if seq.num_output_tokens < p.min_tokens:  # as vLLM: no stop before min_tokens tokens
            return False
        stops, skip = p.stop, p.skip_special_tokens
        window = 4 * max(len(s) for s in stops) + 2
        if not any(s in self.tokenizer.decode(seq.output_token_ids[-window:], skip) for s in stops):
            return False
        text = self.tokenizer.decode(seq.output_token_ids, skip)
        floor = len(self.tokenizer.decode(seq.output_token_ids[: p.min_tokens], skip)) if p.min_tokens else 0
        hits = [i for i in (text.find(s, max(0, floor - len(s) + 1)) for s in stops) if i >= 0]
        if not hits:
            return False
        seq.text = text[: min(hits)]
        return True

    def output(self, choices: list[Sequence]) -> RequestOutput:
        """The request's output from its finished choices (index order)."""
        outs = []
        for seq in choices:
            ids = seq.output_token_ids
            text = seq.text if seq.text is not None else self.tokenizer.decode(ids, seq.params.skip_special_tokens)
            outs.append(CompletionOutput(seq.choice, text, ids, seq.finish_reason or "error", seq.logprobs))
        first = choices[0]
        return RequestOutput(
            index=first.index,
            prompt_token_ids=first.token_ids[: first.num_prompt_tokens],
            token_ids=outs[0].token_ids,
            text=outs[0].text,
            finish_reason=outs[0].finish_reason,
            prompt_tokens=first.num_prompt_tokens,
            cached_tokens=first.num_cached_tokens or 0,
            error=next((s.error for s in choices if s.error is not None), None),
            logprobs=first.logprobs,
            prompt_logprobs=first.prompt_logprobs,
            outputs=outs,
        )
