//! A MariaDB Galera cluster of the test's own: `n` nodes on 127.0.0.1, each in its own temp dir
//! with its own spare ports (client, group communication, incremental and full state transfer).
//! The first node bootstraps the cluster (`--wsrep-new-cluster`); the others join it and receive
//! its data by rsync (`wsrep_sst_method=rsync`). Dropping the cluster kills every node and removes
//! the dirs, also when the test panics; failures panic with every node's log tail.
//!
//! Needs `galera-4` (the wsrep provider), `rsync`, and `ss` or `lsof` (scripts/test installs
//! them). As root, mariadbd runs as root (`--user=root`); the rsync daemon of a joining node then
//! runs as `nobody`, so that node's data dir belongs to `nobody` until the transfer is done.
//!
//! A start takes about 10 s on a 2-core machine (the joiners' state transfers dominate).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use sqlx::{Connection, MySqlConnection};
use tokio::process::{Child, Command};

use crate::servers::{
    check_name, first_existing, is_root, new_dir, os_user, output_text, port_taken, spare_port,
    sweep_leftovers, tail, PortClaim, MARIADB_FLAGS, MY_PREFIX, POLL,
};

const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

/// How long a node may take to start, join and be synced (a state transfer on a loaded machine).
const SYNC_TIMEOUT: Duration = Duration::from_secs(120);

/// A running Galera cluster; user `root` without password over TCP on every node.
pub struct GaleraCluster {
    nodes: Vec<Node>,
}

struct Node {
    /// The client port.
    port: u16,
    /// Group communication (`gmcast.listen_addr`, `wsrep_node_address`).
    gcomm: u16,
    /// Incremental state transfer (`ist.recv_addr`).
    ist: u16,
    /// Full state transfer (`wsrep_sst_receive_address`): the joiner's rsync daemon.
    sst: u16,
    /// Hold the four ports for this node alone while it lives.
    _claims: [PortClaim; 4],
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let claims = [spare_port(), spare_port(), spare_port(), spare_port()];
        Node {
            port: claims[0].port(),
            gcomm: claims[1].port(),
            ist: claims[2].port(),
            sst: claims[3].port(),
            _claims: claims,
            child: None,
            dir: new_dir(MY_PREFIX),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }

    fn log_tail(&self) -> String {
        tail(&self.dir.path().join("error.log"), 30)
    }
}

impl GaleraCluster {
    /// Starts an `n`-node cluster (n ≥ 1) and waits until every node is synced.
    pub async fn start(n: usize) -> GaleraCluster {
        assert!(n >= 1, "a cluster needs a node");
        sweep_leftovers();
        let mariadbd = first_existing(&["/usr/sbin/mariadbd", "/usr/sbin/mysqld"])
            .unwrap_or_else(|| panic!("no /usr/sbin/mariadbd: install mariadb-server"));
        assert!(
            Path::new(PROVIDER).exists(),
            "no {PROVIDER}: install galera-4 (scripts/test does)"
        );
        // Ports are taken before any node starts; one taken meanwhile by someone else makes a
        // node fail to start, and then the whole cluster is tried again on new ports.
        for attempt in 1..=3 {
            let mut cluster = GaleraCluster {
                nodes: (0..n).map(|_| Node::new()).collect(),
            };
            match cluster.launch(&mariadbd).await {
                Ok(()) => return cluster,
                Err(e)
                    if attempt < 3 && cluster.nodes.iter().any(|n| port_taken(&n.log_tail())) =>
                {
                    eprintln!("Galera cluster: a port was taken, trying others ({e})");
                }
                Err(e) => panic!("Galera cluster did not start: {e}\n{}", cluster.log_tails()),
            }
        }
        unreachable!()
    }

    /// How many nodes it has.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether it has no node (never: `start` needs one).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The direct URL of `database` on node `i`.
    pub fn url(&self, i: usize, database: &str) -> String {
        self.nodes[i].url(database)
    }

    /// The URL of `database` on each node, in node order.
    pub fn urls(&self, database: &str) -> Vec<String> {
        self.nodes.iter().map(|n| n.url(database)).collect()
    }

