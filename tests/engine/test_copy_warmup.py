"""bench/train_reference.py's copy warm-up: random-token repeat windows only, until their loss falls
below a threshold or the step budget runs out (what taught the reference pair to copy in context)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import copy_windows  # noqa: E402
import train_reference  # noqa: E402
import train_step  # noqa: E402


def _tiny(vocab: int = 64):
    cfg = train_reference.TrainConfig(vocab_size=vocab, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                      intermediate_size=64, context=32, batch_size=4, steps=60, warmup=5)  # fmt: skip
    torch.manual_seed(0)
    model = train_reference.build_model(cfg, eos_id=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return cfg, model, opt


def _warm(cfg, model, opt, steps: int, until: float) -> dict:
    def step(batch: torch.Tensor, lr: float) -> torch.Tensor:
        return train_step.step(model, opt, batch, lr, bf16=False)

    return copy_windows.warm_up(step, cfg.batch_size, cfg.context + 1, cfg.vocab_size, torch.Generator().manual_seed(1),
                                steps=steps, lr=1e-3, ramp=cfg.warmup, until=until)  # fmt: skip


def test_warmup_runs_its_budget_when_the_loss_stays_high() -> None:
    cfg, model, opt = _tiny()
    before = [p.detach().clone() for p in model.parameters()]
    warm = _warm(cfg, model, opt, 30, 0.0)
    assert warm["steps"] == 30 and warm["max_steps"] == 30
    assert 3.0 < warm["final_mean_loss"] < 5.0  # ~ln(64) = 4.16: a fresh model cannot copy yet
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # it trained


def test_warmup_ends_once_the_mean_of_20_steps_is_below_the_threshold() -> None:
    cfg, model, opt = _tiny()
    warm = _warm(cfg, model, opt, 500, 10.0)
    assert warm["steps"] == 20  # the first step with 20 losses to average, all below 10 nats
    assert warm["final_mean_loss"] < 10.0 and warm["until"] == 10.0
