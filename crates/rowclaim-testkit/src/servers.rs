//! Private database servers for fault tests: a PostgreSQL or MariaDB of the test's own (own data
//! directory in a temp dir, own port on 127.0.0.1) that it may stop, crash, restart and whose
//! sessions it may kill. The machine's shared servers are never touched.
//!
//! - Everything is async (tokio) except `Drop`, which blocks for a moment: it stops the server at
//!   once (PostgreSQL: `pg_ctl stop -m immediate`; MariaDB: SIGKILL) and removes the directory,
//!   also when the test panics.
//! - A start takes about a second (initdb / mariadb-install-db, then the server); readiness is
//!   waited for up to 60 s by connecting every 100 ms. Failures panic with the server's log tail.
//! - Do not keep one in a `static` (statics are never dropped). Servers left behind by a test
//!   process that died without dropping them (Ctrl-C, SIGKILL) are stopped and removed by the
//!   first `start` of a later test process.
//! - Do not use them under a paused tokio clock, and do not call `stop`/`restart` of one server
//!   from two tasks at once (they are serialised, but the outcome would make no sense).
//! - As root (CI), PostgreSQL runs as the `postgres` OS user and MariaDB as root (`--user=root`).
//! - Nothing is shared with other servers: no unix sockets in /tmp (PostgreSQL has none, MariaDB's
//!   and its tmpdir are in its own dir), ports taken below the ephemeral range and claimed machine-wide for the server's life (see
//!   `spare_port`).
//!
//! A new backend proves itself by a driver and one `contract_suite!` invocation (see
//! [`crate::contract`]); a private server of its kind here is needed only for the fault suite.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use sqlx::{Connection, MySqlConnection, PgConnection};
use tokio::process::{Child, Command};

/// How long a server may take to start or stop (a loaded 2-core machine is slow).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
pub(crate) const POLL: Duration = Duration::from_millis(100);
/// Temp dir name prefixes; a file `owner` in each holds the PID of the test process.
const PG_PREFIX: &str = "rowclaim-pg-";
pub(crate) const MY_PREFIX: &str = "rowclaim-my-";

/// How a private server is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopMode {
    /// Clean shutdown: PostgreSQL `pg_ctl stop -m fast`, MariaDB SIGTERM. Sessions are ended.
    Fast,
    /// Crash: PostgreSQL `pg_ctl stop -m immediate`, MariaDB SIGKILL. Recovery at the next start.
    /// PostgreSQL still tells its clients that it is going away (SQLSTATE 57P01).
    Immediate,
    /// A machine crash or an OOM kill: SIGKILL of the server and every process it started, at
    /// once. Clients are told nothing; their sockets just close. (MariaDB: as `Immediate`.)
    Kill,
}

// ------------------------------------------------------------------------------- PostgreSQL

/// A PostgreSQL server of the test's own; superuser `postgres`, no password (trust).
pub struct PrivatePostgres {
    port: u16,
    /// Holds `port` for this server alone while it lives, also while it is stopped.
    _claim: Option<PortClaim>,
    bin: PathBuf,
    /// (uid, gid) of the `postgres` OS user when we are root.
    run_as: Option<(u32, u32)>,
    /// Whether it is running; the lock serialises stop/start.
    running: tokio::sync::Mutex<bool>,
    dir: tempfile::TempDir,
}

impl PrivatePostgres {
    /// initdb in a new temp dir, then starts the server on a spare port of 127.0.0.1 and waits
    /// until it accepts connections.
    pub async fn start() -> PrivatePostgres {
        PrivatePostgres::start_with("", &[]).await
    }

