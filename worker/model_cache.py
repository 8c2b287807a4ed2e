"""The loaded engine, kept per worker process and reused across shards of the same model.

One entry: a GPU holds one model. A shard of another model (a worker listening on several queues)
evicts the current engine before loading the next, so two models never sit in memory together.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from jobs.log import get_logger

log = get_logger(__name__)

EngineT = TypeVar("EngineT")


class ModelCache(Generic[EngineT]):
    """`get(key, load)` returns the cached engine for `key`, loading it (and dropping another) if needed.

    `key` must capture everything that changes the loaded weights: model URI, quantization, device.
    """

    def __init__(self) -> None:
        self._key: Hashable | None = None
        self._engine: EngineT | None = None
        self._lock = threading.Lock()
        self._preload: Hashable | None = None  # a key the worker loads on its own at start
        self.loads = 0
        self.load_seconds = 0.0

    def expect(self, key: Hashable) -> None:
        """`key` is preloaded at start (`freight worker --model`): its first load, by whichever
        caller gets there first, is billed to no shard."""
        self._preload = key

    @property
    def loaded_key(self) -> Hashable | None:
        """The key of the engine held now (None while none is loaded)."""
        return self._key

    def get(self, key: Hashable, load: Callable[[], EngineT]) -> EngineT:
        return self.get_timed(key, load)[0]

    def get_timed(self, key: Hashable, load: Callable[[], EngineT]) -> tuple[EngineT, float]:
        """(engine, seconds of loading to bill the caller): 0.0 when it was loaded already (also when
        this call waited for another thread's load of the same key), and for the preloaded key's
        first load."""
        with self._lock:
            if self._engine is not None and self._key == key:
                return self._engine, 0.0
            self._drop()
            start = time.perf_counter()
            engine = load()
            seconds = time.perf_counter() - start
            self.load_seconds += seconds
            self._key, self._engine = key, engine
            self.loads += 1
            preloaded = key == self._preload
            self._preload = None if preloaded else self._preload
            log.info("model_loaded", key=str(key), seconds=round(seconds, 3), preload=preloaded)
            return engine, 0.0 if preloaded else seconds

    def _drop(self) -> None:
        if self._engine is None:
            return
        log.info("model_evicted", key=str(self._key))
        self._key, self._engine = None, None
        gc.collect()
        _empty_device_cache()


def _empty_device_cache() -> None:
    """Return freed GPU memory to the driver before the next model loads (no-op without CUDA)."""
    import torch  # lazy: worker-only module, keeps `import worker.model_cache` light in tests

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
