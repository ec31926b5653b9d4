//! Login throttling per address: after [`FREE_TRIES`] wrong tokens from one address within
//! [`WINDOW`], every login from it (a right token too, so that guesses cannot be confirmed) is
//! answered 429 with `Retry-After` until the window ends. Other addresses are not slowed.
//! Behind a TLS proxy every connection comes from the proxy: the address is then the last one
//! the proxy added to `X-Forwarded-For`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;

/// Wrong tokens an address may send per window before it waits.
pub const FREE_TRIES: u32 = 10;

/// How long an address's wrong tries are remembered (from the first).
pub const WINDOW: Duration = Duration::from_secs(300);

/// Most addresses remembered at once; past it, those whose window ended are forgotten first,
/// then the oldest.
const MOST_ADDRESSES: usize = 10_000;

/// The wrong logins of each address in its current window.
pub struct Throttle {
    /// Address → wrong tries, and when the first of them came.
    tries: Mutex<HashMap<IpAddr, (u32, Instant)>>,
    /// Behind a TLS proxy: the client is the one `X-Forwarded-For` names.
    behind_proxy: bool,
}

impl Throttle {
    pub fn new(behind_proxy: bool) -> Throttle {
        Throttle {
            tries: Mutex::default(),
            behind_proxy,
        }
    }

    /// The address a login comes from.
    pub fn client(&self, peer: SocketAddr, headers: &HeaderMap) -> IpAddr {
        let forwarded = self
            .behind_proxy
            .then(|| headers.get("x-forwarded-for")?.to_str().ok())
            .flatten()
            .and_then(|v| v.rsplit(',').next())
            .and_then(|ip| ip.trim().parse().ok());
        forwarded.unwrap_or(peer.ip())
    }

    /// How long `ip` must wait before it may try again; `None`: it may try now.
    pub fn wait(&self, ip: IpAddr) -> Option<Duration> {
        let tries = self.tries.lock().unwrap_or_else(PoisonError::into_inner);
        let (n, first) = tries.get(&ip)?;
        let left = WINDOW.checked_sub(first.elapsed())?;
        (*n >= FREE_TRIES).then_some(left)
    }

    /// A wrong token came from `ip`; returns whether that used its last free try.
    pub fn wrong(&self, ip: IpAddr) -> bool {
        let mut tries = self.tries.lock().unwrap_or_else(PoisonError::into_inner);
        if tries.len() >= MOST_ADDRESSES && !tries.contains_key(&ip) {
            tries.retain(|_, (_, first)| first.elapsed() < WINDOW);
            if tries.len() >= MOST_ADDRESSES {
                let oldest = tries.iter().min_by_key(|(_, (_, f))| *f).map(|(ip, _)| *ip);
                if let Some(oldest) = oldest {
                    tries.remove(&oldest);
                }
            }
        }
        let entry = tries.entry(ip).or_insert((0, Instant::now()));
        if entry.1.elapsed() >= WINDOW {
            *entry = (0, Instant::now());
        }
        entry.0 += 1;
        entry.0 == FREE_TRIES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_waits_after_its_free_tries_and_others_do_not() {
        let t = Throttle::new(false);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        for i in 1..FREE_TRIES {
            assert!(!t.wrong(a), "try {i}");
            assert_eq!(t.wait(a), None, "try {i}");
        }
        assert!(t.wrong(a), "the last free try");
        assert!(t.wait(a).is_some_and(|w| w <= WINDOW));
        assert_eq!(t.wait(b), None);
    }

    #[test]
    fn behind_a_proxy_the_forwarded_address_counts() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            "203.0.113.9, 198.51.100.7".parse().unwrap(),
        );
        let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let proxied = Throttle::new(true);
        assert_eq!(
            proxied.client(peer, &h),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
        // Without a proxy the header is anyone's to write: not believed.
        assert_eq!(Throttle::new(false).client(peer, &h), peer.ip());
    }
}
