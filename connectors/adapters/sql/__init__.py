"""The sql adapter: one semantic action -> one stored procedure or function, in a transaction of its
own -> one Outcome.

dialects.py picks the dialect by the DSN's scheme (urls.py reads it); transaction.py is what every dialect shares (the
pool, one transaction per call, the phases of a failure, scrubbing), with watchdog.py (a hung
server) and results.py (the answer as bounded JSON); postgres.py and mariadb.py are the dialects.
"""

from connectors.adapters.sql.dialects import sql_adapter, sql_problems
from connectors.adapters.sql.urls import database_url

__all__ = ["database_url", "sql_adapter", "sql_problems"]
