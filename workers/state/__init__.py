"""Everything the fleet keeps in Redis: every key (``keys``), the idempotency ledger, the shared
breaker, rate limits, health marks, pause flags and pool status, and the batcher that carries the
round trips. Knows Redis; knows nothing of Celery, kombu or the roles above."""
