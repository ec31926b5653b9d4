//! A PgBouncer of the test's own in transaction pooling mode, in front of a PostgreSQL server:
//! the deployment most hosted PostgreSQL is reached through.
//!
//! Its pools are small (a few server connections per database) so that the clients of one test
//! really do share server connections between transactions: a statement that relied on
//! keeping its server connection (a named prepared statement, a parse in one round trip and the
//! execute in the next) fails here as it would in production. Nothing of the server behind it is
//! changed; PgBouncer is only another client of it.
//!
//! It runs in the foreground as a child of the test process (as the `postgres` OS user when the
//! test runs as root: PgBouncer refuses root), dies with that process (parent-death signal), and
//! is killed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::{Connection, Executor, PgConnection};

use crate::servers;

/// Server connections per database and user: small, so that clients share them.
pub const POOL_SIZE: u32 = 4;

/// A running PgBouncer (transaction pooling) on a spare port of 127.0.0.1.
pub struct PgBouncer {
    port: u16,
    /// Holds `port` for this PgBouncer alone while it lives.
    _claim: servers::PortClaim,
    child: Child,
    dir: tempfile::TempDir,
}

impl PgBouncer {
    /// Starts one in front of the PostgreSQL at `host:port` (logging in there as `postgres`),
    /// and waits until a query passes through it.
    pub async fn start(host: &str, port: u16) -> PgBouncer {
        let program = pgbouncer_program();
        let run_as = servers::is_root().then(|| {
            servers::os_user("postgres").unwrap_or_else(|| {
                panic!("running as root, but there is no `postgres` OS user to run PgBouncer as")
            })
        });
        let dir = servers::new_dir("rowclaim-pgbouncer-");
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown {} to postgres: {e}", dir.path().display()));
        }
        let mut last = String::new();
        for _ in 0..3 {
            let claim = servers::spare_port();
            let listen = claim.port();
            let ini = dir.path().join("pgbouncer.ini");
            std::fs::write(
                &ini,
                format!(
                    "[databases]\n\
                     * = host={host} port={port} user=postgres\n\
                     [pgbouncer]\n\
                     listen_addr = 127.0.0.1\n\
                     listen_port = {listen}\n\
                     unix_socket_dir =\n\
                     auth_type = any\n\
                     pool_mode = transaction\n\
                     default_pool_size = {POOL_SIZE}\n\
                     max_client_conn = 1000\n\
                     logfile = {log}\n\
                     pidfile = {pid}\n",
                    log = dir.path().join("pgbouncer.log").display(),
                    pid = dir.path().join("pgbouncer.pid").display(),
                ),
            )
            .unwrap_or_else(|e| panic!("write {}: {e}", ini.display()));
            let mut cmd = Command::new(&program);
            cmd.arg(&ini)
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some((uid, gid)) = run_as {
                use std::os::unix::process::CommandExt;
                cmd.uid(uid).gid(gid);
            }
            die_with_parent(&mut cmd);
            let mut child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
            match wait_ready(&mut child, listen).await {
                Ok(()) => {
                    return PgBouncer {
                        port: listen,
                        _claim: claim,
                        child,
                        dir,
                    }
                }
                Err(e) => {
                    let log = servers::tail(&dir.path().join("pgbouncer.log"), 30);
                    last = format!("{e}\n--- pgbouncer log ---\n{log}");
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        panic!("PgBouncer did not start: {last}")
    }

    /// The URL of `database` through this PgBouncer, with `pgbouncer=true`.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}?pgbouncer=true",
            self.port
        )
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        servers::tail(&self.dir.path().join("pgbouncer.log"), 30)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// PgBouncer is killed if the test process dies before dropping it.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec here.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
}

/// The pgbouncer program (Debian's package puts it in /usr/sbin, which a user's PATH may lack).
fn pgbouncer_program() -> PathBuf {
    for p in ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"] {
        if std::path::Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    panic!("pgbouncer is not installed: apt-get install pgbouncer (scripts/test does)")
}

/// Waits until a query passes through the PgBouncer on `port` (or it exits).
async fn wait_ready(child: &mut Child, port: u16) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    // No startup parameter PgBouncer would refuse.
    let opts = sqlx::postgres::PgConnectOptions::new()
        .host("127.0.0.1")
        .port(port)
        .username("postgres")
        .database("postgres")
        .extra_float_digits(None);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("pgbouncer exited ({status})"));
        }
        let attempt = async {
            let mut c = PgConnection::connect_with(&opts).await?;
            // A simple query: no prepared statement to trip over.
            c.execute("SELECT 1").await?;
            c.close().await
        };
        let last = match tokio::time::timeout(Duration::from_secs(10), attempt).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 10 s".to_owned(),
        };
        if Instant::now() > deadline {
            return Err(format!("no query passed within 60 s: {last}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
