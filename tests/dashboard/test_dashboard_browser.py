"""The dashboard alone (`freight dashboard`'s app, a store without API keys, on 127.0.0.1) in a real
headless Chromium: a job page's cost chart draws its data, a planted eval regression is red, a
10,000-shard job's page renders in under 2 s, the fleet page reads Redis, the jobs page follows the
store without a reload; every page is screenshotted and raises no console error (a
Content-Security-Policy refusal would be one).

A job that freight itself runs, from an upload to 100%, is tests/api/test_dashboard_serve.py's."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By

from jobs.autoscale.decisions import DecisionLog
from jobs.client import queue_for_model
from jobs.live_state import LiveState
from jobs.progress import WorkerBeat
from jobs.storage import LocalStore
from tests.browser import chromium, console_errors, screenshot, wait_for
from tests.dashboard.conftest import DashboardServer, dashboard_server
from tests.dashboard.planted import (
    CHECKPOINTS,
    commit,
    finish,
    lose_attempt,
    plant_eval_history,
    plant_job,
    poison,
    result_bytes,
)
from tests.redis_db import flushed_db

REDIS_URL = "redis://127.0.0.1:6379/11"  # a database of its own: flushed before and after


@pytest.fixture(scope="module")
def fleet_redis() -> Iterator[str]:
    with flushed_db(REDIS_URL) as url:
        yield url


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, fleet_redis: str) -> Iterator[DashboardServer]:
    """A store holding a running job, a finished one, a 10,000-shard one and an eval history with a
    regression in its latest run; the dashboard over it, with the fleet's Redis."""
    root = tmp_path_factory.mktemp("dashboard") / "store"
    running, manifest = plant_job(str(root / "runs" / "nightly"), shards=12, created_at=time.time() - 600)
    commit(running, manifest, range(7), failed_rows=1, at=time.time() - 30)
    lose_attempt(running, manifest, 8)
    poison(running, manifest, 9)
    done, done_manifest = plant_job(str(root / "runs" / "done"), shards=3, created_at=time.time() - 7200,
                                    market="on-demand")  # fmt: skip
    finish(done, done_manifest)
    big, big_manifest = plant_job(str(root / "runs" / "big"), shards=10_000, rows_per_shard=1,
                                  created_at=time.time() - 60)  # fmt: skip
    commit(big, big_manifest, range(3_000), data=result_bytes(0, 1, 0))
    lose_attempt(big, big_manifest, 3_001)
    plant_eval_history(LocalStore(root / "eval-history"), "arith", "models/tiny", [150, 152, 149, 118],
                       runs_root=LocalStore(root))  # fmt: skip
    _plant_fleet(fleet_redis, manifest.job_id)
    with dashboard_server(root, redis_url=fleet_redis) as server:
        server.jobs = {"running": manifest.job_id, "done": done_manifest.job_id, "big": big_manifest.job_id}  # type: ignore[attr-defined]
        yield server


def _plant_fleet(url: str, job_id: str) -> None:
    live = LiveState(url)
    now = time.time()
    live.init_job(job_id, output="/runs/nightly", queue=queue_for_model("models/tiny"), model="models/tiny",
                  est_tokens={i: 100 for i in range(12)}, committed=range(7))  # fmt: skip
    live.transition(job_id, 10, "running")
    live.heartbeat(WorkerBeat(worker_id="gpu-a/1", busy=True, instance_id="i-0abc", queue=queue_for_model("models/tiny"),
                              tokens_per_second=812.5, heartbeat=now - 3, job_id=job_id, shard=10, attempt=1,
                              model="models/tiny"))  # fmt: skip
    live.client.rpush(queue_for_model("models/tiny"), *[json.dumps({"shard": i}) for i in range(4)])
    decisions = DecisionLog(live.client, "freight-workers")
    decisions.record({"desired": 2, "previous": 0, "demand": 2, "reason": "scale_out", "queued_shards": 4,
                      "running_shards": 0, "live_workers": 0, "busy_workers": 0}, now - 120)  # fmt: skip
    decisions.record({"desired": 2, "previous": 2, "demand": 2, "reason": "steady", "queued_shards": 4,
                      "running_shards": 1, "live_workers": 1, "busy_workers": 1}, now - 60)  # fmt: skip
    live.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as driver:
        yield driver


