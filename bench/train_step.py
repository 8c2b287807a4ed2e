"""One training step of bench/train_reference.py, and its two objectives: next-token cross entropy
on the corpus, or forward KL to a teacher's next-token distribution (a distilled draft)."""

from __future__ import annotations

import torch


def step(model, opt, batch: torch.Tensor, lr: float, bf16: bool, teacher=None) -> torch.Tensor:
    """One optimizer step on a (B, T+1) batch at learning rate `lr`; returns the loss."""
    for group in opt.param_groups:
        group["lr"] = lr
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = next_token_loss(model, batch) if teacher is None else distill_loss(model, teacher, batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def next_token_loss(model, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy over a (B, T+1) batch of windows."""
    logits = model(input_ids=batch[:, :-1]).logits  # (B, T, V)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def distill_loss(model, teacher, batch: torch.Tensor) -> torch.Tensor:
    """Forward KL(teacher || model) of the next-token distributions over a (B, T+1) batch's first T
    positions, per position (the teacher's forward without gradients)."""
    with torch.no_grad():
        target = torch.log_softmax(teacher(input_ids=batch[:, :-1]).logits.float(), -1)
    logp = torch.log_softmax(model(input_ids=batch[:, :-1]).logits.float(), -1)
    return torch.nn.functional.kl_div(logp.flatten(0, 1), target.flatten(0, 1), log_target=True, reduction="batchmean")
