"""Logits processing against transformers' logits processors on the same logits: repetition penalty,
min_p, min_tokens, logit_bias (presence / frequency: OpenAI's formula, which transformers lacks),
alone and through the persistent batch for a step of mixed rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from contracts.sampling import SamplingParams
from worker.engine.batch_state import PersistentBatch
from worker.engine.device_rows import DeviceRows
from worker.engine.logits_processing import LogitsProcessing, add_bias, mask_tokens, penalize
from worker.engine.sampler import apply_min_p
from worker.engine.sequence import Sequence

V = 64
EOS = 2


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def _presence_frequency(logits: torch.Tensor, output: list[int], presence: float, frequency: float) -> torch.Tensor:
    """OpenAI's definition: mu[j] - c[j] * frequency - (c[j] > 0) * presence, over generated tokens."""
    counts = torch.bincount(torch.tensor(output, dtype=torch.int64), minlength=logits.shape[-1]).float()
    return logits - counts * frequency - (counts > 0).float() * presence


def test_repetition_penalty_matches_transformers() -> None:
    logits = _logits(3)
    ids = torch.tensor([[5, 6, 6, 9], [1, 2, 3, 4], [60, 0, 7, 60]])
    prompt = torch.zeros(3, V, dtype=torch.bool)
    prompt[torch.arange(3)[:, None], ids[:, :2]] = True  # first two: the prompt, the rest generated
    output = torch.zeros(3, V).scatter_add_(1, ids[:, 2:], torch.ones(3, 2))
    for penalty in (1.3, 0.7):
        pparams = torch.tensor([[0.0, 0.0, penalty]] * 3)
        want = RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
        assert torch.allclose(penalize(logits, prompt, output, pparams), want)
        assert torch.allclose(penalize(logits, prompt, output, pparams, additive=False), want)


def test_presence_and_frequency_penalties_count_generated_tokens_only() -> None:
    logits = _logits(2, 1)
    output_ids = [[4, 4, 4, 9], [11]]
    prompt = torch.zeros(2, V, dtype=torch.bool)
    prompt[:, 30] = True  # in the prompt only: untouched by presence / frequency
    output = torch.stack([torch.bincount(torch.tensor(o), minlength=V).float() for o in output_ids])
    pparams = torch.tensor([[0.5, 0.25, 1.0], [-1.5, 2.0, 1.0]])
    got = penalize(logits, prompt, output, pparams)
    for i, o in enumerate(output_ids):
        want = _presence_frequency(logits[i], o, *pparams[i, :2].tolist())
        assert torch.allclose(got[i], want)
    assert torch.equal(got[:, 30], logits[:, 30])
    assert torch.allclose(penalize(logits, None, output, pparams), got)  # no repetition penalty: no prompt


@pytest.mark.parametrize("min_p", [0.05, 0.3, 1.0])
def test_min_p_matches_transformers(min_p: float) -> None:
    logits = _logits(4, 2) / 0.7  # temperature-scaled, as the sampler applies it
    want = MinPLogitsWarper(min_p)(torch.zeros(4, 1, dtype=torch.int64), logits.clone())
    assert torch.equal(apply_min_p(logits, torch.full((4,), min_p)), want)
    assert torch.equal(apply_min_p(logits, torch.zeros(4)), logits)  # 0: off


def test_min_tokens_and_logit_bias_match_transformers() -> None:
    logits = _logits(2, 3)
    stops = torch.tensor([[EOS, 17, -1], [40, -1, -1]])
    want = torch.stack([
        MinNewTokensLengthLogitsProcessor(3, 5, [EOS, 17])(torch.zeros(1, 4, dtype=torch.int64), logits[:1].clone())[0],
        MinNewTokensLengthLogitsProcessor(3, 5, [40])(torch.zeros(1, 4, dtype=torch.int64), logits[1:].clone())[0],
    ])  # fmt: skip
    assert torch.equal(mask_tokens(logits, stops), want)
    bias = SequenceBiasLogitsProcessor([[[7], 4.5], [[9], -100.0]])
    ids, values = torch.tensor([[7, 9], [0, 0]]), torch.tensor([[4.5, -100.0], [0.0, 0.0]])  # row 1: padding
    got = add_bias(logits, ids, values)
    assert torch.allclose(got[0], bias(torch.zeros(1, 1, dtype=torch.int64), logits[:1].clone())[0])
    assert torch.equal(got[1], logits[1])


ROWS = [  # (prompt, generated so far, params): a step of mixed rows through the persistent batch
    ([5, 6, 7], [8, 8], SamplingParams(max_tokens=9, repetition_penalty=1.4, frequency_penalty=0.5)),
    ([9, 10], [], SamplingParams(max_tokens=9)),  # plain: untouched
    ([5, 11], [12], SamplingParams(max_tokens=9, min_tokens=3, stop_token_ids=(13,), logit_bias={EOS: 3.0, 20: -5.0})),
    ([3], [3, 4, 4], SamplingParams(max_tokens=9, presence_penalty=1.0, min_tokens=2, logit_bias={4: 1.0})),
    ([30, 31], [], SamplingParams(max_tokens=9, min_tokens=1, ignore_eos=True)),  # nothing to mask
]


