"""A fresh database per test on the servers scripts/test gives (ROWCLAIM_TEST_POSTGRES,
ROWCLAIM_TEST_MYSQL; a file for SQLite), initialised by the real `rowclaim init`. A server
that is not given fails the test: nothing here is skipped."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import uuid
from pathlib import Path
from typing import Any, Iterator, List, Optional
from urllib.parse import unquote, urlsplit, urlunsplit

import pymysql
import psycopg
import pytest

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def rowclaim_bin() -> str:
    given = os.environ.get("ROWCLAIM_BIN")
    if given:
        return given
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return str(target / "debug" / "rowclaim")


def server_url(var: str) -> str:
    url = os.environ.get(var)
    if not url:
        pytest.fail(f"{var} is not set: run these tests through scripts/test, or set it")
    return url


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, ""))


def mysql_connect(url: str, **kw: Any) -> Any:
    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        database=parts.path.lstrip("/") or None,
        **kw,
    )


class Database:
    """One test's database: its URL, new connections to it, and rowclaim run on it."""

    def __init__(self, backend: str, url: str) -> None:
        self.backend = backend
        self.url = url

    def connect(self) -> Any:
        if self.backend == "postgres":
            return psycopg.connect(self.url)
        if self.backend == "mysql":
            return mysql_connect(self.url)
        return sqlite3.connect(self.url[len("sqlite://"):], timeout=30)

    def rows(self, sql: str) -> List[tuple]:
        """`sql`'s rows, read on a connection of its own (what other transactions see)."""
        conn = self.connect()
        try:
            cur = conn.cursor()
            cur.execute(sql)
            return list(cur.fetchall())
        finally:
            conn.close()

    def count(self, sql: str) -> int:
        return int(self.rows(sql)[0][0])

    def rowclaim(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess:
        """Runs rowclaim on this database; unless `check` is False, it must exit 0."""
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ROWCLAIM_LOG")}
        done = subprocess.run(
            [rowclaim_bin(), "--database", self.url, *args],
            env=env, capture_output=True, text=True, timeout=timeout,
        )
        assert done.returncode == 0 or not check, f"rowclaim {args}: {done.stderr}"
        return done


@pytest.fixture(params=["postgres", "mysql", "sqlite"])
def db(request: Any, tmp_path: Path) -> Iterator[Database]:
    """A database of each kind."""
    yield from fresh(request.param, tmp_path)


@pytest.fixture(params=["postgres", "mysql"])
def routine_db(request: Any, tmp_path: Path) -> Iterator[Database]:
    """A database of each kind with an enqueue routine (SQLite's contract is an INSERT)."""
    yield from fresh(request.param, tmp_path)


@pytest.fixture
def pg_db(tmp_path: Path) -> Iterator[Database]:
    """A PostgreSQL database (psycopg's async connection)."""
    yield from fresh("postgres", tmp_path)


def fresh(backend: str, tmp_path: Path) -> Iterator[Database]:
    """A new database on `backend`'s test server, initialised, dropped afterwards."""
    name = f"rowclaim_py_{uuid.uuid4().hex}"
    admin: Optional[Any] = None
    if backend == "postgres":
        root = server_url("ROWCLAIM_TEST_POSTGRES")
        admin = psycopg.connect(root, autocommit=True)
        admin.execute(f"CREATE DATABASE {name}")
        url = with_database(root, name)
    elif backend == "mysql":
        root = server_url("ROWCLAIM_TEST_MYSQL")
        admin = mysql_connect(root, autocommit=True)
        admin.cursor().execute(f"CREATE DATABASE {name}")
        url = with_database(root, name)
    else:
        url = f"sqlite://{tmp_path / 'jobs.db'}"
    d = Database(backend, url)
    try:
        d.rowclaim("init")
        yield d
    finally:
        if backend == "postgres" and admin is not None:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.close()
        elif backend == "mysql" and admin is not None:
            admin.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
            admin.close()
