"""Sampler on synthetic logits: greedy, top-k / top-p support, counter-based seeded draws, logprobs."""

from __future__ import annotations

import numpy as np
import torch

from contracts.sampling import SamplingParams
from worker.engine.batch_state import seed_keys
from worker.engine.sampler import Sampler, SamplingRows, stop_hits, uniforms

LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])


def _rows(params: list[SamplingParams], seeds: list[int], counters: list[int]) -> SamplingRows:
    keys = np.array([seed_keys(s) for s in seeds], np.int64).reshape(-1, 2)
    return SamplingRows.from_host(
        np.array([p.temperature for p in params], np.float32), np.array([p.top_k for p in params], np.int64),
        np.array([p.top_p for p in params], np.float32), keys, np.array(counters, np.int64), torch.device("cpu"),
    )  # fmt: skip


def _draws(params: SamplingParams, n: int = 300, seed: int = 0) -> list[int]:
    """The first n tokens one request would draw from LOGITS at every step."""
    logits = LOGITS.expand(n, -1).contiguous()
    return Sampler().sample(logits, _rows([params] * n, [seed] * n, list(range(n)))).tolist()


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


def test_uniforms_are_uniform_and_keyed() -> None:
    keys = torch.tensor([seed_keys(s) for s in range(4)])
    counter = torch.arange(20000)
    for k0, k1 in keys.tolist():
        u = uniforms(torch.full_like(counter, k0), torch.full_like(counter, k1), counter)
        assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
        hist = torch.histc(u, bins=10, min=0.0, max=1.0) / u.numel()
        assert torch.allclose(hist, torch.full((10,), 0.1), atol=0.01)
        assert abs(float(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1])) < 0.03  # neighbours unrelated
    a = uniforms(torch.tensor([keys[0, 0]]), torch.tensor([keys[0, 1]]), torch.tensor([5]))
    b = uniforms(torch.tensor([keys[1, 0]]), torch.tensor([keys[1, 1]]), torch.tensor([5]))
    assert a != b


def test_seeded_draws_repeat_and_differ_by_seed() -> None:
    p = SamplingParams(temperature=1.0)
    assert _draws(p, 40, seed=3) == _draws(p, 40, seed=3)
    assert _draws(p, 40, seed=3) != _draws(p, 40, seed=4)


def test_logprobs_top_k_plus_sampled_token() -> None:
    tokens = torch.tensor([0, 3])
    values, ids, chosen = Sampler.logprobs(torch.cat([LOGITS, LOGITS]), tokens, 2)
    logp = LOGITS.log_softmax(-1)[0]
    assert ids.tolist() == [[0, 1], [0, 1]] and torch.allclose(values[0], logp[:2])
    assert torch.allclose(chosen, logp[[0, 3]])


def test_stop_hits_per_row() -> None:
    stops = torch.tensor([[2, 7, -1], [-1, -1, -1], [5, -1, -1]])
    assert stop_hits(torch.tensor([7, 2, 4]), stops).tolist() == [True, False, False]


def test_a_batch_of_mixed_rows_draws_as_each_row_alone() -> None:
    """Sampled rows are cut and drawn together; each still gets its own cut and its own uniforms."""
    params = [
        SamplingParams(temperature=1.0, top_k=2),
        SamplingParams(temperature=1.0, top_p=0.7),
        SamplingParams(temperature=0.5),
        SamplingParams(),  # greedy, in the same step
        SamplingParams(temperature=2.0, top_k=3, top_p=0.9),
    ]
    logits = torch.stack([LOGITS[0], LOGITS[0].flip(0), LOGITS[0] * 2, LOGITS[0], LOGITS[0].roll(2)])

    def run(rows: list[int]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {i: [] for i in rows}
        for step in range(60):
            sampled = Sampler().sample(logits[rows], _rows([params[i] for i in rows], [100 + i for i in rows],
                                                           [step] * len(rows)))  # fmt: skip
            for i, t in zip(rows, sampled.tolist(), strict=True):
                out[i].append(t)
        return out

    together = run([0, 1, 2, 3, 4])
    for i in range(5):
        assert run([i])[i] == together[i]
    assert run([4, 2, 0])[2] == together[2]  # and in any order
    assert set(together[0]) == {0, 1}  # top_k 2 of row 0
    assert set(together[1]) == {5, 4}  # top_p 0.7 of the flipped row
    assert set(together[3]) == {0}
    assert len(set(together[2])) >= 2
