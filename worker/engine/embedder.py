"""Embedder: embedding requests through the engine's ModelRunner and attention backends, prefill only.

A forward takes whole sequences, in request order, while the step's token budget
(max_num_batched_tokens), its row limit (max_num_seqs) and the free KV blocks allow; a sequence longer
than the budget runs alone, chunk by chunk (its earlier chunks' K/V stay in its blocks until the
last chunk, as far as a sliding window still reads them). Inputs are flat (varlen, no padding): a sequence's last token is simply its final row.

KV: each sequence gets fresh blocks from the engine's BlockManager, with no hash, for its first
forward's tokens; a long one grows chunk by chunk, first releasing the blocks its window has left
(BlockManager.release_behind, as the scheduler does: a windowed pool then holds at most
blocks_needed(...) of them, whatever the input's length). Nothing enters the prefix cache and nothing
is read from it; the blocks are freed once the sequence is pooled, so no KV outlives its batch.
(Taking a block may evict an unreferenced cached block, as any allocation can.) They are freed before
the batch's outputs are yielded: a stream paused between outputs, closed or garbage collected holds
no block, so a generate may run to its end meanwhile; a forward due while a generate stream is
unfinished (its sequences hold blocks the embedder's admission does not count on) raises instead.

Pooling (contracts/checkpoint/pooling.py) reads the final hidden states after the model's norm, never the
lm_head: for `lasttoken` / `cls` the last layer runs only the one row per sequence it needs
(AttentionMetadata.output_rows, as generation does for its logits rows); for `mean` every row,
summed per sequence on the device. Truncation and normalization follow.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np
import torch

from contracts.checkpoint.pooling import PoolingConfig
from contracts.sampling import SamplingParams
from worker.engine.backends.base import AttentionMetadata
from worker.engine.block_manager import BlockManager
from worker.engine.kv_groups import metadata
from worker.engine.model_runner import ModelRunner
from worker.engine.sampler import to_device
from worker.engine.sequence import Sequence
from worker.engine.stats import EngineStats

_PARAMS = SamplingParams(max_tokens=1)  # a Sequence needs one; nothing is sampled


@dataclass(frozen=True)
class EmbeddingOutput:
    """One prompt's embedding (float32 [dimensions or hidden size]), or why it has none."""

    index: int  # position in the caller's prompt list
    embedding: np.ndarray | None
    prompt_tokens: int
    error: str | None = None


@dataclass
class _Pending:
    index: int
    seq: Sequence
    dimensions: int | None
    computed: int = 0  # tokens run so far
    acc: torch.Tensor | None = None  # fp32 [H]: the running sum (mean) or the pooled row

    @property
    def num_tokens(self) -> int:
        return self.seq.num_tokens


