"""Sampler: next tokens from logits, on the logits' device; greedy, temperature, min_p, top-k, top-p
(in that order, as vLLM's v1 sampler; the logits come processed: logits_processing.py); logprobs.

A sampled (temperature > 0) row draws by inverting its distribution's CDF at one uniform number. The
uniform is a counter-based hash of the request's two seed keys and the index of the token being
drawn (integer ops on the device), so a request's tokens depend only on its own logits, seed and
position: never on its neighbours in the batch, the step it ran in, or a preemption, and no
per-request generator, host round-trip or Python loop over the rows is needed. All sampled rows of a
step are scaled, cut and drawn together; which rows need a cut is read from host copies of the
parameters, so nothing waits for the device. bench/sampler_speed.py times it against transformers'.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_MASK32 = 0xFFFFFFFF


def to_device(x: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on `device` without making the host wait: the tensor itself on the CPU, else a
    pinned copy sent asynchronously (the pinned block is reused only after the copy ran)."""
    t = torch.from_numpy(np.ascontiguousarray(x))
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class SamplingRows:
    """Per logits row: host copies of the parameters (which rows need which work) and device tensors
    for the math. temperature 0 = greedy; top_k 0 = off; min_p 0 = off; counter = index of the token
    being drawn (0 for a request's first generated token)."""

    temperature: np.ndarray  # float32 [N]
    top_k: np.ndarray  # int64 [N]
    top_p: np.ndarray  # float32 [N]
    fparams: torch.Tensor  # float32 [N, 3]: temperature, top_p, min_p
    iparams: torch.Tensor  # int64 [N, 3]: top_k, key0, key1 (32-bit seed keys)
    counter: torch.Tensor  # int64 [N]
    min_p: np.ndarray  # float32 [N]

    @classmethod
    def from_host(cls, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray, keys: np.ndarray,
                  counter: np.ndarray, device: torch.device, min_p: np.ndarray | None = None) -> SamplingRows:  # fmt: skip
        """From host arrays (keys int64 [N, 2]); the engine gathers its device copies instead."""
        min_p = np.zeros_like(temperature, np.float32) if min_p is None else min_p.astype(np.float32)
        f = np.stack([temperature, top_p, min_p], axis=1).astype(np.float32)
        i = np.concatenate([top_k[:, None], keys], axis=1).astype(np.int64)
        return cls(temperature.astype(np.float32), top_k.astype(np.int64), top_p.astype(np.float32),
                   to_device(f, device), to_device(i, device), to_device(counter.astype(np.int64), device), min_p)  # fmt: skip


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32) held in int64, without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _MASK32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finalizer (a bijection with full avalanche), in int64 arithmetic."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def uniforms(key0: torch.Tensor, key1: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """float32 in [0, 1) per row, 24 random bits each: a hash of (key0, key1, counter)."""
    h = _fmix32(key0 ^ _fmix32((counter + key1) & _MASK32))
    h = _fmix32(h ^ key1)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


def _top_p(sorted_logits: torch.Tensor, top_p: torch.Tensor, cut: bool) -> torch.Tensor:
    """Rows sorted descending: -inf where the mass strictly before a token already reaches the row's
    top_p (so >= 1 token stays); rows with top_p 1 keep everything. cut False: no row cuts."""
    if not cut:
        return sorted_logits
    probs = sorted_logits.softmax(-1)
    limit = torch.where(top_p < 1.0, top_p, torch.full_like(top_p, float("inf")))
    return sorted_logits.masked_fill((probs.cumsum(-1) - probs) >= limit[:, None], float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """logits [N, V] (temperature-scaled), min_p [N] -> tokens whose probability is below min_p times
    the row's top probability at -inf (min_p 0 keeps every token)."""
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < min_p[:, None] * probs.amax(-1, keepdim=True), float("-inf"))