    /// [`PrivatePostgres::start`] with more lines for postgresql.conf and files put into the data
    /// directory first (owned by the server's user, readable by it alone: a TLS key must be).
    pub async fn start_with(conf: &str, files: &[(&str, &[u8])]) -> PrivatePostgres {
        sweep_leftovers();
        let bin = pg_bindir();
        let run_as = if is_root() {
            Some(os_user("postgres").unwrap_or_else(|| {
                panic!("running as root, but there is no `postgres` OS user to run PostgreSQL as")
            }))
        } else {
            None
        };
        let dir = new_dir(PG_PREFIX);
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown {} to postgres: {e}", dir.path().display()));
        }
        let mut pg = PrivatePostgres {
            port: 0,
            _claim: None,
            bin,
            run_as,
            running: tokio::sync::Mutex::new(false),
            dir,
        };
        let data = pg.data();
        let out = pg
            .cmd("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-locale"])
            .args(["--no-sync", "--no-instructions"])
            .output()
            .await
            .unwrap_or_else(|e| panic!("run {}: {e}", pg.bin.join("initdb").display()));
        if !out.status.success() {
            panic!("initdb failed ({}):\n{}", out.status, output_text(&out));
        }
        // Everything but the port (given to pg_ctl, so that a retry can change it).
        let base = "\n# rowclaim test harness\n\
            listen_addresses = '127.0.0.1'\n\
            unix_socket_directories = ''\n\
            fsync = off\n\
            max_connections = 100\n\
            shared_buffers = 32MB\n";
        append(&data.join("postgresql.conf"), &format!("{base}{conf}\n"));
        for (name, bytes) in files {
            let path = data.join(name);
            std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("write {name}: {e}"));
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap_or_else(|e| panic!("chmod {name}: {e}"));
            if let Some((uid, gid)) = run_as {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                    .unwrap_or_else(|e| panic!("chown {name} to postgres: {e}"));
            }
        }

        pg.first_launch("private PostgreSQL").await;
        pg
    }

    /// Starts the new server on a spare port, trying another when someone took the port
    /// meanwhile; panics with the log tail when it does not start.
    async fn first_launch(&mut self, what: &str) {
        for attempt in 1..=3 {
            let claim = spare_port();
            self.port = claim.port();
            self._claim = Some(claim);
            match self.launch().await {
                Ok(()) => {
                    *self.running.get_mut() = true;
                    return;
                }
                Err(e) if attempt < 3 && port_taken(&self.log_tail()) => {
                    eprintln!("{what}: port {} taken, trying another ({e})", self.port);
                    let _ = self.pg_ctl_stop("immediate").await;
                }
                Err(e) => panic!(
                    "{what} did not start on port {}: {e}\n--- server log tail ---\n{}",
                    self.port,
                    self.log_tail()
                ),
            }
        }
    }

    /// The port it listens on (127.0.0.1); the same after a restart.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A streaming standby of `primary`: a base backup of it (`pg_basebackup -R`, so it follows
    /// the primary's WAL) started on a spare port of its own. Promote it with
    /// [`PrivatePostgres::promote`].
    pub async fn standby_of(primary: &PrivatePostgres) -> PrivatePostgres {
        let dir = new_dir(PG_PREFIX);
        if let Some((uid, gid)) = primary.run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown {} to postgres: {e}", dir.path().display()));
        }
        let mut pg = PrivatePostgres {
            port: 0,
            _claim: None,
            bin: primary.bin.clone(),
            run_as: primary.run_as,
            running: tokio::sync::Mutex::new(false),
            dir,
        };
        let out = pg
            .cmd("pg_basebackup")
            .arg("-D")
            .arg(pg.data())
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "--no-sync",
            ])
            .arg("-p")
            .arg(primary.port.to_string())
            .output()
            .await
            .unwrap_or_else(|e| panic!("run pg_basebackup: {e}"));
        if !out.status.success() {
            panic!(
                "pg_basebackup failed ({}):\n{}",
                out.status,
                output_text(&out)
            );
        }
        // The name the primary's synchronous_standby_names can ask for.
        append(
            &pg.data().join("postgresql.auto.conf"),
            "\ncluster_name = 'standby'\n",
        );
        pg.first_launch("private standby").await;
        pg
    }

    /// Makes a standby the primary (`pg_ctl promote`, waiting until it takes writes).
    pub async fn promote(&self) {
        let out = self
            .cmd("pg_ctl")
            .arg("promote")
            .arg("-D")
            .arg(self.data())
            .args(["-w", "-t", "60"])
            .output()
            .await
            .unwrap_or_else(|e| panic!("run pg_ctl promote: {e}"));
        if !out.status.success() {
            panic!(
                "pg_ctl promote failed ({}): {}\n--- server log tail ---\n{}",
                out.status,
                output_text(&out),
                self.log_tail()
            );
        }
    }

    /// Makes this primary wait for its standby (`standby_of`) to apply every commit before it
    /// answers (`remote_apply`): a promotion then loses nothing a client was told of.
    pub async fn replicate_synchronously(&self) {
        self.admin_sql("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
            .await;
        self.admin_sql("ALTER SYSTEM SET synchronous_commit = 'remote_apply'")
            .await;
        self.admin_sql("SELECT pg_reload_conf()").await;
    }

    /// Runs `sql` (simple protocol, several statements allowed) as the superuser.
    pub async fn admin_sql(&self, sql: &str) {
        let mut c = self.admin().await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut c)
            .await
            .unwrap_or_else(|e| panic!("{sql} on private PostgreSQL: {e}"));
        let _ = c.close().await;
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`
    pub fn admin_url(&self) -> String {
        self.url("postgres")
    }

    /// The direct URL of `database` on this server.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates `name` (letters, digits, `_`) and returns its direct URL.
    pub async fn create_database(&self, name: &str) -> String {
        check_name(name);
        let mut c = self.admin().await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut c)
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} on private PostgreSQL: {e}"));
        let _ = c.close().await;
        self.url(name)
    }

    /// Stops the server (`pg_ctl stop -m fast|immediate`, waiting until it is down). A fast stop
    /// that does not finish within 60 s becomes an immediate one. No-op when already stopped.
    pub async fn stop(&self, mode: StopMode) {
        let mut running = self.running.lock().await;
        if !*running {
            return;
        }
        let result = match mode {
            StopMode::Fast => match self.pg_ctl_stop("fast").await {
                Ok(()) => Ok(()),
                Err(e) => {
                    eprintln!("private PostgreSQL: fast stop failed ({e}); stopping immediately");
                    self.pg_ctl_stop("immediate").await
                }
            },
            StopMode::Immediate => self.pg_ctl_stop("immediate").await,
            StopMode::Kill => self.kill_tree().await,
        };
        if let Err(e) = result {
            panic!(
                "could not stop private PostgreSQL ({mode:?}): {e}\n--- server log tail ---\n{}",
                self.log_tail()
            );
        }
        *running = false;
    }

    /// Starts the stopped server again on the same port and waits until it accepts connections
    /// (after `Immediate`, crash recovery runs first). No-op when it is running.
    pub async fn start_again(&self) {
        let mut running = self.running.lock().await;
        if *running {
            return;
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.launch().await {
                Ok(()) => break,
                // Someone took the port while the server was down: wait for it to go away.
                Err(_) if Instant::now() < deadline && port_taken(&self.log_tail()) => {
                    let _ = self.pg_ctl_stop("immediate").await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => panic!(
                    "private PostgreSQL did not start again on port {}: {e}\n--- server log tail ---\n{}",
                    self.port,
                    self.log_tail()
                ),
            }
        }
        *running = true;
    }

    /// `stop(mode)` then `start_again()`: the same port, the same data (committed work survives
    /// both modes).
    pub async fn restart(&self, mode: StopMode) {
        self.stop(mode).await;
        self.start_again().await;
    }

    /// Terminates every client backend connected to `database` (but the one doing it) and waits
    /// until they are gone; returns how many were terminated.
    pub async fn kill_backends(&self, database: &str) -> usize {
        let mut c = self.admin().await;
        let pids: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity \
             WHERE datname = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
        )
        .bind(database)
        .fetch_all(&mut c)
        .await
        .unwrap_or_else(|e| panic!("list the backends of {database}: {e}"));
        let mut killed = 0;
        for pid in &pids {
            let ok: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .fetch_one(&mut c)
                .await
                .unwrap_or_else(|e| panic!("pg_terminate_backend({pid}): {e}"));
            killed += usize::from(ok);
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let left: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)")
                    .bind(&pids[..])
                    .fetch_one(&mut c)
                    .await
                    .unwrap_or_else(|e| panic!("count the terminated backends: {e}"));
            if left == 0 {
                break;
            }
            if Instant::now() > deadline {
                panic!("{left} terminated backends of {database} still there after 60 s");
            }
            tokio::time::sleep(POLL).await;
        }
        let _ = c.close().await;
        killed
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        tail(&self.dir.path().join("server.log"), 40)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    async fn admin(&self) -> PgConnection {
        self.connect_own()
            .await
            .unwrap_or_else(|e| panic!("connect to private PostgreSQL {}: {e}", self.admin_url()))
    }

    /// An admin connection, once it is sure that this server answers on the port (its data
    /// directory): nothing is ever done to another server that holds or took the port.
    async fn connect_own(&self) -> Result<PgConnection, NotReady> {
        let mut c = PgConnection::connect(&self.admin_url()).await?;
        let dir: String = sqlx::query_scalar("SELECT current_setting('data_directory')")
            .fetch_one(&mut c)
            .await?;
        if same_dir(&dir, &self.data()) {
            Ok(c)
        } else {
            let _ = c.close().await;
            Err(NotReady::Yet(format!(
                "port {} is answered by another server (data directory {dir})",
                self.port
            )))
        }
    }

    /// A command of the PostgreSQL bin dir, run as the `postgres` user when we are root.
    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(self.bin.join(program));
        c.current_dir(self.dir.path())
            .stdin(Stdio::null())
            .env_remove("PGDATA")
            .env_remove("PGPORT");
        if let Some((uid, gid)) = self.run_as {
            c.uid(uid).gid(gid);
        }
        c
    }

    /// `pg_ctl start -w` on `self.port`, then a first connection.
    async fn launch(&self) -> Result<(), String> {
        let out = self
            .cmd("pg_ctl")
            .arg("start")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(["-w", "-t", "60", "-o"])
            .arg(format!("-p {}", self.port))
            .output()
            .await
            .map_err(|e| format!("run pg_ctl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pg_ctl start failed ({}): {}",
                out.status,
                output_text(&out)
            ));
        }
        wait_until_ready(|| async {
            let c = self.connect_own().await?;
            Ok(c.close().await?)
        })
        .await
    }

    /// SIGKILL of the postmaster and all its children in one `kill`, then waits until they are
    /// gone (a zombie counts as gone).
    async fn kill_tree(&self) -> Result<(), String> {
        let pid_file = self.data().join("postmaster.pid");
        let text = std::fs::read_to_string(&pid_file)
            .map_err(|e| format!("read {}: {e}", pid_file.display()))?;
        let postmaster: u32 = text
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| format!("no pid in {}", pid_file.display()))?;
        let mut pids = children_of(postmaster);
        pids.push(postmaster);
        let list: Vec<String> = pids.iter().map(u32::to_string).collect();
        signal_all(&list.join(" "), "KILL");
        let deadline = Instant::now() + READY_TIMEOUT;
        while let Some(pid) = pids.iter().find(|&&p| process_alive(p)) {
            if Instant::now() > deadline {
                return Err(format!("process {pid} still alive 60 s after SIGKILL"));
            }
            tokio::time::sleep(POLL).await;
        }
        // As after a reboot: the lock file names a dead server. (Where nothing reaps the killed
        // postmaster, its zombie would make pg_ctl take it for a running server.)
        std::fs::remove_file(&pid_file).map_err(|e| format!("remove {}: {e}", pid_file.display()))
    }

    async fn pg_ctl_stop(&self, mode: &str) -> Result<(), String> {
        let out = self
            .cmd("pg_ctl")
            .arg("stop")
            .arg("-D")
            .arg(self.data())
            .args(["-m", mode, "-w", "-t", "60"])
            .output()
            .await
            .map_err(|e| format!("run pg_ctl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl stop -m {mode} failed ({}): {}",
                out.status,
                output_text(&out)
            ))
        }
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        use std::os::unix::process::CommandExt;
        let mut c = std::process::Command::new(self.bin.join("pg_ctl"));
        c.arg("stop")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "-t", "60"])
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some((uid, gid)) = self.run_as {
            c.uid(uid).gid(gid);
        }
        let _ = c.status();
        // The temp dir goes when `self.dir` drops.
    }
}

/// The bin dir of the newest PostgreSQL under /usr/lib/postgresql, else `pg_config --bindir`.
fn pg_bindir() -> PathBuf {
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .max();
    if let Some((_, bin)) = newest {
        return bin;
    }
    if let Ok(out) = std::process::Command::new("pg_config")
        .arg("--bindir")
        .output()
    {
        let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if bin.join("initdb").exists() && bin.join("pg_ctl").exists() {
            return bin;
        }
    }
    panic!("no PostgreSQL server programs (initdb, pg_ctl) under /usr/lib/postgresql/*/bin or pg_config --bindir: install postgresql (scripts/test does)")
}

// ---------------------------------------------------------------------------------- MariaDB

/// A MariaDB server of the test's own; user `root` without password over TCP.
pub struct PrivateMariadb {
    port: u16,
    /// Holds `port` for this server alone while it lives, also while it is stopped.
    _claim: Option<PortClaim>,
    mariadbd: PathBuf,
    root: bool,
    /// The running server; the lock serialises stop/start.
    child: tokio::sync::Mutex<Option<Child>>,
    dir: tempfile::TempDir,
    /// Options given after [`MARIADB_FLAGS`] at every start (see [`PrivateMariadb::start_with`]).
    extra: Vec<String>,
}

/// Server flags besides datadir, port, socket, pid and log files.
pub(crate) const MARIADB_FLAGS: [&str; 12] = [
    "--bind-address=127.0.0.1",
    "--skip-name-resolve",
    "--skip-log-bin",
    "--innodb-buffer-pool-size=64M",
    "--innodb-log-file-size=16M",
    // Each commit is written to the OS (survives a SIGKILL), not fsynced.
    "--innodb-flush-log-at-trx-commit=2",
    "--innodb-use-native-aio=0",
    "--innodb-buffer-pool-load-at-startup=0",
    "--innodb-buffer-pool-dump-at-shutdown=0",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_general_ci",
    "--max-connections=200",
];

impl PrivateMariadb {
    /// mariadb-install-db in a new temp dir, then starts mariadbd on a spare port of 127.0.0.1
    /// and waits until `root` can log in.
    pub async fn start() -> PrivateMariadb {
        PrivateMariadb::start_with(&[]).await
    }

    /// [`PrivateMariadb::start`] with more mariadbd options, given after the usual ones (so they
    /// win over them) at this start and every later one: a server configured as the shared one
    /// must not be, e.g. `["--log-bin", "--binlog-format=STATEMENT"]` for statement-based
    /// replication.
    pub async fn start_with(extra: &[&str]) -> PrivateMariadb {
        sweep_leftovers();
        let mariadbd =
            first_existing(&["/usr/sbin/mariadbd", "/usr/sbin/mysqld"]).unwrap_or_else(|| {
                panic!("no /usr/sbin/mariadbd: install mariadb-server (scripts/test does)")
            });
        let install = first_existing(&["/usr/bin/mariadb-install-db", "/usr/bin/mysql_install_db"])
            .unwrap_or_else(|| {
                panic!("no /usr/bin/mariadb-install-db: install mariadb-server (scripts/test does)")
            });
        let mut my = PrivateMariadb {
            port: 0,
            _claim: None,
            mariadbd,
            root: is_root(),
            child: tokio::sync::Mutex::new(None),
            dir: new_dir(MY_PREFIX),
            extra: extra.iter().map(|o| (*o).to_owned()).collect(),
        };
        // Its own tmpdir: internal temp table names of two servers in one dir can collide.
        let tmp = my.dir.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap_or_else(|e| panic!("create {}: {e}", tmp.display()));
        let mut c = Command::new(&install);
        c.arg("--no-defaults")
            .arg(format!("--datadir={}", my.data().display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .args(["--skip-name-resolve", "--innodb-log-file-size=16M"])
            .current_dir(my.dir.path())
            .stdin(Stdio::null());
        if my.root {
            c.arg("--user=root");
        }
        let out = c
            .output()
            .await
            .unwrap_or_else(|e| panic!("run {}: {e}", install.display()));
        if !out.status.success() {
            panic!(
                "mariadb-install-db failed ({}):\n{}",
                out.status,
                output_text(&out)
            );
        }

        for attempt in 1..=3 {
            let claim = spare_port();
            my.port = claim.port();
            my._claim = Some(claim);
            match my.launch().await {
                Ok(child) => {
                    *my.child.get_mut() = Some(child);
                    return my;
                }
                Err(e) if attempt < 3 && port_taken(&my.log_tail()) => {
                    eprintln!(
                        "private MariaDB: port {} taken, trying another ({e})",
                        my.port
                    );
                }
                Err(e) => panic!(
                    "private MariaDB did not start on port {}: {e}\n--- server log tail ---\n{}",
                    my.port,
                    my.log_tail()
                ),
            }
        }
        unreachable!()
    }

    /// The port it listens on (127.0.0.1); the same after a restart.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://root@127.0.0.1:PORT/mysql`
    pub fn admin_url(&self) -> String {
        self.url("mysql")
    }

    /// The direct URL of `database` on this server.
    pub fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates `name` (letters, digits, `_`) and returns its direct URL.
    pub async fn create_database(&self, name: &str) -> String {
        check_name(name);
        let mut c = self.admin().await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .execute(&mut c)
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} on private MariaDB: {e}"));
        let _ = c.close().await;
        self.url(name)
    }

    /// Stops the server and waits until the process is gone: `Fast` sends SIGTERM (a clean
    /// shutdown; SIGKILL after 60 s), `Immediate` and `Kill` SIGKILL (a crash). No-op when
    /// already stopped.
    pub async fn stop(&self, mode: StopMode) {
        let mut slot = self.child.lock().await;
        let Some(mut child) = slot.take() else { return };
        if mode == StopMode::Fast {
            if let Some(pid) = child.id() {
                signal(pid, "TERM");
            }
            match tokio::time::timeout(READY_TIMEOUT, child.wait()).await {
                Ok(Ok(_)) => return,
                Ok(Err(e)) => panic!("wait for mariadbd to stop: {e}"),
                Err(_) => eprintln!("private MariaDB: no clean shutdown within 60 s; SIGKILL"),
            }
        }
        let _ = child.start_kill();
        child
            .wait()
            .await
            .unwrap_or_else(|e| panic!("wait for the killed mariadbd: {e}"));
    }

    /// Starts the stopped server again on the same port (InnoDB recovers after a crash) and waits
    /// until `root` can log in. No-op when it is running.
    pub async fn start_again(&self) {
        let mut slot = self.child.lock().await;
        if slot.is_some() {
            return;
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.launch().await {
                Ok(child) => {
                    *slot = Some(child);
                    return;
                }
                // Someone took the port while the server was down: wait for it to go away.
                Err(_) if Instant::now() < deadline && port_taken(&self.log_tail()) => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => panic!(
                    "private MariaDB did not start again on port {}: {e}\n--- server log tail ---\n{}",
                    self.port,
                    self.log_tail()
                ),
            }
        }
    }

    /// `stop(mode)` then `start_again()`: the same port, the same data.
    pub async fn restart(&self, mode: StopMode) {
        self.stop(mode).await;
        self.start_again().await;
    }

    /// KILLs every connection whose current database is `database` (but the one doing it) and
    /// waits until they are gone; returns how many were killed.
    pub async fn kill_backends(&self, database: &str) -> usize {
        let mut c = self.admin().await;
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT CAST(id AS SIGNED) FROM information_schema.processlist \
             WHERE db = ? AND id <> CONNECTION_ID()",
        )
        .bind(database)
        .fetch_all(&mut c)
        .await
        .unwrap_or_else(|e| panic!("list the connections to {database}: {e}"));
        let mut killed = 0;
        for id in &ids {
            // Fails only when the connection ended meanwhile (unknown thread id).
            let r = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
                .execute(&mut c)
                .await;
            killed += usize::from(r.is_ok());
        }
        if !ids.is_empty() {
            let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
            let sql =
                format!("SELECT COUNT(*) FROM information_schema.processlist WHERE id IN ({list})");
            let deadline = Instant::now() + READY_TIMEOUT;
            loop {
                let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone()))
                    .fetch_one(&mut c)
                    .await
                    .unwrap_or_else(|e| panic!("count the killed connections: {e}"));
                if left == 0 {
                    break;
                }
                if Instant::now() > deadline {
                    panic!("{left} killed connections to {database} still there after 60 s");
                }
                tokio::time::sleep(POLL).await;
            }
        }
        let _ = c.close().await;
        killed
    }

    /// The last lines of the server's error log.
    pub fn log_tail(&self) -> String {
        tail(&self.dir.path().join("error.log"), 40)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    async fn admin(&self) -> MySqlConnection {
        self.connect_own()
            .await
            .unwrap_or_else(|e| panic!("connect to private MariaDB {}: {e}", self.admin_url()))
    }

    /// An admin connection, once it is sure that this server answers on the port (its data
    /// directory): nothing is ever done to another server that holds or took the port.
    async fn connect_own(&self) -> Result<MySqlConnection, NotReady> {
        let mut c = MySqlConnection::connect(&self.admin_url()).await?;
        let dir: String = sqlx::query_scalar("SELECT @@datadir")
            .fetch_one(&mut c)
            .await?;
        if same_dir(&dir, &self.data()) {
            Ok(c)
        } else {
            let _ = c.close().await;
            Err(NotReady::Yet(format!(
                "port {} is answered by another server (datadir {dir})",
                self.port
            )))
        }
    }

    /// Spawns mariadbd on `self.port` and waits until `root` can log in.
    async fn launch(&self) -> Result<Child, String> {
        let d = self.dir.path();
        let mut c = Command::new(&self.mariadbd);
        c.arg("--no-defaults"); // must come first
        if self.root {
            c.arg("--user=root");
        }
        c.arg(format!("--datadir={}", self.data().display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--socket={}", d.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", d.join("mysqld.pid").display()))
            .arg(format!("--log-error={}", d.join("error.log").display()))
            .arg(format!("--tmpdir={}", d.join("tmp").display()))
            .args(MARIADB_FLAGS)
            .args(&self.extra)
            .current_dir(d)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = c
            .spawn()
            .map_err(|e| format!("run {}: {e}", self.mariadbd.display()))?;
        let child_ref = &mut child;
        let ready = wait_until_ready(|| {
            let exited = child_ref.try_wait();
            async move {
                match exited {
                    Ok(Some(status)) => Err(NotReady::Gone(format!("mariadbd exited ({status})"))),
                    _ => {
                        let c = self.connect_own().await?;
                        Ok(c.close().await?)
                    }
                }
            }
        })
        .await;
        match ready {
            Ok(()) => Ok(child),
            Err(e) => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                Err(e)
            }
        }
    }
}

