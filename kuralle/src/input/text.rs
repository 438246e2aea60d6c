//! Argument text: a model's raw arguments for one call ([`RawArgs`]), their size limit
//! ([`MAX_TOOL_ARGS_BYTES`]), parsing them into a `Value` ([`parse_args`]), and the marker that
//! stands in for arguments too large to journal.

use std::sync::OnceLock;

use serde_json::Value;

use crate::error::ToolError;

/// A model's raw argument text, parsed into a `Value` (by [`parse_args`]) only when something
/// asks for it, and then once.
///
/// ```
/// use kuralle::{RawArgs, Tool, ToolContext, tool};
///
/// /// Echo back the provided text.
/// #[tool]
/// async fn echo(text: String) -> String {
///     text
/// }
///
/// let args = RawArgs::new(r#"{"text": "hi"}"#);
/// assert!(Echo.prepare_raw(&args).is_ok());
/// assert_eq!(args.value("echo").unwrap()["text"], "hi");
/// assert!(Echo.prepare_raw(&RawArgs::new(r#"{"text": 1}"#)).is_err());
/// ```
#[derive(Debug, Default)]
pub struct RawArgs {
    source: Source,
}

/// Where a call's arguments came from.
#[derive(Debug)]
enum Source {
    /// A model's text, parsed into a `Value` the first time something asks for one.
    Text { text: String, parsed: OnceLock<Result<Value, ToolError>> },
    /// A `Value`, without text (a nested `ctx.tool` call's).
    Given(Value),
}

impl Default for Source {
    fn default() -> Self {
        Self::Text { text: String::new(), parsed: OnceLock::new() }
    }
}

impl RawArgs {
    /// Arguments from their raw text.
    pub fn new(text: impl Into<String>) -> Self {
        Self { source: Source::Text { text: text.into(), parsed: OnceLock::new() } }
    }

    /// Arguments already parsed (a nested call's), which have no text.
    pub(crate) fn from_value(value: Value) -> Self {
        Self { source: Source::Given(value) }
    }

    /// The arguments, when they were given as a `Value` rather than as text.
    pub(crate) fn given(&self) -> Option<&Value> {
        match &self.source {
            Source::Given(value) => Some(value),
            Source::Text { .. } => None,
        }
    }

    /// The raw text (empty for arguments given as a `Value`).
    pub fn text(&self) -> &str {
        match &self.source {
            Source::Text { text, .. } => text,
            Source::Given(_) => "",
        }
    }

    /// The raw text, taken back (empty for arguments given as a `Value`).
    pub(crate) fn into_text(self) -> String {
        match self.source {
            Source::Text { text, .. } => text,
            Source::Given(_) => String::new(),
        }
    }

    /// The arguments parsed by [`parse_args`] (errors name `tool`), parsed on the first call.
    ///
    /// # Errors
    /// As [`parse_args`].
    pub fn value(&self, tool: &str) -> Result<&Value, ToolError> {
        match &self.source {
            Source::Text { text, parsed } => {
                parsed.get_or_init(|| parse_args(tool, text)).as_ref().map_err(Clone::clone)
            }
            Source::Given(value) => Ok(value),
        }
    }
}

/// The largest raw argument text [`parse_args`] accepts: 1 MiB. Larger arguments are refused
/// with [`ToolError::InvalidInput`] before parsing, so a runaway model cannot make the runtime
/// parse (and journal) megabytes of arguments.
pub const MAX_TOOL_ARGS_BYTES: usize = 1 << 20;

/// Parses a model's raw argument text: empty text is `{}`, anything else must be a JSON object
/// of at most [`MAX_TOOL_ARGS_BYTES`], nested at most 128 deep.
///
/// # Errors
/// [`ToolError::InvalidInput`] saying what is wrong, in words a model can act on.
///
/// ```
/// use kuralle::{ToolError, parse_args};
/// assert_eq!(parse_args("echo", r#"{"text":"hi"}"#).unwrap()["text"], "hi");
/// assert!(matches!(parse_args("echo", "[1]"), Err(ToolError::InvalidInput { .. })));
/// assert!(matches!(parse_args("echo", "{\"text\":"), Err(ToolError::InvalidInput { .. })));
/// ```
pub fn parse_args(tool: &str, raw: &str) -> Result<Value, ToolError> {
    if raw.len() > MAX_TOOL_ARGS_BYTES {
        return Err(oversized(tool, raw.len(), MAX_TOOL_ARGS_BYTES));
    }
    if let Some((bytes, limit)) = oversized_marker_parts(raw) {
        return Err(oversized(tool, bytes, limit));
    }
    if raw.trim().is_empty() {
        return Ok(Value::Object(serde_json::Map::new()));
    }
    let value: Value = serde_json::from_str(raw)
        .map_err(|e| ToolError::invalid_input(tool, format!("the arguments are not valid JSON ({e})")))?;
    if !value.is_object() {
        return Err(ToolError::invalid_input(
            tool,
            format!("the arguments must be a JSON object, not {}", kind(&value)),
        ));
    }
    Ok(value)
}

