"""RabbitMQ's own admin tool, run as a subprocess: one way to run it, one error for its failures,
and the broker users every login of the fleet's is made of.

What a user may do is decided above: :mod:`workers.ops.agents` for agents (least privilege),
:mod:`workers.mcp.broker_user` for the MCP facade (impersonator). A password is only ever passed
on stdin, never on a command line, where any user of the host could read it in the process list.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

PASSWORD_PLACEHOLDER = "<password>"
SERVER_NAMED_QUEUE = r"amq\.gen-.*"  # the broker's names for queues a client declares without one
TIMEOUT_SECONDS = 120


class RabbitmqctlError(RuntimeError):
    """rabbitmqctl is missing, refused or failed; the message carries its output."""


class Rabbitmqctl:
    """How to run rabbitmqctl against the fleet's broker, e.g. ``"docker exec -i rabbitmq rabbitmqctl"``."""

    def __init__(self, command: str | Sequence[str] = "rabbitmqctl") -> None:
        self.prefix = shlex.split(command) if isinstance(command, str) else list(command)

    def run(self, args: list[str], *, stdin: str = "", check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``rabbitmqctl ARGS``; its completed process.

        Raises:
            RabbitmqctlError: It is not installed, did not finish in time, or (``check``) failed.
        """
        try:
            result = subprocess.run(
                [*self.prefix, *args], input=stdin, capture_output=True, text=True, timeout=TIMEOUT_SECONDS
            )
        except FileNotFoundError as exc:
            raise RabbitmqctlError(
                f"{self.prefix[0]!r} not found: run this where rabbitmqctl works, or print the "
                "commands with --print and run them on the broker host"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise RabbitmqctlError(f"rabbitmqctl {args[0]} did not finish within {exc.timeout:g} s") from exc
        if check and result.returncode != 0:
            raise failure(args, result)
        return result

    def set_user(self, user: str, password: str) -> None:
        """Create ``user`` with ``password``, or give an existing one that password.

        rabbitmqctl has no "create or update", and reads the password from stdin with its line end
        stripped. A new user has no permissions: it can open no vhost until it is granted some.

        Raises:
            ValueError: A password rabbitmqctl would store differently (see :func:`check_password`).
            RabbitmqctlError: rabbitmqctl failed.
        """
        check_password(password)
        args = add_user_command(user)[1:]
        result = self.run(args, stdin=password + "\n", check=False)
        if result.returncode != 0:
            if "already exists" not in result.stderr + result.stdout:
                raise failure(args, result)
            self.run(["change_password", "--", user], stdin=password + "\n")


def add_user_command(user: str, password_stdin: bool = True) -> list[str]:
    """``rabbitmqctl add_user -- USER``; without ``password_stdin`` it ends with
    :data:`PASSWORD_PLACEHOLDER`, for an operator to fill in. ``--`` keeps a name that starts with
    ``-`` from being read as an option."""
    return ["rabbitmqctl", "add_user", "--", user, *([] if password_stdin else [PASSWORD_PLACEHOLDER])]


def check_password(password: str) -> None:
    """Raise ValueError unless rabbitmqctl stores ``password`` as given: non-empty, no line breaks,
    no leading or trailing whitespace (it strips them when reading stdin)."""
    if not password or password != password.strip() or any(c in password for c in "\r\n"):
        raise ValueError(
            "the password must be non-empty, without line breaks or leading/trailing "
            "whitespace (rabbitmqctl strips them when reading stdin)"
        )


def failure(args: list[str], result: subprocess.CompletedProcess[str]) -> RabbitmqctlError:
    """The error for a rabbitmqctl run that exited non-zero, with the end of its output."""
    output = (result.stderr.strip() or result.stdout.strip())[-2000:]
    return RabbitmqctlError(f"rabbitmqctl {args[0]} failed (exit {result.returncode}): {output}")


def vhost_of(broker_url: str) -> str:
    """The vhost of an AMQP URL (the first, when it lists a cluster's nodes split by ``;``): the path
    without its leading slash, ``/`` when empty."""
    return unquote(urlsplit(broker_url.split(";", 1)[0].strip()).path[1:]) or "/"
