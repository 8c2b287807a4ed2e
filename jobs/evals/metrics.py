"""Evaluation metrics. Each scores one row in [0, 1]; a suite's score is the mean over its rows.

Generation metrics compare a completion with the row's reference. The multiple-choice metric
works on likelihoods instead: every option is scored by the summed logprob of its tokens after
the context (the pipeline's scoring mode), and the row is right when the reference option has the
highest one. A reference may be a list of acceptable answers: the row scores its best match.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from jobs.evals.normalize import Normalization

_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]*$"
# "1,234.5", "-3", "2e3", ".5": digits are required (an empty match would be found everywhere)
_NUMBER = re.compile(r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")


def _references(reference: Any) -> list[Any]:
    if reference is None:
        raise ValueError("the reference is null")
    if isinstance(reference, list | tuple):
        if not reference:
            raise ValueError("the reference list is empty")
        return list(reference)
    return [reference]


class Metric(BaseModel):
    """Base of every metric: a name (the column of per-row scores) and how it scores."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    needs_likelihood: ClassVar[bool] = False

    name: str = Field("", pattern=r"^$|" + _NAME_PATTERN)  # default: the metric's type
    reference_column: str | None = None  # default: the suite's reference_column

    @property
    def column(self) -> str:
        return self.name or str(getattr(self, "type"))  # noqa: B009  (set by every subclass)

    def columns(self) -> list[str]:
        """Per-row score columns this metric adds to the eval results."""
        return [self.column]

    def bind(self, base_dir: Path) -> None:
        """Resolve what the metric needs before any work (custom functions); raise ValueError."""


class GenerationMetric(Metric):
    """A metric on generated text."""

    def score(self, completion: str, reference: Any) -> float:
        raise NotImplementedError


class ExactMatch(GenerationMetric, Normalization):
    """1 when the normalised completion equals the normalised reference."""

    type: Literal["exact_match"] = "exact_match"

    def score(self, completion: str, reference: Any) -> float:
        got = self.apply(completion)
        return float(any(got == self.apply(str(ref)) for ref in _references(reference)))


class Contains(GenerationMetric, Normalization):
    """1 when the normalised reference occurs in the normalised completion."""

    type: Literal["contains"] = "contains"

    def score(self, completion: str, reference: Any) -> float:
        got = self.apply(completion)
        return float(any(self.apply(str(ref)) in got for ref in _references(reference)))


class Regex(GenerationMetric, Normalization):
    """With `pattern`: extract its group `group` from the completion (first match) and compare it
    with the reference after normalisation. Without: the reference itself is the pattern, and the
    row is right when it matches anywhere in the completion."""

    type: Literal["regex"] = "regex"
    pattern: str | None = None
    group: int = Field(0, ge=0)
    ignore_case: bool = False

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"pattern {value!r} is not a valid regular expression: {exc}") from exc
        return value

    @model_validator(mode="after")
    def _group_exists(self) -> Regex:
        if self.pattern is not None and self.group > re.compile(self.pattern).groups:
            groups = re.compile(self.pattern).groups
            raise ValueError(f"group {self.group} does not exist: the pattern has {groups} group(s)")
        return self

    def score(self, completion: str, reference: Any) -> float:
        flags = re.IGNORECASE if self.ignore_case else 0
        if self.pattern is None:
            try:
                return float(any(re.search(str(ref), completion, flags) for ref in _references(reference)))
            except re.error as exc:
                raise ValueError(f"the reference {reference!r} is not a valid regular expression: {exc}") from exc
        found = re.search(self.pattern, completion, flags)
        if found is None or found.group(self.group) is None:
            return 0.0
        got = self.apply(found.group(self.group))
        return float(any(got == self.apply(str(ref)) for ref in _references(reference)))


def parse_number(text: str, which: Literal["first", "last"] = "last") -> float | None:
    """The first or last number in `text` ("1,234.5", "-3", "2e3"); None when there is none."""
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    return float(numbers[0 if which == "first" else -1].replace(",", ""))


