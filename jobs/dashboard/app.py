"""The dashboard's ASGI app: its pages, the JSON they poll, downloads, sign-in, static files.

`create_dashboard(store, settings, config)` is all a server needs: `freight serve` mounts it at `/`
beside the API, `freight dashboard` serves it alone. It only reads the store and Redis: the one
thing it writes is a browser's cookies.

Pages (server-rendered, Jinja2): `/` jobs, `/jobs/<ref>` one job, `/evals`, `/fleet`, `/signin`.
The JSON the pages poll: `/ui/jobs.json`, `/ui/jobs/<ref>.json`. Downloads: `/jobs/<ref>/results.parquet`,
`/jobs/<ref>/output.jsonl`, `/jobs/<ref>/errors.jsonl`.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from starlette.exceptions import HTTPException as StarletteHTTPException

from jobs.api.auth import Authenticator
from jobs.api.layout import file_content
from jobs.dashboard import downloads, formatting
from jobs.dashboard.access import Access, LocalOnly, SignInRequired, Viewer, make_secret
from jobs.dashboard.board import LOCAL_TENANT, STATES, JobBoard, JobSummary
from jobs.dashboard.csrf import CSRF_FIELD, Csrf, CsrfError
from jobs.dashboard.eval_trends import eval_trends
from jobs.dashboard.fleet_view import fleet
from jobs.dashboard.headers import AnswerHeaders
from jobs.dashboard.job_view import STATE_NAMES, job_detail
from jobs.errors import ObjectNotFoundError
from jobs.live_state import LiveState
from jobs.log import get_logger
from jobs.settings import Settings
from jobs.storage import ObjectStore

log = get_logger(__name__)

HERE = Path(__file__).parent
DETAILS_KEPT = 64  # job pages whose data is shared between the clients polling them
LISTS_KEPT = 1024  # encoded job lists (viewer and filters) kept per snapshot
NO_STORE = {"cache-control": "no-store"}


@dataclass(frozen=True)
class DashboardConfig:
    """loopback: the server listens on a loopback address only (a store without API keys is shown
    only then). all_tenants: the operator's view (`freight dashboard --all-tenants`): every job under
    the store, every tenant's and those outside tenants/, with no sign-in even when the store has
    keys; loopback only, for whoever may read the store itself. refresh_s: the oldest data a poll
    may get; scan_s: how often the whole store is listed for new jobs; poll_ms: how often the pages
    ask for news."""

    loopback: bool
    refresh_s: float = 1.0
    scan_s: float = 5.0
    poll_ms: int = 1000
    key_cache_s: float = 0.5
    all_tenants: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.refresh_s <= 60 or not 0 < self.scan_s <= 3600 or not 100 <= self.poll_ms <= 2000:
            raise ValueError("refresh_s in (0, 60], scan_s in (0, 3600] and poll_ms in [100, 2000] (updates <= 2 s)")
        if self.all_tenants and not self.loopback:
            raise ValueError("the all-tenants view shows every tenant's jobs without a sign-in: it listens on a "
                             "loopback address only")  # fmt: skip


@dataclass(frozen=True)
class DetailParts:
    """A job page's data (job_view.job_detail), its JSON (/ui/jobs/<ref>.json), and the two parts of
    the page that grow with the job: the shard grid's cells and the data block the page's script
    reads, made once so a page of a 10,000-shard job renders no loop over its shards."""

    data: dict[str, Any]
    json: bytes
    grid_html: Markup  # one <i class="g-X"> per shard; X is one of job_view's state letters
    data_html: Markup  # the JSON, safe inside <script> (as Jinja's tojson escapes it)

    @classmethod
    def of(cls, data: dict[str, Any]) -> DetailParts:
        encoded = json.dumps(data, separators=(",", ":"), allow_nan=False)
        cells = {c: f'<i class="g-{c}"></i>' for c in STATE_NAMES}
        grid = "".join(cells[c] for c in data.get("grid") or "")
        safe = encoded.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("'", "\\u0027")
        return cls(data, encoded.encode(), Markup(grid), Markup(safe))


class Dashboard:
    """The state one dashboard app holds: the board, access, CSRF, Redis, templates."""

    def __init__(self, store: ObjectStore, settings: Settings, config: DashboardConfig, redis_url: str | None) -> None:
        self.store, self.settings, self.config = store, settings, config
        self.live = LiveState(redis_url, socket_timeout=2.0, retry_for_s=0) if redis_url else None
        self.board = JobBoard(store, settings, self.live, refresh_s=config.refresh_s, scan_s=config.scan_s)
        secret = make_secret(settings)
        self.access = Access(store, Authenticator(store, config.key_cache_s), secret, loopback=config.loopback,
                             all_tenants=config.all_tenants)  # fmt: skip
        self.csrf = Csrf(secret)
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                                 undefined=jinja2.StrictUndefined)  # fmt: skip
        formatting.install(env)
        self.templates = Jinja2Templates(env=env)
        self._details: OrderedDict[str, tuple[float, DetailParts]] = OrderedDict()
        self._lists: dict[tuple[str | None, str, str, str], bytes] = {}
        self._lists_at = 0.0
        self._lock = threading.Lock()

    def detail(self, job: JobSummary) -> DetailParts:
        """The job page's data, its JSON and the page's parts made from them, built once per board
        snapshot however many clients poll it or open the page."""
        snapshot_at = self.board.snapshot().at
        with self._lock:
            hit = self._details.get(job.ref)
            if hit is not None and hit[0] == snapshot_at:
                return hit[1]
        built = DetailParts.of(job_detail(self.board, job))
        with self._lock:
            self._details[job.ref] = (snapshot_at, built)
            self._details.move_to_end(job.ref)
            while len(self._details) > DETAILS_KEPT:
                self._details.popitem(last=False)
        return built

    def jobs_json(self, tenant: str | None, state: str, model: str, tenant_filter: str) -> bytes:
        """/ui/jobs.json's body for this viewer and these filters, encoded once per snapshot."""
        snapshot = self.board.snapshot()
        key = (tenant, state, model, tenant_filter)
        with self._lock:
            if self._lists_at != snapshot.at:
                self._lists, self._lists_at = {}, snapshot.at
            hit = self._lists.get(key)
        if hit is not None:
            return hit
        visible = snapshot.visible(tenant)
        jobs = _filtered(visible, state, model, tenant_filter)
        body = json.dumps({"at": snapshot.at, "total": len(visible), "jobs": [j.as_dict() for j in jobs]},
                          separators=(",", ":"), allow_nan=False).encode()  # fmt: skip
        with self._lock:
            if self._lists_at == snapshot.at and len(self._lists) < LISTS_KEPT:
                self._lists[key] = body
        return body

    def page(self, request: Request, name: str, viewer: Viewer, status: int = 200, **context: Any) -> HTMLResponse:
        response = HTMLResponse("")
        csrf = self.csrf.token(request, response)
        rendered = self.templates.get_template(name).render(
            request=request, viewer=viewer, csrf_field=CSRF_FIELD, csrf_token=csrf, fleet=self.live is not None,
            poll_ms=self.config.poll_ms, open_mode=self.config.loopback and not self.access.keys_exist(),
            all_tenants=self.config.all_tenants, **context,
        )  # fmt: skip
        out = HTMLResponse(rendered, status_code=status)
        for key, value in response.headers.items():
            if key == "set-cookie":
                out.headers.append(key, value)
        return out


