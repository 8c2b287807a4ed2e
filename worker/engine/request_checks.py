"""RequestChecks: what the engine checks of each prompt and its SamplingParams before it runs.

A bad prompt fails alone, as its RequestOutput's error (or EmbeddingOutput's), never the batch: a
prompt that is neither text nor token ids, ids outside the vocabulary, an empty or too long prompt,
logit_bias or stop_token_ids outside the vocabulary, a constraint that does not compile. Arguments
that cannot be a batch at all (one string instead of a list, a count of SamplingParams that matches
nothing) raise ValueError.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq

from contracts.sampling import SamplingParams


class RequestChecks:
    def __init__(
        self,
        vocab_size: int,
        max_model_len: int,
        constraint_error: Callable[[object], str | None],
        max_prompt_chars: int | None = None,
    ) -> None:
        """constraint_error(constraint or reasoning format): why it cannot run (StructuredOutputs.error),
        or None.
        max_prompt_chars: the most characters a text prompt that fits the context can have
        (Tokenizer.max_text_chars); a longer one is refused without being tokenized."""
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.constraint_error = constraint_error
        self.max_prompt_chars = max_prompt_chars

    def encodable(self, prompt: object) -> bool:
        """Whether `prompt` is a text to tokenize (a text over max_prompt_chars is not: prompt_ids
        refuses it as it is)."""
        return isinstance(prompt, str) and (self.max_prompt_chars is None or len(prompt) <= self.max_prompt_chars)

    @staticmethod
    def params_for(prompts: Seq, params: SamplingParams | Seq[SamplingParams] | None) -> list[SamplingParams]:
        """One SamplingParams per prompt (one given for all, one each, or the defaults)."""
        if isinstance(prompts, str):
            raise ValueError("prompts must be a list of strings or of token-id lists, not one string")
        if params is None or isinstance(params, SamplingParams):
            return [params or SamplingParams()] * len(prompts)
        params = list(params)
        if len(params) != len(prompts):
            raise ValueError(
                f"got {len(params)} SamplingParams for {len(prompts)} prompts; pass one or one each"
            )
        return params

    def prompt_ids(self, prompt: object, encoded: list[int] | None, room: int = 1) -> tuple[list[int], str | None]:
        """(token ids, None) or (whatever ids there are, why this prompt cannot run). A text prompt
        comes with `encoded`, its ids from the caller's batch encode; `room`: context positions
        needed after the prompt (1 to generate, 0 to embed)."""
        if encoded is not None:
            ids = encoded
        elif isinstance(prompt, str) and not self.encodable(prompt):
            return [], (f"prompt has {len(prompt)} characters, more than the {self.max_prompt_chars} any "
                        f"text of {self.max_model_len} tokens (the context) can have with this tokenizer; "
                        "shorten it")  # fmt: skip
        elif isinstance(prompt, Seq) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                return ids, f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})"
        else:
            return [], f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}"
        if not ids:
            return ids, "empty prompt: there is no token to condition on"
        if len(ids) + room > self.max_model_len:
            need = " (prompt + at least one generated token)" if room else ""
            return ids, f"prompt has {len(ids)} tokens but the context holds {self.max_model_len}{need}; shorten it"
        return ids, None

    def params_error(self, params: SamplingParams) -> str | None:
        """Why a generate request's SamplingParams cannot run on this model, or None."""
        if params.logit_bias and params.logit_bias[-1][0] >= self.vocab_size:
            return (f"logit_bias token id {params.logit_bias[-1][0]} is outside the vocabulary "
                    f"[0, {self.vocab_size}); use ids the model's tokenizer produces")  # fmt: skip
        if params.stop_token_ids and max(params.stop_token_ids) >= self.vocab_size:
            return (f"stop_token_ids holds {max(params.stop_token_ids)}, outside the vocabulary "
                    f"[0, {self.vocab_size}); use ids the model's tokenizer produces")  # fmt: skip
        if params.reasoning_budget is not None and params.reasoning is None:
            return ("reasoning_budget needs the model's reasoning format (SamplingParams.reasoning): the engine "
                    "must know where the thinking ends")  # fmt: skip
        if params.reasoning is not None and (error := self.constraint_error(params.reasoning)) is not None:
            return error
        if params.constraint is not None:  # compiled once per distinct constraint
            return self.constraint_error(params.constraint)
        return None
