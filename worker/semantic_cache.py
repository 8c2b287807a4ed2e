"""The semantic cache (opt-in: `--semantic-cache THRESHOLD --embed-model M`): a row whose prompt is
close enough to a cached prompt of the same model and settings takes that prompt's answer.

Its answer is the answer of a *similar* prompt, not of this one: a question with one number changed
can be more similar than any paraphrase (bench/semantic_cache.py measures hit and wrong-hit rates per
threshold). Such a row carries `cached = "semantic"`, the cosine similarity, and the source row.

- Eligible rows: deterministic generation rows with a text prompt (worker/row_key.py), not served
  exactly. Their prompts are embedded with freight's own embedder, an Engine over the `--task embed`
  checkpoint M (its pooling, normalized), on the job's device.
- Same model and settings: the row's group is the digest of its answer fields with the prompt left
  out (and the echoed prompt), in the job's space: only rows asking the same thing of the same model
  are compared.
- The vectors live in the result cache's segments beside the answers (`group`, `vector`), written for
  the rows a job with the semantic cache computed; the index metadata names the embedder (its content
  fingerprint and numerics), so vectors of another embedder are never compared.
- Search: faiss's exact inner-product index (IndexFlatIP) over each group's normalized vectors, built
  once per job per process from the segments that hold vectors of this embedder. Exact search never
  returns a neighbour that is not the nearest; bench/semantic_cache.py `--ann` measures it against
  HNSW graphs (faiss, usearch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jobs.log import get_logger
from jobs.model_cache import resolve_model
from jobs.model_fingerprint import model_fingerprint
from jobs.result_cache.options import CacheOptions
from jobs.result_cache.segments import KEY_BYTES
from jobs.settings import Settings
from worker.cached_rows import cached_result
from worker.row_key import deterministic, row_digest
from worker.row_requests import RowRequest
from worker.shard_rows import RowResult

log = get_logger(__name__)


@dataclass
class SemanticLookup:
    """What the semantic cache made of a shard's rows: hits (row -> result), the engine seconds of
    their answers, and every embedded row's group and vector (written with the rows it computes)."""

    hits: dict[int, RowResult] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)
    vectors: dict[int, tuple[bytes, list[float]]] = field(default_factory=dict)


class SemanticCache:
    """A job's semantic cache: its embedder, threshold, and the groups' vector indexes."""

    def __init__(self, job: Any, embedder_engine: Any, embedder: str, threshold: float) -> None:
        self.job, self.engine, self.embedder, self.threshold = job, embedder_engine, embedder, threshold
        self._groups: dict[bytes, tuple[Any, list[bytes]]] | None = None

    @staticmethod
    def eligible(req: RowRequest) -> bool:
        return deterministic(req) and req.sampling is not None and isinstance(req.prompt, str) and req.endpoint != "embeddings"

    def group(self, req: RowRequest) -> bytes:
        """The row's settings without its prompt, in the job's space."""
        bare = dataclasses.replace(req, prompt=None, echo_text=None)
        return row_digest(bare, {"space": self.job.space.space, "semantic": True})[:KEY_BYTES]

    def _load(self) -> dict[bytes, tuple[Any, list[bytes]]]:
        """Each group's faiss index over the cached vectors of this embedder, and the entry keys."""
        import faiss

        if self._groups is not None:
            return self._groups
        vectors: dict[bytes, list[list[float]]] = {}
        keys: dict[bytes, list[bytes]] = {}
        for name in self.job.space.segments_with_vectors(self.embedder):
            for e in self.job.space.segment_entries(name):
                if e.group is None or e.vector is None:
                    continue
                vectors.setdefault(e.group, []).append(e.vector)
                keys.setdefault(e.group, []).append(e.key)
        groups: dict[bytes, tuple[Any, list[bytes]]] = {}
        for group, vecs in vectors.items():
            mat = _normalized(np.asarray(vecs, np.float32))
            index = faiss.IndexFlatIP(mat.shape[1])
            index.add(mat)
            groups[group] = (index, keys[group])
        self._groups = groups
        return groups

    def lookup(self, requests: list[RowRequest]) -> SemanticLookup:
        """Embed the eligible rows of `requests`; those whose nearest cached prompt of their group is
        at least `threshold` similar take its answer."""
        out = SemanticLookup()
        rows = [r for r in requests if self.eligible(r)]
        if not rows:
            return out
        embedded = self.engine.embed([r.prompt for r in rows])
        groups = self._load()
        wanted: dict[bytes, tuple[RowRequest, float]] = {}
        for req, emb in zip(rows, embedded, strict=True):
            if emb.error is not None or emb.embedding is None:
                continue
            vec = _normalized(np.asarray(emb.embedding, np.float32)[None, :])
            group = self.group(req)
            out.vectors[req.row] = (group, vec[0].tolist())
            found = groups.get(group)
            if found is None or found[0].ntotal == 0 or found[0].d != vec.shape[1]:
                continue
            sims, ids = found[0].search(vec, 1)
            similarity = float(sims[0, 0])
            if ids[0, 0] >= 0 and similarity >= self.threshold:
                wanted[found[1][ids[0, 0]]] = (req, min(similarity, 1.0))
        for key, hit in self.job.space.lookup(list(wanted)).items():
            req, similarity = wanted[key]
            out.hits[req.row] = cached_result(req, hit.entry, "semantic", similarity)
            out.seconds[req.row] = hit.entry.seconds
        return out


def _normalized(mat: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    return mat / np.where(norms == 0, 1.0, norms)


def open_semantic_cache(job: Any, options: CacheOptions, settings: Settings, device: str | None = None) -> SemanticCache | None:
    """The job's semantic cache with its embedder loaded (None when it cannot load: logged, the job
    runs with the exact cache alone)."""
    from safetensors import SafetensorError

    from jobs.errors import FreightError
    from worker.engine import Engine, EngineConfig
    from worker.engine.numerics import engine_numerics

    assert options.embed_model is not None and options.semantic_threshold is not None  # CacheOptions' rule
    try:
        model_dir = resolve_model(options.embed_model, settings)
        engine = Engine.from_pretrained(str(model_dir), EngineConfig(device=device or "cpu"))
        fingerprint = model_fingerprint(model_dir, settings)
    except (FreightError, ValueError, KeyError, OSError, SafetensorError) as exc:
        log.warning("semantic_cache_off", embed_model=options.embed_model, error=str(exc))
        return None
    embedder = f"{fingerprint}|{engine_numerics(engine.config)}"
    return SemanticCache(job, engine, embedder, options.semantic_threshold)
