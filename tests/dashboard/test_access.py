"""Who sees what: sign-in with an API key into a signed session cookie, tenant isolation by listing,
URL and download, CSRF on every posted form, the open mode of a store without keys (loopback only),
and the security headers. In process (Starlette's TestClient), over planted jobs."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from freight_cli import app as cli
from jobs.api.keys import create_key, list_keys, revoke_key
from jobs.dashboard.access import SESSION_COOKIE, loopback_host
from jobs.dashboard.app import DashboardConfig, create_dashboard
from jobs.dashboard.csrf import CSRF_COOKIE
from jobs.settings import get_settings
from jobs.storage import LocalStore
from tests.dashboard.planted import commit, plant_job


def _client(root: Path, *, loopback: bool = True, https: bool = False) -> TestClient:
    app = create_dashboard(LocalStore(root), get_settings(), DashboardConfig(loopback=loopback, refresh_s=0.05,
                                                                              scan_s=0.05))  # fmt: skip
    return TestClient(app, base_url="https://testserver" if https else "http://testserver", follow_redirects=False)


def _csrf(client: TestClient, path: str = "/signin") -> str:
    page = client.get(path)
    return re.search(r'name="csrf_token" value="([^"]+)"', page.text)[1]  # type: ignore[index]


def _sign_in(client: TestClient, key: str) -> None:
    response = client.post("/signin", data={"key": key, "next": "/", "csrf_token": _csrf(client)})
    assert response.status_code == 303 and response.headers["location"] == "/", response.text


@pytest.fixture
def tenants(tmp_path: Path) -> tuple[Path, str, str, str]:
    """A store with one job of team-a (a served batch's OUT) and keys of team-a and team-b."""
    root = tmp_path / "store"
    store, manifest = plant_job(str(root / "tenants" / "team-a" / "jobs" / "batch_0000000000000000000000000001"),
                                shards=2)  # fmt: skip
    commit(store, manifest, [0])
    store_root = LocalStore(root)
    return root, create_key(store_root, "team-a")[0], create_key(store_root, "team-b")[0], manifest.job_id


def test_a_tenant_sees_its_jobs_and_another_tenant_none_by_listing_url_or_download(tenants) -> None:  # type: ignore[no-untyped-def]
    root, key_a, key_b, job_id = tenants
    a, b = _client(root), _client(root)
    assert a.get("/").status_code == 303 and a.get("/").headers["location"] == "/signin?next=%2F"
    assert a.get("/ui/jobs.json").status_code == 401
    _sign_in(a, key_a)
    _sign_in(b, key_b)
    assert [j["job_id"] for j in a.get("/ui/jobs.json").json()["jobs"]] == [job_id]
    assert a.get(f"/jobs/{job_id}").status_code == 200
    assert a.get(f"/jobs/{job_id}/results.parquet").status_code == 200
    listed = b.get("/ui/jobs.json").json()
    assert listed["total"] == 0 and listed["jobs"] == []
    for path in (f"/jobs/{job_id}", f"/ui/jobs/{job_id}.json", f"/jobs/{job_id}/results.parquet",
                 f"/jobs/{job_id}/output.jsonl", f"/jobs/{job_id}/errors.jsonl"):  # fmt: skip
        assert b.get(path).status_code == 404, path
    assert job_id not in b.get("/").text
    # a tenant filter in the query cannot widen what a signed-in tenant sees
    assert b.get("/ui/jobs.json?tenant=team-a").json()["jobs"] == []


def test_the_session_cookie_is_httponly_samesite_signed_and_secure_behind_tls(tenants) -> None:  # type: ignore[no-untyped-def]
    root, key_a, _, _ = tenants
    client = _client(root, https=True)
    response = client.post("/signin", data={"key": key_a, "next": "/", "csrf_token": _csrf(client)})
    cookie = next(h for h in response.headers.get_list("set-cookie") if h.startswith(SESSION_COOKIE))
    assert "HttpOnly" in cookie and "Secure" in cookie and "SameSite=lax" in cookie
    assert key_a not in cookie
    plain = _client(root)
    cookie = next(h for h in plain.post("/signin", data={"key": key_a, "next": "/", "csrf_token": _csrf(plain)})
                  .headers.get_list("set-cookie") if h.startswith(SESSION_COOKIE))  # fmt: skip
    assert "Secure" not in cookie  # plain http on loopback: a Secure cookie would never come back
    # a forged or tampered session is no session
    value = client.cookies[SESSION_COOKIE]
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, value[:-2] + ("AA" if not value.endswith("AA") else "BB"))
    assert client.get("/ui/jobs.json").status_code == 401


def test_a_revoked_key_ends_its_sessions(tenants) -> None:  # type: ignore[no-untyped-def]
    root, key_a, _, _ = tenants
    client = _client(root)
    _sign_in(client, key_a)
    assert client.get("/ui/jobs.json").status_code == 200
    (record,) = list_keys(LocalStore(root), "team-a")
    revoke_key(LocalStore(root), record.key_id)
    time.sleep(0.6)  # the key cache keeps an answer at most key_cache_s (0.5 s)
    assert client.get("/ui/jobs.json").status_code == 401


