//! JSON-RPC 2.0 messages as `codex app-server` writes them: one JSON
//! object a line, the `"jsonrpc"` member omitted.

use serde_json::{Value, json};

/// A message from the server.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// The answer to one of our requests: `Ok(result)` or `Err(error)`.
    Response {
        /// Our request id.
        id: Value,
        /// `result` or `error`.
        result: Result<Value, Value>,
    },
    /// A notification.
    Notification {
        /// The method.
        method: String,
        /// Its params (`null` when absent).
        params: Value,
    },
    /// A request from the server, which must be answered.
    Request {
        /// Its id.
        id: Value,
        /// The method.
        method: String,
        /// Its params.
        params: Value,
    },
}

/// Reads a message, or `None` when `value` is not one.
pub fn parse(value: &Value) -> Option<Message> {
    let obj = value.as_object()?;
    let method = obj
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_string);
    let id = obj.get("id").cloned().filter(|v| !v.is_null());
    let params = obj.get("params").cloned().unwrap_or(Value::Null);
    match (method, id) {
        (Some(method), Some(id)) => Some(Message::Request { id, method, params }),
        (Some(method), None) => Some(Message::Notification { method, params }),
        (None, Some(id)) => {
            let result = match obj.get("error") {
                Some(e) if !e.is_null() => Err(e.clone()),
                _ => Ok(obj.get("result").cloned().unwrap_or(Value::Null)),
            };
            Some(Message::Response { id, result })
        }
        (None, None) => None,
    }
}

/// A request.
pub fn request(id: u64, method: &str, params: Value) -> Value {
    json!({"id": id, "method": method, "params": params})
}

/// A notification.
pub fn notification(method: &str) -> Value {
    json!({"method": method})
}

/// A successful answer to a server request.
pub fn response(id: &Value, result: Value) -> Value {
    json!({"id": id, "result": result})
}

/// An error answer to a server request.
pub fn error_response(id: &Value, code: i64, message: &str) -> Value {
    json!({"id": id, "error": {"code": code, "message": message}})
}

/// The `message` of an error object, or its JSON.
pub fn error_message(error: &Value) -> String {
    error
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        assert_eq!(
            parse(&json!({"id": 1, "result": {"a": 1}})),
            Some(Message::Response {
                id: json!(1),
                result: Ok(json!({"a": 1}))
            })
        );
        assert_eq!(
            parse(&json!({"id": 1, "error": {"code": -1, "message": "no"}})),
            Some(Message::Response {
                id: json!(1),
                result: Err(json!({"code": -1, "message": "no"}))
            })
        );
        assert!(matches!(
            parse(&json!({"method": "turn/started", "params": {}})),
            Some(Message::Notification { .. })
        ));
        assert!(matches!(
            parse(&json!({"id": "x", "method": "item/tool/call"})),
            Some(Message::Request { .. })
        ));
        assert_eq!(parse(&json!({"type": "x"})), None);
    }
}