def test_jobs_page_lists_every_job_and_follows_the_store(site: DashboardServer, browser) -> None:  # type: ignore[no-untyped-def]
    browser.get(site.url + "/")
    rows = browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")
    assert {r.get_attribute("data-ref") for r in rows} == set(site.jobs.values())  # type: ignore[attr-defined]
    assert "127.0.0.1 only" in browser.find_element(By.ID, "local-only").text
    nightly = browser.find_element(By.CSS_SELECTOR, f'tr[data-ref="{site.jobs["running"]}"]')  # type: ignore[attr-defined]
    assert "14/24 rows (58%)" in nightly.text and "incomplete" not in nightly.text  # Redis says running
    assert "running" in nightly.text
    browser.execute_script("window.loadedOnce = true")
    # a new job under the store appears, and its progress moves, with no reload
    late, manifest = plant_job(str(site.store.root / "later" / "job"), shards=4)
    wait_for("the new job's row", lambda: browser.find_elements(By.CSS_SELECTOR, f'tr[data-ref="{manifest.job_id}"]'))
    commit(late, manifest, [0, 1])
    bar = f'tr[data-ref="{manifest.job_id}"] progress'
    wait_for("50%", lambda: browser.execute_script(f"return document.querySelector('{bar}').value") == 0.5)
    assert browser.execute_script("return window.loadedOnce") is True
    screenshot(browser, "dashboard-jobs")
    # filters: by state, and the local runs (no tenant)
    browser.get(site.url + "/?state=succeeded")
    assert [r.get_attribute("data-ref") for r in browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")] == [
        site.jobs["done"]]  # type: ignore[attr-defined]  # fmt: skip
    assert console_errors(browser) == []


def test_job_page_draws_its_cost_chart_and_shard_grid(site: DashboardServer, browser) -> None:  # type: ignore[no-untyped-def]
    browser.get(f"{site.url}/jobs/{site.jobs['running']}")  # type: ignore[attr-defined]
    canvas = browser.find_element(By.CSS_SELECTOR, "#cost-time canvas")
    assert canvas.size["width"] > 200 and canvas.size["height"] > 100
    line = browser.execute_script("return freightCharts['cost-time'].data")
    assert len(line[0]) == 8 and line[1][-1] == pytest.approx(7 * 3 * 1.2 / 3600 + 0.001)  # 7 shards + 1 attempt
    assert browser.execute_script("return freightCharts['cost-parts'].data[3][2]") == pytest.approx(0.001)  # waste
    # the canvas holds a drawing, not a blank
    painted = browser.execute_script(
        "const c = document.querySelector('#cost-time canvas'); const d = c.getContext('2d')"
        ".getImageData(0, 0, c.width, c.height).data; let n = 0; for (let i = 3; i < d.length; i += 4) n += d[i] > 0;"
        " return n;")  # fmt: skip
    assert painted > 1000
    cells = browser.execute_script("return Array.from(document.querySelectorAll('#grid i')).map(c => c.className)")
    assert cells == ["g-c"] * 7 + ["g-q", "g-t", "g-p", "g-r", "g-q"]
    legend = {b.get_attribute("data-state"): b.text for b in browser.find_elements(By.CSS_SELECTOR, "#grid-legend b")}
    assert legend == {"committed": "7", "running": "1", "retried": "1", "poison": "1", "pending": "2"}
    grid = browser.find_elements(By.CSS_SELECTOR, "#grid i")
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('mouseover', {bubbles: true}))", grid[10])
    assert browser.find_element(By.ID, "grid-hover").text == "shard 10: running, on gpu-a/1"
    failed = browser.find_elements(By.CSS_SELECTOR, "#failed-rows tbody tr")
    assert len(failed) == 7 and "context is 8192" in failed[0].text
    assert "worker crashed 3 times" in browser.find_element(By.ID, "poison").text
    assert "speculative acceptance" in browser.find_element(By.ID, "extras").text
    links = [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "#downloads a")]
    assert [link.rsplit("/", 1)[-1] for link in links] == ["results.parquet", "output.jsonl", "errors.jsonl"]
    screenshot(browser, "dashboard-job")
    assert console_errors(browser) == []


