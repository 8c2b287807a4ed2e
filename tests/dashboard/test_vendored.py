"""The chart library is the published package's file, unchanged, and the pages fetch nothing from
outside the server."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import jobs.dashboard

HERE = Path(jobs.dashboard.__file__).parent
VENDOR = HERE / "static" / "vendor"


def test_vendored_files_match_the_checksums_in_their_readme() -> None:
    table = (VENDOR / "README.md").read_text()
    rows = re.findall(r"^\| (\S+) \| npm `uplot` [^|]+\| (\d+\.\d+\.\d+) \| MIT [^|]+\| ([0-9a-f]{64}) \|$", table, re.M)
    assert {name for name, _, _ in rows} == {"uPlot.iife.min.js", "uPlot.min.css"}
    for name, version, digest in rows:
        data = (VENDOR / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, name
        if name.endswith(".js"):
            assert data.startswith(f"/*! https://github.com/leeoniya/uPlot (v{version}) */".encode())
    assert "MIT License" in (VENDOR / "uPlot.LICENSE").read_text()


def test_pages_and_scripts_name_no_outside_address() -> None:
    ours = [*HERE.glob("templates/*.html"), *HERE.glob("static/*.js"), *HERE.glob("static/*.css")]
    assert ours
    for path in ours:
        text = path.read_text()
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", text), f"{path.name} names an outside address"
        assert "<script>" not in text and " style=" not in text and "innerHTML" not in text, path.name
