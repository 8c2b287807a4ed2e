"""bench/copy_windows.py: training windows that repeat a span of their own text, and the loss that
tells whether a model copies in context (bench/train_reference.py records it in training.json)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import copy_windows  # noqa: E402


def _stretch(w: torch.Tensor) -> int:
    """The length of the run of consecutive corpus tokens (torch.arange data) a window starts with."""
    return int(torch.nonzero(w[1:] != w[:-1] + 1)[0]) + 1


def test_copy_window_repeats_a_span_of_itself() -> None:
    gen = torch.Generator().manual_seed(0)
    data = torch.arange(10_000)
    for _ in range(20):
        w = copy_windows.copy_window(data, 257, gen)
        assert w.shape == (257,)
        head = _stretch(w)  # the corpus stretch ends where the repeat starts
        tail = w[head:]
        assert copy_windows.MIN_SPAN <= tail.numel() <= 257 // 2
        assert torch.equal(tail, torch.arange(int(tail[0]), int(tail[0]) + tail.numel()))  # a contiguous span
        assert int(w[0]) <= int(tail[0]) and int(tail[-1]) <= int(w[head - 1])  # taken from the window's own head


def test_repeat_window_is_periodic() -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        w = copy_windows.repeat_window(4096, 257, gen)
        period = next(p for p in range(copy_windows.MIN_SPAN, 64) if torch.equal(w[p:], w[:-p]))
        assert w.shape == (257,) and int(w.max()) < 4096 and period < 64


def test_repeat_batch_is_all_repeat_windows_of_varying_periods() -> None:
    batch = copy_windows.repeat_batch(16, 257, 4096, torch.Generator().manual_seed(3))
    assert batch.shape == (16, 257) and int(batch.max()) < 4096
    periods = {next(p for p in range(copy_windows.MIN_SPAN, 64) if torch.equal(w[p:], w[:-p])) for w in batch}
    assert len(periods) > 4  # no single offset predicts the batch: only content does


def test_copy_batch_fraction() -> None:
    gen = torch.Generator().manual_seed(2)
    data = torch.arange(100_000)
    batch = torch.stack([torch.arange(s, s + 257) for s in range(0, 64 * 300, 300)])
    assert copy_batch_is(batch, data, 0.0, gen) == 0
    replaced = copy_batch_is(batch, data, 0.5, gen)
    assert 16 <= replaced <= 48  # ~32 of 64


def test_text_repeat_window_repeats_a_corpus_stretch() -> None:
    gen = torch.Generator().manual_seed(4)
    data = torch.arange(10_000)
    periods = set()
    for _ in range(20):
        w = copy_windows.text_repeat_window(data, 257, gen)
        period = _stretch(w)  # the stretch ends where it starts again
        assert w.shape == (257,) and 2 * copy_windows.MIN_SPAN <= period < 128
        assert torch.equal(w[:period], torch.arange(int(w[0]), int(w[0]) + period))  # consecutive corpus tokens
        assert torch.equal(w[period:], w[:-period])  # then the same stretch over and over
        periods.add(period)
    assert len(periods) > 4


def test_copy_batch_mixes_text_repeats_with_the_other_windows() -> None:
    gen = torch.Generator().manual_seed(5)
    data = torch.arange(100_000)
    batch = torch.stack([torch.arange(s, s + 257) for s in range(0, 64 * 300, 300)])
    only = copy_windows.copy_batch(batch, data, 0.0, gen, vocab=4096, text=0.5)
    changed = (only != batch).any(dim=1)
    assert 16 <= int(changed.sum()) <= 48
    for w in only[changed]:  # every replaced window is a text repeat (a stretch of the corpus, periodic)
        period = _stretch(w)
        assert torch.equal(w[period:], w[:-period]) and int(w.max()) < 100_000
    both = copy_windows.copy_batch(batch, data, 0.5, gen, vocab=4096, text=0.5)
    assert int((both != batch).any(dim=1).sum()) > int(changed.sum())  # ~48 of 64: the two shares add up


def copy_batch_is(batch: torch.Tensor, data: torch.Tensor, fraction: float, gen: torch.Generator) -> int:
    out = copy_windows.copy_batch(batch, data, fraction, gen, vocab=4096)
    return int((out != batch).any(dim=1).sum())


class _Copier(torch.nn.Module):
    """A stand-in language model that predicts each next token by induction where it can: after
    token t it puts its mass on whatever followed t's latest earlier occurrence, else uniform."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        ids = input_ids[0].tolist()
        logits = torch.zeros(1, len(ids), self.vocab)
        for i, t in enumerate(ids):
            before = [j for j in range(i) if ids[j] == t]
            if before:
                logits[0, i, ids[before[-1] + 1]] = 30.0
        return SimpleNamespace(logits=logits)


class _Unigram(_Copier):
    """Knows nothing of its context: the same (uniform) prediction everywhere."""

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=torch.zeros(1, input_ids.shape[1], self.vocab))


def test_copy_losses_tell_a_copier_from_a_model_that_cannot() -> None:
    data = torch.randperm(4096)[:2000]  # no token twice: only the repeat can be predicted
    first, again = copy_windows.copy_losses(_Copier(4096), data, span=32, windows=4)
    assert first == pytest.approx(math.log(4096), rel=1e-4) and again < 1e-6
    first, again = copy_windows.copy_losses(_Unigram(4096), data, span=32, windows=4)
    assert first == pytest.approx(again) == pytest.approx(math.log(4096), rel=1e-4)


@pytest.mark.parametrize("name", ["pycoder-tiny", "pycoder-tiny-draft"])
def test_the_committed_reference_pair_copies_in_context(name: str) -> None:
    """Real language models copy a span they have seen (what prompt lookup and bench/speculative.py's
    copy task rely on); the committed pair must too: on held-out code, a span's repeat costs well
    under its first occurrence (training.json records the same two losses): under a quarter of it
    (the pair before `--copy-text` fine-tuning, 0.33 and 0.46 of it, did not pass)."""
    from stdlib_corpus import heldout_files, token_stream
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    path = ROOT / "examples" / "models" / name
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    data = token_stream(tok, [text for _, text in heldout_files()[:40]])
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    first, again = copy_windows.copy_losses(model, data, windows=12)
    assert again < 0.25 * first, (first, again)


def test_the_committed_target_greedily_repeats_a_span_it_was_shown() -> None:
    """bench/speculative.py's copy task through freight's engine: a held-out span, a comment asking
    for it again and its first 16 tokens; plain greedy decoding must go on repeating it (mean over 8
    prompts of the span tokens repeated before the first difference). A model that copies one token
    and then its own last line (the pair before `--copy-text`: 3.5 of 80) fails; the committed one
    repeats ~38."""
    import speculative

    from worker.engine import Engine, EngineConfig

    engine = Engine.from_pretrained(ROOT / "examples" / "models" / "pycoder-tiny",
                                    EngineConfig(num_threads=1, max_num_seqs=8, max_model_len=512))  # fmt: skip
    mean, _ = speculative.copied(engine, speculative.tasks(engine, 8)["copy"], 80)
    assert mean >= 20, mean
