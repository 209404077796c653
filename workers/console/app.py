"""The console's routes: pages, their live regions, and the state changes behind login, role and CSRF.

Pages are rendered on the server (Jinja2, autoescaped); ``static/console.js`` polls each page's
live region (``/<page>/live``) every few seconds and sends the action forms with ``fetch`` and
the ``X-CSRF-Token`` header. Without JavaScript the forms post as usual and come back to the page.
Every state change, allowed or refused, is one line of the audit trail with the console user.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

import redis
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from connectors.rates import parse_rate
from workers.console.security import (
    CSRF_FIELD,
    CSRF_HEADER,
    csrf_ok,
    csrf_token,
    same_origin,
)
from workers.console.users import Role, User, UsersFile, check_login
from workers.console.views import (
    MAX_REASON_CHARS,
    NAME,
    OPAQUE_ID,
    RUN_ID,
    RUN_STATES,
    Fleet,
    SearchBusy,
    pretty_params,
)
from workers.ops.workflow_commands import RunNotFound
from workers.settings import Settings
from workers.workflows.machine import NotAllowed

log = logging.getLogger("reach.console")

MAX_FORM_BYTES = 16 * 1024
PAYLOAD_HASH = re.compile(r"^[0-9a-f]{64}$")  # the SHA-256 (hex) of the payload the approver was shown
SESSION_COOKIE = "reach_console"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def create_app(settings: Settings, fleet: Fleet, users: UsersFile) -> Starlette:
    """The console as an ASGI app over ``fleet``, for the people in ``users``."""
    env = Environment(loader=PackageLoader("workers.console", "templates"), autoescape=select_autoescape(default=True))
    env.filters["params"] = pretty_params
    templates = Jinja2Templates(env=env)
    rate = parse_rate(settings.console_login_rate)
    limiter = fleet.login_limiter(rate.count, rate.period_ms / 1000)
    key = settings.console_session_key.get_secret_value() if settings.console_session_key else secrets.token_hex(32)
    sessions = fleet.sessions(key)
    ttl = settings.console_session_ttl_seconds

    def removed(names: set[str], at: float) -> None:
        for name in names:  # ended for good: the same name added again does not get them back
            try:
                sessions.end_all(name, at, ttl)
            except redis.RedisError as exc:  # they stay refused while the user is not in the file
                log.warning("console: sessions of the removed user %r not ended in Redis: %s", name, exc)

    users.on_removed = removed

    def current_user(request: Request) -> User | None:
        name, session_id = request.session.get("user"), request.session.get("sid")
        started, credential = request.session.get("at", 0), request.session.get("cred")
        if not isinstance(name, str) or not isinstance(session_id, str) or not isinstance(started, (int, float)):
            return None
        if time.time() - started > ttl:
            return None
        user = users.users().get(name)  # a user removed from the file is logged out at once
        if user is None or credential != sessions.fingerprint(user.name, user.password_hash):
            return None  # a changed password (or a user added again) ends the sessions of the old one
        try:
            if not sessions.stands(session_id, name, started):  # logged out, here or everywhere
                return None
        except redis.RedisError as exc:
            log.warning("console: cannot tell whether session %s was logged out (%s); refusing it", session_id, exc)
            return None
        return user

    def render(request: Request, template: str, user: User | None, **context: Any) -> Response:
        context.update(
            user=user,
            can_approve=user is not None and user.role >= Role.approver,
            can_operate=user is not None and user.role >= Role.operator,
            csrf=csrf_token(request),
            flash=request.session.pop("flash", None),
        )
        return templates.TemplateResponse(request, template, context)

    def page(template: str, live: str | None = None) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            user = current_user(request)
            if user is None:
                return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)
            return render(request, template, user, page=template.removesuffix(".html"), live=live)

        return endpoint

    def live(template: str, load: Callable[[], Any]) -> Callable[[Request], Response]:
        """A page's live region alone, for the poll; 401 once the session has ended."""

        def endpoint(request: Request) -> Response:
            user = current_user(request)
            if user is None:
                return PlainTextResponse("log in again", status_code=401)
            return render(request, template, user, data=load())

        return endpoint

    async def form(request: Request) -> FormData:
        length = request.headers.get("content-length")
        if length is None or not length.isdigit() or int(length) > MAX_FORM_BYTES:
            raise Refused(413, f"a console form is at most {MAX_FORM_BYTES} bytes")
        return await request.form(max_files=0, max_fields=16, max_part_size=MAX_FORM_BYTES)

    async def authorize(request: Request, role: Role, action: str, target: str) -> tuple[User, FormData]:
        """The logged-in user allowed to do ``action``, and the form; Refused (audited) otherwise."""
        user = current_user(request)
        if user is None:
            raise Refused(401, "log in first")  # not audited: there is nobody to name
        try:
            data = await form(request)
            if not same_origin(request, settings.console_public_url):
                raise Refused(403, "refused: the request did not come from the console's own page")
            sent = request.headers.get(CSRF_HEADER) or _field(data, CSRF_FIELD)
            if not csrf_ok(request, sent):
                raise Refused(403, "refused: missing or wrong CSRF token (reload the page)")
            if user.role < role:
                raise Refused(403, f"refused: {action} needs the {role.name} role; {user.name} is a {user.role.name}")
        except Refused as exc:
            fleet.audited(user.name, user.role.name, action, target=target, result="refused", why=str(exc))
            raise
        return user, data

    def done(request: Request, back: str, ok: bool, message: str, status: int = 200) -> Response:
        if request.headers.get("x-requested-with") == "fetch":
            return JSONResponse({"ok": ok, "message": message}, status_code=status)
        request.session["flash"] = {"ok": ok, "message": message}
        return RedirectResponse(back, status_code=303)

    def refused(request: Request, exc: Refused) -> Response:
        if request.headers.get("x-requested-with") == "fetch" or exc.status != 403:
            return JSONResponse({"ok": False, "message": str(exc)}, status_code=exc.status)
        return PlainTextResponse(str(exc), status_code=exc.status)

    # login
    def login_page(request: Request) -> Response:
        return render(
            request, "login.html", None, page="login", live=None, next=_local(request.query_params.get("next"))
        )

    async def login(request: Request) -> Response:
        client = request.client.host if request.client else "-"
        try:
            data = await form(request)
        except Refused as exc:
            return refused(request, exc)
        name, password = _field(data, "name")[:64], _field(data, "password")
        if not same_origin(request, settings.console_public_url) or not csrf_ok(request, _field(data, CSRF_FIELD)):
            return PlainTextResponse("refused: reload the login page and try again", status_code=403)
        try:  # counted before the password is checked: concurrent guesses cannot pass the limit together
            attempt = limiter.reserve(f"user:{name}", f"addr:{client}")
        except redis.RedisError as exc:  # failed logins cannot be counted: no guessing meanwhile
            fleet.audited(name or "-", "-", "login", result="refused", why=f"Redis did not answer: {exc}")
            return PlainTextResponse("login unavailable: Redis did not answer; try again shortly", status_code=503)
        wait = attempt.retry_after
        if wait > 0:
            fleet.audited(name or "-", "-", "login", result="refused", why="too many failed logins", address=client)
            response = render(request, "login.html", None, page="login", live=None, next=_local(data.get("next")))
            response.status_code = 429
            response.headers["Retry-After"] = str(int(wait) + 1)
            return response
        user = await run_in_threadpool(check_login, users.users(), name, password)  # scrypt: ~50 ms of CPU
        if user is None:  # already counted
            fleet.audited(name or "-", "-", "login", result="failed", address=client)
            request.session["flash"] = {"ok": False, "message": "wrong name or password"}
            return RedirectResponse("/login", status_code=303)
        try:
            limiter.succeeded(f"user:{name}", attempt)
        except redis.RedisError as exc:  # its earlier failures just stay counted until they expire
            log.warning("console: failed logins of %r not cleared: %s", name, exc)
        request.session.clear()  # a fresh session, and a fresh CSRF token, for the logged-in user
        request.session.update(
            user=user.name,
            at=time.time(),
            sid=secrets.token_urlsafe(16),
            cred=sessions.fingerprint(user.name, user.password_hash),
            csrf=secrets.token_urlsafe(32),
        )
        fleet.audited(user.name, user.role.name, "login", result="ok", address=client)
        return RedirectResponse(_local(data.get("next")) or "/fleet", status_code=303)

    async def logout(request: Request) -> Response:
        try:
            user, data = await authorize(request, Role.viewer, "logout", "-")
        except Refused as exc:
            return refused(request, exc)
        left = ttl - (time.time() - request.session["at"])
        try:
            sessions.end(request.session["sid"], left)
            if _field(data, "everywhere") == "1":  # every session of this user, on every replica
                sessions.end_all(user.name, time.time(), ttl)
        except redis.RedisError as exc:
            fleet.audited(user.name, user.role.name, "logout", result="failed", why=f"Redis did not answer: {exc}")
            return JSONResponse({"ok": False, "message": f"not logged out: Redis did not answer: {exc}"}, 503)
        fleet.audited(user.name, user.role.name, "logout", result="ok")
        request.session.clear()
        return RedirectResponse("/login", status_code=303)

    # fleet
    async def pause_or_resume(request: Request) -> Response:
        connector, verb = request.path_params["connector"], request.path_params["verb"]
        try:
            user, _ = await authorize(request, Role.operator, verb, connector)
        except Refused as exc:
            return refused(request, exc)
        if verb not in ("pause", "resume") or not await run_in_threadpool(fleet.known_connector, connector):
            return done(request, "/fleet", False, f"no connector {connector!r} to {verb}", 404)
        await run_in_threadpool(fleet.set_paused, connector, verb == "pause")
        fleet.audited(user.name, user.role.name, verb, target=connector, result="ok")
        return done(request, "/fleet", True, f"{connector}: {verb}d")

    # dead letters
    async def replay(request: Request) -> Response:
        try:
            user, data = await authorize(request, Role.operator, "replay", "reach.dlq")
        except Refused as exc:
            return refused(request, exc)
        message_id = _field(data, "message_id") or None
        if message_id is not None and not OPAQUE_ID.match(message_id):
            return done(request, "/dead-letters", False, "not a message id", 400)
        try:
            replayed, kept = await run_in_threadpool(fleet.replay, message_id)
        except Exception as exc:  # kombu's connection errors, or Redis's: nothing was replayed
            return done(request, "/dead-letters", False, f"not replayed: {type(exc).__name__}: {exc}", 503)
        # the audit line says what happened: a refused replay is not "ok"
        result = "ok" if not kept else ("partial" if replayed else "refused")
        if message_id and not replayed and not kept:
            result = "not_found"
        fleet.audited(
            user.name, user.role.name, "replay", target=message_id or "all", result=result, replayed=replayed, kept=kept
        )
        message = f"replayed {len(replayed)} dead letter(s)"
        message += "".join(f"; not replayed {mid or '(no id)'}: {why}" for mid, why in kept)
        if message_id and not replayed and not kept:
            return done(request, "/dead-letters", False, f"{message_id}: not in reach.dlq", 404)
        return done(request, "/dead-letters", not kept, message)

    # approvals
    def approvals_live(request: Request) -> Response:
        """The approvals' live region: one page (``?page=N``), all agents or one (``?agent=A``)."""
        user = current_user(request)
        if user is None:
            return PlainTextResponse("log in again", status_code=401)
        query = request.query_params
        return render(request, "approvals_live.html", user, data=fleet.pending(query.get("agent"), query.get("page")))

    async def decide(request: Request) -> Response:
        approval_id, verb = request.path_params["approval_id"], request.path_params["verb"]
        try:
            user, data = await authorize(request, Role.approver, verb, approval_id)
        except Refused as exc:
            return refused(request, exc)
        if verb not in ("approve", "deny") or not OPAQUE_ID.match(approval_id):
            return done(request, "/approvals", False, "no such approval", 404)
        reason = _field(data, "reason").strip()[:MAX_REASON_CHARS] or None
        shown_hash = _field(data, "payload_hash")
        if not PAYLOAD_HASH.match(shown_hash):
            return done(
                request, "/approvals", False, "the form did not say which payload was shown; reload the page", 400
            )
        try:
            pending = await run_in_threadpool(fleet.get_approval, approval_id)
            decision = await run_in_threadpool(
                fleet.decide, approval_id, verb == "approve", user.name, reason, shown_hash
            )
        except redis.RedisError as exc:
            return done(request, "/approvals", False, f"not decided: Redis did not answer: {exc}", 503)
        fleet.audited(
            user.name,
            user.role.name,
            verb,
            intent_id=pending.intent_id if pending else "",
            agent=pending.agent_id if pending else None,
            target=approval_id,
            result="ok" if decision.ok else decision.code,
            payload_hash=shown_hash,
            reason=reason,
        )
        return done(request, "/approvals", bool(decision.ok), decision.message, 200 if decision.ok else 409)

    # workflow runs: a run is named by its agent and id, in the query string (ids may be "." or "..")
    def runs_page(request: Request) -> Response:
        user = current_user(request)
        if user is None:
            return RedirectResponse(f"/login?next={quote('/runs')}", status_code=303)
        agent, state = request.query_params.get("agent", ""), request.query_params.get("state", "")
        chosen = {"agent": agent if NAME.match(agent) else "", "state": state if state in RUN_STATES else ""}
        live = "/runs/live?" + urlencode({k: v for k, v in chosen.items() if v})
        return render(request, "runs.html", user, page="runs", live=live, chosen=chosen, states=RUN_STATES)

    def runs_live(request: Request) -> Response:
        user = current_user(request)
        if user is None:
            return PlainTextResponse("log in again", status_code=401)
        query = request.query_params
        return render(request, "runs_live.html", user, data=fleet.runs(query.get("agent"), query.get("state")))

    def run_page(request: Request) -> Response:
        user = current_user(request)
        agent, run_id = request.query_params.get("agent", ""), request.query_params.get("id", "")
        here = "?" + urlencode({"agent": agent, "id": run_id})
        if user is None:
            return RedirectResponse(f"/login?next={quote('/run' + here)}", status_code=303)
        return render(request, "run.html", user, page="runs", live="/run/live" + here, agent=agent, run_id=run_id)

    def run_live(request: Request) -> Response:
        user = current_user(request)
        if user is None:
            return PlainTextResponse("log in again", status_code=401)
        query = request.query_params
        return render(request, "run_live.html", user, data=fleet.run(query.get("agent", ""), query.get("id", "")))

    async def act_on_run(request: Request) -> Response:
        verb = request.path_params["verb"]
        try:
            user, data = await authorize(request, Role.operator, f"{verb}_run", "workflow run")
        except Refused as exc:
            return refused(request, exc)
        agent, run_id = _field(data, "agent"), _field(data, "run_id")
        back = "/run?" + urlencode({"agent": agent, "id": run_id})
        if verb not in ("resume", "abort") or not NAME.match(agent) or not RUN_ID.match(run_id):
            return done(request, "/runs", False, "no such run", 404)
        try:
            run = await run_in_threadpool(fleet.act_on_run, verb, agent, run_id, user.name)
        except RunNotFound as exc:
            return done(request, back, False, str(exc), 404)
        except NotAllowed as exc:
            return done(request, back, False, str(exc), 409)
        except redis.RedisError as exc:
            return done(request, back, False, f"not {verb}d: Redis did not answer: {exc}", 503)
        # into the run's own trace too: a run's id is the id of the intent that started it
        fleet.audited(user.name, user.role.name, f"{verb}_run", intent_id=run_id, agent=agent, result="ok")
        return done(request, back, True, f"run {run_id}: {run.state} ({verb}d; the agent gets no second receipt)")

    # trace
    def trace(request: Request) -> Response:
        user = current_user(request)
        if user is None:
            return RedirectResponse(f"/login?next={quote('/trace')}", status_code=303)
        intent_id = request.query_params.get("intent_id", "").strip()
        agent = request.query_params.get("agent", "").strip() or None
        result: dict[str, Any] = {"intent_id": intent_id, "agent": agent}
        if intent_id:
            if not OPAQUE_ID.match(intent_id) or (agent is not None and not NAME.match(agent)):
                result["error"] = "not an intent id (or agent name)"
            else:
                try:
                    found, choices, rows = fleet.trace(intent_id, agent)
                    result.update(agent=found, choices=choices, rows=rows)
                except SearchBusy:
                    result["error"] = (
                        "another search for an intent's agent is running: give the agent, or try again in a moment"
                    )
                except redis.RedisError as exc:
                    result["error"] = f"Redis did not answer: {exc}"
        return render(request, "trace.html", user, page="trace", live=None, result=result)

    def home(request: Request) -> Response:
        return RedirectResponse("/fleet", status_code=303)

    def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [
        Route("/", home),
        Route("/healthz", healthz),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/fleet", page("fleet.html", "/fleet/live")),
        Route("/fleet/live", live("fleet_live.html", fleet.status)),
        Route("/fleet/{connector}/{verb}", pause_or_resume, methods=["POST"]),
        Route("/approvals", page("approvals.html", "/approvals/live")),
        Route("/approvals/live", approvals_live),
        Route("/approvals/{approval_id}/{verb}", decide, methods=["POST"]),
        Route("/dead-letters", page("dead_letters.html", "/dead-letters/live")),
        Route("/dead-letters/live", live("dead_letters_live.html", fleet.dead_letters)),
        Route("/dead-letters/replay", replay, methods=["POST"]),
        Route("/runs", runs_page),
        Route("/runs/live", runs_live),
        Route("/run", run_page),
        Route("/run/live", run_live),
        Route("/run/{verb}", act_on_run, methods=["POST"]),
        Route("/trace", trace),
        Mount("/static", StaticFiles(packages=[("workers.console", "static")]), name="static"),
    ]
    middleware = [
        Middleware(SecurityHeaders),
        Middleware(
            SessionMiddleware,
            secret_key=key,
            session_cookie=SESSION_COOKIE,
            max_age=settings.console_session_ttl_seconds,
            same_site="strict",
            https_only=settings.console_secure_cookie,
        ),
    ]
    return Starlette(routes=routes, middleware=middleware)


class SecurityHeaders:
    """CSP (no inline script or style, no framing), nosniff, no caching: on every response, static files too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, with_headers)


def _field(data: FormData, name: str) -> str:
    value = data.get(name)
    return value if isinstance(value, str) else ""


def _local(target: Any) -> str:
    """``target`` if it is a path on this site (never another host after login), else ""."""
    if isinstance(target, str) and target.startswith("/") and not target.startswith(("//", "/\\")):
        return target[:200]
    return ""