impl Drop for PrivateMariadb {
    fn drop(&mut self) {
        if let Some(child) = self.child.get_mut() {
            let _ = child.start_kill();
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // The temp dir goes when `self.dir` drops.
    }
}

// ---------------------------------------------------------------------------------- helpers

/// Why a readiness check failed.
enum NotReady {
    /// Not yet (try again).
    Yet(String),
    /// Never (the server process is gone).
    Gone(String),
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReady::Yet(e) | NotReady::Gone(e) => f.write_str(e),
        }
    }
}

/// Whether a server's data directory (as it reports it) is `ours`.
fn same_dir(reported: &str, ours: &Path) -> bool {
    let reported = Path::new(reported.trim_end_matches('/'));
    match (std::fs::canonicalize(reported), std::fs::canonicalize(ours)) {
        (Ok(a), Ok(b)) => a == b,
        _ => reported == ours,
    }
}

impl From<sqlx::Error> for NotReady {
    fn from(e: sqlx::Error) -> NotReady {
        NotReady::Yet(e.to_string())
    }
}

/// Runs `check` every 100 ms until it succeeds (each try limited to 10 s), for up to 60 s, or
/// until it says `Gone`.
async fn wait_until_ready<F, Fut>(mut check: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), NotReady>>,
{
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let last = match tokio::time::timeout(Duration::from_secs(10), check()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(NotReady::Gone(e))) => return Err(e),
            Ok(Err(NotReady::Yet(e))) => e,
            Err(_) => "connection attempt timed out after 10 s".to_owned(),
        };
        if Instant::now() > deadline {
            return Err(format!("no connection within 60 s, last error: {last}"));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A port reserved on this machine for one private server (or PgBouncer, Galera port,
/// chromedriver) of any test process, for as long as the claim lives: a lock (flock) on
/// `/tmp/rowclaim-ports/PORT`, which the kernel also drops when the process dies. Keep it beside
/// the server for the server's whole life, also while it is stopped: a failover test's killed
/// primary keeps its port, so that another test (of this binary or of one running beside it)
/// cannot start a server there that the workers' route would then take for the old primary.
#[derive(Debug)]
pub(crate) struct PortClaim {
    port: u16,
    _lock: std::fs::File,
}

impl PortClaim {
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

/// Where the port locks are: one directory for every user's test processes.
const PORT_LOCKS: &str = "/tmp/rowclaim-ports";

/// A port nobody listens on now and no other live claim holds. Taken below the kernel's
/// ephemeral range when there is room, so that while a server is down for a restart its port is
/// not handed out to an outgoing connection or a `bind(0)` (the proxies use those, and
/// chromedriver's clients).
pub(crate) fn spare_port() -> PortClaim {
    try_spare_port().unwrap_or_else(|e| panic!("find a spare port on 127.0.0.1: {e}"))
}

/// [`spare_port`], for a caller that reports the error instead of panicking.
pub(crate) fn try_spare_port() -> std::io::Result<PortClaim> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    const LOW: u32 = 10_000;
    if ephemeral_low > LOW + 1000 {
        for _ in 0..200 {
            let port = (LOW + random() % (ephemeral_low - LOW)) as u16;
            if let Some(claim) = claim_port(port)? {
                return Ok(claim);
            }
        }
    }
    for _ in 0..200 {
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))?
            .local_addr()?
            .port();
        if let Some(claim) = claim_port(port)? {
            return Ok(claim);
        }
    }
    Err(std::io::Error::other(format!(
        "no free, unclaimed port found (locks in {PORT_LOCKS})"
    )))
}

