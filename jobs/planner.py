"""Planning: validate a JobSpec against its input and model, then cut the rows into shards.

Every check a user can fail runs here, before anything is written under OUT.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from jobs import datasets
from jobs.adapter_check import check_adapters
from jobs.constraint_check import check_constraint, check_constraint_compiles
from jobs.cost import PriceTable
from jobs.errors import FreightError, InputError, SpecMismatchError
from jobs.input_inspect import inspect_input, is_string
from jobs.manifest import (
    COST_KEY,
    MANIFEST_KEY,
    SUCCESS_KEY,
    Manifest,
    ShardPlan,
    check_same_job,
    read_manifest,
    write_or_match,
)
from jobs.model_check import check_draft, check_model
from jobs.reasoning_check import check_reasoning
from jobs.settings import Settings, get_settings
from jobs.spec import JobSpec, SamplingSpec
from jobs.storage import ObjectStore, open_store

# Rows whose prompts agree on their first PREFIX_CHARS characters form a prefix group (~16+ tokens:
# at least one full KV block, so the engine's prefix cache can reuse it); so do rows with the same
# shorter prompt, which the shard then computes once (worker/row_dedup.py).
PREFIX_CHARS = 64
REQUESTS_KEY = "input/requests.parquet"  # an OpenAI-Batch input's parsed requests (InputPlan.requests)


@dataclass(frozen=True)
class PreparedJob:
    """A validated job whose manifest is in OUT. `resumed`: OUT already held this job."""

    store: ObjectStore
    manifest: Manifest
    resumed: bool


def prepare_job(
    spec: JobSpec,
    settings: Settings | None = None,
    prices: PriceTable | None = None,
    check: Callable[[Manifest, ObjectStore], None] | None = None,
) -> PreparedJob:
    """Validate, plan, and write OUT/manifest.json (or match the one there). Nothing is written on error.

    `check(manifest, store)` runs after planning, before anything is written (e.g. `--max-cost`, which
    reads from `store` the shards a rerun has already committed); it raises FreightError to refuse
    the job."""
    store = open_store(spec.output, settings)
    root = store.local_path("manifest.json")
    if root is not None and root.parent.exists() and not root.parent.is_dir():
        raise InputError(f"output {store.url} is a file: give a folder (created if new) or s3://bucket/prefix")
    if store.exists(MANIFEST_KEY):
        check_same_job(store, read_manifest(store), spec)
    elif store.exists(SUCCESS_KEY) or store.exists(COST_KEY) or store.list("shards/"):
        raise SpecMismatchError(f"{store.url} holds job output without a manifest: use a new --output")
    manifest, requests = _plan(spec, settings, prices)
    if check is not None:
        check(manifest, store)
    if requests is not None and not store.exists(MANIFEST_KEY):  # a new job: its parsed copy, then the manifest
        store.put(REQUESTS_KEY, datasets.write_result(requests))
        manifest = manifest.model_copy(
            update={"input": manifest.input.model_copy(update={"requests": store.url_of(REQUESTS_KEY)})}
        )
    manifest, resumed = write_or_match(store, manifest)
    return PreparedJob(store=store, manifest=manifest, resumed=resumed)


def plan(spec: JobSpec, settings: Settings | None = None, prices: PriceTable | None = None) -> Manifest:
    """The manifest for `spec`: input checked, prices resolved, rows cut into prefix-grouped shards."""
    return _plan(spec, settings, prices)[0]


def _plan(
    spec: JobSpec, settings: Settings | None, prices: PriceTable | None
) -> tuple[Manifest, pa.Table | None]:
    """plan(), and an OpenAI-Batch input's parsed requests (None for Parquet)."""
    pricing = (prices or PriceTable.load()).pricing(spec.instance_type, spec.market, spec.price_per_hour)
    check_constraint(spec.sampling)  # compiled as the worker compiles it: refused here, not on every row
    config = check_model(spec.model, settings, embed=spec.task == "embed")
    check_constraint_compiles(spec.sampling, spec.model, config, settings)  # as the engine runs it
    if spec.speculative is not None and spec.speculative.startswith("draft:"):
        check_draft(spec.model, spec.speculative[len("draft:") :], settings)
    check_sampling(spec.sampling, settings or get_settings(), int(config["vocab_size"]))
    if spec.loras:  # each adapter as the engine would load it, from its files' JSON and header
        check_adapters(spec.adapters, spec.model, config, spec.model_name, settings)
    input_plan, prompts, requests = inspect_input(spec, settings)
    check_reasoning(spec, input_plan.prompt_kind, settings)
    shards = cut_shards(prompts, spec.shard_rows)
    manifest = Manifest(
        job_id=spec.job_id,
        spec=spec,
        input=input_plan,
        shards=tuple(shards),
        created_at=time.time(),
        price_per_hour=pricing.price_per_hour,
        on_demand_price_per_hour=pricing.on_demand_price_per_hour,
    )
    return manifest, requests


