//! The soak's private servers and the faults done to them.
//!
//! - PostgreSQL: a primary with a synchronous standby (remote_apply: a commit the workers were
//!   told of is on the standby, so a promotion loses nothing that was confirmed), a TCP proxy in
//!   front of each, the workers on the multi-host URL of the two proxies (as deploy.rs's
//!   failover tests), and one `rowclaim work` through a PgBouncer (transaction pooling) of the
//!   soak's own, restarted on the same port.
//! - MariaDB: one server, a TCP proxy in front of it, the workers through the proxy.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use rowclaim_testkit::proxy::Proxy;
use rowclaim_testkit::servers::{PrivateMariadb, PrivatePostgres, StopMode};
use sqlx::Connection;

/// The soak's database on each server.
pub const DB: &str = "soak";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// The (current primary) server stopped immediately (a crash) and started again.
    Restart,
    /// Every connection through the proxies closed.
    Cut,
    /// No byte through the proxies for a few seconds.
    BlackHole,
    /// A worker SIGKILLed; a replacement started.
    KillWorker,
    /// A worker SIGSTOPped past its lease, then SIGCONT.
    StopWorker,
    /// The PgBouncer killed (SIGTERM: its immediate shutdown) and started again on its port.
    PgBouncerRestart,
    /// The primary crashed and the standby promoted (once: there is one standby).
    Promote,
}

impl FaultKind {
    /// The kind named `name` (ROWCLAIM_SOAK_FAULTS).
    pub fn from_name(name: &str) -> Option<FaultKind> {
        Some(match name {
            "restart" => FaultKind::Restart,
            "cut" => FaultKind::Cut,
            "black-hole" => FaultKind::BlackHole,
            "kill" => FaultKind::KillWorker,
            "stop" => FaultKind::StopWorker,
            "pgbouncer" => FaultKind::PgBouncerRestart,
            "promote" => FaultKind::Promote,
            _ => return None,
        })
    }

    pub fn label(self) -> &'static str {
        match self {
            FaultKind::Restart => "server restart (immediate)",
            FaultKind::Cut => "connections cut",
            FaultKind::BlackHole => "black hole",
            FaultKind::KillWorker => "worker SIGKILLed",
            FaultKind::StopWorker => "worker SIGSTOPped past its lease",
            FaultKind::PgBouncerRestart => "PgBouncer restart",
            FaultKind::Promote => "standby promoted",
        }
    }
}

pub enum Rig {
    Postgres(Box<PgRig>),
    Mariadb(Box<MyRig>),
}

pub struct PgRig {
    primary: PrivatePostgres,
    standby: PrivatePostgres,
    to_primary: Proxy,
    to_standby: Proxy,
    bouncer: Bouncer,
    promoted: bool,
}

pub struct MyRig {
    server: PrivateMariadb,
    proxy: Proxy,
}

impl Rig {
    pub async fn postgres() -> Rig {
        let primary = PrivatePostgres::start().await;
        let standby = PrivatePostgres::standby_of(&primary).await;
        primary.replicate_synchronously().await;
        primary.create_database(DB).await;
        let to_primary = Proxy::start(primary.port()).await;
        let to_standby = Proxy::start(standby.port()).await;
        let bouncer = Bouncer::start(primary.port()).await;
        Rig::Postgres(Box::new(PgRig {
            primary,
            standby,
            to_primary,
            to_standby,
            bouncer,
            promoted: false,
        }))
    }

