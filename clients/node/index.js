// Enqueue rowclaim jobs on the caller's connection, in the caller's transaction: the SQL of
// docs/enqueue-sql.md (the function and procedure `rowclaim init` installs). Nothing here begins,
// commits or rolls back: the job exists if and only if the caller commits.

/** The attempts a job gets unless told otherwise (rowclaim's DEFAULT_MAX_ATTEMPTS). */
export const DEFAULT_MAX_ATTEMPTS = 25;

// Every option the functions take, by its name here; anything else is refused.
const OPTIONS = new Set([
  "queue",
  "kind",
  "priority",
  "runAt",
  "delayMs",
  "maxAttempts",
  "uniqueKey",
  "limitKey",
  "timeoutMs",
  "after",
  "runAnyway",
]);

// PostgreSQL: every option passed, NULL being the function's default.
const POSTGRES =
  "SELECT rowclaim_enqueue(payload => $1::jsonb, queue => $2, kind => $3, priority => $4, " +
  "run_at => $5::timestamptz, delay => make_interval(secs => $6::float8 / 1000), " +
  "max_attempts => $7, unique_key => $8, limit_key => $9, " +
  "timeout => make_interval(secs => $10::float8 / 1000), after => $11::int8[], " +
  "run_anyway => $12) AS id";

const MYSQL = "CALL rowclaim_enqueue(?, ?)";

const isInt = (v) => Number.isSafeInteger(v);

/** Checks `options` as rowclaim's NewJob does; throws a TypeError or RangeError naming it. */
function check(options) {
  for (const key of Object.keys(options)) {
    if (!OPTIONS.has(key)) {
      throw new TypeError(`unknown option ${key}; known: ${[...OPTIONS].join(", ")}`);
    }
  }
  const o = options;
  const text = (name, v) => {
    if (v != null && typeof v !== "string") throw new TypeError(`${name} must be a string`);
  };
  text("queue", o.queue);
  text("kind", o.kind);
  text("uniqueKey", o.uniqueKey);
  text("limitKey", o.limitKey);
  for (const name of ["priority", "delayMs", "maxAttempts", "timeoutMs"]) {
    if (o[name] != null && !isInt(o[name])) throw new TypeError(`${name} must be an integer`);
  }
  if (o.queue != null && (o.queue.length < 1 || o.queue.length > 255)) {
    throw new RangeError("queue name must have 1 to 255 characters");
  }
  if (o.kind != null && o.kind.length > 255) throw new RangeError("kind is longer than 255 characters");
  if (o.priority != null && (o.priority < -(2 ** 31) || o.priority >= 2 ** 31)) {
    throw new RangeError(`priority must be a 32-bit integer, not ${o.priority}`);
  }
  if (o.maxAttempts != null && (o.maxAttempts < 1 || o.maxAttempts >= 2 ** 31)) {
    throw new RangeError(`maxAttempts must be at least 1, not ${o.maxAttempts}`);
  }
  if (o.uniqueKey != null && o.uniqueKey.length > 255) {
    throw new RangeError("uniqueKey is longer than 255 characters");
  }
  if (o.limitKey != null && (o.limitKey.length < 1 || o.limitKey.length > 255)) {
    throw new RangeError("limitKey must have 1 to 255 characters");
  }
  if (o.runAt != null && o.delayMs != null) throw new TypeError("give runAt or delayMs, not both");
  if (o.runAt != null && !(o.runAt instanceof Date && !Number.isNaN(o.runAt.getTime()))) {
    throw new TypeError("runAt must be a valid Date");
  }
  if (o.delayMs != null && o.delayMs < 0) throw new RangeError("delayMs must not be negative");
  if (o.timeoutMs != null && o.timeoutMs <= 0) {
    throw new RangeError("timeoutMs must be more than zero");
  }
  if (o.after != null && !(Array.isArray(o.after) && o.after.every(isInt))) {
    throw new TypeError("after must be an array of job ids (integers)");
  }
  if (o.after?.length && o.uniqueKey != null) {
    throw new TypeError("a job that waits for other jobs (after) cannot have a unique key");
  }
  if (o.runAnyway != null && typeof o.runAnyway !== "boolean") {
    throw new TypeError("runAnyway must be true or false");
  }
}

function payloadJson(payload) {
  const text = JSON.stringify(payload === undefined ? {} : payload);
  if (text === undefined) throw new TypeError("the payload cannot be written as JSON");
  return text;
}

/** Which database a connection speaks: pg's Client (or a pool's client), or mysql2's. */
function dialect(conn) {
  if (conn && typeof conn.escapeIdentifier === "function" && typeof conn.query === "function") {
    return "postgres";
  }
  if (conn && typeof conn.execute === "function" && typeof conn.query === "function") {
    return "mysql";
  }
  throw new TypeError(
    "rowclaim.enqueue takes a pg Client (or PoolClient) or a mysql2 connection (promise API)",
  );
}

/** The id a database gave, as a number. */
function toId(value) {
  const id = Number(value);
  if (value == null || !Number.isSafeInteger(id)) {
    throw new Error(`rowclaim_enqueue returned no usable id (${value}); is the database initialised?`);
  }
  return id;
}

async function one(conn, payload, options = {}) {
  check(options);
  const json = payloadJson(payload);
  const o = options;
  if (dialect(conn) === "postgres") {
    const res = await conn.query(POSTGRES, [
      json,
      o.queue ?? null,
      o.kind ?? null,
      o.priority ?? null,
      o.runAt ?? null,
      o.delayMs ?? null,
      o.maxAttempts ?? null,
      o.uniqueKey ?? null,
      o.limitKey ?? null,
      o.timeoutMs ?? null,
      o.after ?? null,
      o.runAnyway ?? null,
    ]);
    return toId(res.rows[0]?.id);
  }
  const mysqlOptions = {
    queue: o.queue,
    kind: o.kind,
    priority: o.priority,
    run_at_ms: o.runAt?.getTime(),
    delay_ms: o.delayMs,
    max_attempts: o.maxAttempts,
    unique_key: o.uniqueKey,
    limit_key: o.limitKey,
    timeout_ms: o.timeoutMs,
    after: o.after,
    run_anyway: o.runAnyway,
  };
  // mysql2's callback connections give their promise API with .promise().
  const c = typeof conn.promise === "function" ? conn.promise() : conn;
  const [results] = await c.query(MYSQL, [json, JSON.stringify(mysqlOptions)]);
  return toId(results?.[0]?.[0]?.id);
}

/**
 * Enqueues one job on `conn` (pg Client or PoolClient, or a mysql2 connection), in the
 * transaction it has open; resolves to the job's id. With a unique key that a ready or running
 * job has already, resolves to that job's id. With `after` (ids of jobs it waits for) it is
 * enqueued waiting and runs once all of them completed; if one ended dead or cancelled it is
 * cancelled, naming it, unless `runAnyway`.
 */
export async function enqueue(conn, payload, options) {
  return one(conn, payload, options);
}

/** Enqueues each `{ payload, ...options }` in order, in the caller's transaction; their ids. */
export async function enqueueMany(conn, jobs) {
  const ids = [];
  for (const job of jobs) {
    const { payload, ...options } = job;
    ids.push(await one(conn, payload, options));
  }
  return ids;
}
