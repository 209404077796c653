"""Every Redis key of the fleet, built here and nowhere else.

A key that holds anything taken from an agent's input (an intent id, an idempotency key)
starts with that agent, so one agent's input can never reach, overwrite or read another
agent's state. Agent and connector names match ``producers.wire.AGENT_ID_PATTERN``
(``^[a-z][a-z0-9_]{0,62}$``: no ``:`` and no braces), so the segments before the agent's own
text cannot run into each other. An intent whose agent is not known (an unparsable message
without an identity) files under ``-``, which no agent can be named.

Redis Cluster: the part in braces is the key's *hash tag*, the only part Redis hashes to pick
the slot, so all keys with one tag live on one node and a Lua script or a transaction may touch
them together. Keys are tagged by the agent or by the connector they belong to:

Keyed by agent, tag ``{<agent>}`` (everything an agent's input reaches)::

    reach:receipt:{<agent>}:<intent_id>               string  the receipt (JSON): redeliveries, lookups
    reach:receipt-sent:{<agent>}:<intent_id>          string  the broker confirmed the receipt
    reach:deliveries:{<agent>}:<intent_id>            counter deliveries of a job to its pool (poison)
    reach:router-deliveries:{<agent>}:<digest>        counter redeliveries of one message to the router
    reach:trace:{<agent>}:<intent_id>                 list    the intent's audit lines (``reach trace``)
    reach:idem:{<agent>}:<connector>:<action>:<key>   hash    the idempotency ledger record
    reach:abandoned:{<agent>}:<attempt>               string  an attempt (at one of the agent's records) given up
    reach:rl:{<agent>}:<connector>                    string  a binding's rate-limit bucket (GCRA)
    reach:budget:{<agent>}:<connector>:<param>:<ms>   zset    a value budget's counted intents, by time
    reach:budget-amounts:{<agent>}:<connector>:<param>:<ms>  hash  their amounts, and the window's total
    reach:budget-held:{<agent>}:<intent_id>           string  the budget keys an intent was counted in
    reach:history:{<agent>}:<intent_id>               string  a history record (JSON, at most 8 KB): reach.history
    reach:history-entity:{<agent>}:<entity>:<digest>  zset    the agent's records naming one entity value, by time
    reach:history-action:{<agent>}:<connector>.<action>  zset  the agent's records of one action, by time

One key holds an intent id under no agent, untagged: the index ``reach trace`` finds an intent's
traces by, whatever agent sent it (only the fleet writes it, and only agent names into it)::

    reach:trace-agents:<intent_id>                    set     the agents with a trace for this intent id

So one agent's intents all land on one node: an agent that sends most of the traffic makes that
node the busy one (Redis Cluster spreads agents, not one agent's intents).

Keyed by connector, tag ``{<connector>}`` (names from the catalog, never from intents)::

    reach:breaker:{<connector>}                       hash    the shared circuit breaker
    reach:health:{<connector>}                        string  up | down, from the health probe
    reach:paused:{<connector>}                        string  set by ``reach pause``
    reach:workers:{<connector>}                       hash    per-worker status for ``reach status``
    reach:last-error:{<connector>}                    string  the connector's last error
    reach:auth:{<connector>}                          hash    an oauth2_refresh_token connector's newest tokens
    reach:auth:{<connector>}:lock                     string  held by the process spending its refresh token

Approvals, tag ``{approvals}`` (one slot: a decision, the expiry sweep and the per-agent count
touch them together; intents that wait for a person are few, so one node holds them all)::

    reach:approval:{approvals}:<approval_id>          hash    a parked intent: its job, hash, state, decision
    reach:approvals-due:{approvals}                   zset    approval ids by when the sweep must look at them
    reach:approvals-count:{approvals}                 hash    pending approvals per agent (the bound)
    reach:approval-intent:{approvals}:<agent>:<intent_id>  string  the approval of an agent's intent (redelivery)
    reach:approval-key:{approvals}:<agent>:<connector>:<action>:<key>  string  the approval of a request's key

Workflow runs (workers/state/workflow_runs.py): a run's id is the id of the intent that started it,
so it is filed under its owner's tag, beside the index of its step intents (one script touches both)::

    reach:wf-run:{<owner>}:<run_id>                   hash    v (version), doc (the run, JSON), sent (outbound confirmed)
    reach:wf-step:{<owner>}:<intent_id>               string  the run a step or undo intent belongs to
    reach:wf-key:{<owner>}:<workflow>:<key>           string  the run a start's idempotency key belongs to (digest|run)

and two indexes of runs, tag ``{workflows}``, members ``<owner>:<run_id>`` (no agent name holds a ``:``)::

    reach:wf-runs:{workflows}                         zset    every run kept, by start time (``reach workflow list``)
    reach:wf-due:{workflows}                          zset    runs not finished, by when the runner's sweep looks

The approval id is the fleet's own (random); the one key holding an agent's input (its intent id)
names the agent right after the tag, so agents cannot reach each other's entries.

Keyed by process or by what the catalog says (no agent's input reaches them; untagged)::

    reach:alive:<worker_id>                           string  a worker process's heartbeat
    reach:embedding:<model>:<sha256 of the text>      string  an action text's embedding (float32, little-endian)
    reach:console-ended:<session_id>                  string  a console session logged out (until it would expire)
    reach:console-user:<sha256 of a user name>        string  the user's sessions that began before this time are over
    reach:console-login:{console}:<sha256 of a name or address>  zset  login attempts in the window (the limiter;
                                                      one tag: a login reserves its name's and address's at once)

The two ``auth`` keys are built by ``connectors.adapters.auth.state_key`` (connectors cannot import workers).

Keyed by a pair of agents, tag ``{<a>|<b>}`` (``a`` < ``b``, names from identities; built by
``connectors.adapters.loops.pair_key``, since connectors cannot import workers)::

    reach:agent-calls:{<a>|<b>}                       zset    agent-to-agent calls in flight between them (loop guard)

Every Lua script receives the keys it touches through KEYS, none builds a key itself, and all the
keys one script is given share a tag (tests/unit/test_lua_keys.py, tests/unit/test_keys.py). What
a script would need across two tags is split: the pool reads the breaker beside its ledger script
in the same round trip, and a record's holder is judged with its heartbeat read beside the record
(``workers.state.ledger``).
"""

