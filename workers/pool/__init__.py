"""The pool role: a connector's isolated worker runs each dispatched job once (idempotency ledger,
breaker, retries) and publishes its one receipt."""
