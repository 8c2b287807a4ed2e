"""Constraint's shape checks and canonical JSON schemas (compiling is the engine's: test_structured*)."""

import pytest

from contracts.constraint import Constraint
from worker.engine import SamplingParams


def test_equal_schemas_written_differently_are_one_constraint() -> None:
    a = Constraint.json_schema({"type": "object", "properties": {"x": {"type": "integer"}}})
    b = Constraint.json_schema('{ "properties": {"x": {"type": "integer"}},  "type": "object" }')
    assert a == b and hash(a) == hash(b)
    assert a.is_json and not Constraint("regex", "a+").is_json


@pytest.mark.parametrize(("args", "message"), [
    (("choice",), "the list of choices is empty"),
    (("choice", "", ("a", "")), "non-empty string"),
    (("regex", "", ("a",)), "only a choice constraint takes"),
    (("regex", ""), "regex: empty regex"),
    (("json_object", "{}"), "json_object takes no spec"),
    (("xml", "x"), "is not one of"),
])  # fmt: skip
def test_bad_shapes_are_refused_with_the_reason(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Constraint(*args)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_a_schema_that_is_not_a_json_object_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="json_schema"):
        Constraint.json_schema(text)


def test_sampling_params_carries_a_constraint() -> None:
    c = Constraint("choice", choices=["yes", "no"])
    assert SamplingParams(constraint=c).constraint == Constraint("choice", choices=("yes", "no"))
    with pytest.raises(ValueError, match="must be a Constraint"):
        SamplingParams(constraint="json")  # type: ignore[arg-type]


def test_json_schema_keeps_the_order_of_properties() -> None:
    """Key order elsewhere is canonical; a properties map keeps its order (the output's key order)."""
    a = Constraint.json_schema({"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}})
    b = Constraint.json_schema({"properties": {"b": {"type": "integer"}, "a": {"type": "string"}}, "type": "object"})
    c = Constraint.json_schema({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}})
    assert a == b and a != c
    assert a.spec.index('"b"') < a.spec.index('"a"')
