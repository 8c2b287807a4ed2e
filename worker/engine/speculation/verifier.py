"""Verifier: a verify step's logits -> the tokens each speculating sequence keeps.

A verify chunk holds a sequence's newest token then its K proposed tokens d_1..d_K; the logits at its
position j give the target's distribution for the token after d_j (d_0 = the newest token). Each
position is processed and sampled exactly as a plain decode step of that token would be: counter
(the token's index, which seeds its uniform and gates min_tokens) = tokens generated before it, and
the penalties count d_1..d_j as generated (`extra`). Call t_j the token the target draws there.

Acceptance (deterministic proposers: prompt lookup, a greedy draft, i.e. q = one-hot at d_j): accept
d_{j+1} while t_j == d_{j+1}; the first t_j that differs (or t_K when all were accepted: the bonus
token) ends the run. Greedy rows keep exactly the argmax tokens. For a drawing row this is the
Leviathan / Chen rejection rule for a one-hot q: d is accepted with probability p(d), and a rejected
position yields t_j ~ p conditioned on t_j != d = norm(max(0, p - q)), the rule's residual. Because
t_j uses the same counter-based uniform as the plain step, a seeded row's tokens are the very tokens
it gets without speculation. Structured outputs: a constrained row's positions take the grammar's
masks along its draft before processing and sampling (the engine's mask phase, before verify:
StructuredOutputs.mask_runs, position j's mask = the grammar after d_1..d_j), so the target's own
token is masked like any sampled token, and its run is cut where the grammar stops accepting the
draft (`cuts`: RunCut.allowed; Speculator.plan already dropped the proposals the grammar refuses, so
this cut is a safeguard or a dead end).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from worker.engine.batch_state import PersistentBatch
from worker.engine.device_rows import DeviceRows
from worker.engine.logits_processing import LogitsProcessing
from worker.engine.sampler import Sampler, SamplingRows, to_device
from worker.engine.scheduler_output import ScheduledChunk
from worker.engine.sequence import Sequence
from worker.engine.structured_outputs import RunCut


@dataclass(slots=True, kw_only=True)
class SpecRun:
    """One verified sequence: `tokens` = its accepted proposals, then the target's own token."""

    seq: Sequence
    row: int
    proposed: int  # K
    tokens: list[int]
    logprobs: list[dict[int, float]] | None  # per token in `tokens`, when the request asked
    failure: str | None = None  # constrained: the last token's position was a dead end (it ends the row)

    @property
    def accepted(self) -> int:
        return len(self.tokens) - 1


