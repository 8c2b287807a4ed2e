"""Webhooks cannot be aimed inside the network: private, loopback, link-local and metadata addresses
are refused after resolution, at submit and at each send (DNS rebinding reaches nothing); redirects
are never followed; a try has one total deadline; receivers are sent to concurrently; a URL's
credential never lands in plain text in OUT.

Refusals are checked on addresses a resolver stub answers: nothing here connects anywhere but to
receivers listening on 127.0.0.1 (opted in with notify_allow)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback_server import LoopbackServer, QuietHandler
from pipeline_data import prompts_table, write_parquet
from typer.testing import CliRunner
from webhook_receiver import WebhookReceiver

from freight_cli import app
from jobs.notify import Notifier
from jobs.notify_targets import open_target, seal_target, shown_target, submit_targets
from jobs.settings import Settings, get_settings
from jobs.webhook_address import WebhookAddressError, resolve_webhook
from jobs.webhook_post import WebhookSendError, post_webhook

LOOPBACK = "127.0.0.1"


def _stub(answers: dict[str, list[str]]):  # noqa: ANN202
    """A resolver that answers from `answers` and records what it was asked (never touches DNS)."""
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return answers[host]

    resolve.asked = asked  # type: ignore[attr-defined]
    return resolve


@pytest.mark.parametrize(
    "address",
    ["169.254.169.254", "10.1.2.3", "192.168.1.10", "172.16.0.5", "127.0.0.1", "0.0.0.0", "100.64.0.1",
     "::1", "fe80::1", "fd00:ec2::254", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "64:ff9b::a01:203",
     "224.0.0.1"],
)  # fmt: skip
def test_every_non_public_address_a_host_resolves_to_is_refused(address: str) -> None:
    resolver = _stub({"hooks.example.com": [address]})
    with pytest.raises(WebhookAddressError) as err:
        resolve_webhook("https://hooks.example.com/x", (), resolver)
    message = str(err.value)
    assert f"hooks.example.com resolves to {address}" in message and "FREIGHT_NOTIFY_ALLOW" in message
    assert "\n" not in message


def test_one_private_answer_among_public_ones_refuses_and_the_allow_list_opts_in() -> None:
    both = _stub({"hooks.example.com": ["93.184.216.34", "10.0.0.7"]})
    with pytest.raises(WebhookAddressError, match="10.0.0.7, a private address"):
        resolve_webhook("http://hooks.example.com/", (), both)
    allow = Settings(notify_allow="10.0.0.0/8").notify_allow_networks
    assert resolve_webhook("http://hooks.example.com/", allow, both).address == "93.184.216.34"
    public = _stub({"hooks.example.com": ["93.184.216.34"]})
    dest = resolve_webhook("https://hooks.example.com:8443/p?q=1", (), public)
    assert (dest.host, dest.port, dest.address) == ("hooks.example.com", 8443, "93.184.216.34")
    with pytest.raises(WebhookAddressError, match="does not resolve"):
        resolve_webhook("http://nowhere.example/", (), public)


def test_submit_refuses_an_internal_webhook_and_writes_nothing(
    tmp_path: Path, demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FREIGHT_NOTIFY_ALLOW", "")
    get_settings.cache_clear()
    data = write_parquet(prompts_table(4), tmp_path / "in.parquet")
    for target in ("http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:6379/", "http://[::1]:80/",
                   "http://10.0.0.8/hook"):  # fmt: skip
        out = tmp_path / "out"
        result = CliRunner().invoke(app, ["run", str(data), "--model", str(demo_model_dir), "--output", str(out),
                                          "--notify", target])  # fmt: skip
        assert result.exit_code == 2, result.output
        assert "freight sends only to public addresses" in result.output and "Traceback" not in result.output
        assert not out.exists()
    get_settings.cache_clear()


def test_a_send_checks_again_and_connects_to_the_address_it_checked() -> None:
    """Submit saw a public address; at send the name answers a private one (DNS rebinding): nothing is
    sent. And a name the system cannot resolve reaches the receiver at the address the check gave."""
    with _receiver() as rx:
        port = rx.url.split(":")[2].split("/")[0]
        url = f"http://hooks.test:{port}/hook"
        submit = _stub({"hooks.test": ["93.184.216.34"]})
        settings = Settings(notify_allow="", notify_attempts=1)
        assert submit_targets([url], settings, submit) == (url,)
        rebound = _stub({"hooks.test": ["10.9.8.7"]})
        sender = Notifier(settings, rebound)
        sender.send(url, b"{}", "s")
        assert sender.drain(5.0) and rebound.asked == ["hooks.test"]  # type: ignore[attr-defined]
        assert rx.posts == []
        pinned = Notifier(Settings(notify_allow=LOOPBACK), _stub({"hooks.test": [LOOPBACK]}))
        pinned.send(url, b'{"a": 1}', "s")
        (post,) = rx.wait(1)
        assert pinned.drain(5.0) and post.body == b'{"a": 1}' and post.headers["Host"] == f"hooks.test:{port}"


class _receiver:  # noqa: N801  (a context manager over WebhookReceiver)
    def __enter__(self) -> WebhookReceiver:
        self.rx = WebhookReceiver()
        return self.rx

    def __exit__(self, *exc: object) -> None:
        self.rx.close()


class _Redirecting(LoopbackServer):
    """Answers every POST with a 302 to `location`."""

    def __init__(self, location: str) -> None:
        self.hits = 0
        outer = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.hits += 1
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST  # noqa: N815

        super().__init__(Handler, "/hook")


def test_a_redirect_is_a_failed_try_never_followed(tmp_path: Path) -> None:
    with _receiver() as target:
        redirecting = _Redirecting(target.url)
        try:
            with pytest.raises(WebhookSendError, match="302, a redirect: redirects are not followed"):
                post_webhook(redirecting.url, b"{}", {}, 5.0, Settings(notify_allow=LOOPBACK).notify_allow_networks)
            delivered: list[int] = []
            sender = Notifier(Settings(notify_allow=LOOPBACK, notify_attempts=2, notify_backoff_s=0.01))
            sender.send(redirecting.url, b"{}", "s", on_delivered=lambda: delivered.append(1))
            assert sender.drain(5.0)
            assert redirecting.hits == 3 and target.posts == [] and delivered == []  # never recorded as done
        finally:
            redirecting.close()


@pytest.fixture
def trickler() -> Iterator[str]:
    """A receiver that answers one byte of its status line every 0.3 s, for ever (until closed)."""
    server = socket.socket()
    server.bind((LOOPBACK, 0))
    server.listen(8)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    def trickle(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
                if stop.wait(0.3):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://{LOOPBACK}:{server.getsockname()[1]}/hook"
    stop.set()
    server.close()


def test_a_trickling_receiver_is_cut_at_the_deadline_and_delays_no_other(trickler: str) -> None:
    settings = Settings(notify_allow=LOOPBACK, notify_timeout_s=1.5, notify_attempts=1)
    with _receiver() as fast:
        sender = Notifier(settings)
        t0 = time.monotonic()
        for _ in range(3):
            sender.send(trickler, b"{}", "s")  # three slow receivers first, then the fast one
        sender.send(fast.url, b'{"fast": 1}', "s")
        assert len(fast.wait(1, timeout=1.0)) == 1
        assert time.monotonic() - t0 < 1.0  # the fast one went out while the slow ones trickled
        assert sender.drain(5.0)  # each slow try ended at its 1.5 s deadline, not at a per-read timeout
        assert time.monotonic() - t0 < 3.0
    with pytest.raises(WebhookSendError, match=r"no answer within 0.5 s"):
        post_webhook(trickler, b"{}", {}, 0.5, settings.notify_allow_networks)


def test_a_url_with_a_credential_is_sealed_in_every_record(
    tmp_path: Path, demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FREIGHT_WEBHOOK_SECRET", "s3cret")
    get_settings.cache_clear()
    with _receiver() as rx:
        hostport = rx.url.split("//")[1].split("/")[0]
        url = f"http://hook-user:hunter2@{hostport}/hook?token=tok-123&x=1"
        data = write_parquet(prompts_table(4), tmp_path / "in.parquet")
        out = tmp_path / "out"
        result = CliRunner().invoke(app, ["run", str(data), "--model", str(demo_model_dir), "--output", str(out),
                                          "--max-tokens", "2", "--notify", url])  # fmt: skip
        assert result.exit_code == 0, result.output
        (post,) = rx.wait(1)
        assert json.loads(post.body)["state"] == "succeeded"
        assert post.headers["Authorization"].startswith("Basic ")  # the URL's user:pass, as sent
        for path in [out / "lifecycle.json", *(out / "notify").rglob("*.json")]:
            text = path.read_text()
            assert "hunter2" not in text and "tok-123" not in text, path
        stored = json.loads((out / "lifecycle.json").read_text())["notify"][0]
        assert shown_target(stored) == f"http://hook-user:***@{hostport}/hook?token=***&x=1"
        assert open_target(stored, "s3cret") == url
        with pytest.raises(ValueError, match="sealed with another FREIGHT_WEBHOOK_SECRET"):
            open_target(stored, "other")
    get_settings.cache_clear()
    with pytest.raises(ValueError, match="carries a credential: set FREIGHT_WEBHOOK_SECRET"):
        seal_target("https://h.example/x?token=t", None)
    assert seal_target("https://h.example/x", None) == "https://h.example/x"
