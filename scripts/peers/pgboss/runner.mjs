// pg-boss runner for scripts/bench-peers: its enqueue only.
//
//   node runner.mjs --url URL --jobs N [--batch B] [--out FILE]
//
// Installs pg-boss's schema (start() with supervision and scheduling off, so that no background
// maintenance runs beside the clock), creates the queue "bench" (default policy), then, on the
// clock, inserts N jobs with the payload {i: k} through boss.insert(name, jobs) in batches of B
// (default 10,000): pg-boss's bulk path, one statement per batch (json_to_recordset), ids not
// returned. Reports jobs per second, this process's CPU per job (process.cpuUsage) and the CPU
// per job of every `postgres` process on the machine (from /proc, before and after).
//
// Checks itself: exactly N jobs of "bench" in pgboss.job, in state created, their data.i the N
// distinct numbers 0 … N-1; otherwise it exits 1.
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { PgBoss } from "pg-boss";
import pg from "pg";

function parseArgs(argv) {
  const a = { jobs: 200000, batch: 10000 };
  for (let i = 0; i < argv.length; i += 2) {
    const k = argv[i];
    const v = argv[i + 1];
    if (v === undefined) throw new Error(`${k} needs a value`);
    if (k === "--url") a.url = v;
    else if (k === "--jobs") a.jobs = Number(v);
    else if (k === "--batch") a.batch = Number(v);
    else if (k === "--out") a.out = v;
    else throw new Error(`unknown argument ${k}`);
  }
  if (!a.url || !(a.jobs > 0) || !(a.batch > 0)) {
    throw new Error("usage: runner.mjs --url URL --jobs N [--batch B] [--out FILE]");
  }
  return a;
}

function fail(msg) {
  console.error(`pg-boss runner FAILED its own check: ${msg}`);
  process.exit(1);
}

const CLK_TCK = Number(execFileSync("getconf", ["CLK_TCK"]).toString().trim()) || 100;

/** Seconds of CPU of every `postgres` process, with what each reaped (utime+stime+cutime+cstime). */
function serverCpu() {
  let ticks = 0;
  let found = false;
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    let stat;
    try {
      stat = readFileSync(`/proc/${pid}/stat`, "latin1");
    } catch {
      continue;
    }
    const open = stat.indexOf("(");
    const close = stat.lastIndexOf(")");
    if (open < 0 || close < 0 || stat.slice(open + 1, close) !== "postgres") continue;
    const f = stat.slice(close + 2).trim().split(/\s+/);
    for (const n of [14, 15, 16, 17]) ticks += Number(f[n - 3]) || 0;
    found = true;
  }
  return found ? ticks / CLK_TCK : null;
}

function selfCpu() {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

const a = parseArgs(process.argv.slice(2));
const N = a.jobs;
const QUEUE = "bench";
const version = JSON.parse(readFileSync(
  new URL("./node_modules/pg-boss/package.json", import.meta.url), "utf8")).version;

// ---- Setup, before the clock ---------------------------------------------------------------
const boss = new PgBoss({ connectionString: a.url, supervise: false, schedule: false });
boss.on("error", (e) => console.error(`pg-boss error: ${e}`));
await boss.start();
await boss.createQueue(QUEUE);
const check = new pg.Client({ connectionString: a.url });
await check.connect();
await check.query("CHECKPOINT").catch(() => {});

// ---- The enqueue ------------------------------------------------------------------------------
const cpu0 = selfCpu();
const srv0 = serverCpu();
const t0 = performance.now();
for (let i = 0; i < N; i += a.batch) {
  const jobs = [];
  for (let k = i; k < Math.min(N, i + a.batch); k++) jobs.push({ data: { i: k } });
  await boss.insert(QUEUE, jobs);
}
const t1 = performance.now();
const cpu1 = selfCpu();
const srv1 = serverCpu();
await boss.stop({ graceful: false, wait: true });

// ---- The check --------------------------------------------------------------------------------
const r = (await check.query(
  `SELECT count(*)::int8 AS n, count(*) FILTER (WHERE state = 'created')::int8 AS created,
          count(DISTINCT (data->>'i')::int8)::int8 AS d,
          min((data->>'i')::int8) AS lo, max((data->>'i')::int8) AS hi
     FROM pgboss.job WHERE name = $1`, [QUEUE])).rows[0];
await check.end();
const [n, created, d, lo, hi] = [r.n, r.created, r.d, r.lo, r.hi].map(Number);
if (n !== N || created !== N || d !== N || lo !== 0 || hi !== N - 1) {
  fail(`${n} jobs after inserting ${N} (${created} created, ${d} distinct, i from ${lo} to ${hi})`);
}

const seconds = (t1 - t0) / 1000;
const report = {
  system: "pg-boss",
  version,
  node: process.version,
  mode: "enqueue",
  api: "insert",
  batch: a.batch,
  jobs: N,
  seconds,
  jobs_per_second: N / seconds,
  worker_cpu_us_per_job: ((cpu1 - cpu0) * 1e6) / N,
  server_cpu_us_per_job: srv0 === null || srv1 === null ? null : ((srv1 - srv0) * 1e6) / N,
  check: "passed",
};
const text = JSON.stringify(report, null, 2) + "\n";
if (a.out) writeFileSync(a.out, text);
else process.stdout.write(text);
process.exit(0);
