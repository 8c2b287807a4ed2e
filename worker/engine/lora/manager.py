"""LoraManager: the adapters an engine serves, and the model's wrapped projections that apply them.

Adapters are registered by name (`sync`: the set a job uses; one already loaded from an unchanged
file keeps its id, host copy and any resident slot). Each registration gets an id never reused in
the engine's life: sequences carry it, and the prefix cache's hashes start from it, so KV computed
under one adapter (or an earlier file of the same name) is never served to another. The wrapped
projections and the device stacks (lora/stacks.py) are (re)built when the set of wrapped modules or
the largest rank changes, only between streams (no sequence holds a slot then); with no adapter the
model is left unwrapped. Residency on the device: lora/slots.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog
import torch
from torch import nn

from contracts.lora.config import AdapterError
from worker.engine.backends.base import Backend
from worker.engine.lora.adapter import LoraAdapter, load_adapter, weights_stamp
from worker.engine.lora.linear import LoraLinear
from worker.engine.lora.slots import LoraSlots
from worker.engine.lora.stacks import LoraStacks, engine_target
from worker.engine.lora.step import LoraStep

log = structlog.get_logger(__name__)


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


class LoraManager:
    def __init__(self, model: nn.Module, backend: Backend, max_loras: int, device: torch.device, dtype: torch.dtype,
                 base_config: dict[str, Any], base_names: list[str | None]) -> None:  # fmt: skip
        self.model = model
        self.backend = backend
        self.max_loras = max_loras
        self.device = device
        self.dtype = dtype
        self.base_config = base_config
        self.base_names = base_names
        self.adapters: dict[int, LoraAdapter] = {}
        self.ids: dict[str, int] = {}  # name -> id of the registered adapter of that name
        self._next_id = 0
        self.step = LoraStep(backend, max_loras, device)
        self.stacks: LoraStacks | None = None
        self.slots: LoraSlots | None = None
        self._shape: tuple[frozenset[str], int] | None = None  # (wrapped modules, rank) of the stacks

    # ---- the registry --------------------------------------------------------------------
    def sync(self, adapters: Mapping[str, str | Path], base_names: tuple[str | None, ...] = (),
             max_loras: int | None = None) -> None:  # fmt: skip
        """Serve exactly these adapters (name -> local PEFT folder) from now on, with `max_loras` slots
        on the device (None: keep the number); AdapterError naming the first one that cannot be
        served (nothing changes then). Call only between streams."""
        names = [*self.base_names, *base_names, self.base_config.get("_name_or_path")]
        loaded: dict[str, LoraAdapter] = {}
        for name, folder in adapters.items():
            path = Path(folder).expanduser()
            held = self.adapters.get(self.ids.get(name, -1))
            try:
                same = held is not None and held.folder == path and held.stamp == weights_stamp(path)
            except OSError:
                same = False
            if not same:
                loaded[name] = load_adapter(name, path, self.base_config, names, self.dtype,
                                            pin=self.device.type == "cuda")  # fmt: skip
        for name in [n for n in self.ids if n not in adapters or n in loaded]:
            self._forget(name)
        for name, adapter in loaded.items():
            self.ids[name] = self._next_id
            self.adapters[self._next_id] = adapter
            self._next_id += 1
            log.info("lora_loaded", adapter=name, folder=str(adapter.folder), rank=adapter.rank,
                     modules=len(adapter.layout.modules), bytes=adapter.nbytes)  # fmt: skip
        if max_loras is not None and max_loras != self.max_loras:
            self.max_loras = self.step.num_slots = max_loras
            self._shape = None  # new stacks of that many slots
        self._build()

    def _forget(self, name: str) -> None:
        aid = self.ids.pop(name)
        del self.adapters[aid]
        if self.slots is not None:
            self.slots.forget(aid)

    def id_of(self, name: str | None) -> int:
        """The id of the adapter called `name` (-1 for None: the base); AdapterError when unknown."""
        if name is None:
            return -1
        aid = self.ids.get(name)
        if aid is None:
            served = ", ".join(sorted(self.ids)) or "none"
            raise AdapterError(f"unknown adapter {name!r}: this engine serves {served} (and the base model)")
        return aid

    def name_of(self, aid: int) -> str | None:
        return None if aid < 0 else self.adapters[aid].name

    # ---- the model's wrapped projections -------------------------------------------------
    def _build(self) -> None:
        """Stacks and wrappers for the registered adapters' modules at their largest rank (unchanged
        when neither changed; resident adapters are then kept)."""
        targets = frozenset(engine_target(m.name)[0] for a in self.adapters.values() for m in a.layout.modules)
        rank = max((a.rank for a in self.adapters.values()), default=0)
        if self._shape == (targets, rank):
            return
        self.step.clear()
        for name, module in list(self.model.named_modules()):
            if isinstance(module, LoraLinear):
                _replace(self.model, name, module.base)
        self.stacks = self.slots = self.step.stacks = None
        self.model.lora = None  # type: ignore[attr-defined]
        self._shape = (targets, rank)
        if not targets:
            return
        self.stacks = self.step.stacks = LoraStacks(self.model, sorted(targets), self.max_loras, rank, self.dtype,
                                                    self.device)  # fmt: skip
        for target, stack in self.stacks.stacks.items():
            _replace(self.model, target, LoraLinear(self.model.get_submodule(target), stack, self.step, self.backend))
        stacks = self.stacks
        self.slots = LoraSlots(self.max_loras, lambda slot, aid: stacks.write(slot, self.adapters[aid]))
        self.model.lora = self.step  # type: ignore[attr-defined]
        log.info("lora_stacks", modules=len(targets), rank=rank, slots=self.max_loras, bytes=stacks.nbytes)

    # ---- residency (PersistentBatch asks, for each sequence that joins or leaves) ---------
    def available(self, aid: int) -> bool:
        return aid < 0 or (self.slots is not None and self.slots.available(aid))

    def acquire(self, aid: int) -> int:
        """The slot of adapter `aid` on the device (swapped in if needed), -1 for the base."""
        return -1 if aid < 0 else self.slots.acquire(aid)  # type: ignore[union-attr]

    def release(self, slot: int) -> None:
        if slot >= 0:
            self.slots.release(slot)  # type: ignore[union-attr]

    def adapter_in(self, slot: int) -> int:
        return -1 if slot < 0 else self.slots.adapter_in[slot]  # type: ignore[union-attr,return-value]


__all__ = ["AdapterError", "LoraManager"]
