"""Enqueue rowclaim jobs inside your application's own transaction.

The job exists if and only if your transaction commits: ``rowclaim.enqueue(conn, payload,
queue="mail")`` runs the SQL that ``rowclaim init`` installs (docs/enqueue-sql.md) on the
connection you give, psycopg 3, PyMySQL, mysqlclient or sqlite3, and returns the job's id.
"""

from ._enqueue import enqueue, enqueue_async, enqueue_many, enqueue_many_async
from ._job import DEFAULT_MAX_ATTEMPTS, Job

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "Job",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
]
