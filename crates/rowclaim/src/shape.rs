//! Values as Rust types: JSON read into a user's type and written from one, with an error that
//! says what did not fit and where ([`Error::Shape`]). Typed jobs and typed rows both go
//! through here.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, Result};

/// `value` read as a `T`. `what` (called only on failure) says what was read, for the message.
pub(crate) fn from_json<'de, T, D>(value: D, what: impl FnOnce() -> String) -> Result<T>
where
    T: DeserializeOwned,
    D: serde::Deserializer<'de, Error = serde_json::Error>,
{
    serde_path_to_error::deserialize(value).map_err(|e| shape_error(e, what))
}

/// `value` written as JSON. `what` (called only on failure) says what was written.
pub(crate) fn to_json<T: Serialize + ?Sized>(
    value: &T,
    what: impl FnOnce() -> String,
) -> Result<serde_json::Value> {
    serde_path_to_error::serialize(value, serde_json::value::Serializer)
        .map_err(|e| shape_error(e, what))
}

fn shape_error(
    e: serde_path_to_error::Error<serde_json::Error>,
    what: impl FnOnce() -> String,
) -> Error {
    let field = e.path().to_string();
    Error::Shape {
        what: what(),
        field,
        source: e.into_inner(),
    }
}

/// The name of `T` as a user wrote it, without its module path (`Welcome`, `Vec<Welcome>`).
pub(crate) fn type_name<T: ?Sized>() -> String {
    let full = std::any::type_name::<T>();
    let mut out = String::with_capacity(full.len());
    // Keep the last segment of every path in the name (generic arguments too).
    let mut segment = String::new();
    for c in full.chars() {
        // `{{closure}}` is a segment too, in the path of a type declared in an async fn.
        if c.is_alphanumeric() || matches!(c, '_' | ':' | '{' | '}') {
            segment.push(c);
        } else {
            out.push_str(segment.rsplit("::").next().unwrap_or(&segment));
            segment.clear();
            out.push(c);
        }
    }
    out.push_str(segment.rsplit("::").next().unwrap_or(&segment));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, Serialize)]
    struct Email {
        to: String,
        tries: u32,
    }

    #[test]
    fn a_value_that_does_not_fit_names_the_field() {
        let bad = serde_json::json!({"to": "ada@example.com", "tries": "three"});
        let e = from_json::<Email, _>(&bad, || "a row of emails as Email".into()).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("a row of emails as Email: tries: invalid type"),
            "{text}"
        );
        assert!(
            matches!(&e, Error::Shape { field, .. } if field == "tries"),
            "{e:?}"
        );
        assert_eq!(e.kind(), crate::ErrorKind::BadInput);
        let missing = serde_json::json!({"tries": 1});
        let e = from_json::<Email, _>(missing, || "it".into()).unwrap_err();
        assert!(e.to_string().starts_with("it: missing field `to`"), "{e}");
    }

    #[test]
    fn names_lose_their_module_paths() {
        assert_eq!(type_name::<Email>(), "Email");
        assert_eq!(type_name::<Vec<Email>>(), "Vec<Email>");
        assert_eq!(type_name::<u32>(), "u32");
        let local = || {
            struct Local;
            type_name::<Option<Local>>()
        };
        assert_eq!(local(), "Option<Local>");
    }
}
