r"""The MCP facade's own RabbitMQ user: it may publish intents as any agent, and nothing else.

Over HTTP the facade publishes each agent's intents with AMQP ``user_id`` = that agent, so the
router (and REACH_REQUIRE_USER_ID=1) keeps trusting ``user_id`` as a broker-checked identity.
RabbitMQ lets a connection set a ``user_id`` other than its login only if the login has the
``impersonator`` tag; this user has it, and otherwise an agent user's rights::

    tags       impersonator
    configure  ^amq\.gen-.*$                      its server-named receipt queues
    write      ^(reach\.intents|amq\.gen-.*)$     publish intents; bind its queues
    read       ^(reach\.receipts|amq\.gen-.*)$    bind to reach.receipts; consume its queues
    topic permissions on reach.receipts:
      write    ^$
      read     ^<agent>\.mcp\.<32 hex>$           only the keys the facade's clients bind

So the facade can act as every agent but can read no agent's own receipts, touch no connector
queue and publish nowhere but ``reach.intents``. Give this login to the facade alone: whoever
holds it can act as any agent (docs/operations.md "The MCP facade").
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from workers.mcp.clients import REPLY_KEY_PATTERN
from workers.transport.rabbitmqctl import (
    PASSWORD_PLACEHOLDER as PASSWORD_PLACEHOLDER,
)
from workers.transport.rabbitmqctl import (
    SERVER_NAMED_QUEUE,
    Rabbitmqctl,
    RabbitmqctlError,
    add_user_command,
)
from workers.transport.topology import INTENTS_EXCHANGE, RECEIPTS_EXCHANGE

FACADE_TAG = "impersonator"
DEFAULT_USER = "reach_mcp"
USER_PATTERN = re.compile(r"^[a-z][a-z0-9_.-]{0,62}\Z")

FacadeUserError = RabbitmqctlError  # the name this module's callers catch


def rabbitmqctl_commands(user: str, vhost: str = "/", password_stdin: bool = True) -> list[list[str]]:
    """The rabbitmqctl commands that create the facade's user with its tag and permissions.

    With ``password_stdin`` add_user reads the password from stdin; otherwise the command holds
    :data:`PASSWORD_PLACEHOLDER`. The tag and permissions come after the user exists, so a failed
    run leaves a user that can open no vhost.

    Raises:
        ValueError: ``user`` is not a usable name.
    """
    if not USER_PATTERN.match(user):
        raise ValueError(f"user name {user!r} must be 1-63 of a-z 0-9 _ . - starting with a letter")
    return [
        add_user_command(user, password_stdin),
        ["rabbitmqctl", "set_user_tags", "--", user, FACADE_TAG],
        [
            "rabbitmqctl",
            "set_permissions",
            f"--vhost={vhost}",
            "--",
            user,
            f"^{SERVER_NAMED_QUEUE}$",
            f"^({re.escape(INTENTS_EXCHANGE.name)}|{SERVER_NAMED_QUEUE})$",
            f"^({re.escape(RECEIPTS_EXCHANGE.name)}|{SERVER_NAMED_QUEUE})$",
        ],
        [
            "rabbitmqctl",
            "set_topic_permissions",
            f"--vhost={vhost}",
            "--",
            user,
            RECEIPTS_EXCHANGE.name,
            "^$",
            f"^{REPLY_KEY_PATTERN}$",
        ],
    ]


def create_facade_user(
    user: str, password: str, vhost: str = "/", rabbitmqctl: str | Sequence[str] = "rabbitmqctl"
) -> None:
    """Create the facade's user (or give an existing one the new password), then its tag and permissions.

    Raises:
        ValueError: A bad name, or a password rabbitmqctl would store differently.
        FacadeUserError: rabbitmqctl failed.
    """
    _, *rest = rabbitmqctl_commands(user, vhost)
    ctl = Rabbitmqctl(rabbitmqctl)
    ctl.set_user(user, password)
    for command in rest:
        ctl.run(command[1:])


def delete_facade_user(user: str, rabbitmqctl: str | Sequence[str] = "rabbitmqctl") -> None:
    """Delete the facade's user; RabbitMQ closes its connections at once.

    Raises:
        FacadeUserError: No such user, or rabbitmqctl failed.
    """
    Rabbitmqctl(rabbitmqctl).run(["delete_user", "--", user])
