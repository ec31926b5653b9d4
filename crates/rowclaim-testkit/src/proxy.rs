//! A TCP proxy a test controls, between clients and a (private) database server on 127.0.0.1:
//! cut every connection, black-hole all traffic for a while (a partition that heals), or cut one
//! connection right after the client sent a given statement, so that its answer is lost.
//!
//! Control calls take effect at once: after `cut_all` or `blackhole(true)` returns, no further
//! byte of an affected connection is forwarded (closing the sockets follows within moments).
//!
//! Used by the CLI's fault suite (`crates/rowclaim-cli/tests/fault.rs`) and checked by its
//! harness smoke tests (`fault_harness.rs`). It knows nothing of SQL: any backend reached over
//! TCP can be put behind it. A new backend proves itself first by a driver and one
//! `contract_suite!` invocation (see [`crate::contract`]); fault tests through this proxy come
//! after that.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The client bytes kept per connection so that a `cut_after` pattern split across reads is
/// still found (patterns up to this long).
const TAIL: usize = 1024;
/// How long a `cut_after` waits for the server to close its side (see there).
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Default)]
struct Ctl {
    /// Bumped by `cut_all`: connections accepted under an older value are closed.
    cut: u64,
    blackhole: bool,
    /// The proxy was dropped.
    closed: bool,
}

struct Shared {
    upstream: u16,
    ctl: watch::Sender<Ctl>,
    armed: Mutex<Option<Vec<u8>>>,
    fired: AtomicBool,
    open: AtomicUsize,
    accepted: AtomicUsize,
    /// Connections whose client sent at least one byte.
    spoke: AtomicUsize,
}