/// The claim of `port`, or None when another claim holds it or something listens on it.
fn claim_port(port: u16) -> std::io::Result<Option<PortClaim>> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = Path::new(PORT_LOCKS);
    if !dir.is_dir() {
        match std::fs::create_dir(dir) {
            // Every user's tests lock here (sticky, like /tmp).
            Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    // The files stay (one per port ever claimed, empty): removing one could let two processes
    // lock two different files of the same name.
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .open(dir.join(port.to_string()))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
        return Ok(None);
    }
    Ok(Some(PortClaim { port, _lock: lock }))
}

fn random() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish() as u32
}

/// Whether a server log says its port was in use.
pub(crate) fn port_taken(log: &str) -> bool {
    log.contains("Address already in use")
        || log.contains("could not bind IPv4")
        || log.contains("Bind on TCP/IP port")
}

pub(crate) fn is_root() -> bool {
    match std::fs::metadata("/proc/self") {
        Ok(m) => m.uid() == 0,
        Err(_) => std::process::Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
            .unwrap_or(false),
    }
}

/// (uid, gid) of an OS user, from /etc/passwd.
pub(crate) fn os_user(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() > 3 && f[0] == name).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}

/// Where the servers' temp dirs go: the temp dir, or /tmp when another user (`postgres`) could
/// not get through it.
fn temp_root() -> PathBuf {
    let t = std::env::temp_dir();
    let passable = t.ancestors().all(|p| {
        std::fs::metadata(p)
            .map(|m| m.mode() & 0o001 != 0)
            .unwrap_or(false)
    });
    if passable || !is_root() {
        t
    } else {
        PathBuf::from("/tmp")
    }
}

