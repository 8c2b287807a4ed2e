"""Starting an eval run: freeze the suites' rows in OUT, write OUT/eval.json, run or queue the jobs.

Layout of one eval run's OUT:
    eval.json                          the run plan (this module's RunPlan), written before any job
    <suite>/rows.parquet               id, prompt, reference[, choices]: the rows as scored
    <suite>/generate.parquet           generation job input (id, prompt)
    <suite>/options.parquet            scoring job input (id, prompt, continuation), one row per option
    <suite>/<model key>/generate/      the generation job's OUT (manifest, shards, cost.json, _SUCCESS)
    <suite>/<model key>/likelihood/    the scoring job's OUT
    <suite>/<model key>/scores.parquet per-row results with one score column per metric (collect)
    <suite>/<model key>/chart.png      score over time, when there are two runs or more (collect)
    report.json, report.md             the report (collect)
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from jobs.adapter_check import check_adapters
from jobs.datasets import write_result
from jobs.errors import FreightError
from jobs.evals.data import generation_input, likelihood_input, load_suite_data
from jobs.evals.history import model_key
from jobs.evals.metrics import MultipleChoice
from jobs.evals.suite import Suite, SuiteFile
from jobs.log import get_logger
from jobs.model_check import check_model
from jobs.result_cache.options import CacheOptions, write_cache_options
from jobs.result_cache.store import ResultCache
from jobs.spec import JobSpec, LoraSpec, SamplingSpec
from jobs.storage import ObjectStore, open_store

log = get_logger(__name__)
PLAN_KEY = "eval.json"
JobExecutor = Callable[[JobSpec], None]  # embedded: runs the job to the end; --submit: queues it


class PlannedModel(BaseModel):
    """One model (or one LoRA adapter of it) of a suite and its jobs. A suite's adapters share their
    model's jobs: each entry scores its own rows of them."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: str
    generate: JobSpec | None  # None when the suite has only multiple-choice metrics
    likelihood: JobSpec | None  # None when it has none
    adapter: str | None = None  # the LoRA adapter (a suite's `adapters` name); None: the model itself


class PlannedSuite(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    dataset_sha256: str
    rows: int
    models: list[PlannedModel]


class RunPlan(BaseModel):
    """OUT/eval.json: everything `collect` needs, including the suite file's text as it was."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: int = 1
    run_id: str
    started_at: str
    output: str
    suite_file: str  # path of the suite file; custom metric files resolve against its folder
    suite_text: str
    history: str
    suites: list[PlannedSuite]
    result_cache: str | None = None  # the result cache its jobs read and write (None: none)


def new_run_id(now: datetime | None = None) -> str:
    """Sortable by time, to the microsecond (two runs within one second keep their order):
    20261129T020000.123456Z-3f9a1c2e."""
    now = now or datetime.now(UTC)
    return f"{now.strftime('%Y%m%dT%H%M%S.%fZ')}-{secrets.token_hex(4)}"


def _pick(suite_file: SuiteFile, names: Sequence[str] | None) -> list[Suite]:
    if not names:
        return list(suite_file.suites)
    return [suite_file.suite(name) for name in names]


def _entries(suite: Suite, model: str, out: ObjectStore) -> list[PlannedModel]:
    """The model's entry and one per adapter of the suite, all sharing the model's jobs."""
    planned = _job_specs(suite, model, out)
    return [planned, *(planned.model_copy(update={"adapter": name}) for name, _ in suite.adapters)]


def _job_specs(suite: Suite, model: str, out: ObjectStore) -> PlannedModel:
    """The model's entry: its jobs (with the suite's adapters, whose rows they hold too)."""
    sampling = suite.sampling
    base = f"{suite.name}/{model_key(model)}"
    loras = tuple(LoraSpec(name=name, path=path) for name, path in suite.adapters)

    def job(rows: str, kind: str, **fields: Any) -> JobSpec:
        """A job over the suite's `rows` file (written by the plan, prompt and id columns) into
        `kind` under the model's folder."""
        extra = {"shard_rows": suite.shard_rows} if suite.shard_rows else {}
        return JobSpec(input=out.url_of(f"{suite.name}/{rows}"), model=model, output=out.url_of(f"{base}/{kind}"),
                       prompt_column="prompt", id_column="id", loras=loras, **extra, **fields)  # fmt: skip

    generate = likelihood = None
    if suite.needs_generation:
        generate = job(
            "generate.parquet",
            "generate",
            sampling=SamplingSpec(**sampling.model_dump()),  # a suite's sampling keys are SamplingSpec's
            speculative=suite.speculative,
            speculative_tokens=suite.speculative_tokens,
        )
    if suite.needs_likelihood:
        likelihood = job(
            "options.parquet",
            "likelihood",
            continuation_column="continuation",
            sampling=SamplingSpec(max_tokens=1, seed=sampling.seed),
        )
    return PlannedModel(model=model, generate=generate, likelihood=likelihood)


