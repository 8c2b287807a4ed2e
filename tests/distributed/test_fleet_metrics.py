"""WorkerMetrics is written by the task thread and read by the heartbeat thread at the same time."""

from __future__ import annotations

import threading

from worker.metrics import WorkerMetrics


def test_tokens_per_second_is_safe_across_threads() -> None:
    metrics = WorkerMetrics(window_s=0.01)  # a tiny window: rows expire while both threads run
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        try:
            while not stop.is_set():
                assert metrics.current_tokens_per_second() >= 0
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(20_000):
            metrics.record_tokens(prompt=3, cached=1, completion=2)
    finally:
        stop.set()
        reader.join()
    assert errors == []
    # the running total equals the window's rows once nothing else touches it
    with metrics._lock:
        assert metrics._recent_tokens == sum(n for _, n, _ in metrics._recent)
        assert metrics._recent_completion == sum(c for _, _, c in metrics._recent)


def test_window_rate() -> None:
    metrics = WorkerMetrics(window_s=10.0)
    metrics.record_tokens(prompt=30, cached=0, completion=20)
    metrics.record_tokens(prompt=0, cached=0, completion=50)
    assert metrics.current_tokens_per_second() == 10.0
    assert metrics.current_completion_tokens_per_second() == 7.0
