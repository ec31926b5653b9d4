"""Native launchers for the harness's peer adapters that install from a package registry, so
that they run beside rowclaim without Docker (run_bench.py loads this when PEERS_NATIVE is
set, e.g. PEERS_NATIVE=procrastinate).

- procrastinate: the harness's procrastinate-bench/main.py, run by a Python 3.12 venv with the
  versions its pyproject.toml pins (PROCRASTINATE_PYTHON, default
  /work/hb-venv-procrastinate/bin/python; `pip install procrastinate==3.8.1
  'psycopg[binary]==3.3.3'`).
- pgboss: the harness's pgboss-bench/main.js after `npm ci` there (pg-boss 12.18.2, which asks
  for Node >= 22.12).
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


LAUNCHERS = {"procrastinate": _procrastinate, "pgboss": _pgboss}


def register(names: list[str]) -> None:
    for name in names:
        name = name.strip()
        if not name:
            continue
        entry = adapters.ADAPTERS[name]
        adapters.ADAPTERS[name] = adapters.AdapterEntry(
            bench_dir=entry.bench_dir, builder=_no_build, launcher=LAUNCHERS[name]
        )
