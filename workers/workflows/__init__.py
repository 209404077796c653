"""The workflow runner: a role beside the router and the pools (``reach workflows``).

It drives each run of a catalog ``workflow:`` (connectors/workflows/) step by step, every step an
ordinary intent sent through the router on behalf of the agent that started the run::

    ids.py       the deterministic intent ids of a run's steps and undos
    model.py     a run as kept in Redis (workers/state/workflow_runs.py): steps, outbound, final receipt
    machine.py   the transitions: pure functions from a run and what happened to the next run
    final.py     the run's one final receipt
    keyed_starts.py  starts sharing an idempotency key: the input digest, the claim's life, refusals
    runner.py    per message: load, transition, compare-and-set, publish confirmed, then ack; the sweep
    operators.py what ``reach workflow list | show | resume | abort`` do to runs

Exactly once downstream rests on three things: one compare-and-set per transition, publishing the
transition's outbound message only after it was written (and again, with the same intent id and
idempotency key, whenever it may not have been confirmed), and the pools' idempotency ledger,
which never calls a system twice for one key.
"""
