//! Text for messages and command lines: clipping to a number of characters
//! (never inside a character), a JSON decode error without its value, and
//! POSIX shell quoting.

/// The first `max_chars` characters of `text` (all of it when shorter).
pub fn head(text: &str, max_chars: usize) -> &str {
    match text.char_indices().nth(max_chars) {
        Some((i, _)) => text.get(..i).unwrap_or(text),
        None => text,
    }
}

/// The last `max_chars` characters of `text` (all of it when shorter).
pub fn last(text: &str, max_chars: usize) -> &str {
    if max_chars == 0 {
        return "";
    }
    match text.char_indices().nth_back(max_chars - 1) {
        Some((i, _)) => text.get(i..).unwrap_or(text),
        None => text,
    }
}

/// `text` cut to `max_chars` characters, with `…` after them when it was
/// longer (for a value quoted in a message).
pub fn clip(text: &str, max_chars: usize) -> String {
    let kept = head(text, max_chars);
    if kept.len() < text.len() {
        format!("{kept}…")
    } else {
        text.to_string()
    }
}

/// The last `max_chars` characters of `text`, with `…` before them when it
/// was longer (for the tail of an output).
pub fn clip_start(text: &str, max_chars: usize) -> String {
    let kept = last(text, max_chars);
    if kept.len() < text.len() {
        format!("…{kept}")
    } else {
        text.to_string()
    }
}

/// The longest end of `text` of at most `max_bytes` bytes that starts on a
/// character boundary.
pub fn last_bytes(text: &str, max_bytes: usize) -> &str {
    let mut start = text.len().saturating_sub(max_bytes);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text.get(start..).unwrap_or("")
}

/// `text` safe to print on a terminal: every control character (C0, DEL
/// and C1, which include ESC and the 8-bit CSI) written as its `\u{..}`
/// escape, so that text from the agent, the repository or a request can
/// neither move the cursor, retitle the window nor forge a line.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// What a JSON decode error says, without the text it found: `invalid
/// type: string "…", expected a sequence` becomes `invalid type: string,
/// expected a sequence`; only a number out of its range is kept; an
/// unknown field's or variant's name is shown only when
/// [`plain_name`], else by its length; another error is cut before its
/// first `"`. The input comes from a peer (a coordinator's answer, a
/// stored agent state) and may be large or hold what must not reach an
/// event or a log line; the kind, what was expected and the position are
/// what a reader needs to mend it.
pub fn json_error(e: &serde_json::Error) -> String {
    let whole = e.to_string();
    let at = format!(" at line {} column {}", e.line(), e.column());
    let message = whole.strip_suffix(&at).unwrap_or(&whole);
    let position = if e.line() > 0 { at.as_str() } else { "" };
    let said = match e.classify() {
        // serde_json's own fixed text ("EOF while parsing a string", "key
        // must be a string", …): it never quotes the input.
        serde_json::error::Category::Syntax
        | serde_json::error::Category::Eof
        | serde_json::error::Category::Io => message.to_string(),
        serde_json::error::Category::Data => data_error(message),
    };
    format!("{said}{position}")
}

/// [`json_error`] of a data error (the JSON is well formed, the value does
/// not fit the type), from serde's message forms.
fn data_error(message: &str) -> String {
    for prefix in ["invalid type: ", "invalid value: "] {
        // `{unexpected}, expected {expected}`: the expected part is the
        // type's own text, so the last separator is serde's.
        if let Some((found, expected)) = message
            .strip_prefix(prefix)
            .and_then(|rest| rest.rsplit_once(", expected "))
        {
            let kind: Vec<&str> = found
                .split(' ')
                .take_while(|w| !w.starts_with(['`', '"', '\'']))
                .collect();
            let kind = kind.join(" ");
            // A number out of range is kept (`invalid value: integer
            // `5000000000`, expected u32`); a value of the wrong kind is
            // not, even a number: it sits where a string (a key, a PIN)
            // was meant to.
            let found = match kind.as_str() {
                "integer" | "floating point"
                    if prefix == "invalid value: " && found.len() <= 40 =>
                {
                    found
                }
                _ => &kind,
            };
            return format!("{prefix}{found}, expected {expected}");
        }
    }
    for what in ["unknown variant", "unknown field"] {
        let Some(rest) = message
            .strip_prefix(what)
            .and_then(|r| r.strip_prefix(" `"))
        else {
            continue;
        };
        // The name is the peer's and may hold a separator; the type's
        // list after it holds none, so the last separator is serde's.
        let end = ["`, expected ", "`, there are no "]
            .into_iter()
            .filter_map(|sep| rest.rfind(sep))
            .max();
        let Some(end) = end else { break };
        let (name, tail) = rest.split_at(end);
        return if plain_name(name) {
            format!("{what} `{name}{tail}")
        } else {
            format!(
                "{what} of {} characters, not shown{}",
                name.chars().count(),
                tail.strip_prefix('`').unwrap_or(tail)
            )
        };
    }
    // Others quote our own names in backticks (`missing field `x``) but a
    // custom error may quote the input in double quotes (url's "relative
    // URL without a base: \"…\"").
    let cut = message.split('"').next().unwrap_or_default();
    printable(&clip(cut.trim_end(), 200)).into_owned()
}