/// A new temp dir with an `owner` file naming this process (see `sweep_leftovers`).
pub(crate) fn new_dir(prefix: &str) -> tempfile::TempDir {
    let root = temp_root();
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&root)
        .unwrap_or_else(|e| panic!("create a temp dir in {}: {e}", root.display()));
    std::fs::write(dir.path().join("owner"), std::process::id().to_string())
        .unwrap_or_else(|e| panic!("write {}/owner: {e}", dir.path().display()));
    dir
}

/// Once per test process: stops and removes the private servers of test processes that are gone
/// (killed before their servers were dropped). Only dirs with an `owner` file whose process no
/// longer exists are touched, and only a server process whose command line names that dir.
pub(crate) fn sweep_leftovers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if !Path::new("/proc/self").exists() {
            return;
        }
        let Ok(entries) = std::fs::read_dir(temp_root()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let (pid_file, sig) = if name.starts_with(PG_PREFIX) {
                ("data/postmaster.pid", "QUIT")
            } else if name.starts_with(MY_PREFIX) {
                ("mysqld.pid", "KILL")
            } else {
                continue;
            };
            let dir = entry.path();
            let Some(owner) = read_pid(&dir.join("owner")) else {
                continue;
            };
            if alive(owner) {
                continue;
            }
            if let Some(pid) = read_pid(&dir.join(pid_file)) {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let dir_text = dir.to_string_lossy();
                if String::from_utf8_lossy(&cmdline).contains(dir_text.as_ref()) {
                    eprintln!("stopping a leftover private server (pid {pid}) in {dir_text}");
                    signal(pid, sig);
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while alive(pid) && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    });
}

