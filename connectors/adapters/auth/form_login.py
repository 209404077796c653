"""``form_login``: a login form whose session cookie goes out with every request."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Generator

import httpx

from connectors.adapters.auth.errors import AUTH_TIMEOUT, CredentialsUnavailable, Refusals, TokenError


class FormLoginAuth(httpx.Auth):
    """A login form: POST the credentials, keep the session cookie, log in again when it expires.

    The adapter's clients keep no cookies (one pool serves every agent), so the session lives here,
    one per pool process, and goes out as the Cookie header of each request (only to the hosts and
    paths the cookie names). A 401, or a redirect to the login page, means the session expired:
    log in once more and resend (the system refused the request, so resending is safe). One login
    at a time; threads that waited reuse its session.
    """

    requires_response_body = False

    def __init__(self, login_url: str, form: dict[str, str], verify: ssl.SSLContext) -> None:
        self._login_url = httpx.URL(login_url)
        self._form = form
        self._verify = verify
        self._lock = threading.Lock()
        self._session: httpx.Cookies | None = None
        self._refusals = Refusals()

    def __repr__(self) -> str:
        return f"FormLoginAuth({self._login_url}, <redacted>)"

    def _is_login_page(self, response: httpx.Response) -> bool:
        if not response.is_redirect:
            return False
        try:
            target = response.request.url.join(response.headers["Location"])
        except (httpx.InvalidURL, KeyError):
            return False
        login = self._login_url
        return (target.host, target.port, target.path) == (login.host, login.port, login.path)

    def _login(self) -> httpx.Cookies:
        try:
            response = httpx.post(
                self._login_url, data=self._form, timeout=AUTH_TIMEOUT, verify=self._verify, trust_env=False
            )
        except httpx.HTTPError as exc:
            raise CredentialsUnavailable(f"the login page did not answer ({type(exc).__name__})") from exc
        status = response.status_code
        if status >= 500 or status == 429:
            raise CredentialsUnavailable(f"the login page answered HTTP {status}")
        session = httpx.Cookies()
        session.extract_cookies(response)
        if status >= 400 or self._is_login_page(response) or not session:
            raise TokenError(f"the login at {self._login_url} was refused (HTTP {status})")
        return session

    def session(self, stale: httpx.Cookies | None = None) -> httpx.Cookies:
        """The current session; a new one when there is none or it is ``stale`` (it was refused)."""
        with self._lock:
            if self._session is None or self._session is stale:
                self._session = None
                self._refusals.check()
                with self._refusals.remembered():
                    self._session = self._login()
            return self._session

    @staticmethod
    def _apply(request: httpx.Request, session: httpx.Cookies) -> None:
        request.headers.pop("Cookie", None)
        session.set_cookie_header(request)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        session = self.session()
        self._apply(request, session)
        response = yield request
        if response.status_code == 401 or self._is_login_page(response):
            self._apply(request, self.session(stale=session))
            yield request