def _filter(logits: torch.Tensor, rows: SamplingRows, drawn: np.ndarray) -> torch.Tensor:
    """logits [N, V] (temperature-scaled; row i is rows[drawn[i]]) with each row's tokens outside its
    top-k / top-p at -inf. Rows with a top-k cut apply top-p to their k best only (no full sort)."""
    vocab = logits.shape[-1]
    device = logits.device
    if (rows.min_p[drawn] > 0).any():
        logits = apply_min_p(logits, rows.fparams[:, 2].index_select(0, to_device(drawn, device)))
    top_k, top_p = rows.top_k[drawn], rows.top_p[drawn]
    k_rows = np.flatnonzero((top_k > 0) & (top_k < vocab))
    if k_rows.size:
        idx = to_device(k_rows, device)
        src = to_device(drawn[k_rows], device)
        sub = logits.index_select(0, idx)
        values, index = torch.topk(sub, int(top_k[k_rows].max()), dim=-1)  # sorted, descending
        ks = rows.iparams[:, 0].index_select(0, src)
        values = values.masked_fill(torch.arange(values.shape[1], device=device)[None, :] >= ks[:, None],
                                    float("-inf"))  # fmt: skip
        values = _top_p(values, rows.fparams[:, 1].index_select(0, src), bool((top_p[k_rows] < 1.0).any()))
        logits = logits.index_copy(0, idx, torch.full_like(sub, float("-inf")).scatter(1, index, values))
    p_rows = np.flatnonzero((top_p < 1.0) & ~((top_k > 0) & (top_k < vocab)))
    if p_rows.size:
        idx = to_device(p_rows, device)
        sub = logits.index_select(0, idx)
        ordered, order = torch.sort(sub, dim=-1, descending=True)
        cut = _top_p(ordered, rows.fparams[:, 1].index_select(0, to_device(drawn[p_rows], device)), True)
        logits = logits.index_copy(0, idx, sub.scatter(1, order, cut))
    return logits


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax, int64 [N] (the first maximum). On the CPU through numpy: torch's fp32 argmax
    there is the slower of the two on a step's rows, and both return the first maximum."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous():
        return torch.from_numpy(logits.numpy().argmax(-1).astype(np.int64))
    return logits.argmax(-1)


class Sampler:
    def sample(self, logits: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
        """logits fp32 [N, V], row i sampled with rows[i]'s parameters -> token ids int64 [N] on the
        logits' device. Never waits for the device."""
        picked = greedy(logits)
        drawn = np.flatnonzero(rows.temperature > 0)
        if drawn.size:
            device = logits.device
            idx = to_device(drawn, device) if drawn.size < logits.shape[0] else None
            sub = logits if idx is None else logits.index_select(0, idx)
            fp = rows.fparams if idx is None else rows.fparams.index_select(0, idx)
            ip = rows.iparams if idx is None else rows.iparams.index_select(0, idx)
            counter = rows.counter if idx is None else rows.counter.index_select(0, idx)
            cut = _filter(sub / fp[:, :1], rows, drawn)
            cdf = cut.softmax(-1).cumsum(-1)
            # the first token whose cumulative mass exceeds u; a token of zero mass is never picked
            target = (uniforms(ip[:, 1], ip[:, 2], counter) * cdf[:, -1])[:, None]
            tokens = torch.searchsorted(cdf, target, right=True).clamp_max(cdf.shape[-1] - 1)[:, 0]
            picked = tokens if idx is None else picked.index_copy(0, idx, tokens)
        return picked

    @staticmethod
    def logprobs(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """logits [N, V], the sampled tokens [N] -> (top-k values [N, k], top-k ids [N, k], the sampled
        tokens' logprobs [N]) of the unscaled distribution, on the logits' device."""
        logp = torch.log_softmax(logits, dim=-1)
        top = torch.topk(logp, k, dim=-1)
        return top.values, top.indices, logp.gather(1, tokens[:, None])[:, 0]

    @staticmethod
    def prompt_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """logits [n, V] at n prompt positions, targets [n] the tokens after them -> logprobs [n]."""
        return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]


def stop_hits(tokens: torch.Tensor, stop_ids: torch.Tensor) -> torch.Tensor:
    """tokens int64 [N], stop_ids int64 [N, S] (-1 padded: EOS unless ignored, plus stop ids) -> bool [N]."""
    return (stop_ids == tokens[:, None]).any(-1)
