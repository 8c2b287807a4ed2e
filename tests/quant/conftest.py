"""Fixtures of the quantization tests: the committed trained reference model and real text."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_MODEL = ROOT / "examples" / "models" / "pycoder-tiny"


@pytest.fixture(scope="session")
def reference_model() -> Path:
    """bench/train_reference.py's model: a 5M-parameter Llama trained on the stdlib's source."""
    assert (REFERENCE_MODEL / "model.safetensors").is_file(), "run bench/train_reference.py first"
    return REFERENCE_MODEL


@pytest.fixture(scope="session")
def real_texts() -> list[str]:
    """Chunks of real Python source (held-out and training files alike; only activations matter)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for name in ("textwrap.py", "heapq.py", "bisect.py", "shlex.py"):
        src = (stdlib / name).read_text(encoding="utf-8")
        texts += [src[i : i + 1200] for i in range(2000, 2000 + 3 * 1200, 1200)]
    return texts


@pytest.fixture(autouse=True)
def one_torch_thread():
    """These tiny models run ~10x faster on one thread than on two on a shared 2-core machine
    (the two threads wait on each other); restored afterwards for the rest of the suite."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
