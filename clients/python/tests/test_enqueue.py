"""rowclaim.enqueue on PostgreSQL, MariaDB and SQLite: inside the caller's transaction (a
rollback leaves no job, a commit gives one that `rowclaim work` runs, here with the example
Python handler), every option, unique keys and delays as rowclaim's Rust API has them."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

import rowclaim
from conftest import EXAMPLES, Database

HANDLER = str(EXAMPLES / "handler.py")


def work(db: Database, queue: str) -> None:
    """Runs the example handler on every due job of `queue`, then returns."""
    db.rowclaim("work", "--queue", queue, "--until-empty", "--", sys.executable, HANDLER)


def output_text(db: Database) -> str:
    return "output::text" if db.backend == "postgres" else "output"


def test_rollback_leaves_no_job(db: Database) -> None:
    conn = db.connect()
    job = rowclaim.enqueue(conn, {"to": "ada"}, queue="mail")
    assert job > 0
    conn.rollback()
    conn.close()
    assert db.count("SELECT COUNT(*) FROM rowclaim_jobs") == 0


def test_committed_job_is_run_by_the_python_handler(db: Database) -> None:
    conn = db.connect()
    job = rowclaim.enqueue(conn, {"to": "ada"}, queue="mail", kind="welcome")
    # Not there for anyone else until the commit.
    assert db.count("SELECT COUNT(*) FROM rowclaim_jobs") == 0
    conn.commit()
    conn.close()
    work(db, "mail")
    rows = db.rows(f"SELECT id, status, {output_text(db)} FROM rowclaim_jobs")
    assert [(r[0], r[1]) for r in rows] == [(job, "completed")]
    assert json.loads(rows[0][2]) == {"sent_to": "ada", "job": job, "attempt": 1}


def run_at_ms(db: Database) -> str:
    """run_at in epoch milliseconds, and its distance from created_at."""
    if db.backend == "postgres":
        return ("(extract(epoch FROM run_at) * 1000)::bigint, "
                "(extract(epoch FROM run_at - created_at) * 1000)::bigint")
    if db.backend == "mysql":
        return ("TIMESTAMPDIFF(MICROSECOND, '1970-01-01', run_at) DIV 1000, "
                "TIMESTAMPDIFF(MICROSECOND, created_at, run_at) DIV 1000")
    return "run_at, run_at - created_at"


def test_every_option(db: Database) -> None:
    conn = db.connect()
    delayed = rowclaim.enqueue(
        conn, {"to": "ada"}, queue="mail", kind="welcome", priority=5,
        delay=timedelta(minutes=10), max_attempts=3, unique_key="welcome:ada",
        limit_key="ada", timeout=30,
    )
    at = datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
    later = rowclaim.enqueue(conn, [1, 2], queue="mail", run_at=at)
    plain = rowclaim.enqueue(conn)
    conn.commit()
    conn.close()
    columns = (f"id, queue, kind, priority, max_attempts, unique_key, limit_key, timeout_ms, "
               f"status, attempts, {run_at_ms(db)} FROM rowclaim_jobs ORDER BY id")
    rows = db.rows(f"SELECT {columns}")
    assert [tuple(r[:10]) for r in rows] == [
        (delayed, "mail", "welcome", 5, 3, "welcome:ada", "ada", 30000, "ready", 0),
        (later, "mail", "", 0, 25, None, None, None, "ready", 0),
        (plain, "default", "", 0, 25, None, None, None, "ready", 0),
    ]
    assert rows[0][11] == 600_000
    assert rows[1][10] == int(at.timestamp() * 1000)
    assert rows[2][11] == 0
    payloads = db.rows("SELECT payload FROM rowclaim_jobs ORDER BY id")
    loaded = [json.loads(p[0]) if isinstance(p[0], str) else p[0] for p in payloads]
    assert loaded == [{"to": "ada"}, [1, 2], {}]


def test_unique_key_answers_the_pending_job(db: Database) -> None:
    conn = db.connect()
    first = rowclaim.enqueue(conn, {"to": "ada"}, queue="mail", unique_key="welcome:ada")
    again = rowclaim.enqueue(conn, {"to": "bob"}, queue="mail", unique_key="welcome:ada")
    assert again == first
    conn.commit()
    # Committed and pending, from another transaction too.
    other = db.connect()
    assert rowclaim.enqueue(other, {"to": "cy"}, queue="mail", unique_key="welcome:ada") == first
    other.commit()
    other.close()
    assert db.count("SELECT COUNT(*) FROM rowclaim_jobs") == 1
    work(db, "mail")
    # Once it completed, the key is free again.
    fresh = rowclaim.enqueue(conn, {"to": "ada"}, queue="mail", unique_key="welcome:ada")
    conn.commit()
    conn.close()
    assert fresh != first
    assert db.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'ready'") == 1


def test_a_delayed_job_waits(db: Database) -> None:
    conn = db.connect()
    later = rowclaim.enqueue(conn, {"to": "later"}, queue="mail", delay=3600)
    now = rowclaim.enqueue(conn, {"to": "now"}, queue="mail")
    conn.commit()
    conn.close()
    work(db, "mail")
    rows = db.rows("SELECT id, status, attempts FROM rowclaim_jobs ORDER BY id")
    assert [tuple(r) for r in rows] == [(later, "ready", 0), (now, "completed", 1)]


def test_enqueue_many(db: Database) -> None:
    conn = db.connect()
    jobs = [rowclaim.Job({"to": f"n{i}"}, queue="bulk", priority=i) for i in range(3)]
    ids = rowclaim.enqueue_many(conn, jobs)
    conn.commit()
    conn.close()
    assert len(set(ids)) == 3 and ids == sorted(ids)
    rows = db.rows("SELECT id, priority FROM rowclaim_jobs ORDER BY id")
    assert [tuple(r) for r in rows] == list(zip(ids, range(3)))


BAD_OPTIONS = [
    ({"max_attempts": 0}, "max_attempts must be at least 1"),
    ({"queue": ""}, "queue name must have 1 to 255 characters"),
    ({"limit_key": ""}, "limit_key must have 1 to 255 characters"),
    ({"run_at": datetime(2030, 1, 1)}, "run_at must be timezone-aware"),
    ({"delay": -1}, "delay must not be negative"),
    ({"timeout": 0}, "timeout must be at least one millisecond"),
]


def test_bad_options_are_refused(db: Database) -> None:
    conn = db.connect()
    for options, says in BAD_OPTIONS:
        with pytest.raises(ValueError, match=says):
            rowclaim.enqueue(conn, {}, **options)
    with pytest.raises(TypeError):
        rowclaim.enqueue(conn, {}, queu="mail")
    conn.rollback()
    conn.close()
    assert db.count("SELECT COUNT(*) FROM rowclaim_jobs") == 0


def test_the_database_checks_too(routine_db: Database) -> None:
    """The routine refuses what the client would have: a caller of the SQL is held to it."""
    db = routine_db
    conn = db.connect()
    cur = conn.cursor()
    with pytest.raises(Exception, match="max_attempts must be at least 1, not 0"):
        if db.backend == "postgres":
            cur.execute("SELECT rowclaim_enqueue(max_attempts => 0)")
        else:
            cur.execute("CALL rowclaim_enqueue('{}', '{\"max_attempts\": 0}')")
    conn.rollback()
    conn.close()


def test_async_psycopg(pg_db: Database) -> None:
    db = pg_db

    async def enqueue_twice() -> list:
        conn = await psycopg.AsyncConnection.connect(db.url)
        await rowclaim.enqueue_async(conn, {"to": "gone"}, queue="mail")
        await conn.rollback()
        ids = await rowclaim.enqueue_many_async(
            conn, [rowclaim.Job({"to": "ada"}, queue="mail"), rowclaim.Job({"to": "bob"})])
        await conn.commit()
        await conn.close()
        return ids

    ids = asyncio.run(enqueue_twice())
    rows = db.rows("SELECT id, queue FROM rowclaim_jobs ORDER BY id")
    assert [tuple(r) for r in rows] == [(ids[0], "mail"), (ids[1], "default")]
    with pytest.raises(TypeError, match="enqueue_async"):
        asyncio.run(_sync_on_async(db.url))


async def _sync_on_async(url: str) -> None:
    conn = await psycopg.AsyncConnection.connect(url)
    try:
        rowclaim.enqueue(conn, {})
    finally:
        await conn.close()


def test_listening_workers_are_woken_at_the_commit(pg_db: Database) -> None:
    """PostgreSQL: a worker's LISTEN hears of a committed job's queue, not of a rolled-back one."""
    listener = psycopg.connect(pg_db.url, autocommit=True)
    listener.execute("LISTEN rowclaim_jobs")
    conn = pg_db.connect()
    rowclaim.enqueue(conn, {}, queue="gone")
    conn.rollback()
    rowclaim.enqueue(conn, {}, queue="mail")
    conn.commit()
    conn.close()
    heard = [n.payload for n in listener.notifies(timeout=30, stop_after=1)]
    listener.close()
    assert heard == ["mail"]


def test_a_unique_key_enqueued_at_once_in_two_transactions(db: Database) -> None:
    """The second enqueue waits for the first transaction; once it commits, it answers its job
    (MySQL: read past the second transaction's own, older snapshot)."""
    first = db.connect()
    mine = rowclaim.enqueue(first, {"n": 1}, queue="mail", unique_key="twin")
    begun = threading.Event()
    answer: list = []

    def racer() -> None:
        second = db.connect()  # its own thread's (sqlite3 wants that)
        if db.backend == "mysql":
            # A snapshot taken before the first commits: the twin is not in it.
            second.cursor().execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        begun.set()
        try:
            answer.append(rowclaim.enqueue(second, {"n": 2}, queue="mail", unique_key="twin"))
            second.commit()
        except Exception as e:  # reported by the assertion below; its locks go with it
            answer.append(e)
            second.rollback()
        finally:
            second.close()

    thread = threading.Thread(target=racer)
    thread.start()
    assert begun.wait(timeout=60)
    thread.join(timeout=0.5)  # it waits for the first transaction
    first.commit()
    first.close()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert answer == [mine]
    assert db.count("SELECT COUNT(*) FROM rowclaim_jobs") == 1
