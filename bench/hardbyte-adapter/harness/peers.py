"""Native launchers for the harness's peer adapters that install from a package registry, so
that they run beside rowclaim without Docker (run_bench.py loads this when PEERS_NATIVE is
set, e.g. PEERS_NATIVE=procrastinate).

- procrastinate: the harness's procrastinate-bench/main.py, run by a Python 3.12 venv with the
  versions its pyproject.toml pins (PROCRASTINATE_PYTHON, default
  /work/hb-venv-procrastinate/bin/python; `pip install procrastinate==3.8.1
  'psycopg[binary]==3.3.3'`).
- pgboss: the harness's pgboss-bench/main.js after `npm ci` there (pg-boss 12.18.2, which asks
  for Node >= 22.12).
- pgmq: the harness's pgmq-bench/main.py, by a venv with its pinned `psycopg[binary]==3.3.3`
  (PGMQ_PYTHON, default: the procrastinate venv, which has it). Its adapter.json declares the
  `pgmq` extension, which the server must offer: PGMQ 1.11.1 is pure SQL, and its `pgmq.control`
  and `pgmq.sql` (shipped in the `pgmq` crate's `install-sql-embedded` feature) installed as
  `pgmq--1.11.1.sql` in the server's extension directory make `CREATE EXTENSION pgmq` work, as
  PGMQ's own `make install` does (see README.md: a private copy of the PostgreSQL 15 tree).
"""
from __future__ import annotations

import os

from bench_harness import adapters

DIR = adapters.SCRIPT_DIR


def _no_build(skip: bool) -> None:
    return None


def _procrastinate(manifest, overrides):
    python = os.environ.get("PROCRASTINATE_PYTHON", "/work/hb-venv-procrastinate/bin/python")
    return adapters.LaunchSpec(
        argv=[python, "main.py"],
        env=adapters._base_env(manifest, overrides),
        cwd=str(DIR / "procrastinate-bench"),
    )


def _pgboss(manifest, overrides):
    return adapters.LaunchSpec(
        argv=["node", "main.js"],
        env=adapters._base_env(manifest, overrides),
        cwd=str(DIR / "pgboss-bench"),
    )


def _pgmq(manifest, overrides):
    python = os.environ.get(
        "PGMQ_PYTHON",
        os.environ.get("PROCRASTINATE_PYTHON", "/work/hb-venv-procrastinate/bin/python"),
    )
    return adapters.LaunchSpec(
        argv=[python, "main.py"],
        env=adapters._base_env(manifest, overrides),
        cwd=str(DIR / "pgmq-bench"),
    )


LAUNCHERS = {"procrastinate": _procrastinate, "pgboss": _pgboss, "pgmq": _pgmq}


def register(names: list[str]) -> None:
    for name in names:
        name = name.strip()
        if not name:
            continue
        entry = adapters.ADAPTERS[name]
        adapters.ADAPTERS[name] = adapters.AdapterEntry(
            bench_dir=entry.bench_dir, builder=_no_build, launcher=LAUNCHERS[name]
        )
