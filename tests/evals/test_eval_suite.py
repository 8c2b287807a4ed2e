"""Suite files: a valid one loads with its defaults; each mistake fails at load with its line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jobs.evals.lines import LineIndex
from jobs.evals.metrics import Custom, ExactMatch, MultipleChoice
from jobs.evals.suite import SuiteError
from jobs.evals.suite_loader import load_suite_file

VALID = """\
id = "nightly"
history = "hist"

[[suite]]
name = "qa"
dataset = "data/qa.parquet"
models = ["models/tiny", "s3://bucket/models/other"]
reference_column = "answer"
id_column = "qid"
schedule = "0 2 * * *"

[suite.sampling]
max_tokens = 8

[[suite.metrics]]
type = "exact_match"
lowercase = true

[[suite.metrics]]
type = "multiple_choice"
choices_column = "options"

[[suite]]
name = "qa-contains"
dataset = "data/qa.parquet"
models = ["models/tiny"]
reference_column = "answer"
metrics = [{ type = "contains", name = "has_answer" }]
speculative = "draft:models/draft"
speculative_tokens = 3
"""


def _error(path: Path) -> str:
    with pytest.raises(SuiteError) as info:
        load_suite_file(path)
    return str(info.value)


def test_valid_file_loads_with_defaults_and_resolved_paths(qa_dataset: Path, write_suites) -> None:
    path = write_suites(VALID)
    loaded = load_suite_file(path)
    assert loaded.lock_id == "nightly"
    assert loaded.history == str(path.parent / "hist")
    assert loaded.output == str(path.parent / "eval-runs")
    qa, contains = loaded.suites
    assert qa.dataset == str(qa_dataset)
    assert qa.models == (str(path.parent / "models" / "tiny"), "s3://bucket/models/other")
    assert qa.prompt_column == "prompt" and qa.messages_column is None
    assert qa.sampling.max_tokens == 8 and qa.sampling.temperature == 0.0 and qa.sampling.seed == 0
    assert isinstance(qa.metrics[0], ExactMatch) and qa.metrics[0].lowercase
    assert isinstance(qa.metrics[1], MultipleChoice) and qa.metrics[1].columns() == [
        "multiple_choice",
        "multiple_choice_norm",
    ]
    assert qa.needs_generation and qa.needs_likelihood
    assert contains.metrics[0].column == "has_answer" and contains.schedule is None
    assert loaded.suite("qa-contains") is contains
    assert (qa.speculative, qa.speculative_tokens) == (None, None)
    assert (contains.speculative, contains.speculative_tokens) == ("draft:" + str(path.parent / "models" / "draft"), 3)
    from jobs.evals.plan import _job_specs
    from jobs.storage import LocalStore

    planned = _job_specs(contains, contains.models[0], LocalStore(str(path.parent / "out")))
    assert (planned.generate.speculative, planned.generate.speculative_tokens) == (contains.speculative, 3)
    with pytest.raises(ValueError, match="no suite named 'nope'"):
        loaded.suite("nope")


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if needle in line)


def test_unknown_metric_names_the_line_and_the_known_metrics(qa_dataset: Path, write_suites) -> None:
    text = VALID.replace('type = "exact_match"', 'type = "exact"')
    message = _error(write_suites(text))
    line = _line_of(text, 'type = "exact"')
    assert f"suites.toml:{line}:" in message
    assert "unknown metric 'exact'" in message and "did you mean 'exact_match'" in message
    assert "contains, custom, exact_match, multiple_choice, numeric, regex" in message


def test_missing_column_lists_the_columns_that_exist(qa_dataset: Path, write_suites) -> None:
    text = VALID.replace('reference_column = "answer"\nid_column', 'reference_column = "gold"\nid_column')
    message = _error(write_suites(text))
    assert f"suites.toml:{_line_of(text, 'gold')}:" in message
    assert "has no column 'gold' (reference_column)" in message
    assert "its columns: qid, prompt, answer, options" in message
    text = VALID.replace('choices_column = "options"', 'choices_column = "opts"')
    assert "has no column 'opts' (choices_column)" in _error(write_suites(text))


@pytest.mark.parametrize("cron", ["61 2 * * *", "0 2 * *", "every night", "0 2 * * * *"])
def test_bad_cron_fails_at_load_with_the_line_and_an_example(
    qa_dataset: Path, write_suites, cron: str
) -> None:
    text = VALID.replace('"0 2 * * *"', f'"{cron}"')
    message = _error(write_suites(text))
    assert f"suites.toml:{_line_of(text, 'schedule')}:" in message
    assert f"schedule {cron!r}" in message and "'0 2 * * *'" in message


def test_cron_aliases_are_accepted(qa_dataset: Path, write_suites) -> None:
    assert (
        load_suite_file(write_suites(VALID.replace('"0 2 * * *"', '"@daily"'))).suites[0].schedule == "@daily"
    )


def test_every_problem_is_reported_at_once_with_its_line(qa_dataset: Path, write_suites) -> None:
    text = (
        VALID.replace("max_tokens = 8", "max_tokens = 0")
        .replace('name = "qa-contains"', 'name = "qa-contains"\ncolour = "red"')
        .replace(
            'metrics = [{ type = "contains", name = "has_answer" }]',
            'metrics = [{ type = "regex", pattern = "(a" }]',
        )
    )
    lines = _error(write_suites(text)).splitlines()
    assert len(lines) == 2, lines  # the regex is not reached: the second suite fails on its unknown key first
    assert (
        f"suites.toml:{_line_of(text, 'max_tokens = 0')}:" in lines[0]
        and "greater than or equal to 1" in lines[0]
    )
    assert f"suites.toml:{_line_of(text, 'colour')}:" in lines[1] and "unknown key 'colour'" in lines[1]
    text = VALID.replace(
        'metrics = [{ type = "contains", name = "has_answer" }]',
        'metrics = [{ type = "regex", pattern = "(a" }]',
    )
    message = _error(write_suites(text))
    assert "not a valid regular expression" in message
    assert f"suites.toml:{_line_of(text, '(a')}:" in message


def test_structural_mistakes(qa_dataset: Path, write_suites) -> None:
    assert re.search(
        r"suites.toml:\d+: .*missing key 'models'",
        _error(write_suites(VALID.replace('models = ["models/tiny"]\n', ""))),
    )
    assert "used twice" in _error(write_suites(VALID.replace('name = "qa-contains"', 'name = "qa"')))
    assert "no suites" in _error(write_suites('history = "h"\n'))
    assert "unknown top-level key 'suites'" in _error(
        write_suites(VALID.replace('[[suite]]\nname = "qa-contains"', '[[suites]]\nname = "x"'))
    )
    syntax = _error(write_suites(VALID.replace("max_tokens = 8", "max_tokens = ")))
    assert "line 13" in syntax and "fix the TOML syntax" in syntax
    taken = _error(write_suites(VALID.replace('name = "has_answer"', 'name = "error"')))
    assert "metric column 'error' is taken" in taken
    assert "no such suite file" in _error(Path("/nonexistent/suites.toml"))
    missing = _error(write_suites(VALID.replace("data/qa.parquet", "data/none.parquet", 1)))
    assert "cannot read dataset" in missing and f"suites.toml:{_line_of(VALID, 'dataset')}:" in missing


def test_custom_metric_by_import_path_and_by_file(qa_dataset: Path, write_suites, tmp_path: Path) -> None:
    (tmp_path / "my_metrics.py").write_text(
        "def starts(completion, reference):\n    return completion.startswith(reference)\n"
    )
    text = VALID.replace(
        'metrics = [{ type = "contains", name = "has_answer" }]',
        'metrics = [{ type = "custom", function = "my_metrics.py:starts", name = "starts" },'
        ' { type = "custom", function = "operator:eq", name = "eq" }]',
    )
    suite = load_suite_file(write_suites(text)).suites[1]
    starts, eq = suite.metrics
    assert (
        isinstance(starts, Custom)
        and starts.score("Paris is", "Paris") == 1.0
        and starts.score("Rome", "Paris") == 0.0
    )
    assert eq.score("4", "4") == 1.0
    bad = _error(write_suites(text.replace("operator:eq", "operator:nothing_here")))
    assert "has no function 'nothing_here'" in bad
    assert "cannot import module 'no_such_module_x'" in _error(
        write_suites(text.replace("operator:eq", "no_such_module_x:f"))
    )


def test_line_index_maps_tables_arrays_and_dotted_keys() -> None:
    text = '[[suite]]\nname = "a"\n[suite.sampling]\nseed = 1\n[[suite.metrics]]\ntype = "x"\n[[suite]]\nname = "b"\nsampling.seed = 2\n'
    lines = LineIndex(text)
    assert lines.line_of(("suite", 0, "name")) == 2
    assert lines.line_of(("suite", 0, "sampling", "seed")) == 4
    assert lines.line_of(("suite", 0, "metrics", 0, "type")) == 6
    assert lines.line_of(("suite", 1)) == 7
    assert lines.line_of(("suite", 1, "sampling", "seed")) == 9
    assert lines.line_of(("suite", 1, "metrics", 3, "type")) == 7  # nearest located ancestor


def test_line_index_skips_multiline_strings_and_reads_commented_headers() -> None:
    text = (
        "[[suite]]  # first\n"
        'name = "a"\n'
        'notes = """\n'
        "fake = 1\n"
        "[[suite]]\n"
        '"""\n'
        "[ suite.sampling ]  # spaces and a comment\n"
        "seed = 3\n"
        '"quoted key" = 1\n'
    )
    lines = LineIndex(text)
    assert lines.line_of(("suite", 0, "notes")) == 3
    assert lines.line_of(("suite", 0, "fake")) == 1  # inside the string: not a key
    assert lines.line_of(("suite", 1)) is None  # nor a header
    assert lines.line_of(("suite", 0, "sampling", "seed")) == 8
    assert lines.line_of(("suite", 0, "sampling", "quoted key")) == 9


