"""TEST-ONLY worker: a freight worker whose pool process fails when it starts shard POISON.

KIND "kill": it SIGKILLs itself every time, standing for a row that crashes the process (a CUDA
fault, an OOM kill). KIND "raise_once": the first attempt raises, standing for a transient error
(storage hiccup); later attempts run. KIND "hang_once": the first attempt hangs without another
engine step (a CUDA hang, a deadlock); later attempts run. KIND "slow_rows_once": the first attempt
reports each finished row SLOW_ROW_S late (slow, but making progress); later attempts run. It wraps worker.shard.run_shard from
outside; production code carries no hook for it.
Usage: python fleet_poison_worker.py POISON_SHARD KIND <`freight worker` args...>
"""

from __future__ import annotations

import os
import signal
import sys
import time

import worker.shard as shard_module

POISON = int(sys.argv[1])
KIND = sys.argv[2]
_real_run_shard = shard_module.run_shard
SLOW_ROW_S = 2.5


def _poisoned_run_shard(engine, store, manifest, shard_index, **kwargs):  # noqa: ANN001, ANN202
    if shard_index == POISON and KIND == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if shard_index == POISON and KIND == "raise_once" and kwargs["attempt"] == 1:
        raise RuntimeError(f"test poison: attempt 1 of shard {POISON} raises")
    if shard_index == POISON and KIND == "hang_once" and kwargs["attempt"] == 1:
        time.sleep(3600)  # no engine step ever again: only the main process's deadline ends this
    if shard_index == POISON and KIND == "slow_rows_once" and kwargs["attempt"] == 1:
        real_on_row = kwargs["on_row"]

        def slow_on_row(row):  # noqa: ANN001, ANN202
            time.sleep(SLOW_ROW_S)
            print(f"test poison: slow row of shard {POISON}", file=sys.stderr, flush=True)
            real_on_row(row)

        kwargs["on_row"] = slow_on_row
    return _real_run_shard(engine, store, manifest, shard_index, **kwargs)


shard_module.run_shard = _poisoned_run_shard

if __name__ == "__main__":
    from freight_cli import main

    sys.argv = ["freight", *sys.argv[3:]]
    main()  # `freight worker ...`: the CLI sets the worker up, then runs this app with the wrapper