def _oracle(logits: torch.Tensor, prompt: list[int], out: list[int], p: SamplingParams) -> torch.Tensor:
    """transformers' processors in vLLM's order, then the presence / frequency formula."""
    ids = torch.tensor([prompt + out])
    procs = LogitsProcessorList()
    stops = [*p.stop_token_ids, *(() if p.ignore_eos else (EOS,))]
    if p.min_tokens and stops:
        procs.append(MinNewTokensLengthLogitsProcessor(len(prompt), p.min_tokens, stops))
    if p.logit_bias:
        procs.append(SequenceBiasLogitsProcessor([[[t], b] for t, b in p.logit_bias]))
    if p.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(p.repetition_penalty))
    got = procs(ids, logits[None].clone())[0]
    return _presence_frequency(got, out, p.presence_penalty, p.frequency_penalty) if out else got


@pytest.mark.parametrize("mirror", [False, True])
def test_a_step_of_mixed_rows_matches_the_processors_row_by_row(mirror: bool) -> None:
    batch = PersistentBatch(8, 4, 16, frozenset({EOS}))
    for i, (prompt, out, p) in enumerate(ROWS):
        seq = Sequence(i, i, prompt, p, seed=i)
        seq.token_ids.extend(out)  # a recomputed sequence: its generated tokens come back in its counts
        batch.add(seq, 64)
    dev = DeviceRows(batch, torch.device("cpu"), copy=mirror)
    processing = LogitsProcessing(batch, dev, V)
    dev.sync()
    rows = np.array([3, 0, 1, 4, 2])  # any order
    counter = np.array([len(ROWS[r][1]) for r in rows])
    logits = _logits(len(rows), 4)
    got, penalized = processing.apply(logits, rows, counter)
    for i, r in enumerate(rows.tolist()):
        assert torch.allclose(got[i], _oracle(logits[i], *ROWS[r]), atol=1e-6), f"row {r}"
    assert torch.equal(got[rows.tolist().index(1)], logits[rows.tolist().index(1)])
    # after sampling, the penalized rows count their new token on the device
    tokens = torch.tensor([4, 8, 0, 0, 0])
    processing.count(penalized, tokens)
    counts = processing.counts
    assert counts.output[counts.slot_of_row[0], 8] == 3 and counts.output[counts.slot_of_row[3], 4] == 3
    assert counts.slot_of_row[1] == -1 and counts.capacity == 4  # only penalized rows hold counts


def test_penalty_slots_are_reused_after_a_row_leaves() -> None:
    batch = PersistentBatch(4, 4, 16, frozenset({EOS}))
    dev = DeviceRows(batch, torch.device("cpu"), copy=False)
    processing = LogitsProcessing(batch, dev, V)
    p = SamplingParams(max_tokens=4, presence_penalty=1.0)
    first = Sequence(0, 0, [1, 2], p, seed=0)
    first.token_ids.append(5)
    batch.add(first, 8)
    processing.counts.sync(batch)
    slot = processing.counts.slot_of_row[first.row]
    batch.remove(first)
    second = Sequence(1, 1, [3], p, seed=0)
    batch.add(second, 8)
    processing.counts.sync(batch)
    assert processing.counts.slot_of_row[second.row] == slot
    assert processing.counts.output[slot].sum() == 0 and processing.counts.prompt[slot].nonzero().flatten().tolist() == [3]


class _PresenceFrequency:
    """OpenAI's presence / frequency penalties as a transformers logits processor (it has none)."""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = input_ids[0, self.prompt_len :].tolist()
        return _presence_frequency(scores[0], out, self.presence, self.frequency)[None] if out else scores


@torch.no_grad()
def test_greedy_with_processors_matches_transformers_generate(make_checkpoint) -> None:
    """End to end: the engine's greedy tokens under repetition penalty, min_tokens, logit_bias and the
    presence / frequency penalties equal transformers' generate with the same processors."""
    from engine_oracle import VOCAB

    from worker.engine import Engine, EngineConfig

    ckpt = make_checkpoint("llama")
    engine = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=8 << 20))
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (12, 30, 7)]
    cases = [
        SamplingParams(max_tokens=16, repetition_penalty=1.8),
        SamplingParams(max_tokens=16, repetition_penalty=0.6),  # < 1 rewards repeats: a visible loop
        SamplingParams(max_tokens=10, min_tokens=6, logit_bias={EOS: 30.0, 99: 4.0}),
        SamplingParams(max_tokens=16, frequency_penalty=1.5, presence_penalty=0.5, repetition_penalty=1.1),
    ]
    plain = [o.token_ids for o in engine.generate(prompts, SamplingParams(max_tokens=16))]
    changed = 0
    for p in cases:
        outs = engine.generate(prompts, [p] * len(prompts))
        for prompt, out, base in zip(prompts, outs, plain, strict=True):
            procs = LogitsProcessorList()
            if p.presence_penalty or p.frequency_penalty:
                procs.append(_PresenceFrequency(len(prompt), p.presence_penalty, p.frequency_penalty))
            want = ckpt.model.generate(
                torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
                do_sample=False, max_new_tokens=p.max_tokens, min_new_tokens=p.min_tokens or None,
                repetition_penalty=p.repetition_penalty,
                sequence_bias={(t,): b for t, b in p.logit_bias} or None, logits_processor=procs,
                eos_token_id=EOS, pad_token_id=0,
            )[0, len(prompt) :].tolist()  # fmt: skip
            assert out.token_ids == want, p
            changed += out.token_ids != base[: len(out.token_ids)]
    assert changed >= 6  # the processors really changed the greedy continuations
