//! `docs/openapi.yaml` (the routes of PROTOCOL.md section 2 as an OpenAPI
//! 3.1 document), embedded in the binary for `hosted-boot-conformance` and
//! the tests, and a validator for the part of JSON Schema the document uses.
//! Only `conformance` loads it: `run` never does (the runner's own checks
//! are its wire types).
//!
//! The validator knows the keywords listed in [`KNOWN_KEYWORDS`] and refuses
//! a document that uses any other (so a keyword it would silently ignore
//! cannot enter the document); `pattern` and `format` are annotations only
//! (the runner checks those values itself, PROTOCOL.md 5).

use serde_json::{Map, Value};

use crate::wire::routes::Route;

/// The document's text, as shipped.
pub const TEXT: &str = include_str!("../../../docs/openapi.yaml");

/// The JSON Schema keywords the validator understands. `description`,
/// `title`, `examples`, `default`, `pattern`, `format` and `x-…` are
/// annotations.
pub const KNOWN_KEYWORDS: &[&str] = &[
    "$ref",
    "type",
    "enum",
    "const",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "oneOf",
    "anyOf",
    "minimum",
    "minLength",
    "maxLength",
    "maxItems",
    "maxProperties",
    "description",
    "title",
    "examples",
    "default",
    "pattern",
    "format",
];

/// The parsed document.
#[derive(Clone, Debug)]
pub struct Document {
    root: Value,
}

/// One operation of the document: a route's method and path.
#[derive(Clone, Debug)]
pub struct Operation<'a> {
    /// The path (`/api/cli/sessions/{sessionId}`).
    pub path: &'a str,
    /// Lower-case method (`get`, `post`).
    pub method: &'a str,
    /// The operation object.
    pub op: &'a Value,
}

/// The embedded document does not parse or uses a keyword the validator
/// does not know (the message says which).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InvalidDocument(pub String);

/// The first place where a value does not match its schema, by its JSON
/// pointer (`/session/workspaceId: missing, required`); never the value.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Mismatch(pub String);

impl Document {
    /// Parses [`TEXT`].
    ///
    /// Errors: the YAML does not parse, or the document uses a schema
    /// keyword the validator does not know (a bug of the shipped document,
    /// caught by its test).
    pub fn load() -> Result<Document, InvalidDocument> {
        Document::parse(TEXT)
    }

    /// Parses `text` (YAML) as a document.
    ///
    /// Errors: as [`Document::load`].
    pub fn parse(text: &str) -> Result<Document, InvalidDocument> {
        Document::parsed(text).map_err(InvalidDocument)
    }

    fn parsed(text: &str) -> Result<Document, String> {
        let docs = yaml_rust2::YamlLoader::load_from_str(text)
            .map_err(|e| format!("docs/openapi.yaml does not parse: {e}"))?;
        let first = docs
            .into_iter()
            .next()
            .ok_or("docs/openapi.yaml is empty")?;
        let root = yaml_to_json(first)?;
        let doc = Document { root };
        for (name, schema) in doc.schemas() {
            check_keywords(schema, &format!("#/components/schemas/{name}"))?;
        }
        Ok(doc)
    }

    /// The document as JSON.
    pub fn root(&self) -> &Value {
        &self.root
    }

