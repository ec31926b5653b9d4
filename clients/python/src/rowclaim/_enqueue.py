"""Enqueue on the caller's connection, in the caller's transaction: the SQL of
docs/enqueue-sql.md (the function and procedure `rowclaim init` installs; SQLite's INSERT).
Nothing here begins, commits or rolls back: the job exists if and only if the caller commits.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ._job import Job

# Each option as the PostgreSQL function names it, and how a Job gives it. A NULL is the
# function's default, so every one is passed.
_POSTGRES = (
    "SELECT rowclaim_enqueue(payload => %s::jsonb, queue => %s, kind => %s, priority => %s, "
    "run_at => %s::timestamptz, delay => %s::interval, max_attempts => %s, "
    "unique_key => %s, limit_key => %s, timeout => %s::interval, after => %s::bigint[], "
    "run_anyway => %s)"
)


def _postgres_args(job: Job) -> Tuple[Any, ...]:
    timeout_ms = job.timeout_ms()
    timeout = None if timeout_ms is None else timedelta(milliseconds=timeout_ms)
    return (
        job.payload_json(),
        job.queue,
        job.kind,
        job.priority,
        job.run_at,
        job.delay_interval(),
        job.max_attempts,
        job.unique_key,
        job.limit_key,
        timeout,
        job.after_ids(),
        job.run_anyway,
    )


_MYSQL = "CALL rowclaim_enqueue(%s, %s)"


def _mysql_options(job: Job) -> str:
    """The procedure's options object: the options given, by their names there."""
    options = {
        "queue": job.queue,
        "kind": job.kind,
        "priority": job.priority,
        "run_at_ms": job.run_at_ms(),
        "delay_ms": job.delay_ms() if job.delay is not None else None,
        "max_attempts": job.max_attempts,
        "unique_key": job.unique_key,
        "limit_key": job.limit_key,
        "timeout_ms": job.timeout_ms(),
        "after": job.after_ids(),
        "run_anyway": job.run_anyway,
    }
    return json.dumps({k: v for k, v in options.items() if v is not None})


# SQLite's clock in epoch milliseconds (julianday works on every SQLite with RETURNING).
_NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
_SQLITE_INSERT = (
    "INSERT INTO rowclaim_jobs (queue, kind, payload, priority, run_at, max_attempts, "
    "unique_key, limit_key, timeout_ms, created_at) "
    f"VALUES (?, ?, json(?), ?, COALESCE(?, {_NOW_MS} + ?), ?, ?, ?, ?, {_NOW_MS}) "
    "ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('ready', 'running') "
    "DO NOTHING RETURNING id"
)
_SQLITE_PENDING = (
    "SELECT id FROM rowclaim_jobs WHERE unique_key = ? AND status IN ('ready', 'running')"
)
# A job that waits (docs/enqueue-sql.md, "sqlite-after"): its ids checked first (so that an
# unknown one is named and nothing is written), then one row of rowclaim_waits per job it
# waits for, then waiting while one has not finished, cancelled (naming it) if one failed.
_SQLITE_UNKNOWN = (
    "SELECT value FROM json_each(?) WHERE value NOT IN (SELECT id FROM rowclaim_jobs) "
    "ORDER BY value LIMIT 1"
)
_SQLITE_EDGES = (
    "INSERT INTO rowclaim_waits (job, waits_for) "
    "SELECT DISTINCT ?, (SELECT id FROM rowclaim_jobs WHERE id = value) FROM json_each(?)"
)
_SQLITE_DEPS = (
    "SELECT 1 FROM rowclaim_waits AS w JOIN rowclaim_jobs AS d ON d.id = w.waits_for "
    "WHERE w.job = rowclaim_jobs.id AND d.status "
)
_SQLITE_WAITING = (
    "UPDATE rowclaim_jobs SET status = 'waiting' WHERE id = ? AND EXISTS ("
    f"{_SQLITE_DEPS}NOT IN ('completed', 'dead', 'cancelled'))"
)
_SQLITE_CANCEL = (
    f"UPDATE rowclaim_jobs SET status = 'cancelled', finished_at = {_NOW_MS}, last_error = ("
    "SELECT 'cancelled: job ' || d.id || ', which it waited for, ' "
    "|| CASE d.status WHEN 'dead' THEN 'ended dead' ELSE 'was cancelled' END "
    "FROM rowclaim_waits AS w JOIN rowclaim_jobs AS d ON d.id = w.waits_for "
    "WHERE w.job = rowclaim_jobs.id AND d.status IN ('dead', 'cancelled') "
    "ORDER BY d.id LIMIT 1) "
    f"WHERE id = ? AND EXISTS ({_SQLITE_DEPS}IN ('dead', 'cancelled'))"
)
_SQLITE_RUN_ANYWAY = "UPDATE rowclaim_jobs SET if_failed = 'run' WHERE id = ?"
# How often a unique job is inserted again when its pending twin finished in between.
_UNIQUE_TRIES = 5


def _sqlite_args(job: Job) -> Tuple[Any, ...]:
    return (
        job.queue if job.queue is not None else "default",
        job.kind if job.kind is not None else "",
        job.payload_json(),
        job.priority if job.priority is not None else 0,
        job.run_at_ms(),
        job.delay_ms(),
        job.max_attempts if job.max_attempts is not None else 25,
        job.unique_key,
        job.limit_key,
        job.timeout_ms(),
    )


