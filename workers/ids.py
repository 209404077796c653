"""Identifiers the fleet makes for its own bookkeeping: claim attempts, ledger nonces, span ids.

They must be unique, not secret: none is a credential, and nothing an agent sends is checked
against one. So they come from the ``random`` module (re-seeded in a forked child) rather than
the operating system: ``os.urandom`` is a system call that lets go of the interpreter lock, and
in a pool under load every such hand-over between threads costs more than the id itself. Ids an
agent sees first (trace ids, approval ids) stay with ``secrets``.
"""

from __future__ import annotations

import random


def hex_id(chars: int) -> str:
    """``chars`` random lowercase hex digits."""
    return f"{random.getrandbits(chars * 4):0{chars}x}"
