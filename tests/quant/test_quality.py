"""Quality bounds of quantized weights on the committed trained model, through the engine as it runs
them on the CPU (the integer kernels: activations rounded to int8 per block): held-out perplexity of
int8 within 0.5% of fp32's and of GPTQ int4 within 3% (bench/quant_quality.py measures the same on
more text)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.quant.checkpoint import QuantizeSpec, quantize_checkpoint
from worker.engine.quant.linear import QuantLinear

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from stdlib_corpus import corpus_files, is_heldout  # noqa: E402

WINDOWS, WINDOW = 8, 256


def _texts(heldout: bool):
    """The split's files' texts in the corpus's order, read one by one (the bench reads them all)."""
    for rel, path in corpus_files():
        if is_heldout(rel) == heldout:
            yield path.read_text(encoding="utf-8", errors="replace")


def _engine(model_dir: Path, **kw) -> Engine:
    return Engine.from_pretrained(model_dir, EngineConfig(device="cpu", kv_cache_bytes=32 << 20,
                                                          enable_prefix_caching=False, **kw))  # fmt: skip


@pytest.fixture(scope="module")
def windows(reference_model: Path) -> list[list[int]]:
    """The first WINDOWS windows of WINDOW tokens of the held-out standard-library files."""
    tokenizer = _engine(reference_model).tokenizer
    stream: list[int] = []
    for text in _texts(heldout=True):
        stream += tokenizer.encode(text)
        if len(stream) >= WINDOWS * WINDOW:
            break
    return [stream[i * WINDOW : (i + 1) * WINDOW] for i in range(WINDOWS)]


def _perplexity(engine: Engine, windows: list[list[int]]) -> float:
    assert any(isinstance(m, QuantLinear) and m.cpu_path == "kernel" for m in engine.runner.model.modules()) \
        or engine.config.quantization is None  # fmt: skip
    outs = engine.generate(windows, SamplingParams(max_tokens=1, prompt_logprobs=True))
    lps = [lp for out in outs for lp in out.prompt_logprobs[1:]]
    return math.exp(-sum(lps) / len(lps))


@pytest.fixture(scope="module")
def fp32_perplexity(reference_model: Path, windows: list[list[int]]) -> float:
    return _perplexity(_engine(reference_model), windows)


def test_int8_stays_within_half_a_percent(reference_model: Path, windows, fp32_perplexity: float) -> None:
    int8 = _perplexity(_engine(reference_model, quantization="int8"), windows)
    assert abs(int8 / fp32_perplexity - 1) < 0.005, (int8, fp32_perplexity)


def test_gptq_int4_stays_within_3_percent(reference_model: Path, windows, fp32_perplexity: float,
                                          tmp_path: Path) -> None:  # fmt: skip
    texts = [text[:2000] for text, _ in zip(_texts(heldout=False), range(8), strict=False)]  # training split rows
    out = tmp_path / "gptq"
    quantize_checkpoint(reference_model, out, QuantizeSpec(method="int4-gptq", group_size=128), texts)
    int4 = _perplexity(_engine(out), windows)
    assert int4 / fp32_perplexity - 1 < 0.03, (int4, fp32_perplexity)