def test_every_posted_form_needs_its_csrf_token(tenants) -> None:  # type: ignore[no-untyped-def]
    root, key_a, _, _ = tenants
    client = _client(root)
    token = _csrf(client)
    refused = [
        client.post("/signin", data={"key": key_a, "next": "/"}),  # no token
        client.post("/signin", data={"key": key_a, "next": "/", "csrf_token": token + "x"}),  # not ours
        client.post("/signin", data={"key": key_a, "next": "/", "csrf_token": token},
                    headers={"origin": "https://evil.example"}),  # another site's form  # fmt: skip
    ]
    other = _client(root)
    other_token = _csrf(other)
    refused.append(client.post("/signin", data={"key": key_a, "next": "/", "csrf_token": other_token}))  # another browser's
    for response in refused:
        assert response.status_code == 403 and SESSION_COOKIE not in response.headers.get("set-cookie", "")
    _sign_in(client, key_a)
    assert client.post("/signout", data={}).status_code == 403
    assert client.get("/ui/jobs.json").status_code == 200  # still signed in
    response = client.post("/signout", data={"csrf_token": _csrf(client, "/")})
    assert response.status_code == 303 and client.get("/ui/jobs.json").status_code == 401
    # a sign-in never sends the browser off the site
    response = client.post("/signin", data={"key": key_a, "next": "//evil.example/x", "csrf_token": _csrf(client)})
    assert response.headers["location"] == "/"
    # and a wrong key says so, setting nothing
    response = client.post("/signin", data={"key": "fk-wrong", "next": "/", "csrf_token": _csrf(client)})
    assert response.status_code == 401 and "not a valid API key" in response.text
    assert CSRF_COOKIE in client.cookies


def test_a_store_without_keys_is_open_on_loopback_only(tmp_path: Path) -> None:
    root = tmp_path / "store"
    plant_job(str(root / "runs" / "a"), shards=1)
    page = _client(root).get("/")
    assert page.status_code == 200 and "listens on 127.0.0.1 only" in " ".join(page.text.split())
    refused = _client(root, loopback=False).get("/")
    assert refused.status_code == 403 and "served only on 127.0.0.1" in " ".join(refused.text.split())
    assert _client(root, loopback=False).get("/ui/jobs.json").status_code == 403
    # the command refuses to listen beyond loopback without keys, and says why
    result = CliRunner().invoke(cli, ["dashboard", "--store", str(root), "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "no API keys" in result.output
    assert loopback_host("127.0.0.1") and loopback_host("::1") and loopback_host("localhost")
    assert not loopback_host("0.0.0.0") and not loopback_host("10.1.2.3") and not loopback_host("dash.example")


def test_the_all_tenants_view_shows_every_job_on_loopback_only(tenants) -> None:  # type: ignore[no-untyped-def]
    root, key_a, _, job_id = tenants
    _, local = plant_job(str(root / "nightly" / "run-1"), shards=1)  # a `freight run` OUT, outside tenants/
    tenant_a = _client(root)
    _sign_in(tenant_a, key_a)
    assert [j["job_id"] for j in tenant_a.get("/ui/jobs.json").json()["jobs"]] == [job_id]  # never the local run
    assert tenant_a.get(f"/jobs/{local.job_id}").status_code == 404
    app = create_dashboard(LocalStore(root), get_settings(), DashboardConfig(loopback=True, all_tenants=True))
    operator = TestClient(app, follow_redirects=False)  # no sign-in, though the store has keys
    listed = {j["job_id"]: j["tenant"] for j in operator.get("/ui/jobs.json").json()["jobs"]}
    assert listed == {job_id: "team-a", local.job_id: None}
    page = operator.get("/")
    assert page.status_code == 200 and 'id="all-tenants"' in page.text and "<th>Tenant</th>" in page.text
    assert operator.get(f"/jobs/{local.job_id}").status_code == 200
    assert operator.get(f"/jobs/{job_id}").status_code == 200
    with pytest.raises(ValueError, match="loopback"):
        DashboardConfig(loopback=False, all_tenants=True)
    result = CliRunner().invoke(cli, ["dashboard", "--store", str(root), "--host", "0.0.0.0", "--all-tenants"])
    assert result.exit_code == 2 and "loopback address only" in result.output


def test_every_answer_carries_the_security_headers(tenants) -> None:  # type: ignore[no-untyped-def]
    root, key_a, _, job_id = tenants
    client = _client(root)
    _sign_in(client, key_a)
    for path in ("/", "/signin", f"/jobs/{job_id}", "/evals", "/fleet", "/ui/jobs.json", "/static/dashboard.css",
                 "/nowhere"):  # fmt: skip
        response = client.get(path)
        policy = response.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert re.fullmatch(r"app;dur=\d+\.\d\d", response.headers["server-timing"]), path  # its own time, ms
    assert client.get("/nowhere").status_code == 404
