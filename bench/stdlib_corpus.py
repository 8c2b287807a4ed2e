"""The reference model's corpus: the running interpreter's standard library, and its fixed split.

Every `*.py` file of the stdlib (`sysconfig` "stdlib"), skipping site-packages, test suites, idlelib and
the files that are data rather than code (see bench/train_reference.py for why), read as UTF-8. A file
is held out when the first byte of sha256(its path relative to the stdlib, POSIX separators) is below
HELDOUT_THRESHOLD (about 10% of files), independent of file order."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import torch

EOS = "<|endoftext|>"  # the tokenizer's end-of-text token, after every file in a token stream
SKIP_DIRS = {"site-packages", "test", "tests", "idlelib", "__pycache__", "encodings", "pydoc_data"}
SKIP_FILES = {"html/entities.py"}  # a table of character names
SKIP_PREFIXES = ("_sysconfigdata",)  # build settings as one dict literal
HELDOUT_THRESHOLD = 26  # first sha256 byte < 26 -> held out (26/256 ~ 10% of files)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(rel_path: str) -> bool:
    """The split: held out iff sha256(relative POSIX path)[0] < HELDOUT_THRESHOLD."""
    return hashlib.sha256(rel_path.encode()).digest()[0] < HELDOUT_THRESHOLD


def corpus_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """(relative path, absolute path) of every corpus file, sorted by relative path."""
    root = root or stdlib_root()
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if (
            SKIP_DIRS.intersection(rel.split("/")[:-1])
            or rel in SKIP_FILES
            or path.name.startswith(SKIP_PREFIXES)
        ):
            continue
        out.append((rel, path))
    return sorted(out)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def train_files(root: Path | None = None) -> list[str]:
    """Texts of the training files, in sorted path order."""
    texts = (_read(p) for rel, p in corpus_files(root) if not is_heldout(rel))
    return [t for t in texts if t]


def heldout_files(root: Path | None = None) -> list[tuple[str, str]]:
    """(relative path, text) of the held-out files, in sorted path order."""
    pairs = ((rel, _read(p)) for rel, p in corpus_files(root) if is_heldout(rel))
    return [(rel, t) for rel, t in pairs if t]


def token_stream(tok, texts: list[str]) -> torch.Tensor:
    """All texts encoded and joined, each followed by EOS: int64 [total_tokens]."""
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)