fn oversized(tool: &str, bytes: usize, limit: usize) -> ToolError {
    ToolError::invalid_input(
        tool,
        format!(
            "the arguments are {bytes} bytes; the limit is {limit} bytes. Send smaller arguments (for example a reference instead of the content)"
        ),
    )
}

/// The key of the marker that stands in for arguments too large to keep.
const OVERSIZED_KEY: &str = "__kuralle_oversized_arguments";

/// What the runtime journals and sends back in place of arguments too large to keep: a small
/// JSON object that [`parse_args`] answers with the same [`ToolError::InvalidInput`] the
/// original arguments got, so a replayed run gives the model the same answer.
pub(crate) fn oversized_marker(bytes: usize, limit: usize) -> String {
    format!("{{\"{OVERSIZED_KEY}\":{{\"bytes\":{bytes},\"limit\":{limit}}}}}")
}

/// `(bytes, limit)` of an [`oversized_marker`].
pub(crate) fn oversized_marker_parts(raw: &str) -> Option<(usize, usize)> {
    if !raw.starts_with("{\"__kuralle_oversized") || raw.len() > 128 {
        return None;
    }
    let value: Value = serde_json::from_str(raw).ok()?;
    let marker = value.get(OVERSIZED_KEY)?;
    let number = |k: &str| marker.get(k)?.as_u64().and_then(|n| usize::try_from(n).ok());
    Some((number("bytes")?, number("limit")?))
}

/// "a string", "an array", ... for error messages.
pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    use super::*;
    use crate::strategies::json_value;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        /// Any text: a value exactly when it is blank or a JSON object, else a clear
        /// `InvalidInput` naming the tool; never a panic.
        #[test]
        fn any_text_parses_or_gets_a_clear_error(raw in "(?s).{0,64}") {
            match parse_args("t", &raw) {
                Ok(v) => {
                    prop_assert!(v.is_object());
                    prop_assert!(raw.trim().is_empty() || serde_json::from_str::<Value>(&raw).is_ok_and(|p| p == v));
                }
                Err(ToolError::InvalidInput { tool, message }) => {
                    prop_assert_eq!(tool, "t");
                    prop_assert!(!message.is_empty());
                    prop_assert!(!serde_json::from_str::<Value>(&raw).is_ok_and(|v| v.is_object()));
                }
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }

        /// Every JSON object round-trips through its text (compact and pretty).
        #[test]
        fn json_objects_round_trip(entries in proptest::collection::vec(("(?s).{0,6}", json_value()), 0..6)) {
            let object = Value::Object(entries.into_iter().collect::<Map<_, _>>());
            prop_assert_eq!(parse_args("t", &object.to_string()).unwrap(), object.clone());
            prop_assert_eq!(parse_args("t", &serde_json::to_string_pretty(&object).unwrap()).unwrap(), object);
        }

        /// Hostile shapes: deep nesting, truncation at any point, a marker look-alike.
        #[test]
        fn hostile_shapes_never_panic(depth in 0usize..2000, cut in any::<prop::sample::Index>(), open in "[\\[{\"]") {
            let nested = format!("{{\"a\":{}{}", open.repeat(depth), "]".repeat(depth / 2));
            let _ = parse_args("t", &nested);
            let text = format!("{{\"__kuralle_oversized_arguments\":{{\"bytes\":{depth},\"limit\":1}}}}");
            let _ = parse_args("t", &text[..cut.index(text.len() + 1)]);
            prop_assert!(parse_args("t", &text).is_err());
        }
    }
}