def start_run(
    suite_file: SuiteFile,
    output: str,
    execute: JobExecutor,
    *,
    suite_names: Sequence[str] | None = None,
    models: Sequence[str] | None = None,
    run_id: str | None = None,
    result_cache: str | None | Literal["suite"] = "suite",
) -> RunPlan:
    """Write the run's inputs and plan into `output`, then hand each job to `execute`.

    An OUT that already holds a run of the same suites and models resumes it (jobs keep their
    committed shards); any other existing run there is refused. `result_cache`: the cache every
    job reads and writes ("suite": the suite file's, SuiteFile.result_cache; None: none); a cache
    that cannot be used is refused before anything is written."""
    out = open_store(output)
    cache = suite_file.result_cache if result_cache == "suite" else result_cache
    if cache is not None:
        ResultCache.open(cache)
    suites = _pick(suite_file, suite_names)
    for model in sorted({m for suite in suites for m in (models or suite.models)}):
        config = check_model(model)  # a missing model fails before anything is written
        for suite in suites:  # and so does an adapter the engine would refuse over it
            if suite.adapters and model in (models or suite.models):
                check_adapters(dict(suite.adapters), model, config)
    text = Path(suite_file.path).read_text(encoding="utf-8")
    planned: list[PlannedSuite] = []
    inputs: dict[str, bytes] = {}
    for suite in suites:
        data = load_suite_data(suite)
        adapters = [name for name, _ in suite.adapters]
        inputs[f"{suite.name}/rows.parquet"] = write_result(data.table)
        if suite.needs_generation:
            inputs[f"{suite.name}/generate.parquet"] = generation_input(data, adapters)
        mc = [m for m in suite.metrics if isinstance(m, MultipleChoice)]
        if mc:
            inputs[f"{suite.name}/options.parquet"] = likelihood_input(data, mc[0], adapters)
        chosen = list(models) if models else list(suite.models)
        planned.append(
            PlannedSuite(
                name=suite.name,
                dataset_sha256=data.sha256,
                rows=data.rows,
                models=[entry for m in chosen for entry in _entries(suite, m, out)],
            )
        )
    plan = RunPlan(
        run_id=run_id or new_run_id(),
        started_at=datetime.now(UTC).isoformat(),
        output=out.url,
        suite_file=str(suite_file.path),
        suite_text=text,
        history=suite_file.history,
        suites=planned,
        result_cache=cache,
    )
    if not out.exists(PLAN_KEY) and out.list(""):
        raise FreightError(
            f"{out.url} already holds other files; give `--output` a new folder for an eval run"
        )
    if not out.exists(PLAN_KEY):
        for key, data in inputs.items():
            out.put(key, data)
    if not out.put_if_absent(PLAN_KEY, plan.model_dump_json(indent=2).encode()):
        existing = RunPlan.model_validate_json(out.get(PLAN_KEY))
        if existing.suites != plan.suites or existing.suite_text != plan.suite_text:
            raise FreightError(
                f"{out.url} already holds eval run {existing.run_id} of other suites, models or data; "
                "use a new --output folder for a new run"
            )
        plan = existing
        log.info("resuming eval run", run_id=plan.run_id, output=out.url)
    # grouped by model (stable): an embedded run loads each model once
    for spec in sorted(job_specs(plan), key=lambda spec: spec.model):
        log.info("eval job", run_id=plan.run_id, output=spec.output)
        write_cache_options(open_store(spec.output), CacheOptions(url=plan.result_cache))
        execute(spec)
    return plan


def job_specs(plan: RunPlan) -> list[JobSpec]:
    """Every job of the run, suite by suite, model by model (generation before likelihood); a job
    that a model's adapters share, once."""
    specs: dict[str, JobSpec] = {}
    for suite in plan.suites:
        for entry in suite.models:
            for spec in (entry.generate, entry.likelihood):
                if spec is not None:
                    specs.setdefault(spec.output, spec)
    return list(specs.values())


def read_plan(output: str) -> RunPlan:
    out = open_store(output)
    if not out.exists(PLAN_KEY):
        raise FreightError(
            f"{out.url} holds no eval run ({PLAN_KEY} is missing); run `freight eval run` first"
        )
    return RunPlan.model_validate_json(out.get(PLAN_KEY))
