//! How tool results map to MCP content, both ways.
//!
//! A tool's result is one JSON value. Over MCP it becomes a text block (a string as is, any
//! other value as JSON text), plus `structuredContent` when the tool has an output schema. A
//! tool that wants images, audio or embedded resources returns an [`McpContent`], whose JSON
//! form `{"mcp:content": [blocks]}` the server sends as the blocks themselves; the client maps
//! non-text results from a remote tool to the same form, so both directions agree.

use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::ToolError;

/// The key of [`McpContent`]'s JSON form.
pub const CONTENT_KEY: &str = "mcp:content";

/// Marks an output schema that wraps a non-object result as `{"result": …}`. The standalone
/// FastMCP 2 package marks its wrappers with its own key; the client reads both. (The
/// official Python SDK wraps without a mark, so its results stay as declared.)
const WRAP_MARKERS: [&str; 2] = ["x-kuralle-wrap-result", "x-fastmcp-wrap-result"];

/// MCP content blocks as a tool result: text, images, audio, embedded resources.
///
/// Return it from a `#[tool]` fn; it is journaled as `{"mcp:content": [...]}` and served as
/// those blocks.
///
/// ```
/// use kuralle::mcp::McpContent;
///
/// let c = McpContent::new().text("a red pixel:").image("iVBORw0KGgo=", "image/png");
/// let v = serde_json::to_value(&c).unwrap();
/// assert_eq!(v["mcp:content"][1]["type"], "image");
/// assert_eq!(serde_json::from_value::<McpContent>(v).unwrap(), c);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpContent {
    #[serde(rename = "mcp:content")]
    blocks: Vec<ContentBlock>,
}

impl McpContent {
    /// No blocks yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a text block.
    #[must_use]
    pub fn text(self, text: impl Into<String>) -> Self {
        self.block(ContentBlock::text(text))
    }

    /// Adds an image block (`data` is base64).
    #[must_use]
    pub fn image(self, data: impl Into<String>, mime_type: impl Into<String>) -> Self {
        self.block(ContentBlock::image(data, mime_type))
    }

    /// Adds an audio block (`data` is base64).
    #[must_use]
    pub fn audio(self, data: impl Into<String>, mime_type: impl Into<String>) -> Self {
        self.block(ContentBlock::audio(data, mime_type))
    }

    /// Adds an embedded text resource.
    #[must_use]
    pub fn resource_text(self, uri: impl Into<String>, mime_type: impl Into<String>, text: impl Into<String>) -> Self {
        self.block(ContentBlock::resource(ResourceContents::TextResourceContents {
            uri: uri.into(),
            mime_type: Some(mime_type.into()),
            text: text.into(),
            meta: None,
        }))
    }

    /// Adds any block.
    #[must_use]
    pub fn block(mut self, block: ContentBlock) -> Self {
        self.blocks.push(block);
        self
    }

    /// The blocks, in order.
    pub fn blocks(&self) -> &[ContentBlock] {
        &self.blocks
    }
}

/// The output schema a tool advertises over MCP, which requires an object at the root: an
/// object schema as it is, anything else wrapped as `{"result": <schema>}` (with `$defs` and
/// `$schema` lifted to the root so references still resolve). `None` when not an object.
pub(crate) fn mcp_output_schema(schema: &Value) -> Option<(Map<String, Value>, bool)> {
    let Value::Object(map) = schema else { return None };
    if map.get("type").and_then(Value::as_str) == Some("object") {
        return Some((map.clone(), false));
    }
    let mut inner = map.clone();
    let mut root = Map::new();
    for lifted in ["$schema", "$defs"] {
        if let Some(v) = inner.remove(lifted) {
            root.insert(lifted.to_owned(), v);
        }
    }
    root.insert("type".into(), json!("object"));
    root.insert("properties".into(), json!({ "result": inner }));
    root.insert("required".into(), json!(["result"]));
    root.insert(WRAP_MARKERS[0].into(), Value::Bool(true));
    Some((root, true))
}

/// A remote tool's output schema as the result the client hands out: a wrapped schema (see
/// [`mcp_output_schema`]) is unwrapped, with `$defs` and `$schema` moved back inside.
/// Returns the schema and whether results arrive wrapped.
pub(crate) fn unwrap_output_schema(schema: Value) -> (Value, bool) {
    let wrapped = WRAP_MARKERS.iter().any(|m| schema.get(*m) == Some(&Value::Bool(true)));
    let Some(mut inner) = schema.pointer("/properties/result").cloned().filter(|_| wrapped) else {
        return (schema, false);
    };
    if let Value::Object(map) = &mut inner {
        for lifted in ["$schema", "$defs"] {
            if let Some(v) = schema.get(lifted) {
                map.insert(lifted.to_owned(), v.clone());
            }
        }
    }
    (inner, true)
}

