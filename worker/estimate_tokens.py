"""The token counts of a job before it runs, read the way the shards will read it: every shard's rows
through `build_requests` (overrides, chat templates, likelihood), tokenized with the model's
tokenizer, and the prefill the prefix cache leaves to compute.

Prefix cache model (the engine's block manager): a prompt's leading full blocks (block_size tokens,
hashed with their parents) already computed by an earlier prompt of the job are reused; the rest is
computed. One engine runs the job's shards in plan order (the embedded runner; on a fleet each worker
has its own cache, so the figure is a lower bound there). A fully cached prompt still computes its
last token (the engine needs its logits). The engine's block hashes start from the row's LoRA adapter, so
rows of different adapters (or an adapter and the model) never share blocks here either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jobs.datasets import InputReader
from jobs.manifest import Manifest
from jobs.profile_store import expected_tokens
from jobs.settings import Settings
from worker.row_dedup import find_duplicates
from worker.row_requests import RowRequest, build_requests

BLOCK_SIZE = 16  # EngineConfig's default block size


@dataclass(frozen=True)
class TokenCounts:
    """What the job's prompts hold and ask for. Rows with bad input count in `rows_bad` only.

    `decode_context_tokens`: the attention work of decoding, the sum over every generated token of
    the context it attends (a row of P prompt tokens generating G: G*P + G*(G-1)/2), with G =
    the row's expected length (jobs.profile_store.expected_tokens at the profile's stop hazard);
    `expected_completion_tokens` their sum; `shard_decode` holds (generated tokens, context tokens) per shard."""

    rows: int
    rows_bad: int
    prompt_tokens: int
    computed_prompt_tokens: int
    max_completion_tokens: int  # sum over the good rows of their max_tokens
    shards: int
    expected_completion_tokens: float = 0.0
    decode_context_tokens: float = 0.0
    shard_decode: tuple[tuple[float, float], ...] = ()
    rows_deduplicated: int = 0  # rows that take the answer of an equal row of their shard (computed once)
    rows_cached: int = 0  # rows the result cache's index holds: served, not computed
    # a job with LoRA adapters: per adapter ("" for the model's own rows) the rows it computes and their
    # tokens (rows, computed_prompt_tokens, expected_completion_tokens, decode_context_tokens)
    adapters: dict[str, tuple[int, int, float, float]] = field(default_factory=dict)


def count_tokens(manifest: Manifest, tokenizer: Any, settings: Settings | None = None,
                 max_model_len: int | None = None, block_size: int = BLOCK_SIZE,
                 stop_hazard: float = 0.0, cache_hits: Callable[[list[RowRequest]], set[int]] | None = None,
                 ) -> TokenCounts:  # fmt: skip
    """Read every shard's rows and count (see the module docstring). A prompt of `max_model_len`
    tokens or more is a bad row, as the engine refuses it. A shard's duplicate rows
    (worker/row_dedup.py) and the rows `cache_hits` names (the result cache's expected hits) count as
    rows, not as work."""
    reader = InputReader(manifest.input, settings)
    max_chars = tokenizer.max_text_chars(max_model_len) if max_model_len is not None else None
    seen: set[int] = set()  # hashes of full prefix blocks computed so far (chained with the parent)
    rows = bad = prompt = computed = max_out = deduplicated = from_cache = 0
    expected = 0.0
    per_shard: list[tuple[float, float]] = []
    by_adapter: dict[str, list[float]] = {}  # name -> [rows, computed prompt, expected completion, context]
    for shard in manifest.shards:
        generated = context = 0.0
        indices = shard.row_indices()
        table = reader.read(shard.ranges)
        requests = build_requests(table, indices, manifest.spec, manifest.input, tokenizer)
        dups = find_duplicates([r for r in requests if r.error is None])
        hit = cache_hits(dups.unique) if cache_hits is not None else set()
        reused = {c.row for original, copies in dups.copies.items() for c in copies} | hit
        deduplicated += sum(len(copies) for original, copies in dups.copies.items() if original not in hit)
        from_cache += len(hit) + sum(len(copies) for original, copies in dups.copies.items() if original in hit)
        requests = [r for r in requests if r.row not in reused]
        rows += len(reused)
        texts = [r.prompt for r in requests if _encodable(r.prompt, max_chars)]
        encoded = iter(tokenizer.encode_batch(texts)) if texts else iter(())
        for req in requests:
            rows += 1
            if req.error is not None or (isinstance(req.prompt, str) and not _encodable(req.prompt, max_chars)):
                bad += 1  # a text longer than any that fits: refused untokenized, as the engine does
                continue
            ids = next(encoded) if isinstance(req.prompt, str) else list(req.prompt or [])
            # as the engine refuses prompts: a generation needs room for one token, an embedding not
            room = 0 if req.sampling is None else 1
            if not ids or (max_model_len is not None and len(ids) + room > max_model_len):
                bad += 1
                continue
            prompt += len(ids)
            if req.sampling is None:  # an embedding: prefill only, no prefix cache (nothing is kept)
                computed += len(ids)
                continue
            n = req.sampling.n  # n choices share the prompt, each generates
            max_out += req.sampling.max_tokens * n
            per = expected_tokens(req.sampling.max_tokens, stop_hazard)  # one choice's expected length
            generated += per * n
            expected += per * n
            context += n * (per * len(ids) + per * max(per - 1.0, 0.0) / 2.0)
            cached, parent = 0, 0 if req.adapter is None else hash(("adapter", req.adapter))
            for start in range(0, len(ids) - len(ids) % block_size, block_size):
                parent = hash((parent, tuple(ids[start : start + block_size])))
                if parent in seen and cached == start:
                    cached = start + block_size
                seen.add(parent)
            computed += len(ids) - min(cached, len(ids) - 1)
            if manifest.spec.loras:
                mine = by_adapter.setdefault(req.adapter or "", [0, 0, 0.0, 0.0])
                mine[0] += 1
                mine[1] += len(ids) - min(cached, len(ids) - 1)
                mine[2] += per * n
                mine[3] += n * (per * len(ids) + per * max(per - 1.0, 0.0) / 2.0)
        per_shard.append((generated, context))
    return TokenCounts(rows=rows, rows_bad=bad, prompt_tokens=prompt, computed_prompt_tokens=computed,
                       max_completion_tokens=max_out, shards=len(manifest.shards), expected_completion_tokens=expected,
                       decode_context_tokens=sum(c for _, c in per_shard), shard_decode=tuple(per_shard),
                       rows_deduplicated=deduplicated, rows_cached=from_cache,
                       adapters={k: (int(v[0]), int(v[1]), v[2], v[3]) for k, v in sorted(by_adapter.items())})  # fmt: skip


def _encodable(prompt: object, max_chars: int | None) -> bool:
    return isinstance(prompt, str) and (max_chars is None or len(prompt) <= max_chars)