def _modules(conn: Any) -> List[str]:
    """The packages of the connection's classes (a subclass's too)."""
    return [c.__module__.split(".")[0] for c in type(conn).__mro__]


def _is_async(conn: Any) -> bool:
    return any(c.__name__ == "AsyncConnection" for c in type(conn).__mro__)


def _dialect(conn: Any) -> str:
    modules = _modules(conn)
    if "psycopg" in modules:
        if _is_async(conn):
            raise TypeError("an AsyncConnection: use rowclaim.enqueue_async")
        return "postgres"
    if "pymysql" in modules or "MySQLdb" in modules:
        return "mysql"
    if "sqlite3" in modules or "_sqlite3" in modules:
        return "sqlite"
    raise TypeError(
        f"rowclaim.enqueue takes a psycopg (3), PyMySQL, mysqlclient or sqlite3 connection, "
        f"not {type(conn).__module__}.{type(conn).__name__}"
    )


def _one(conn: Any, job: Job) -> int:
    job.check()
    dialect = _dialect(conn)
    cur = conn.cursor()
    try:
        if dialect == "postgres":
            cur.execute(_POSTGRES, _postgres_args(job))
            return _id(cur.fetchone())
        if dialect == "mysql":
            cur.execute(_MYSQL, (job.payload_json(), _mysql_options(job)))
            row = cur.fetchone()
            # A CALL's status follows its result: read it before the connection's next statement.
            while cur.nextset():
                pass
            return _id(row)
        ids = job.after_ids()
        if ids:
            return _sqlite_waiting(cur, job, json.dumps(ids))
        for _ in range(_UNIQUE_TRIES):
            cur.execute(_SQLITE_INSERT, _sqlite_args(job))
            row = cur.fetchone()
            if row is not None:
                return _id(row)
            cur.execute(_SQLITE_PENDING, (job.unique_key,))
            row = cur.fetchone()
            if row is not None:
                return _id(row)
        raise RuntimeError(f"unique key {job.unique_key!r} keeps changing hands; try again")
    finally:
        cur.close()


def _sqlite_waiting(cur: Any, job: Job, ids: str) -> int:
    """SQLite: enqueues a job that waits for the jobs `ids` (a JSON array; no unique key)."""
    cur.execute(_SQLITE_UNKNOWN, (ids,))
    unknown = cur.fetchone()
    if unknown is not None:
        raise ValueError(
            f"rowclaim_enqueue: waits for job {unknown[0]}, which does not exist (never "
            "enqueued, deleted, or pruned after it finished); leave it out of after"
        )
    cur.execute(_SQLITE_INSERT, _sqlite_args(job))
    job_id = _id(cur.fetchone())
    cur.execute(_SQLITE_EDGES, (job_id, ids))
    cur.execute(_SQLITE_WAITING, (job_id,))
    if job.run_anyway:
        cur.execute(_SQLITE_RUN_ANYWAY, (job_id,))
    else:
        cur.execute(_SQLITE_CANCEL, (job_id,))
    return job_id


def _id(row: Optional[Sequence[Any]]) -> int:
    if row is None or row[0] is None:
        raise RuntimeError("rowclaim_enqueue returned no id (is the database initialised?)")
    return int(row[0])


def _jobs(payload: Any, options: Dict[str, Any]) -> Job:
    return Job(payload, **options)


def enqueue(conn: Any, payload: Any = None, **options: Any) -> int:
    """Enqueues one job on ``conn`` (psycopg 3, PyMySQL, mysqlclient or sqlite3), in the
    transaction it has open, and returns the job's id. It exists once the caller commits.

    The options are those of :class:`rowclaim.Job`: ``queue``, ``kind``, ``priority``,
    ``run_at`` or ``delay``, ``max_attempts``, ``unique_key``, ``limit_key``, ``timeout``,
    ``after`` (ids of jobs it waits for) and ``run_anyway``.
    With a unique key that a ready or running job has already, returns that job's id.
    """
    return _one(conn, _jobs(payload, options))


def enqueue_many(conn: Any, jobs: Iterable[Job]) -> List[int]:
    """Enqueues each job (see :func:`enqueue`) in the caller's transaction; their ids, in
    order."""
    return [_one(conn, job) for job in jobs]


async def _one_async(conn: Any, job: Job) -> int:
    job.check()
    if not _is_async(conn) or "psycopg" not in _modules(conn):
        raise TypeError(
            f"rowclaim.enqueue_async takes a psycopg AsyncConnection, "
            f"not {type(conn).__module__}.{type(conn).__name__}"
        )
    async with conn.cursor() as cur:
        await cur.execute(_POSTGRES, _postgres_args(job))
        return _id(await cur.fetchone())


async def enqueue_async(conn: Any, payload: Any = None, **options: Any) -> int:
    """:func:`enqueue` on a psycopg ``AsyncConnection``."""
    return await _one_async(conn, _jobs(payload, options))


async def enqueue_many_async(conn: Any, jobs: Iterable[Job]) -> List[int]:
    """:func:`enqueue_many` on a psycopg ``AsyncConnection``."""
    return [await _one_async(conn, job) for job in jobs]