def test_multiple_choice_rules(qa_dataset: Path, write_suites) -> None:
    two = VALID.replace(
        'metrics = [{ type = "contains", name = "has_answer" }]',
        'metrics = [{ type = "multiple_choice", choices_column = "options" },'
        ' { type = "multiple_choice", name = "mc2", choices_column = "options" }]',
    )
    assert "at most one multiple_choice metric per suite" in _error(write_suites(two))
    chat = VALID.replace(
        'reference_column = "answer"\nid_column',
        'messages_column = "prompt"\nreference_column = "answer"\nid_column',
    )
    assert "multiple_choice scores a text context; use prompt_column" in _error(write_suites(chat))
    own = VALID.replace(
        'choices_column = "options"', 'choices_column = "options"\nreference_column = "correct_index"'
    )
    message = _error(write_suites(own))
    assert (
        f"suites.toml:{_line_of(own, 'correct_index')}:" in message and "no column 'correct_index'" in message
    )


def test_sampling_takes_one_structured_output_key(qa_dataset: Path, write_suites) -> None:
    """A suite's answers may be held to a choice, a regex or a JSON schema: the generation job's
    SamplingSpec carries it (the job-wide --choice / --regex / --json-schema)."""
    from jobs.evals.plan import _job_specs
    from jobs.storage import open_store

    text = VALID.replace("max_tokens = 8", 'max_tokens = 8\nchoice = ["yes", "no"]')
    qa = load_suite_file(write_suites(text)).suites[0]
    assert qa.sampling.choice == ("yes", "no")
    planned = _job_specs(qa, qa.models[0], open_store(str(qa_dataset.parent)))
    assert planned.generate is not None and planned.generate.sampling.choice == ("yes", "no")
    schema = VALID.replace("max_tokens = 8", 'max_tokens = 8\njson_schema = { type = "object" }')
    qa = load_suite_file(write_suites(schema)).suites[0]
    planned = _job_specs(qa, qa.models[0], open_store(str(qa_dataset.parent)))
    assert planned.generate is not None and planned.generate.sampling.json_schema == '{"type":"object"}'
    both = _error(write_suites(VALID.replace("max_tokens = 8", 'max_tokens = 8\nregex = "a"\nchoice = ["a"]')))
    assert "regex and choice both constrain the answers: give one" in both
    assert "choice" in _error(write_suites(VALID.replace("max_tokens = 8", "max_tokens = 8\nchoice = []")))
    # compiled at load as the worker compiles it (jobs/constraint_check.py), reported at its line
    text = VALID.replace("max_tokens = 8", 'max_tokens = 8\nregex = "[a-z"')
    message = _error(write_suites(text))
    assert f"suites.toml:{_line_of(text, 'regex =')}: suite 'qa': sampling.regex does not compile: unclosed" in message
    text = VALID.replace("max_tokens = 8", 'max_tokens = 8\njson_schema = { type = "objekt" }')
    message = _error(write_suites(text))
    assert f"suites.toml:{_line_of(text, 'json_schema =')}:" in message and "Invalid type: objekt" in message
    assert "sampling.regex" in _error(write_suites(VALID.replace("max_tokens = 8", 'max_tokens = 8\nregex = ""')))