    fn schemas(&self) -> Vec<(&str, &Value)> {
        self.root
            .pointer("/components/schemas")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.as_str(), v)).collect())
            .unwrap_or_default()
    }

    /// Every operation, in document order.
    pub fn operations(&self) -> Vec<Operation<'_>> {
        let mut out = Vec::new();
        let Some(paths) = self.root.get("paths").and_then(Value::as_object) else {
            return out;
        };
        for (path, item) in paths {
            let Some(item) = item.as_object() else {
                continue;
            };
            for (method, op) in item {
                if ["get", "post", "put", "patch", "delete", "head", "options"]
                    .contains(&method.as_str())
                {
                    out.push(Operation { path, method, op });
                }
            }
        }
        out
    }

    /// The operation of `route` (by its `x-hosted-boot-route`).
    pub fn operation(&self, route: Route) -> Option<Operation<'_>> {
        self.operations()
            .into_iter()
            .find(|o| o.op.get("x-hosted-boot-route").and_then(Value::as_str) == Some(route.name()))
    }

    /// Follows `$ref`s of the document (`#/…`) until a non-reference.
    pub fn resolve<'a>(&'a self, mut v: &'a Value) -> &'a Value {
        for _ in 0..16 {
            match v.get("$ref").and_then(Value::as_str) {
                Some(r) => match r.strip_prefix('#').and_then(|p| self.root.pointer(p)) {
                    Some(target) => v = target,
                    None => return v,
                },
                None => return v,
            }
        }
        v
    }

    /// The response object `route` documents for `status` (exact, then
    /// `2XX`-style range, then `default`).
    pub fn response(&self, route: Route, status: u16) -> Option<&Value> {
        let op = self.operation(route)?;
        let responses = op.op.get("responses")?;
        let range = format!("{}XX", status / 100);
        let found = responses
            .get(status.to_string())
            .or_else(|| responses.get(&range))
            .or_else(|| responses.get("default"))?;
        Some(self.resolve(found))
    }

    /// The JSON schema of `route`'s answer with `status`, if the document
    /// gives one.
    pub fn response_schema(&self, route: Route, status: u16) -> Option<&Value> {
        self.response(route, status)?
            .pointer("/content/application~1json/schema")
    }

    /// The JSON schema of `route`'s request body, if any.
    pub fn request_schema(&self, route: Route) -> Option<&Value> {
        let op = self.operation(route)?;
        let body = self.resolve(op.op.get("requestBody")?);
        body.pointer("/content/application~1json/schema")
    }

    /// The schema named `name` under `components/schemas`.
    pub fn schema(&self, name: &str) -> Option<&Value> {
        self.root.pointer(&format!("/components/schemas/{name}"))
    }

    /// Checks `value` against `schema`; `Err` names the first mismatch by its
    /// JSON pointer in `value` (`/session/workspaceId: missing, required`).
    /// Values are never quoted (an answer may carry a secret), only their
    /// type.
    pub fn validate(&self, schema: &Value, value: &Value) -> Result<(), Mismatch> {
        self.check(schema, value, "").map_err(Mismatch)
    }

    // long: one block per JSON Schema keyword the document uses, each a few
    // lines over the same schema, value and place; split, every piece would
    // take them all.
    fn check(&self, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
        let schema = self.resolve(schema);
        let Some(s) = schema.as_object() else {
            // `{}` or `true`: anything.
            return Ok(());
        };
        let place = if at.is_empty() { "the body" } else { at };
        if let Some(t) = s.get("type") {
            let types: Vec<&str> = match t {
                Value::String(one) => vec![one.as_str()],
                Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if !types.iter().any(|t| type_matches(t, value)) {
                return Err(format!(
                    "{place}: expected {}, got {}",
                    types.join(" or "),
                    type_name(value)
                ));
            }
        }
        if let Some(Value::Array(allowed)) = s.get("enum")
            && !allowed.contains(value)
        {
            let shown: Vec<String> = allowed.iter().map(Value::to_string).collect();
            return Err(format!(
                "{place}: expected one of {}, got another {}",
                shown.join(", "),
                type_name(value)
            ));
        }
        if let Some(c) = s.get("const")
            && c != value
        {
            return Err(format!("{place}: expected {c}"));
        }
        if let (Some(min), Some(n)) = (s.get("minimum").and_then(Value::as_f64), value.as_f64())
            && n < min
        {
            return Err(format!("{place}: expected at least {min}, got {n}"));
        }
        if let Some(text) = value.as_str() {
            let chars = text.chars().count() as u64;
            if let Some(min) = s.get("minLength").and_then(Value::as_u64)
                && chars < min
            {
                return Err(format!(
                    "{place}: expected at least {min} characters, got {chars}"
                ));
            }
            if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
                && chars > max
            {
                return Err(format!(
                    "{place}: expected at most {max} characters, got {chars}"
                ));
            }
        }
        if let Some(items) = value.as_array() {
            if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
                && items.len() as u64 > max
            {
                return Err(format!(
                    "{place}: expected at most {max} items, got {}",
                    items.len()
                ));
            }
            if let Some(item_schema) = s.get("items") {
                for (i, item) in items.iter().enumerate() {
                    self.check(item_schema, item, &format!("{at}/{i}"))?;
                }
            }
        }
        if let Some(obj) = value.as_object() {
            self.check_object(s, obj, at, place)?;
        }
        if let Some(Value::Array(options)) = s.get("oneOf") {
            let fits: Vec<Result<(), String>> =
                options.iter().map(|o| self.check(o, value, at)).collect();
            let ok = fits.iter().filter(|r| r.is_ok()).count();
            if ok != 1 {
                let why = fits
                    .into_iter()
                    .filter_map(Result::err)
                    .collect::<Vec<_>>()
                    .join("; or ");
                return Err(if ok == 0 {
                    format!("{place}: matches none of its forms ({why})")
                } else {
                    format!("{place}: matches more than one of its forms")
                });
            }
        }
        if let Some(Value::Array(options)) = s.get("anyOf") {
            let fits: Vec<Result<(), String>> =
                options.iter().map(|o| self.check(o, value, at)).collect();
            if !fits.iter().any(Result::is_ok) {
                let why = fits
                    .into_iter()
                    .filter_map(Result::err)
                    .collect::<Vec<_>>()
                    .join("; or ");
                return Err(format!("{place}: matches none of its forms ({why})"));
            }
        }
        Ok(())
    }

    fn check_object(
        &self,
        s: &Map<String, Value>,
        obj: &Map<String, Value>,
        at: &str,
        place: &str,
    ) -> Result<(), String> {
        if let Some(Value::Array(required)) = s.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if !obj.contains_key(name) {
                    return Err(format!("{at}/{name}: missing, required"));
                }
            }
        }
        if let Some(max) = s.get("maxProperties").and_then(Value::as_u64)
            && obj.len() as u64 > max
        {
            return Err(format!(
                "{place}: expected at most {max} members, got {}",
                obj.len()
            ));
        }
        let props = s.get("properties").and_then(Value::as_object);
        for (name, member) in obj {
            match props.and_then(|p| p.get(name)) {
                Some(member_schema) => {
                    self.check(member_schema, member, &format!("{at}/{name}"))?
                }
                None => match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        return Err(format!("{at}/{name}: not a member of this object"));
                    }
                    Some(extra @ Value::Object(_)) => {
                        self.check(extra, member, &format!("{at}/{name}"))?
                    }
                    _ => {}
                },
            }
        }
        Ok(())
    }
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.is_u64() || v.is_i64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => false,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Refuses a schema keyword outside [`KNOWN_KEYWORDS`] (extensions `x-…`
/// aside), recursively.
fn check_keywords(schema: &Value, at: &str) -> Result<(), String> {
    let Some(s) = schema.as_object() else {
        return Ok(());
    };
    for (key, sub) in s {
        if key.starts_with("x-") {
            continue;
        }
        if !KNOWN_KEYWORDS.contains(&key.as_str()) {
            return Err(format!(
                "{at}: schema keyword {key:?} is not one the conformance validator knows"
            ));
        }
        match key.as_str() {
            "properties" => {
                for (name, member) in sub.as_object().into_iter().flatten() {
                    check_keywords(member, &format!("{at}/properties/{name}"))?;
                }
            }
            "items" | "additionalProperties" => check_keywords(sub, &format!("{at}/{key}"))?,
            "oneOf" | "anyOf" => {
                for (i, option) in sub.as_array().into_iter().flatten().enumerate() {
                    check_keywords(option, &format!("{at}/{key}/{i}"))?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn yaml_to_json(y: yaml_rust2::Yaml) -> Result<Value, String> {
    use yaml_rust2::Yaml;
    Ok(match y {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(b),
        Yaml::Integer(i) => Value::from(i),
        Yaml::Real(text) => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .ok_or_else(|| format!("docs/openapi.yaml: {text:?} is not a number"))?,
        Yaml::String(s) => Value::String(s),
        Yaml::Array(items) => Value::Array(
            items
                .into_iter()
                .map(yaml_to_json)
                .collect::<Result<_, _>>()?,
        ),
        Yaml::Hash(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                let key = match k {
                    Yaml::String(s) => s,
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    other => return Err(format!("docs/openapi.yaml: a key {other:?} is not text")),
                };
                out.insert(key, yaml_to_json(v)?);
            }
            Value::Object(out)
        }
        Yaml::Alias(_) | Yaml::BadValue => {
            return Err("docs/openapi.yaml: aliases and bad values are not supported".into());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_shipped_document_loads_and_validates_what_it_describes() {
        let doc = Document::load().unwrap();
        let tok = doc.response_schema(Route::AgentToken, 200).unwrap();
        doc.validate(tok, &json!({"token": "t", "expiresAt": null}))
            .unwrap();
        let e = doc.validate(tok, &json!({"expiresAt": 1})).unwrap_err();
        assert_eq!(e.0, "/token: missing, required");
        let s = doc.response_schema(Route::Session, 200).unwrap();
        let e = doc
            .validate(s, &json!({"session": {"workspaceId": 3, "repoBranch": "b", "clientInfo": {"task": "t"}}}))
            .unwrap_err();
        assert_eq!(e.0, "/session/workspaceId: expected string, got number");
        let bad_turn = json!({"session": {"workspaceId": "w", "repoBranch": "b", "clientInfo": {"task": "t"},
            "pendingTurn": {"runId": "r"}}});
        assert!(
            doc.validate(s, &bad_turn)
                .unwrap_err()
                .0
                .contains("none of its forms")
        );
        // A 503 falls to the documented error, a 204 of an ack to its range.
        assert!(doc.response(Route::Finish, 204).is_some());
        assert!(doc.response_schema(Route::Events, 503).is_some());
    }

    #[test]
    fn an_unknown_keyword_is_refused() {
        let text = "openapi: 3.1.0\ncomponents:\n  schemas:\n    A:\n      type: object\n      patternProperties: {}\n";
        let e = Document::parse(text).unwrap_err();
        assert!(e.0.contains("patternProperties"), "{e}");
    }
}
