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

from dataclasses import dataclass

import numpy as np
import torch

from worker.engine.backends.base import AttentionMetadata
from worker.engine.batch_state import PersistentBatch
from worker.engine.device_rows import DeviceRows
from worker.engine.kv_groups import metadata
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


def decode_tables(table: torch.Tensor, rows: np.ndarray, rows_dev: torch.Tensor | None, width: int) -> torch.Tensor:
    """The decode rows' block tables [D, width] from one group's mirrored table on the device: a view
    when the rows are consecutive (a packed batch: no copy), else a gathered copy (rows_dev: the rows
    on the device, None: not sent yet)."""
    first = int(rows[0])
    if int(rows[-1]) - first + 1 == rows.size:
        return table[first : first + rows.size, :width]
    return table.index_select(0, to_device(rows, table.device) if rows_dev is None else rows_dev)[:, :width]


def _gather(dev: DeviceRows, name: str, rows: np.ndarray, width: int) -> torch.Tensor:
    """The block tables [M, width] of `rows` (any order, repeats allowed: a verify run's rows) in the
    group table `name`, gathered on the host when the device's table is the host's array (a few us;
    torch's gather takes ~30)."""
    if not dev.copy:
        return torch.from_numpy(getattr(dev.batch, name)[rows, :width])
    return getattr(dev, name).index_select(0, to_device(rows, dev.device))[:, :width]


