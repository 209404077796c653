"""The ids of the intents a run sends: the same for the same run, step, kind and attempt, so an
intent published again after a crash is the same intent, and the pools' ledger runs it once.

``wf.<owner>.<digest>.<step>.d0`` does a step; ``wf.<owner>.<digest>.<step>.u<n>`` is the n-th
try to undo it. The digest is of the owner and the run id (run ids are agents' intent ids: two
agents may use the same one); the owner is in the id so that an approval notice, which names only
the intent, finds its run. At most 98 characters of ``[a-z0-9_.]``, within an intent id's 128.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["do", "undo"]
_ID = re.compile(r"^wf\.([a-z][a-z0-9_]{0,62})\.([0-9a-f]{20})\.([0-9]{1,2})\.([du])([0-9]{1,6})\Z")


@dataclass(frozen=True)
class StepIntent:
    owner: str
    digest: str
    step: int
    kind: Kind
    attempt: int


def run_digest(owner: str, run_id: str) -> str:
    return hashlib.sha256(f"{owner}\x00{run_id}".encode()).hexdigest()[:20]


def step_intent_id(owner: str, run_id: str, step: int, kind: Kind, attempt: int = 0) -> str:
    """The intent id of ``kind`` of step ``step`` (0-based), try ``attempt`` (0 for a step, 1.. for undos)."""
    return f"wf.{owner}.{run_digest(owner, run_id)}.{step}.{'d' if kind == 'do' else 'u'}{attempt}"


def parse_step_intent_id(intent_id: str) -> StepIntent | None:
    match = _ID.match(intent_id)
    if match is None:
        return None
    kind: Kind = "do" if match.group(4) == "d" else "undo"
    return StepIntent(match.group(1), match.group(2), int(match.group(3)), kind, int(match.group(5)))
