//! A database URL as it may be shown in a message: never with a password, however malformed.
//!
//! A well-formed URL keeps its user (`postgres://app:***@db/app`); in one without `://` the
//! whole part before the `@` is masked, since nothing says where its user ends
//! (`postgres//***@db/app`). The `@` taken is the last one, so a password holding `@`, `/` or
//! `?` is masked whole. Query values of keys that name a password (`password=`,
//! `sslpassword=`, …) are masked too.

/// `url` with its password masked, for messages: `postgres://app:***@db:5432/app`.
pub fn redacted_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => url.split_at(scheme_like(url)),
    };
    let well_formed = scheme.ends_with("://");
    let (userinfo, after) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at..]),
        None => (None, rest),
    };
    let mut out = String::from(scheme);
    match userinfo {
        Some(info) if well_formed => {
            let user_end = info.find([':', '@']).unwrap_or(info.len());
            out.push_str(&info[..user_end]);
            if user_end < info.len() {
                out.push_str(":***");
            }
        }
        Some(_) => out.push_str("***"),
        None => {}
    }
    match userinfo {
        Some(_) => out.push_str(&masked_query(after)),
        // No `@`: a `host:port` whose port is no number may be `user:password` without its
        // host (`postgres://app:S3cret/db`).
        None => out.push_str(&masked_query(&masked_ports(after))),
    }
    out
}

/// `rest` (a URL after its scheme, with no `@`) with every `host:port` of its host list whose
/// port is not a number masked: `app:***/db`.
fn masked_ports(rest: &str) -> String {
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (hosts, tail) = rest.split_at(end);
    let hosts: Vec<String> = hosts
        .split(',')
        .map(|host| {
            // `[::1]:5432`: the port is after the bracket.
            let from = host.find(']').unwrap_or(0);
            match host[from..].find(':').map(|i| from + i) {
                Some(colon) if !host[colon + 1..].chars().all(|c| c.is_ascii_digit()) => {
                    format!("{}:***", &host[..colon])
                }
                _ => host.to_owned(),
            }
        })
        .collect();
    format!("{}{tail}", hosts.join(","))
}

/// How much of the start of `url` looks like a scheme with its separators: `postgres//`,
/// `postgresql:/`, `mysql:`; 0 when it does not start with a letter.
fn scheme_like(url: &str) -> usize {
    let word = url
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-')))
        .unwrap_or(url.len());
    if word == 0 || !url.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return 0;
    }
    let seps = url[word..]
        .find(|c: char| c != ':' && c != '/')
        .unwrap_or(url.len() - word);
    word + seps
}

/// `text` (the part of a URL after its userinfo) with the value of every query key that names a
/// password masked.
fn masked_query(text: &str) -> String {
    let Some((before, query)) = text.split_once('?') else {
        return text.to_owned();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if names_a_secret(key) => format!("{key}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{before}?{}", pairs.join("&"))
}

fn names_a_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("pass") || key.contains("secret") || key.contains("token")
}

#[cfg(test)]
mod tests {
    use super::redacted_url as r;

    #[test]
    fn well_formed_urls_keep_their_user() {
        assert_eq!(r("x://u:secret@h/db"), "x://u:***@h/db");
        assert_eq!(r("mysql://root@h/test"), "mysql://root@h/test");
        assert_eq!(r("sqlite://rowclaim.db"), "sqlite://rowclaim.db");
        assert_eq!(r("postgres://u:p@ss/w?rd@h:5/d"), "postgres://u:***@h:5/d");
        assert_eq!(r("postgres://u@p:ss@h/d"), "postgres://u:***@h/d");
    }

    #[test]
    fn malformed_urls_lose_all_before_the_at() {
        let cases = [
            (
                "postgres//postgres:S3cretPW@h:5432/db",
                "postgres//***@h:5432/db",
            ),
            ("postgresql:/postgres:S3cretPW@h/db", "postgresql:/***@h/db"),
            ("mysql//root:S3cretPW@h/test", "mysql//***@h/test"),
            ("postgres:S3cretPW@h/db", "postgres:***@h/db"),
            ("root:S3cretPW@h/db", "root:***@h/db"),
            (":S3cretPW@h/db", "***@h/db"),
        ];
        for (url, shown) in cases {
            assert_eq!(r(url), shown, "{url}");
        }
    }

    #[test]
    fn a_port_that_is_no_number_may_be_a_password() {
        assert_eq!(r("postgres://app:S3cret/db"), "postgres://app:***/db");
        assert_eq!(r("postgres//app:S3cret/db"), "postgres//app:***/db");
        assert_eq!(
            r("postgres://h:5432,[::1]:5433/db"),
            "postgres://h:5432,[::1]:5433/db"
        );
        assert_eq!(r("postgres://h:x,i:5/db"), "postgres://h:***,i:5/db");
    }

    #[test]
    fn query_passwords_are_masked() {
        assert_eq!(
            r("postgres://h/db?user=u&password=S3cretPW&sslmode=require"),
            "postgres://h/db?user=u&password=***&sslmode=require"
        );
        assert_eq!(
            r("postgres//h/db?sslpassword=S3"),
            "postgres//h/db?sslpassword=***"
        );
    }
}
