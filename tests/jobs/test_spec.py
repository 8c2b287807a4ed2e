"""JobSpec: validation, a stable job_id, and differences named field by field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from jobs.manifest import InputFile, InputPlan
from jobs.spec import JobSpec, SamplingSpec, row_seed


def _spec(**kw: object) -> JobSpec:
    base: dict[str, object] = {"input": "in.parquet", "model": "m", "output": "out"}
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def test_job_id_is_stable_and_depends_on_every_field() -> None:
    a = _spec(sampling=SamplingSpec(max_tokens=8))
    assert a.job_id == _spec(sampling=SamplingSpec(max_tokens=8)).job_id
    assert len(a.job_id) == 16 and int(a.job_id, 16) >= 0
    assert a.job_id != _spec(sampling=SamplingSpec(max_tokens=9)).job_id
    assert a.job_id != _spec(sampling=SamplingSpec(max_tokens=8), quantization="int8").job_id
    assert _spec(quantization="fp8").job_id not in (a.job_id, _spec(quantization="int8").job_id)
    assert _spec(output="out/").job_id == _spec(output="out").job_id  # trailing slash is not a new job
    assert _spec(speculative="ngram").job_id not in (_spec().job_id, _spec(speculative="ngram", speculative_tokens=3).job_id)
    with pytest.raises(ValidationError, match="ngram' or 'draft:PATH"):
        _spec(speculative="draft:")
    with pytest.raises(ValidationError, match="speculative_tokens"):
        _spec(speculative="ngram", speculative_tokens=0)


def test_diff_names_each_difference() -> None:
    a = _spec(sampling=SamplingSpec(max_tokens=8, seed=1))
    b = _spec(sampling=SamplingSpec(max_tokens=16, seed=1), shard_rows=10)
    assert a.diff(b) == ["sampling.max_tokens: 8 != 16", "shard_rows: 256 != 10"]
    assert a.diff(a) == []


@pytest.mark.parametrize(
    "kw",
    [
        {"sampling": {"max_tokens": 0}},
        {"sampling": {"temperature": -1}},
        {"sampling": {"top_p": 0}},
        {"shard_rows": 0},
        {"market": "reserved"},
        {"quantization": "int3"},
        {"quantization": "int8", "quant_group": 32},  # a group is int4's
        {"quant_group": 32},
        {"quantization": "int4", "quant_group": 48},
        {"unknown_field": 1},
        {"output": "in.parquet"},
        {"continuation_column": "prompt"},
    ],
)
def test_bad_specs_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        _spec(**kw)


def test_quant_group_is_a_later_field_of_int4_jobs() -> None:
    """An int4 job's group size: in the job id and the engine's keys when set, out of the manifest at None."""
    int4 = _spec(quantization="int4")
    grouped = _spec(quantization="int4", quant_group=32)
    assert "quant_group" not in int4.model_dump(mode="json") and grouped.model_dump(mode="json")["quant_group"] == 32
    assert grouped.job_id != int4.job_id
    assert (int4.quantization_label, grouped.quantization_label, _spec().quantization_label) == ("int4", "int4-g32", None)


def test_cache_salt_is_a_later_field_of_served_jobs() -> None:
    """serve's tenant salts its job's prefix cache: in the manifest and the job id when set only, so a
    CLI job (no salt) keeps its id and its prefix reuse."""
    salted = _spec(cache_salt="team-a")
    assert "cache_salt" not in _spec().model_dump(mode="json") and salted.model_dump(mode="json")["cache_salt"] == "team-a"
    assert len({_spec().job_id, salted.job_id, _spec(cache_salt="team-b").job_id}) == 3
    with pytest.raises(ValidationError):
        _spec(cache_salt="")


def test_spec_is_frozen() -> None:
    with pytest.raises(ValidationError):
        _spec().shard_rows = 3  # type: ignore[misc]


def test_row_seed_depends_on_job_seed_and_row_id_only() -> None:
    assert row_seed(0, "a") == row_seed(0, "a")
    assert len({row_seed(0, "a"), row_seed(1, "a"), row_seed(0, "b")}) == 3
    assert 0 <= row_seed(7, "x") < 2**63


def test_sampling_fields_added_later_keep_older_job_ids() -> None:
    """Fields added after spec version 1 enter the id only when set: an OUT planned before them resumes."""
    old = JobSpec(input="a.parquet", model="m", output="o")
    assert old.job_id == "6a08540ca883a1fc"  # the id this spec had before n, penalties, logit_bias, ...
    ids = {old.job_id}
    for kw in ({"n": 2}, {"logprobs": 0}, {"presence_penalty": 0.5}, {"min_tokens": 1}, {"logit_bias": {"3": 1}}):
        ids.add(JobSpec(input="a.parquet", model="m", output="o", sampling=SamplingSpec(**kw)).job_id)
    assert len(ids) == 6


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"logit_bias": '{"x": 1}'}, "logit_bias key 'x' is not a token id"),
        ({"logit_bias": "{"}, "logit_bias is not JSON"),
        ({"logit_bias": {"3": 101}}, "a bias must be a number in [-100, 100]"),
        ({"stop": ("",)}, "stop strings must not be empty"),
        ({"min_tokens": 9, "max_tokens": 4}, "min_tokens (9) must not exceed max_tokens (4)"),
        ({"logprobs": 21}, "less than or equal to 20"),
    ],
)
def test_bad_sampling_flags_say_why(kw: dict[str, object], expected: str) -> None:
    with pytest.raises(ValidationError) as err:
        SamplingSpec(**kw)  # type: ignore[arg-type]
    assert expected in str(err.value)


# the fields of spec version 1, what a worker older than every later field knows
V1_SPEC = {"input", "model", "output", "prompt_column", "id_column", "continuation_column", "sampling", "shard_rows",
           "instance_type", "market", "price_per_hour", "quantization"}  # fmt: skip
V1_SAMPLING = {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop"}


def test_manifest_json_leaves_later_fields_out_at_their_defaults() -> None:
    """A job that uses no later field writes only version-1 fields, so an older worker (extra="forbid")
    reads its manifest; a later field is written once it is set, and the JSON round-trips either way."""
    plain = _spec()
    dumped = plain.model_dump(mode="json")
    assert set(dumped) == V1_SPEC and set(dumped["sampling"]) == V1_SAMPLING
    assert JobSpec.model_validate_json(plain.model_dump_json()) == plain
    used = _spec(speculative="ngram", speculative_tokens=6, task="generate",
                 sampling=SamplingSpec(n=2, logit_bias={"3": 1.5}, choice=("a", "b")))  # fmt: skip
    dumped = used.model_dump(mode="json")
    assert set(dumped) == V1_SPEC | {"speculative", "speculative_tokens"}  # task at its default: left out
    assert set(dumped["sampling"]) == V1_SAMPLING | {"n", "logit_bias", "choice"}
    assert JobSpec.model_validate_json(used.model_dump_json()) == used
    # a spec's full view (diffs) still names every field with its value
    assert plain.all_fields()["speculative_tokens"] is None and plain.all_fields()["sampling"]["logit_bias"] == []
    # the manifest's input plan likewise: id_type came later
    plan = InputPlan(format="parquet", files=(InputFile(url="a", rows=1, size=1),), rows=1, prompt_column="prompt",
                     prompt_kind="text", id_column=None)  # fmt: skip
    assert "id_type" not in plan.model_dump() and InputPlan.model_validate_json(plan.model_dump_json()) == plan
    assert plan.model_copy(update={"id_type": "int64"}).model_dump()["id_type"] == "int64"
    assert plain.diff(used) == [
        "sampling.choice: None != ['a', 'b']", "sampling.logit_bias: [] != [[3, 1.5]]", "sampling.n: 1 != 2",
        "speculative: None != 'ngram'", "speculative_tokens: None != 6",
    ]  # fmt: skip
