"""The multiple-choice likelihood metric against transformers as the oracle, on a tiny random model.

For every (context, option) the oracle computes the summed logprob of the option's tokens after the
context the way common harnesses do (context tokens, then the continuation's tokens, one forward
pass, log-softmax), and the eval's per-option logprobs, choices and accuracies must agree.
"""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from freight_cli import app
from jobs.evals.collect import read_scores
from jobs.evals.plan import read_plan
from jobs.evals.scoring import read_job_results
from jobs.storage import open_store

QUESTIONS = [
    ("The opposite of hot is", ["cold", "warm", "a very long distractor option"], 0),
    ("def main():\n    return", ["None", "main()", "x"], 1),
    ("import json\njson.", ["dumps(obj)", "loads", "encoder"], 2),
    ("for i in range(10):", [" print(i)", "pass", "break"], 0),
    ("Water is", ["wet", "dry"], 1),
]
DELIMITER = " "
TOLERANCE = 2e-3  # nats, summed over a few tokens: float32 kernels of the engine vs transformers


def _oracle(model_dir: Path) -> list[list[float]]:
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    # the checkpoint's tokenizer.json as written; transformers 5's AutoTokenizer would swap in
    # Qwen2Tokenizer's own pre-tokenizer for a qwen2 config and split "\n    " differently
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    scores = []
    for context, options, _ in QUESTIONS:
        row = []
        for option in options:
            ctx = tokenizer(context)["input_ids"]
            cont = tokenizer(DELIMITER + option, add_special_tokens=False)["input_ids"]
            ids = torch.tensor([ctx + cont])
            with torch.no_grad():
                logprobs = torch.log_softmax(model(ids).logits[0].double(), dim=-1)  # [T, vocab]
            # token at position p is predicted by the logits at p - 1
            row.append(sum(float(logprobs[p - 1, ids[0, p]]) for p in range(len(ctx), len(ctx) + len(cont))))
        scores.append(row)
    return scores


def _add_bos(model_dir: Path) -> None:
    """Make the tokenizer prepend a BOS to every encoded text, as Llama and Mistral tokenizers do."""
    from tokenizers import Tokenizer, processors

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    bos = "<|endoftext|>"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tokenizer.token_to_id(bos))]
    )
    tokenizer.save(str(model_dir / "tokenizer.json"))


@pytest.mark.parametrize(
    ("arch", "bos"),
    [("qwen2", False), ("llama", True)],  # llama: a tokenizer that prepends a BOS to every encode
)
def test_multiple_choice_matches_transformers(tmp_path: Path, arch: str, bos: bool) -> None:
    from worker.demo_model import make_demo_model

    model_dir = make_demo_model(tmp_path / "model", arch, seed=3)
    if bos:
        _add_bos(model_dir)
    pq.write_table(
        pa.table(
            {
                "prompt": [q for q, _, _ in QUESTIONS],
                "options": [o for _, o, _ in QUESTIONS],
                "answer": [a for _, _, a in QUESTIONS],
            }
        ),
        tmp_path / "mc.parquet",
    )
    (tmp_path / "suites.toml").write_text(
        'history = "history"\n[[suite]]\nname = "mc"\ndataset = "mc.parquet"\nmodels = ["model"]\n'
        'reference_column = "answer"\n'
        f'metrics = [{{ type = "multiple_choice", choices_column = "options", target_delimiter = "{DELIMITER}" }}]\n'
    )
    out = str(tmp_path / "run")
    result = CliRunner().invoke(
        app, ["eval", "run", str(tmp_path / "suites.toml"), "--output", out], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output

    (entry,) = read_plan(out).suites[0].models
    assert entry.generate is None and entry.likelihood is not None  # only a scoring job was run
    job = read_job_results(open_store(entry.likelihood.output)).to_pydict()
    got = dict(zip(job["id"], job["continuation_logprob"], strict=True))
    expected = _oracle(model_dir)
    right = right_norm = 0
    for q, ((_, options, answer), oracle) in enumerate(zip(QUESTIONS, expected, strict=True)):
        mine = [got[f"{q}#{k}"] for k in range(len(options))]
        assert mine == pytest.approx(oracle, abs=TOLERANCE)
        ranked = sorted(oracle, reverse=True)
        assert ranked[0] - ranked[1] > 2 * TOLERANCE  # no near-tie: the argmax is well defined
        right += max(range(len(options)), key=lambda k: oracle[k]) == answer
        normed = [lp / len(o) for lp, o in zip(oracle, options, strict=True)]  # characters of the option
        right_norm += max(range(len(options)), key=lambda k: normed[k]) == answer
    scores = read_scores(out, "mc", str(model_dir))
    assert scores.column("multiple_choice").to_pylist() == [
        float(max(range(len(o)), key=lambda k: e[k]) == a)
        for (_, o, a), e in zip(QUESTIONS, expected, strict=True)
    ]
    assert sum(scores.column("multiple_choice").to_pylist()) == right
    assert sum(scores.column("multiple_choice_norm").to_pylist()) == right_norm
    assert all(math.isfinite(v) and v < 0 for v in job["continuation_logprob"])
