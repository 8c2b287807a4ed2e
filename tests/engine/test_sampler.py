"""Sampler on synthetic logits: greedy, top-k / top-p support, per-request seeded draws, logprobs."""

from __future__ import annotations

import torch

from worker.engine.sampler import Sampler
from worker.engine.sampling_params import SamplingParams
from worker.engine.sequence import Sequence

LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])


def _draws(params: SamplingParams, n: int = 300, seed: int = 0) -> list[int]:
    seq = Sequence(0, 0, [1], params, seed=seed)
    return [Sampler().sample(LOGITS, [seq])[0] for _ in range(n)]


def test_greedy_and_degenerate_cuts_pick_the_argmax() -> None:
    assert set(_draws(SamplingParams(), 5)) == {0}
    assert set(_draws(SamplingParams(temperature=1.0, top_k=1), 50)) == {0}
    assert set(_draws(SamplingParams(temperature=1.0, top_p=0.01), 50)) == {0}


def test_top_k_and_top_p_limit_the_support() -> None:
    assert set(_draws(SamplingParams(temperature=1.0, top_k=2))) == {0, 1}
    probs = LOGITS.softmax(-1)[0]  # 0.57, 0.21, 0.13, ...: top_p 0.7 keeps tokens 0 and 1 only
    assert probs[0] < 0.7 < probs[0] + probs[1]
    assert set(_draws(SamplingParams(temperature=1.0, top_p=0.7))) == {0, 1}
    assert len(set(_draws(SamplingParams(temperature=1.0)))) >= 4


def test_frequencies_follow_the_distribution() -> None:
    draws = _draws(SamplingParams(temperature=1.0), n=3000)
    freq = torch.bincount(torch.tensor(draws), minlength=6).float() / len(draws)
    assert torch.allclose(freq, LOGITS.softmax(-1)[0], atol=0.03)


def test_seeded_draws_repeat_and_differ_by_seed() -> None:
    p = SamplingParams(temperature=1.0)
    assert _draws(p, 40, seed=3) == _draws(p, 40, seed=3)
    assert _draws(p, 40, seed=3) != _draws(p, 40, seed=4)


def test_logprobs_top_k_plus_sampled_token() -> None:
    seq = Sequence(0, 0, [1], SamplingParams(temperature=1.0, logprobs=2), seed=0)
    for _ in range(20):
        token = Sampler().sample(LOGITS, [seq])[0]
        entry = seq.logprobs[-1]
        assert {0, 1} <= set(entry) and token in entry
        assert abs(entry[0] - float(LOGITS.log_softmax(-1)[0, 0])) < 1e-6


def test_a_batch_of_mixed_rows_draws_as_each_row_alone() -> None:
    """Sampled rows are cut and raced together; each still gets its own cut and its own noise."""
    params = [
        SamplingParams(temperature=1.0, top_k=2),
        SamplingParams(temperature=1.0, top_p=0.7),
        SamplingParams(temperature=0.5),
        SamplingParams(),  # greedy, in the same step
        SamplingParams(temperature=2.0, top_k=3, top_p=0.9),
    ]
    logits = torch.stack([LOGITS[0], LOGITS[0].flip(0), LOGITS[0] * 2, LOGITS[0], LOGITS[0].roll(2)])

    def run(rows: list[int]) -> dict[int, list[int]]:
        seqs = {i: Sequence(0, i, [1], params[i], seed=100 + i) for i in rows}
        out: dict[int, list[int]] = {i: [] for i in rows}
        for _ in range(60):
            for i, t in zip(rows, Sampler().sample(logits[rows], [seqs[i] for i in rows]), strict=True):
                out[i].append(t)
        return out

    together = run([0, 1, 2, 3, 4])
    for i in range(5):
        assert run([i])[i] == together[i]
    assert set(together[0]) == {0, 1}  # top_k 2 of row 0
    assert set(together[1]) == {5, 4}  # top_p 0.7 of the flipped row
    assert set(together[3]) == {0}
    assert len(set(together[2])) >= 2
