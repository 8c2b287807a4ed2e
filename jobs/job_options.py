"""The job options: one table of the flags `freight run`, `submit` and `estimate` take and the keys an
eval suite gives, each with its value type, default and help.

The CLI builds its parameters from this table (freight_cli/job_options.py); eval suites describe
their keys with its help (jobs/evals/suite.py). An option's `name` is the keyword of the spec it
fills (JobSpec, or its SamplingSpec for the sampling flags) and, with `-` for `_`, its flag.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from jobs.cost import SHIPPED_PRICES

REQUIRED: Any = ...  # the default of an option the user must give


def _shipped_instance_types() -> str:
    """The shipped price table's keys, for --instance-type's help (read once, at import: a small TOML)."""
    try:
        return ", ".join(tomllib.loads(SHIPPED_PRICES.read_text()))
    except (OSError, tomllib.TOMLDecodeError):  # the help must not fail; the run will say why
        return "see jobs/prices.toml"


@dataclass(frozen=True)
class JobOption:
    """One job option as a user writes it: on the command line (`type` is the flag's value type,
    e.g. a file name for --json-schema) or as a suite key of the same name."""

    name: str
    type: Any
    help: str
    default: Any = None
    metavar: str | None = None  # None: typer shows a Literal's choices, a flag nothing
    argument: bool = False  # positional (INPUT) instead of a --flag

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


JOB_OPTIONS: tuple[JobOption, ...] = (
    JobOption("input", str, "Parquet file, folder/prefix of Parquet files, or OpenAI-Batch .jsonl",
              REQUIRED, "INPUT", argument=True),
    JobOption("model", str, "Hugging Face checkpoint folder or s3://bucket/prefix", REQUIRED, "MODEL"),
    JobOption("output", str, "where results go: local folder or s3://bucket/prefix", REQUIRED, "OUT"),
    JobOption("prompt_column", str, "string prompts, or chat messages (list of role/content)", "prompt", "COLUMN"),
    JobOption("id_column", str | None,
              "unique ids (strings or integers) for the results (default: the row number)", None, "COLUMN"),
    JobOption("continuation_column", str | None, "score this column's text after the prompt", None, "COLUMN"),
    JobOption("task", Literal["generate", "embed"],
              "generate: completions; embed: one embedding per prompt (as /v1/embeddings), pooled as the "
              "checkpoint's sentence-transformers files say (Qwen3-Embedding, e5-mistral); a Parquet input's "
              "prompt column must hold text", "generate"),
    JobOption("dimensions", int | None,
              "--task embed: keep the first N dimensions (Matryoshka), then normalize", None, "N"),
    # Sampling flags with vLLM's names and meanings; a row's column or JSONL body field of the same
    # name overrides each (README "Sampling").
    JobOption("max_tokens", int, "tokens to generate per row, at most", 128, "N"),
    JobOption("temperature", float, "sampling temperature; 0 = greedy", 0.0, "T"),
    JobOption("top_p", float, "nucleus sampling mass in (0, 1]; 1 = off", 1.0, "P"),
    JobOption("top_k", int, "sample from the K likeliest tokens; 0 = off", 0, "K"),
    JobOption("seed", int, "job seed; each row's seed is hash(seed, row id)", 0, "SEED"),
    JobOption("stop", list[str] | None,
              "stop string, cut from the text with what follows (repeat for more)", None, "TEXT"),
    JobOption("n", int, "choices per row (FREIGHT_MAX_N caps it)", 1, "N"),
    JobOption("logprobs", int | None,
              "log-probabilities of each generated token and its K likeliest (0-20)", None, "K"),
    JobOption("presence_penalty", float, "in [-2, 2]: lowers tokens already generated, once each", 0.0, "P"),
    JobOption("frequency_penalty", float, "in [-2, 2]: lowers tokens by how often they were generated", 0.0, "P"),
    JobOption("repetition_penalty", float,
              "> 0: divides the logits of prompt and generated tokens; 1 = off", 1.0, "P"),
    JobOption("min_p", float, "drop tokens below P x the likeliest's probability; 0 = off", 0.0, "P"),
    JobOption("min_tokens", int, "tokens to generate before EOS may end a row", 0, "N"),
    JobOption("logit_bias", str | None,
              'bias added to token logits, e.g. \'{"50256": -100}\' (token id: [-100, 100])', None, "JSON"),
    # Chat rows of a model that thinks (README "Reasoning"); a row's body field or column overrides each.
    JobOption("reasoning_budget", int | None,
              "thinking tokens per row, at most: then the model's end-of-thinking marker is written and the "
              "answer follows (--max-tokens bounds thinking and answer together)", None, "N"),
    JobOption("reasoning_effort", Literal["low", "medium", "high"] | None,
              "the chat template's reasoning effort (gpt-oss)", None),
    JobOption("no_thinking", bool, "turn the model's thinking off (the chat template's enable_thinking=False: "
              "Qwen3)", False),
    # Structured output for every row without its own constraint (README "Structured output"); at
    # most one of the three. freight_cli/constraint_options.py reads the file and splits the choices.
    JobOption("json_schema", Path | None,
              "a JSON file holding a JSON schema: every row's output is JSON that follows it (a row's own "
              "constraint wins)", None, "FILE"),
    JobOption("regex", str | None, "every row's output matches this regular expression, whole", None, "PATTERN"),
    JobOption("choice", str | None, "every row's output is one of these comma-separated strings", None, "A,B,C"),
    JobOption("row_constraints", bool,
              "hold each row's output to its own Parquet column response_format, json_schema, regex or choice "
              "(a null cell takes the job's flag); without it such columns are plain data", False),
    JobOption("shard_rows", int, "rows per shard, about", 256, "N"),
    JobOption("instance_type", str,
              f"where it runs, for the cost report: one of {_shipped_instance_types()} (the shipped price "
              "table), or a key of --prices, or any name with --price-per-hour", "cpu-local", "TYPE"),
    JobOption("market", Literal["on-demand", "spot"], "which price of the instance type", "on-demand"),
    JobOption("price_per_hour", float | None, "USD per instance-hour; overrides the price table", None, "USD"),
    JobOption("prices", Path | None,
              "a price table instead of the shipped one: a TOML table per instance type with USD per hour, "
              'e.g. ["g5.xlarge"] on_demand = 1.006 spot = 0.40 (spot optional: defaults to on_demand)',
              None, "FILE"),
    JobOption("quantization", Literal["int8", "int4", "fp8"] | None,
              "quantize the weights at load (int8/int4: round to nearest; fp8: e4m3, on GPUs of compute "
              "capability 8.9+ such as L4, L40S, H100, H200)"),
    JobOption("quant_group", int | None,
              "--quantization int4: the group size along K, 32, 64 or 128 (smaller: closer to the model, a "
              "few more bytes; default: the largest that divides every layer)", None, "G"),
    JobOption("speculative", str | None,
              "speculative decoding: ngram proposes the tokens that followed the text's last 1-4 tokens "
              "earlier in the prompt or completion (copy-heavy tasks); draft:PATH a smaller checkpoint with "
              "the same tokenizer. Outputs are unchanged; it turns itself off where it does not pay",
              None, "ngram|draft:PATH"),
    JobOption("speculative_tokens", int | None,
              "speculative decoding: most tokens proposed per step (default: ngram 8, draft 6)", None, "K"),
    # LoRA adapters of the model (docs/design/lora.md): rows pick one by name, all share the batches
    JobOption("lora", list[str] | None,
              "a PEFT LoRA adapter of the model, NAME=PATH (a folder or s3:// prefix with adapter_config.json "
              "and adapter_model.safetensors); a row runs it when its `adapter` column or its body's model "
              "names it, else the model itself (repeat for more; ranks up to 64)", None, "NAME=PATH"),
    JobOption("max_loras", int | None,
              "LoRA adapters kept on the device at once; others wait and are swapped in from host memory, "
              "least recently used first (default: 8)", None, "N"),
    # The caches of answers (docs/design/result-cache.md): not part of the job spec (the results are
    # the same with or without them), they go to OUT/cache.json (jobs/result_cache/options.py).
    JobOption("result_cache", str | None,
              "reuse the answers of deterministic rows (greedy, or seeded by the row) that earlier jobs computed "
              "with the same model content and settings, and keep this job's there: a folder or "
              "s3://bucket/prefix (default: FREIGHT_RESULT_CACHE; off: none)", None, "DIR|s3://..."),
    JobOption("semantic_cache", float | None,
              "opt-in: a row whose prompt is at least this similar (cosine of --embed-model's embeddings, in "
              "(0, 1]) to a cached prompt of the same model and settings takes that prompt's answer: the answer "
              "of a similar prompt, not of this one", None, "THRESHOLD"),
    JobOption("embed_model", str | None,
              "--semantic-cache: the --task embed checkpoint (folder or s3://) that embeds the prompts", None,
              "MODEL"),
)  # fmt: skip
# The cache options, taken out of the options before the JobSpec is built (freight_cli/job_options.py).
CACHE_OPTIONS = ("result_cache", "semantic_cache", "embed_model")

_BY_NAME = {option.name: option for option in JOB_OPTIONS}


def job_option(name: str) -> JobOption:
    """The option called `name` (KeyError names it when the table has none)."""
    return _BY_NAME[name]
