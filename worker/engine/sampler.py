"""Sampler: next tokens from logits; greedy, temperature, top-k, top-p; logprobs.

A sampled (temperature > 0) row draws from its own request's torch.Generator with the exponential
race (argmax of p / E, E ~ Exp(1)), which equals a categorical draw; so a request's tokens depend
only on its own logits and seed, never on its neighbours in the batch.
"""

from __future__ import annotations

import torch

from worker.engine.sequence import Sequence


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [V] (already temperature-scaled) with tokens outside top-k / top-p set to -inf."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the mass strictly before it already reaches top_p (keeps >= 1 token).
        drop = (probs.cumsum(-1) - probs) >= top_p
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


class Sampler:
    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """logits fp32 [N, V], row i for seqs[i] -> next token per row; appends logprobs if asked."""
        tokens = [0] * len(seqs)
        greedy = [i for i, s in enumerate(seqs) if s.params.greedy]
        if greedy:
            picked = (
                logits[greedy].argmax(-1).tolist() if len(greedy) < len(seqs) else logits.argmax(-1).tolist()
            )
            for i, t in zip(greedy, picked, strict=True):
                tokens[i] = t
        for i, seq in enumerate(seqs):
            p = seq.params
            if p.greedy:
                continue
            row = _filter(logits[i].cpu() / p.temperature, p.top_k, p.top_p)
            probs = row.softmax(-1)
            race = torch.empty_like(probs).exponential_(generator=seq.generator)
            tokens[i] = int((probs / race).argmax())
        want = [i for i, s in enumerate(seqs) if s.logprobs is not None]
        if want:
            logp = torch.log_softmax(logits[want], dim=-1).cpu()
            for row, i in enumerate(want):
                k = seqs[i].params.logprobs or 0
                top = torch.topk(logp[row], k) if k else None
                entry = (
                    dict(zip(top.indices.tolist(), top.values.tolist(), strict=True))
                    if top is not None
                    else {}
                )
                entry[tokens[i]] = float(logp[row, tokens[i]])
                seqs[i].logprobs.append(entry)
        return tokens

    @staticmethod
    def prompt_logprobs(logits: torch.Tensor, seq: Sequence, first: int) -> None:
        """logits [n, V] at positions first..first+n-1 score prompt tokens first+1..first+n."""
        targets = torch.tensor(seq.token_ids[first + 1 : first + 1 + logits.shape[0]], device=logits.device)
        logp = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]
        seq.prompt_logprobs.extend(logp.tolist())
