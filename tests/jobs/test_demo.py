"""`make demo` as a newcomer sees it: it says what the model is, and most of the trained demo model's
completions read as Python (the first model answered 12 of 32 prompts with "\\n#\\n#\\n#"); its
second job extracts a JSON object per code snippet under a JSON schema."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as pads
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]


def reads_as_python(prompt: str, completion: str) -> bool:
    """The prompt plus the completion's whole lines parse as Python, once what the cut left open is
    closed (a docstring with its quotes, a block with `pass`); a completion of only comments or blank
    lines does not count."""
    lines = completion.splitlines()
    if not any(line.strip() and not line.strip().startswith("#") for line in lines):
        return False
    whole = completion[: completion.rfind("\n") + 1] if "\n" in completion else completion
    text = (prompt + whole).rstrip("\n")
    for quotes in ("", '"""', "\'\'\'"):
        for block in ("", "\n    pass", "\n        pass", "\n            pass"):
            try:
                ast.parse(text + quotes + block)
                return True
            except SyntaxError:
                continue
    return False


def test_the_heuristic() -> None:
    assert reads_as_python("def f(n):\n", "    if n < 2:\n        return n\n    return f(n")
    assert not reads_as_python("def f(n):\n", "\n#\n#\n#\n")
    assert not reads_as_python("def f(n):\n", "\ndef _get_version(None):\n    pass\n")
    assert reads_as_python("def f(n):\n", '    """Return the nth number.\n\n    The first is\n    more')


def test_make_demo(tmp_path: Path) -> None:
    env = {**os.environ, "FREIGHT_LOG_LEVEL": "warning", "FREIGHT_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--workdir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert "pycoder-tiny, a 5.2M-parameter Llama" in proc.stdout and "not programs that work" in proc.stdout
    assert "--- fn-00: the prompt, then what the model wrote after it ---" in proc.stdout
    prompts = {r["id"]: r["prompt"] for r in pq.read_table(tmp_path / "prompts.parquet").to_pylist()}
    rows = pads.dataset(tmp_path / "out" / "shards").to_table()
    completions = {r["id"]: r["completion"] or "" for r in rows.to_pylist()}
    assert len(completions) == len(prompts) == 32
    good = sorted(i for i in prompts if reads_as_python(prompts[i], completions[i]))
    assert len(good) >= 24, {i: completions[i] for i in prompts if i not in good}
    _check_extraction(proc, tmp_path)


def _check_extraction(proc: subprocess.CompletedProcess[str], work: Path) -> None:
    """The second job: a JSON object per snippet, each `parsed` value valid against the schema, shown
    in a table."""
    import json

    import jsonschema

    sys.path.insert(0, str(ROOT / "examples"))
    from demo_data import EXTRACT_SCHEMA, SNIPPETS

    rows = {r["id"]: r for r in pads.dataset(work / "extract" / "shards").to_table().to_pylist()}
    assert set(rows) == set(SNIPPETS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "what the model extracted" in proc.stdout
    parsed = [r["parsed"] for r in rows.values() if r["parsed"] is not None]
    assert len(parsed) >= len(SNIPPETS) // 2, rows
    for value in parsed:
        jsonschema.validate(json.loads(value), EXTRACT_SCHEMA)
