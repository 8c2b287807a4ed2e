"""Workers serve whatever arrives: `freight worker` without --model/--queues on an empty Redis waits,
takes model A's job, then model B's (queues added and dropped with no restart); `--model` loads the
model at start, billed to no shard; `freight status` says who serves a job, and when nobody does.
Real worker processes, a private redis-server, default settings but 1 s heartbeats (10 s by default:
the tests wait for a beat that shows a change, and for the 10 s they were mostly waiting)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_jobs import Fleet, freight, make_input, result_rows, submit
from fleet_servers import wait_for

from jobs.client import queue_for_model
from jobs.leases import live_nodes
from jobs.progress import WorkerBeat
from jobs.storage import open_store
from worker.demo_model import make_demo_model


@pytest.fixture()
def fleet(redis_url: str, tmp_path: Path, demo_model: Path) -> Iterator[Fleet]:
    f = Fleet(redis_url, tmp_path, demo_model, defaults=True, overrides={"FREIGHT_HEARTBEAT_S": "1"})
    yield f
    f.stop()


def _events(log_text: str, event: str) -> list[dict]:
    return [json.loads(line) for line in log_text.splitlines() if line.startswith("{") and f'"{event}"' in line]


def test_a_worker_without_queues_serves_every_model_as_jobs_arrive(fleet: Fleet, tmp_path: Path) -> None:
    w = fleet.start("any", serve_all=True)  # Redis is empty: no queue exists yet
    (node,) = wait_for(lambda: live_nodes(fleet.live.client, time.time()), 60, "the worker's node beat")
    assert node.serve_all and node.hostname == "any@test"
    idle_since = time.monotonic()
    model_b = Path(make_demo_model(tmp_path / "model-b", arch="qwen2")).resolve()
    inp = make_input(tmp_path / "input.parquet", 8)
    time.sleep(max(0.0, idle_since + 3 - time.monotonic()))  # over one queue sync (2 s) with no queue
    assert w.alive(), w.log_text()[-2000:]  # it waits for work instead of exiting
    for model, out in ((fleet.model, tmp_path / "out-a"), (model_b, tmp_path / "out-b")):
        submit(fleet.env(), inp, model, out, 4)
        done = fleet.wait_done(out, timeout=300)
        assert done.returncode == 0, done.stderr
        assert len(result_rows(out)) == 8
    assert w.alive()  # the same process served both models
    queue_a, queue_b = queue_for_model(str(fleet.model)), queue_for_model(str(model_b))
    changes = _events(w.log_text(), "queues_changed")
    assert any(queue_a in c["added"] for c in changes) and any(queue_b in c["added"] for c in changes)
    # A's queue is idle and B's model is the one loaded: A's consumer goes, B's stays
    wait_for(lambda: any(queue_a in c["dropped"] for c in _events(w.log_text(), "queues_changed")), 30,
             "the idle queue dropped")  # fmt: skip
    wait_for(lambda: live_nodes(fleet.live.client, time.time())[0].queues == (queue_b,), 30,
             "the node beat listing B's queue only")  # fmt: skip


@pytest.mark.slow
def test_model_preload_and_status_lines(fleet: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "out"
    inp = make_input(tmp_path / "input.parquet", 8)
    submit(fleet.env(), inp, fleet.model, out, 4)
    status = freight(["status", str(out)], fleet.env())
    assert status.returncode == 0, status.stderr
    assert f"no live worker consumes {fleet.queue}" in status.stdout
    assert f"freight worker --model {fleet.model}" in status.stdout
    w = fleet.start("pre", model=str(fleet.model))
    wait_for(lambda: fleet.live.client.hget("freight:workers", "pre@test#0"), 60, "a heartbeat")
    wait_for(lambda: WorkerBeat.from_json("pre@test#0", fleet.live.client.hget("freight:workers", "pre@test#0"))
             .model == str(fleet.model), 60, "the model loaded at start")  # fmt: skip
    done = fleet.wait_done(out, timeout=300)
    assert done.returncode == 0, done.stderr
    (loaded,) = [e for e in _events(w.log_text(), "model_loaded") if "key" in e]  # the cache's, once
    assert loaded["preload"] is True
    store = open_store(str(out))
    records = [json.loads(store.get(k)) for k in store.list("costs/") if k.endswith(".json")]
    assert len(records) == 2 and all(r["load_seconds"] == 0 for r in records)  # billed to no shard
    # a second job of the same model: status shows the worker consuming its queue, model loaded
    out2 = tmp_path / "out2"
    # 32 shards of 8 rows x 2,000 tokens (the tiny model decodes a shard in about half a second since
    # the decode stack: the job runs for well over one beat interval, 10 s by default, and a beat
    # lands while a shard runs; the rest is stopped at teardown)
    submit(fleet.env(), make_input(tmp_path / "input2.parquet", 256, max_tokens=(2000,)), fleet.model, out2, 8,
           max_tokens=2000)  # fmt: skip
    wait_for(lambda: fleet.busy("pre@test#0"), 60, "the second job running")
    # the heartbeat names the running attempt and carries the time of its last engine step
    beat = wait_for(lambda: (b := WorkerBeat.from_json("pre@test#0", fleet.live.client.hget(
        "freight:workers", "pre@test#0"))).last_step and b, 60, "a beat with the last engine step")  # fmt: skip
    assert beat.job_id is not None and beat.shard is not None and time.time() - beat.last_step < 15
    status = freight(["status", str(out2)], fleet.env())
    assert status.returncode == 0, status.stderr
    assert f"workers: 1 live, 1 consuming {fleet.queue}, 1 with the model loaded" in status.stdout
    assert "no live worker" not in status.stdout


@pytest.mark.parametrize(
    ("sizes", "loaded", "elsewhere", "adopt", "expected"),
    [
        ({}, set(), {}, True, set()),  # nothing anywhere: only the idle placeholder
        ({"a": 3, "b": 0}, set(), {}, True, {"a"}),  # no model yet: every queue with work
        ({"a": 3, "b": 2}, set(), {}, True, {"a", "b"}),
        ({"a": 3, "b": 2}, {"a"}, {}, True, {"a"}),  # own model busy: keep the weights, serve it only
        ({"a": 0, "b": 2}, {"a"}, {}, True, {"a", "b"}),  # own queue empty: take B, stay warm for A
        ({"a": 0, "b": 0}, {"a"}, {}, True, {"a"}),  # idle queues dropped, the loaded model's kept
        # B starves while A has other consumers: this node switches to B (one node at a time)
        ({"a": 5, "b": 2}, {"a"}, {"a": 2}, True, {"b"}),
        ({"a": 5, "b": 2}, {"a"}, {"a": 2}, False, {"a"}),  # another node adopted B first
        ({"a": 5, "b": 2}, {"a"}, {"b": 1}, True, {"a"}),  # B is served elsewhere
    ],
)
def test_choose_queues(sizes, loaded, elsewhere, adopt, expected) -> None:  # noqa: ANN001
    from worker.queue_sync import choose_queues

    assert choose_queues(sizes, loaded, elsewhere, lambda q: adopt) == expected
