"""The distributed part of `freight status`: a fleet job's live lines from Redis and the output."""

from __future__ import annotations

from rich.console import Console

from jobs.settings import get_settings
from jobs.storage import ObjectStore


def print_fleet_status(store: ObjectStore) -> None:
    """Live lines under `freight status` for a distributed job: shards by state, rows/s, ETA, failures,
    storage outages, cancel. Prints nothing for an embedded job; never waits on an absent Redis (1 s timeout)."""
    from jobs.fleet_status import fleet_status, outage_lines, worker_lines
    from jobs.live_state import LiveState
    from jobs.manifest import read_manifest

    live = LiveState(get_settings().redis_url, socket_timeout=1.0, retry_for_s=0)
    try:
        st = fleet_status(store, live)
    finally:
        live.close()
    if not st.live and not st.failures and st.state != "cancelled":
        return
    console = Console(highlight=False)
    line = (f"fleet: {st.state}; shards {st.shards_committed}/{st.shards_total} committed, "
            f"{st.shards_queued} queued, {st.shards_running} running, {st.shards_failed} failed")  # fmt: skip
    if st.rows_per_second:
        line += f"; {st.rows_per_second:.1f} rows/s"
    if st.eta_seconds is not None:
        line += f", ETA {st.eta_seconds:.0f} s"
    console.print(line)
    for f in st.failures:
        console.print(f"  shard {f['shard']} failed after {f['attempts']} attempts: {f['reason']}")
    budget = get_settings().max_shard_storage_outages  # this process's setting; workers should share it
    for extra in [*outage_lines(st, budget), *worker_lines(st, read_manifest(store).spec.model)]:
        console.print(extra, soft_wrap=True)  # worker lines: who serves it; none: say so