/// The `tools/call` result for a call's outcome. `structured` is `Some(wrapped)` when the tool
/// advertises an output schema (`wrapped`: the value sits under `"result"`).
pub(crate) fn to_call_result(outcome: Result<Value, ToolError>, structured: Option<bool>) -> CallToolResult {
    let value = match outcome {
        Ok(v) => v,
        // The message names the tool and the problem in words a client's user (or model) can
        // act on; `isError` keeps it out of the protocol-error path that clients hide.
        Err(e) => return CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
    };
    if value.get(CONTENT_KEY).is_some()
        && let Ok(content) = McpContent::deserialize(&value)
    {
        return CallToolResult::success(content.blocks);
    }
    let text = match &value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = match structured {
        Some(true) => Some(json!({ "result": value })),
        Some(false) => Some(value),
        None => None,
    };
    result
}

/// A remote tool's result as one JSON value: an error result is a [`ToolError::Failed`] with
/// its text; structured content wins; a single text block is its text; anything else is the
/// [`McpContent`] form.
pub(crate) fn from_call_result(tool: &str, result: CallToolResult, wrapped: bool) -> Result<Value, ToolError> {
    let texts =
        || result.content.iter().filter_map(|b| b.as_text().map(|t| t.text.as_str())).collect::<Vec<_>>().join("\n");
    if result.is_error == Some(true) {
        let message = texts();
        let message = if message.is_empty() { "the MCP server reported an error".to_owned() } else { message };
        return Err(ToolError::failed(tool, message));
    }
    if let Some(mut v) = result.structured_content.clone() {
        if wrapped && let Some(inner) = v.get_mut("result") {
            return Ok(inner.take());
        }
        return Ok(v);
    }
    match result.content.as_slice() {
        [] => Ok(Value::Null),
        [only] if only.as_text().is_some() => Ok(Value::String(texts())),
        blocks => serde_json::to_value(McpContent { blocks: blocks.to_vec() })
            .map_err(|e| ToolError::InvalidOutput { tool: tool.to_owned(), message: e.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_schemas_stay_and_others_are_wrapped_with_their_defs_lifted() {
        let object = json!({"type": "object", "properties": {"id": {"type": "integer"}}});
        assert_eq!(mcp_output_schema(&object), Some((object.as_object().unwrap().clone(), false)));

        let list = json!({"$schema": "s", "type": "array", "items": {"$ref": "#/$defs/Item"}, "$defs": {"Item": {}}});
        let (wrapped, is_wrapped) = mcp_output_schema(&list).unwrap();
        let wrapped = Value::Object(wrapped);
        assert!(is_wrapped);
        assert_eq!(wrapped["$defs"], json!({"Item": {}}));
        assert_eq!(wrapped["properties"]["result"], json!({"type": "array", "items": {"$ref": "#/$defs/Item"}}));
        assert_eq!(unwrap_output_schema(wrapped), (list, true));
        assert_eq!(mcp_output_schema(&json!(true)), None);
    }

    #[test]
    fn results_round_trip_through_a_call_result() {
        let wrapped = to_call_result(Ok(json!(7)), Some(true));
        assert_eq!(wrapped.structured_content, Some(json!({"result": 7})));
        assert_eq!(from_call_result("t", wrapped, true), Ok(json!(7)));

        let text = to_call_result(Ok(json!("plain")), None);
        assert_eq!(text.structured_content, None);
        assert_eq!(from_call_result("t", text, false), Ok(json!("plain")));

        let content = McpContent::new().text("a").image("AA==", "image/png");
        let served = to_call_result(Ok(serde_json::to_value(&content).unwrap()), None);
        assert_eq!(served.content.len(), 2);
        assert_eq!(from_call_result("t", served, false), Ok(serde_json::to_value(&content).unwrap()));

        let failed = to_call_result(Err(ToolError::failed("t", "no stock")), Some(false));
        assert_eq!(failed.is_error, Some(true));
        assert_eq!(from_call_result("t", failed, false), Err(ToolError::failed("t", "tool `t` failed: no stock")));
    }

    #[test]
    fn an_object_that_only_looks_like_content_is_a_plain_result() {
        let lookalike = json!({"mcp:content": "not blocks"});
        let served = to_call_result(Ok(lookalike.clone()), None);
        assert_eq!(served.content[0].as_text().map(|t| t.text.clone()), Some(lookalike.to_string()));
    }
}
