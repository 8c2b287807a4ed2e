"""`freight serve`'s dashboard at `/`, in a real headless Chromium, over a real server whose batches
run embedded on a tiny model: tenant A signs in with its key, a batch it starts appears on the jobs
page and its progress bar moves to 100% without a reload, its page shows the real cost; tenant B,
signed in, sees none of it, by listing or by URL. One browser for the module."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import pytest
from selenium.webdriver.common.by import By

from jobs.api.layout import job_prefix
from jobs.finalize import committed_shards
from jobs.storage import LocalStore
from tests.api.serve_harness import ServeProcess, batch_file, wait_batch
from tests.browser import chromium, console_errors, screenshot, wait_for

REQUESTS, SHARD_ROWS = 24, 2  # 12 shards, committed one by one: a part-done state to hold


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as driver:
        yield driver


def _sign_in(browser, url: str, key: str) -> None:  # type: ignore[no-untyped-def]
    browser.get(url + "/")
    wait_for("the sign-in page", lambda: browser.current_url.startswith(url + "/signin"))
    browser.find_element(By.ID, "key").send_keys(key)
    browser.find_element(By.ID, "signin-button").click()
    wait_for("the jobs page", lambda: browser.find_elements(By.ID, "jobs"))


def _batch_process(server: ServeProcess) -> int:
    """The pid of the server's batch process (its child running freight_cli.batch_process)."""
    pid = server.process.pid
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if b"freight_cli.batch_process" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
    raise AssertionError(f"freight serve (pid {pid}) has no batch process")


@contextmanager
def _held_part_done(server: ServeProcess, prefix: str, shards: int) -> Iterator[None]:
    """Stops (SIGSTOP) the batch process as soon as the job at `prefix` has a committed shard, and
    lets it go on (SIGCONT) on exit; fails when the job was already done by then."""
    pid, out = _batch_process(server), LocalStore(server.store_dir / prefix)
    wait_for("a committed shard", lambda: committed_shards(out), timeout=120, every=0.005)
    os.kill(pid, signal.SIGSTOP)
    try:
        done = len(committed_shards(out))
        assert done < shards, f"all {shards} shards were committed before the batch process was held"
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_tenant_watches_its_batch_finish_and_another_tenant_cannot_see_it(
    serve_process: Callable[..., ServeProcess], served_model: Path, browser, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    server = serve_process("--shard-rows", str(SHARD_ROWS))
    key_a, key_b = server.key("team-a"), server.key("team-b")
    _sign_in(browser, server.url, key_a)
    session = browser.get_cookie("freight_session")
    assert session["httpOnly"] and session["sameSite"] == "Lax" and not session["secure"]  # plain http here
    assert key_a not in session["value"]  # the cookie holds the key's hash, signed; never the key
    assert browser.find_element(By.ID, "tenant").text == "team-a"
    browser.execute_script("window.loadedOnce = true; window.seen = [];")

    client = server.client(key_a)
    upload = client.files.create(file=batch_file(tmp_path / "in.jsonl", REQUESTS, model=str(served_model), max_tokens=24), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    row = f'tr[data-ref="{batch.id}"]'
    wait_for("the batch's row", lambda: browser.find_elements(By.CSS_SELECTOR, row), timeout=30)
    browser.execute_script(  # every 50 ms, what the row's bar shows
        "setInterval(() => { const p = document.querySelector(arguments[0] + ' progress');"
        " if (p) window.seen.push(p.value); }, 50);", row)  # fmt: skip
    # The batch process is held still once a shard, but not every shard, is committed, so a run that
    # takes less than the page's poll period still shows the part-done state it passes through.
    with _held_part_done(server, job_prefix("team-a", batch.id), REQUESTS // SHARD_ROWS):
        wait_for("the bar part done", lambda: browser.execute_script("return window.seen.some(v => v > 0 && v < 1)"),
                 timeout=20)  # fmt: skip
    wait_batch(client, batch.id, timeout=180)
    wait_for("100% on the page", lambda: browser.execute_script("return window.seen.at(-1)") == 1, timeout=20)
    seen = browser.execute_script("return window.seen")
    assert any(0 < v < 1 for v in seen), f"the bar never showed the batch part done: {sorted(set(seen))}"
    assert seen == sorted(seen)  # it only moved forward
    assert browser.execute_script("return window.loadedOnce") is True  # no reload
    assert "succeeded" in browser.find_element(By.CSS_SELECTOR, row).text
    screenshot(browser, "serve-jobs-team-a")

    browser.find_element(By.CSS_SELECTOR, f"{row} a").click()
    wait_for("the cost chart", lambda: browser.execute_script("return window.freightCharts && freightCharts['cost-time']"))
    line = browser.execute_script("return freightCharts['cost-time'].data")
    assert len(line[0]) == REQUESTS // SHARD_ROWS and line[1][-1] > 0  # one point per billed shard
    assert browser.execute_script("return document.querySelectorAll('#grid i.g-c').length") == REQUESTS // SHARD_ROWS
    output = browser.find_element(By.LINK_TEXT, "OpenAI output file").get_attribute("href")
    cookies = {"freight_session": session["value"]}
    lines = httpx2.get(output, cookies=cookies).text.splitlines()
    assert len(lines) == REQUESTS and all('"custom_id": "req-' in line for line in lines)
    screenshot(browser, "serve-job-team-a")
    assert console_errors(browser) == []

    # tenant B: signs out of A (a CSRF-protected form) and in with its own key
    browser.find_element(By.CSS_SELECTOR, "form[action='/signout'] button").click()
    wait_for("the sign-in page", lambda: browser.find_elements(By.ID, "key"))
    _sign_in(browser, server.url, key_b)
    assert browser.find_element(By.ID, "tenant").text == "team-b"
    assert browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr") == []
    browser.get(f"{server.url}/jobs/{batch.id}")
    assert "Not found" in browser.find_element(By.TAG_NAME, "h1").text
    screenshot(browser, "serve-job-team-b-refused")
    b_cookies = {"freight_session": browser.get_cookie("freight_session")["value"]}
    for path in (f"/ui/jobs/{batch.id}.json", f"/jobs/{batch.id}/output.jsonl", f"/jobs/{batch.id}/results.parquet"):
        assert httpx2.get(server.url + path, cookies=b_cookies).status_code == 404, path
    listed = httpx2.get(server.url + "/ui/jobs.json", cookies=b_cookies).json()
    assert listed["jobs"] == [] and listed["total"] == 0
    # the API beside it is untouched: its own JSON errors for unknown paths and methods
    assert httpx2.get(server.url + "/v1/nope").json()["error"]["code"] == "unknown_url"
    assert httpx2.delete(server.url + "/v1/batches", headers={"authorization": f"Bearer {key_a}"}).status_code == 405
