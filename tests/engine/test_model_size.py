"""A config.json whose sizes the machine or the weights cannot back is refused before anything is
allocated, in one line; the rotary tables are built for the context the engine serves (at most what
its KV budget holds), not for max_position_embeddings."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from worker.demo_model import with_config
from worker.engine import Engine, EngineConfig


def _model(tmp_path: Path, demo: Path, **config: object) -> Path:
    return with_config(demo, tmp_path / "model", **config)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from worker.demo_model import make_demo_model

    return make_demo_model(tmp_path_factory.mktemp("models") / "tiny", arch="llama")


def test_a_huge_max_position_embeddings_builds_the_table_the_kv_budget_serves(tmp_path: Path, demo: Path) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    engine = Engine.from_pretrained(_model(tmp_path, demo, max_position_embeddings=10**12),
                                    EngineConfig(kv_cache_bytes=8 << 20))  # fmt: skip
    cfg = engine.runner.model.cfg
    per_token = 2 * cfg.num_kv_heads * cfg.head_dim * engine.config.torch_dtype.itemsize * cfg.num_layers
    assert engine.max_model_len == (8 << 20) // per_token  # what 8 MiB of KV holds, not 10^12
    table = engine.runner.model.cos_sin
    assert table.shape == (engine.max_model_len, cfg.head_dim)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 512, grown_mib  # (a 10^12-row table would be 128 TB)
    (out,) = engine.generate(["def add(a, b):"], None)
    assert out.error is None


def test_a_config_the_weights_cannot_fill_is_refused_before_allocating(tmp_path: Path, demo: Path) -> None:
    with pytest.raises(ValueError) as err:
        Engine.from_pretrained(_model(tmp_path, demo, intermediate_size=10**9), EngineConfig(kv_cache_bytes=8 << 20))
    assert "parameters but the checkpoint's tensors hold" in str(err.value) and "\n" not in str(err.value)


def test_a_context_the_machine_cannot_hold_is_refused_before_allocating(tmp_path: Path, demo: Path) -> None:
    """max_model_len asked for 10^12 positions and a KV budget that would allow it: the rotary tables
    alone are terabytes, refused with what is free."""
    model = _model(tmp_path, demo, max_position_embeddings=10**12)
    with pytest.raises(ValueError, match=r"the model needs [\d,.]+ GiB on cpu .* rotary tables .* is free") as err:
        Engine.from_pretrained(model, EngineConfig(kv_cache_bytes=1 << 50, max_model_len=10**12))
    assert "\n" not in str(err.value)
