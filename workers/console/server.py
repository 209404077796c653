"""``reach console``: the console app under uvicorn, over the fleet named by the settings."""

from __future__ import annotations

from workers.console.app import create_app
from workers.console.users import UsersFile
from workers.console.views import Fleet
from workers.observability import uvicorn_guard
from workers.observability.http_guard import HttpLimits
from workers.settings import Settings
from workers.state.client import connect_redis


class NoUsers(ValueError):
    """REACH_CONSOLE_USERS is not set: nobody could log in."""


def run_console(settings: Settings, host: str, port: int) -> None:
    """Serve the console until interrupted.

    Raises:
        NoUsers: REACH_CONSOLE_USERS is unset.
        UsersFileError: the users file cannot be read or is not valid.
    """
    if not settings.console_users:
        raise NoUsers("set REACH_CONSOLE_USERS to a users file (see `reach console hash-password`)")
    users = UsersFile(settings.console_users)
    app = create_app(settings, Fleet(settings, connect_redis(settings)), users)
    # one process; the blocking calls to Redis and the broker run on Starlette's thread pool
    limits = HttpLimits.from_settings(settings)
    uvicorn_guard.run(app, host, port, limits, "console", log_level="warning", proxy_headers=False, server_header=False)