def _row_slots(table: np.ndarray, batch: PersistentBatch, rows: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Decode rows' slots in one group's table; -1 below the protected (cached) positions."""
    bs = batch.block_size
    slots = table.reshape(-1).take(rows * table.shape[1] + pos // bs).astype(np.int64) * bs + pos % bs
    slots[pos < batch.protected[rows]] = -1
    return slots


def _chunk_slots(table: list[int], protected: int, lo: int, hi: int, bs: int) -> list[int]:
    """Slots of a chunk's positions [lo, hi) in one group's block table; -1 below `protected`."""
    return [-1 if p < protected else table[p // bs] * bs + p % bs for p in range(lo, hi)]


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
    bs, device = batch.block_size, dev.device
    rows, pos = sched.decode_rows, sched.decode_positions
    at = batch.span(rows)
    width = int(pos.max()) // bs + 1
    protected = pos < batch.protected[at]  # a fully cached prompt recomputes its last token: no store
    below = protected.any()
    # consecutive rows: views, no copy; where the device's arrays are the host's (not dev.copy) the
    # numpy arrays are sliced and wrapped, a few us less than slicing the torch views
    viewed = isinstance(at, slice)
    if viewed:
        ids, rows_dev = dev.last_token[at] if dev.copy else torch.from_numpy(batch.last_token[at]), None
    else:
        rows_dev = to_device(rows, device)
        ids = dev.last_token.index_select(0, rows_dev)
    lens = to_device((pos + 1).astype(np.int32), device)
    block, offset = pos // bs, pos % bs
    metas = []
    for g in batch.groups:
        host = getattr(batch, g.table)
        slots = host[rows, block].astype(np.int64) * bs + offset
        if below:
            slots[protected] = -1
        if not viewed:
            tables = decode_tables(getattr(dev, g.table), rows, rows_dev, width)
        else:
            tables = getattr(dev, g.table)[at, :width] if dev.copy else torch.from_numpy(host[at, :width])
        metas.append(AttentionMetadata(slot_mapping=to_device(slots, device), num_prefill_tokens=0,
                                       decode_context_lens=lens, decode_block_tables=tables))  # fmt: skip
    return StepInputs(input_ids=ids, positions=to_device(pos, device), meta=metadata(metas), logit_rows=None,
                      sample_rows=rows, sample_rows_ascending=True, prompt=[], num_prefill_tokens=0, decode_rows=rows,
                      decode_positions=pos)  # fmt: skip


def _with_verify(sched: SchedulerOutput, batch: PersistentBatch, dev: DeviceRows) -> StepInputs:
    """A pure decode step whose last rows are verify runs (see the module docstring)."""
    bs, device, d = batch.block_size, dev.device, sched.decode_rows.size
    vrows, vpos, vids = verify_rows(sched)
    rows = np.concatenate([sched.decode_rows, vrows]) if d else vrows
    pos = np.concatenate([sched.decode_positions, vpos]) if d else vpos
    ids = to_device(vids, device)
    if d:
        ids = torch.cat([dev.last_token.index_select(0, to_device(sched.decode_rows, device)), ids])
    width = int(pos.max()) // bs + 1
    lens = to_device((pos + 1).astype(np.int32), device)
    metas = [AttentionMetadata(
        slot_mapping=to_device(_row_slots(getattr(batch, g.table), batch, rows, pos), device), num_prefill_tokens=0,
        decode_context_lens=lens, decode_block_tables=_gather(dev, g.table, rows, width),
    ) for g in batch.groups]  # fmt: skip
    return StepInputs(input_ids=ids, positions=to_device(pos, device), meta=metadata(metas), logit_rows=None,
                      sample_rows=sched.decode_rows, sample_rows_ascending=True, prompt=[], num_prefill_tokens=0,
                      decode_rows=sched.decode_rows, decode_positions=sched.decode_positions, spec=tuple(sched.spec),
                      num_spec_logits=vrows.size)  # fmt: skip


def build_step(sched: SchedulerOutput, batch: PersistentBatch, dev: DeviceRows) -> StepInputs:
    if not sched.chunks:
        return decode_step(sched, batch, dev)
    device, bs = dev.device, batch.block_size
    ids: list[int] = []
    positions: list[int] = []
    cu, lens = [0], []
    prompt_hidden: list[int] = []  # hidden rows of prompt-logprob positions
    prompt: list[PromptScores] = []
    sample_hidden: list[int] = []
    sample_rows: list[int] = []
    prompt_chunks: list[int] = []  # the chunk of each prompt / sample hidden row
    sample_chunks: list[int] = []
    for i, c in enumerate(sched.chunks):
        seq, lo, hi = c.seq, c.start, c.start + c.num_tokens
        row0 = len(ids)
        ids.extend(seq.token_ids[lo:hi])
        positions.extend(range(lo, hi))
        cu.append(cu[-1] + c.num_tokens)
        lens.append(hi)
        if c.prompt_end > c.prompt_first:
            count = c.prompt_end - c.prompt_first
            prompt.append(PromptScores(seq=seq, first=c.prompt_first, offset=len(prompt_hidden), count=count))
            prompt_hidden.extend(range(row0 + c.prompt_first - lo, row0 + c.prompt_end - lo))
            prompt_chunks.extend([i] * count)
        if c.samples:  # the chunk's last logits, once per choice sampled from them (forks: n > 1)
            for s in (seq, *c.forks):
                sample_hidden.append(row0 + c.num_tokens - 1)
                sample_chunks.append(i)
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
    all_pos = np.concatenate([np.asarray(positions, np.int64), pos])
    input_ids = to_device(np.asarray(ids, np.int64), device)
    shared: dict = {  # every group's metadata but the slots and block tables
        "num_prefill_tokens": num_prefill,  # > 0: there are chunks
        "prefill_cu_seqlens_q": to_device(np.asarray(cu, np.int32), device),
        "prefill_context_lens": to_device(np.asarray(lens, np.int32), device),
    }
    width = int(pos.max()) // bs + 1 if num_decode else 0
    rows_dev = None
    if num_decode:
        rows_dev = to_device(rows, device)
        shared["decode_context_lens"] = to_device((pos + 1).astype(np.int32), device)
        if vids is None:
            input_ids = torch.cat([input_ids, dev.last_token.index_select(0, rows_dev)])
        else:
            plain = sched.decode_rows.size
            input_ids = torch.cat([input_ids, dev.last_token.index_select(0, rows_dev[:plain]), to_device(vids, device)])
    logit_hidden = prompt_hidden + sample_hidden  # then the decode rows
    total = num_prefill + num_decode
    logit_rows = None
    keep = None
    if len(logit_hidden) < num_prefill:  # some rows need no logits: the last layer skips them
        keep = np.concatenate([np.asarray(logit_hidden, np.int64), np.arange(num_prefill, total)])
        shared["output_rows"] = to_device(keep, device)
        if keep.size:
            shared["output_context_lens"] = to_device((all_pos[keep] + 1).astype(np.int32), device)
    elif prompt_hidden or forked or len(logit_hidden) + num_decode < total:  # a subset, or rows repeated
        logit_rows = to_device(np.concatenate([np.asarray(logit_hidden, np.int64), np.arange(num_prefill, total)]),
                               device)  # fmt: skip
    metas = []
    for g in batch.groups:  # the slots and block tables of each KV cache group (kv_groups.py)
        slots: list[int] = []
        tables: list[list[int]] = []
        for c in sched.chunks:
            table, hi = g.blocks(c.seq), c.start + c.num_tokens
            slots.extend(_chunk_slots(table, c.seq.protected_len, c.start, hi, bs))
            tables.append(table[: -(-hi // bs)])
        fields: dict = {"prefill_block_tables": to_device(_pad(tables, max(len(t) for t in tables)), device)}
        host = getattr(batch, g.table)
        all_slots = np.asarray(slots, np.int64)
        if num_decode:
            all_slots = np.concatenate([all_slots, _row_slots(host, batch, rows, pos)])
            fields["decode_block_tables"] = (decode_tables(getattr(dev, g.table), rows, rows_dev, width) if vids is None
                                             else getattr(dev, g.table).index_select(0, rows_dev)[:, :width])  # fmt: skip
        if keep is not None and keep.size:
            chunk_tables = [tables[i] for i in prompt_chunks + sample_chunks]
            out_width = max([len(t) for t in chunk_tables] + [width])
            keep_tables = _pad(chunk_tables, out_width)
            if num_decode:
                keep_tables = np.concatenate([keep_tables, host[rows, :out_width]])
            fields["output_block_tables"] = to_device(keep_tables, device)
        metas.append(AttentionMetadata(slot_mapping=to_device(all_slots, device), **shared, **fields))
    rope = all_pos
    if any(c.seq.rope_offset for c in sched.chunks):  # LongRoPE prompts past the threshold (module docstring)
        offsets = np.repeat([c.seq.rope_offset for c in sched.chunks], [c.num_tokens for c in sched.chunks])
        rope = all_pos + np.concatenate([offsets, np.zeros(num_decode, np.int64)])
    return StepInputs(input_ids=input_ids, positions=to_device(rope, device), meta=metadata(metas), logit_rows=logit_rows,
                      sample_rows=all_sample_rows, sample_rows_ascending=not sample_rows, prompt=prompt,
                      num_prefill_tokens=num_prefill, decode_rows=sched.decode_rows,
                      decode_positions=sched.decode_positions, spec=tuple(sched.spec),
                      num_spec_logits=0 if vids is None else vids.size)  # fmt: skip
