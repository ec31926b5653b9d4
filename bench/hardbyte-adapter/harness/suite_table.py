#!/usr/bin/env python3
"""Markdown tables of a run_suite.sh run, from the harness's own summary.json of each cell,
in the shape of the harness's 2026-05-09 SUMMARY.md: peak throughput (phase A), recovery /
baseline completion-rate ratio with jobs_lost and chaos_recovery_time_s (phase B), stress /
clean completion-rate ratio and the cell's exit code (phase C).

    python suite_table.py $HARNESS_DIR/results/rowclaim-suite/run_index.tsv
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

STRESS = {"idle_in_tx": "idle_1", "sustained_high_load": "pressure_1",
          "active_readers": "readers_1", "event_burst": "pressure_1"}
CHAOS_PHASE = {"chaos_postgres_restart": "restart", "chaos_pg_backend_kill": "kills",
               "chaos_pool_exhaustion": "exhaustion", "chaos_crash_recovery": "kill",
               "chaos_repeated_kills": "repeated"}


def median(phases: dict, label: str, metric: str) -> float | None:
    m = phases.get(label, {}).get("metrics", {}).get(metric)
    return m["median"] if m else None


def fmt(v: float | None, pattern: str = "{:,.0f}") -> str:
    return "—" if v is None else pattern.format(v)


def main(index: Path) -> None:
    rows = list(csv.DictReader(index.open(), delimiter="\t"))
    print("| cell | system | rc | result | detail | load before |")
    print("|---|---|---:|---|---|---|")
    for r in rows:
        summary = Path(r["run_dir"] or "/nonexistent") / "summary.json"
        if not summary.exists():
            print(f"| {r['cell']} | {r['systems']} | {r['rc']} | no summary | | {r['load_before']} |")
            continue
        s = json.loads(summary.read_text())
        for system, block in s["systems"].items():
            ph = block["phases"]
            if r["phase"] == "A":
                rate = median(ph, "clean", "completion_rate")
                peak = ph.get("clean", {}).get("metrics", {}).get("completion_rate", {}).get("peak")
                p99 = median(ph, "clean", "claim_p99_ms")
                result = f"{fmt(rate)} jobs/s median (peak {fmt(peak)})"
                detail = f"claim p50/p99 {fmt(median(ph, 'clean', 'claim_p50_ms'), '{:.0f}')}/{fmt(p99, '{:.0f}')} ms"
            elif r["phase"] == "B":
                base = median(ph, "baseline", "completion_rate")
                rec = median(ph, "recovery", "completion_rate")
                chaos = median(ph, CHAOS_PHASE.get(r["cell"], ""), "completion_rate")
                agg = ph.get("recovery", {})
                ratio = rec / base if rec is not None and base else None
                result = f"recovery/baseline {fmt(ratio and ratio * 100, '{:.0f}')} %"
                detail = (f"baseline {fmt(base)}/s, during chaos {fmt(chaos)}/s, recovery {fmt(rec)}/s; "
                          f"jobs_lost {fmt(agg.get('jobs_lost'))}, "
                          f"chaos_recovery_time_s {fmt(agg.get('chaos_recovery_time_s'), '{:.0f}')}")
            else:
                clean = median(ph, "clean_1", "completion_rate")
                stress = median(ph, STRESS.get(r["cell"], ""), "completion_rate")
                rec = median(ph, "recovery_1", "completion_rate")
                ratio = stress / clean if stress is not None and clean else None
                depth = ph.get("recovery_1", {}).get("metrics", {}).get("queue_depth", {})
                result = f"stress/clean {fmt(ratio and ratio * 100, '{:.0f}')} %"
                detail = (f"clean {fmt(clean)}/s, stress {fmt(stress)}/s, recovery {fmt(rec)}/s; "
                          f"claim p99 in stress {fmt(median(ph, STRESS.get(r['cell'], ''), 'claim_p99_ms'), '{:.0f}')} ms; "
                          f"depth in recovery median {fmt(depth.get('median'))}")
            print(f"| {r['cell']} | {system} | {r['rc']} | {result} | {detail} | {r['load_before']} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
