"""Sampler: next tokens from logits; greedy, temperature, top-k, top-p; logprobs.

A sampled (temperature > 0) row draws by inverting its distribution's CDF at one uniform number from
its own request's generator (CPU, one number a step), so a request's tokens depend only on its own
logits and seed, never on its neighbours in the batch. All sampled rows of a step are scaled, cut
and drawn together on the logits' device, with one copy of the picked tokens to the host: per-row
work and copies would cost more than a GPU step, and one uniform a row is far cheaper than the
vocabulary of exponentials an exponential race needs. bench/sampler_speed.py times it against
transformers' sampling.
"""

from __future__ import annotations

import torch

from worker.engine.sequence import Sequence


def _top_p(sorted_logits: torch.Tensor, top_p: list[float]) -> torch.Tensor:
    """Rows sorted descending: -inf where the mass strictly before a token already reaches the row's
    top_p (so >= 1 token stays); rows with top_p 1 keep everything."""
    if all(p >= 1.0 for p in top_p):
        return sorted_logits
    probs = sorted_logits.softmax(-1)
    limit = torch.tensor([p if p < 1.0 else float("inf") for p in top_p], device=probs.device)
    return sorted_logits.masked_fill((probs.cumsum(-1) - probs) >= limit[:, None], float("-inf"))


def _filter(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """logits [N, V] (temperature-scaled) with each row's tokens outside its top-k / top-p at -inf.
    Rows with a top-k cut apply top-p to their k best only (no sort of the whole vocabulary)."""
    vocab = logits.shape[-1]
    device = logits.device
    k_rows = [i for i, k in enumerate(top_k) if 0 < k < vocab]
    if k_rows:
        rows = torch.tensor(k_rows, device=device)
        sub = logits.index_select(0, rows)
        values, index = torch.topk(sub, max(top_k[i] for i in k_rows), dim=-1)  # sorted, descending
        ks = torch.tensor([top_k[i] for i in k_rows], device=device)
        values = values.masked_fill(torch.arange(values.shape[1], device=device)[None, :] >= ks[:, None],
                                    float("-inf"))  # fmt: skip
        values = _top_p(values, [top_p[i] for i in k_rows])
        logits = logits.index_copy(0, rows, torch.full_like(sub, float("-inf")).scatter(1, index, values))
    taken = set(k_rows)
    p_rows = [i for i, p in enumerate(top_p) if p < 1.0 and i not in taken]
    if p_rows:
        rows = torch.tensor(p_rows, device=device)
        sub = logits.index_select(0, rows)
        ordered, order = torch.sort(sub, dim=-1, descending=True)
        cut = _top_p(ordered, [top_p[i] for i in p_rows])
        logits = logits.index_copy(0, rows, sub.scatter(1, order, cut))
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
        drawn = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if drawn:
            for i, t in zip(drawn, self._draw(logits, [seqs[i] for i in drawn], drawn), strict=True):
                tokens[i] = t
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
    def _draw(logits: torch.Tensor, seqs: list[Sequence], rows: list[int]) -> list[int]:
        """Sampled tokens of `seqs` (logits rows `rows`), all rows at once on the logits' device."""
        device = logits.device
        sub = logits if len(rows) == logits.shape[0] else logits.index_select(0, torch.tensor(rows, device=device))
        temps = torch.tensor([s.params.temperature for s in seqs], device=device, dtype=sub.dtype)
        cut = _filter(sub / temps[:, None], [s.params.top_k for s in seqs], [s.params.top_p for s in seqs])
        cdf = cut.softmax(-1).cumsum(-1)
        u = torch.tensor([torch.rand((), generator=s.generator).item() for s in seqs], dtype=cdf.dtype)
        # the first token whose cumulative mass exceeds u; a token of zero mass is never picked
        target = (u.to(device) * cdf[:, -1])[:, None]
        return torch.searchsorted(cdf, target, right=True).clamp_max(cdf.shape[-1] - 1)[:, 0].tolist()

    @staticmethod
    def prompt_logprobs(logits: torch.Tensor, seq: Sequence, first: int) -> None:
        """logits [n, V] at positions first..first+n-1 score prompt tokens first+1..first+n."""
        targets = torch.tensor(seq.token_ids[first + 1 : first + 1 + logits.shape[0]], device=logits.device)
        logp = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]
        seq.prompt_logprobs.extend(logp.tolist())
