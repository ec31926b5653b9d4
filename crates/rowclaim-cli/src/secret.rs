//! Tokens an operator hands the CLI in a file, and how a request's is checked: shared by the
//! dashboard (its login and metrics tokens) and `work --metrics-token-file`.
//!
//! A token is compared in constant time ([`same_secret`]) and never said: messages name the
//! file it came from, and [`Bearer`]'s `Debug` hides it.

use std::path::Path;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::error::CliError;

/// Shortest token accepted from a token file: shorter is guessable.
pub const MIN_TOKEN: usize = 16;

/// `n` random bytes from the operating system, as hex.
pub fn random_hex(n: usize) -> Result<String, getrandom::Error> {
    let mut bytes = vec![0u8; n];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether two secrets are equal, taking as long whatever the first difference and whatever
/// their lengths: their digests are compared (a comparison of the texts themselves would end at
/// once on a length mismatch, telling the length of an operator's token).
pub fn same_secret(a: &str, b: &str) -> bool {
    use sha2::{Digest, Sha256};
    let (a, b) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    a[..].ct_eq(&b[..]).into()
}

/// The token in `flag`'s file `path`: its contents trimmed, the first line of them, at least
/// [`MIN_TOKEN`] characters. A file that cannot be read or holds no such token is bad input
/// naming the flag, the path and what to put there; the message never quotes the file.
pub fn read_token_file(path: &Path, flag: &str) -> Result<String, CliError> {
    let fix = format!(
        "write a token of at least {MIN_TOKEN} characters on its first line, e.g. `openssl rand \
         -hex 32 > {}`",
        path.display()
    );
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::BadInput(format!(
            "{flag} {}: cannot read the token file: {e}; {fix}",
            path.display()
        ))
    })?;
    let token = text.trim().lines().next().unwrap_or_default().trim();
    let problem = if token.is_empty() {
        "the token file is empty"
    } else if token.chars().count() < MIN_TOKEN {
        "the token is too short to be a secret"
    } else {
        return Ok(token.to_owned());
    };
    Err(CliError::BadInput(format!(
        "{flag} {}: {problem}; {fix}",
        path.display()
    )))
}

/// The token of an `Authorization: Bearer <token>` header, if the request has one (the scheme
/// in any case, as RFC 6750 allows).
pub fn bearer_of(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("Bearer")
        .then_some(token.trim())
}

/// The answer to a request without the right bearer token: 401 with `WWW-Authenticate: Bearer`
/// and `why` (which must not hold the token).
pub fn bearer_refused(why: &'static str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        why,
    )
        .into_response()
}

/// A bearer token that opens a route. Its `Debug` never shows it, so that nothing that prints
/// what holds it can put it in a log.
#[derive(Clone)]
pub struct Bearer(Arc<str>);

impl Bearer {
    /// The token in `flag`'s file `path` (see [`read_token_file`]).
    pub fn from_file(path: &Path, flag: &str) -> Result<Bearer, CliError> {
        read_token_file(path, flag).map(|t| Bearer(t.into()))
    }

    /// Whether the request carries this token as `Authorization: Bearer …` (in constant time).
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        bearer_of(headers).is_some_and(|given| same_secret(given, &self.0))
    }

    /// Middleware letting through only requests with this token; others get
    /// [`bearer_refused`]. Refusals are not logged: a scanner would fill the log.
    pub async fn require(self, req: Request, next: Next) -> Response {
        if self.admits(req.headers()) {
            return next.run(req).await;
        }
        bearer_refused(
            "the metrics token is required: Authorization: Bearer <the token in \
             --metrics-token-file>\n",
        )
    }
}

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bearer(…)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
        assert_eq!(random_hex(32).unwrap().len(), 64);
    }

    #[test]
    fn bearer_tokens_are_read_from_the_header() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer_of(&h), None);
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer_of(&h), None);
        h.insert(header::AUTHORIZATION, "bearer  abc ".parse().unwrap());
        assert_eq!(bearer_of(&h), Some("abc"));
        let b = Bearer("abc".into());
        assert!(b.admits(&h));
        h.insert(header::AUTHORIZATION, "Bearer abd".parse().unwrap());
        assert!(!b.admits(&h));
        assert!(!format!("{b:?}").contains("abc"));
    }

    #[test]
    fn token_files_name_flag_path_and_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let said = |r: Result<String, CliError>| r.unwrap_err().to_string();
        let missing = said(read_token_file(&path, "--x-file"));
        assert!(missing.starts_with(&format!("--x-file {}: cannot read", path.display())));
        assert!(missing.contains("openssl rand -hex 32"), "{missing}");
        std::fs::write(&path, " \n\n").unwrap();
        let empty = said(read_token_file(&path, "--x-file"));
        assert!(empty.contains("is empty"), "{empty}");
        std::fs::write(&path, "tiny-tok\n").unwrap();
        let short = said(read_token_file(&path, "--x-file"));
        assert!(
            short.contains("too short") && !short.contains("tiny-tok"),
            "{short}"
        );
        std::fs::write(&path, "\n  0123456789abcdef  \nmore\n").unwrap();
        assert_eq!(
            read_token_file(&path, "--x-file").unwrap(),
            "0123456789abcdef"
        );
    }
}
