"""The OpenAI endpoints a request can name: their urls, the short names the worker uses, and the
endpoint of rows written before results carried one."""

from __future__ import annotations

from typing import Literal

from jobs.manifest import InputPlan

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
RESPONSES_URL = "/v1/responses"
ENDPOINT_URLS = (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, RESPONSES_URL)

Endpoint = Literal["chat", "completions", "embeddings", "responses"]
ENDPOINT_OF_URL: dict[str, Endpoint] = {
    CHAT_URL: "chat", COMPLETIONS_URL: "completions", EMBEDDINGS_URL: "embeddings", RESPONSES_URL: "responses",
}  # fmt: skip
URL_OF_ENDPOINT: dict[str, str] = {endpoint: url for url, endpoint in ENDPOINT_OF_URL.items()}


def default_endpoint(plan: InputPlan) -> str:
    """The url of rows written before the `endpoint` column (partial files, result shards of jobs
    planned before it): chat for a messages prompt column, else completions (such JSONL jobs held
    one prompt kind per file)."""
    return CHAT_URL if plan.prompt_kind == "messages" else COMPLETIONS_URL