/// A running proxy; dropping it closes every connection through it and stops listening.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a spare port of 127.0.0.1 and forwards every connection to
    /// 127.0.0.1:`upstream_port` (connected when the client connects; when the server is down
    /// the client's connection is closed at once).
    pub async fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap_or_else(|e| panic!("proxy: listen on 127.0.0.1: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("proxy: local address: {e}"))
            .port();
        let shared = Arc::new(Shared {
            upstream: upstream_port,
            ctl: watch::Sender::new(Ctl::default()),
            armed: Mutex::new(None),
            fired: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
            spoke: AtomicUsize::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Proxy {
            port,
            shared,
            accept,
        }
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `direct_url` with its port replaced by the proxy's (`scheme://user@host:PORT/db?…`).
    pub fn url_for(&self, direct_url: &str) -> String {
        let scheme_end = direct_url.find("://").map(|i| i + 3).unwrap_or(0);
        let rest = &direct_url[scheme_end..];
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        let host_start = authority.rfind('@').map(|i| i + 1).unwrap_or(0);
        let host_port = &authority[host_start..];
        let host = match host_port.rfind(':') {
            Some(i) if !host_port[i..].contains(']') => &host_port[..i],
            _ => host_port,
        };
        format!(
            "{}{}{host}:{}{}",
            &direct_url[..scheme_end],
            &authority[..host_start],
            self.port,
            &rest[authority_end..]
        )
    }

    /// Closes every open connection through the proxy, both sides; later connections are
    /// forwarded as usual.
    pub fn cut_all(&self) {
        self.shared.ctl.send_modify(|c| c.cut += 1);
    }

    /// On: no byte moves in either direction on any connection (nothing is read, nothing
    /// closed), and new connections are accepted but not connected upstream. Off: everything
    /// resumes where it stopped, nothing lost (a network partition that heals).
    pub fn blackhole(&self, on: bool) {
        self.shared.ctl.send_modify(|c| c.blackhole = on);
    }

    /// Arms a one-shot cut: the next client-to-server chunk of any connection that contains
    /// `pattern` (also when split across reads; up to 1 KiB) is forwarded to the server, then
    /// that connection is cut and nothing more of the server's reaches the client. The server
    /// side is half-closed at once; the client side is closed when the server has closed its
    /// side (it has then handled everything it was sent, e.g. a COMMIT is done), or after 30 s.
    /// Disarms when it fires; arming again resets `fired`.
    pub fn cut_after(&self, pattern: &[u8]) {
        assert!(
            !pattern.is_empty() && pattern.len() <= TAIL,
            "cut_after: pattern must be 1..=1024 bytes"
        );
        *self.shared.armed.lock().unwrap_or_else(|e| e.into_inner()) = Some(pattern.to_vec());
        self.shared.fired.store(false, Ordering::SeqCst);
    }

    /// Whether the armed `cut_after` has fired and its connection is closed on both sides.
    pub fn fired(&self) -> bool {
        self.shared.fired.load(Ordering::SeqCst)
    }

    /// Connections through the proxy that are open now.
    pub fn connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Connections the proxy has accepted since it started, closed ones included.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections whose client sent anything: sessions, not a bare connect-and-close such as
    /// a knock to see whether a port listens.
    pub fn sessions(&self) -> usize {
        self.shared.spoke.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.ctl.send_modify(|c| c.closed = true);
        self.accept.abort();
    }
}

/// Counts a connection as open while it lives.
struct OpenGuard(Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut rx = shared.ctl.subscribe();
    let closed = async move {
        let _ = rx.wait_for(|c| c.closed).await;
    };
    tokio::pin!(closed);
    loop {
        let client = tokio::select! {
            r = listener.accept() => match r {
                Ok((client, _)) => client,
                Err(_) => {
                    // Out of file descriptors and the like: try again shortly.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = &mut closed => return,
        };
        let generation = shared.ctl.borrow().cut;
        shared.open.fetch_add(1, Ordering::SeqCst);
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(serve(OpenGuard(shared.clone()), client, generation));
    }
}

/// How a direction or a connection ended.
enum End {
    /// The sender closed its side (forwarded as a half-close).
    Eof,
    /// The armed pattern went through.
    CutAfter,
    /// Cut, proxy dropped, or a socket error.
    Dead,
}

fn dead(c: &Ctl, generation: u64) -> bool {
    c.closed || c.cut != generation
}

/// Waits until bytes may move; false when the connection is to be closed instead.
async fn gate(rx: &mut watch::Receiver<Ctl>, generation: u64) -> bool {
    match rx.wait_for(|c| dead(c, generation) || !c.blackhole).await {
        Ok(c) => !dead(&c, generation),
        Err(_) => false,
    }
}

/// Completes when bytes must stop moving (black hole, cut, drop).
async fn stop_moving(rx: &mut watch::Receiver<Ctl>, generation: u64) {
    let _ = rx.wait_for(|c| c.blackhole || dead(c, generation)).await;
}

/// Completes when the connection is to be closed.
async fn until_dead(mut rx: watch::Receiver<Ctl>, generation: u64) {
    let _ = rx.wait_for(|c| dead(c, generation)).await;
}

async fn serve(guard: OpenGuard, client: TcpStream, generation: u64) {
    let shared = guard.0.clone();
    let mut rx = shared.ctl.subscribe();
    if !gate(&mut rx, generation).await {
        return;
    }
    let server = tokio::select! {
        r = TcpStream::connect(("127.0.0.1", shared.upstream)) => match r {
            Ok(s) => s,
            Err(_) => return,
        },
        _ = until_dead(rx.clone(), generation) => return,
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_r, mut client_w) = client.into_split();
    let (mut server_r, mut server_w) = server.into_split();

    let end = {
        let up = pump(
            &mut client_r,
            &mut server_w,
            rx.clone(),
            generation,
            Some(&shared),
        );
        let down = pump(&mut server_r, &mut client_w, rx.clone(), generation, None);
        tokio::pin!(up, down);
        let (mut up_done, mut down_done) = (false, false);
        loop {
            tokio::select! {
                biased;
                _ = until_dead(rx.clone(), generation) => break End::Dead,
                e = &mut up, if !up_done => match e {
                    End::Eof => up_done = true,
                    other => break other,
                },
                e = &mut down, if !down_done => match e {
                    End::Eof => down_done = true,
                    other => break other,
                },
            }
            if up_done && down_done {
                break End::Eof;
            }
        }
    };

    if let End::CutAfter = end {
        // The server side is half-closed (pump); read and drop whatever the server still sends
        // until it closes, then close the client side (all halves drop here).
        let drain = async {
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n) = server_r.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        };
        tokio::select! {
            _ = tokio::time::timeout(DRAIN_LIMIT, drain) => {}
            _ = until_dead(rx.clone(), generation) => {}
        }
        shared.fired.store(true, Ordering::SeqCst);
        drop((client_r, client_w, server_r, server_w));
    }
    drop(guard);
}

/// Forwards `src` to `dst` while the connection is neither black-holed nor dead. On EOF it
/// half-closes `dst`; with `cut` (client to server), the armed pattern going through ends it.
async fn pump(
    src: &mut OwnedReadHalf,
    dst: &mut OwnedWriteHalf,
    mut rx: watch::Receiver<Ctl>,
    generation: u64,
    cut: Option<&Shared>,
) -> End {
    let mut buf = vec![0u8; 16 * 1024];
    let mut tail: Vec<u8> = Vec::new();
    let mut spoke = false;
    loop {
        if !gate(&mut rx, generation).await {
            return End::Dead;
        }
        let n = tokio::select! {
            r = src.read(&mut buf) => match r {
                Ok(n) => n,
                Err(_) => return End::Dead,
            },
            _ = stop_moving(&mut rx, generation) => continue,
        };
        if n == 0 {
            let _ = dst.shutdown().await;
            return End::Eof;
        }
        let chunk = &buf[..n];
        if let (Some(shared), false) = (cut, spoke) {
            // The client's first bytes.
            spoke = true;
            shared.spoke.fetch_add(1, Ordering::SeqCst);
        }
        let fire = cut.is_some_and(|shared| {
            let mut armed = shared.armed.lock().unwrap_or_else(|e| e.into_inner());
            let hit = armed.as_deref().is_some_and(|p| {
                let mut window = tail[tail.len().saturating_sub(p.len() - 1)..].to_vec();
                window.extend_from_slice(chunk);
                window.windows(p.len()).any(|w| w == p)
            });
            if hit {
                *armed = None;
            }
            hit
        });
        if cut.is_some() {
            tail.extend_from_slice(chunk);
            let excess = tail.len().saturating_sub(TAIL);
            tail.drain(..excess);
        }
        if !write_gated(dst, chunk, &mut rx, generation).await {
            return End::Dead;
        }
        if fire {
            let _ = dst.shutdown().await;
            return End::CutAfter;
        }
    }
}

/// Writes all of `data` while bytes may move; false when the connection died first.
async fn write_gated(
    dst: &mut OwnedWriteHalf,
    mut data: &[u8],
    rx: &mut watch::Receiver<Ctl>,
    generation: u64,
) -> bool {
    while !data.is_empty() {
        if !gate(rx, generation).await {
            return false;
        }
        tokio::select! {
            r = dst.write(data) => match r {
                Ok(0) | Err(_) => return false,
                Ok(n) => data = &data[n..],
            },
            _ = stop_moving(rx, generation) => {}
        }
    }
    true
}
