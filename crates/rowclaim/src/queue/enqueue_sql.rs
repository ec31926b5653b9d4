//! Enqueue in SQL: the contract applications in other languages build on (`docs/enqueue-sql.md`
//! documents it). `rowclaim init` installs, as its own schema component
//! ([`super::migrate::Component::Enqueue`], migrated after the jobs' tables it writes), a
//! PostgreSQL function and a MariaDB/MySQL stored procedure named `rowclaim_enqueue`, which
//! enqueue one job in the caller's transaction exactly as `Queue::enqueue` does: the same
//! checks, the run-at from the database's clock, a pending unique key answered with its job,
//! and (PostgreSQL) the listening workers woken at the commit. SQLite has no functions that
//! write: there the contract is the documented `INSERT` ([`SQLITE_INSERT`]).
//!
//! A version replaces the routine whole (`CREATE OR REPLACE`, or `DROP … IF EXISTS` then
//! `CREATE`), so a later one may add a parameter (on PostgreSQL drop the old signature first:
//! one with another parameter list is another function) or, on MySQL, an option key.

/// PostgreSQL's versions: named parameters with defaults (NULL means the default too, so that
/// a client may pass every option), the job's id returned.
#[cfg(feature = "postgres")]
pub(crate) const POSTGRES: &[&[&str]] = &[
    &[
    "CREATE OR REPLACE FUNCTION rowclaim_enqueue(
    payload jsonb DEFAULT '{}',
    queue text DEFAULT 'default',
    kind text DEFAULT '',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    delay interval DEFAULT NULL,
    max_attempts integer DEFAULT 25,
    unique_key text DEFAULT NULL,
    limit_key text DEFAULT NULL,
    timeout interval DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
AS $rowclaim$
#variable_conflict use_column
DECLARE
    q text := COALESCE(rowclaim_enqueue.queue, 'default');
    k text := COALESCE(rowclaim_enqueue.kind, '');
    tries integer := 0;
    job_id bigint;
BEGIN
    IF rowclaim_enqueue.payload IS NULL THEN
        RAISE EXCEPTION 'rowclaim_enqueue: payload is NULL; give a JSON value, e.g. ''{}''::jsonb'
            USING ERRCODE = '22023';
    END IF;
    IF length(q) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'rowclaim_enqueue: queue name must have 1 to 255 characters'
            USING ERRCODE = '22023';
    END IF;
    IF COALESCE(rowclaim_enqueue.max_attempts, 1) < 1 THEN
        RAISE EXCEPTION 'rowclaim_enqueue: max_attempts must be at least 1, not %',
            rowclaim_enqueue.max_attempts USING ERRCODE = '22023';
    END IF;
    IF length(rowclaim_enqueue.unique_key) > 255 THEN
        RAISE EXCEPTION 'rowclaim_enqueue: unique_key is longer than 255 characters'
            USING ERRCODE = '22023';
    END IF;
    IF length(rowclaim_enqueue.limit_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'rowclaim_enqueue: limit_key must have 1 to 255 characters'
            USING ERRCODE = '22023';
    END IF;
    IF rowclaim_enqueue.delay < interval '0' THEN
        RAISE EXCEPTION 'rowclaim_enqueue: delay must not be negative, not %',
            rowclaim_enqueue.delay USING ERRCODE = '22023';
    END IF;
    IF rowclaim_enqueue.timeout <= interval '0' THEN
        RAISE EXCEPTION 'rowclaim_enqueue: timeout must be longer than zero, not %',
            rowclaim_enqueue.timeout USING ERRCODE = '22023';
    END IF;
    LOOP
        tries := tries + 1;
        -- As Queue::enqueue: a pending twin (ready or running) makes this insert nothing, a
        -- concurrent one waits for the other transaction, then conflicts.
        INSERT INTO rowclaim_jobs
            (queue, kind, payload, priority, run_at, max_attempts, unique_key, timeout_ms,
             limit_key)
        VALUES (q, k, rowclaim_enqueue.payload, COALESCE(rowclaim_enqueue.priority, 0),
            COALESCE(rowclaim_enqueue.run_at, now() + COALESCE(rowclaim_enqueue.delay, interval '0')),
            COALESCE(rowclaim_enqueue.max_attempts, 25), rowclaim_enqueue.unique_key,
            ceil(extract(epoch FROM rowclaim_enqueue.timeout) * 1000)::bigint,
            rowclaim_enqueue.limit_key)
        ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('ready', 'running')
        DO NOTHING
        RETURNING id INTO job_id;
        IF job_id IS NOT NULL THEN
            -- Delivered at the commit, as Queue::enqueue's wake-up.
            PERFORM pg_notify('rowclaim_jobs', q);
            RETURN job_id;
        END IF;
        SELECT id INTO job_id FROM rowclaim_jobs
        WHERE unique_key = rowclaim_enqueue.unique_key AND status IN ('ready', 'running');
        IF job_id IS NOT NULL THEN
            RETURN job_id;
        END IF;
        -- The twin finished between the two statements: try the insert again.
        IF tries >= 5 THEN
            RAISE EXCEPTION 'rowclaim_enqueue: unique key % keeps changing hands; try again',
                rowclaim_enqueue.unique_key USING ERRCODE = '40001';
        END IF;
    END LOOP;
END
$rowclaim$",
    ],
    // 2: `after` and `run_anyway` (jobs that wait).
    &[
        "DROP FUNCTION IF EXISTS rowclaim_enqueue(jsonb, text, text, integer, timestamptz, \
         interval, integer, text, text, interval)",
    "CREATE OR REPLACE FUNCTION rowclaim_enqueue(
    payload jsonb DEFAULT '{}',
    queue text DEFAULT 'default',
    kind text DEFAULT '',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    delay interval DEFAULT NULL,
    max_attempts integer DEFAULT 25,
    unique_key text DEFAULT NULL,
    limit_key text DEFAULT NULL,
    timeout interval DEFAULT NULL,
    after bigint[] DEFAULT NULL,
    run_anyway boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql
AS $rowclaim$
#variable_conflict use_column
DECLARE
    q text := COALESCE(rowclaim_enqueue.queue, 'default');
    k text := COALESCE(rowclaim_enqueue.kind, '');
    tries integer := 0;
    job_id bigint;
    -- What it waits for, sorted and without twins (as NewJob::waits_for); NULL: nothing.
    deps bigint[] := NULLIF(ARRAY(SELECT DISTINCT d FROM unnest(rowclaim_enqueue.after) AS d
        ORDER BY d), '{}');
    anyway boolean := COALESCE(rowclaim_enqueue.run_anyway, false);
    missing bigint;
    failed_id bigint;
    failed_status text;
BEGIN
    IF rowclaim_enqueue.payload IS NULL THEN
        RAISE EXCEPTION 'rowclaim_enqueue: payload is NULL; give a JSON value, e.g. ''{}''::jsonb'
            USING ERRCODE = '22023';
    END IF;
    IF length(q) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'rowclaim_enqueue: queue name must have 1 to 255 characters'
            USING ERRCODE = '22023';
    END IF;
    IF COALESCE(rowclaim_enqueue.max_attempts, 1) < 1 THEN
        RAISE EXCEPTION 'rowclaim_enqueue: max_attempts must be at least 1, not %',
            rowclaim_enqueue.max_attempts USING ERRCODE = '22023';
    END IF;
    IF length(rowclaim_enqueue.unique_key) > 255 THEN
        RAISE EXCEPTION 'rowclaim_enqueue: unique_key is longer than 255 characters'
            USING ERRCODE = '22023';
    END IF;
    IF length(rowclaim_enqueue.limit_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'rowclaim_enqueue: limit_key must have 1 to 255 characters'
            USING ERRCODE = '22023';
    END IF;
    IF rowclaim_enqueue.delay < interval '0' THEN
        RAISE EXCEPTION 'rowclaim_enqueue: delay must not be negative, not %',
            rowclaim_enqueue.delay USING ERRCODE = '22023';
    END IF;
    IF rowclaim_enqueue.timeout <= interval '0' THEN
        RAISE EXCEPTION 'rowclaim_enqueue: timeout must be longer than zero, not %',
            rowclaim_enqueue.timeout USING ERRCODE = '22023';
    END IF;
    IF deps IS NOT NULL THEN
        IF rowclaim_enqueue.unique_key IS NOT NULL THEN
            RAISE EXCEPTION 'rowclaim_enqueue: a job that waits for other jobs (after) cannot have a unique key'
                USING ERRCODE = '22023';
        END IF;
        IF array_position(deps, NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'rowclaim_enqueue: after holds a NULL; give the ids of jobs'
                USING ERRCODE = '22023';
        END IF;
        SELECT d INTO missing FROM unnest(deps) AS d
        WHERE NOT EXISTS (SELECT 1 FROM rowclaim_jobs AS j WHERE j.id = d) ORDER BY d LIMIT 1;
        IF missing IS NOT NULL THEN
            RAISE EXCEPTION 'rowclaim_enqueue: waits for job %, which does not exist (never enqueued, deleted, or pruned after it finished); leave it out of after',
                missing USING ERRCODE = '22023';
        END IF;
    END IF;
    LOOP
        tries := tries + 1;
        -- As Queue::enqueue: a pending twin (ready or running) makes this insert nothing, a
        -- concurrent one waits for the other transaction, then conflicts.
        INSERT INTO rowclaim_jobs
            (queue, kind, payload, priority, run_at, max_attempts, unique_key, timeout_ms,
             limit_key)
        VALUES (q, k, rowclaim_enqueue.payload, COALESCE(rowclaim_enqueue.priority, 0),
            COALESCE(rowclaim_enqueue.run_at, now() + COALESCE(rowclaim_enqueue.delay, interval '0')),
            COALESCE(rowclaim_enqueue.max_attempts, 25), rowclaim_enqueue.unique_key,
            ceil(extract(epoch FROM rowclaim_enqueue.timeout) * 1000)::bigint,
            rowclaim_enqueue.limit_key)
        ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('ready', 'running')
        DO NOTHING
        RETURNING id INTO job_id;
        IF job_id IS NOT NULL AND deps IS NOT NULL THEN
            -- As after::hold: the edges, then the verdict of after::judge on the jobs it
            -- waits for as they are now (the first dead or cancelled one cancels it, unless
            -- it runs anyway; any unfinished one makes it wait). One that finishes between
            -- this read and the commit is seen by the workers' sweep.
            INSERT INTO rowclaim_waits (job, waits_for) SELECT job_id, d FROM unnest(deps) AS d;
            SELECT j.id, j.status INTO failed_id, failed_status FROM rowclaim_jobs AS j
            WHERE j.id = ANY (deps) AND j.status IN ('dead', 'cancelled') AND NOT anyway
            ORDER BY j.id LIMIT 1;
            IF failed_id IS NOT NULL THEN
                UPDATE rowclaim_jobs SET status = 'cancelled', finished_at = now(),
                    last_error = format('cancelled: job %s, which it waited for, %s', failed_id,
                        CASE failed_status WHEN 'dead' THEN 'ended dead' ELSE 'was cancelled' END)
                WHERE id = job_id;
                RETURN job_id;
            END IF;
            UPDATE rowclaim_jobs SET if_failed = CASE WHEN anyway THEN 'run' END,
                status = CASE WHEN EXISTS (SELECT 1 FROM rowclaim_jobs AS j
                    WHERE j.id = ANY (deps)
                    AND j.status NOT IN ('completed', 'dead', 'cancelled'))
                    THEN 'waiting' ELSE status END
            WHERE id = job_id
            RETURNING status INTO failed_status;
            IF failed_status <> 'ready' THEN
                RETURN job_id;
            END IF;
        END IF;
        IF job_id IS NOT NULL THEN
            -- Delivered at the commit, as Queue::enqueue's wake-up.
            PERFORM pg_notify('rowclaim_jobs', q);
            RETURN job_id;
        END IF;
        SELECT id INTO job_id FROM rowclaim_jobs
        WHERE unique_key = rowclaim_enqueue.unique_key AND status IN ('ready', 'running');
        IF job_id IS NOT NULL THEN
            RETURN job_id;
        END IF;
        -- The twin finished between the two statements: try the insert again.
        IF tries >= 5 THEN
            RAISE EXCEPTION 'rowclaim_enqueue: unique key % keeps changing hands; try again',
                rowclaim_enqueue.unique_key USING ERRCODE = '40001';
        END IF;
    END LOOP;
END
$rowclaim$",
    ],
];

/// MariaDB/MySQL's versions: `CALL rowclaim_enqueue(payload, options)`, the options a JSON
/// object (MySQL's routines have neither named nor defaulted parameters: an object of options
/// lets a later version add one without breaking a caller), the job's id answered as a
/// one-row result (`id`). Local names start with `v_`: in a routine a variable wins over a
/// column of the same name. (MySQL 8 has no `CREATE OR REPLACE PROCEDURE`: on a Galera
/// cluster, whose nodes' inits take no turns, another node may create it between this one's
/// `DROP` and `CREATE`, which `Schema::made_already` lets pass.)
#[cfg(feature = "mysql")]
pub(crate) const MYSQL: &[&[&str]] = &[
    &[
    "DROP PROCEDURE IF EXISTS rowclaim_enqueue",
    "CREATE PROCEDURE rowclaim_enqueue(IN job_payload LONGTEXT, IN job_options LONGTEXT)
MODIFIES SQL DATA
BEGIN
    DECLARE v_opts LONGTEXT DEFAULT COALESCE(job_options, '{}');
    DECLARE v_queue VARCHAR(1024);
    DECLARE v_kind VARCHAR(1024);
    DECLARE v_priority BIGINT;
    DECLARE v_run_at_ms BIGINT;
    DECLARE v_delay_ms BIGINT;
    DECLARE v_max_attempts BIGINT;
    DECLARE v_unique_key VARCHAR(1024);
    DECLARE v_limit_key VARCHAR(1024);
    DECLARE v_timeout_ms BIGINT;
    DECLARE v_rest LONGTEXT;
    DECLARE v_bad VARCHAR(64);
    DECLARE v_msg VARCHAR(512);
    DECLARE v_id BIGINT;
    DECLARE v_tries INT DEFAULT 0;
    DECLARE v_duplicate INT DEFAULT 0;
    DECLARE CONTINUE HANDLER FOR 1062 SET v_duplicate = 1;

    IF job_payload IS NULL OR NOT JSON_VALID(job_payload) THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT =
            'rowclaim_enqueue: the payload is not JSON; give a JSON text, e.g. ''{}''';
    END IF;
    IF NOT JSON_VALID(v_opts) OR JSON_TYPE(v_opts) <> 'OBJECT' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT =
            'rowclaim_enqueue: the options are not a JSON object; give e.g. ''{\"queue\": \"mail\"}''';
    END IF;
    SET v_rest = JSON_REMOVE(v_opts, '$.queue', '$.kind', '$.priority', '$.run_at_ms',
        '$.delay_ms', '$.max_attempts', '$.unique_key', '$.limit_key', '$.timeout_ms');
    IF JSON_LENGTH(v_rest) > 0 THEN
        SET v_msg = CONCAT('rowclaim_enqueue: unknown options ', JSON_KEYS(v_rest),
            '; known: queue, kind, priority, run_at_ms, delay_ms, max_attempts, unique_key, ',
            'limit_key, timeout_ms');
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_msg;
    END IF;
    -- Each option a JSON value of its type, or null (the default).
    SET v_bad = CASE
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.queue')) NOT IN ('STRING', 'NULL') THEN 'queue'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.kind')) NOT IN ('STRING', 'NULL') THEN 'kind'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.unique_key')) NOT IN ('STRING', 'NULL')
            THEN 'unique_key'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.limit_key')) NOT IN ('STRING', 'NULL')
            THEN 'limit_key'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.priority')) NOT IN ('INTEGER', 'NULL')
            THEN 'priority'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.run_at_ms')) NOT IN ('INTEGER', 'NULL')
            THEN 'run_at_ms'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.delay_ms')) NOT IN ('INTEGER', 'NULL')
            THEN 'delay_ms'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.max_attempts')) NOT IN ('INTEGER', 'NULL')
            THEN 'max_attempts'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.timeout_ms')) NOT IN ('INTEGER', 'NULL')
            THEN 'timeout_ms'
    END;
    IF v_bad IS NOT NULL THEN
        SET v_msg = CONCAT('rowclaim_enqueue: option ', v_bad, ' has the wrong type (',
            IF(v_bad IN ('queue', 'kind', 'unique_key', 'limit_key'), 'a string', 'an integer'),
            ' or null)');
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_msg;
    END IF;
    SET v_queue = COALESCE(JSON_VALUE(v_opts, '$.queue'), 'default');
    SET v_kind = COALESCE(JSON_VALUE(v_opts, '$.kind'), '');
    SET v_priority = COALESCE(CAST(JSON_VALUE(v_opts, '$.priority') AS SIGNED), 0);
    SET v_run_at_ms = CAST(JSON_VALUE(v_opts, '$.run_at_ms') AS SIGNED);
    SET v_delay_ms = COALESCE(CAST(JSON_VALUE(v_opts, '$.delay_ms') AS SIGNED), 0);
    SET v_max_attempts = COALESCE(CAST(JSON_VALUE(v_opts, '$.max_attempts') AS SIGNED), 25);
    SET v_unique_key = JSON_VALUE(v_opts, '$.unique_key');
    SET v_limit_key = JSON_VALUE(v_opts, '$.limit_key');
    SET v_timeout_ms = CAST(JSON_VALUE(v_opts, '$.timeout_ms') AS SIGNED);

    -- The checks of Queue::enqueue (NewJob's, and DATETIME's years).
    SET v_msg = CASE
        WHEN CHAR_LENGTH(v_queue) NOT BETWEEN 1 AND 255
            THEN 'queue name must have 1 to 255 characters'
        WHEN CHAR_LENGTH(v_kind) > 255 THEN 'kind is longer than 255 characters'
        WHEN v_priority NOT BETWEEN -2147483648 AND 2147483647
            THEN 'priority is outside the 32-bit integers'
        WHEN v_max_attempts NOT BETWEEN 1 AND 2147483647
            THEN CONCAT('max_attempts must be at least 1, not ', v_max_attempts)
        WHEN CHAR_LENGTH(v_unique_key) > 255 THEN 'unique_key is longer than 255 characters'
        WHEN CHAR_LENGTH(v_limit_key) NOT BETWEEN 1 AND 255
            THEN 'limit_key must have 1 to 255 characters'
        WHEN v_timeout_ms <= 0 THEN 'timeout_ms must be more than zero'
        WHEN v_delay_ms < 0 THEN 'delay_ms must not be negative'
        WHEN v_delay_ms > 28401325920000 THEN
            'a delay of more than 900 years is beyond what MySQL''s DATETIME holds'
        WHEN v_run_at_ms NOT BETWEEN -30610224000000 AND 253402300799999 THEN
            'run_at_ms is outside the years 1000 to 9999 that MySQL''s DATETIME holds'
    END;
    IF v_msg IS NOT NULL THEN
        SET v_msg = CONCAT('rowclaim_enqueue: ', v_msg);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_msg;
    END IF;

    retry: LOOP
        SET v_tries = v_tries + 1;
        SET v_duplicate = 0;
        -- As Queue::enqueue: the insert is the uniqueness check (it waits for a twin another
        -- transaction is inserting, and fails with a duplicate key once that one commits).
        INSERT INTO rowclaim_jobs (queue, kind, payload, priority, run_at, max_attempts,
            unique_key, timeout_ms, limit_key, created_at)
        VALUES (v_queue, v_kind, job_payload, v_priority,
            COALESCE(TIMESTAMPADD(MICROSECOND, v_run_at_ms * 1000, TIMESTAMP '1970-01-01 00:00:00'),
                UTC_TIMESTAMP(6) + INTERVAL v_delay_ms * 1000 MICROSECOND),
            v_max_attempts, v_unique_key, v_timeout_ms, v_limit_key, UTC_TIMESTAMP(6));
        IF v_duplicate = 0 THEN
            SET v_id = LAST_INSERT_ID();
            LEAVE retry;
        END IF;
        -- A locking read sees the latest committed twin, also in a REPEATABLE READ snapshot
        -- older than it.
        SET v_id = NULL;
        SELECT MAX(id) INTO v_id FROM rowclaim_jobs WHERE pending_key = v_unique_key
            LOCK IN SHARE MODE;
        IF v_id IS NOT NULL THEN
            LEAVE retry;
        END IF;
        IF v_tries >= 5 THEN
            SET v_msg = CONCAT('rowclaim_enqueue: unique key ', v_unique_key,
                ' keeps changing hands; try again');
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_msg;
        END IF;
    END LOOP;
    SELECT v_id AS id;
END",
    ],
    // 2: the options `after` and `run_anyway` (jobs that wait).
    &[
        "DROP PROCEDURE IF EXISTS rowclaim_enqueue",
    "CREATE PROCEDURE rowclaim_enqueue(IN job_payload LONGTEXT, IN job_options LONGTEXT)
MODIFIES SQL DATA
BEGIN
    DECLARE v_opts LONGTEXT DEFAULT COALESCE(job_options, '{}');
    DECLARE v_queue VARCHAR(1024);
    DECLARE v_kind VARCHAR(1024);
    DECLARE v_priority BIGINT;
    DECLARE v_run_at_ms BIGINT;
    DECLARE v_delay_ms BIGINT;
    DECLARE v_max_attempts BIGINT;
    DECLARE v_unique_key VARCHAR(1024);
    DECLARE v_limit_key VARCHAR(1024);
    DECLARE v_timeout_ms BIGINT;
    DECLARE v_rest LONGTEXT;
    DECLARE v_bad VARCHAR(64);
    DECLARE v_msg VARCHAR(512);
    DECLARE v_id BIGINT;
    DECLARE v_tries INT DEFAULT 0;
    DECLARE v_duplicate INT DEFAULT 0;
    DECLARE v_after LONGTEXT;
    DECLARE v_anyway INT DEFAULT 0;
    DECLARE v_i INT DEFAULT 0;
    DECLARE v_dep BIGINT;
    DECLARE v_missing BIGINT;
    DECLARE v_failed_id BIGINT;
    DECLARE v_failed_status VARCHAR(32);
    DECLARE v_unfinished BIGINT;
    DECLARE CONTINUE HANDLER FOR 1062 SET v_duplicate = 1;

    IF job_payload IS NULL OR NOT JSON_VALID(job_payload) THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT =
            'rowclaim_enqueue: the payload is not JSON; give a JSON text, e.g. ''{}''';
    END IF;
    IF NOT JSON_VALID(v_opts) OR JSON_TYPE(v_opts) <> 'OBJECT' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT =
            'rowclaim_enqueue: the options are not a JSON object; give e.g. ''{\"queue\": \"mail\"}''';
    END IF;
    SET v_rest = JSON_REMOVE(v_opts, '$.queue', '$.kind', '$.priority', '$.run_at_ms',
        '$.delay_ms', '$.max_attempts', '$.unique_key', '$.limit_key', '$.timeout_ms', '$.after', '$.run_anyway');
    IF JSON_LENGTH(v_rest) > 0 THEN
        SET v_msg = CONCAT('rowclaim_enqueue: unknown options ', JSON_KEYS(v_rest),
            '; known: queue, kind, priority, run_at_ms, delay_ms, max_attempts, unique_key, ',
            'limit_key, timeout_ms, after, run_anyway');
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_msg;
    END IF;
    -- Each option a JSON value of its type, or null (the default).
    SET v_bad = CASE
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.queue')) NOT IN ('STRING', 'NULL') THEN 'queue'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.kind')) NOT IN ('STRING', 'NULL') THEN 'kind'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.unique_key')) NOT IN ('STRING', 'NULL')
            THEN 'unique_key'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.limit_key')) NOT IN ('STRING', 'NULL')
            THEN 'limit_key'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.priority')) NOT IN ('INTEGER', 'NULL')
            THEN 'priority'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.run_at_ms')) NOT IN ('INTEGER', 'NULL')
            THEN 'run_at_ms'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.delay_ms')) NOT IN ('INTEGER', 'NULL')
            THEN 'delay_ms'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.max_attempts')) NOT IN ('INTEGER', 'NULL')
            THEN 'max_attempts'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.timeout_ms')) NOT IN ('INTEGER', 'NULL')
            THEN 'timeout_ms'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.after')) NOT IN ('ARRAY', 'NULL') THEN 'after'
        WHEN JSON_TYPE(JSON_EXTRACT(v_opts, '$.run_anyway')) NOT IN ('BOOLEAN', 'NULL')
            THEN 'run_anyway'
    END;
    IF v_bad IS NOT NULL THEN
        SET v_msg = CONCAT('rowclaim_enqueue: option ', v_bad, ' has the wrong type (',
            CASE WHEN v_bad IN ('queue', 'kind', 'unique_key', 'limit_key') THEN 'a string'
                WHEN v_bad = 'after' THEN 'an array of job ids'
                WHEN v_bad = 'run_anyway' THEN 'true, false'
                ELSE 'an integer' END,
            ' or null)');
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_msg;
    END IF;
    SET v_queue = COALESCE(JSON_VALUE(v_opts, '$.queue'), 'default');
    SET v_kind = COALESCE(JSON_VALUE(v_opts, '$.kind'), '');
    SET v_priority = COALESCE(CAST(JSON_VALUE(v_opts, '$.priority') AS SIGNED), 0);
    SET v_run_at_ms = CAST(JSON_VALUE(v_opts, '$.run_at_ms') AS SIGNED);
    SET v_delay_ms = COALESCE(CAST(JSON_VALUE(v_opts, '$.delay_ms') AS SIGNED), 0);
    SET v_max_attempts = COALESCE(CAST(JSON_VALUE(v_opts, '$.max_attempts') AS SIGNED), 25);
    SET v_unique_key = JSON_VALUE(v_opts, '$.unique_key');
    SET v_limit_key = JSON_VALUE(v_opts, '$.limit_key');
    SET v_timeout_ms = CAST(JSON_VALUE(v_opts, '$.timeout_ms') AS SIGNED);
    -- What it waits for (NULL: nothing), each an integer, each a job (the first missing one
    -- named, as after::hold names it).
    SET v_after = JSON_EXTRACT(v_opts, '$.after');
    IF JSON_TYPE(v_after) <> 'ARRAY' OR JSON_LENGTH(v_after) = 0 THEN
        SET v_after = NULL;
    END IF;
    SET v_anyway = COALESCE(JSON_CONTAINS(v_opts, 'true', '$.run_anyway'), 0);
    IF v_after IS NOT NULL THEN
        IF v_unique_key IS NOT NULL THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT =
                'rowclaim_enqueue: a job that waits for other jobs (after) cannot have a unique key';
        END IF;
        WHILE v_i < JSON_LENGTH(v_after) DO
            IF JSON_TYPE(JSON_EXTRACT(v_after, CONCAT('$[', v_i, ']'))) <> 'INTEGER' THEN
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT =
                    'rowclaim_enqueue: option after has the wrong type (an array of job ids or null)';
            END IF;
            SET v_dep = CAST(JSON_EXTRACT(v_after, CONCAT('$[', v_i, ']')) AS SIGNED);
            IF NOT EXISTS (SELECT 1 FROM rowclaim_jobs WHERE id = v_dep) THEN
                SET v_missing = LEAST(COALESCE(v_missing, v_dep), v_dep);
            END IF;
            SET v_i = v_i + 1;
        END WHILE;
        IF v_missing IS NOT NULL THEN
            SET v_msg = CONCAT('rowclaim_enqueue: waits for job ', v_missing,
                ', which does not exist (never enqueued, deleted, or pruned after it ',
                'finished); leave it out of after');
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_msg;
        END IF;
    END IF;

    -- The checks of Queue::enqueue (NewJob's, and DATETIME's years).
    SET v_msg = CASE
        WHEN CHAR_LENGTH(v_queue) NOT BETWEEN 1 AND 255
            THEN 'queue name must have 1 to 255 characters'
        WHEN CHAR_LENGTH(v_kind) > 255 THEN 'kind is longer than 255 characters'
        WHEN v_priority NOT BETWEEN -2147483648 AND 2147483647
            THEN 'priority is outside the 32-bit integers'
        WHEN v_max_attempts NOT BETWEEN 1 AND 2147483647
            THEN CONCAT('max_attempts must be at least 1, not ', v_max_attempts)
        WHEN CHAR_LENGTH(v_unique_key) > 255 THEN 'unique_key is longer than 255 characters'
        WHEN CHAR_LENGTH(v_limit_key) NOT BETWEEN 1 AND 255
            THEN 'limit_key must have 1 to 255 characters'
        WHEN v_timeout_ms <= 0 THEN 'timeout_ms must be more than zero'
        WHEN v_delay_ms < 0 THEN 'delay_ms must not be negative'
        WHEN v_delay_ms > 28401325920000 THEN
            'a delay of more than 900 years is beyond what MySQL''s DATETIME holds'
        WHEN v_run_at_ms NOT BETWEEN -30610224000000 AND 253402300799999 THEN
            'run_at_ms is outside the years 1000 to 9999 that MySQL''s DATETIME holds'
    END;
    IF v_msg IS NOT NULL THEN
        SET v_msg = CONCAT('rowclaim_enqueue: ', v_msg);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_msg;
    END IF;

    retry: LOOP
        SET v_tries = v_tries + 1;
        SET v_duplicate = 0;
        -- As Queue::enqueue: the insert is the uniqueness check (it waits for a twin another
        -- transaction is inserting, and fails with a duplicate key once that one commits).
        INSERT INTO rowclaim_jobs (queue, kind, payload, priority, run_at, max_attempts,
            unique_key, timeout_ms, limit_key, created_at)
        VALUES (v_queue, v_kind, job_payload, v_priority,
            COALESCE(TIMESTAMPADD(MICROSECOND, v_run_at_ms * 1000, TIMESTAMP '1970-01-01 00:00:00'),
                UTC_TIMESTAMP(6) + INTERVAL v_delay_ms * 1000 MICROSECOND),
            v_max_attempts, v_unique_key, v_timeout_ms, v_limit_key, UTC_TIMESTAMP(6));
        IF v_duplicate = 0 THEN
            SET v_id = LAST_INSERT_ID();
            LEAVE retry;
        END IF;
        -- A locking read sees the latest committed twin, also in a REPEATABLE READ snapshot
        -- older than it.
        SET v_id = NULL;
        SELECT MAX(id) INTO v_id FROM rowclaim_jobs WHERE pending_key = v_unique_key
            LOCK IN SHARE MODE;
        IF v_id IS NOT NULL THEN
            LEAVE retry;
        END IF;
        IF v_tries >= 5 THEN
            SET v_msg = CONCAT('rowclaim_enqueue: unique key ', v_unique_key,
                ' keeps changing hands; try again');
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_msg;
        END IF;
    END LOOP;
    IF v_after IS NOT NULL THEN
        -- As after::hold: the edges, then the verdict of after::judge on the jobs it waits
        -- for as they are now. One that finishes between this read and the commit is seen by
        -- the workers' sweep.
        SET v_i = 0;
        WHILE v_i < JSON_LENGTH(v_after) DO
            INSERT IGNORE INTO rowclaim_waits (job, waits_for)
            VALUES (v_id, CAST(JSON_EXTRACT(v_after, CONCAT('$[', v_i, ']')) AS SIGNED));
            SET v_i = v_i + 1;
        END WHILE;
        SELECT COUNT(*) INTO v_unfinished
            FROM rowclaim_waits AS w JOIN rowclaim_jobs AS j ON j.id = w.waits_for
            WHERE w.job = v_id AND j.status NOT IN ('completed', 'dead', 'cancelled');
        SELECT MIN(j.id) INTO v_failed_id
            FROM rowclaim_waits AS w JOIN rowclaim_jobs AS j ON j.id = w.waits_for
            WHERE w.job = v_id AND j.status IN ('dead', 'cancelled') AND NOT v_anyway;
        IF v_failed_id IS NOT NULL THEN
            SELECT status INTO v_failed_status FROM rowclaim_jobs WHERE id = v_failed_id;
            UPDATE rowclaim_jobs SET status = 'cancelled', finished_at = UTC_TIMESTAMP(6),
                last_error = CONCAT('cancelled: job ', v_failed_id, ', which it waited for, ',
                    IF(v_failed_status = 'dead', 'ended dead', 'was cancelled'))
            WHERE id = v_id;
        ELSE
            UPDATE rowclaim_jobs SET if_failed = IF(v_anyway, 'run', NULL),
                status = IF(v_unfinished > 0, 'waiting', status)
            WHERE id = v_id;
        END IF;
    END IF;
    SELECT v_id AS id;
END",
    ],
];

/// SQLite has no routines that write: its contract is the documented `INSERT`.
#[cfg(feature = "sqlite")]
pub(crate) const SQLITE: &[&[&str]] = &[];

#[cfg(test)]
mod tests;
