"""The sql adapter: one semantic action -> one stored procedure or function, in a transaction of its
own -> one Outcome.

dialects.py picks the dialect by the DSN's scheme; transaction.py is what every dialect shares (the
pool, one transaction per call, the phases of a failure, scrubbing), with watchdog.py (a hung
server) and results.py (the answer as bounded JSON); postgres.py and mariadb.py are the dialects.
"""

from connectors.adapters.sql.dialects import database_url, sql_adapter, sql_problems

__all__ = ["database_url", "sql_adapter", "sql_problems"]
