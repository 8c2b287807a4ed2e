"""A batch's validation: its input file and model checked, its freight job planned (manifest written).

Runs in the batch process (the file may be 200 MB: never in the API process). What fails here fails
the batch with `errors.data` (code, message, line); what one line gets wrong is that request's error
in the error file, and the batch runs on. The job:

- input: the uploaded file in place (`tenants/<t>/files/<id>.jsonl`); output: `tenants/<t>/jobs/<id>`.
- model: a batch runs one, as OpenAI's do. With `--models`, the served model most lines name, by its
  name or one of its LoRA adapters' (a request that gives none takes the model; the only model when
  no line names one), with its adapters; without, the checkpoint folder or s3:// prefix most lines give.
- sampling: the job-wide defaults a body's fields override (max_tokens: ServeConfig.default_max_tokens).
- lifecycle: the batch's expires_at as the job's deadline.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from jobs.api.batches import BatchRecord
from jobs.api.config import ServeConfig
from jobs.api.files import read_record as read_file
from jobs.api.layout import file_content, job_prefix, sub_store
from jobs.api.models import ServedModel
from jobs.batch_input import BatchFileError
from jobs.errors import FreightError, ModelNotFoundError
from jobs.lifecycle import Lifecycle, write_lifecycle
from jobs.planner import PreparedJob, prepare_job
from jobs.settings import Settings
from jobs.spec import JobSpec, SamplingSpec
from jobs.storage import ObjectStore

SHOW = 10  # lines named in errors.data for one kind of problem, at most


@dataclass(frozen=True)
class PlanFailure:
    """Why the batch failed validation: OpenAI's errors.data entries {code, message, param, line}."""

    errors: list[dict[str, Any]]

    @classmethod
    def one(cls, code: str, message: str, param: str | None = None, line: int | None = None) -> PlanFailure:
        return cls([{"code": code, "message": message, "param": param, "line": line}])


def plan_batch(store: ObjectStore, record: BatchRecord, config: ServeConfig, settings: Settings) -> PreparedJob | PlanFailure:
    """The batch's job planned in the store, or why the batch fails validation."""
    source = read_file(store, record.tenant, record.input_file_id)
    if source is None:
        return PlanFailure.one("file_not_found", f"The input file {record.input_file_id} was deleted or expired "
                               "before the batch was validated.", "input_file_id")  # fmt: skip
    key = file_content(record.tenant, record.input_file_id)
    chosen = choose_model(_lines(store, key), config.models)
    if isinstance(chosen, PlanFailure):
        return chosen
    model, name = chosen
    try:
        spec = JobSpec(
            input=store.url_of(key),
            model=model.path,
            output=store.url_of(job_prefix(record.tenant, record.id)),
            sampling=SamplingSpec(max_tokens=config.default_max_tokens),
            shard_rows=config.shard_rows,
            instance_type=config.instance_type,
            market=config.market,
            price_per_hour=config.price_per_hour,
            quantization=model.quantization,
            quant_group=model.quant_group,
            speculative=model.speculative,
            speculative_tokens=model.speculative_tokens,
            model_name=name,
            loras=model.loras,
            cache_salt=record.tenant,  # the engine is shared by every tenant's batches: no prefix crosses them
        )
        prepared = prepare_job(spec, settings)
    except BatchFileError as exc:
        return PlanFailure([{"code": code, "message": what, "param": None, "line": line}
                            for line, code, what in exc.problems[:SHOW]] or [_entry("invalid_file", str(exc))])  # fmt: skip
    except ModelNotFoundError as exc:
        return PlanFailure.one("model_not_found", _public(str(exc), model, name), "model")
    except (FreightError, ValidationError, ValueError) as exc:
        return PlanFailure.one("invalid_batch", _public(str(exc), model, name))
    job = sub_store(store, job_prefix(record.tenant, record.id), settings)
    write_lifecycle(job, Lifecycle(deadline=float(record.expires_at), submitted_at=time.time()))
    return prepared


def _entry(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message, "param": None, "line": None}


def _public(message: str, model: ServedModel, name: str | None) -> str:
    """A planning message fit for the tenant: a served model's checkpoint path named by its name."""
    return message if name is None else message.replace(model.path, repr(name))


def _lines(store: ObjectStore, key: str) -> Iterator[bytes]:
    """The file's lines, read in pieces (a local file in place)."""
    local = store.local_path(key)
    if local is not None:
        with local.open("rb") as f:
            yield from f
        return
    tail = b""
    for piece in store.read_chunks(key):
        *whole, tail = (tail + piece).split(b"\n")
        yield from whole
    if tail:
        yield tail


def choose_model(lines: Iterator[bytes], served: dict[str, ServedModel]) -> tuple[ServedModel, str | None] | PlanFailure:
    """(the batch's model, its served name or None) from the `model` its lines' bodies give (counted
    over the lines that parse; the rest are those requests' errors later)."""
    named: Counter[str] = Counter()
    first_line: dict[str, int] = {}
    for lineno, raw in enumerate(lines, start=1):
        model = _body_model(raw)
        if model is not None:
            named[model] += 1
            first_line.setdefault(model, lineno)
    if served:
        owner = {**{a: m for m, model in served.items() for a in model.adapters}, **{m: m for m in served}}
        votes: Counter[str] = Counter()  # lines naming each served model or one of its adapters
        first: dict[str, int] = {}
        for m in named:
            if m in owner:
                votes[owner[m]] += named[m]
                first[owner[m]] = min(first.get(owner[m], first_line[m]), first_line[m])
        if votes:
            name = max(votes, key=lambda m: (votes[m], -first[m]))
            return served[name], name
        if not named and len(served) == 1:
            (only,) = served.values()
            return only, only.name
        names = ", ".join(sorted(served))
        if not named:
            return PlanFailure.one("missing_model", f"No request names a model; this server serves {names}: name "
                                   "one in each request body's 'model'.", "model")  # fmt: skip
        return PlanFailure([
            {"code": "model_not_found", "message": f"The model '{m}' does not exist on this server (it serves "
             f"{names}).", "param": "model", "line": first_line[m]}
            for m in sorted(named, key=first_line.__getitem__)[:SHOW]
        ])  # fmt: skip
    if not named:
        return PlanFailure.one("missing_model", "No request names a model: give each request body's 'model' as the "
                               "checkpoint (a folder or s3:// prefix), or start the server with --models.", "model")  # fmt: skip
    path = max(named, key=lambda m: (named[m], -first_line[m]))
    if not (path.startswith("s3://") or path.startswith("/")):
        return PlanFailure.one("model_not_found", f"The model '{path}' is not a checkpoint this server can find: give "
                               "an absolute folder or an s3:// prefix (or start the server with --models, to name "
                               "models).", "model", first_line[path])  # fmt: skip
    return ServedModel(name=path, path=path), None


def _body_model(raw: bytes) -> str | None:
    try:
        line = json.loads(raw)
    except ValueError:
        return None
    body = line.get("body") if isinstance(line, dict) else None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else None
