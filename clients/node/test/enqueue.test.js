// rowclaim's Node client on PostgreSQL (pg) and MariaDB (mysql2), against the servers
// scripts/test gives (ROWCLAIM_TEST_POSTGRES, ROWCLAIM_TEST_MYSQL; a missing one fails): inside
// the caller's transaction a rollback leaves no job and a commit gives one that `rowclaim work`
// runs with the example handler; every option, unique keys, delays.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import mysql from "mysql2/promise";
import pg from "pg";

import { enqueue, enqueueMany } from "../index.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../../..");
const rowclaimBin =
  process.env.ROWCLAIM_BIN ??
  path.join(process.env.CARGO_TARGET_DIR ?? path.join(repo, "target"), "debug", "rowclaim");
const handler = path.join(here, "..", "examples", "handler.mjs");

function serverUrl(name) {
  const url = process.env[name];
  if (!url) throw new Error(`${name} is not set: run these tests through scripts/test, or set it`);
  return url;
}

function withDatabase(url, name) {
  const u = new URL(url);
  u.pathname = `/${name}`;
  return u.toString();
}

function rowclaim(url, ...args) {
  const env = { ...process.env };
  delete env.DATABASE_URL;
  delete env.ROWCLAIM_LOG;
  return execFileSync(rowclaimBin, ["--database", url, ...args], {
    env,
    timeout: 120_000,
    encoding: "utf8",
    stdio: ["ignore", "pipe", "pipe"],
  });
}

// One statement on a connection of its own, closed however the statement ends (an open
// connection would keep node --test waiting instead of failing).
async function pgOnce(url, sql) {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    await c.query(sql);
  } finally {
    await c.end();
  }
}

async function mysqlOnce(url, sql) {
  const c = await mysql.createConnection(mysqlConfig(url));
  try {
    await c.query(sql);
  } finally {
    await c.end();
  }
}

function mysqlConfig(url) {
  const u = new URL(url);
  return {
    host: u.hostname,
    port: Number(u.port || 3306),
    user: decodeURIComponent(u.username || "root"),
    password: decodeURIComponent(u.password),
    database: u.pathname.slice(1) || undefined,
  };
}

// Each backend: how to make a fresh database, connect, and read what other transactions see.
const backends = {
  postgres: {
    admin: () => serverUrl("ROWCLAIM_TEST_POSTGRES"),
    create: (admin, name) => pgOnce(admin, `CREATE DATABASE ${name}`),
    drop: (admin, name) => pgOnce(admin, `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`),
    async connect(url) {
      const c = new pg.Client({ connectionString: url });
      await c.connect();
      return {
        conn: c,
        begin: () => c.query("BEGIN"),
        commit: () => c.query("COMMIT"),
        rollback: () => c.query("ROLLBACK"),
        rows: async (sql) => (await c.query({ text: sql, rowMode: "array" })).rows,
        end: () => c.end(),
      };
    },
    runAtMs: "(extract(epoch FROM run_at) * 1000)::int8::text",
    delayMs: "(extract(epoch FROM run_at - created_at) * 1000)::int8::text",
    output: "output::text",
    text: (c) => `${c}::text`,
  },
  mysql: {
    admin: () => serverUrl("ROWCLAIM_TEST_MYSQL"),
    create: (admin, name) => mysqlOnce(admin, `CREATE DATABASE ${name}`),
    drop: (admin, name) => mysqlOnce(admin, `DROP DATABASE IF EXISTS ${name}`),
    async connect(url) {
      const c = await mysql.createConnection(mysqlConfig(url));
      return {
        conn: c,
        begin: () => c.beginTransaction(),
        commit: () => c.commit(),
        rollback: () => c.rollback(),
        rows: async (sql) => (await c.query({ sql, rowsAsArray: true }))[0],
        end: () => c.end(),
      };
    },
    runAtMs: "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', run_at) DIV 1000 AS CHAR)",
    delayMs: "CAST(TIMESTAMPDIFF(MICROSECOND, created_at, run_at) DIV 1000 AS CHAR)",
    output: "output",
    text: (c) => `CAST(${c} AS CHAR)`,
  },
};