def test_eval_trends_show_the_planted_regression_in_red(site: DashboardServer, browser) -> None:  # type: ignore[no-untyped-def]
    browser.get(site.url + "/evals")
    flagged = browser.find_elements(By.CSS_SELECTOR, "td.regression")
    assert len(flagged) == 1 and "59.0%" in flagged[0].text and "regression" in flagged[0].text
    assert browser.execute_script("return getComputedStyle(arguments[0]).color", flagged[0]) == "rgb(198, 40, 40)"
    # the chart: the interval as a band, the regressed run as the only point of the red series
    data = browser.execute_script("return freightCharts['0:exact_match'].data")
    assert data[4] == [None, None, None, pytest.approx(59.0)]
    assert all(low < score < high for score, low, high in zip(data[1], data[2], data[3], strict=True))
    assert browser.find_element(By.CSS_SELECTOR, ".regression-badge").text == "regressed in the latest run"
    # each run names its checkpoint: the regressed run is the one on a new checkpoint
    prints = [td.get_attribute("title") for td in browser.find_elements(By.CSS_SELECTOR, "table.runs td.mono")]
    assert prints == [CHECKPOINTS[1]] + [CHECKPOINTS[0]] * 3  # newest run first
    screenshot(browser, "dashboard-evals")
    assert console_errors(browser) == []


def test_a_10000_shard_job_page_renders_in_under_2_s(site: DashboardServer, browser) -> None:  # type: ignore[no-untyped-def]
    url = f"{site.url}/jobs/{site.jobs['big']}"  # type: ignore[attr-defined]
    browser.get(url)  # the first look reads the 3,000 records; the page below is the dashboard's steady state
    browser.get(url)
    timing = browser.execute_script(
        "const n = performance.getEntriesByType('navigation')[0]; return [n.responseStart, n.loadEventEnd]")
    assert browser.execute_script("return document.querySelectorAll('#grid i').length") == 10_000
    assert browser.execute_script("return freightCharts['cost-time'].data[0].length") == 400
    assert timing[1] < 2000, f"the page took {timing[1]:.0f} ms to render (server answered at {timing[0]:.0f} ms)"
    assert console_errors(browser) == []


def test_fleet_page_shows_workers_queues_and_decisions(site: DashboardServer, browser) -> None:  # type: ignore[no-untyped-def]
    browser.get(site.url + "/fleet")
    workers = browser.find_element(By.ID, "workers").text
    assert "gpu-a/1" in workers and "tiny" in workers and "shard 10 (attempt 1)" in workers and "812.5" in workers
    assert "4" in browser.find_element(By.CSS_SELECTOR, "#queues tbody tr").text
    decisions = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#decisions tbody tr")]
    assert "steady" in decisions[0] and "scale_out" in decisions[1]
    screenshot(browser, "dashboard-fleet")
    assert console_errors(browser) == []


def test_pages_set_a_content_security_policy(site: DashboardServer) -> None:
    import httpx2

    for path in ("/", f"/jobs/{site.jobs['done']}", "/evals", "/fleet", "/static/job.js"):  # type: ignore[attr-defined]
        response = httpx2.get(site.url + path)
        assert response.status_code == 200, path
        assert "script-src 'self'" in response.headers["content-security-policy"]
        assert response.headers["x-frame-options"] == "DENY"
    body = httpx2.get(site.url + "/").text
    assert "<script>" not in body and " style=" not in body  # nothing inline for the policy to refuse