from __future__ import annotations

PREFIX = "reach:"
NO_AGENT = "-"  # never an agent name: the pattern starts with a letter

RECEIPT_PREFIX = PREFIX + "receipt:"
SENT_PREFIX = PREFIX + "receipt-sent:"
DELIVERIES_PREFIX = PREFIX + "deliveries:"
ROUTER_DELIVERIES_PREFIX = PREFIX + "router-deliveries:"
TRACE_PREFIX = PREFIX + "trace:"
TRACE_AGENTS_PREFIX = PREFIX + "trace-agents:"
IDEMPOTENCY_PREFIX = PREFIX + "idem:"
RATE_LIMIT_PREFIX = PREFIX + "rl:"
BUDGET_PREFIX = PREFIX + "budget:"
BUDGET_AMOUNTS_PREFIX = PREFIX + "budget-amounts:"
BUDGET_HELD_PREFIX = PREFIX + "budget-held:"
HISTORY_PREFIX = PREFIX + "history:"
HISTORY_ENTITY_PREFIX = PREFIX + "history-entity:"
HISTORY_ACTION_PREFIX = PREFIX + "history-action:"
BREAKER_PREFIX = PREFIX + "breaker:"
HEALTH_PREFIX = PREFIX + "health:"
PAUSED_PREFIX = PREFIX + "paused:"
WORKERS_PREFIX = PREFIX + "workers:"
LAST_ERROR_PREFIX = PREFIX + "last-error:"
ALIVE_PREFIX = PREFIX + "alive:"
ABANDONED_PREFIX = PREFIX + "abandoned:"
EMBEDDING_PREFIX = PREFIX + "embedding:"
APPROVAL_PREFIX = PREFIX + "approval:"
APPROVAL_INTENT_PREFIX = PREFIX + "approval-intent:"
APPROVAL_KEY_PREFIX = PREFIX + "approval-key:"
APPROVALS_TAG = "{approvals}"


def _agent(agent: str | None) -> str:
    """The agent's hash tag."""
    return "{" + (agent or NO_AGENT) + "}"


def _connector(connector: str) -> str:
    """The connector's hash tag."""
    return "{" + connector + "}"


