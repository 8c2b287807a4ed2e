"""/v1/batches end to end through the official `openai` client, against `freight serve` in a process of
its own (its batch process runs the jobs with the embedded runner on a tiny model)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx2
import openai
import pytest
from openai.types import Batch, BatchError

from tests.api.serve_harness import FREIGHT, ServeProcess, batch_line, wait_batch
from tests.jobs.openai_check import BatchRequestOutput, assert_known_fields, parse_output


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _run_batch(client: openai.OpenAI, path: Path, lines: list[str], endpoint: str = "/v1/chat/completions",
               window: str = "24h") -> Batch:  # fmt: skip
    """Upload `lines` as a batch file, create a batch of it and wait for its end."""
    upload = client.files.create(file=_write(path, lines).open("rb"), purpose="batch")
    return wait_batch(client, client.batches.create(input_file_id=upload.id, endpoint=endpoint,
                                                    completion_window=window).id)  # fmt: skip


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [] if file_id is None else [json.loads(x) for x in client.files.content(file_id).read().splitlines()]


def test_upload_create_poll_download(serve_process: Callable[..., ServeProcess], served_model: Path, tmp_path: Path) -> None:
    server = serve_process()
    key = server.key("team-a")
    client = server.client(key)
    model = str(served_model)
    lines = [batch_line(f"r{i}", f"Tell me about {i}", model=model, max_tokens=6) for i in range(12)]
    lines.append(batch_line("bad-field", model=model, temperature="hot"))
    lines.append(json.dumps({"custom_id": "bad-url", "method": "POST", "url": "/v1/images", "body": {"model": model}}))
    upload = client.files.create(file=_write(tmp_path / "in.jsonl", lines).open("rb"), purpose="batch")
    created = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                                    metadata={"project": "docs", "run": "1"})  # fmt: skip
    assert isinstance(created, Batch) and created.status == "validating" and created.model_extra == {}
    assert created.request_counts is not None and created.request_counts.total == 14
    assert created.expires_at == created.created_at + 86_400 and created.metadata == {"project": "docs", "run": "1"}

    seen = []
    batch = client.batches.retrieve(created.id)
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        seen.append(batch.status)
        batch = client.batches.retrieve(created.id)
    assert batch.status == "completed", batch
    assert set(seen) <= {"validating", "in_progress", "finalizing"} and "in_progress" in seen
    assert batch.model_extra == {} and batch.model == model and batch.errors is None
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at  # type: ignore[operator]
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (14, 12, 2)

    output = tmp_path / "out.jsonl"
    output.write_bytes(client.files.content(batch.output_file_id).read())  # type: ignore[arg-type]
    parsed = parse_output(output)  # every line a 200 with a body the SDK's types parse
    assert sorted(raw["custom_id"] for raw, _ in parsed) == sorted(f"r{i}" for i in range(12))
    assert all(body.model == model for _, body in parsed)  # type: ignore[attr-defined]
    errors = _lines(client, batch.error_file_id)
    for line in errors:
        assert_known_fields(BatchRequestOutput.model_validate(line))
    assert {e["custom_id"]: e["response"]["status_code"] for e in errors} == {"bad-field": 400, "bad-url": 400}
    assert "temperature" in next(e for e in errors if e["custom_id"] == "bad-field")["error"]["message"]

    out_file = client.files.retrieve(batch.output_file_id)  # type: ignore[arg-type]
    assert out_file.purpose == "batch_output" and out_file.bytes == output.stat().st_size
    assert out_file.expires_at == out_file.created_at + 30 * 86_400

    # usage is the job's cost report's tokens
    with httpx2.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}) as http:
        cost = http.get(f"/v1/batches/{batch.id}/cost").json()
    assert cost["state"] == "succeeded" and cost["rows"] == 14 and cost["rows_failed"] == 2
    assert batch.usage is not None and batch.usage.model_extra == {}
    assert batch.usage.input_tokens == cost["prompt_tokens"] > 0
    assert batch.usage.output_tokens == cost["completion_tokens"] == sum(
        body.usage.completion_tokens for _, body in parsed  # type: ignore[attr-defined]
    )
    assert batch.usage.input_tokens_details.cached_tokens == cost["cached_tokens"]
    assert batch.usage.total_tokens == cost["prompt_tokens"] + cost["completion_tokens"]

    # the batch is a freight job: `freight jobs` lists it, `freight results --format openai` writes its files
    listed = json.loads(subprocess.run([FREIGHT, "jobs", "--prefix", str(server.store_dir),
                                        "--json"], check=True, capture_output=True, text=True).stdout)  # fmt: skip
    (job,) = listed
    assert job["state"] == "succeeded" and job["rows_total"] == 14 and job["job_id"] == cost["job_id"]
    export = tmp_path / "export.jsonl"
    subprocess.run([FREIGHT, "results", job["output"], "--format", "openai", "--to",
                    str(export)], check=True, capture_output=True)  # fmt: skip
    assert export.read_bytes() == output.read_bytes()
    assert (tmp_path / "export.errors.jsonl").read_bytes() == client.files.content(batch.error_file_id).read()  # type: ignore[arg-type]


def test_bad_batches_are_refused_with_openai_errors(
    serve_process: Callable[..., ServeProcess], served_model: Path, tmp_path: Path
) -> None:
    server = serve_process()
    key = server.key("team-a")
    client = server.client(key)
    good = client.files.create(file=_write(tmp_path / "in.jsonl", [batch_line("a", model=str(served_model))]).open("rb"),
                               purpose="batch")  # fmt: skip

    def refused(param: str | None, **kwargs: object) -> openai.BadRequestError:
        args = {"input_file_id": good.id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **kwargs}
        with pytest.raises(openai.BadRequestError) as bad:
            client.batches.create(**args)  # type: ignore[arg-type]
        assert bad.value.param == param, bad.value.body
        return bad.value

    assert "/v1/chat/completions" in refused("endpoint", endpoint="/v1/moderations").message
    assert "duration" in refused("completion_window", completion_window="soon").message
    assert "1m" in refused("completion_window", completion_window="30s").message
    refused("metadata", metadata={f"k{i}": "v" for i in range(17)})
    refused("output_expires_after.seconds", output_expires_after={"anchor": "created_at", "seconds": 10})
    assert "Unrecognized" in refused("priority", extra_body={"priority": 1}).message
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-0000000000000000000000000000", endpoint="/v1/chat/completions",
                              completion_window="24h")  # fmt: skip
    with httpx2.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}) as http:
        not_json = http.post("/v1/batches", content=b"{not json", headers={"content-type": "application/json"})
        wrong_type = http.post("/v1/batches", content=b"input_file_id=x", headers={"content-type": "text/plain"})
        an_array = http.post("/v1/batches", json=[1, 2])
    for answer in (not_json, wrong_type, an_array):
        assert answer.status_code == 400 and set(answer.json()["error"]) == {"message", "type", "param", "code"}
    assert client.batches.list().data == []  # nothing was made

    # a file that fails validation: repeated custom_ids, named by line
    batch = _run_batch(client, tmp_path / "dup.jsonl", [batch_line("x", model=str(served_model)),
                       batch_line("y", model=str(served_model)), batch_line("x", model=str(served_model))])  # fmt: skip
    assert batch.status == "failed" and batch.failed_at and batch.errors is not None
    (error,) = batch.errors.data  # type: ignore[misc]
    assert isinstance(error, BatchError) and error.code == "duplicate_custom_id" and error.line == 3
    assert batch.output_file_id is None and batch.error_file_id is None
    with pytest.raises(openai.BadRequestError) as bad:
        client.batches.cancel(batch.id)
    assert "failed already" in bad.value.message
    # a batch_output file is no input
    done = wait_batch(client, client.batches.create(input_file_id=good.id, endpoint="/v1/chat/completions",
                                                    completion_window="24h").id)  # fmt: skip
    refused("input_file_id", input_file_id=done.output_file_id)


def _long_file(path: Path, model: Path, n: int = 300, tokens: int = 24) -> Path:
    return _write(path, [batch_line(f"r{i}", f"Write a long story about the number {i}", model=str(model),
                                    max_tokens=tokens, ignore_eos=True) for i in range(n)])  # fmt: skip


def _ids_once(client: openai.OpenAI, batch: Batch) -> tuple[list[dict], list[dict]]:
    """(output lines, error lines); asserts every custom_id of the batch appears once in all."""
    out, err = _lines(client, batch.output_file_id), _lines(client, batch.error_file_id)
    ids = [line["custom_id"] for line in out + err]
    assert len(ids) == len(set(ids)) == batch.request_counts.total  # type: ignore[union-attr]
    return out, err


@pytest.mark.slow
def test_cancel_mid_run_keeps_the_rows_done(serve_process: Callable[..., ServeProcess], served_model: Path,
                                            tmp_path: Path) -> None:  # fmt: skip
    server = serve_process("--shard-rows", "25", "--max-batches-in-flight", "1")
    client = server.client(server.key("team-a"))
    upload = client.files.create(file=_long_file(tmp_path / "in.jsonl", served_model).open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.RateLimitError) as over:  # one batch in flight at most
        client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert over.value.code == "batch_limit_exceeded"
    while (b := client.batches.retrieve(batch.id)).request_counts.completed < 25:  # type: ignore[union-attr]
        assert b.status in ("validating", "in_progress"), b
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    batch = wait_batch(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at >= batch.cancelling_at  # type: ignore[operator]
    out, err = _ids_once(client, batch)
    counts = batch.request_counts
    assert counts is not None and counts.total == 300 and 25 <= counts.completed == len(out) < 300
    assert counts.failed == len(err) == 300 - len(out)
    assert {e["error"]["code"] for e in err} == {"batch_cancelled"} and all(e["response"] is None for e in err)
    assert all(line["response"]["status_code"] == 200 for line in out)
    assert batch.usage is not None and batch.usage.output_tokens == 24 * len(out)
    again = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert client.batches.cancel(again.id).status == "cancelling"  # in flight no more: a new one is taken
    assert wait_batch(client, again.id).status == "cancelled"


@pytest.mark.slow
def test_a_short_completion_window_ends_expired(serve_process: Callable[..., ServeProcess], served_model: Path,
                                                tmp_path: Path) -> None:  # fmt: skip
    server = serve_process("--shard-rows", "25", "--min-completion-window", "1s")
    client = server.client(server.key("team-a"))
    warm = _run_batch(client, tmp_path / "w.jsonl", [batch_line("w", model=str(served_model))], window="1h")
    assert warm.status == "completed"
    # far more work than any machine does in the window, so the window ends it on every machine
    long = _long_file(tmp_path / "in.jsonl", served_model, n=2000, tokens=64)
    upload = client.files.create(file=long.open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="3s")
    assert batch.expires_at == batch.created_at + 3
    batch = wait_batch(client, batch.id)
    assert batch.status == "expired" and batch.expired_at >= batch.expires_at  # type: ignore[operator]
    out, err = _ids_once(client, batch)
    assert len(out) < 2000 and {e["error"]["code"] for e in err} == {"batch_expired"}
    assert batch.request_counts.completed == len(out)  # type: ignore[union-attr]


def test_pages_of_batches_and_tenants_apart(serve_process: Callable[..., ServeProcess], served_model: Path,
                                           tmp_path: Path) -> None:  # fmt: skip
    server = serve_process()
    a, b = server.client(server.key("team-a")), server.client(server.key("team-b"))
    upload = a.files.create(file=_write(tmp_path / "in.jsonl", [batch_line("x", model=str(served_model))]).open("rb"),
                            purpose="batch")  # fmt: skip
    ids = [a.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                            metadata={"n": str(i)}).id for i in range(12)]  # fmt: skip
    newest_first = ids[::-1]
    page = a.batches.list(limit=5)
    assert [x.id for x in page.data] == newest_first[:5] and page.has_more
    page2 = a.batches.list(limit=5, after=page.data[-1].id)
    assert [x.id for x in page2.data] == newest_first[5:10]
    last = a.batches.list(limit=5, after=page2.data[-1].id)
    assert [x.id for x in last.data] == newest_first[10:] and not last.has_more
    assert [x.id for x in a.batches.list(limit=7)] == newest_first  # the SDK follows the cursor
    assert [x.metadata["n"] for x in a.batches.list(limit=100).data] == [str(i) for i in reversed(range(12))]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        a.batches.list(after="batch_0000000000000000000000000000")
    assert bad.value.param == "after"
    # another tenant sees none of it; its ids of A's objects are unknown to it (404, never 403)
    assert b.batches.list().data == []
    for call in (lambda: b.batches.retrieve(ids[0]), lambda: b.batches.cancel(ids[0]),
                 lambda: b.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")):  # fmt: skip
        with pytest.raises(openai.NotFoundError):
            call()
    with httpx2.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.key('team-b')}"}) as http:
        assert http.get(f"/v1/batches/{ids[0]}/cost").status_code == 404
    with pytest.raises(openai.AuthenticationError):
        server.client("fk-wrong").batches.list()
    for batch_id in ids:
        assert wait_batch(a, batch_id).status == "completed"


@pytest.mark.slow
def test_a_server_killed_mid_batch_resumes_every_row_once(serve_process: Callable[..., ServeProcess],
                                                          served_model: Path, tmp_path: Path) -> None:  # fmt: skip
    import os
    import signal
    import time

    server = serve_process("--shard-rows", "25")
    key = server.key("team-a")
    client = server.client(key)
    upload = client.files.create(file=_long_file(tmp_path / "in.jsonl", served_model).open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    while client.batches.retrieve(batch.id).request_counts.completed < 50:  # type: ignore[union-attr]
        time.sleep(0.05)
    child = json.loads((server.store_dir / "serve" / "batch-process.lock").read_text())["pid"]
    server.process.send_signal(signal.SIGKILL)
    server.process.wait()
    deadline = time.monotonic() + 5
    while True:  # the batch process dies with its server
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the batch process outlived its server"
        time.sleep(0.02)
    restarted = serve_process("--shard-rows", "25", store_dir=server.store_dir)
    client = restarted.client(key)
    assert [x.id for x in client.batches.list().data] == [batch.id]
    done = wait_batch(client, batch.id, timeout=300)
    assert done.status == "completed" and done.error_file_id is None
    out, _ = _ids_once(client, done)
    assert sorted(line["custom_id"] for line in out) == sorted(f"r{i}" for i in range(300))
    assert done.request_counts.completed == 300  # type: ignore[union-attr]


def test_a_mixed_file_runs_every_endpoint_and_refuses_bad_lines(
    serve_process: Callable[..., ServeProcess], served_model: Path, tmp_path: Path
) -> None:
    from openai.types import Completion, CreateEmbeddingResponse
    from openai.types.chat import ChatCompletion
    from openai.types.responses import Response

    server = serve_process()
    client = server.client(server.key("team-a"))
    model = str(served_model)
    lines = [
        batch_line("chat", "Hello there", model=model, max_tokens=5, temperature=0.7, seed=3),
        batch_line("chat-n", "Two answers", model=model, max_tokens=4, n=2, logprobs=True, top_logprobs=2),
        batch_line("text", "Once upon a time", url="/v1/completions", model=model, max_tokens=5, logprobs=1),
        batch_line("embed", "a sentence to embed", url="/v1/embeddings", model=model),
        batch_line("embed-small", "a shorter one", url="/v1/embeddings", model=model, dimensions=8),
        json.dumps({"custom_id": "no-url", "method": "POST", "body": {"model": model, "prompt": "no url given"}}),
        batch_line("resp", "Hello there", url="/v1/responses", model=model, instructions="Be brief.",
                   max_output_tokens=5, metadata={"run": "7"}, include=["message.output_text.logprobs"], top_logprobs=2),
        json.dumps({"custom_id": "resp-items", "method": "POST", "url": "/v1/responses", "body": {
            "model": model, "max_output_tokens": 4, "text": {"format": {"type": "json_object"}},
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Answer in JSON"}]}]}}),
        # bad lines: each that request's error, the batch runs on
        batch_line("tools", model=model, tools=[{"type": "function", "function": {"name": "f"}}]),
        batch_line("other-model", model="/somewhere/else"),
        json.dumps({"custom_id": "get", "method": "GET", "url": "/v1/chat/completions", "body": {"model": model}}),
        json.dumps({"method": "POST", "url": "/v1/completions", "body": {"model": model, "prompt": "x"}}),
        json.dumps({"custom_id": "extra", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}, "x": 1}),
        batch_line("too-long", "word " * 5000, url="/v1/completions", model=model),
        batch_line("resp-store", url="/v1/responses", model=model, store=True),
    ]
    # a batch with nothing to compute (every line an error before the engine) never loads the model
    refused = [line for line in lines[-7:] if "too-long" not in line]  # the engine finds a prompt too long
    only_errors = _run_batch(client, tmp_path / "bad.jsonl", refused)
    assert only_errors.request_counts.failed == 6 and only_errors.request_counts.completed == 0, only_errors  # type: ignore[union-attr]
    assert "engine_loaded" not in server.log.read_text()
    # a batch's endpoint names its file's main url; freight runs each line at its own
    batch = _run_batch(client, tmp_path / "mixed.jsonl", lines, endpoint="/v1/responses")
    assert batch.status == "completed" and batch.endpoint == "/v1/responses", batch
    out, err = _ids_once(client, batch)
    bodies = {line["custom_id"]: line["response"]["body"] for line in out}
    assert set(bodies) == {"chat", "chat-n", "text", "embed", "embed-small", "no-url", "resp", "resp-items"}
    assert ChatCompletion.model_validate(bodies["chat"]).choices[0].finish_reason in ("stop", "length")
    two = ChatCompletion.model_validate(bodies["chat-n"])
    assert [c.index for c in two.choices] == [0, 1] and all(len(c.logprobs.content[0].top_logprobs) == 2 for c in two.choices)  # type: ignore[union-attr]
    assert Completion.model_validate(bodies["text"]).choices[0].logprobs is not None
    assert Completion.model_validate(bodies["no-url"]).object == "text_completion"
    full = CreateEmbeddingResponse.model_validate(bodies["embed"]).data[0].embedding
    small = CreateEmbeddingResponse.model_validate(bodies["embed-small"]).data[0].embedding
    assert len(small) == 8 < len(full) and abs(sum(x * x for x in full) - 1.0) < 1e-4
    resp = Response.model_validate(bodies["resp"])
    assert resp.object == "response" and resp.model == model and resp.output_text
    assert (resp.instructions, resp.metadata, resp.max_output_tokens, resp.top_logprobs) == ("Be brief.", {"run": "7"}, 5, 2)
    assert resp.status in ("completed", "incomplete") and resp.usage is not None and 0 < resp.usage.output_tokens <= 5
    assert all(len(t.top_logprobs) == 2 for t in resp.output[0].content[0].logprobs)  # type: ignore[union-attr]
    items = Response.model_validate(bodies["resp-items"])
    assert items.text is not None and items.text.format.type == "json_object" and items.usage.output_tokens <= 4  # type: ignore[union-attr]
    why = {line["custom_id"]: line["error"]["message"] for line in err}
    assert set(why) == {"tools", "other-model", "get", "line-12", "extra", "too-long", "resp-store"}
    assert "renders no tools" in why["tools"] and "this job runs" in why["other-model"]
    assert "POST" in why["get"] and "custom_id" in why["line-12"] and "'x'" in why["extra"]
    assert "context" in why["too-long"] and "store true" in why["resp-store"]
    assert batch.request_counts.completed == 8 and batch.request_counts.failed == 7  # type: ignore[union-attr]
    assert server.log.read_text().count("engine_loaded") == 1  # loaded by the batch that had rows to run


def test_models_by_name(serve_process: Callable[..., ServeProcess], served_model: Path, tmp_path: Path) -> None:
    """--models: a request's model is a served name, or a LoRA adapter of one (the batch runs its model,
    the request its adapter); a name the file does not hold is that request's error, or the batch's
    when no line names a served model; the output names the model or adapter as asked."""
    import transformers

    pytest.importorskip("peft")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from tiny_adapters import make_adapter
    base = transformers.AutoModelForCausalLM.from_pretrained(served_model).float().eval()
    make_adapter(base, tmp_path / "ad" / "alpha", rank=8, seed=1, scale=0.3)
    models = tmp_path / "models.toml"
    models.write_text(f'[tiny-chat]\npath = "{served_model}"\nadapters = {{ alpha = "ad/alpha" }}\n\n'
                      f'[tiny-int8]\npath = "{served_model}"\nquantization = "int8"\n')  # fmt: skip
    server = serve_process("--models", str(models))
    client = server.client(server.key("team-a"))
    lines = [batch_line("named", model="tiny-chat", max_tokens=6), batch_line("unnamed", max_tokens=3),
             batch_line("other", model="gpt-4o", max_tokens=3), batch_line("path", model=str(served_model)),
             batch_line("alpha", model="alpha", max_tokens=6)]  # fmt: skip
    batch = _run_batch(client, tmp_path / "in.jsonl", lines)
    assert batch.status == "completed" and batch.model == "tiny-chat", batch
    out, err = _ids_once(client, batch)
    bodies = {line["custom_id"]: line["response"]["body"] for line in out}
    assert {k: b["model"] for k, b in bodies.items()} == {"named": "tiny-chat", "unnamed": "tiny-chat", "alpha": "alpha"}
    assert bodies["alpha"]["choices"][0]["message"] != bodies["named"]["choices"][0]["message"]  # the adapter ran
    why = {line["custom_id"]: line["error"]["message"] for line in err}
    assert set(why) == {"other", "path"} and all("this batch runs 'tiny-chat'" in m for m in why.values())
    assert str(served_model) not in why["other"]  # the server's folders are named to no request

    failed = _run_batch(client, tmp_path / "nope.jsonl", [batch_line("a", model="nope"), batch_line("b", model="nope")])
    assert failed.status == "failed" and failed.errors is not None
    (error,) = failed.errors.data  # type: ignore[misc]
    assert (error.code, error.line, error.param) == ("model_not_found", 1, "model")
    assert "tiny-chat" in (error.message or "") and "tiny-int8" in (error.message or "")

    broken = tmp_path / "broken.toml"
    broken.write_text('"x" = { quantization = "int8" }\n')
    result = subprocess.run([FREIGHT, "serve", "--store", str(tmp_path / "s2"), "--models", str(broken)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2 and "--models" in result.stderr and "'x'" in result.stderr



def test_models_file_adapters_are_checked(served_model: Path, tmp_path: Path) -> None:
    """An adapter's name is one thing only: neither a model's nor another model's adapter's."""
    from jobs.api.models import load_models
    from jobs.errors import FreightError

    (tmp_path / "ok.toml").write_text(f'[a]\npath = "{served_model}"\nadapters = {{ "b/v1" = "ad/b" }}\n')
    assert load_models(tmp_path / "ok.toml")["a"].adapters == {"b/v1": str(tmp_path / "ad" / "b")}
    (tmp_path / "clash.toml").write_text(f'[a]\npath = "{served_model}"\nadapters = {{ b = "x" }}\n\n'
                                         f'[b]\npath = "{served_model}"\n')  # fmt: skip
    with pytest.raises(FreightError, match="adapter 'b' has the name of model 'b'"):
        load_models(tmp_path / "clash.toml")
    (tmp_path / "twice.toml").write_text(f'[a]\npath = "{served_model}"\nadapters = {{ x = "x" }}\n\n'
                                         f'[c]\npath = "{served_model}"\nadapters = {{ x = "y" }}\n')  # fmt: skip
    with pytest.raises(FreightError, match="adapter 'x' has the name of an adapter of 'a'"):
        load_models(tmp_path / "twice.toml")
    (tmp_path / "badname.toml").write_text(f'[a]\npath = "{served_model}"\nadapters = {{ "-x" = "x" }}\n')
    with pytest.raises(FreightError, match="adapter name '-x'"):
        load_models(tmp_path / "badname.toml")