/// Whether a name a peer chose (a member's key, an enum's variant) may be
/// shown in a message: 1 to 24 ASCII letters, digits, `_` or `-`. Longer
/// ones are shown by their length: a token pasted where a name goes is
/// longer than the names of the contract.
pub fn plain_name(name: &str) -> bool {
    (1..=24).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

/// Quotes `value` for a POSIX shell: in single quotes, an embedded single
/// quote written `'\''` (the shell gives back exactly `value`).
pub fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// Quotes `value` for a POSIX shell as [`shell_quote`] does, but leaves it
/// bare when it is not empty and holds only characters no shell treats
/// specially (letters, digits, `_-./:=@%+,`): for command lines people read.
pub fn shell_word(value: &str) -> String {
    let plain = !value.is_empty()
        && value.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'_' | b'-' | b'.' | b'/' | b':' | b'=' | b'@' | b'%' | b'+' | b','
                )
        });
    if plain {
        value.to_string()
    } else {
        shell_quote(value)
    }
}

/// A signal number by its name: `SIGTERM`, `SIGINT`, `SIGKILL`, …, or
/// `signal N` for one without a common name.
pub fn signal_name(n: i32) -> String {
    let name = match n {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => return format!("signal {n}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_error<T: serde::de::DeserializeOwned + std::fmt::Debug>(json: &str) -> String {
        json_error(&serde_json::from_str::<T>(json).unwrap_err())
    }

    fn value_error<T: serde::de::DeserializeOwned + std::fmt::Debug>(
        value: serde_json::Value,
    ) -> String {
        json_error(&serde_json::from_value::<T>(value).unwrap_err())
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code, reason = "only decoded, to make errors")]
    struct Shape {
        files: Vec<String>,
        count: u32,
        kind: Option<Kind>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Kind {
        One,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Empty {}

    /// A field whose own deserializer quotes the input in its error, as
    /// url's does (`relative URL without a base: "…"`).
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code, reason = "only decoded, to make errors")]
    struct WithUrl {
        #[serde(deserialize_with = "quoting")]
        url: String,
    }

    fn quoting<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        Err(serde::de::Error::custom(format!(
            "relative URL without a base: {s:?}"
        )))
    }

    /// The text found is never in the message; the kind, what was
    /// expected, a number found and the position are.
    #[test]
    fn a_json_error_names_the_kind_not_the_value() {
        let e = decode_error::<Shape>(r#"{"files": "SECRET, expected x", "count": 1}"#);
        assert_eq!(
            e,
            "invalid type: string, expected a sequence at line 1 column 30"
        );
        let e = value_error::<Shape>(serde_json::json!({"files": "SECRET"}));
        assert_eq!(e, "invalid type: string, expected a sequence");
        let e = value_error::<Shape>(serde_json::json!({"files": [true], "count": 1}));
        assert_eq!(e, "invalid type: boolean, expected a string");
        let e = value_error::<Shape>(serde_json::json!({"files": [], "count": 1.5}));
        assert_eq!(e, "invalid type: floating point, expected u32");
        let e =
            value_error::<Shape>(serde_json::json!({"files": [4111111111111111_u64], "count": 1}));
        assert_eq!(e, "invalid type: integer, expected a string");
        let e = value_error::<Shape>(serde_json::json!({"files": [], "count": 5_000_000_000_u64}));
        assert_eq!(e, "invalid value: integer `5000000000`, expected u32");
        let e = value_error::<Shape>(serde_json::json!({"files": []}));
        assert_eq!(e, "missing field `count`");
        let e = value_error::<Shape>(serde_json::json!({"files": [], "count": 1, "kind": "two"}));
        assert_eq!(e, "unknown variant `two`, expected `one`");
        let e = decode_error::<Shape>(r#"{"files": ["SECRET"#);
        assert_eq!(e, "EOF while parsing a string at line 1 column 18");
    }

    /// A name that is not a plain identifier, or one that forges serde's
    /// separator, is shown by its length; the type's own list stays.
    #[test]
    fn an_unknown_name_is_shown_only_when_plain() {
        for (json, what) in [
            (
                serde_json::json!({"files": [], "count": 1, "kind": "x".repeat(25)}),
                "variant",
            ),
            (
                serde_json::json!({"files": [], "count": 1, "x".repeat(25): 1}),
                "field",
            ),
        ] {
            let e = value_error::<Shape>(json);
            assert!(
                e.starts_with(&format!(
                    "unknown {what} of 25 characters, not shown, expected "
                )),
                "{e}"
            );
        }
        let forged = "SECRET`, expected `x";
        let e = value_error::<Shape>(serde_json::json!({"files": [], "count": 1, "kind": forged}));
        assert_eq!(
            e,
            "unknown variant of 20 characters, not shown, expected `one`"
        );
        let e =
            value_error::<Shape>(serde_json::json!({"files": [], "count": 1, "kind": "\u{1b}[2J"}));
        assert_eq!(
            e,
            "unknown variant of 4 characters, not shown, expected `one`"
        );
        let e = value_error::<Empty>(serde_json::json!({"SECRET-token value": 1}));
        assert_eq!(
            e,
            "unknown field of 18 characters, not shown, there are no fields"
        );
        let e = value_error::<Empty>(serde_json::json!({"token": 1}));
        assert_eq!(e, "unknown field `token`, there are no fields");
    }

    /// A custom error (url's) quotes the input in double quotes: the
    /// message stops before it.
    #[test]
    fn a_custom_error_is_cut_before_its_quote() {
        let e = value_error::<WithUrl>(serde_json::json!({"url": "SECRET not a url"}));
        assert_eq!(e, "relative URL without a base:");
        let e = decode_error::<WithUrl>(r#"{"url": "SECRET"}"#);
        assert_eq!(e, "relative URL without a base: at line 1 column 17");
    }

    #[test]
    fn clipping_counts_characters_not_bytes() {
        assert_eq!(head("héllo", 2), "hé");
        assert_eq!(head("hé", 5), "hé");
        assert_eq!(last("héllo", 4), "éllo");
        assert_eq!(last("hé", 5), "hé");
        assert_eq!(last("hé", 0), "");
        assert_eq!(clip("héllo", 2), "hé…");
        assert_eq!(clip("hé", 2), "hé");
        assert_eq!(clip_start("abcdef", 3), "…def");
        assert_eq!(clip_start("abc", 3), "abc");
        assert_eq!(last_bytes("aé", 1), "");
        assert_eq!(last_bytes("aé", 2), "é");
        assert_eq!(last_bytes("aé", 9), "aé");
    }

    #[test]
    fn quoting_is_posix() {
        assert_eq!(shell_quote("/usr/bin/x"), "'/usr/bin/x'");
        assert_eq!(shell_quote("/a b/it's"), r"'/a b/it'\''s'");
        // The shell gives back exactly the value.
        let value = "/tmp/it's a \"dir\"/$HOME `x`";
        for quoted in [shell_quote(value), shell_word(value)] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {quoted}"))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), value);
        }
    }

    #[test]
    fn quoting_keeps_plain_words_bare() {
        assert_eq!(shell_word("A=http://x:1/y"), "A=http://x:1/y");
        assert_eq!(shell_word("it's here"), "'it'\\''s here'");
        assert_eq!(shell_word(""), "''");
    }

    #[test]
    fn printable_escapes_every_control_character() {
        assert_eq!(printable("plain text é 中"), "plain text é 中");
        assert_eq!(
            printable("a\x1b]0;T\x07b\rc\nd\u{9b}e\x7f"),
            "a\\u{1b}]0;T\\u{7}b\\u{d}c\\u{a}d\\u{9b}e\\u{7f}"
        );
    }
}
