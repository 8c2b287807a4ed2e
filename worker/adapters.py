"""A job's LoRA adapters on a worker's engine: each resolved to a local folder (S3 adapters through
the model cache) and handed to the engine before a shard runs (the engine keeps an unchanged one)."""

from __future__ import annotations

from typing import Any

from jobs.errors import AdapterRefusedError
from jobs.model_cache import resolve_adapter
from jobs.settings import Settings
from jobs.spec import JobSpec


def use_adapters(engine: Any, spec: JobSpec, settings: Settings | None = None) -> None:
    """Make `engine` serve exactly `spec`'s adapters, `spec.max_loras` of them on the device at once
    (a job without adapters drops any a previous job left). AdapterRefusedError naming an adapter
    the engine refuses (its files changed since the job was checked at submit)."""
    folders = {name: resolve_adapter(name, path, settings) for name, path in spec.adapters.items()}
    try:
        engine.set_loras(folders, base_names=(spec.model, spec.model_name), max_loras=spec.max_loras)
    except ValueError as exc:
        raise AdapterRefusedError(str(exc)) from None
