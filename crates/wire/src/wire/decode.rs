//! A peer's JSON decoded into a type, with an error that says where in the
//! document (`files[0].content`) and what kind of value was found, never
//! the text found ([`crate::text::json_error`]): the coordinator's answers,
//! a turn, a stored agent state.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// `value` as a `T`; the error names the path to the member that does
/// not fit.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| said(&e))
}

/// `bytes`, one JSON document, as a `T` (trailing characters refused, as
/// `serde_json::from_slice` does); the error names the path to the member
/// that does not fit.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| said(&e))?;
    de.end().map_err(|e| crate::text::json_error(&e))?;
    Ok(value)
}

fn said(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let why = crate::text::json_error(e.inner());
    let path = shown_path(e.path());
    if path.is_empty() {
        why
    } else {
        format!("{path}: {why}")
    }
}

/// The longest path shown whole; a deeper one keeps its start and its end,
/// so that the reason after it survives a message's cut.
const MAX_PATH_CHARS: usize = 120;

/// The path with each name the peer chose (a key of a map, a member the
/// type ignores) shown only when [`crate::text::plain_name`], else as
/// `?`; a member whose key could not be read is left out.
fn shown_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(if crate::text::plain_name(key) {
                    key
                } else {
                    "?"
                });
            }
            Segment::Unknown => {}
        }
    }
    if out.chars().count() > MAX_PATH_CHARS {
        let start = crate::text::head(&out, 40);
        let end = crate::text::last(&out, MAX_PATH_CHARS - 40);
        out = format!("{start}…{end}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code, reason = "only decoded, to make errors")]
    struct State {
        files: Vec<File>,
        #[serde(default)]
        extra: std::collections::BTreeMap<String, u32>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code, reason = "only decoded, to make errors")]
    struct File {
        path: String,
        content: String,
    }

    #[test]
    fn the_error_names_the_path_and_the_kind() {
        let e = from_value::<State>(serde_json::json!({"files": [{"path": "a", "content": 5}]}))
            .unwrap_err();
        assert_eq!(
            e,
            "files[0].content: invalid type: integer, expected a string"
        );
        let e = from_slice::<State>(
            br#"{"files": [{"path": "a", "content": "b"}, {"path": "SECRET", "content": []}]}"#,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "files[1].content: invalid type: sequence, expected a string at line 1 column 72"
        );
        let e = from_value::<State>(serde_json::json!({"files": "SECRET"})).unwrap_err();
        assert_eq!(e, "files: invalid type: string, expected a sequence");
        let e = from_slice::<State>(b"{\"files\": []} x").unwrap_err();
        assert_eq!(e, "trailing characters at line 1 column 15");
    }

    /// A key the peer chose is shown only when plain: a syntax error
    /// inside an ignored member, or a map's key.
    #[test]
    fn a_name_the_peer_chose_is_shown_only_when_plain() {
        let e = from_slice::<State>(br#"{"SECRET token value": [1, 2 }"#).unwrap_err();
        assert!(e.starts_with("?: expected"), "{e}");
        let e = from_slice::<State>(br#"{"files": [], }"#).unwrap_err();
        assert_eq!(e, "trailing comma at line 1 column 15");
        let e = from_value::<State>(
            serde_json::json!({"files": [], "extra": {"SECRET token": "x", "plain": "y"}}),
        )
        .unwrap_err();
        assert!(
            e.starts_with("extra.?: invalid type: string, expected u32"),
            "{e}"
        );
        assert!(!e.contains("SECRET"), "{e}");
    }

    /// A deep path keeps its start and its end, and the reason after it.
    #[test]
    fn a_deep_path_is_cut_in_its_middle() {
        let mut doc = String::from("1");
        for _ in 0..60 {
            doc = format!(r#"{{"key_of_twenty_chars": {doc}}}"#);
        }
        let doc = format!(r#"{{"files": [], "extra": {{"a": 1}}, "deep": {doc}}}"#);
        let e = from_slice::<Nested>(doc.as_bytes()).unwrap_err();
        assert!(e.chars().count() < 250, "{e}");
        assert!(e.starts_with("deep.key_of_twenty_chars."), "{e}");
        assert!(e.contains("…"), "{e}");
        assert!(
            e.ends_with(
                "key_of_twenty_chars: invalid type: integer, expected struct Deep at line 1 column 1482"
            ),
            "{e}"
        );
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code, reason = "only decoded, to make errors")]
    struct Nested {
        deep: Deep,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code, reason = "only decoded, to make errors")]
    struct Deep {
        key_of_twenty_chars: Box<Deep>,
    }
}
