"""A real headless Chromium for the dashboard's tests: Debian's `chromium` and `chromium-driver`
packages (`make test` installs them when missing), driven through Selenium. One browser per test
module; screenshots go to tests/artifacts/ (git ignores it)."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[webdriver.Chrome]:
    """A headless Chromium session (no sandbox: tests run as root in CI's container)."""
    for binary in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(binary) is None:
            pytest.fail(f"{binary} is missing: `make test` installs it (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={width},{height}", "--disable-extensions", "--no-first-run"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver: webdriver.Chrome, name: str) -> Path:
    """A full-page PNG of what the browser shows now, as tests/artifacts/<name>.png."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(max(int(height), 600), 4000))
    path = ARTIFACTS / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', name)}.png"
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)
    assert path.stat().st_size > 10_000, f"{path} looks blank"
    return path


def console_errors(driver: webdriver.Chrome) -> list[str]:
    """The page's console errors since the last call (a Content-Security-Policy refusal is one)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0, every: float = 0.05) -> Any:
    """check()'s first truthy value; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(every)
