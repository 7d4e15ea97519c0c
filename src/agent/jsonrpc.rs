//! JSON-RPC 2.0 messages as `codex app-server` writes them (one JSON object
//! a line, the `"jsonrpc"` member omitted) and ACP agents too (with it),
//! and the loop that reads such an agent's output ([`serve`]).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::command::{JsonLines, event_for_line};
use super::lenient;
use super::{AdapterCommand, AdapterIo};
use crate::process::supervisor::Stream;

/// Reads a JSON-RPC agent's output until it ends (Codex app-server, an ACP
/// agent): each stdout line that is a JSON object goes to `message`, any
/// other line, and every stderr line, becomes an event; a protocol
/// interrupt goes to `interrupt` (neither kind of agent takes a wrap-up).
pub async fn serve<S>(
    io: &mut AdapterIo,
    state: &mut S,
    mut message: impl FnMut(&mut S, &mut AdapterIo, &Value),
    mut interrupt: impl FnMut(&mut S, &mut AdapterIo),
) {
    let mut json_lines = JsonLines::new();
    let mut commands_open = true;
    loop {
        tokio::select! {
            line = io.lines.recv() => {
                let Some((stream, line)) = line else { break };
                let object = match stream {
                    Stream::Stdout => json_lines.push(&line),
                    Stream::Stderr => None,
                };
                match object {
                    Some(obj) => message(state, io, &Value::Object(obj)),
                    None => io
                        .events
                        .emit_agent(event_for_line(io.events.fresh_redactor(), stream, &line)),
                }
            }
            cmd = io.commands.recv(), if commands_open => match cmd {
                Some(AdapterCommand::ProtocolInterrupt) => interrupt(state, io),
                // Not sent: their launches take no wrap-up.
                Some(AdapterCommand::WrapUp) => {}
                None => commands_open = false,
            },
        }
    }
}

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

/// The members of a message the runner reads; which of them are there
/// says what kind of message it is (JSON-RPC has no tag member).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Envelope {
    #[serde(deserialize_with = "lenient::value")]
    method: Option<String>,
    /// `null` reads as absent: a message with a null id is no request or
    /// response of ours.
    id: Option<Value>,
    params: Value,
    error: Option<Value>,
    result: Option<Value>,
}

/// Reads a message, or `None` when `value` is not one.
pub fn parse(value: &Value) -> Option<Message> {
    if !value.is_object() {
        return None;
    }
    let Envelope {
        method,
        id,
        params,
        error,
        result,
    } = lenient::read(value);
    match (method, id) {
        (Some(method), Some(id)) => Some(Message::Request { id, method, params }),
        (Some(method), None) => Some(Message::Notification { method, params }),
        (None, Some(id)) => {
            let result = match error {
                Some(e) => Err(e),
                None => Ok(result.unwrap_or(Value::Null)),
            };
            Some(Message::Response { id, result })
        }
        (None, None) => None,
    }
}

/// A request.
#[derive(Debug, Serialize)]
pub struct Request<'a, P> {
    /// Ours, to match the response with.
    pub id: u64,
    /// The method.
    pub method: &'a str,
    /// Its params.
    pub params: P,
}

/// A request.
pub fn request<P: Serialize>(id: u64, method: &str, params: P) -> Request<'_, P> {
    Request { id, method, params }
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

/// The member of an error object the runner reads.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ErrorObject {
    #[serde(deserialize_with = "lenient::value")]
    message: Option<String>,
}

/// The `message` of an error object, or its JSON.
pub fn error_message(error: &Value) -> String {
    lenient::read::<ErrorObject>(error)
        .message
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
        // A null id is none; a method that is no string is none.
        assert!(matches!(
            parse(&json!({"id": null, "method": "turn/started"})),
            Some(Message::Notification {
                params: Value::Null,
                ..
            })
        ));
        assert_eq!(
            parse(&json!({"id": 4, "method": 7, "error": null})),
            Some(Message::Response {
                id: json!(4),
                result: Ok(Value::Null)
            })
        );
        assert_eq!(parse(&json!([1])), None);
    }

    #[test]
    fn requests_keep_their_members() {
        assert_eq!(
            serde_json::to_value(request(2, "turn/start", json!({"threadId": "t"}))).ok(),
            Some(json!({"id": 2, "method": "turn/start", "params": {"threadId": "t"}}))
        );
        assert_eq!(error_message(&json!({"code": 1, "message": "no"})), "no");
        assert_eq!(
            error_message(&json!({"code": 1, "message": 2})),
            r#"{"code":1,"message":2}"#
        );
    }
}
