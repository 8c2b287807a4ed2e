"""The engine's hot path on the CPU: the persistent batch's step inputs against a from-scratch rebuild
from the Sequence objects, under random joins, finishes and preemptions; overlapped steps, the static
padded decode buffers (what CUDA graphs replay) and mirrored device rows against the plain path."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from engine_oracle import VOCAB

import worker.engine.model_runner as model_runner
from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.backends.base import AttentionMetadata
from worker.engine.step_inputs import StepInputs, build_step

BS = 16
MODES = [
    {},
    {"overlap_steps": True},
    {"static_decode": True},
    {"overlap_steps": True, "static_decode": True, "mirror": True},
]


def _engine(path, mirror: bool = False, **config: object) -> Engine:
    engine = Engine.from_pretrained(path, EngineConfig(**config))
    if mirror:  # separate "device" tensors refreshed row by row, as on CUDA
        engine.runner.bind(engine.batch, mirror=True, static_decode=bool(engine.config.static_decode))
    return engine


def _workload(seed: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts sharing prefixes, greedy and sampled requests, stop ids that fire, logprobs, stop strings,
    n > 1 choices, penalties, min_p, min_tokens and logit_bias."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, VOCAB) for _ in range(70)]
    prompts, params = [], []
    for i in range(24):
        head = shared[: rng.choice([0, 16, 33, 70])]
        prompts.append(head + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 60))])
        max_tokens = rng.randrange(1, 40)
        params.append(SamplingParams(
            max_tokens=max_tokens,
            n=rng.choice([1, 1, 1, 2, 3]),
            repetition_penalty=rng.choice([1.0, 1.0, 1.3]),
            frequency_penalty=rng.choice([0.0, 0.0, 0.7]),
            min_p=rng.choice([0.0, 0.1]),
            min_tokens=rng.choice([0, 0, min(3, max_tokens)]),
            logit_bias={rng.randrange(3, VOCAB): 5.0} if i % 5 == 2 else {},
            temperature=rng.choice([0.0, 0.0, 0.8, 1.3]),
            top_k=rng.choice([0, 0, 5]),
            top_p=rng.choice([1.0, 0.9]),
            seed=rng.randrange(1 << 40) if i % 3 else None,
            stop_token_ids=[rng.randrange(3, VOCAB) for _ in range(rng.choice([0, 40]))],
            ignore_eos=rng.random() < 0.5,
            logprobs=2 if i % 7 == 0 else None,
            prompt_logprobs=i % 11 == 5,
            stop=["e"] if i % 9 == 4 else (),
        ))  # fmt: skip
    return prompts, params


def _rebuild(sched, batch) -> dict[str, list]:
    """The step's inputs from the Sequence objects alone (the algorithm before the persistent batch)."""
    ids, positions, slots, known = [], [], [], []
    pre_lens, pre_tables, dec_lens, dec_tables = [], [], [], []
    for c in sched.chunks:
        seq, lo, hi = c.seq, c.start, c.start + c.num_tokens
        ids.extend(seq.token_ids[lo:hi])
        known.extend([True] * c.num_tokens)
        positions.extend(range(lo, hi))
        slots.extend(-1 if p < seq.protected_len else seq.block_table[p // BS] * BS + p % BS for p in range(lo, hi))
        pre_lens.append(hi)
        pre_tables.append(seq.block_table[: -(-hi // BS)])
    for r in sched.decode_rows.tolist():
        seq = batch.seqs[r]
        p = seq.num_computed_tokens - 1  # the scheduler has counted this step's token
        ids.append(seq.token_ids[p] if p < len(seq.token_ids) else -1)  # -1: still on the device (overlap)
        known.append(p < len(seq.token_ids))
        positions.append(p)
        slots.append(-1 if p < seq.protected_len else seq.block_table[p // BS] * BS + p % BS)
        dec_lens.append(p + 1)
        dec_tables.append(seq.block_table[: p // BS + 1])
    return {"ids": ids, "known": known, "positions": positions, "slots": slots, "pre_lens": pre_lens,
            "pre_tables": pre_tables, "dec_lens": dec_lens, "dec_tables": dec_tables}  # fmt: skip


def _check_step(engine: Engine, sched, inputs: StepInputs) -> None:
    b, dev = engine.batch, engine.runner.rows
    want = _rebuild(sched, b)
    meta = inputs.meta
    assert inputs.positions.tolist() == want["positions"]
    assert meta.slot_mapping.tolist() == want["slots"]
    got_ids = inputs.input_ids.tolist()
    assert [g for g, k in zip(got_ids, want["known"], strict=True) if k] == [w for w in want["ids"] if w >= 0]
    if want["pre_lens"]:
        assert meta.prefill_context_lens.tolist() == want["pre_lens"]
        for row, table in zip(meta.prefill_block_tables.tolist(), want["pre_tables"], strict=True):
            assert row[: len(table)] == table
    if want["dec_lens"]:
        assert meta.decode_context_lens.tolist() == want["dec_lens"]
        for row, table in zip(meta.decode_block_tables.tolist(), want["dec_tables"], strict=True):
            assert row[: len(table)] == table
    active = np.flatnonzero(b.active)
    for r in active.tolist():  # every running row against its sequence; device copies against the host
        seq = b.seqs[r]
        b.check_row(seq)
        assert dev.block_table[r, : len(seq.block_table)].tolist() == seq.block_table
        assert dev.fparams[r].tolist() == pytest.approx([seq.params.temperature, seq.params.top_p, seq.params.min_p])
        assert dev.iparams[r, 0] == seq.params.top_k
    decoding = set(sched.decode_rows.tolist())
    for r in active.tolist():  # the decode set: every row past its prefill that has a token to compute
        total = int(b.num_tokens[r] + b.num_pending[r])
        if b.prefilling[r] or r in decoding:
            continue
        assert total == b.limit[r] or any(b.seqs[r] in (c.seq, *c.forks) for c in sched.chunks), f"row {r} skipped"


def _checked_generate(engine: Engine, prompts, params, monkeypatch) -> list:
    steps = []

    def build(sched, batch, dev):
        inputs = build_step(sched, batch, dev)
        _check_step(engine, sched, inputs)
        steps.append(sched.decode_rows.size)
        return inputs

    monkeypatch.setattr(model_runner, "build_step", build)
    outs = engine.generate(prompts, params)
    engine.block_manager.check_invariants([])
    assert engine.batch.num_active == 0 and not engine.scheduler.departed
    assert max(steps) > 1
    return outs


@pytest.mark.parametrize("seed", [0, 1])
def test_persistent_batch_matches_a_rebuild_under_joins_finishes_and_preemption(make_checkpoint, monkeypatch,
                                                                                seed: int) -> None:  # fmt: skip
    """Random requests (stop ids that fire, sampled and greedy rows, shared prefixes) through a cache
    of 16 blocks and 6 rows: every step's inputs equal a rebuild from the sequences, in every mode,
    and every mode produces the same outputs."""
    ckpt = make_checkpoint("llama")
    prompts, params = _workload(seed)
    results = []
    for modes in MODES:
        engine = _engine(ckpt.path, kv_cache_bytes=16 * 8192, max_num_seqs=6, max_num_batched_tokens=48, **modes)
        outs = _checked_generate(engine, prompts, params, monkeypatch)
        results.append(outs)
        assert engine.stats.preemptions > 0 and engine.stats.cached_tokens > 0
        assert {o.finish_reason for o in outs} == {"stop", "length"}
    for outs in results[1:]:  # the same tokens; logprobs to rounding (steps batch rows differently)
        for a, b in zip(results[0], outs, strict=True):
            assert a.prompt_logprobs == pytest.approx(b.prompt_logprobs, abs=1e-4)
            for x, y in zip(a.outputs, b.outputs, strict=True):
                assert (x.token_ids, x.finish_reason, x.text) == (y.token_ids, y.finish_reason, y.text)
                for u, w in zip(x.logprobs or [], y.logprobs or [], strict=True):
                    assert u.keys() == w.keys() and all(abs(u[t] - w[t]) < 1e-4 for t in u)


def test_overlapped_steps_drop_tokens_sampled_past_a_stop(make_checkpoint) -> None:
    """With overlap a sequence that stops on a token is scheduled once more before the host sees the
    token; that extra token is dropped and counted nowhere."""
    ckpt = make_checkpoint("llama")
    plain = _engine(ckpt.path, kv_cache_bytes=8 << 20)
    base = plain.generate([[5, 6, 7]], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    stop = SamplingParams(max_tokens=12, ignore_eos=True, stop_token_ids=[base.token_ids[4]])
    want = plain.generate([[5, 6, 7]], stop)[0]
    assert want.finish_reason == "stop" and len(want.token_ids) <= 5
    over = _engine(ckpt.path, kv_cache_bytes=8 << 20, overlap_steps=True)
    got = over.generate([[5, 6, 7]], stop)[0]
    assert got.token_ids == want.token_ids and got.finish_reason == "stop"
    assert over.stats.decode_tokens == len(want.token_ids)
    over.block_manager.check_invariants([])


@pytest.mark.parametrize("modes", MODES[1:])
def test_seeded_sampling_is_batch_independent_in_every_mode(make_checkpoint, modes: dict) -> None:
    ckpt = make_checkpoint("qwen3")
    params = SamplingParams(max_tokens=10, temperature=1.0, top_k=20, seed=11, ignore_eos=True)
    prompt = [9, 8, 7, 6, 5]
    alone = _engine(ckpt.path, kv_cache_bytes=8 << 20).generate([prompt], params)[0].token_ids
    engine = _engine(ckpt.path, kv_cache_bytes=8 << 20, **modes)
    others = [[3 + i] * (i + 2) for i in range(6)]
    mixed = [SamplingParams(max_tokens=3 + i, temperature=0.7 * (i % 2), seed=i) for i in range(6)]
    outs = engine.generate([*others[:3], prompt, *others[3:]], [*mixed[:3], params, *mixed[3:]])
    assert outs[3].token_ids == alone
    assert len(set(alone)) > 1  # really sampled


def test_static_decode_pads_to_the_captured_sizes(make_checkpoint) -> None:
    """Decode steps of 3 and 5 rows run on buffers padded to 4 and 8 with the plain path's tokens, and
    the padding rows (slot -1) store no K/V anywhere."""
    ckpt = make_checkpoint("llama")
    engine = _engine(ckpt.path, kv_cache_bytes=8 << 20, max_num_seqs=12, static_decode=True)
    graphs = engine.runner.graphs
    assert graphs.sizes == [1, 2, 4, 8, 12] and [graphs.padded(n) for n in (3, 5, 9)] == [4, 8, 12]
    plain = _engine(ckpt.path, kv_cache_bytes=8 << 20, max_num_seqs=12)
    for n in (3, 5):
        prompts = [[7 + i, 8, 9 + n] for i in range(n)]
        params = SamplingParams(max_tokens=6, ignore_eos=True)
        assert [o.token_ids for o in engine.generate(prompts, params)] == [
            o.token_ids for o in plain.generate(prompts, params)
        ]
    caches = engine.runner.kv_caches
    for k, v in caches:
        k.fill_(7.0)
        v.fill_(7.0)
    slots = torch.tensor([5 * BS + 2, 9 * BS, 3 * BS + 15])
    with torch.inference_mode():
        meta = AttentionMetadata(slot_mapping=slots, num_prefill_tokens=0,
                                 decode_context_lens=torch.tensor([3, 1, 16], dtype=torch.int32),
                                 decode_block_tables=torch.tensor([[5], [9], [3]], dtype=torch.int32))  # fmt: skip
        logits = graphs.run(torch.tensor([11, 12, 13]), torch.tensor([2, 0, 15]), meta)
    assert logits.shape == (3, VOCAB) and graphs.padded(3) == 4
    for k, v in caches:
        for cache in (k, v):
            changed = torch.nonzero((cache.flatten(0, 1) != 7.0).any(-1).any(-1)).flatten()
            assert changed.tolist() == sorted(slots.tolist())


def test_config_refuses_cuda_graphs_on_the_cpu() -> None:
    with pytest.raises(ValueError, match="cuda_graphs=True needs device='cuda'"):
        EngineConfig(cuda_graphs=True)
    cfg = EngineConfig()
    assert cfg.cuda_graphs is False and cfg.static_decode is False and cfg.overlap_steps is False
