// graphile-worker runner for scripts/bench-peers.
//
//   node runner.mjs --url URL --jobs N --concurrency C --settings performance|defaults
//                   [--stats stale|fresh] [--mode drain|enqueue] [--out FILE]
//
// Installs graphile-worker's schema, adds N jobs of the task "noop" with addJobs in batches of
// 10,000 (before the clock), then CHECKPOINTs (--stats stale, the default: the planner knows
// what it knew before the jobs came) or runs VACUUM ANALYZE and then CHECKPOINT (--stats fresh),
// then runs one worker (run(), the long-running mode users deploy)
// with a task handler that does nothing but tick a counter for the check. The clock runs from
// run() to the end of runner.stop() after the N-th job, so that the last batched completions are
// written. Reports jobs per second, this process's CPU per job (process.cpuUsage) and the CPU
// per job of every `postgres` process on the machine (from /proc, before and after the drain).
//
// --settings performance: the batching options of graphile-worker's "Performance" page
//   (preset.worker: localQueue { size: 500 }, completeJobBatchDelay 0, failJobBatchDelay 0,
//   preparedStatements true, maxPoolSize max(10, C + 2)), concurrency C.
// --settings defaults: nothing set but concurrency C.
// Both run with NO_LOG_SUCCESS=1 (set by scripts/bench-peers, as graphile-worker's own perf test
// does): otherwise the default logger prints one line per completed job.
//
// --mode enqueue: only the enqueue, on the clock: the N addJobs calls (batches of 10,000, the
//   payload {i: k}) from the first to the last. Reports its jobs per second and the CPU per job of
//   this process and of the server over the same span, and checks that exactly N jobs of "noop"
//   are in graphile_worker._private_jobs with the N distinct payloads; no worker runs.
//
// Checks itself: the handler ran once for every job, no job failed, and no job is left in
// graphile_worker._private_jobs; otherwise it exits 1.
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { EventEmitter } from "node:events";
import { run, makeWorkerUtils } from "graphile-worker";
import pg from "pg";

function parseArgs(argv) {
  const a = { jobs: 200000, concurrency: 8, settings: "performance", stats: "stale", mode: "drain" };
  for (let i = 0; i < argv.length; i += 2) {
    const k = argv[i];
    const v = argv[i + 1];
    if (v === undefined) throw new Error(`${k} needs a value`);
    if (k === "--url") a.url = v;
    else if (k === "--jobs") a.jobs = Number(v);
    else if (k === "--concurrency") a.concurrency = Number(v);
    else if (k === "--settings") a.settings = v;
    else if (k === "--out") a.out = v;
    else if (k === "--stats") a.stats = v;
    else if (k === "--mode") a.mode = v;
    else throw new Error(`unknown argument ${k}`);
  }
  if (!a.url || !(a.jobs > 0) || !(a.concurrency > 0) ||
      !["performance", "defaults"].includes(a.settings) || !["stale", "fresh"].includes(a.stats) ||
      !["drain", "enqueue"].includes(a.mode)) {
    throw new Error("usage: runner.mjs --url URL --jobs N --concurrency C --settings performance|defaults [--stats stale|fresh] [--mode drain|enqueue] [--out FILE]");
  }
  return a;
}

