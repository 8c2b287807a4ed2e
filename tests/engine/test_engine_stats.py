"""The engine's busy time split between prefill and decode (EngineStats.add_busy), which prices input
and output tokens in the cost report."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.stats import EngineStats


def test_a_step_is_shared_by_its_token_counts() -> None:
    stats = EngineStats()
    stats.add_busy(1.0, prefill_tokens=30, decode_tokens=10)  # a mixed step: 3/4 prefill
    stats.add_busy(0.5, prefill_tokens=0, decode_tokens=8)  # pure decode
    stats.add_busy(0.25, prefill_tokens=64, decode_tokens=0)  # pure prefill
    stats.add_busy(0.125, prefill_tokens=0, decode_tokens=0)  # nothing computed: counted as prefill
    assert stats.busy_seconds == pytest.approx(1.875)
    assert stats.decode_seconds == pytest.approx(0.25 + 0.5)
    assert stats.prefill_seconds == pytest.approx(0.75 + 0.25 + 0.125)
    snap = stats.snapshot()
    assert (snap - snap).prefill_seconds == 0.0


def test_the_engine_splits_every_step(tokenizer_dir: Path) -> None:
    engine = Engine.from_pretrained(str(tokenizer_dir), EngineConfig(device="cpu", num_threads=1))
    before = engine.stats.snapshot()
    engine.generate(["def f(x):", "class A:"], SamplingParams(max_tokens=1))
    scoring = engine.stats.snapshot() - before
    assert scoring.decode_seconds == 0.0  # one token each: sampled from the prefill's last position
    assert scoring.prefill_seconds == pytest.approx(scoring.busy_seconds) and scoring.busy_seconds > 0
    before = engine.stats.snapshot()
    engine.generate(["def f(x):", "class A:"], SamplingParams(max_tokens=16, ignore_eos=True))
    both = engine.stats.snapshot() - before
    assert both.prefill_seconds > 0 and both.decode_seconds > 0
    assert both.prefill_seconds + both.decode_seconds == pytest.approx(both.busy_seconds)