def tag_of(key: str | bytes) -> str:
    """The hash tag of a key built here (``{desk}`` of ``reach:idem:{desk}:...``), braces included;
    "" for an untagged key. Redis's rule: the first ``{`` and the first ``}`` after it."""
    text = key.decode() if isinstance(key, bytes) else key
    start = text.find("{")
    end = text.find("}", start + 1)
    return text[start : end + 1] if start >= 0 and end > start + 1 else ""


# keyed by agent


def receipt(agent: str | None, intent_id: str) -> str:
    return f"{RECEIPT_PREFIX}{_agent(agent)}:{intent_id}"


def sent(agent: str | None, intent_id: str) -> str:
    return f"{SENT_PREFIX}{_agent(agent)}:{intent_id}"


def deliveries(agent: str | None, intent_id: str) -> str:
    return f"{DELIVERIES_PREFIX}{_agent(agent)}:{intent_id}"


def router_deliveries(sender: str | None, digest: str) -> str:
    """Redeliveries of one message to the router, by its sender (the AMQP user_id, else ``-``)
    and a digest of the message, so they count before anything in the body is trusted."""
    return f"{ROUTER_DELIVERIES_PREFIX}{_agent(sender)}:{digest}"


def trace(agent: str | None, intent_id: str) -> str:
    return f"{TRACE_PREFIX}{_agent(agent)}:{intent_id}"


def trace_agents(intent_id: str) -> str:
    """The index of one intent id's traces: a set of agent names (``-`` for an unknown agent) that
    only the fleet writes, one member per agent that used the id, so ``reach trace`` finds the
    trace without a scan. Untagged: it spans agents, and holds no agent's input but the id."""
    return f"{TRACE_AGENTS_PREFIX}{intent_id}"


def idempotency(agent: str | None, connector: str, action: str, idempotency_key: str) -> str:
    return f"{IDEMPOTENCY_PREFIX}{_agent(agent)}:{connector}:{action}:{idempotency_key}"


def rate_limit(agent: str, connector: str) -> str:
    return f"{RATE_LIMIT_PREFIX}{_agent(agent)}:{connector}"


def budget(agent: str, connector: str, param: str, per_ms: int) -> tuple[str, str]:
    """A binding's value budget: (the counted intents by time, their amounts). Named by the param
    and the window, so a changed ``max`` keeps counting what the window already holds."""
    rest = f"{_agent(agent)}:{connector}:{param}:{per_ms}"
    return BUDGET_PREFIX + rest, BUDGET_AMOUNTS_PREFIX + rest


def budget_held(agent: str, intent_id: str) -> str:
    return f"{BUDGET_HELD_PREFIX}{_agent(agent)}:{intent_id}"


def abandoned(record: str, attempt: str) -> str:
    """The given-up mark of ``attempt`` at the ledger ``record`` it claims, in that record's slot
    (attempt ids are unique in the fleet; the tag only places the mark beside the record)."""
    return f"{ABANDONED_PREFIX}{tag_of(record)}:{attempt}"


def history_record(agent: str, intent_id: str) -> str:
    return f"{HISTORY_PREFIX}{_agent(agent)}:{intent_id}"


def history_entity(agent: str, entity: str, digest: str) -> str:
    """An entity value's index: the value by its digest (connectors.history.value_digest), so no
    agent text is part of the key; the entity's name is the catalog's."""
    return f"{HISTORY_ENTITY_PREFIX}{_agent(agent)}:{entity}:{digest}"


def history_action(agent: str, connector: str, action: str) -> str:
    return f"{HISTORY_ACTION_PREFIX}{_agent(agent)}:{connector}.{action}"


def history_match(agent: str) -> str:
    """A SCAN pattern for every history key of one agent (records and indexes): ``reach history
    purge``. Agent names hold no glob characters."""
    return f"{HISTORY_PREFIX[:-1]}*:{_agent(agent)}:*"


def history_prefixes(agent: str) -> tuple[str, ...]:
    """How every history key of one agent begins (what ``history_match`` finds is checked by them)."""
    return tuple(f"{p}{_agent(agent)}:" for p in (HISTORY_PREFIX, HISTORY_ENTITY_PREFIX, HISTORY_ACTION_PREFIX))


# keyed by connector or process


def breaker(connector: str) -> str:
    return BREAKER_PREFIX + _connector(connector)


def health(connector: str) -> str:
    return HEALTH_PREFIX + _connector(connector)


def paused(connector: str) -> str:
    return PAUSED_PREFIX + _connector(connector)


