"""Training windows that repeat a span of their own text, and the loss that shows a model copies.

Real language models copy: once the last few tokens match an earlier stretch of the context they
continue it (induction heads, Olsson et al. 2022). Extraction, code edits and RAG answers lean on
that, and it is what prompt lookup proposes. A small model trained on the corpus alone does not
learn it: its loss on a span's repeat stays at its loss on the first occurrence. The committed pair
(examples/models/pycoder-tiny and -draft) copies; each one's training.json records its
`copy_losses`.

`copy_batch` replaces a fraction of a batch's windows with copy windows: half a corpus stretch of
T + 1 - L tokens then L of them again from a random point (L uniform in [8, T / 2]; nothing marks
where the repeat starts), half random tokens repeated with a period in [8, 64) (only looking back
predicts those). train_reference.py's `--copy-fraction` mixes them in; `--init-from` fine-tunes.

Which windows teach what:
- Copy windows mixed into corpus training, or a fine-tune with them, leave a small model's repeat
  loss near its first-occurrence loss: the corpus gives it no reason to look back.
- Random tokens with one fixed period are learned by position (the token 32 back), not by content;
  windows of varying period alone (`repeat_batch`, train_reference.py's `--copy-warmup`) teach a
  fresh model of the draft's shape to copy by content after a plateau, and the skill survives corpus
  training with 30% copy windows. The target's shape stays on that plateau far longer, so it is grown
  from the warmed-up draft (bench/grow_model.py) and copies from step 0.
- Random tokens never repeat within a period, so one token of context always names the place to copy
  from, and a model taught only by them follows the latest occurrence of the last token; code repeats
  "\n", indents and "#" everywhere. `text_repeat_window` repeats a corpus stretch instead, where only
  the last several tokens say which earlier place continues: fine-tuning with it
  (train_reference.py's `--copy-text`) is what makes greedy decoding repeat long spans
  (bench/speculative.py's first line prints how many span tokens plain greedy decoding repeats).

`copy_losses` measures the skill on held-out text: mean next-token loss on a span's first occurrence
and on its repeat, in windows of span + span.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

MIN_SPAN = 8


def copy_window(data: torch.Tensor, length: int, gen: torch.Generator) -> torch.Tensor:
    """One window of `length` tokens whose last L tokens repeat L tokens from its first part."""
    span = int(torch.randint(MIN_SPAN, max(MIN_SPAN + 1, length // 2 + 1), (1,), generator=gen))
    head = length - span
    start = int(torch.randint(0, data.numel() - head, (1,), generator=gen))
    first = data[start : start + head]
    at = int(torch.randint(0, head - span + 1, (1,), generator=gen))
    return torch.cat([first, first[at : at + span]])


def repeat_window(vocab: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """One window of `length` tokens: a sequence of random tokens (L in [8, 64)) over and over. Only
    looking back by content predicts it (the period varies, so no fixed offset does): such windows
    alone taught a fresh draft-shaped model to copy after ~1,300 steps; natural text taught none."""
    period = int(torch.randint(MIN_SPAN, 64, (1,), generator=gen))
    seq = torch.randint(0, vocab, (period,), generator=gen)
    return seq.repeat(length // period + 1)[:length]


def text_repeat_window(data: torch.Tensor, length: int, gen: torch.Generator) -> torch.Tensor:
    """One window of `length` tokens: a corpus stretch of P tokens (P in [16, 128)) over and over. Code
    repeats tokens within a line and across lines ("\n", indents, "#"), so the token before a
    position names many earlier places: only matching the last several tokens says which one
    continues. Random-token windows (repeat_window) never ask that, and a model trained on them alone
    copies one token then follows the latest occurrence of it (its own last line)."""
    period = int(torch.randint(2 * MIN_SPAN, 128, (1,), generator=gen))
    start = int(torch.randint(0, data.numel() - period, (1,), generator=gen))
    return data[start : start + period].repeat(length // period + 1)[:length]


def repeat_batch(rows: int, length: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """(rows, length): a batch of repeat windows only (train_reference.py's `--copy-warmup`)."""
    return torch.stack([repeat_window(vocab, length, gen) for _ in range(rows)])


def warm_up(step: Callable[[torch.Tensor, float], torch.Tensor], rows: int, length: int, vocab: int,
            gen: torch.Generator, *, steps: int, lr: float, ramp: int, until: float) -> dict:  # fmt: skip
    """Train on repeat batches only: `step(batch, lr)` runs one optimizer step and returns the loss,
    at `lr` after a linear ramp of `ramp` steps, until the mean loss of the last 20 steps is below
    `until` or `steps` have run. The loss sits near ln(vocab) for a long plateau, then falls within a
    few hundred steps once the model looks back by content. Returns what training.json records."""
    t0, recent, n = time.time(), [], 0
    for n in range(1, steps + 1):
        loss = step(repeat_batch(rows, length, vocab, gen), lr * min(1.0, n / ramp)).item()
        recent = (recent + [loss])[-20:]
        if n % 10 == 1:
            print(f"warm-up {n - 1:5d} loss {loss:.4f} {(time.time() - t0) / n:.2f}s/step", flush=True)
        if len(recent) == 20 and sum(recent) / 20 < until:
            break
    mean = sum(recent) / max(1, len(recent))
    print(f"warm-up done: {n} steps, mean loss {mean:.3f}", flush=True)
    return {"steps": n, "max_steps": steps, "lr": lr, "until": until, "final_mean_loss": round(mean, 4),
            "seconds": round(time.time() - t0)}


def copy_batch(batch: torch.Tensor, data: torch.Tensor, fraction: float, gen: torch.Generator,
               vocab: int = 0, text: float = 0.0) -> torch.Tensor:  # fmt: skip
    """`batch` (B, T+1) with each window replaced, with probability `fraction`, by a copy window;
    with a `vocab`, half of those are random-token repeat windows instead. With `text` > 0, each
    window is first replaced with that probability by a text repeat window (text_repeat_window);
    the others are drawn as before."""
    if fraction <= 0 and text <= 0:
        return batch
    out, texts = batch.clone(), []
    if text > 0:
        texts = (torch.rand(batch.shape[0], generator=gen) < text).nonzero().flatten().tolist()
        for row in texts:
            out[row] = text_repeat_window(data, batch.shape[1], gen)
    pick = torch.rand(batch.shape[0], generator=gen) < fraction
    pick[texts] = False
    for row in pick.nonzero().flatten().tolist():
        if vocab and torch.rand(1, generator=gen).item() < 0.5:
            out[row] = repeat_window(vocab, batch.shape[1], gen)
        else:
            out[row] = copy_window(data, batch.shape[1], gen)
    return out


@torch.no_grad()
def copy_losses(model, data: torch.Tensor, span: int = 96, windows: int = 24) -> tuple[float, float]:
    """(loss on a span's first occurrence, loss on its repeat): mean next-token cross entropy in
    nats over `windows` evenly spaced held-out spans, each run as one window span + span."""
    step = max(1, (data.numel() - span) // windows)
    first, again = [], []
    for i in range(windows):
        s = data[i * step : i * step + span]
        ids = torch.cat([s, s])[None]
        logits = model(input_ids=ids[:, :-1]).logits.float()[0]
        nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
        first.append(nll[: span - 1].mean())
        again.append(nll[span:].mean())  # the repeat's tokens after its first one
    return torch.stack(first).mean().item(), torch.stack(again).mean().item()
