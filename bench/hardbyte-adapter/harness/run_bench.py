#!/usr/bin/env python3
"""Run hardbyte/postgresql-job-queue-benchmarking with rowclaim, without Docker.

The harness (`bench.py run ...`) starts, stops and restarts PostgreSQL with Docker Compose.
This wrapper imports the harness unchanged and swaps those five steps for `pg_ctl` on a
private cluster, then registers the rowclaim adapter beside the harness's own, and hands the
command line to the harness's own `main`. Everything else (phases, chaos hooks, metrics
daemon, summary, plots, report) is the harness's.

    Docker Compose step (orchestrator.py)   here
    start_postgres        compose up        initdb (first time) + pg_ctl start -w, SELECT 1
    stop_postgres         compose down -v   pg_ctl stop -m fast, data directory removed
    _compose_stop_postgres  compose stop    pg_ctl stop -m fast (the image's STOPSIGNAL is SIGINT)
    _compose_start_postgres compose start   pg_ctl start -w, SELECT 1
    _restart_postgres     stop + start      the two above

The cluster uses the harness's own postgres.conf (included), with the port, the listen address
and the socket directory overridden. PostgreSQL refuses to run as root, so as root the server
runs as the `postgres` OS user.

Environment: HARNESS_DIR (the harness checkout; default /work/hb-harness), PG_BIN (default
/usr/lib/postgresql/15/bin), PG_PORT (default 55432; 5432 is refused), PG_DATA (default
/work/hb-pgdata), ROWCLAIM_ADAPTER_DIR (default: the directory above this file), PEERS_NATIVE
(comma-separated peers to launch natively; see peers.py).

Usage: python run_bench.py run --systems rowclaim --scenario chaos_postgres_restart ...
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ADAPTER_DIR = Path(os.environ.get("ROWCLAIM_ADAPTER_DIR", HERE.parent))
HARNESS_DIR = Path(os.environ.get("HARNESS_DIR", "/work/hb-harness"))
PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_PORT = int(os.environ.get("PG_PORT", "55432"))
PG_DATA = Path(os.environ.get("PG_DATA", "/work/hb-pgdata"))

if PG_PORT == 5432:
    sys.exit("PG_PORT=5432 is the shared server's port: choose a private one")

sys.path.insert(0, str(HARNESS_DIR))
from bench_harness import adapters, orchestrator  # noqa: E402

adapters.PG_PORT = PG_PORT  # pg_url() reads it at call time


def _as_postgres() -> dict:
    """subprocess arguments to run as the postgres OS user when we are root."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": pwd.getpwnam("postgres").pw_gid}


def _pg(program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    argv = [str(PG_BIN / program), *args]
    print(f"[pgctl] $ {' '.join(argv)}", file=sys.stderr)
    env = {k: v for k, v in os.environ.items() if k not in ("PGDATA", "PGPORT")}
    return subprocess.run(argv, check=check, env=env, cwd="/", **_as_postgres())


def _initdb() -> None:
    PG_DATA.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(PG_DATA, "postgres", "postgres")
    _pg("initdb", "-D", str(PG_DATA), "-U", "bench", "-A", "trust", "-E", "UTF8",
        "--no-locale", "--no-instructions")
    conf = PG_DATA / "postgresql.conf"
    with conf.open("a") as fh:
        fh.write(f"\n# hardbyte harness settings, then this private cluster's own\n"
                 f"include '{HARNESS_DIR / 'postgres.conf'}'\n"
                 f"port = {PG_PORT}\n"
                 "listen_addresses = '127.0.0.1'\n"
                 "unix_socket_directories = ''\n")


def _wait_ready(what: str) -> None:
    import psycopg

    last: Exception | None = None
    for _ in range(60):
        try:
            with psycopg.connect(adapters.pg_url("postgres"), autocommit=True) as conn:
                conn.execute("SELECT 1").fetchone()
            return
        except psycopg.Error as exc:
            last = exc
            time.sleep(0.5)
    raise RuntimeError(f"private PostgreSQL not query-ready after {what}: {last}")


def _running() -> bool:
    return (PG_DATA / "postmaster.pid").exists()


def start_postgres(pg_image: str) -> None:
    if not (PG_DATA / "PG_VERSION").exists():
        _initdb()
    if not _running():
        _pg("pg_ctl", "-D", str(PG_DATA), "-l", str(PG_DATA / "server.log"), "-w", "-t", "60",
            "start")
    _wait_ready("start")


def stop_postgres(pg_image: str) -> None:
    if os.environ.get("KEEP_DB"):
        print("[pgctl] KEEP_DB set — leaving postgres running for inspection", file=sys.stderr)
        return
    if _running():
        _pg("pg_ctl", "-D", str(PG_DATA), "-m", "fast", "-w", "stop", check=False)
    # `docker compose down -v` drops the volume: the next system starts on a fresh cluster.
    shutil.rmtree(PG_DATA, ignore_errors=True)


def compose_stop_postgres(pg_image: str) -> None:
    _pg("pg_ctl", "-D", str(PG_DATA), "-m", "fast", "-w", "stop", check=False)


def compose_start_postgres(pg_image: str) -> None:
    _pg("pg_ctl", "-D", str(PG_DATA), "-l", str(PG_DATA / "server.log"), "-w", "-t", "60",
        "start")
    _wait_ready("restart")


def restart_postgres(pg_image: str) -> None:
    compose_stop_postgres(pg_image)
    compose_start_postgres(pg_image)


orchestrator.start_postgres = start_postgres
orchestrator.stop_postgres = stop_postgres
orchestrator._compose_stop_postgres = compose_stop_postgres
orchestrator._compose_start_postgres = compose_start_postgres
orchestrator._restart_postgres = restart_postgres


# ─── the rowclaim adapter ───────────────────────────────────────────────


def build_rowclaim(skip: bool) -> None:
    if skip:
        return
    print("[harness] building rowclaim adapter (release)...", file=sys.stderr)
    subprocess.run(["cargo", "build", "--release"], cwd=str(ADAPTER_DIR), check=True)


def launch_rowclaim(manifest, overrides):
    target = adapters._cargo_target_dir(ADAPTER_DIR / "Cargo.toml")
    return adapters.LaunchSpec(
        argv=[str(target / "release" / "rowclaim-bench-adapter")],
        env=adapters._base_env(manifest, overrides),
    )


adapters.ADAPTERS["rowclaim"] = adapters.AdapterEntry(
    bench_dir=ADAPTER_DIR, builder=build_rowclaim, launcher=launch_rowclaim
)

if os.environ.get("PEERS_NATIVE"):
    sys.path.insert(0, str(HERE))
    import peers  # noqa: E402

    peers.register(os.environ["PEERS_NATIVE"].split(","))

if __name__ == "__main__":
    raise SystemExit(orchestrator.main(sys.argv[1:]))