    pub async fn mariadb() -> Rig {
        let server = PrivateMariadb::start().await;
        server.create_database(DB).await;
        let proxy = Proxy::start(server.port()).await;
        Rig::Mariadb(Box::new(MyRig { server, proxy }))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Rig::Postgres(_) => "postgres",
            Rig::Mariadb(_) => "mariadb",
        }
    }

    /// The URL most workers use: the multi-host URL of both proxies (PostgreSQL), the proxy's
    /// (MariaDB).
    pub fn url(&self) -> String {
        match self {
            Rig::Postgres(pg) => format!(
                "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{DB}",
                pg.to_primary.port(),
                pg.to_standby.port()
            ),
            Rig::Mariadb(my) => format!("mysql://root@127.0.0.1:{}/{DB}", my.proxy.port()),
        }
    }

    /// Where the servers listen, for someone looking at them during a run.
    pub fn servers(&self) -> String {
        match self {
            Rig::Postgres(pg) => format!(
                "primary on port {}, standby on {}, proxies {} and {}, PgBouncer {}",
                pg.primary.port(),
                pg.standby.port(),
                pg.to_primary.port(),
                pg.to_standby.port(),
                pg.bouncer.port
            ),
            Rig::Mariadb(my) => format!(
                "MariaDB on port {}, proxy {}",
                my.server.port(),
                my.proxy.port()
            ),
        }
    }

    /// The PgBouncer's URL (PostgreSQL only).
    pub fn bouncer_url(&self) -> Option<String> {
        match self {
            Rig::Postgres(pg) => Some(pg.bouncer.url(DB)),
            Rig::Mariadb(_) => None,
        }
    }

    /// The faults this rig can do (workers' faults included).
    pub fn kinds(&self) -> Vec<FaultKind> {
        let mut kinds = vec![
            FaultKind::Restart,
            FaultKind::Cut,
            FaultKind::BlackHole,
            FaultKind::KillWorker,
            FaultKind::StopWorker,
        ];
        if let Rig::Postgres(pg) = self {
            kinds.push(FaultKind::PgBouncerRestart);
            if !pg.promoted {
                kinds.push(FaultKind::Promote);
            }
        }
        kinds
    }

    /// Does a server or network fault; returns what it did, for the report.
    pub async fn fault(&mut self, kind: FaultKind, black_hole: Duration) -> String {
        match (self, kind) {
            (Rig::Postgres(pg), FaultKind::Restart) => {
                pg.current().restart(StopMode::Immediate).await;
                format!("port {}", pg.current().port())
            }
            (Rig::Mariadb(my), FaultKind::Restart) => {
                my.server.restart(StopMode::Immediate).await;
                String::new()
            }
            (Rig::Postgres(pg), FaultKind::Cut) => {
                let n = pg.to_primary.connections() + pg.to_standby.connections();
                pg.to_primary.cut_all();
                pg.to_standby.cut_all();
                format!("{n} connections")
            }
            (Rig::Mariadb(my), FaultKind::Cut) => {
                let n = my.proxy.connections();
                my.proxy.cut_all();
                format!("{n} connections")
            }
            (Rig::Postgres(pg), FaultKind::BlackHole) => {
                pg.to_primary.blackhole(true);
                pg.to_standby.blackhole(true);
                tokio::time::sleep(black_hole).await;
                pg.to_primary.blackhole(false);
                pg.to_standby.blackhole(false);
                format!("{} s", black_hole.as_secs())
            }
            (Rig::Mariadb(my), FaultKind::BlackHole) => {
                my.proxy.blackhole(true);
                tokio::time::sleep(black_hole).await;
                my.proxy.blackhole(false);
                format!("{} s", black_hole.as_secs())
            }
            (Rig::Postgres(pg), FaultKind::PgBouncerRestart) => {
                let port = pg.current().port();
                pg.bouncer.restart(port).await;
                String::new()
            }
            (Rig::Postgres(pg), FaultKind::Promote) => {
                pg.primary.stop(StopMode::Immediate).await;
                // An operator's (or a failover manager's) reaction time.
                tokio::time::sleep(Duration::from_secs(1)).await;
                pg.standby.promote().await;
                pg.promoted = true;
                // The pooler follows the new primary, as its operator would make it.
                pg.bouncer.restart(pg.standby.port()).await;
                format!("standby on port {} is the primary", pg.standby.port())
            }
            (_, kind) => panic!("{kind:?} is not a fault of this rig"),
        }
    }

    /// Client sessions on the soak's database (all servers that are up), not counting this one.
    pub async fn connections(&self) -> i64 {
        match self {
            Rig::Postgres(pg) => {
                let mut ports = vec![pg.standby.port()];
                if !pg.promoted {
                    ports.push(pg.primary.port());
                }
                let mut n = 0;
                for port in ports {
                    n += pg_sessions(port).await.unwrap_or(0);
                }
                n
            }
            Rig::Mariadb(my) => my_sessions(&my.server.admin_url()).await.unwrap_or(0),
        }
    }

    /// Jobs of the soak's queue: (id, status, unique key), read directly from the server that
    /// takes writes.
    pub async fn jobs(&self) -> Vec<(i64, String, String)> {
        const SQL: &str = "SELECT id, status, COALESCE(unique_key, '') FROM rowclaim_jobs \
                           WHERE queue = 'soak' ORDER BY id";
        match self {
            Rig::Postgres(pg) => {
                let mut c = sqlx::PgConnection::connect(&pg.current().url(DB))
                    .await
                    .expect("connect to the primary");
                sqlx::query_as(SQL)
                    .fetch_all(&mut c)
                    .await
                    .expect("read the jobs")
            }
            Rig::Mariadb(my) => {
                let mut c = sqlx::MySqlConnection::connect(&my.server.url(DB))
                    .await
                    .expect("connect to MariaDB");
                let rows: Vec<(i64, String, String)> = sqlx::query_as(SQL)
                    .fetch_all(&mut c)
                    .await
                    .expect("read the jobs");
                rows
            }
        }
    }
}