class Verifier:
    def __init__(self, batch: PersistentBatch, dev: DeviceRows, processing: LogitsProcessing, sampler: Sampler) -> None:
        self.batch = batch
        self.dev = dev
        self.processing = processing
        self.sampler = sampler

    def verify(self, logits: torch.Tensor, chunks: tuple[ScheduledChunk, ...],
               cuts: dict[int, RunCut] | None = None) -> list[SpecRun]:  # fmt: skip
        """logits fp32 [M, V]: the chunks' rows in order (1 + K each; a constrained run's masked) -> one
        SpecRun per chunk (its logprobs: `logprobs`). Writes each row's newest token (host and device)
        and counts the kept tokens for the penalties. `cuts`: the constrained runs' (by index in
        chunks), from StructuredOutputs.mask_runs."""
        b, device = self.batch, self.dev.device
        cuts = cuts or {}
        row_list = [c.seq.row for c in chunks]  # (lists: a few runs, where numpy's per-call cost dominates)
        size_list = [c.num_tokens for c in chunks]
        start_list = [0, *itertools.accumulate(size_list)][:-1]
        rows = np.array(row_list, np.int64)
        sizes, starts = np.array(size_list, np.int64), np.array(start_list, np.int64)
        drawing = b.num_drawing and b.temperature[rows].any()
        processing = b.num_processed and b.processed[rows].any()
        penalized = None
        if device.type == "cpu" and not drawing and not processing:
            targets = logits.numpy().argmax(-1)
        else:
            per = np.repeat(rows, sizes)  # batch row of each logits row
            counter = np.repeat(b.num_tokens[rows] - b.num_prompt[rows], sizes) + np.arange(per.size) - np.repeat(starts, sizes)
            per_dev = to_device(per, device)
            params = SamplingRows(
                b.temperature[per], b.top_k[per], b.top_p[per], self.dev.fparams.index_select(0, per_dev),
                self.dev.iparams.index_select(0, per_dev), to_device(counter, device), b.min_p[per],
            )  # fmt: skip
            x = logits
            if processing:
                extra = self._proposal_counts(chunks, starts, logits) if b.penalized[rows].any() else None
                x, penalized = self.processing.apply(logits, per, counter, extra)
            targets = self.sampler.sample(x, params).cpu().numpy()
        runs = []
        targets = targets.tolist()
        for i, c in enumerate(chunks):
            t = targets[start_list[i] : start_list[i] + size_list[i]]
            a = 0
            cut = cuts.get(i)
            allowed = len(c.draft) if cut is None else cut.allowed  # how many proposals the grammar allows
            while a < allowed and t[a] == c.draft[a]:
                a += 1
            failed = cut.failure if cut is not None and a == cut.allowed else None
            runs.append(SpecRun(seq=c.seq, row=row_list[i], proposed=len(c.draft), tokens=t[: a + 1], logprobs=None,
                                failure=failed))
        last = np.array([r.tokens[-1] for r in runs], np.int64)
        b.last_token[rows] = last  # the next decode step's input
        if self.dev.copy:
            self.dev.last_token.index_copy_(0, to_device(rows, device), to_device(last, device))
        if penalized is not None:
            self._count(runs)
        return runs

    def _proposal_counts(self, chunks: tuple[ScheduledChunk, ...], starts: np.ndarray,
                         logits: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """float32 [M, V]: row starts[i] + j counts chunk i's proposals d_1..d_j (generated before it)."""
        at = np.concatenate([starts[i] + 1 + np.arange(len(c.draft)) for i, c in enumerate(chunks)])
        ids = np.concatenate([np.asarray(c.draft, np.int64) for c in chunks])
        device = logits.device
        marks = torch.zeros(logits.shape, dtype=torch.float32, device=device)
        marks[to_device(at, device), to_device(ids, device)] = 1.0
        total = marks.cumsum(0)  # minus the total before each chunk's first row (which has no mark)
        first = np.repeat(starts, [c.num_tokens for c in chunks])
        return total - total.index_select(0, to_device(first, device))

    def _count(self, runs: list[SpecRun]) -> None:
        """Count the kept tokens of the penalized rows (PenaltyCounts), like sampled tokens."""
        b, device = self.batch, self.dev.device
        kept = [r for r in runs if b.penalized[r.row]]
        if not kept:
            return
        slot_of = self.processing.counts.slot_of_row
        slots = np.concatenate([np.full(len(r.tokens), slot_of[r.row], np.int64) for r in kept])
        tokens = np.concatenate([np.asarray(r.tokens, np.int64) for r in kept])
        self.processing.counts.count(to_device(slots, device), to_device(tokens, device))

    def logprobs(self, logits: torch.Tensor, runs: list[SpecRun]) -> None:
        """SpecRun.logprobs of the raw distribution (`logits` [M, V], before any mask) at each kept
        token's position (as plain decode), for the runs whose requests asked."""
        ks = self.batch.logprobs_k
        if not self.batch.num_special or not (ks[[r.row for r in runs]] >= 0).any():
            return
        want = [i for i, r in enumerate(runs) if ks[r.row] >= 0]
        starts = [0, *itertools.accumulate(1 + r.proposed for r in runs)][:-1]
        at = np.concatenate([starts[i] + np.arange(len(runs[i].tokens)) for i in want])
        tokens = np.concatenate([np.asarray(runs[i].tokens, np.int64) for i in want])
        device = logits.device
        values, ids, chosen = self.sampler.logprobs(logits.index_select(0, to_device(at, device)),
                                                    to_device(tokens, device), int(ks[[runs[i].row for i in want]].max()))  # fmt: skip
        values, ids, chosen = values.cpu().tolist(), ids.cpu().tolist(), chosen.cpu().tolist()
        j = 0
        for i in want:
            run, k = runs[i], int(ks[runs[i].row])
            run.logprobs = []
            for token in run.tokens:
                entry = dict(zip(ids[j][:k], values[j][:k], strict=True))
                entry[token] = chosen[j]
                run.logprobs.append(entry)
                j += 1
