//! The name of one claim ([`Token`]), which fences every later change to its rows.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The name of one claim: a fresh UUID v7. Every later change to the claim's rows is conditional
/// on it (fencing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Token(uuid::Uuid);

impl Token {
    pub(crate) fn new() -> Token {
        Token(uuid::Uuid::now_v7())
    }

    /// A fresh token that ends in `tag` (its last 48 bits, 12 hex digits): a UUID v7 whose
    /// time is now, then a count kept by this process (unique within one millisecond up to 2^26
    /// tokens), then the tag. A worker tags its claims so that an operator can tell, from the
    /// owner a row shows, which worker holds it ([`Token::tag`]).
    pub(crate) fn tagged(tag: u64) -> Token {
        static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let tag = tag.to_be_bytes();
        // The builder keeps 4 bits of the first byte and 6 of the third (version and variant
        // take the rest): the count is spread over the 26 bits left.
        let mut bytes = [0u8; 10];
        bytes[0] = ((n >> 22) & 0x0f) as u8;
        bytes[1] = (n >> 14) as u8;
        bytes[2] = ((n >> 8) & 0x3f) as u8;
        bytes[3] = n as u8;
        bytes[4..].copy_from_slice(&tag[2..]);
        Token(uuid::Builder::from_unix_timestamp_millis(ms, &bytes).into_uuid())
    }

    /// The last 48 bits of a token (its last 12 hex digits), which `Token::tagged` sets: what
    /// ties a claim to the worker that took it.
    pub fn tag(&self) -> u64 {
        let b = self.0.as_bytes();
        b[10..]
            .iter()
            .fold(0u64, |tag, byte| (tag << 8) | u64::from(*byte))
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl FromStr for Token {
    type Err = Error;
    fn from_str(s: &str) -> Result<Token> {
        uuid::Uuid::parse_str(s.trim())
            .map(Token)
            .map_err(|_| Error::InvalidInput(format!("token {s:?} is not a UUID")))
    }
}

#[cfg(test)]
mod tests {
    use super::Token;
    use std::collections::HashSet;

    /// A tagged token ends in its tag, stays a UUID v7 (time first), and no two are alike
    /// however fast they are made.
    #[test]
    fn tagged_tokens_end_in_their_tag_and_never_repeat() {
        let tag = 0xbe0c_88ea_43ff;
        let mut seen = HashSet::new();
        for _ in 0..200_000 {
            let t = Token::tagged(tag);
            assert_eq!(t.tag(), tag);
            assert_eq!(t.0.get_version_num(), 7);
            assert!(t.to_string().ends_with("be0c88ea43ff"), "{t}");
            assert!(seen.insert(t), "{t} made twice");
        }
        let other = Token::tagged(1);
        assert_eq!(other.tag(), 1);
        assert!(other.to_string().parse::<Token>().is_ok());
    }
}
