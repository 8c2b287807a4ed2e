"""Backend registry: a name -> the Backend class that implements the kernel contract.

To add a backend, add one line to _REGISTRY ("name": "module:Class"); the module is imported only
when that backend is picked, so a backend whose dependencies are missing costs nothing elsewhere.
"""

from __future__ import annotations

import importlib

import structlog
import torch

from kernels.cpu.build import KernelBuildError
from worker.engine.backends.base import AttentionMetadata, Backend

_REGISTRY: dict[str, str] = {
    "cpu": "worker.engine.backends.cpu_backend:CpuBackend",
    "torch": "worker.engine.backends.torch_backend:TorchBackend",
    "triton": "worker.engine.backends.triton_backend:TritonBackend",
}


def registered_backends() -> list[str]:
    return sorted(_REGISTRY)


def backend_class(name: str) -> type[Backend]:
    """Import and return the backend registered as `name`."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown backend {name!r}; registered: {registered_backends()}")
    module_name, class_name = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def select_backend(name: str, device: torch.device) -> Backend:
    """`name` is "auto" or a registered name. "auto" is "triton" on CUDA, "cpu" on the CPU, or "torch"
    where the CPU kernels cannot be built here (no C compiler: logged as a warning)."""
    if name == "auto":
        if device.type == "cuda" and "triton" in _REGISTRY:
            name = "triton"
        elif device.type == "cpu":
            try:
                return backend_class("cpu")()
            except KernelBuildError as exc:
                structlog.get_logger("freight.engine").warning("cpu_kernels_unavailable", fallback="torch", reason=str(exc))
                name = "torch"
        else:
            name = "torch"
    cls = backend_class(name)
    if not cls.supports(device):
        raise ValueError(f"backend {name!r} cannot run on device {device}; use backend='torch' or 'auto'")
    try:
        return cls()
    except KernelBuildError as exc:
        raise ValueError(f"backend {name!r} is unavailable here ({exc}); use backend='torch' or 'auto'") from exc


__all__ = ["AttentionMetadata", "Backend", "backend_class", "registered_backends", "select_backend"]