def check_sampling(sampling: SamplingSpec, settings: Settings, vocab_size: int) -> None:
    """The job-wide sampling rules that need the settings or the model (SamplingSpec checks the rest)."""
    if sampling.n > settings.max_n:
        raise FreightError(
            f"--n {sampling.n}: a row may ask for at most {settings.max_n} choices (FREIGHT_MAX_N); "
            "ask for fewer, or raise FREIGHT_MAX_N"
        )
    outside = [token for token, _ in sampling.logit_bias if token >= vocab_size]
    if outside:
        raise FreightError(
            f"--logit-bias: token id {outside[0]} is outside the model's vocabulary (ids 0..{vocab_size - 1})"
        )


def cut_shards(prompts: pa.ChunkedArray | pa.Array, shard_rows: int) -> list[ShardPlan]:
    """Shards of about `shard_rows` rows, input order kept, rows sharing a long prefix kept together.

    Each prefix group (>= 2 rows agreeing on the first PREFIX_CHARS characters, or equal when
    shorter) moves as one unit
    placed at its first row; other rows stay where they are. A unit that does not fit starts a new
    shard when the current one is at least half full; units larger than a shard are split.
    """
    n = len(prompts)
    units = _units(prompts)
    shards: list[list[int]] = []
    current: list[int] = []
    for unit in units:
        if current and len(current) + len(unit) > shard_rows and len(current) >= shard_rows // 2:
            shards.append(current)
            current = []
        pos = 0
        while pos < len(unit):
            take = min(shard_rows - len(current), len(unit) - pos)
            current.extend(unit[pos : pos + take])
            pos += take
            if len(current) >= shard_rows:
                shards.append(current)
                current = []
    if current:
        shards.append(current)
    assert sum(len(s) for s in shards) == n  # invariant: every row in exactly one shard
    return [ShardPlan(index=i, rows=len(rows), ranges=_ranges(sorted(rows))) for i, rows in enumerate(shards)]


def _units(prompts: pa.ChunkedArray | pa.Array) -> list[list[int]]:
    n = len(prompts)
    if n == 0:
        return []
    arr = prompts.combine_chunks() if isinstance(prompts, pa.ChunkedArray) else prompts
    if not is_string(arr.type):
        return [[i] for i in range(n)]
    # a prompt shorter than PREFIX_CHARS is its own key: only equal prompts share it
    keys = pc.utf8_slice_codeunits(arr, 0, PREFIX_CHARS)
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys.to_pylist()):
        if key:  # null and empty prompts are row errors: nothing to keep together
            groups.setdefault(key, []).append(i)
    group_of = {rows[0]: rows for rows in groups.values() if len(rows) > 1}
    grouped = {i for rows in group_of.values() for i in rows}
    units: list[list[int]] = []
    for i in range(n):
        if i in group_of:
            units.append(group_of[i])
        elif i not in grouped:
            units.append([i])
    return units


def _ranges(rows: list[int]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for r in rows:
        if out and out[-1][1] == r:
            out[-1] = (out[-1][0], r + 1)
        else:
            out.append((r, r + 1))
    return tuple(out)