    /// Creates `name` (letters, digits, `_`) on the cluster (DDL replicates to every node) and
    /// returns its URL on each node.
    pub async fn create_database(&self, name: &str) -> Vec<String> {
        check_name(name);
        let mut c = self.admin(0).await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .execute(&mut c)
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} on the Galera cluster: {e}"));
        let _ = c.close().await;
        self.urls(name)
    }

    /// Every node's last log lines, for a failure message.
    pub fn log_tails(&self) -> String {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                format!(
                    "--- node {i} (port {}) log tail ---\n{}",
                    n.port,
                    n.log_tail()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn admin(&self, i: usize) -> MySqlConnection {
        MySqlConnection::connect(&self.url(i, "mysql"))
            .await
            .unwrap_or_else(|e| panic!("connect to Galera node {i}: {e}\n{}", self.log_tails()))
    }

    /// Bootstraps the first node, then starts the others together and waits until all are synced.
    async fn launch(&mut self, mariadbd: &Path) -> Result<(), String> {
        self.install_first().await?;
        let gcomm: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.gcomm))
            .collect();
        let address = format!("gcomm://{}", gcomm.join(","));
        let first = spawn(mariadbd, &self.nodes[0], &address, true)?;
        self.nodes[0].child = Some(first);
        wait_synced(&mut self.nodes[0]).await?;
        for i in 1..self.nodes.len() {
            prepare_joiner(&self.nodes[i])?;
            let child = spawn(mariadbd, &self.nodes[i], &address, false)?;
            self.nodes[i].child = Some(child);
        }
        for i in 1..self.nodes.len() {
            wait_synced(&mut self.nodes[i]).await?;
        }
        Ok(())
    }

    /// Only the first node needs system tables: the joiners get the whole data dir from it.
    async fn install_first(&self) -> Result<(), String> {
        let install = first_existing(&["/usr/bin/mariadb-install-db", "/usr/bin/mysql_install_db"])
            .ok_or("no /usr/bin/mariadb-install-db: install mariadb-server")?;
        for n in &self.nodes {
            std::fs::create_dir(n.dir.path().join("tmp"))
                .map_err(|e| format!("create tmp: {e}"))?;
        }
        let n = &self.nodes[0];
        let mut c = Command::new(&install);
        c.arg("--no-defaults")
            .arg(format!("--datadir={}", n.data().display()))
            .arg(format!("--tmpdir={}", n.dir.path().join("tmp").display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .args(["--skip-name-resolve", "--innodb-log-file-size=16M"])
            .current_dir(n.dir.path())
            .stdin(Stdio::null());
        if is_root() {
            c.arg("--user=root");
        }
        let out = c
            .output()
            .await
            .map_err(|e| format!("run {}: {e}", install.display()))?;
        if !out.status.success() {
            return Err(format!(
                "mariadb-install-db failed ({}):\n{}",
                out.status,
                output_text(&out)
            ));
        }
        Ok(())
    }
}

/// A joiner's empty data dir, writable by the rsync daemon that receives the state transfer: as
/// root that daemon runs as `nobody` (the SST script sets no uid), so the dir is handed to
/// `nobody` and the node's own dir made passable.
fn prepare_joiner(n: &Node) -> Result<(), String> {
    let data = n.data();
    std::fs::create_dir(&data).map_err(|e| format!("create {}: {e}", data.display()))?;
    if is_root() {
        let (uid, gid) = os_user("nobody").ok_or("no OS user nobody for the rsync daemon")?;
        std::fs::set_permissions(n.dir.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", n.dir.path().display()))?;
        std::os::unix::fs::chown(&data, Some(uid), Some(gid))
            .map_err(|e| format!("chown {} to nobody: {e}", data.display()))?;
    }
    Ok(())
}

fn spawn(mariadbd: &Path, n: &Node, address: &str, bootstrap: bool) -> Result<Child, String> {
    let d = n.dir.path();
    let mut c = Command::new(mariadbd);
    c.arg("--no-defaults"); // must come first
    if is_root() {
        c.arg("--user=root");
    }
    c.arg(format!("--datadir={}", n.data().display()))
        .arg(format!("--port={}", n.port))
        .arg(format!("--socket={}", d.join("mysqld.sock").display()))
        .arg(format!("--pid-file={}", d.join("mysqld.pid").display()))
        .arg(format!("--log-error={}", d.join("error.log").display()))
        .arg(format!("--tmpdir={}", d.join("tmp").display()))
        .args(MARIADB_FLAGS)
        // What Galera requires of every node.
        .args([
            "--binlog-format=ROW",
            "--innodb-autoinc-lock-mode=2",
            "--default-storage-engine=InnoDB",
            "--wsrep-on=ON",
        ])
        .arg(format!("--wsrep-provider={PROVIDER}"))
        .arg("--wsrep-cluster-name=rowclaim-test")
        .arg(format!("--wsrep-cluster-address={address}"))
        .arg(format!("--wsrep-node-address=127.0.0.1:{}", n.gcomm))
        .arg(format!(
            "--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{};\
             ist.recv_addr=127.0.0.1:{};gcache.size=16M",
            n.gcomm, n.ist
        ))
        .arg("--wsrep-sst-method=rsync")
        .arg(format!("--wsrep-sst-receive-address=127.0.0.1:{}", n.sst))
        .current_dir(d)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if bootstrap {
        c.arg("--wsrep-new-cluster");
    }
    c.spawn()
        .map_err(|e| format!("run {}: {e}", mariadbd.display()))
}

/// Waits until the node answers and says it is synced with the cluster.
async fn wait_synced(n: &mut Node) -> Result<(), String> {
    let deadline = Instant::now() + SYNC_TIMEOUT;
    let url = n.url("mysql");
    loop {
        if let Some(child) = n.child.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("node on port {} exited ({status})", n.port));
            }
        }
        let last = match tokio::time::timeout(Duration::from_secs(10), synced(&url)).await {
            Ok(Ok(true)) => return Ok(()),
            Ok(Ok(false)) => "not synced yet".to_owned(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "connection attempt timed out".to_owned(),
        };
        if Instant::now() > deadline {
            return Err(format!(
                "node on port {} not synced within {} s: {last}",
                n.port,
                SYNC_TIMEOUT.as_secs()
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn synced(url: &str) -> Result<bool, sqlx::Error> {
    let mut c = MySqlConnection::connect(url).await?;
    let state: Option<(String, String)> =
        sqlx::query_as("SHOW STATUS LIKE 'wsrep_local_state_comment'")
            .fetch_optional(&mut c)
            .await?;
    let ready: Option<(String, String)> = sqlx::query_as("SHOW STATUS LIKE 'wsrep_ready'")
        .fetch_optional(&mut c)
        .await?;
    let _ = c.close().await;
    Ok(state.is_some_and(|(_, v)| v == "Synced") && ready.is_some_and(|(_, v)| v == "ON"))
}

impl Drop for GaleraCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(child) = n.child.as_mut() {
                let _ = child.start_kill();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for n in &mut self.nodes {
            if let Some(child) = n.child.as_mut() {
                while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        // The temp dirs go when the nodes drop.
    }
}
