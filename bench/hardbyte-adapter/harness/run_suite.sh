#!/usr/bin/env bash
# The harness's three phases for rowclaim (and any native peers in SYSTEMS), cell by cell, as
# the harness's scripts/run_full_sweep.sh runs them, through run_bench.py (pg_ctl instead of
# Docker Compose). Each cell is its own `bench run`; results land in the harness's results/,
# and one line per cell in $OUT/run_index.tsv (with the machine's load before the cell).
#
#   HARNESS_DIR=/work/hb-harness PYTHON=/work/hb-venv/bin/python \
#     bash run_suite.sh [A] [B] [C]          (default: A B C)
#   SYSTEMS=rowclaim,pgboss PEERS_NATIVE=pgboss A_WORKERS=64 bash run_suite.sh A   (peers beside it)
#   CELLS=event_burst bash run_suite.sh C    (only the named cells, comma-separated)
#   A_TIMEOUT=30m: phase A's cell limit (default 15m, as the sweep; four systems at FULL=1 need more)
#
# Durations: phase B (chaos) uses the harness's named scenarios unchanged. Phases A and C are
# shortened for a 2-core machine (A: 20 s warmup + 60 s clean instead of 30 s + 180 s, at W=16
# and W=64; C: every phase of the sweep's shapes halved), unless FULL=1.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
HARNESS_DIR="${HARNESS_DIR:-/work/hb-harness}"
PYTHON="${PYTHON:-python3}"
SYSTEMS="${SYSTEMS:-rowclaim}"
OUT="${OUT:-$HARNESS_DIR/results/rowclaim-suite}"
mkdir -p "$OUT/logs"
INDEX="$OUT/run_index.tsv"
[[ -f $INDEX ]] || echo -e "phase\tcell\tsystems\trun_dir\trc\tstarted\tended\tload_before" > "$INDEX"
export HARNESS_DIR

cell() { # cell PHASE ID TIMEOUT ARGS...
  local phase=$1 id=$2 limit=$3; shift 3
  [[ -z ${CELLS:-} || ,$CELLS, == *,$id,* ]] || return 0
  local log="$OUT/logs/$id.log" started load rc run_dir
  started=$(date -u +%FT%TZ); load=$(uptime | sed 's/.*load average: //')
  echo "[$(date -u +%T)] START $id ($*)"
  timeout --signal=KILL "$limit" "$PYTHON" "$HERE/run_bench.py" run --systems "$SYSTEMS" "$@" > "$log" 2>&1
  rc=$?
  run_dir=$(grep -oE 'results at: .*' "$log" | tail -1 | sed 's/results at: //')
  echo -e "$phase\t$id\t$SYSTEMS\t$run_dir\t$rc\t$started\t$(date -u +%FT%TZ)\t$load" >> "$INDEX"
  echo "[$(date -u +%T)] END   $id rc=$rc $run_dir"
}

phase_a() {
  local p="--phase warmup=warmup:20s --phase clean=clean:60s"
  [[ ${FULL:-0} == 1 ]] && p="--phase warmup=warmup:30s --phase clean=clean:180s"
  for w in ${A_WORKERS:-16 64}; do
    # shellcheck disable=SC2086
    cell A "perf_w$w" "${A_TIMEOUT:-15m}" --producer-rate 50000 --producer-mode depth-target \
      --target-depth 4000 --worker-count "$w" $p
  done
}

phase_b() {
  for s in chaos_postgres_restart chaos_pg_backend_kill chaos_pool_exhaustion; do
    cell B "$s" 15m --scenario "$s" --producer-rate 600 --replicas 1
  done
  for s in chaos_crash_recovery chaos_repeated_kills; do
    cell B "$s" 15m --scenario "$s" --producer-rate 300 --replicas 2
  done
}

phase_c() {
  local w=15s c=30s s=120s r=90s r2=60s b=150s br=120s
  [[ ${FULL:-0} == 1 ]] && { w=30s c=60s s=240s r=180s r2=120s b=300s br=240s; }
  cell C idle_in_tx 15m --producer-rate 800 --worker-count 32 --phase warmup=warmup:$w \
    --phase clean_1=clean:$c --phase idle_1=idle-in-tx:$s --phase recovery_1=clean:$r
  cell C sustained_high_load 15m --producer-rate 800 --worker-count 32 --phase warmup=warmup:$w \
    --phase clean_1=clean:$c --phase pressure_1=high-load:$s --phase recovery_1=clean:$r2
  cell C active_readers 15m --producer-rate 800 --worker-count 32 --phase warmup=warmup:$w \
    --phase clean_1=clean:$c --phase readers_1=active-readers:$s --phase recovery_1=clean:$r2
  cell C event_burst 15m --producer-rate 1200 --worker-count 64 --phase warmup=warmup:$w \
    --phase clean_1=clean:$c --phase pressure_1=high-load:$b --phase recovery_1=clean:$br
}

for p in "${@:-A B C}"; do
  for one in $p; do
    case $one in
      A) phase_a ;; B) phase_b ;; C) phase_c ;;
      *) echo "unknown phase $one (A, B or C)"; exit 2 ;;
    esac
  done
done
