"""The demo dataset: a few dozen Python-completion prompts, most behind one shared instruction prefix."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# A shared instruction long enough (> 64 characters, several KV blocks) for the planner to keep its
# rows in one shard and for the engine's prefix cache to reuse it.
INSTRUCTION = (
    "# Complete the following Python function. Keep it short, readable and correct;\n"
    "# use only the standard library.\n\n"
)
FUNCTIONS = [
    "def fibonacci(n):",
    "def is_prime(n):",
    "def reverse_words(text):",
    "def flatten(nested):",
    "def word_count(path):",
    "def merge_sorted(a, b):",
    "def chunked(items, size):",
    "def median(values):",
    "def parse_csv_line(line):",
    "def slugify(title):",
    "def gcd(a, b):",
    "def transpose(matrix):",
    "def unique_everseen(iterable):",
    "def binary_search(items, target):",
    "def read_json(path):",
    "def camel_to_snake(name):",
    "def rotate(items, k):",
    "def count_vowels(text):",
    "def dedent_block(text):",
    "def running_mean(values):",
    "def is_palindrome(text):",
    "def histogram(values, bins):",
    "def deep_merge(a, b):",
    "def format_bytes(n):",
]
STANDALONE = [
    "import os\n\ndef list_python_files(root):",
    "class Stack:\n    def __init__(self):",
    "def main():\n    import argparse\n",
    "with open('data.txt') as f:\n",
    "from dataclasses import dataclass\n\n@dataclass\nclass Point:",
    "def quicksort(xs):\n    if len(xs) <= 1:\n",
    "for i in range(10):\n",
    'def add(a, b):\n    """Return a + b."""\n',
]


def make_demo_dataset(path: str | Path) -> Path:
    """Write the demo Parquet (columns id, prompt; 32 rows) and return its path."""
    ids: list[str] = []
    prompts: list[str] = []
    for i, fn in enumerate(FUNCTIONS):
        ids.append(f"fn-{i:02d}")
        prompts.append(INSTRUCTION + fn + "\n")
    for i, code in enumerate(STANDALONE):
        ids.append(f"code-{i:02d}")
        prompts.append(code)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "prompt": prompts}), path)
    return path


# The second job: one JSON object per code snippet, its shape fixed by a JSON schema (structured
# output). Identifier patterns of bounded length and a short list keep a small model's answers
# readable and complete within the token budget.
EXTRACT_SCHEMA = {
    "type": "object",
    "properties": {
        "function": {"type": "string", "pattern": "^[a-z_][a-z0-9_]{0,23}$"},
        "args": {"type": "array", "items": {"type": "string", "pattern": "^[a-z_][a-z0-9_]{0,11}$"}, "maxItems": 4},
        "returns_value": {"type": "boolean"},
    },
    "required": ["function", "args", "returns_value"],
    "additionalProperties": False,
}
SNIPPETS = {
    "gcd": "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n",
    "greet": "def greet(name):\n    print(f'hello, {name}')\n",
    "median": "def median(values):\n    s = sorted(values)\n    return s[len(s) // 2]\n",
    "save": "def save(path, text):\n    with open(path, 'w') as f:\n        f.write(text)\n",
    "is_even": "def is_even(n):\n    return n % 2 == 0\n",
    "log_all": "def log_all(items, prefix):\n    for item in items:\n        print(prefix, item)\n",
    "clamp": "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
    "reset": "def reset(state):\n    state.clear()\n",
}
EXTRACT_PROMPT = "{code}\n# The function above, described as JSON (name, argument names, returns a value):\n"


def make_extract_dataset(path: str | Path) -> Path:
    """Write the extraction job's Parquet (columns id, prompt; one code snippet a row)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prompts = [EXTRACT_PROMPT.format(code=code) for code in SNIPPETS.values()]
    pq.write_table(pa.table({"id": list(SNIPPETS), "prompt": prompts}), path)
    return path