class Numeric(GenerationMetric):
    """1 when the number in the completion is within tolerance of the reference:
    |got - want| <= max(abs_tol, rel_tol * |want|). The number is the first or last one in the
    completion, or in group 1 of `pattern` when given (e.g. "#### (.*)")."""

    type: Literal["numeric"] = "numeric"
    extract: Literal["first", "last"] = "last"
    pattern: str | None = None
    abs_tol: float = Field(1e-6, ge=0)
    rel_tol: float = Field(0.0, ge=0)

    @field_validator("pattern")
    @classmethod
    def _one_group(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                groups = re.compile(value).groups
            except re.error as exc:
                raise ValueError(f"pattern {value!r} is not a valid regular expression: {exc}") from exc
            if groups < 1:
                raise ValueError(f"pattern {value!r} needs a group around the number, e.g. '#### (.*)'")
        return value

    def score(self, completion: str, reference: Any) -> float:
        text = completion
        if self.pattern is not None:
            found = re.search(self.pattern, completion)
            if found is None or found.group(1) is None:
                return 0.0
            text = found.group(1)
        got = parse_number(text, self.extract)
        if got is None:
            return 0.0
        for ref in _references(reference):
            want = float(ref) if isinstance(ref, int | float) else parse_number(str(ref), "first")
            if want is None:
                raise ValueError(f"the reference {ref!r} is not a number")
            if abs(got - want) <= max(self.abs_tol, self.rel_tol * abs(want)):
                return 1.0
        return 0.0


class Custom(GenerationMetric):
    """A user function `f(completion: str, reference) -> float | bool` in [0, 1], given as
    "package.module:function" (importable) or "path/to/file.py:function" (relative to the suite file)."""

    type: Literal["custom"] = "custom"
    function: str = Field(pattern=r"^[^:]+:[A-Za-z_][A-Za-z0-9_]*$")
    _fn: Callable[[str, Any], float | bool] | None = PrivateAttr(None)

    def bind(self, base_dir: Path) -> None:
        target, attr = self.function.rsplit(":", 1)
        if target.endswith(".py"):
            path = (base_dir / target).resolve()
            if not path.is_file():
                raise ValueError(f"custom metric file {path} does not exist")
            digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
            spec = importlib.util.spec_from_file_location(f"freight_eval_metric_{digest}", path)
            if spec is None or spec.loader is None:
                raise ValueError(f"cannot import {path} as a Python module")
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except Exception as exc:  # a syntax error or a failing import inside the user's file
                raise ValueError(f"cannot import {path}: {type(exc).__name__}: {exc}") from exc
        else:
            try:
                module = importlib.import_module(target)
            except ImportError as exc:
                raise ValueError(f"cannot import module {target!r}: {exc}") from exc
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise ValueError(f"{target!r} has no function {attr!r}")
        self._fn = fn

    def score(self, completion: str, reference: Any) -> float:
        if self._fn is None:
            raise RuntimeError("custom metric used before bind(); load suites with load_suite_file")
        try:
            value = float(self._fn(completion, reference))
        except Exception as exc:  # user code: any failure is this row's error, not the run's
            raise ValueError(f"custom metric {self.function} raised {type(exc).__name__}: {exc}") from exc
        if not 0.0 <= value <= 1.0 or math.isnan(value):
            raise ValueError(f"custom metric {self.function} returned {value}, outside [0, 1]")
        return value


class MultipleChoice(Metric):
    """Likelihood multiple choice: each option is scored by the summed logprob of its tokens after
    `context + target_delimiter`; the row is right when the reference option scores highest.
    Also reports `<name>_norm`: the same with each sum divided by the option's length in
    characters, without the delimiter (lm-evaluation-harness's acc_norm). The reference is the option's 0-based index
    or its text."""

    needs_likelihood: ClassVar[bool] = True
    type: Literal["multiple_choice"] = "multiple_choice"
    choices_column: str = "choices"
    target_delimiter: str = " "

    def columns(self) -> list[str]:
        return [self.column, f"{self.column}_norm"]

    def continuation(self, option: str) -> str:
        return f"{self.target_delimiter}{option}"

    @staticmethod
    def answer_index(reference: Any, options: Sequence[str]) -> int:
        if isinstance(reference, bool):
            raise ValueError(f"the reference {reference!r} is neither an option index nor an option")
        if isinstance(reference, int) and 0 <= reference < len(options):
            return reference
        if isinstance(reference, str):
            if reference in options:
                return list(options).index(reference)
            if reference.strip().isdigit() and int(reference) < len(options):
                return int(reference)
        raise ValueError(
            f"the reference {reference!r} is neither an option index (0..{len(options) - 1}) nor one of the options"
        )

    def score_options(
        self, logprobs: Sequence[float], options: Sequence[str], reference: Any
    ) -> tuple[float, float]:
        """(accuracy, length-normalised accuracy) of one question. Ties go to the lowest index."""
        if len(logprobs) != len(options) or not options:
            raise ValueError("every option needs exactly one logprob")
        answer = self.answer_index(reference, options)
        best = max(range(len(options)), key=lambda i: (logprobs[i], -i))
        normed = [lp / max(1, len(o)) for lp, o in zip(logprobs, options, strict=True)]
        best_norm = max(range(len(options)), key=lambda i: (normed[i], -i))
        return float(best == answer), float(best_norm == answer)


METRICS: dict[str, type[Metric]] = {
    cls.model_fields["type"].default: cls
    for cls in (ExactMatch, Contains, Regex, Numeric, MultipleChoice, Custom)
}
