"""StepInputs: one step's flat (varlen) model inputs, attention metadata and logits plan.

Layout of the step's T tokens: the chunks of prefilling (or just admitted) sequences first, any
length, through prefill attention; then one token per decode row, through decode attention. The
prefill part is built in Python from the chunks (its work is proportional to its tokens); the decode
part with a few numpy operations over the PersistentBatch rows, whatever the batch size.

Logits rows: prompt-logprob rows of the chunks first, then the sampling rows (chunks that reach their
sequence's last token, then every decode row), so the sampled logits are one contiguous slice. A chunk
that forks choices (n > 1) has its last row repeated once per forked choice.

Speculation's verify runs (`sched.spec`: a sequence's newest token then its K proposed tokens) are
decode rows too, after the plain ones: row j of a run is a query at position start + j over the
sequence's own block table with context start + j + 1. Every row's K/V is stored before any row
attends (each layer), so the run is causal over its own tokens, and a verify step stays a pure decode
step (the CPU's decode stack, CUDA graphs). Their logits come last (`num_spec_logits`) and are not
in `sample_rows`: the verifier samples them.

`positions` go to the rotary only: a chunk token's position plus its sequence's rope_offset
(LongRoPE's all-long rows for a prompt past the threshold, models/rotary.py; 0 otherwise). Decode and
verify rows pass their position as it is: a long prompt's sequence decodes at positions >= its prompt
length - 1 >= the threshold, where both halves of the table hold the same long rows. Attention reads
the real positions, through the context lengths and slots.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from worker.engine.backends.base import AttentionMetadata
from worker.engine.batch_state import PersistentBatch
from worker.engine.device_rows import DeviceRows
from worker.engine.sampler import to_device
from worker.engine.scheduler_output import SchedulerOutput
from worker.engine.sequence import Sequence


@dataclass(frozen=True, kw_only=True)
class PromptScores:
    """Logits rows [offset, offset + count) score seq's prompt tokens first+1 .. first+count."""

    seq: Sequence
    first: int
    offset: int
    count: int


@dataclass(slots=True, kw_only=True)
class StepInputs:
    input_ids: torch.Tensor  # int64 [T] on the device
    positions: torch.Tensor  # int64 [T]: rotary rows (module docstring: position + rope_offset for chunks)
    meta: AttentionMetadata
    logit_rows: torch.Tensor | None  # int64 [N]: hidden rows that need logits; None: every row
    sample_rows: np.ndarray  # int64 [S]: batch row of each sampled logits row (the last S rows)
    sample_rows_ascending: bool  # only decode rows sample (they come ascending)
    prompt: list[PromptScores]
    num_prefill_tokens: int  # T - decode rows
    decode_rows: np.ndarray  # int64 [D]
    decode_positions: np.ndarray  # int64 [D]
    spec: tuple = ()  # sched.spec: the verify runs, in logits order
    num_spec_logits: int = 0  # their rows: the last ones, 1 + K per run