def workers(connector: str) -> str:
    return WORKERS_PREFIX + _connector(connector)


def last_error(connector: str) -> str:
    return LAST_ERROR_PREFIX + _connector(connector)


def alive(worker_id: str) -> str:
    return ALIVE_PREFIX + worker_id


# the keys a connector's pools, probes and operators leave, by which ``reach status`` finds the
# connectors of a fleet when no catalog names them
CONNECTOR_PREFIXES = (WORKERS_PREFIX, HEALTH_PREFIX, BREAKER_PREFIX, PAUSED_PREFIX, LAST_ERROR_PREFIX)


def connector_of(key: str | bytes) -> str | None:
    """The connector a key with one of ``CONNECTOR_PREFIXES`` belongs to (None for other keys)."""
    text = key.decode() if isinstance(key, bytes) else key
    for prefix in CONNECTOR_PREFIXES:
        tag = text[len(prefix) :]
        if text.startswith(prefix) and len(tag) > 2 and tag[0] == "{" and tag[-1] == "}":
            return tag[1:-1]
    return None


def console_session_ended(session_id: str) -> str:
    """A console session that was logged out: its cookie is refused by every console replica until
    the session would have expired anyway (the id is the console's own, random)."""
    return f"{PREFIX}console-ended:{session_id}"


CONSOLE_LOGIN_MATCH = PREFIX + "console-login:{console}:*"  # every console login counter (tests forget them)


def console_login_failures(digest: str) -> str:
    """Console login attempts of one user name or client address (its digest: typed text never
    becomes a key), shared by every console replica; all in one slot (a login's script takes two)."""
    return f"{PREFIX}console-login:{{console}}:{digest}"


def console_user(digest: str) -> str:
    """When a console user's sessions were last ended (logout everywhere, removal from the users
    file), under the digest of the name, shared by every console replica."""
    return f"{PREFIX}console-user:{digest}"


def embedding(model_and_digest: str) -> str:
    """An action text's embedding: ``<model>:<sha256 hex>`` (connectors.routing.ActionIndex.cache_key);
    shared by every router, so a restart or a second replica embeds nothing again."""
    return EMBEDDING_PREFIX + model_and_digest


# workflow runs (workers/state/workflow_runs.py)

WORKFLOW_RUN_PREFIX = PREFIX + "wf-run:"
WORKFLOW_STEP_PREFIX = PREFIX + "wf-step:"
WORKFLOW_KEY_PREFIX = PREFIX + "wf-key:"
WORKFLOWS_TAG = "{workflows}"


def workflow_run(owner: str, run_id: str) -> str:
    return f"{WORKFLOW_RUN_PREFIX}{_agent(owner)}:{run_id}"


def workflow_step(owner: str, intent_id: str) -> str:
    return f"{WORKFLOW_STEP_PREFIX}{_agent(owner)}:{intent_id}"


def workflow_key(owner: str, workflow: str, key: str) -> str:
    """The claim of a workflow start's idempotency key (scope: agent, workflow, key, as an action's)."""
    return f"{WORKFLOW_KEY_PREFIX}{_agent(owner)}:{workflow}:{key}"


def workflow_runs() -> str:
    return f"{PREFIX}wf-runs:{WORKFLOWS_TAG}"


def workflow_due() -> str:
    return f"{PREFIX}wf-due:{WORKFLOWS_TAG}"


# approvals (workers/state/approval_store.py)


def approval(approval_id: str) -> str:
    return f"{APPROVAL_PREFIX}{APPROVALS_TAG}:{approval_id}"


def approvals_due() -> str:
    return f"{PREFIX}approvals-due:{APPROVALS_TAG}"


def approvals_count() -> str:
    return f"{PREFIX}approvals-count:{APPROVALS_TAG}"


def approval_of_intent(agent: str, intent_id: str) -> str:
    return f"{APPROVAL_INTENT_PREFIX}{APPROVALS_TAG}:{agent}:{intent_id}"


def approval_of_key(agent: str, connector: str, action: str, idempotency_key: str) -> str:
    """The approval of an agent's request (its idempotency key, as the ledger's scope has it): a
    repeat of the key joins it instead of asking a person again."""
    return f"{APPROVAL_KEY_PREFIX}{APPROVALS_TAG}:{agent}:{connector}:{action}:{idempotency_key}"
