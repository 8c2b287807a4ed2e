"""SpeculativeConfig: how an Engine speculates. Torch-free, frozen, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ngram", "draft")
# K when none is given: prompt lookup's proposals cost nothing to make, so a long cap only adds the
# verify rows the controller prices (and on copy-heavy work its runs are long); each draft token
# costs a forward of the draft, and the adaptive draft stops early where its confidence says the
# next token does not pay. The draft's default is the K that measures best at batch 1, a longer one
# no better: `bench/speculative.py --batches 1 --repeats 3 --k K` (docs/PERFORMANCE.md, "The draft's K").
DEFAULT_TOKENS = {"ngram": 8, "draft": 6}


@dataclass(frozen=True)
class SpeculativeConfig:
    """method "ngram": prompt lookup (the last 1-4 tokens matched against the prompt and the text so
    far; the tokens that followed are proposed); "draft": a smaller checkpoint with the same tokenizer
    (draft_model, a folder) proposes. num_tokens: K, the most tokens proposed per sequence and step
    (None: the method's default, DEFAULT_TOKENS).
    adaptive: K shrinks and speculation pauses for sequences whose proposals are rejected, and whole
    steps run without speculation at batch sizes where the engine measured it not to pay."""

    method: str = "ngram"
    num_tokens: int | None = None
    draft_model: str | None = None
    adaptive: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {METHODS}, got {self.method!r}")
        if self.num_tokens is None:
            object.__setattr__(self, "num_tokens", DEFAULT_TOKENS[self.method])
        if isinstance(self.num_tokens, bool) or not isinstance(self.num_tokens, int) or self.num_tokens < 1:
            raise ValueError(f"speculative num_tokens (K) must be an int >= 1, got {self.num_tokens!r}")
        if self.num_tokens > 16:
            raise ValueError(f"speculative num_tokens (K) must be <= 16, got {self.num_tokens}; "
                             "longer runs are almost never accepted whole")  # fmt: skip
        if self.method == "draft" and not self.draft_model:
            raise ValueError("speculative method 'draft' needs draft_model: the folder of the draft checkpoint")
        if self.method == "ngram" and self.draft_model:
            raise ValueError("draft_model is only read by method 'draft'; drop it or set method='draft'")

    @classmethod
    def parse(cls, spec: str, num_tokens: int | None = None) -> SpeculativeConfig:
        """From the CLI's form: "ngram" or "draft:PATH" (num_tokens None: the method's default)."""
        if spec == "ngram":
            return cls("ngram", num_tokens)
        if spec.startswith("draft:") and len(spec) > len("draft:"):
            return cls("draft", num_tokens, spec[len("draft:") :])
        raise ValueError(f"--speculative must be 'ngram' or 'draft:PATH', got {spec!r}")