def _pad(tables: list[list[int]], width: int) -> np.ndarray:
    """Right-pad block tables with 0 (a valid block id; reads past a row's context are masked)."""
    out = np.zeros((len(tables), width), np.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return out


def decode_tables(dev: DeviceRows, rows: np.ndarray, rows_dev: torch.Tensor, width: int,
                  name: str = "block_table") -> torch.Tensor:  # fmt: skip
    """The decode rows' block tables [D, width] on the device (`name`: the local layers' with
    "local_table"): a view of the mirrored table when the rows are consecutive (a packed batch: no
    copy), else a gathered copy."""
    table = getattr(dev, name)
    first = int(rows[0])
    if int(rows[-1]) - first + 1 == rows.size:
        return table[first : first + rows.size, :width]
    return table.index_select(0, rows_dev)[:, :width]


def _gather(dev: DeviceRows, rows: np.ndarray, width: int, name: str = "block_table") -> torch.Tensor:
    """The block tables [M, width] of `rows` (any order, repeats allowed: a verify run's rows), gathered
    on the host when the device's table is the host's array (a few us; torch's gather takes ~30)."""
    if not dev.copy:
        return torch.from_numpy(getattr(dev.batch, name)[rows, :width])
    return getattr(dev, name).index_select(0, to_device(rows, dev.device))[:, :width]


def _row_slots(table: np.ndarray, batch: PersistentBatch, rows: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Decode rows' slots in one group's table; -1 below the protected (cached) positions."""
    bs = batch.block_size
    slots = table.reshape(-1).take(rows * table.shape[1] + pos // bs).astype(np.int64) * bs + pos % bs
    slots[pos < batch.protected[rows]] = -1
    return slots


def _local(meta: AttentionMetadata, slots: np.ndarray, device: torch.device, **tables: torch.Tensor) -> AttentionMetadata:
    """meta with the local layers' slots and block tables (a model with two KV cache groups)."""
    return dataclasses.replace(meta, slot_mapping=to_device(slots, device), scratch={}, **tables)


def verify_rows(sched: SchedulerOutput) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(batch row, position, input id) int64 [M] of every row of the verify runs (Python lists: a
    handful of runs of a few rows each, where numpy's per-call cost would dominate)."""
    rows: list[int] = []
    pos: list[int] = []
    ids: list[int] = []
    for c in sched.spec:
        lo, n = c.start, c.num_tokens
        rows += [c.seq.row] * n
        pos += range(lo, lo + n)
        ids.append(c.seq.token_ids[lo])
        ids += c.draft
    return np.array(rows, np.int64), np.array(pos, np.int64), np.array(ids, np.int64)


def decode_step(sched: SchedulerOutput, batch: PersistentBatch, dev: DeviceRows) -> StepInputs:
    """build_step for a step of decode rows only (the steady state): a handful of numpy operations,
    views instead of gathers when the rows are the first n."""
    if sched.spec:
        return _with_verify(sched, batch, dev)
    bs = batch.block_size
    rows, pos = sched.decode_rows, sched.decode_positions
    at = batch.span(rows)
    slots = batch.block_table[rows, pos // bs].astype(np.int64) * bs + pos % bs
    below = pos < batch.protected[at]  # a fully cached prompt recomputes its last token: no store
    if below.any():
        slots[below] = -1
    if isinstance(at, slice):
        ids = dev.last_token[at]
        tables = dev.block_table[at, : int(pos.max()) // bs + 1]
    else:
        rows_dev = to_device(rows, dev.device)
        ids = dev.last_token.index_select(0, rows_dev)
        tables = decode_tables(dev, rows, rows_dev, int(pos.max()) // bs + 1)
    meta = AttentionMetadata(
        slot_mapping=to_device(slots, dev.device), num_prefill_tokens=0,
        decode_context_lens=to_device((pos + 1).astype(np.int32), dev.device), decode_block_tables=tables,
    )  # fmt: skip
    if batch.local_table is not None:
        width = tables.shape[1]
        ltables = dev.local_table[at, :width] if isinstance(at, slice) else decode_tables(
            dev, rows, rows_dev, width, "local_table")  # fmt: skip
        meta = dataclasses.replace(meta, local=_local(meta, _row_slots(batch.local_table, batch, rows, pos), dev.device,
                                                      decode_block_tables=ltables))  # fmt: skip
    return StepInputs(input_ids=ids, positions=to_device(pos, dev.device), meta=meta, logit_rows=None, sample_rows=rows,
                      sample_rows_ascending=True, prompt=[], num_prefill_tokens=0, decode_rows=rows,
                      decode_positions=pos)  # fmt: skip


def _with_verify(sched: SchedulerOutput, batch: PersistentBatch, dev: DeviceRows) -> StepInputs:
    """A pure decode step whose last rows are verify runs (see the module docstring)."""
    bs, device, d = batch.block_size, dev.device, sched.decode_rows.size
    vrows, vpos, vids = verify_rows(sched)
    rows = np.concatenate([sched.decode_rows, vrows]) if d else vrows
    pos = np.concatenate([sched.decode_positions, vpos]) if d else vpos
    slots = _row_slots(batch.block_table, batch, rows, pos)
    ids = to_device(vids, device)
    if d:
        ids = torch.cat([dev.last_token.index_select(0, to_device(sched.decode_rows, device)), ids])
    width = int(pos.max()) // bs + 1
    meta = AttentionMetadata(
        slot_mapping=to_device(slots, device), num_prefill_tokens=0,
        decode_context_lens=to_device((pos + 1).astype(np.int32), device),
        decode_block_tables=_gather(dev, rows, width),
    )  # fmt: skip
    if batch.local_table is not None:
        meta = dataclasses.replace(meta, local=_local(meta, _row_slots(batch.local_table, batch, rows, pos), device,
                                                      decode_block_tables=_gather(dev, rows, width, "local_table")))  # fmt: skip
    return StepInputs(input_ids=ids, positions=to_device(pos, device), meta=meta, logit_rows=None,
                      sample_rows=sched.decode_rows, sample_rows_ascending=True, prompt=[], num_prefill_tokens=0,
                      decode_rows=sched.decode_rows, decode_positions=sched.decode_positions, spec=tuple(sched.spec),
                      num_spec_logits=vrows.size)  # fmt: skip


def build_step(sched: SchedulerOutput, batch: PersistentBatch, dev: DeviceRows) -> StepInputs:
    if not sched.chunks:
        return decode_step(sched, batch, dev)
    device, bs = dev.device, batch.block_size
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    cu, lens, tables = [0], [], []
    prompt_hidden: list[int] = []  # hidden rows of prompt-logprob positions
    prompt: list[PromptScores] = []
    sample_hidden: list[int] = []
    sample_rows: list[int] = []
    prompt_chunks: list[int] = []  # the chunk (index into tables) of each prompt / sample hidden row
    sample_chunks: list[int] = []
    grouped = batch.local_table is not None  # the local layers' slots and tables too (kv_groups.py)
    lslots: list[int] = []
    ltables: list[list[int]] = []
    for c in sched.chunks:
        seq, lo, hi = c.seq, c.start, c.start + c.num_tokens
        row0 = len(ids)
        ids.extend(seq.token_ids[lo:hi])
        positions.extend(range(lo, hi))
        table, protected = seq.block_table, seq.protected_len
        slots.extend(-1 if p < protected else table[p // bs] * bs + p % bs for p in range(lo, hi))
        cu.append(cu[-1] + c.num_tokens)
        lens.append(hi)
        tables.append(table[: -(-hi // bs)])
        if grouped:
            local = seq.local.block_table
            lslots.extend(-1 if p < protected else local[p // bs] * bs + p % bs for p in range(lo, hi))
            ltables.append(local[: -(-hi // bs)])
        if c.prompt_end > c.prompt_first:
            count = c.prompt_end - c.prompt_first
            prompt.append(PromptScores(seq=seq, first=c.prompt_first, offset=len(prompt_hidden), count=count))
            prompt_hidden.extend(range(row0 + c.prompt_first - lo, row0 + c.prompt_end - lo))
            prompt_chunks.extend([len(tables) - 1] * count)
        if c.samples:  # the chunk's last logits, once per choice sampled from them (forks: n > 1)
            for s in (seq, *c.forks):
                sample_hidden.append(row0 + c.num_tokens - 1)
                sample_chunks.append(len(tables) - 1)
                sample_rows.append(s.row)
    num_prefill = len(ids)
    forked = any(c.forks for c in sched.chunks)
    rows, pos = sched.decode_rows, sched.decode_positions
    all_sample_rows = np.concatenate([np.asarray(sample_rows, np.int64), rows])
    vids = None
    if sched.spec:  # verify runs: decode rows after the plain ones (module docstring)
        vrows, vpos, vids = verify_rows(sched)
        rows, pos = np.concatenate([rows, vrows]), np.concatenate([pos, vpos])
    num_decode = rows.size
    meta_args: dict = {
        "num_prefill_tokens": num_prefill,  # > 0: there are chunks
        "prefill_cu_seqlens_q": to_device(np.asarray(cu, np.int32), device),
        "prefill_context_lens": to_device(np.asarray(lens, np.int32), device),
        "prefill_block_tables": to_device(_pad(tables, max(len(t) for t in tables)), device),
    }
    all_pos = np.concatenate([np.asarray(positions, np.int64), pos])
    all_slots = np.asarray(slots, np.int64)
    local_slots = np.asarray(lslots, np.int64)
    local_args: dict = {"prefill_block_tables": to_device(_pad(ltables, max(len(t) for t in tables)), device)} if grouped else {}
    input_ids = to_device(np.asarray(ids, np.int64), device)
    if num_decode:
        dslots = _row_slots(batch.block_table, batch, rows, pos)
        rows_dev = to_device(rows, device)
        meta_args.update(
            decode_context_lens=to_device((pos + 1).astype(np.int32), device),
            decode_block_tables=decode_tables(dev, rows, rows_dev, int(pos.max()) // bs + 1) if vids is None
            else dev.block_table.index_select(0, rows_dev)[:, : int(pos.max()) // bs + 1],
        )
        all_slots = np.concatenate([all_slots, dslots])
        if grouped:
            local_slots = np.concatenate([local_slots, _row_slots(batch.local_table, batch, rows, pos)])
            width = meta_args["decode_block_tables"].shape[1]
            local_args["decode_block_tables"] = to_device(batch.local_table[rows, :width], device)
        if vids is None:
            input_ids = torch.cat([input_ids, dev.last_token.index_select(0, rows_dev)])
        else:
            plain = sched.decode_rows.size
            input_ids = torch.cat([input_ids, dev.last_token.index_select(0, rows_dev[:plain]), to_device(vids, device)])
    logit_hidden = prompt_hidden + sample_hidden  # then the decode rows
    total = num_prefill + num_decode
    logit_rows = None
    if len(logit_hidden) < num_prefill:  # some rows need no logits: the last layer skips them
        keep = np.concatenate([np.asarray(logit_hidden, np.int64), np.arange(num_prefill, total)])
        meta_args.update(output_rows=to_device(keep, device))
        if keep.size:
            chunk_tables = [tables[i] for i in prompt_chunks + sample_chunks]
            width = max([len(t) for t in chunk_tables] + [int(pos.max()) // bs + 1 if num_decode else 0])
            keep_tables = _pad(chunk_tables, width)
            if num_decode:
                keep_tables = np.concatenate([keep_tables, batch.block_table[rows, :width]])
            if grouped:
                keep_local = _pad([ltables[i] for i in prompt_chunks + sample_chunks], width)
                if num_decode:
                    keep_local = np.concatenate([keep_local, batch.local_table[rows, :width]])
                local_args["output_block_tables"] = to_device(keep_local, device)
            meta_args.update(
                output_context_lens=to_device((all_pos[keep] + 1).astype(np.int32), device),
                output_block_tables=to_device(keep_tables, device),
            )
    elif prompt_hidden or forked or len(logit_hidden) + num_decode < total:  # a subset, or rows repeated
        logit_rows = to_device(np.concatenate([np.asarray(logit_hidden, np.int64), np.arange(num_prefill, total)]),
                               device)  # fmt: skip
    meta = AttentionMetadata(slot_mapping=to_device(all_slots, device), **meta_args)
    if grouped:
        meta = dataclasses.replace(meta, local=_local(meta, local_slots, device, **local_args))
    rope = all_pos
    if any(c.seq.rope_offset for c in sched.chunks):  # LongRoPE prompts past the threshold (module docstring)
        offsets = np.repeat([c.seq.rope_offset for c in sched.chunks], [c.num_tokens for c in sched.chunks])
        rope = all_pos + np.concatenate([offsets, np.zeros(num_decode, np.int64)])
    return StepInputs(input_ids=input_ids, positions=to_device(rope, device), meta=meta, logit_rows=logit_rows,
                      sample_rows=all_sample_rows, sample_rows_ascending=not sample_rows, prompt=prompt,
                      num_prefill_tokens=num_prefill, decode_rows=sched.decode_rows,
                      decode_positions=sched.decode_positions, spec=tuple(sched.spec),
                      num_spec_logits=0 if vids is None else vids.size)  # fmt: skip

