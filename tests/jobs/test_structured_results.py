"""The results of constrained rows: `parsed` (choice 0's JSON value, compact) only where a JSON
constraint finished "stop", `parsed_choices` with n > 1; partial files keep which rows were
constrained; the cost report sums constrained_rows and mask_seconds."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from contracts.constraint import Constraint
from contracts.sampling import SamplingParams
from jobs import datasets
from jobs.cost import ShardRecord, build_report
from worker.engine.outputs import CompletionOutput, RequestOutput
from worker.row_requests import RowRequest
from worker.shard_rows import from_output, parsed_value, result_row, rows_table

SCHEMA = Constraint.json_schema({"type": "object"})


def _req(constraint: Constraint | None, n: int = 1, echo: str | None = None) -> RowRequest:
    s = SamplingParams(max_tokens=8, temperature=1.0, top_p=1.0, seed=1, n=n, constraint=constraint)
    return RowRequest(row=0, id="r", prompt="p", sampling=s, echo_text=echo)


def _out(*choices: tuple[str, str], error: str | None = None) -> RequestOutput:
    outs = [CompletionOutput(i, text, [1] * max(1, len(text)), reason) for i, (text, reason) in enumerate(choices)]
    first = outs[0]
    return RequestOutput(index=0, prompt_token_ids=[5], token_ids=first.token_ids, text=first.text,
                         finish_reason=first.finish_reason, prompt_tokens=1, cached_tokens=0, error=error,
                         outputs=outs)  # fmt: skip


def test_parsed_value_rule() -> None:
    assert parsed_value('{ "b": [1, 2.50],\n "a": "é" }', "stop") == '{"b":[1,2.5],"a":"é"}'  # key order kept
    assert parsed_value('{"a": 1}', "length") is None
    assert parsed_value('{"a": 1', "stop") is None  # a stop string cut the value short
    assert parsed_value('{"a": NaN}', "stop") is None  # not JSON
    assert parsed_value("[]", "error") is None


@pytest.mark.parametrize(
    ("constraint", "reason", "want"),
    [
        (SCHEMA, "stop", '{"a":1}'),
        (Constraint("json_object"), "stop", '{"a":1}'),
        (SCHEMA, "length", None),
        (Constraint("regex", ".*"), "stop", None),  # no JSON constraint: no parsed value
        (None, "stop", None),
    ],
)
def test_parsed_of_one_choice(constraint: Constraint | None, reason: str, want: str | None) -> None:
    res = from_output(_out(('{"a": 1}', reason)), _req(constraint))
    assert res.parsed == want and res.parsed_choices is None
    assert res.completion == '{"a": 1}'  # the text stays as generated
    assert res.constrained == (constraint is not None)


def test_parsed_with_echo_parses_the_generated_text_only() -> None:
    res = from_output(_out(('{"a": 1}', "stop")), _req(SCHEMA, echo="prompt: "))
    assert res.completion == 'prompt: {"a": 1}' and res.parsed == '{"a":1}'


def test_parsed_of_an_error_row_is_null() -> None:
    res = from_output(_out(('{"a": 1}', "error"), error="no grammar"), _req(SCHEMA))
    assert res.finish_reason == "error" and res.error == "no grammar" and res.parsed is None
    assert res.constrained


def test_parsed_choices_with_n_gt_1() -> None:
    res = from_output(_out(('{"a": 1}', "stop"), ('{"a": ', "length"), ("[ 2 ]", "stop")), _req(SCHEMA, n=3))
    assert res.parsed == '{"a":1}' and res.parsed_choices == ['{"a":1}', None, "[2]"]
    assert res.finish_reasons == ["stop", "length", "stop"]
    first_cut = from_output(_out(('{"a"', "length"), ("{}", "stop")), _req(SCHEMA, n=2))
    assert first_cut.parsed is None and first_cut.parsed_choices == [None, "{}"]
    # a failed choice fails the row: no parsed values at all
    failed = from_output(_out(("{}", "stop"), ("", "error"), error="no KV room"), _req(SCHEMA, n=2))
    assert failed.parsed is None and failed.parsed_choices is None and failed.error == "no KV room"
    plain = from_output(_out(("x", "stop"), ("y", "stop")), _req(None, n=2))
    assert plain.parsed is None and plain.parsed_choices is None


def test_result_columns_and_partial_files_round_trip() -> None:
    rows = [
        from_output(_out(('{"a": 1}', "stop"), ("{}", "stop")), _req(SCHEMA, n=2)),
        from_output(_out(("x", "stop")), _req(None)),
    ]
    table = rows_table(rows, likelihood=False, with_row=False)
    assert table.schema == datasets.result_schema(likelihood=False)
    assert table.column("parsed").to_pylist() == ['{"a":1}', None]
    assert table.column("parsed_choices").to_pylist() == [['{"a":1}', "{}"], None]
    assert "_constrained" not in table.column_names  # committed results carry no private columns
    partial = rows_table(rows, likelihood=False, with_row=True)
    back = [result_row(r, "/v1/completions") for r in partial.to_pylist()]
    assert [b.constrained for b in back] == [True, False] and back[0].parsed_choices == ['{"a":1}', "{}"]
    # a partial file written before these columns reads back as unconstrained, without parsed values
    old = partial.drop_columns(["parsed", "parsed_choices", "_constrained"]).to_pylist()[0]
    again = result_row(old, "/v1/completions")
    assert again.parsed is None and not again.constrained


def test_result_shards_of_before_and_after_read_as_one_table() -> None:
    """OUT/shards/ mixing a shard committed before the parsed columns and one after opens as one table."""
    old_schema = pa.schema([f for f in datasets.result_schema(False) if not f.name.startswith("parsed")])
    old = old_schema.empty_table()
    new = rows_table([from_output(_out(("{}", "stop")), _req(SCHEMA))], likelihood=False, with_row=False)
    both = pa.concat_tables([old, new], promote_options="default")
    assert both.column("parsed").to_pylist() == ["{}"]


def _record(shard: int, constrained: int, mask: float) -> ShardRecord:
    return ShardRecord(
        job_id="j", shard=shard, attempt=1, rows=4, rows_failed=0, prompt_tokens=10, cached_tokens=0,
        completion_tokens=5, busy_seconds=1.0, prefill_seconds=0.4, decode_seconds=0.6,
        constrained_rows=constrained, mask_seconds=mask, load_seconds=0.0, wall_seconds=1.0,
        billed_seconds=1.0, instance_type="cpu-local", market="on-demand", price_per_hour=1.0,
        on_demand_price_per_hour=1.0, cost_usd=0.1, on_demand_cost_usd=0.1, worker="w", started_at=0.0,
        finished_at=1.0,
    )  # fmt: skip


def test_cost_report_sums_constrained_rows_and_mask_seconds() -> None:
    report = build_report(
        "j", [_record(0, 3, 0.25), _record(1, 0, 0.0), _record(2, 1, 0.5)], [], started_at=0.0, finished_at=2.0,
        default_instance_type="cpu-local", default_market="on-demand", default_price_per_hour=1.0,
    )  # fmt: skip
    assert report["constrained_rows"] == 4 and report["mask_seconds"] == pytest.approx(0.75)
    old = json.loads(_record(0, 0, 0.0).model_dump_json())  # a record written before the fields
    del old["constrained_rows"], old["mask_seconds"]
    assert ShardRecord.model_validate(old).constrained_rows == 0


def test_cost_table_shows_constrained_rows_only_when_there_are_some() -> None:
    from rich.console import Console

    from jobs.tables import cost_table

    def text(constrained: int) -> str:
        report = build_report(
            "j", [_record(0, constrained, 0.25)], [], started_at=0.0, finished_at=2.0,
            default_instance_type="cpu-local", default_market="on-demand", default_price_per_hour=1.0,
        )  # fmt: skip
        console = Console(record=True, width=100)
        console.print(cost_table(report))
        return console.export_text()

    shown = text(3).splitlines()
    line = next(i for i, row in enumerate(shown) if "constrained rows (mask s)" in row)
    assert "3 (0.25)" in shown[line] and "prefill / decode" in shown[line - 1]
    assert "constrained" not in text(0)
