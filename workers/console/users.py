"""Who may log in to the console, and what they may do.

The users file (``REACH_CONSOLE_USERS``, usually a mounted Secret) is YAML or JSON::

    alice: {password_hash: "scrypt$16384$8$1$<salt>$<hash>", role: approver}
    olga:  {password_hash: "scrypt$...", role: operator}

``reach console hash-password`` prints a hash. Roles are ordered: a viewer sees; an approver
also decides approvals (as the person of the same name in the catalog's approver groups); an
operator also pauses, resumes and replays dead letters. The file is read again when it changes,
so removing a user ends their sessions at their next request (``UsersFile.on_removed`` hears of
it, so that the console can end them for good: a user added again does not get old sessions back).
"""

from __future__ import annotations

import base64
import enum
import functools
import hashlib
import hmac
import os
import re
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

# scrypt's cost: 16 MiB of memory and ~50 ms per check, so a stolen file is slow to guess from
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
SCRYPT_MAXMEM = 64 * 1024 * 1024
MAX_PASSWORD_BYTES = 1024  # hashing is the costly part: bound what a login form can make us hash
MAX_USERS_FILE_BYTES = 1024 * 1024
USER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


class Role(enum.IntEnum):
    viewer = 1
    approver = 2
    operator = 3


@dataclass(frozen=True)
class User:
    name: str
    role: Role
    password_hash: str


class UsersFileError(ValueError):
    """The users file cannot be read or has an entry the console cannot use."""


def hash_password(password: str, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$salt$hash`` (base64) of ``password``; a new random salt unless one is given."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = _scrypt(password.encode(), salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` hashes to ``stored``, compared in constant time; False for a malformed hash."""
    if len(password.encode()) > MAX_PASSWORD_BYTES:
        return False
    try:
        scheme, n, r, p, salt, expected = stored.split("$")
        if scheme != "scrypt":
            return False
        digest = _scrypt(password.encode(), _unb64(salt), int(n), int(r), int(p))
        return hmac.compare_digest(digest, _unb64(expected))
    except (ValueError, MemoryError):
        return False


def check_login(users: dict[str, User], name: str, password: str) -> User | None:
    """The user whose name and password these are, or None (always after one hash computation)."""
    user = users.get(name)
    ok = verify_password(password, user.password_hash if user else _dummy_hash())
    return user if ok and user is not None else None


@functools.cache
def _dummy_hash() -> str:
    """Checked for an unknown name: the same work as for a known one, so timing does not tell which names exist."""
    return hash_password(secrets.token_urlsafe(16))


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, maxmem=SCRYPT_MAXMEM, dklen=32)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def parse_users(text: str) -> dict[str, User]:
    """The users of a file's text.

    Raises:
        UsersFileError: not a mapping of names to ``{password_hash, role}``.
    """
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsersFileError(f"not YAML or JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise UsersFileError("must map user names to {password_hash, role}")
    users: dict[str, User] = {}
    for name, entry in doc.items():
        if not isinstance(name, str) or not USER_NAME.match(name):
            raise UsersFileError(f"user name {name!r} must match {USER_NAME.pattern}")
        if not isinstance(entry, dict) or set(entry) - {"password_hash", "role"}:
            raise UsersFileError(f"user {name}: give exactly password_hash and role")
        role, password_hash = entry.get("role"), entry.get("password_hash")
        if not isinstance(role, str) or role not in Role.__members__:
            raise UsersFileError(f"user {name}: role must be one of {', '.join(Role.__members__)}")
        if not isinstance(password_hash, str) or not password_hash.startswith("scrypt$"):
            raise UsersFileError(f"user {name}: password_hash must come from `reach console hash-password`")
        users[name] = User(name, Role[role], password_hash)
    return users


class UsersFile:
    """The users file, read again whenever its modification time or size changes."""

    def __init__(self, path: str) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._users: dict[str, User] = {}
        # called with the names a new version of the file no longer has, and that version's time
        self.on_removed: Callable[[set[str], float], None] | None = None
        self.users()  # a missing or broken file stops the console at start, not at the first login

    def users(self) -> dict[str, User]:
        """The users as the file says now.

        Raises:
            UsersFileError: the file cannot be read or is not valid (at start; later, the last
                good version is kept so a half-written Secret does not lock everyone out).
        """
        try:
            info = os.stat(self._path)
        except OSError as exc:
            if self._stamp is None:
                raise UsersFileError(f"cannot read {self._path}: {exc.strerror}") from None
            return self._users
        stamp = (info.st_mtime_ns, info.st_size)
        with self._lock:
            if stamp == self._stamp:
                return self._users
            try:
                if info.st_size > MAX_USERS_FILE_BYTES:
                    raise UsersFileError(f"{self._path} is larger than {MAX_USERS_FILE_BYTES} bytes")
                users = parse_users(self._path.read_text(encoding="utf-8"))
            except (OSError, UsersFileError) as exc:
                if self._stamp is None:
                    raise UsersFileError(f"{self._path}: {exc}") from None
                return self._users
            removed = set(self._users) - set(users)
            self._users, self._stamp = users, stamp
        if removed and self.on_removed is not None:
            self.on_removed(removed, info.st_mtime)
        return users
