"""Jobs that wait (``after``, ``run_anyway``) on PostgreSQL, MariaDB and SQLite: a job enqueued
waiting runs once the job it waits for completed; one waiting for a dead job is cancelled,
naming it, unless it runs anyway; an unknown id is refused, naming it, and leaves no job. The
same through psycopg's ``AsyncConnection``."""

from __future__ import annotations

import asyncio
import sys
from typing import Tuple

import psycopg
import pytest

import rowclaim
from conftest import EXAMPLES, Database

HANDLER = str(EXAMPLES / "handler.py")


def work(db: Database, queue: str) -> None:
    db.rowclaim("work", "--queue", queue, "--until-empty", "--", sys.executable, HANDLER)


def status(db: Database, job: int) -> str:
    return str(db.rows(f"SELECT status FROM rowclaim_jobs WHERE id = {job}")[0][0])


def test_a_waiting_job_runs_after_the_job_it_waits_for(db: Database) -> None:
    conn = db.connect()
    first = rowclaim.enqueue(conn, {"to": "first"}, queue="mail")
    second, third = rowclaim.enqueue_many(conn, [
        rowclaim.Job({"to": "second"}, queue="mail", after=[first, first]),
        rowclaim.Job({"to": "third"}, queue="mail", after=[first], run_anyway=True),
    ])
    conn.commit()
    conn.close()
    assert [status(db, j) for j in (first, second, third)] == ["ready", "waiting", "waiting"]
    assert db.count(f"SELECT COUNT(*) FROM rowclaim_waits WHERE job = {second}") == 1
    assert db.rows(f"SELECT if_failed FROM rowclaim_jobs WHERE id = {third}") == [("run",)]
    # The worker releases them once the first completed; --until-empty runs them too.
    work(db, "mail")
    assert [status(db, j) for j in (first, second, third)] == ["completed"] * 3


def test_a_dead_job_cancels_its_waiter_unless_it_runs_anyway(db: Database) -> None:
    conn = db.connect()
    # No recipient: the example handler fails it, and with one attempt it is dead.
    doomed = rowclaim.enqueue(conn, {}, queue="doomed", max_attempts=1)
    conn.commit()
    failed = db.rowclaim("work", "--queue", "doomed", "--until-empty", "--", sys.executable,
                         HANDLER, check=False)
    assert failed.returncode != 0, failed.stderr
    assert status(db, doomed) == "dead"
    cancelled = rowclaim.enqueue(conn, {"to": "x"}, queue="mail", after=[doomed])
    anyway = rowclaim.enqueue(conn, {"to": "y"}, queue="mail", after=[doomed], run_anyway=True)
    conn.commit()
    conn.close()
    rows = db.rows(f"SELECT status, last_error FROM rowclaim_jobs WHERE id = {cancelled}")
    assert rows == [("cancelled", f"cancelled: job {doomed}, which it waited for, ended dead")]
    assert db.count(
        f"SELECT COUNT(*) FROM rowclaim_jobs WHERE id = {cancelled} AND finished_at IS NOT NULL"
    ) == 1
    assert status(db, anyway) == "ready"
    work(db, "mail")
    assert status(db, anyway) == "completed"
    assert status(db, cancelled) == "cancelled"


def test_an_unknown_job_is_refused(db: Database) -> None:
    conn = db.connect()
    known = rowclaim.enqueue(conn, {"to": "a"}, queue="mail")
    with pytest.raises(Exception, match="waits for job 987654, which does not exist"):
        rowclaim.enqueue(conn, {"to": "b"}, queue="mail", after=[known, 987654])
    conn.rollback()
    conn.close()
    assert db.count("SELECT COUNT(*) FROM rowclaim_jobs") == 0


def test_bad_after_options_are_refused(db: Database) -> None:
    conn = db.connect()
    for options, says in [
        ({"after": [1], "unique_key": "k"}, "cannot have a unique key"),
        ({"after": ["1"]}, "job ids"),
        ({"after": "1"}, "not a string"),
        ({"after": [1], "run_anyway": 1}, "True or False"),
    ]:
        with pytest.raises(ValueError, match=says):
            rowclaim.enqueue(conn, {}, **options)
    conn.close()


def test_async_psycopg_after_and_run_anyway(pg_db: Database) -> None:
    """``enqueue_async`` / ``enqueue_many_async`` with ``after`` and ``run_anyway``: the jobs
    wait; a cancel of one they wait for cancels the one that does not run anyway, naming it,
    and the other runs once the rest completed; an unknown id is refused, naming it."""
    db = pg_db

    async def enqueue() -> Tuple[int, int, int, int]:
        conn = await psycopg.AsyncConnection.connect(db.url)
        try:
            first = await rowclaim.enqueue_async(conn, {"to": "first"}, queue="mail")
            doomed = await rowclaim.enqueue_async(conn, {"to": "doomed"}, queue="held")
            waits, anyway = await rowclaim.enqueue_many_async(conn, [
                rowclaim.Job({"to": "w"}, queue="mail", after=[first, doomed]),
                rowclaim.Job({"to": "a"}, queue="mail", after=[doomed, first], run_anyway=True),
            ])
            await conn.commit()
            with pytest.raises(Exception, match="waits for job 987654, which does not exist"):
                await rowclaim.enqueue_async(conn, {"to": "x"}, queue="mail", after=[987654])
            await conn.rollback()
        finally:
            await conn.close()
        return first, doomed, waits, anyway

    first, doomed, waits, anyway = asyncio.run(enqueue())
    assert [status(db, j) for j in (first, doomed, waits, anyway)] == [
        "ready", "ready", "waiting", "waiting"]
    assert db.count("SELECT COUNT(*) FROM rowclaim_jobs") == 4, "the refused job left nothing"
    assert db.count(f"SELECT COUNT(*) FROM rowclaim_waits WHERE job = {anyway}") == 2
    assert db.rows(f"SELECT if_failed FROM rowclaim_jobs WHERE id IN ({waits}, {anyway}) "
                   "ORDER BY id") == [(None,), ("run",)]
    db.rowclaim("jobs", "cancel", str(doomed))
    rows = db.rows(f"SELECT status, last_error FROM rowclaim_jobs WHERE id = {waits}")
    assert rows == [("cancelled", f"cancelled: job {doomed}, which it waited for, was cancelled")]
    assert status(db, anyway) == "waiting", "it still waits for the first job"
    work(db, "mail")
    assert [status(db, j) for j in (first, waits, anyway)] == [
        "completed", "cancelled", "completed"]