impl PgRig {
    fn current(&self) -> &PrivatePostgres {
        if self.promoted {
            &self.standby
        } else {
            &self.primary
        }
    }
}

async fn pg_sessions(port: u16) -> Result<i64, sqlx::Error> {
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let mut c = sqlx::PgConnection::connect(&url).await?;
    let n = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
         AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
    )
    .bind(DB)
    .fetch_one(&mut c)
    .await?;
    let _ = c.close().await;
    Ok(n)
}

async fn my_sessions(admin: &str) -> Result<i64, sqlx::Error> {
    let mut c = sqlx::MySqlConnection::connect(admin).await?;
    let n = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.processlist WHERE db = ? AND id <> CONNECTION_ID()",
    )
    .bind(DB)
    .fetch_one(&mut c)
    .await?;
    let _ = c.close().await;
    Ok(n)
}

// ------------------------------------------------------------------------------- PgBouncer

/// A PgBouncer (transaction pooling) on a port of its own that it keeps across restarts (the
/// testkit's `PgBouncer` takes a new port each start; a restart must not move clients).
pub struct Bouncer {
    port: u16,
    child: Option<std::process::Child>,
    dir: tempfile::TempDir,
}

impl Bouncer {
    async fn start(upstream: u16) -> Bouncer {
        let dir = tempfile::Builder::new()
            .prefix("rowclaim-soak-pgbouncer-")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a spare port")
            .port();
        let mut b = Bouncer {
            port,
            child: None,
            dir,
        };
        b.launch(upstream).await;
        b
    }

    fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}?pgbouncer=true",
            self.port
        )
    }

    /// Stops it (SIGTERM) and starts it again on the same port, in front of `upstream`.
    async fn restart(&mut self, upstream: u16) {
        self.stop();
        self.launch(upstream).await;
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }

    async fn launch(&mut self, upstream: u16) {
        let root = std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
            .unwrap_or(false);
        let run_as = root.then(|| os_user("postgres").expect("a postgres OS user"));
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(self.dir.path(), Some(uid), Some(gid)).expect("chown");
        }
        let d = self.dir.path();
        let ini = d.join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host=127.0.0.1 port={upstream} user=postgres\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {}\nunix_socket_dir =\n\
                 auth_type = any\npool_mode = transaction\ndefault_pool_size = 4\n\
                 max_client_conn = 1000\nlogfile = {}\npidfile = {}\n",
                self.port,
                d.join("pgbouncer.log").display(),
                d.join("pgbouncer.pid").display()
            ),
        )
        .expect("write pgbouncer.ini");
        let program = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from("pgbouncer"));
        // The port was just given up by the old process: try a few times.
        for _ in 0..50 {
            let mut cmd = std::process::Command::new(&program);
            cmd.arg(&ini)
                .current_dir(d)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some((uid, gid)) = run_as {
                use std::os::unix::process::CommandExt;
                cmd.uid(uid).gid(gid);
            }
            let mut child = cmd.spawn().expect("start pgbouncer");
            for _ in 0..50 {
                if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                    .await
                    .is_ok()
                {
                    self.child = Some(child);
                    return;
                }
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let log = std::fs::read_to_string(d.join("pgbouncer.log")).unwrap_or_default();
        panic!("PgBouncer did not start on port {}:\n{log}", self.port);
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn os_user(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() > 3 && f[0] == name).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}
