"""Shared fixtures: tiny random Hugging Face checkpoints built by transformers (the oracle) on disk,
and greedy / log-softmax references computed with transformers in fp32."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from engine_oracle import MAX_NEW, hf_greedy, mixed_prompts
from torch_threads import torch_threads

from worker.demo_model import make_demo_model

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from tiny_checkpoints import save_tiny_checkpoint, tiny_model  # noqa: E402


@dataclass
class Checkpoint:
    path: Path
    model: torch.nn.Module  # the transformers model saved at path (fp32, eval)


@pytest.fixture(autouse=True, scope="package")
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared CPU the threads' spin-waits
    cost more than the work; restore the setting for the rest of the suite."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_model(tmp_path_factory.mktemp("demo"), "llama", size="tiny")


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path):
    """make_checkpoint(arch, seed=0, **config_overrides) -> Checkpoint (cached per arguments)."""
    cache: dict[tuple, Checkpoint] = {}

    def make(arch: str, seed: int = 0, **overrides: object) -> Checkpoint:
        key = (arch, seed, repr(sorted(overrides.items())))
        if key not in cache:
            model = tiny_model(arch, seed, **overrides)
            path = save_tiny_checkpoint(model, tmp_path_factory.mktemp(f"ckpt_{arch}"), tokenizer_dir)
            cache[key] = Checkpoint(path, model)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def expected(make_checkpoint):
    """expected(arch, **config_overrides) -> transformers' greedy MAX_NEW tokens for each of
    mixed_prompts() (cached per arguments)."""
    cache: dict = {}

    def get(arch: str, **overrides: object) -> list[list[int]]:
        key = (arch, repr(sorted(overrides.items())))
        if key not in cache:
            model = make_checkpoint(arch, **overrides).model
            cache[key] = [hf_greedy(model, p, MAX_NEW) for p in mixed_prompts()]
        return cache[key]

    return get