for (const [backend, b] of Object.entries(backends)) {
  describe(backend, () => {
    let admin;
    let name;
    let url;

    // A fresh database for each test, initialised by the real `rowclaim init`.
    async function fresh() {
      if (name) await b.drop(admin, name);
      name = `rowclaim_node_${randomUUID().replaceAll("-", "")}`;
      await b.create(admin, name);
      url = withDatabase(admin, name);
      rowclaim(url, "init");
    }

    // `fn` on a new connection, ended however `fn` ends: a failing assertion with a
    // connection open would otherwise keep node --test waiting instead of failing.
    async function session(fn) {
      const s = await b.connect(url);
      try {
        return await fn(s);
      } finally {
        await s.end();
      }
    }

    // What another connection sees.
    const rows = (sql) => session((s) => s.rows(sql));

    function work(queue) {
      rowclaim(url, "work", "--queue", queue, "--until-empty", "--", process.execPath, handler);
    }

    before(() => {
      admin = b.admin();
    });
    after(async () => {
      if (name) await b.drop(admin, name);
    });

    test("a rolled-back transaction leaves no job", async () => {
      await fresh();
      await session(async (s) => {
        await s.begin();
        const id = await enqueue(s.conn, { to: "ada" }, { queue: "mail" });
        assert.ok(id > 0);
        await s.rollback();
      });
      assert.equal(Number((await rows("SELECT COUNT(*) FROM rowclaim_jobs"))[0][0]), 0);
    });

    test("a committed job is run by rowclaim work with the Node handler", async () => {
      await fresh();
      const id = await session(async (s) => {
        await s.begin();
        const id = await enqueue(s.conn, { to: "ada" }, { queue: "mail", kind: "welcome" });
        const seen = await rows("SELECT id FROM rowclaim_jobs");
        assert.equal(seen.length, 0, "seen before the commit");
        await s.commit();
        return id;
      });
      work("mail");
      const done = await rows(`SELECT id, status, ${b.output} FROM rowclaim_jobs`);
      assert.equal(done.length, 1);
      assert.equal(Number(done[0][0]), id);
      assert.equal(done[0][1], "completed");
      assert.deepEqual(JSON.parse(done[0][2]), { sent_to: "ada", job: id, attempt: 1 });
    });

    test("every option", async () => {
      await fresh();
      const at = new Date(Date.UTC(2030, 0, 2, 3, 4, 5, 678));
      const [delayed, later, plain] = await session(async (s) => {
        await s.begin();
        const delayed = await enqueue(s.conn, { to: "ada" }, {
          queue: "mail",
          kind: "welcome",
          priority: 5,
          delayMs: 600_000,
          maxAttempts: 3,
          uniqueKey: "welcome:ada",
          limitKey: "ada",
          timeoutMs: 30_000,
        });
        const later = await enqueue(s.conn, [1, 2], { queue: "mail", runAt: at });
        const plain = await enqueue(s.conn);
        await s.commit();
        return [delayed, later, plain];
      });
      const got = await rows(
        `SELECT ${b.text("id")}, queue, kind, ${b.text("priority")}, ${b.text("max_attempts")}, ` +
          `unique_key, limit_key, ${b.text("timeout_ms")}, status, ${b.runAtMs}, ${b.delayMs} ` +
          "FROM rowclaim_jobs ORDER BY id",
      );
      assert.deepEqual(
        got.map((r) => r.slice(0, 9)),
        [
          [String(delayed), "mail", "welcome", "5", "3", "welcome:ada", "ada", "30000", "ready"],
          [String(later), "mail", "", "0", "25", null, null, null, "ready"],
          [String(plain), "default", "", "0", "25", null, null, null, "ready"],
        ],
      );
      assert.equal(got[0][10], "600000");
      assert.equal(got[1][9], String(at.getTime()));
      assert.equal(got[2][10], "0");
    });

    test("a unique key answers the pending job", async () => {
      await fresh();
      const [first, fresh2] = await session(async (s) => {
        await s.begin();
        const first = await enqueue(s.conn, { to: "ada" }, { queue: "mail", uniqueKey: "k" });
        const twin = await enqueue(s.conn, { to: "bob" }, { queue: "mail", uniqueKey: "k" });
        assert.equal(twin, first);
        await s.commit();
        work("mail");
        await s.begin();
        const fresh2 = await enqueue(s.conn, { to: "ada" }, { queue: "mail", uniqueKey: "k" });
        await s.commit();
        return [first, fresh2];
      });
      assert.notEqual(fresh2, first);
      const statuses = await rows("SELECT status FROM rowclaim_jobs ORDER BY id");
      assert.deepEqual(statuses, [["completed"], ["ready"]]);
    });

    test("a delayed job waits; enqueueMany keeps the order", async () => {
      await fresh();
      const ids = await session(async (s) => {
        await s.begin();
        const ids = await enqueueMany(s.conn, [
          { payload: { to: "later" }, queue: "mail", delayMs: 3_600_000 },
          { payload: { to: "now" }, queue: "mail" },
        ]);
        await s.commit();
        return ids;
      });
      assert.ok(ids[0] < ids[1]);
      work("mail");
      const got = await rows("SELECT status FROM rowclaim_jobs ORDER BY id");
      assert.deepEqual(got, [["ready"], ["completed"]]);
    });

    test("a job that waits runs after its job; a dead one cancels it unless it runs anyway", async () => {
      await fresh();
      await session(waitsThenRuns);
    });

    async function waitsThenRuns(s) {
      await s.begin();
      const first = await enqueue(s.conn, { to: "first" }, { queue: "mail" });
      const waits = await enqueue(s.conn, { to: "second" }, { queue: "mail", after: [first] });
      // No recipient: the example handler fails it, and with one attempt it is dead.
      const doomed = await enqueue(s.conn, {}, { queue: "doomed", maxAttempts: 1 });
      await s.commit();
      const status = async (id) =>
        (await rows(`SELECT status FROM rowclaim_jobs WHERE id = ${id}`))[0][0];
      assert.equal(await status(waits), "waiting");
      work("mail");
      assert.equal(await status(waits), "completed");
      assert.throws(() => work("doomed"), /exited with status 1/);
      assert.equal(await status(doomed), "dead");
      await s.begin();
      const cancelled = await enqueue(s.conn, { to: "x" }, { queue: "mail", after: [doomed] });
      const anyway = await enqueue(s.conn, { to: "y" }, {
        queue: "mail",
        after: [doomed],
        runAnyway: true,
      });
      await s.commit();
      await assert.rejects(
        enqueue(s.conn, {}, { after: [first, 987654] }),
        /waits for job 987654, which does not exist/,
      );
      const got = await rows(`SELECT status, last_error FROM rowclaim_jobs WHERE id = ${cancelled}`);
      assert.deepEqual(got, [
        ["cancelled", `cancelled: job ${doomed}, which it waited for, ended dead`],
      ]);
      assert.equal(await status(anyway), "ready");
    }

    test("bad options are refused, naming them", async () => {
      await fresh();
      await session(async (s) => {
        const refused = (options, says) => assert.rejects(enqueue(s.conn, {}, options), says);
        await refused({ maxAttempts: 0 }, /maxAttempts must be at least 1/);
        await refused({ queue: "" }, /queue name must have 1 to 255/);
        await refused({ queu: "mail" }, /unknown option queu/);
        await refused({ delayMs: 1.5 }, /delayMs must be an integer/);
        await assert.rejects(enqueue({}, {}), /takes a pg Client/);
      });
    });
  });
}
