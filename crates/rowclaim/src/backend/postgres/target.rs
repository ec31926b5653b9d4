//! A PostgreSQL URL as rowclaim reads it: libpq's several hosts
//! (`postgres://u@h1:5432,h2:5433/db`), which of them is wanted (`target_session_attrs`), and
//! whether a transaction-mode pooler is in between (`pgbouncer=true`).

use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;

/// Which server of a multi-host URL is wanted (libpq's `target_session_attrs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wanted {
    /// One that takes writes (`SHOW transaction_read_only` is off).
    ReadWrite,
    /// The first that answers.
    Any,
}

/// A PostgreSQL URL as rowclaim reads it: the hosts (each as sqlx options), and the URL options
/// that are rowclaim's rather than sqlx's.
#[derive(Debug)]
pub(crate) struct Target {
    /// `host:port` (for messages) and the options to reach it, in the URL's order.
    pub(crate) hosts: Vec<(String, PgConnectOptions)>,
    pub(crate) wanted: Wanted,
    /// `pgbouncer=true`: a transaction-mode pooler is in between.
    pub(crate) pooled: bool,
}

impl Target {
    /// Reads `postgres://user:pass@h1[:p1][,h2[:p2]…]/db?…`. `target_session_attrs` and
    /// `pgbouncer` are taken out; the rest goes to sqlx for each host.
    pub(crate) fn parse(url: &str) -> std::result::Result<Target, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| "expected postgres://".to_owned())?;
        let (before_query, query) = match rest.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match before_query.find('/') {
            Some(i) => before_query.split_at(i),
            None => (before_query, ""),
        };
        let (userinfo, hostlist) = match authority.rfind('@') {
            Some(i) => (&authority[..=i], &authority[i + 1..]),
            None => ("", authority),
        };

        let (wanted, pooled, query) = url_options(query)?;
        let several = hostlist.contains(',');
        let mut hosts = Vec::new();
        for host in hostlist.split(',') {
            if host.is_empty() && several {
                return Err("an empty host in the host list".to_owned());
            }
            let one = format!("{scheme}://{userinfo}{host}{path}{query}");
            let options = PgConnectOptions::from_str(&one).map_err(|e| {
                let e = crate::error::describe_plain(&e);
                if several {
                    format!("host {host}: {e}")
                } else {
                    e
                }
            })?;
            let label = match options.get_socket() {
                // The socket file, as libpq names it (the directory alone names no port).
                Some(dir) => dir
                    .join(format!(".s.PGSQL.{}", options.get_port()))
                    .display()
                    .to_string(),
                None => format!("{}:{}", options.get_host(), options.get_port()),
            };
            hosts.push((label, options));
        }
        Ok(Target {
            hosts,
            wanted,
            pooled,
        })
    }

    /// `host:port` (or a socket file) for messages: the one host, or all of them.
    pub(crate) fn label(&self) -> String {
        let labels: Vec<&str> = self.hosts.iter().map(|(l, _)| l.as_str()).collect();
        labels.join(",")
    }
}

/// The URL options that are rowclaim's (`target_session_attrs`, `pgbouncer`), taken out of the
/// query; the rest, as a query again (with its `?`), goes to sqlx.
fn url_options(query: Option<&str>) -> std::result::Result<(Wanted, bool, String), String> {
    let mut wanted = Wanted::ReadWrite;
    let mut pooled = false;
    let mut kept = Vec::new();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "target_session_attrs" => {
                wanted = match value {
                    "read-write" => Wanted::ReadWrite,
                    "any" => Wanted::Any,
                    other => {
                        return Err(format!(
                            "target_session_attrs={other} is not supported: use read-write \
                             (the default: the first host that takes writes) or any"
                        ))
                    }
                }
            }
            "pgbouncer" => {
                pooled = match value {
                    "true" | "1" | "yes" | "on" => true,
                    "false" | "0" | "no" | "off" => false,
                    other => return Err(format!("pgbouncer={other}: use true or false")),
                }
            }
            _ => kept.push(pair),
        }
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    Ok((wanted, pooled, query))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_multi_host_urls() {
        let t = Target::parse(
            "postgres://u:pw@h1:5432,h2:5433/db?target_session_attrs=any&sslmode=disable",
        )
        .unwrap();
        assert_eq!(t.label(), "h1:5432,h2:5433");
        assert_eq!(t.wanted, Wanted::Any);
        assert!(!t.pooled);
        assert_eq!(t.hosts[1].1.get_database(), Some("db"));
        assert_eq!(t.hosts[1].1.get_username(), "u");

        let t = Target::parse("postgres://u@h1,%2Frun%2Fpg:5433/db").unwrap();
        assert_eq!(t.label(), "h1:5432,/run/pg/.s.PGSQL.5433");

        let t = Target::parse("postgres://u@h1/db?pgbouncer=true").unwrap();
        assert_eq!(t.label(), "h1:5432");
        assert_eq!(t.wanted, Wanted::ReadWrite);
        assert!(t.pooled);

        let e = Target::parse("postgres://u@h1/db?target_session_attrs=standby").unwrap_err();
        assert!(e.contains("target_session_attrs=standby"), "{e}");
        let e = Target::parse("postgres://u@h1:1,h2:x/db").unwrap_err();
        assert!(e.starts_with("host h2:x"), "{e}");
    }
}
