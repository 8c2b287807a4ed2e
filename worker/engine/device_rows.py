"""DeviceRows: the PersistentBatch arrays a step reads on the device, kept current row by row.

Mirrored: the block tables int32 [R, W] (one per KV cache group: kv_groups.py), last_token int64 [R] (the row's newest token: written by the host
when a row joins, by the step itself on the device after sampling, so a decode input never waits for
the host), fparams float32 [R, 3], iparams int64 [R, 3], stop_ids int64 [R, S], and for the logits
processing pparams float32 [R, 3], bias_ids int64 [R, B] and bias_values float32 [R, B].

With copy=False (the CPU) the device tensors are the host arrays themselves (torch.from_numpy views):
nothing is copied, ever. With copy=True (CUDA; also on the CPU in tests, to check the bookkeeping)
they are separate tensors and sync() sends only the rows that changed: every mirrored array of the
rows that joined, the block table of rows that got blocks, each as one pinned asynchronous copy.
"""

from __future__ import annotations

import numpy as np
import torch

from worker.engine.batch_state import PersistentBatch
from worker.engine.sampler import to_device

MIRRORED = ("last_token", "fparams", "iparams", "stop_ids", "pparams", "bias_ids", "bias_values")  # and the tables


class DeviceRows:
    def __init__(self, batch: PersistentBatch, device: torch.device, copy: bool) -> None:
        self.batch = batch
        self.device = device
        self.copy = copy
        self.tables = tuple(g.table for g in batch.groups)  # the block tables, one per KV cache group
        self.mirrored = (*self.tables, *MIRRORED)
        self.tensors: dict[str, torch.Tensor] = {}
        for name in self.mirrored:
            self._set(name, self._full(name))
        batch.joined.clear()
        batch.grew.clear()
        batch.resized.clear()

    def _full(self, name: str) -> torch.Tensor:
        host = torch.from_numpy(getattr(self.batch, name))
        return host.to(self.device, copy=True) if self.copy else host

    def _set(self, name: str, tensor: torch.Tensor) -> None:
        """The mirror of array `name`: in `tensors`, and as the attribute `name` (a plain attribute: a
        step reads a few of them, where a __getattr__ fallback costs ~1 us each)."""
        self.tensors[name] = tensor
        setattr(self, name, tensor)

    def sync(self) -> None:
        """Bring the device copies up to date with the host for the rows that changed."""
        b = self.batch
        for name in b.resized:  # a request with more stop ids (or biases) than any before: a wider array
            self._set(name, self._full(name))
        b.resized.clear()
        if not self.copy:
            b.joined.clear()
            b.grew.clear()
            return
        if b.joined:
            rows = np.fromiter(sorted(b.joined), np.int64, len(b.joined))
            self._copy_rows(rows, self.mirrored)
        grew = b.grew - b.joined
        if grew:
            self._copy_rows(np.fromiter(sorted(grew), np.int64, len(grew)), self.tables)
        b.joined.clear()
        b.grew.clear()

    def _copy_rows(self, rows: np.ndarray, names: tuple[str, ...]) -> None:
        idx = to_device(rows, self.device)
        for name in names:
            self.tensors[name].index_copy_(0, idx, to_device(getattr(self.batch, name)[rows], self.device))
