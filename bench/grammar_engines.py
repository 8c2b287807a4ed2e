"""llguidance vs xgrammar on freight's tokenizers: the measurement behind the grammar-engine choice.

    .venv/bin/python bench/grammar_engines.py                 # both libraries (xgrammar: pip install it)
    .venv/bin/python bench/grammar_engines.py --steps 400     # longer random walks

For each tokenizer (the tests' tiny demo tokenizer, examples/models/pycoder-tiny's, the bench's
"medium" demo tokenizer) and each library: the time to build the tokenizer information, to compile
bench/nested_schema.json (nested objects, $defs/$ref, enums, arrays, a pattern; its cache bypassed),
and the mask fill time per token per sequence, over a seeded random walk through the grammar (each
step: fill the allowed-token bitmask, pick a random allowed token, consume it; a finished walk starts
again). Also the install footprint each library adds to the runtime install (its own files plus
the packages it requires that freight's runtime does not already have). Numbers are CPU-side and
single-threaded; the machine may be loaded (2 shared cores).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata as md
import json
import random
import re
import tempfile
import time
import tomllib
from pathlib import Path

import torch

from worker.demo_model import make_demo_model

SCHEMA = json.loads((Path(__file__).parent / "nested_schema.json").read_text())


def _runtime() -> set[str]:
    """freight's runtime dependencies and everything they require (already installed by freight)."""
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    deps = tomllib.loads(text)["project"]["dependencies"]
    names = {re.split(r"[\[<>=!~ ;]", d)[0].lower().replace("_", "-") for d in deps}
    seen = set(names)
    for name in names:
        _requires(name, seen, set())
    return seen


def _dist_bytes(name: str) -> int:
    dist = md.distribution(name)
    return sum(dist.locate_file(f).stat().st_size for f in dist.files or [] if dist.locate_file(f).exists())


def _requires(name: str, seen: set[str], skip: set[str]) -> None:
    """Add to `seen` the packages `name` requires (transitively), except those in `skip`."""
    try:
        reqs = md.requires(name) or []
    except md.PackageNotFoundError:
        return
    for req in reqs:
        if "extra ==" in req:
            continue
        dep = re.split(r"[\[<>=!~ ;(]", req)[0].strip().lower().replace("_", "-")
        if dep and dep not in seen and dep not in skip:
            seen.add(dep)
            _requires(dep, seen, skip)


def footprint(name: str) -> tuple[int, list[str]]:
    """Bytes on disk of `name` plus the packages it pulls in beyond freight's runtime."""
    extra: set[str] = set()
    _requires(name, extra, _runtime())
    total = _dist_bytes(name)
    for dep in extra:
        with contextlib.suppress(md.PackageNotFoundError):
            total += _dist_bytes(dep)
    return total, sorted(extra)


def walk(fill, allowed_of, consume, reset, steps: int, seed: int = 0) -> float:
    """Seconds per mask fill over a seeded random walk of `steps` tokens."""
    rng = random.Random(seed)
    spent = 0.0
    for _ in range(20):  # warm-up (first masks build the library's caches), not timed
        allowed = allowed_of(fill())
        if not allowed or not consume(rng.choice(allowed)):
            reset()
    reset()
    for _ in range(steps):
        t0 = time.perf_counter()
        mask = fill()
        spent += time.perf_counter() - t0
        allowed = allowed_of(mask)
        if not allowed or not consume(rng.choice(allowed)):
            reset()
    return spent / steps


def unpack(bitmask: torch.Tensor, vocab: int) -> list[int]:
    bits = (bitmask[0, :, None] >> torch.arange(32, dtype=torch.int32)) & 1
    return torch.nonzero(bits.reshape(-1)[:vocab]).flatten().tolist()


def bench_llguidance(tokenizer_json: str, vocab: int, eos: int, steps: int) -> dict[str, float]:
    import llguidance
    import llguidance.torch as llt

    t0 = time.perf_counter()
    tok = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=eos)
    t_tok = time.perf_counter() - t0
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    t0 = time.perf_counter()
    matcher = llguidance.LLMatcher(tok, grammar)
    t_compile = time.perf_counter() - t0
    assert not matcher.is_error(), matcher.get_error()
    bitmask = llt.allocate_token_bitmask(1, vocab)

    def fill() -> torch.Tensor:
        llt.fill_next_token_bitmask(matcher, bitmask, 0)
        return bitmask

    per = walk(fill, lambda m: unpack(m, vocab), matcher.consume_token, matcher.reset, steps)
    return {"tokenizer_s": t_tok, "compile_s": t_compile, "fill_us": per * 1e6}


def bench_xgrammar(model_dir: Path, vocab: int, steps: int) -> dict[str, float]:
    import transformers
    import xgrammar as xgr

    t0 = time.perf_counter()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    t_tok = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
    t_compile = time.perf_counter() - t0
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab)

    def fill() -> torch.Tensor:
        matcher.fill_next_token_bitmask(bitmask, 0)
        return bitmask

    per = walk(fill, lambda m: unpack(m, vocab), matcher.accept_token, matcher.reset, steps)
    return {"tokenizer_s": t_tok, "compile_s": t_compile, "fill_us": per * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {
            "demo tiny (tests)": make_demo_model(Path(tmp) / "tiny", "llama", size="tiny"),
            "pycoder-tiny": root / "examples" / "models" / "pycoder-tiny",
            "demo medium (bench)": make_demo_model(Path(tmp) / "medium", "llama", size="medium"),
        }
        print(f"{'tokenizer':<22} {'vocab':>6} {'library':<11} {'tok info s':>10} {'compile ms':>10} {'fill us/tok':>11}")
        for label, d in dirs.items():
            cfg = json.loads((d / "config.json").read_text())
            vocab, eos = cfg["vocab_size"], cfg["eos_token_id"]
            eos = eos[0] if isinstance(eos, list) else eos
            text = (d / "tokenizer.json").read_text()
            rows = {"llguidance": bench_llguidance(text, vocab, eos, args.steps)}
            with contextlib.suppress(ImportError):
                rows["xgrammar"] = bench_xgrammar(d, vocab, args.steps)
            for lib, r in rows.items():
                print(f"{label:<22} {vocab:>6} {lib:<11} {r['tokenizer_s']:>10.3f} {r['compile_s'] * 1e3:>10.1f} "
                      f"{r['fill_us']:>11.1f}")  # fmt: skip
    for lib in ("llguidance", "xgrammar"):
        try:
            size, deps = footprint(lib)
        except md.PackageNotFoundError:
            continue
        print(f"install footprint {lib}: {size / 1e6:.1f} MB with {len(deps)} packages beyond freight's runtime: "
              f"{', '.join(deps) or '-'}")  # fmt: skip


if __name__ == "__main__":
    main()