def create_dashboard(
    store: ObjectStore, settings: Settings, config: DashboardConfig, *, redis_url: str | None = None
) -> FastAPI:
    """The dashboard over `store` (and, with `redis_url`, the fleet of that Redis)."""
    app = FastAPI(title="freight dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    dash = Dashboard(store, settings, config, redis_url)
    app.state.dashboard = dash
    app.add_middleware(AnswerHeaders)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    _install_handlers(app, dash)

    def viewer(request: Request) -> Viewer:
        return dash.access.viewer(request)

    def visible_job(request: Request, ref: str) -> tuple[Viewer, JobSummary]:
        who = viewer(request)
        job = dash.board.snapshot().find(ref, who.tenant)
        if job is None:  # another tenant's job answers as no job at all
            raise StarletteHTTPException(404, f"no job {ref!r} here")
        return who, job

    @app.get("/", response_class=HTMLResponse)
    def jobs_page(request: Request, state: str = "", model: str = "", tenant: str = "") -> Response:
        who = viewer(request)
        jobs = dash.board.snapshot().visible(who.tenant)
        shown = _filtered(jobs, state, model, tenant)
        query = urlencode({k: v for k, v in (("state", state), ("model", model), ("tenant", tenant)) if v})
        return dash.page(
            request, "jobs.html", who, jobs=shown, total=len(jobs), states=STATES,
            models=sorted({j.model for j in jobs}), tenants=sorted({j.tenant or LOCAL_TENANT for j in jobs}),
            chosen={"state": state, "model": model, "tenant": tenant}, poll_url=f"/ui/jobs.json?{query}",
        )  # fmt: skip

    @app.get("/ui/jobs.json")
    def jobs_json(request: Request, state: str = "", model: str = "", tenant: str = "") -> Response:
        who = viewer(request)
        return Response(dash.jobs_json(who.tenant, state, model, tenant), media_type="application/json",
                        headers=NO_STORE)  # fmt: skip

    @app.get("/jobs/{ref}", response_class=HTMLResponse)
    def job_page(request: Request, ref: str) -> Response:
        who, job = visible_job(request, ref)
        parts = dash.detail(job)
        return dash.page(request, "job.html", who, job=job, detail=parts.data, grid_html=parts.grid_html,
                         data_html=parts.data_html, state_names=STATE_NAMES,
                         downloads=_downloads(dash, job), poll_url=f"/ui/jobs/{quote(job.ref)}.json")  # fmt: skip

    @app.get("/ui/jobs/{ref}.json")
    def job_json(request: Request, ref: str) -> Response:
        _, job = visible_job(request, ref)
        return Response(dash.detail(job).json, media_type="application/json", headers=NO_STORE)

    @app.get("/jobs/{ref}/results.parquet")
    def results_parquet(request: Request, ref: str) -> Response:
        _, job = visible_job(request, ref)
        out = dash.board.snapshot().listing.outs.get(job.out)
        if out is None or not out.committed:
            raise StarletteHTTPException(404, f"job {ref!r} has no committed results yet")
        return _attachment(downloads.parquet_results(dash.board.reader(out)), f"{job.ref}.parquet",
                           "application/vnd.apache.parquet")  # fmt: skip

    @app.get("/jobs/{ref}/{which}.jsonl")
    def openai_file(request: Request, ref: str, which: str) -> Response:
        _, job = visible_job(request, ref)
        if which not in ("output", "errors"):
            raise StarletteHTTPException(404, f"no {which}.jsonl: output.jsonl or errors.jsonl")
        stored = _batch_file(dash, job, which)
        if stored is not None:
            return _attachment(downloads.stored_file(store, stored), f"{job.ref}.{which}.jsonl", "application/jsonl")
        out = dash.board.snapshot().listing.outs.get(job.out)
        if out is None or job.kind == "likelihood":
            raise StarletteHTTPException(404, f"job {ref!r} has no OpenAI Batch {which} file")
        return _attachment(downloads.openai_file(dash.board.reader(out), which), f"{job.ref}.{which}.jsonl",
                           "application/jsonl")  # fmt: skip

    @app.get("/evals", response_class=HTMLResponse)
    def evals_page(request: Request) -> Response:
        who = viewer(request)
        listing = dash.board.snapshot().listing
        trends = eval_trends(store, dash.board.cache, listing.eval_records, who.tenant)
        return dash.page(request, "evals.html", who, trends=trends)

    @app.get("/fleet", response_class=HTMLResponse)
    def fleet_page(request: Request) -> Response:
        who = viewer(request)
        if dash.live is None:
            return dash.page(request, "fleet.html", who, data=None)
        visible = None if who.tenant is None else {j.job_id for j in dash.board.snapshot().visible(who.tenant)}
        return dash.page(request, "fleet.html", who, data=fleet(dash.live, visible))

    @app.get("/signin", response_class=HTMLResponse)
    def signin_page(request: Request, next: str = "/") -> Response:
        return dash.page(request, "signin.html", Viewer(None, signed_in=False), next=_local(next), error=None,
                         keys=dash.access.keys_exist())  # fmt: skip

    @app.post("/signin")
    def signin(request: Request, key: str = Form(""), next: str = Form("/"), csrf_token: str = Form("")) -> Response:
        dash.csrf.check(request, csrf_token)
        response = RedirectResponse(_local(next), status_code=303)
        if not key.strip() or dash.access.sign_in(key, request, response) is None:
            return dash.page(request, "signin.html", Viewer(None, signed_in=False), status=401, next=_local(next),
                             error="That key is not a valid API key of this store (or it was revoked).",
                             keys=dash.access.keys_exist())  # fmt: skip
        return response

    @app.post("/signout")
    def signout(request: Request, csrf_token: str = Form("")) -> Response:
        dash.csrf.check(request, csrf_token)
        response = RedirectResponse("/signin", status_code=303)
        dash.access.sign_out(request, response)
        return response

    return app


def _filtered(jobs: list[JobSummary], state: str, model: str, tenant: str) -> list[JobSummary]:
    """The jobs in `state`, of `model`, of `tenant` (LOCAL_TENANT: outside tenants/); "" = any."""
    return [
        j for j in jobs
        if (not state or j.state == state) and (not model or j.model == model)
        and (not tenant or (j.tenant or LOCAL_TENANT) == tenant)
    ]  # fmt: skip


def _local(target: str) -> str:
    """`target` when it is a path of this site, else "/": a sign-in never redirects elsewhere."""
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/"


def _downloads(dash: Dashboard, job: JobSummary) -> list[dict[str, str]]:
    ref = quote(job.ref)
    out = dash.board.snapshot().listing.outs.get(job.out)
    links = []
    if out is not None and out.committed:
        links.append({"label": "Results (Parquet)", "href": f"/jobs/{ref}/results.parquet"})
    if job.kind != "likelihood" and (_batch_file(dash, job, "output") or (out is not None and out.committed)):
        links.append({"label": "OpenAI output file", "href": f"/jobs/{ref}/output.jsonl"})
        links.append({"label": "OpenAI error file", "href": f"/jobs/{ref}/errors.jsonl"})
    return links


def _batch_file(dash: Dashboard, job: JobSummary, which: str) -> str | None:
    """The key of a served batch's own output or error file, once it has one."""
    if job.batch_id is None or job.tenant is None:
        return None
    record = dash.board.batch(job.tenant, job.batch_id)
    file_id = None if record is None else record.output_file_id if which == "output" else record.error_file_id
    return file_content(job.tenant, file_id) if file_id else None


def _attachment(body: Any, name: str, media_type: str) -> StreamingResponse:
    return StreamingResponse(body, media_type=media_type,
                             headers={"content-disposition": f'attachment; filename="{name}"'})  # fmt: skip


def _install_handlers(app: FastAPI, dash: Dashboard) -> None:
    def wants_json(request: Request) -> bool:
        return request.url.path.startswith("/ui/")

    @app.exception_handler(SignInRequired)
    async def _signin(request: Request, exc: SignInRequired) -> Response:
        if wants_json(request):
            return JSONResponse({"error": "sign in with an API key at /signin"}, status_code=401)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/signin?{urlencode({'next': target})}", status_code=303)

    @app.exception_handler(LocalOnly)
    async def _local_only(request: Request, exc: LocalOnly) -> Response:
        message = ("This store has no API keys, so the dashboard would show every job to anyone: it is served "
                   "only on 127.0.0.1. Create a key (`freight keys create --tenant NAME --store STORE`) to sign "
                   "in from elsewhere, or serve on 127.0.0.1.")  # fmt: skip
        return _error(dash, request, 403, "Local only", message)

    @app.exception_handler(CsrfError)
    async def _csrf(request: Request, exc: CsrfError) -> Response:
        log.warning("dashboard_csrf_refused", path=request.url.path, reason=str(exc))
        return _error(dash, request, 403, "Form refused", "The form was not sent from this dashboard's page "
                      f"({exc}). Reload the page and send it again.")  # fmt: skip

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if wants_json(request):
            return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)
        title = "Not found" if exc.status_code == 404 else f"Error {exc.status_code}"
        return _error(dash, request, exc.status_code, title, str(exc.detail))

    @app.exception_handler(ObjectNotFoundError)
    async def _gone(request: Request, exc: ObjectNotFoundError) -> Response:
        return _error(dash, request, 404, "Gone", f"{exc} (deleted while the page was built?)")


def _error(dash: Dashboard, request: Request, status: int, title: str, message: str) -> Response:
    if request.url.path.startswith("/ui/"):
        return JSONResponse({"error": message}, status_code=status)
    return dash.page(request, "error.html", Viewer(None, signed_in=False), status=status, title=title, message=message)