class Embedder:
    def __init__(self, runner: ModelRunner, block_manager: BlockManager, pooling: PoolingConfig,
                 max_tokens: int, max_seqs: int, stats: EngineStats, generating: Callable[[], bool]) -> None:  # fmt: skip
        self.runner = runner
        self.bm = block_manager
        self.pooling = pooling
        self.max_tokens = max_tokens  # token budget of one forward
        self.max_seqs = max_seqs
        self.stats = stats
        self.generating = generating  # True while a generate stream of the engine is unfinished

    def run(self, requests: list[tuple[int, list[int], int | None]], should_stop: Callable[[], bool] | None = None,
            errors: Seq[EmbeddingOutput] = ()) -> Generator[EmbeddingOutput, None, None]:  # fmt: skip
        """`errors` (bad prompts' outputs) first, then (index, token ids, dimensions) of valid requests ->
        their outputs, a forward's worth at a time. should_stop() is checked before each forward; once True the generator returns. Raises
        RuntimeError when a forward is due while a generate stream is unfinished (its blocks are held)."""
        yield from errors
        queue = deque(_Pending(i, Sequence(i, i, ids, _PARAMS, 0), d) for i, ids, d in requests)
        while queue:
            if should_stop is not None and should_stop():
                return
            head = queue[0]
            why = self.bm.never_fits(head.num_tokens, self.max_tokens)  # as the scheduler's admission
            if why is not None:
                queue.popleft()
                yield EmbeddingOutput(head.index, None, head.num_tokens,
                                      f"prompt has {head.num_tokens} tokens and {why}; shorten it or raise kv_cache_bytes")  # fmt: skip
                continue
            if self.generating():
                raise RuntimeError(
                    "a generate stream was started on this engine while this embed_stream was partly read, "
                    "and it is unfinished; finish or close that stream before reading more embeddings")
            batch = self._admit(queue)
            try:
                if len(batch) == 1 and head.num_tokens > self.max_tokens:
                    while head.computed < head.num_tokens:
                        if should_stop is not None and should_stop():
                            return
                        lo, hi = head.computed, min(head.num_tokens, head.computed + self.max_tokens)
                        self._grow(head.seq, lo, hi)
                        self._forward([(head, lo, hi)])
                else:
                    self._forward([(p, 0, p.num_tokens) for p in batch])
                outs = self._finish(batch)
            finally:  # before any yield: a paused or abandoned stream holds no KV block
                for p in batch:
                    self.bm.free(p.seq)
            yield from outs

    def _admit(self, queue: deque[_Pending]) -> list[_Pending]:
        """Pop and allocate the next forward's sequences (at least one: the head fits the cache)."""
        batch: list[_Pending] = []
        tokens = 0
        while queue and len(batch) < self.max_seqs:
            p = queue[0]
            if batch and (tokens + p.num_tokens > self.max_tokens or not self.bm.can_allocate(p.seq, [])):
                break
            queue.popleft()
            # fresh blocks, no hashes (outside the prefix cache), for its first forward's tokens (_grow)
            self.bm.allocate(p.seq, [], [], min(p.num_tokens, self.max_tokens))
            self.stats.prompt_tokens += p.num_tokens
            batch.append(p)
            tokens += p.num_tokens
        return batch

    def _grow(self, seq: Sequence, lo: int, hi: int) -> None:
        """Before the chunk [lo, hi) of a long sequence: give back the blocks its window has left (the
        block manager's rule, as the scheduler's before growth; none without a window, and a model
        with two KV cache groups keeps its full layers' blocks), then hold blocks up to hi."""
        self.bm.release_behind(seq, lo)
        if not self.bm.append_slots(seq, hi):  # it runs alone and its need fits the pools (run)
            raise RuntimeError(f"no free KV block for positions {lo}..{hi - 1} of a sequence running alone")

    @torch.inference_mode()
    def _forward(self, chunks: list[tuple[_Pending, int, int]]) -> None:
        """Run positions [lo, hi) of each chunk's sequence in one forward; fold their rows into acc."""
        t0 = time.perf_counter()
        device, bs = self.runner.device, self.bm.block_size
        mode = self.pooling.mode
        ids: list[int] = []
        positions: list[np.ndarray] = []
        cu, lens = [0], []
        keep: list[int] = []  # lasttoken / cls: the hidden row each sequence needs in this forward
        keep_chunks: list[int] = []
        for c, (p, lo, hi) in enumerate(chunks):
            if (mode == "lasttoken" and hi == p.num_tokens) or (mode == "cls" and lo == 0):
                keep.append(len(ids) + (hi - lo - 1 if mode == "lasttoken" else 0))
                keep_chunks.append(c)
            ids.extend(p.seq.token_ids[lo:hi])
            positions.append(np.arange(lo, hi, dtype=np.int64) + self.runner.model.rope_offset(p.num_tokens))  # LongRoPE
            cu.append(len(ids))
            lens.append(hi)
        shared: dict = {  # every KV cache group's metadata but the slots and block tables
            "num_prefill_tokens": len(ids),
            "prefill_cu_seqlens_q": to_device(np.asarray(cu, np.int32), device),
            "prefill_context_lens": to_device(np.asarray(lens, np.int32), device),
        }
        if mode != "mean":  # the last layer attends and runs its MLP for the kept rows only
            shared.update(
                output_rows=to_device(np.asarray(keep, np.int64), device),
                # the kept row's position + 1: the whole chunk (last token) or 1 (cls, first chunk)
                output_context_lens=to_device(np.asarray([lens[c] if mode == "lasttoken" else 1 for c in keep_chunks],
                                                         np.int32), device),  # fmt: skip
            )
        metas = []
        for g in self.runner.groups:  # the slots and block tables of each KV cache group (kv_groups.py)
            slots, tables = [], []
            for p, lo, hi in chunks:
                table, pos = g.blocks(p.seq), np.arange(lo, hi, dtype=np.int64)
                slots.append(np.asarray(table, np.int64)[pos // bs] * bs + pos % bs)
                tables.append(table[: -(-hi // bs)])
            fields = {"prefill_block_tables": to_device(_pad(tables), device)}
            if mode != "mean":
                fields["output_block_tables"] = to_device(_pad([tables[c] for c in keep_chunks] or [[0]]), device)
            metas.append(AttentionMetadata(slot_mapping=to_device(np.concatenate(slots), device), **shared, **fields))
        meta = metadata(metas)
        hidden = self.runner.hidden_states(  # [T or len(keep), H]
            to_device(np.asarray(ids, np.int64), device), to_device(np.concatenate(positions), device), meta
        )
        if mode == "mean":
            seg = torch.repeat_interleave(torch.arange(len(chunks), device=device),  # no host read:
                                          to_device(np.diff(cu), device), output_size=len(ids))  # fmt: skip
            sums = hidden.new_zeros((len(chunks), hidden.shape[1]), dtype=torch.float32)
            sums.index_add_(0, seg, hidden.float())
            for (p, _, _), s in zip(chunks, sums, strict=True):
                p.acc = s if p.acc is None else p.acc + s
        else:
            for c, row in zip(keep_chunks, hidden.float(), strict=True):
                chunks[c][0].acc = row
        for p, _, hi in chunks:
            p.computed = hi
        self.stats.steps += 1
        self.stats.computed_prefill_tokens += len(ids)
        self.stats.add_busy(time.perf_counter() - t0, len(ids), 0)

    def _finish(self, batch: list[_Pending]) -> list[EmbeddingOutput]:
        """Pool, truncate and normalize the batch's sequences; one copy to the host."""
        t0 = time.perf_counter()
        vectors = []
        for p in batch:
            pooled = p.acc / p.num_tokens if self.pooling.mode == "mean" else p.acc
            vectors.append(_truncate_normalize(pooled, p.dimensions, self.pooling.normalize))
        host = [v.cpu().numpy() for v in vectors] if len(set(v.shape for v in vectors)) > 1 else list(
            torch.stack(vectors).cpu().numpy())  # fmt: skip
        self.stats.add_busy(time.perf_counter() - t0, 0, 0)  # waits for the device: prefill time
        return [EmbeddingOutput(p.index, np.ascontiguousarray(v, np.float32), p.num_tokens)
                for p, v in zip(batch, host, strict=True)]  # fmt: skip


def _truncate_normalize(pooled: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """Truncate to `dimensions` (None: all), then L2-normalize if the checkpoint has a Normalize
    module (PoolingConfig.normalize). [H] -> [d]."""
    out = pooled[:dimensions] if dimensions is not None else pooled
    if normalize:  # torch.nn.functional.normalize(out, dim=0): x / max(||x||, 1e-12)
        out = out / out.norm(p=2).clamp_min(1e-12)
    return out


def dimensions_per_prompt(dimensions: int | Seq[int | None] | None, n: int) -> list[int | None]:
    """`dimensions` for each of n prompts: one value for all, or a sequence of n."""
    if dimensions is None or isinstance(dimensions, int):
        return [dimensions] * n
    dims = list(dimensions)
    if len(dims) != n:
        raise ValueError(f"got {len(dims)} dimensions for {n} prompts; pass one or one each")
    return dims


def _pad(tables: list[list[int]]) -> np.ndarray:
    """Right-pad block tables with 0 (a valid block id; reads past a row's context are masked)."""
    out = np.zeros((len(tables), max(len(t) for t in tables)), np.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return out
