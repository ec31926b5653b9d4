//! A new job's payload as it is given: a value, or JSON text kept as it came
//! ([`crate::NewJob::from_json`]), written to the database as text either way.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

/// A new job's payload. Serialised, either is the JSON it holds (read back, a value).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum Payload {
    Value(Value),
    Text(Box<RawValue>),
}

impl Payload {
    /// JSON text as a payload; the parser's error if it is not one JSON value (whitespace
    /// around it is dropped).
    pub(crate) fn from_json(text: String) -> Result<Payload, serde_json::Error> {
        // Checking JSON text without making its value lets an escaped lone surrogate
        // ("\ud800") through, which PostgreSQL and MySQL refuse: such text is parsed.
        if text.contains("\\u") {
            serde_json::from_str::<Value>(&text)?;
        }
        RawValue::from_string(text).map(Payload::Text)
    }

    /// Its JSON text: a value serialised, text as given.
    pub(crate) fn text(&self) -> Cow<'_, str> {
        match self {
            Payload::Value(v) => Cow::Owned(v.to_string()),
            Payload::Text(t) => Cow::Borrowed(t.get()),
        }
    }

    /// Its value (`None` for text that is not JSON, which [`Payload::from_json`] refuses).
    fn value(&self) -> Option<Cow<'_, Value>> {
        match self {
            Payload::Value(v) => Some(Cow::Borrowed(v)),
            Payload::Text(t) => serde_json::from_str(t.get()).ok().map(Cow::Owned),
        }
    }
}

/// Payloads are equal when their values are, however they were given.
impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        match (self, other) {
            (Payload::Value(a), Payload::Value(b)) => a == b,
            _ => self.value() == other.value(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(s: &str) -> Result<Payload, serde_json::Error> {
        Payload::from_json(s.to_owned())
    }

    /// What the database is given must be JSON it accepts: whatever a value's parser refuses,
    /// text is refused too.
    #[test]
    fn text_that_is_not_one_json_value_is_refused() {
        let bad = [
            "",
            " ",
            "{",
            "{\"a\":1} x",
            "{\"a\":1}{}",
            "[1,]",
            "nan",
            "\"tab\there\"",
            r#""\ud800""#,
            r#""\udc00 alone""#,
            "'single'",
        ];
        for s in bad {
            assert!(
                serde_json::from_str::<Value>(s).is_err(),
                "a value's parser refuses {s:?} too"
            );
            assert!(text(s).is_err(), "{s:?} is not JSON");
        }
    }

    #[test]
    fn text_is_kept_as_given_without_the_whitespace_around_it() {
        let p = text(" {\"b\": [1, 2.5, \"\\u00e9\"],\n\t\"a\": null}\n").expect("JSON");
        assert_eq!(p.text(), "{\"b\": [1, 2.5, \"\\u00e9\"],\n\t\"a\": null}");
        assert_eq!(p, Payload::Value(json!({"a": null, "b": [1, 2.5, "é"]})));
        assert_ne!(p, Payload::Value(json!({"a": null, "b": [1, 2.5]})));
        assert_eq!(text("\"s\"").expect("JSON").text(), "\"s\"");
    }

    #[test]
    fn text_serialises_as_the_json_it_holds() {
        let p = text("{\"a\": [1, {\"b\": true}]}").expect("JSON");
        let written = serde_json::to_string(&p).expect("serialise");
        assert_eq!(written, "{\"a\": [1, {\"b\": true}]}");
        let back: Payload = serde_json::from_str(&written).expect("read back");
        assert_eq!(back, p);
        assert!(matches!(back, Payload::Value(_)));
    }
}
