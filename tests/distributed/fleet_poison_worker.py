"""TEST-ONLY worker: a freight worker whose pool process SIGKILLs itself when it starts shard POISON.

It stands for a row that crashes the process every time (a CUDA fault, an OOM kill). It wraps
worker.shard.run_shard from outside; production code carries no hook for it.
Usage: python fleet_poison_worker.py POISON_SHARD <celery worker args...>
"""

from __future__ import annotations

import os
import signal
import sys

import worker.shard as shard_module
from worker.celery_app import app

POISON = int(sys.argv[1])
_real_run_shard = shard_module.run_shard


def _poisoned_run_shard(engine, store, manifest, shard_index, **kwargs):  # noqa: ANN001, ANN202
    if shard_index == POISON:
        os.kill(os.getpid(), signal.SIGKILL)
    return _real_run_shard(engine, store, manifest, shard_index, **kwargs)


shard_module.run_shard = _poisoned_run_shard

if __name__ == "__main__":
    app.worker_main(sys.argv[2:])
