//! A new job's payload as it is given: a value, or JSON text kept as it came
//! ([`crate::NewJob::from_json`]), written to the database as text either way.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Error as _, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// A new job's payload. Serialised, either is the value it holds; deserialised, a value.
#[derive(Clone, Debug)]
pub(crate) enum Payload {
    Value(Value),
    Text(Box<RawValue>),
}

impl Payload {
    /// JSON text as a payload; the parser's error if it is not one JSON value that
    /// [`serde_json::Value`] would read (whitespace around it is dropped).
    pub(crate) fn from_json(text: String) -> Result<Payload, serde_json::Error> {
        // A value's parser refuses what a look at the text alone lets through: numbers out of
        // a float's range (1e400), escaped lone surrogates ("\ud800"), nesting past 128
        // levels. Those would be stored and then not read back as the job's payload. Checked
        // in one pass that builds nothing.
        let mut check = serde_json::Deserializer::from_str(&text);
        Checked::deserialize(&mut check)?;
        check.end()?;
        RawValue::from_string(text).map(Payload::Text)
    }

    /// Its JSON text: a value serialised, text as given.
    pub(crate) fn text(&self) -> Cow<'_, str> {
        match self {
            Payload::Value(v) => Cow::Owned(v.to_string()),
            Payload::Text(t) => Cow::Borrowed(t.get()),
        }
    }

    /// Its value (text is read; [`Payload::from_json`] took only text that reads).
    fn value(&self) -> Result<Cow<'_, Value>, serde_json::Error> {
        match self {
            Payload::Value(v) => Ok(Cow::Borrowed(v)),
            Payload::Text(t) => serde_json::from_str(t.get()).map(Cow::Owned),
        }
    }
}

/// Payloads are equal when their values are, however they were given.
impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        match (self.value(), other.value()) {
            (Ok(a), Ok(b)) => a == b,
            _ => self.text() == other.text(),
        }
    }
}

/// As its value, in any format (a `RawValue` is written as itself only by serde_json).
impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value().map_err(S::Error::custom)?.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Payload, D::Error> {
        Value::deserialize(d).map(Payload::Value)
    }
}

/// One JSON value read through and dropped: the parser's own checks, without a value made.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Checked, D::Error> {
        d.deserialize_any(Checked)
    }
}

impl<'de> Visitor<'de> for Checked {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(s: &str) -> Result<Payload, serde_json::Error> {
        Payload::from_json(s.to_owned())
    }

    /// Text is taken exactly when a value's parser reads it: what is stored is read back as
    /// the job's payload.
    #[test]
    fn text_is_taken_when_a_value_would_be_read_from_it() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let mut cases: Vec<String> = [
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
            r#"{"\ud800": 1}"#,
            "'single'",
            "1e400",
            "[-1e400]",
            r#"{"a": 1e-400}"#,
            "18446744073709551616",
            "-0",
            r#""\ud83d\ude00""#,
            r#"{"a": 1, "a": 2}"#,
            "null",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        cases.extend([127, 128, 129].map(nested));
        for s in &cases {
            let value = serde_json::from_str::<Value>(s);
            let got = text(s);
            assert_eq!(got.is_ok(), value.is_ok(), "{s:.40}: {got:?} / {value:?}");
        }
        assert!(text(&nested(128)).is_err() && text("1e400").is_err());
        assert!(text(&nested(127)).is_ok() && text("18446744073709551616").is_ok());
    }

    #[test]
    fn text_is_kept_as_given_without_the_whitespace_around_it() {
        let p = text(" {\"b\": [1, 2.5, \"\\u00e9\"],\n\t\"a\": null}\n").expect("JSON");
        assert_eq!(p.text(), "{\"b\": [1, 2.5, \"\\u00e9\"],\n\t\"a\": null}");
        assert_eq!(p, Payload::Value(json!({"a": null, "b": [1, 2.5, "é"]})));
        assert_ne!(p, Payload::Value(json!({"a": null, "b": [1, 2.5]})));
        assert_eq!(text("\"s\"").expect("JSON").text(), "\"s\"");
    }

    /// Serialised as its value, not as the raw text (which serde_json alone writes as itself:
    /// another format would get serde_json's private token for it).
    #[test]
    fn text_serialises_as_its_value() {
        let p = text("{\"a\": [1, {\"b\": true}]}").expect("JSON");
        let written = serde_json::to_string(&p).expect("serialise");
        assert_eq!(written, "{\"a\":[1,{\"b\":true}]}");
        let back: Payload = serde_json::from_str(&written).expect("read back");
        assert_eq!(back, p);
        assert!(matches!(back, Payload::Value(_)));
    }
}
