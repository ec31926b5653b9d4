/** A job's options (undefined or null: rowclaim's default). */
export interface JobOptions {
  /** The queue (1 to 255 characters); default "default". */
  queue?: string | null;
  /** The job's kind, for routing; default "". */
  kind?: string | null;
  /** Higher runs first; default 0. */
  priority?: number | null;
  /** Run no earlier than this time. */
  runAt?: Date | null;
  /** Run no earlier than now plus this many milliseconds, by the database's clock. */
  delayMs?: number | null;
  /** Runs before it is dead; default 25. */
  maxAttempts?: number | null;
  /** While a job with this key is ready or running, enqueueing returns its id. */
  uniqueKey?: string | null;
  /** The key its queue's per-key limits count it under. */
  limitKey?: string | null;
  /** How long one run may take, in milliseconds; default the worker's. */
  timeoutMs?: number | null;
  /** Ids of jobs it waits for: it runs once all of them completed; if one ended dead or
   * cancelled, it is cancelled (naming that job) unless runAnyway. No unique key with it. */
  after?: number[] | null;
  /** With after: run also when one of them ended dead or cancelled. */
  runAnyway?: boolean | null;
}

/** A job for enqueueMany: its payload and options. */
export interface Job extends JobOptions {
  payload?: unknown;
}

/** A pg Client or PoolClient, or a mysql2 connection (promise API, or callback with .promise()). */
export type Connection = { query: (...args: any[]) => any };

export const DEFAULT_MAX_ATTEMPTS: 25;

/**
 * Enqueues one job on `conn`, in the transaction it has open; resolves to the job's id (the
 * pending job's, when its unique key is taken).
 */
export function enqueue(conn: Connection, payload?: unknown, options?: JobOptions): Promise<number>;

/** Enqueues each job in order, in the caller's transaction; resolves to their ids. */
export function enqueueMany(conn: Connection, jobs: Iterable<Job>): Promise<number[]>;
