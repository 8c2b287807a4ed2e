"""An engine whose weights load when a shard first has rows to compute, so a job the result cache
answers in full (every row a hit or a copy of one) never loads the model.

Before the load, a `LazyEngine` offers what a shard needs to key its rows: `config` (device and
dtype: the result cache's numerics) and `tokenizer` (the checkpoint's, read without the weights).
`compute_shard` asks for the engine itself (`ready`) only after the cache lookup and the dedup left
rows to run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: importing this module loads no torch
    from worker.engine.config import EngineConfig
    from worker.engine.tokenizer import Tokenizer

# () -> (the loaded engine, its load seconds to bill the shard that asked for it)
EngineLoad = Callable[[], tuple[Any, float]]


class LazyEngine:
    """The engine over `model_dir` built as `config` says, loaded by `load` on the first `ready()`;
    `tokenizer`: the checkpoint's, serving until then."""

    def __init__(self, model_dir: Path, config: EngineConfig, tokenizer: Tokenizer, load: EngineLoad) -> None:
        self.model_dir = model_dir
        self.config = config
        self._load = load
        self._engine: Any = None
        self._tokenizer: Tokenizer | None = tokenizer
        self.load_seconds = 0.0  # what the load billed (0.0 until it ran)

    @property
    def loaded(self) -> bool:
        return self._engine is not None

    @property
    def tokenizer(self) -> Any:
        """The loaded engine's tokenizer, else the one given (the same checkpoint's)."""
        return self._engine.tokenizer if self._engine is not None else self._tokenizer

    def ready(self) -> tuple[Any, float]:
        """(the loaded engine, load seconds to bill this caller: the load's on the call that ran it,
        0.0 on every later call)."""
        if self._engine is not None:
            return self._engine, 0.0
        self._engine, self.load_seconds = self._load()
        self._tokenizer = None
        return self._engine, self.load_seconds


def ready_engine(engine: Any) -> tuple[Any, float]:
    """(a loaded engine, load seconds to bill) for a LazyEngine or an engine loaded already (0.0)."""
    return engine.ready() if isinstance(engine, LazyEngine) else (engine, 0.0)
