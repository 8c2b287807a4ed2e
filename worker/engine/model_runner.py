"""ModelRunner: owns the model and the KV cache; turns a step's chunks into one varlen forward.

The step's tokens are flattened into [T] tensors (no padding): multi-token chunks first (prefill
attention over cu_seqlens), then one token per decoding sequence (paged decode attention). Logits
are computed only for rows that need them: the last row of each chunk that samples, and, for
prompt_logprobs requests, every prompt row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.engine.backends.base import AttentionMetadata
from worker.engine.models import CausalLM
from worker.engine.scheduler import ScheduledChunk


@dataclass(frozen=True)
class StepLogits:
    """logits fp32 [N, vocab]; sample_rows[i] is the row of chunk i's sampling logits (-1: none);
    prompt_rows[i] = (first prompt position scored, rows) for chunks that collect prompt logprobs."""

    logits: torch.Tensor
    sample_rows: list[int]
    prompt_rows: list[tuple[int, list[int]] | None]


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype) -> None:  # fmt: skip
        cfg = model.cfg
        self.model = model
        self.device = device
        self.block_size = block_size
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        # zeros, not empty: padded reads of never-written slots must stay finite (masked to 0 weight).
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.num_layers)
        ]

    @staticmethod
    def kv_bytes_per_block(model: CausalLM, block_size: int, dtype: torch.dtype) -> int:
        cfg = model.cfg
        return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize

    def _tensor(self, data: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype).to(self.device, non_blocking=True)

    @torch.inference_mode()
    def execute(self, chunks: list[ScheduledChunk]) -> StepLogits:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu = [0]
        pre_lens, pre_tables, dec_lens, dec_tables = [], [], [], []
        sample_rows: list[int] = []
        prompt_rows: list[tuple[int, list[int]] | None] = []
        logit_rows: list[int] = []
        logit_tables: list[list[int]] = []  # the block table of each logit row's sequence
        for c in chunks:
            seq, lo, hi = c.seq, c.start, c.start + c.num_tokens
            row0 = len(input_ids)
            input_ids.extend(seq.token_ids[lo:hi])
            positions.extend(range(lo, hi))
            table = seq.block_table
            for p in range(lo, hi):
                slots.append(-1 if p < seq.protected_len else table[p // bs] * bs + p % bs)
            if c.num_tokens > 1:
                cu.append(cu[-1] + c.num_tokens)
                pre_lens.append(hi)
                pre_tables.append(table[: -(-hi // bs)])
            else:
                dec_lens.append(hi)
                dec_tables.append(table[: -(-hi // bs)])
            # Prompt logprobs: position p's logits score token p+1, for p in [lo, hi) and p+1 < prompt.
            if seq.prompt_logprobs is not None and len(seq.prompt_logprobs) < seq.num_prompt_tokens:
                first = len(seq.prompt_logprobs) - 1  # position whose logits score the next missing token
                end = min(hi, seq.num_prompt_tokens - 1)
                if lo <= first < end:
                    prompt_rows.append((first, list(range(len(logit_rows), len(logit_rows) + end - first))))
                    logit_rows.extend(range(row0 + first - lo, row0 + end - lo))
                    logit_tables.extend([table] * (end - first))
                else:
                    prompt_rows.append(None)
            else:
                prompt_rows.append(None)
            if c.samples:
                sample_rows.append(len(logit_rows))
                logit_rows.append(row0 + c.num_tokens - 1)
                logit_tables.append(table)
            else:
                sample_rows.append(-1)

        rows_only = len(logit_rows) < len(input_ids)  # a prefill chunk: most rows need no logits
        meta = AttentionMetadata(
            slot_mapping=self._tensor(slots, torch.int64),
            num_prefill_tokens=cu[-1],
            prefill_cu_seqlens_q=self._tensor(cu, torch.int32) if pre_lens else None,
            prefill_context_lens=self._tensor(pre_lens, torch.int32) if pre_lens else None,
            prefill_block_tables=self._tensor(_pad(pre_tables), torch.int32) if pre_lens else None,
            decode_context_lens=self._tensor(dec_lens, torch.int32) if dec_lens else None,
            decode_block_tables=self._tensor(_pad(dec_tables), torch.int32) if dec_lens else None,
            **(self._output_rows(logit_rows, positions, logit_tables) if rows_only else {}),
        )
        hidden = self.model(
            self._tensor(input_ids, torch.int64), self._tensor(positions, torch.int64), meta, self.kv_caches
        )
        if not rows_only:  # every row came back: pick the logit rows
            hidden = hidden.index_select(0, self._tensor(logit_rows, torch.int64))
        logits = self.model.compute_logits(hidden) if logit_rows else hidden.new_empty(0)
        return StepLogits(logits, sample_rows, prompt_rows)

    def _output_rows(self, rows: list[int], positions: list[int], tables: list[list[int]]) -> dict:
        """AttentionMetadata's output_* fields: each kept row attends its sequence up to itself."""
        if not rows:
            return {"output_rows": self._tensor([], torch.int64)}
        bs = self.block_size
        lens = [positions[r] + 1 for r in rows]
        return {
            "output_rows": self._tensor(rows, torch.int64),
            "output_context_lens": self._tensor(lens, torch.int32),
            "output_block_tables": self._tensor(
                _pad([t[: -(-n // bs)] for t, n in zip(tables, lens, strict=True)]), torch.int32
            ),
        }


def _pad(tables: list[list[int]]) -> list[list[int]]:
    """Right-pad block tables with 0 (a valid block id; reads past context_lens are masked)."""
    width = max(len(t) for t in tables)
    return [t + [0] * (width - len(t)) for t in tables]
