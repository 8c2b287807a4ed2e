"""The semantic cache's hit and wrong-hit rates per threshold, and its nearest-neighbour search
against the peers it was chosen over.

A prompt set with known answers: base questions (the cache), a paraphrase of each (the same
question: a hit is right when it finds its base) and a near-duplicate of each (the same wording with
one number or name changed: a different question, so any hit is wrong). Every prompt is embedded
with freight's embedder (Engine.embed over a `--task embed` checkpoint); each query takes its
nearest cached prompt (faiss IndexFlatIP, exact), and a hit is a similarity at or above the threshold.

    hit rate        paraphrases that hit their own base / paraphrases
    wrong-hit rate  (near-duplicates that hit anything + paraphrases that hit another base) / queries

The peer row is the exact cache (threshold: equal prompts only). The lowest threshold with 0 wrong
hits is the one the docs recommend. With `--ann`, faiss's exact index is measured against HNSW graphs
(faiss IndexHNSWFlat, usearch) on random unit vectors: build and query time, recall of the true
nearest neighbour, ratios to faiss flat.

    .venv/bin/python bench/semantic_cache.py                          # examples/models/pycoder-tiny, mean pooling
    .venv/bin/python bench/semantic_cache.py --embed-model /models/Qwen3-Embedding-0.6B
    .venv/bin/python bench/semantic_cache.py --ann --vectors 20000 --dim 256
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

THRESHOLDS = (0.80, 0.85, 0.90, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999, 1.0)
CITIES = [("France", "Paris", "Spain"), ("Japan", "Tokyo", "Korea"), ("Italy", "Rome", "Greece"),
          ("Canada", "Ottawa", "Mexico"), ("Egypt", "Cairo", "Kenya"), ("Norway", "Oslo", "Sweden")]  # fmt: skip


def prompt_set() -> list[tuple[str, str, str]]:
    """(base, paraphrase, near-duplicate) triples."""
    out: list[tuple[str, str, str]] = []
    for a, b in ((17, 25), (3, 9), (120, 45), (8, 8), (61, 14), (250, 750)):
        out.append((f"What is {a} plus {b}?", f"Compute the sum of {a} and {b}.", f"What is {a} plus {b + 1}?"))
        out.append((f"What is {a} times {b}?", f"Multiply {a} by {b}. What do you get?", f"What is {a + 2} times {b}?"))
    for n in (2, 3, 5, 7):
        out.append((f"How many days are in {n} weeks?", f"{n} weeks have how many days?",
                    f"How many days are in {n + 1} weeks?"))  # fmt: skip
        out.append((f"Convert {n} hours to minutes.", f"How many minutes is {n} hours?",
                    f"Convert {n} hours to seconds."))  # fmt: skip
    for country, _, other in CITIES:
        out.append((f"What is the capital of {country}?", f"Name the capital city of {country}.",
                    f"What is the capital of {other}?"))  # fmt: skip
    for word in ("list", "string", "dictionary", "tuple"):
        out.append((f"Write a Python function that reverses a {word}.", f"In Python, how do I reverse a {word}?",
                    f"Write a Python function that sorts a {word}."))  # fmt: skip
    return out


def embedder_dir(path: str | None, work: Path) -> Path:
    """The embedding checkpoint: `path`, or a copy of examples/models/pycoder-tiny with mean pooling."""
    if path:
        return Path(path)
    from worker.demo_model import add_pooling_config

    src = Path(__file__).resolve().parent.parent / "examples" / "models" / "pycoder-tiny"
    shutil.copytree(src, work / "embedder")
    return add_pooling_config(work / "embedder", "mean", normalize=True)


def rates(triples: list[tuple[str, str, str]], vectors: dict[str, np.ndarray]) -> list[tuple[str, float, float, float]]:
    import faiss

    bases = [t[0] for t in triples]
    index = faiss.IndexFlatIP(len(vectors[bases[0]]))
    index.add(np.stack([vectors[b] for b in bases]))
    queries = [(t[1], i) for i, t in enumerate(triples)] + [(t[2], None) for t in triples]
    sims, ids = index.search(np.stack([vectors[q] for q, _ in queries]), 1)
    paraphrases = len(triples)
    rows = [("exact cache (peer)", 1.0, 0.0, 0.0)]  # no paraphrase is an equal prompt
    for t in THRESHOLDS:
        right = sum(1 for (q, want), s, i in zip(queries, sims[:, 0], ids[:, 0], strict=True) if want is not None and s >= t and i == want)
        wrong = sum(1 for (q, want), s, i in zip(queries, sims[:, 0], ids[:, 0], strict=True) if s >= t and (want is None or i != want))
        rows.append((f"{t:g}", t, right / paraphrases, wrong / len(queries)))
    return rows


def ann(n: int, dim: int, queries: int) -> None:
    import faiss

    rng = np.random.default_rng(0)
    base = rng.standard_normal((n, dim)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    q = base[rng.integers(0, n, queries)] + rng.standard_normal((queries, dim)).astype(np.float32) * 0.3 / np.sqrt(dim)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    results = []
    t0 = time.perf_counter()
    flat = faiss.IndexFlatIP(dim)
    flat.add(base)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, truth = flat.search(q, 1)
    results.append(("faiss IndexFlatIP (exact)", built, time.perf_counter() - t0, 1.0))
    t0 = time.perf_counter()
    hnsw = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(base)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, found = hnsw.search(q, 1)
    results.append(("faiss IndexHNSWFlat M=32", built, time.perf_counter() - t0, float((found == truth).mean())))
    try:
        from usearch.index import Index
    except ImportError:
        print("usearch is not installed (pip install usearch==2.26.6): its row is left out")
    else:
        t0 = time.perf_counter()
        u = Index(ndim=dim, metric="cos", dtype="f32")
        u.add(np.arange(n), base)
        built = time.perf_counter() - t0
        t0 = time.perf_counter()
        m = u.search(q, 1)
        results.append(("usearch HNSW (cos)", built, time.perf_counter() - t0, float((m.keys[:, :1] == truth).mean())))
    ref = results[0][1] + results[0][2]
    print(f"\nnearest neighbour, {n:,} unit vectors of {dim}, {queries} queries (build + query, as a job does once)")
    print(f"{'index':28} {'build s':>9} {'query ms':>9} {'recall@1':>9} {'total vs flat':>14}")
    for name, b, s, r in results:
        print(f"{name:28} {b:9.3f} {s * 1e3:9.1f} {r:9.3f} {(b + s) / ref:13.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embed-model", default=None, help="a --task embed checkpoint (default: pycoder-tiny, mean)")
    ap.add_argument("--ann", action="store_true", help="also measure the nearest-neighbour indexes")
    ap.add_argument("--vectors", type=int, default=20000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--queries", type=int, default=256)
    args = ap.parse_args()
    from worker.engine import Engine, EngineConfig

    with tempfile.TemporaryDirectory(prefix="semantic-bench-") as tmp:
        model = embedder_dir(args.embed_model, Path(tmp))
        engine = Engine.from_pretrained(model, EngineConfig(device="cpu"))
        triples = prompt_set()
        texts = sorted({p for t in triples for p in t})
        vectors = {o_text: o.embedding / np.linalg.norm(o.embedding) for o_text, o in zip(texts, engine.embed(texts), strict=True)}
    print(f"{len(triples)} questions, each with a paraphrase and a near-duplicate; embedder {args.embed_model or 'pycoder-tiny (mean)'}")
    print(f"{'threshold':20} {'hit rate':>9} {'wrong-hit rate':>15}")
    table = rates(triples, vectors)
    for name, _, hit, wrong in table:
        print(f"{name:20} {hit:9.1%} {wrong:15.1%}")
    safe = [(t, hit) for name, t, hit, wrong in table[1:] if wrong == 0.0]
    if safe:
        t, hit = min(safe)
        print(f"lowest threshold with 0 wrong hits: {t:g} (hit rate {hit:.1%})")
    else:
        print("every threshold measured a wrong hit")
    if args.ann:
        ann(args.vectors, args.dim, args.queries)


if __name__ == "__main__":
    main()
