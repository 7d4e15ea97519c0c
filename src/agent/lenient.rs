//! Reading the agent CLIs' messages into serde types as leniently as the
//! adapters read them when they picked members out of a `Value`: a member
//! of the wrong shape reads as absent and the rest of the message still
//! counts, so a message that yielded a partial result still does. Every
//! message type has `#[serde(default)]` and its members one of these
//! `deserialize_with` functions (or a type that accepts any JSON, `Value`).

use serde::Deserialize;
use serde::de::value::MapDeserializer;
use serde::de::{DeserializeOwned, Deserializer};
use serde_json::Value;

/// `T` read from `value`; `T::default()` when `value` is not an object (a
/// member looked up in a string or an array is absent) or not a `T`.
pub fn read<T: DeserializeOwned + Default>(value: &Value) -> T {
    match value {
        Value::Object(_) => T::deserialize(value).unwrap_or_default(),
        _ => T::default(),
    }
}

/// An adjacently tagged `T` (`#[serde(tag = .., content = ..)]`) from its
/// tag and its content, read apart from the message: a message without
/// the content member counts as one with `null` there (serde's form would
/// refuse it, and the adapters read such a message). `None` for a tag `T`
/// does not know.
pub fn adjacent<T: DeserializeOwned>(tag: (&str, &str), content: (&str, &Value)) -> Option<T> {
    let name = Value::from(tag.1);
    let members = [(tag.0, &name), content];
    T::deserialize(MapDeserializer::<_, serde_json::Error>::new(
        members.into_iter(),
    ))
    .ok()
}

/// The member whatever it is, `null` included (`Option<Value>` would read
/// `null` as absent).
pub fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// The member as a `T` (a string, a bool, a number), `None` when it is
/// another kind of value, `null` included.
pub fn value<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = Value::deserialize(d)?;
    Ok(T::deserialize(&value).ok())
}

/// A token count: an integer, or a float without a fraction (some CLIs
/// write `12.0`).
pub fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let value = Value::deserialize(d)?;
    Ok(super::usage::as_u64(Some(&value)))
}

/// A member read with [`read`]: `Some` whenever it is present, `null`
/// included (an object that lacks the members reads as all absent).
pub fn member<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    let value = Value::deserialize(d)?;
    Ok(Some(read(&value)))
}

/// A member read with [`read`], `None` when it is `null` too.
pub fn non_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    let value = Value::deserialize(d)?;
    Ok((!value.is_null()).then(|| read(&value)))
}

/// A member read with [`read`] when it is an object, else `None`.
pub fn if_object<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    let value = Value::deserialize(d)?;
    Ok(value.is_object().then(|| read(&value)))
}

/// A member read with [`read`] whatever it is (absent and `null` read as
/// an object without members).
pub fn object<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    let value = Value::deserialize(d)?;
    Ok(read(&value))
}

/// An array, each element read with [`read`]; `None` when the member is
/// not an array.
pub fn list<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    let value = Value::deserialize(d)?;
    Ok(value.as_array().map(|a| a.iter().map(read).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default)]
    struct Inner {
        #[serde(deserialize_with = "value")]
        name: Option<String>,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default)]
    struct Outer {
        #[serde(deserialize_with = "value")]
        name: Option<String>,
        #[serde(deserialize_with = "count")]
        tokens: Option<u64>,
        #[serde(deserialize_with = "member")]
        inner: Option<Inner>,
        #[serde(deserialize_with = "non_null")]
        error: Option<Inner>,
        #[serde(deserialize_with = "list")]
        items: Option<Vec<Inner>>,
        #[serde(deserialize_with = "if_object")]
        info: Option<Inner>,
    }

    #[test]
    fn a_member_of_the_wrong_shape_reads_as_absent() {
        let o: Outer = read(&json!({
            "name": 3, "tokens": 12.0, "inner": ["x"], "error": null,
            "items": ["a", {"name": "b"}, {"name": 1}], "info": ["x"]}));
        assert_eq!(
            o,
            Outer {
                name: None,
                tokens: Some(12),
                inner: Some(Inner::default()),
                error: None,
                items: Some(vec![
                    Inner::default(),
                    Inner {
                        name: Some("b".into())
                    },
                    Inner::default()
                ]),
                info: None,
            }
        );
        assert_eq!(read::<Outer>(&json!(["name", 1])), Outer::default());
        assert_eq!(read::<Outer>(&json!({"tokens": 1.5})).tokens, None);
        assert_eq!(
            read::<Outer>(&json!({"error": {"name": "e"}})).error,
            Some(Inner {
                name: Some("e".into())
            })
        );
        assert_eq!(read::<Outer>(&json!({"items": {}})).items, None);
        assert_eq!(
            read::<Outer>(&json!({"info": {}})).info,
            Some(Inner::default())
        );
    }
}