/// Whether process `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The number on the first line of a file.
fn read_pid(path: &Path) -> Option<u32> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .read_to_string(&mut text)
        .ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// Sends SIG`name` to `pid` (through the shell's `kill`, present on every machine).
pub(crate) fn signal(pid: u32, name: &str) {
    signal_all(&pid.to_string(), name);
}

/// Sends signal `name` to the space-separated `pids` in one `kill`.
fn signal_all(pids: &str, name: &str) {
    let _ = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("kill -{name} {pids}"))
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The pids whose parent is `parent` (from /proc/*/stat).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    // pid (comm) state ppid …: comm may hold spaces and parentheses.
                    let after = &stat[stat.rfind(')')? + 1..];
                    after.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

/// Whether `pid` runs (a zombie does not).
fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        state != Some("Z") && state != Some("X")
    })
}

pub(crate) fn check_name(name: &str) {
    assert!(
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
        "database name {name:?}: use letters, digits and _ only"
    );
}

pub(crate) fn first_existing(paths: &[&str]) -> Option<PathBuf> {
    paths.iter().map(PathBuf::from).find(|p| p.exists())
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap_or_else(|e| panic!("append to {}: {e}", path.display()));
}

/// The last `lines` lines of a file (or why it could not be read).
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

pub(crate) fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claimed port is handed out to nobody else while the claim lives: not in this process, not
    /// in another (flock(1) stands in for another test binary); dropped, it is free again.
    #[test]
    fn a_claimed_port_is_not_handed_out_again() {
        let claim = spare_port();
        let port = claim.port();
        assert!(
            claim_port(port).expect("claim").is_none(),
            "port {port} handed out twice in one process"
        );
        let lock = Path::new(PORT_LOCKS).join(port.to_string());
        // Whether another process gets the port's lock at once.
        let another_locks = || {
            std::process::Command::new("flock")
                .arg("-n")
                .arg(&lock)
                .arg("true")
                .status()
                .expect("run flock (util-linux)")
                .success()
        };
        assert!(
            !another_locks(),
            "another process could lock {} while the claim lives",
            lock.display()
        );
        drop(claim);
        assert!(
            another_locks(),
            "{} still locked after the claim ended",
            lock.display()
        );
    }
}
