"""`freight serve --result-cache`: a tenant's repeated batch is answered from its own result cache,
never from another tenant's, with the same output lines; a server without it writes no cache. The
kept engine's prefix cache is kept apart per tenant likewise (its cached_tokens)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2

from tests.api.serve_harness import FREIGHT, ServeProcess, batch_line, wait_batch
from tests.jobs.openai_check import parse_output

N = 3  # requests of the batch: the smallest that shows each row answered from the cache


def _greedy_lines(model: Path) -> list[str]:
    """Greedy requests: deterministic rows, the ones the result cache keeps and answers."""
    return [batch_line(f"r{i}", f"Tell me about {i}", model=str(model), max_tokens=4, temperature=0) for i in range(N)]


def _run(server: ServeProcess, key: str, lines: list[str], path: Path) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    """(the batch, its output lines, its cost report) of `lines` run by `key`'s tenant."""
    client = server.client(key)
    path.write_text("".join(line + "\n" for line in lines))
    upload = client.files.create(file=path.open("rb"), purpose="batch")
    batch = wait_batch(client, client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                                     completion_window="24h").id)  # fmt: skip
    assert batch.status == "completed", batch
    output = path.with_suffix(".out.jsonl")
    output.write_bytes(client.files.content(batch.output_file_id).read())
    parse_output(output)  # every line a 200 with a body the SDK's types parse, no field they do not know
    with httpx2.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}) as http:
        cost = http.get(f"/v1/batches/{batch.id}/cost").json()
    return batch, [json.loads(x) for x in output.read_text().splitlines()], cost


def _answers(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Each request's line without what names its batch (the line's and body's ids, the request id,
    the time it was made): what a cached answer must repeat."""
    out = {}
    for line in lines:
        response = line["response"]
        body = {k: v for k, v in response["body"].items() if k not in ("id", "created")}
        out[line["custom_id"]] = {**{k: v for k, v in line.items() if k not in ("id", "response")},
                                  "status_code": response["status_code"], "keys": sorted(response), "body": body}  # fmt: skip
    return out


def test_a_tenant_reuses_its_own_answers_never_another_tenants(
    serve_process: Callable[..., ServeProcess], served_model: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    server = serve_process("--result-cache", str(cache))
    a, b = server.key("team-a"), server.key("team-b")
    lines = _greedy_lines(served_model)

    first, out1, cost1 = _run(server, a, lines, tmp_path / "a1.jsonl")
    assert cost1["result_cache_hits"] == 0 and cost1["result_cache_entries_written"] == N
    second, out2, cost2 = _run(server, a, lines, tmp_path / "a2.jsonl")
    assert cost2["result_cache_hits"] == N and cost2["result_cache_entries_written"] == 0
    assert cost2["result_cache_seconds"] > 0
    assert second.request_counts.completed == N and second.usage == first.usage
    assert _answers(out2) == _answers(out1)  # the same lines: no field says an answer was cached

    # another tenant's same batch computes every row, in its own cache
    _, out3, cost3 = _run(server, b, lines, tmp_path / "b.jsonl")
    assert cost3["result_cache_hits"] == 0 and cost3["result_cache_entries_written"] == N
    # the same answers (its usage's cached_tokens is the kept engine's prefix cache, not this cache)
    assert {k: v["body"]["choices"] for k, v in _answers(out3).items()} == {
        k: v["body"]["choices"] for k, v in _answers(out1).items()
    }
    assert sorted(p.name for p in (cache / "tenants").iterdir()) == ["team-a", "team-b"]
    assert list(cache.iterdir()) == [cache / "tenants"]


def _cached(lines: list[dict[str, Any]]) -> dict[str, int]:
    return {line["custom_id"]: line["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"]
            for line in lines}  # fmt: skip


def test_without_a_result_cache_none_is_written_and_no_tenant_sees_anothers_prefixes(
    serve_process: Callable[..., ServeProcess], served_model: Path, tmp_path: Path
) -> None:
    """A server without --result-cache writes no cache. Its kept engine reuses a prompt's KV blocks
    within a tenant only: a batch's cached_tokens never tell it what another tenant sent (the
    engine's cache salt is the tenant)."""
    server = serve_process()
    a, b = server.key("team-a"), server.key("team-b")
    lines = _greedy_lines(served_model)
    _, first, cost_first = _run(server, a, lines, tmp_path / "a1.jsonl")
    assert cost_first["result_cache_hits"] == 0 and cost_first["result_cache_entries_written"] == 0
    _, other, cost = _run(server, b, lines, tmp_path / "b.jsonl")
    assert _cached(other) == _cached(first) == dict.fromkeys(_cached(first), 0)  # nothing of team-a's
    assert cost["cached_tokens"] == 0
    _, again, cost_again = _run(server, a, lines, tmp_path / "a2.jsonl")
    assert all(_cached(again)[k] > n for k, n in _cached(first).items())  # team-a's own blocks
    assert cost_again["cached_tokens"] == sum(_cached(again).values())
    jobs = [job for tenant in ("team-a", "team-b") for job in (server.store_dir / "tenants" / tenant / "jobs").iterdir()]
    assert len(jobs) == 3 and not any((job / "cache.json").exists() for job in jobs)


def test_a_result_cache_the_server_cannot_open_is_refused(tmp_path: Path, serve_env: dict[str, str]) -> None:
    (tmp_path / "file").write_text("")
    for url in ("ftp://host/cache", str(tmp_path / "file")):
        refused = subprocess.run([FREIGHT, "serve", "--store", str(tmp_path / "store"), "--result-cache", url],
                                 env=serve_env, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert refused.returncode == 2 and refused.stderr.startswith("error:"), refused.stderr
