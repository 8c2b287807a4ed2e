"""DecodeGraphs: pure-decode steps run on static, padded input buffers, as CUDA graphs on CUDA.

A decode step of n rows is padded to the next captured size (1, 2, 4, 8, then multiples of 8 up to
max_num_seqs): its inputs are copied into the first n rows of static buffers, the padding rows get
slot -1 (their K/V is stored nowhere), context length 1 and position 0, and the step's logits are
the first n rows of a static output. On CUDA each size is captured once at engine start as a graph
(one shared memory pool) and replayed, so a decode step is a handful of copies and one graph launch
instead of ~20 kernel launches per layer from Python. Without capture (the CPU, or cuda_graphs off
with static_decode on) the same padded buffers run eagerly: that is how the tests check, on the CPU,
that padding changes no token.
"""

from __future__ import annotations

import bisect
import time

import torch

from worker.engine.backends.base import AttentionMetadata
from worker.engine.kv_groups import kv_groups, metadata
from worker.engine.models import CausalLM


def graph_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 8 up to max_batch (max_batch itself always included)."""
    sizes = [s for s in (1, 2, 4) if s < max_batch] + list(range(8, max_batch, 8))
    return [*sizes, max_batch]


def activation_bytes(model: CausalLM, batch: int, dtype: torch.dtype) -> int:
    """A generous bound on one decode forward's live activations at `batch` rows (the graphs' shared
    pool holds about one of them): hidden, residual, qkv, attention, gate_up and logits, twice."""
    cfg = model.cfg
    per_row = 6 * cfg.hidden_size + 3 * cfg.intermediate_size + 2 * (cfg.q_size + 2 * cfg.kv_size)
    return 2 * batch * (per_row * dtype.itemsize + cfg.vocab_size * (dtype.itemsize + 4))


class DecodeGraphs:
    def __init__(self, model: CausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], max_batch: int,
                 max_blocks: int, device: torch.device) -> None:  # fmt: skip
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = graph_sizes(max_batch)
        top = self.sizes[-1]
        self.input_ids = torch.zeros(top, dtype=torch.int64, device=device)
        self.positions = torch.zeros(top, dtype=torch.int64, device=device)
        self.context_lens = torch.ones(top, dtype=torch.int32, device=device)
        # slots and block tables (valid ids only), one buffer per KV cache group (kv_groups.py)
        groups = kv_groups(model.kv_grouped)
        self.slots = [torch.full((top,), -1, dtype=torch.int64, device=device) for _ in groups]
        self.block_tables = [torch.zeros(top, max_blocks, dtype=torch.int32, device=device) for _ in groups]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def padded(self, n: int) -> int:
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def _forward(self, size: int) -> torch.Tensor:
        meta = metadata([AttentionMetadata(
            slot_mapping=slots[:size], num_prefill_tokens=0, decode_context_lens=self.context_lens[:size],
            decode_block_tables=tables[:size],
        ) for slots, tables in zip(self.slots, self.block_tables, strict=True)])  # fmt: skip
        hidden = self.model(self.input_ids[:size], self.positions[:size], meta, self.kv_caches)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> float:
        """Capture every size as a CUDA graph (largest first, one memory pool); returns seconds."""
        t0 = time.perf_counter()
        pool = None
        for size in reversed(self.sizes):
            for _ in range(2):  # warm-up: kernels compiled and autotuned, cuBLAS workspaces made
                self._forward(size)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """One decode step of n rows (`meta`: its decode metadata, a group's in each `local`) -> logits
        [n, V]."""
        n = input_ids.shape[0]
        size = self.padded(n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.context_lens[:n].copy_(meta.decode_context_lens)  # type: ignore[arg-type]
        group: AttentionMetadata | None = meta
        for slots, tables in zip(self.slots, self.block_tables, strict=True):
            slots[:n].copy_(group.slot_mapping)  # type: ignore[union-attr]
            block_tables = group.decode_block_tables  # type: ignore[union-attr]
            tables[:n, : block_tables.shape[1]].copy_(block_tables)
            group = group.local  # type: ignore[union-attr]
        if size > n:  # padding rows: stored nowhere, attend one (valid, ignored) key
            self.input_ids[n:size] = 0
            self.positions[n:size] = 0
            for slots in self.slots:
                slots[n:size] = -1
            self.context_lens[n:size] = 1
        graph = self.graphs.get(size)
        if graph is None:
            return self._forward(size)[:n]
        graph.replay()
        return self.outputs[size][:n]
