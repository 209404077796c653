"""``reach console``: the operator web page, served by Starlette with server-rendered pages.

Rooms: ``users`` (who may log in, with which role; password hashes), ``security`` (session,
CSRF token, Origin check, login rate limit), ``views`` (what each page shows, from the ops
functions), ``app`` (routes and templates), ``server`` (uvicorn). Nothing here re-implements
the fleet's operations: pages call ``workers.ops.fleet``, ``workers.state.control``,
``workers.observability.audit``, ``workers.ops.approval_decisions`` and ``workers.ops.workflow_commands``.
"""

from workers.console.app import create_app
from workers.console.users import Role, User, hash_password

__all__ = ["Role", "User", "create_app", "hash_password"]