function fail(msg) {
  console.error(`graphile-worker runner FAILED its own check: ${msg}`);
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
    // f[0] is field 3 (state); utime is field 14.
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
const C = a.concurrency;
const version = JSON.parse(readFileSync(
  new URL("./node_modules/graphile-worker/package.json", import.meta.url), "utf8")).version;

// ---- Setup, before the clock ---------------------------------------------------------------
const utils = await makeWorkerUtils({ connectionString: a.url });
await utils.migrate();
const check = new pg.Client({ connectionString: a.url });
await check.connect();
if (a.mode === "enqueue") await check.query("CHECKPOINT").catch(() => {});
const enqCpu0 = selfCpu();
const enqSrv0 = serverCpu();
const tEnqueue = performance.now();
const BATCH = 10000;
for (let i = 0; i < N; i += BATCH) {
  const specs = [];
  for (let k = i; k < Math.min(N, i + BATCH); k++) {
    specs.push({ identifier: "noop", payload: { i: k } });
  }
  const added = await utils.addJobs(specs);
  if (added.length !== specs.length) fail(`addJobs of ${specs.length} returned ${added.length}`);
}
const enqueueSeconds = (performance.now() - tEnqueue) / 1000;
const enqCpu1 = selfCpu();
const enqSrv1 = serverCpu();
await utils.release();

const waiting = Number((await check.query(
  "SELECT count(*) AS n FROM graphile_worker._private_jobs")).rows[0].n);
if (waiting !== N) fail(`${waiting} jobs in the table after adding ${N}`);
console.error(`graphile-worker: ${N} jobs added in ${enqueueSeconds.toFixed(2)} s (${(N / enqueueSeconds).toFixed(0)}/s)`);

if (a.mode === "enqueue") {
  const r = (await check.query(
    `SELECT count(DISTINCT (payload->>'i')::int8)::int8 AS d, min((payload->>'i')::int8) AS lo,
            max((payload->>'i')::int8) AS hi
       FROM graphile_worker._private_jobs j
       JOIN graphile_worker._private_tasks t ON t.id = j.task_id WHERE t.identifier = 'noop'`)).rows[0];
  await check.end();
  const [d, lo, hi] = [r.d, r.lo, r.hi].map(Number);
  if (d !== N || lo !== 0 || hi !== N - 1) {
    fail(`${d} distinct payloads of the task noop after adding ${N} (i from ${lo} to ${hi})`);
  }
  const report = {
    system: "graphile-worker",
    version,
    node: process.version,
    mode: "enqueue",
    api: "addJobs",
    batch: BATCH,
    jobs: N,
    seconds: enqueueSeconds,
    jobs_per_second: N / enqueueSeconds,
    worker_cpu_us_per_job: ((enqCpu1 - enqCpu0) * 1e6) / N,
    server_cpu_us_per_job: enqSrv0 === null || enqSrv1 === null ? null : ((enqSrv1 - enqSrv0) * 1e6) / N,
    check: "passed",
  };
  const text = JSON.stringify(report, null, 2) + "\n";
  if (a.out) writeFileSync(a.out, text);
  else process.stdout.write(text);
  process.exit(0);
}

// The planner's statistics for the drain: stale (only a checkpoint) or fresh.
if (a.stats === "fresh") await check.query("VACUUM ANALYZE");
await check.query("CHECKPOINT").catch(() => {});

// ---- The drain --------------------------------------------------------------------------------
const runs = new Uint8Array(N);
let done = 0;
let failed = 0;
let tFirst = null;
let allDone;
const finished = new Promise((resolve) => { allDone = resolve; });
const taskList = {
  noop: async (payload) => {
    if (tFirst === null) tFirst = performance.now();
    runs[payload.i]++;
    if (++done === N) allDone();
  },
};
const events = new EventEmitter();
events.on("job:error", () => { failed++; });

const options = { connectionString: a.url, concurrency: C, taskList, events, noHandleSignals: true };
if (a.settings === "performance") {
  options.preset = {
    worker: {
      maxPoolSize: Math.max(10, C + 2),
      preparedStatements: true,
      localQueue: { size: 500 },
      completeJobBatchDelay: 0,
      failJobBatchDelay: 0,
    },
  };
}

const cpu0 = selfCpu();
const srv0 = serverCpu();
const t0 = performance.now();
const runner = await run(options);
let stopping = false;
await Promise.race([
  finished,
  runner.promise.then(
    () => stopping || fail(`the worker stopped after ${done} of ${N} jobs`),
    (e) => fail(`the worker failed after ${done} of ${N} jobs: ${e}`)),
]);
const tLast = performance.now();
stopping = true;
await runner.stop();
await runner.promise;
const t1 = performance.now();
const cpu1 = selfCpu();
// The worker's connections close after the stop. A backend that exited is counted in neither
// its own /proc entry nor the postmaster's (which takes its CPU when it reaps it) for a moment:
// a reading then came back as low as the one before the drain (0 µs per job). So wait until
// only this check connection is left, and a moment more for the reaping.
for (let i = 0; i < 100; i++) {
  const others = Number((await check.query(
    "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() " +
    "AND pid <> pg_backend_pid()")).rows[0].n);
  if (others === 0) break;
  await new Promise((r) => setTimeout(r, 50));
}
await new Promise((r) => setTimeout(r, 200));
const srv1 = serverCpu();

// ---- The check --------------------------------------------------------------------------------
const left = Number((await check.query(
  "SELECT count(*) AS n FROM graphile_worker._private_jobs")).rows[0].n);
await check.end();
let never = 0;
let twice = 0;
for (let i = 0; i < N; i++) {
  if (runs[i] === 0) never++;
  else if (runs[i] > 1) twice++;
}
if (failed) fail(`${failed} jobs failed`);
if (never || twice) fail(`${never} jobs never ran, ${twice} ran more than once`);
if (left !== 0) fail(`${left} jobs left in graphile_worker._private_jobs`);

const seconds = (t1 - t0) / 1000;
const report = {
  system: "graphile-worker",
  version,
  node: process.version,
  settings: a.settings,
  stats: a.stats,
  options: options.preset?.worker ?? {},
  jobs: N,
  concurrency: C,
  enqueue_seconds: enqueueSeconds,
  seconds,
  seconds_to_first_handler: (tFirst - t0) / 1000,
  seconds_to_last_handler: (tLast - t0) / 1000,
  jobs_per_second: N / seconds,
  worker_cpu_us_per_job: ((cpu1 - cpu0) * 1e6) / N,
  server_cpu_us_per_job: srv0 === null || srv1 === null ? null : ((srv1 - srv0) * 1e6) / N,
  check: "passed",
};
const text = JSON.stringify(report, null, 2) + "\n";
if (a.out) writeFileSync(a.out, text);
else process.stdout.write(text);
process.exit(0);
