"""LoraStep: the adapter slot of each token of the step being run, shared by every wrapped projection.

The ModelRunner sets it before each forward (`set`, from StepInputs.lora_slots: None when no token of
the step has an adapter, and then every wrapped projection is its base alone). The plan that groups
the tokens by slot (the backend's `plan_lora`) is made when the first projection asks for it and
reused by every projection of every layer (a step the CPU's C decode stack takes reads `slots` and
`stacks` instead, and needs no plan). A step whose last layer keeps only some rows
(AttentionMetadata.output_rows: o_proj and the MLP see those rows alone) gets their slots and plan the
first time a projection asks for them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from worker.engine.backends.base import Backend
from worker.engine.lora.stacks import LoraStacks
from worker.engine.sampler import to_device


class LoraStep:
    def __init__(self, backend: Backend, num_slots: int, device: torch.device) -> None:
        self.backend = backend
        self.num_slots = num_slots
        self.device = device
        self.active = False
        self.stacks: LoraStacks | None = None  # the wrapped projections' stacks (set by the manager)
        self.slots: torch.Tensor | None = None  # int32 [T]: each token's slot, on the device, while active
        self._all: tuple[torch.Tensor, Any] | None = None
        self._kept: tuple[torch.Tensor, Any] | None = None
        self._output_rows: torch.Tensor | None = None

    def set(self, slots: np.ndarray | None, output_rows: torch.Tensor | None = None) -> None:
        """slots: int32 [T] for the step's tokens (-1: the base), or None when every token is the base's;
        output_rows: the step's AttentionMetadata.output_rows."""
        if slots is None:
            self.clear()
            return
        self.slots = to_device(slots.astype(np.int32, copy=False), self.device)
        self._all = self._kept = None
        self._output_rows = output_rows
        self.active = True

    def clear(self) -> None:
        self.active = False
        self.slots = self._all = self._kept = self._output_rows = None

    def for_rows(self, rows: int) -> tuple[torch.Tensor, Any]:
        """(slots int32 [rows], plan) of the activations a projection is given: every token of the
        step, or its output_rows in the last layer."""
        slots = self.slots
        assert slots is not None  # invariant: only asked while active
        if rows == slots.shape[0]:
            if self._all is None:
                self._all = (slots, self.backend.plan_lora(slots, self.num_slots))
            return self._all
        if self._output_rows is not None and rows == self._output_rows.shape[0]:
            if self._kept is None:
                kept = slots.index_select(0, self._output_rows)
                self._kept = (kept, self.backend.plan_lora(kept, self.num_slots))
            return self._kept
        raise RuntimeError(f"a wrapped projection got {rows} rows; the step has {slots.shape[0]}")

