"""Counting a module's model loads in a test: which jobs' engines it loaded, in order."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest


def count_loads(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> list[str]:
    """Wraps `module.load_engine` (worker.local's, or worker.tasks' import of it) for the test; the
    list returned gets the job id of every load it makes, and the load still happens."""
    loads: list[str] = []
    real = module.load_engine

    def counted(manifest: Any, *args: Any) -> Any:
        loads.append(manifest.job_id)
        return real(manifest, *args)

    monkeypatch.setattr(module, "load_engine", counted)
    return loads
