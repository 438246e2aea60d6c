//! A journaled model response (its parts, in order, with the provider that produced them),
//! and what it must satisfy before it is journaled and sent back to the model: one call per
//! call id, and no arguments too large to keep.
//!
//! Both fixes are applied before the response is journaled, so a replayed run sees exactly
//! what the live run saw and gives the model the same answers.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use serde::{Deserialize, Serialize, Serializer};

use crate::{
    input::text::{MAX_TOOL_ARGS_BYTES, oversized_marker, oversized_marker_parts},
    model::{FinishReason, Origin, Part, SmolStr, ToolCallRequest, Usage, legacy_parts},
};

/// A journaled model response. Journals written before parts existed hold `text` and
/// `tool_calls` instead; they read back as the same parts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(from = "ResponseWire")]
pub(crate) struct ModelResponse {
    pub(crate) parts: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) origin: Option<Origin>,
    pub(crate) finish: FinishReason,
    pub(crate) usage: Usage,
    /// The names of the tools the request offered, so a replay of the run can tell when a
    /// test offers different ones. `None` in journals written before they were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) offered: Option<Offered>,
    /// What the response cost in dollars, when its model has a [`Pricing`](crate::Pricing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cost_usd: Option<f64>,
}

/// The tools a request offered, journaled as their names: the request's own specs while the
/// step runs (shared, where copying every name was an allocation per tool per step), the
/// names once read back.
#[derive(Debug, Clone)]
pub(crate) enum Offered {
    Specs(Arc<[crate::tool::ToolSpec]>),
    Names(Vec<String>),
}

impl Offered {
    /// The names, in the request's order.
    pub(crate) fn names(&self) -> Vec<&str> {
        match self {
            Self::Specs(specs) => specs.iter().map(|t| t.name.as_str()).collect(),
            Self::Names(names) => names.iter().map(String::as_str).collect(),
        }
    }
}

impl Serialize for Offered {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Specs(specs) => serializer.collect_seq(specs.iter().map(|t| &t.name)),
            Self::Names(names) => serializer.collect_seq(names),
        }
    }
}

#[derive(Deserialize)]
struct ResponseWire {
    #[serde(default)]
    parts: Option<Vec<Part>>,
    #[serde(default)]
    origin: Option<Origin>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCallRequest>,
    finish: FinishReason,
    #[serde(default)]
    usage: Usage,
    #[serde(default)]
    offered: Option<Vec<String>>,
    cost_usd: Option<f64>,
}

impl From<ResponseWire> for ModelResponse {
    fn from(w: ResponseWire) -> Self {
        let parts = w.parts.unwrap_or_else(|| legacy_parts(w.text.unwrap_or_default(), w.tool_calls));
        let offered = w.offered.map(Offered::Names);
        Self { parts, origin: w.origin, finish: w.finish, usage: w.usage, offered, cost_usd: w.cost_usd }
    }
}

impl ModelResponse {
    /// The text parts, joined.
    pub(super) fn text(&self) -> String {
        let mut text = String::new();
        for part in &self.parts {
            if let Part::Text { text: t, .. } = part {
                text.push_str(t);
            }
        }
        text
    }

    /// Whether the response asks for tool calls.
    pub(super) fn has_calls(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::ToolCall { .. }))
    }

    /// Bytes of text the response holds outside its calls' arguments.
    pub(super) fn text_bytes(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Text { text, signature, id } => {
                    text.len() + signature.as_ref().map_or(0, String::len) + id.as_ref().map_or(0, String::len)
                }
                Part::ToolCall { call, signature, id } => {
                    call.call_id.len()
                        + call.name.len()
                        + signature.as_ref().map_or(0, String::len)
                        + id.as_ref().map_or(0, String::len)
                }
                Part::Reasoning { text, summary, signature, encrypted, id } => {
                    text.len()
                        + summary.iter().map(String::len).sum::<usize>()
                        + [signature, encrypted, id].iter().map(|s| s.as_ref().map_or(0, String::len)).sum::<usize>()
                }
                Part::RedactedReasoning { data } => data.len(),
            })
            .sum()
    }
}

/// Moves the calls out of `parts`, in order, leaving empty calls in their places for
/// [`put_calls`] to fill: dispatch consumes them without a copy.
pub(super) fn take_calls(parts: &mut [Part]) -> Vec<ToolCallRequest> {
    parts
        .iter_mut()
        .filter_map(|p| match p {
            Part::ToolCall { call, .. } => Some(std::mem::take(call)),
            _ => None,
        })
        .collect()
}

/// Runs `f` on the calls of `parts` as one slice: in place for a response of at most one call
/// (the common one), which then allocates nothing; otherwise taken out and put back.
pub(super) fn with_calls(parts: &mut [Part], f: impl FnOnce(&mut [ToolCallRequest])) {
    let mut calls = parts.iter_mut().filter_map(|p| match p {
        Part::ToolCall { call, .. } => Some(call),
        _ => None,
    });
    let first = calls.next();
    if calls.next().is_none() {
        f(first.map(std::slice::from_mut).unwrap_or_default());
        return;
    }
    let mut taken = take_calls(parts);
    f(&mut taken);
    put_calls(parts, taken);
}

/// Puts `calls` back into the call parts of `parts`, in order.
pub(super) fn put_calls(parts: &mut [Part], calls: impl IntoIterator<Item = ToolCallRequest>) {
    let mut calls = calls.into_iter();
    for part in parts {
        if let Part::ToolCall { call, .. } = part
            && let Some(next) = calls.next()
        {
            *call = next;
        }
    }
}

/// Gives every call a distinct, non-empty id. A repeated id becomes `<id>~<n>` (the first free
/// `n` from 2), in the assistant message and in its result alike, so the transcript answers
/// each call exactly once and OpenAI-compatible servers accept it on the next request.
///
/// Linear in the number of calls: for each repeated id the search for a free `n` resumes
/// where the last one for that id stopped. Every `n` below that was taken then, and ids are
/// never freed, so the answer is the same as searching from 2; and each probe that fails
/// passes an id in `seen` that no other search probes (`<id>~<n>` names one `(id, n)`), so
/// all the searches together fail at most once per call.
pub(super) fn dedupe_call_ids(calls: &mut [ToolCallRequest]) {
    // Filled first: an id depends only on its call's place, so it is the same as when each
    // call is reached below.
    for (index, call) in calls.iter_mut().enumerate() {
        if call.call_id.is_empty() {
            call.call_id = smol_str::format_smolstr!("call_{index}");
        }
    }
    if calls.len() < 2 {
        // The common response of one call repeats nothing: no sets to build every step.
        return;
    }
    let mut seen: HashSet<SmolStr> = HashSet::with_capacity(calls.len());
    // The next `n` to try, per repeated id.
    let mut next: HashMap<SmolStr, u64> = HashMap::new();
    for call in calls.iter_mut() {
        if !seen.contains(&call.call_id) {
            seen.insert(call.call_id.clone());
            continue;
        }
        let original = std::mem::take(&mut call.call_id);
        let n = next.entry(original.clone()).or_insert(2);
        let renamed = loop {
            let id = smol_str::format_smolstr!("{original}~{n}");
            *n += 1;
            if !seen.contains(&id) {
                break id;
            }
        };
        tracing::warn!(call_id = %original, renamed = %renamed, "the model repeated a call id in one response; renamed");
        seen.insert(renamed.clone());
        call.call_id = renamed;
    }
}

/// Replaces arguments that cannot be kept with a small marker that answers the call with
/// [`ToolError::InvalidInput`](crate::ToolError::InvalidInput): first every argument text over
/// [`MAX_TOOL_ARGS_BYTES`] (the per-call limit), then, while the calls' arguments together
/// still exceed `budget` bytes, the largest remaining ones. The other calls are unaffected.
pub(super) fn cap_arguments(calls: &mut [ToolCallRequest], budget: usize) {
    for call in calls.iter_mut() {
        if call.arguments.len() > MAX_TOOL_ARGS_BYTES {
            call.arguments = oversized_marker(call.arguments.len(), MAX_TOOL_ARGS_BYTES);
        }
    }
    let mut total: usize = calls.iter().map(|c| c.arguments.len()).sum();
    while total > budget {
        let Some(largest) = calls
            .iter_mut()
            .filter(|c| oversized_marker_parts(&c.arguments).is_none())
            .max_by_key(|c| c.arguments.len())
        else {
            return;
        };
        let bytes = largest.arguments.len();
        largest.arguments = oversized_marker(bytes, budget);
        total = total - bytes + largest.arguments.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::text::parse_args;

    fn call(id: &str, args: &str) -> ToolCallRequest {
        ToolCallRequest { call_id: id.into(), name: "t".into(), arguments: args.into() }
    }

    #[test]
    fn with_calls_sees_every_call_in_order_and_keeps_what_it_changes() {
        for n in 0..4 {
            let mut parts = vec![Part::text("a")];
            for i in 0..n {
                parts.push(Part::call(call(&format!("c{i}"), "{}")));
                parts.push(Part::text("between"));
            }
            with_calls(&mut parts, |calls| {
                let ids: Vec<&str> = calls.iter().map(|c| c.call_id.as_str()).collect();
                assert_eq!(ids, (0..n).map(|i| format!("c{i}")).collect::<Vec<_>>());
                for c in calls.iter_mut() {
                    c.arguments = format!("{{\"id\":\"{}\"}}", c.call_id);
                }
            });
            let args: Vec<String> = take_calls(&mut parts).into_iter().map(|c| c.arguments).collect();
            assert_eq!(args, (0..n).map(|i| format!("{{\"id\":\"c{i}\"}}")).collect::<Vec<_>>());
            assert_eq!(parts.len(), 1 + 2 * n, "no part added or lost");
        }
    }

    #[test]
    fn offered_tools_are_journaled_as_names_and_read_back_as_such() {
        let spec = |name: &str| crate::tool::ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: serde_json::json!({}),
            output_schema: None,
        };
        let response = ModelResponse {
            parts: vec![Part::text("hi")],
            origin: None,
            finish: FinishReason::Stop,
            usage: Usage::default(),
            offered: Some(Offered::Specs(Arc::from(vec![spec("search"), spec("charge")]))),
            cost_usd: None,
        };
        let text = serde_json::to_value(&response).unwrap();
        assert_eq!(text["offered"], serde_json::json!(["search", "charge"]));
        let back: ModelResponse = serde_json::from_value(text).unwrap();
        assert_eq!(back.offered.unwrap().names(), ["search", "charge"]);
    }

    #[test]
    fn repeated_and_empty_ids_are_made_unique() {
        let mut calls = vec![call("a", "{}"), call("a", "{}"), call("a~2", "{}"), call("a", "{}"), call("", "{}")];
        dedupe_call_ids(&mut calls);
        let ids: Vec<_> = calls.iter().map(|c| c.call_id.as_str()).collect();
        assert_eq!(ids, ["a", "a~2", "a~2~2", "a~3", "call_4"]);
        for (id, kept) in [("", "call_0"), ("b", "b")] {
            let mut one = vec![call(id, "{}")];
            dedupe_call_ids(&mut one);
            assert_eq!(one[0].call_id, kept);
        }
    }

    /// The search from 2 for every repeated id, as it was written before it was made linear.
    fn dedupe_from_two(calls: &mut [ToolCallRequest]) {
        let mut seen: HashSet<SmolStr> = HashSet::new();
        for (index, call) in calls.iter_mut().enumerate() {
            if call.call_id.is_empty() {
                call.call_id = format!("call_{index}").into();
            }
            if seen.insert(call.call_id.clone()) {
                continue;
            }
            let original = call.call_id.clone();
            let renamed: SmolStr =
                (2u64..).map(|n| format!("{original}~{n}").into()).find(|id| !seen.contains(id)).unwrap();
            seen.insert(renamed.clone());
            call.call_id = renamed;
        }
    }

    #[test]
    fn ten_thousand_identical_ids_are_numbered_in_order() {
        let mut calls: Vec<_> = (0..10_000).map(|_| call("call_x", "{}")).collect();
        // An id that is already taken is skipped, as before.
        calls[1].call_id = "call_x~3".into();
        dedupe_call_ids(&mut calls);
        let mut expected: Vec<String> = vec!["call_x".into(), "call_x~3".into(), "call_x~2".into()];
        expected.extend((4..=10_000).map(|n| format!("call_x~{n}")));
        let ids: Vec<_> = calls.iter().map(|c| c.call_id.clone()).collect();
        assert_eq!(ids, expected);
        let distinct: HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), 10_000);
    }

    proptest::proptest! {
        /// Any mix of repeated, suffixed and empty ids gets the same ids as the search from 2.
        #[test]
        fn dedupe_matches_the_search_from_two(
            ids in proptest::collection::vec(proptest::sample::select(
                vec!["", "a", "a~2", "a~3", "a~2~2", "b", "b~2", "a~10", "call_1", "call_3~2"]), 0..40)
        ) {
            let mut fast: Vec<_> = ids.iter().map(|id| call(id, "{}")).collect();
            let mut slow = fast.clone();
            dedupe_call_ids(&mut fast);
            dedupe_from_two(&mut slow);
            let fast: Vec<_> = fast.into_iter().map(|c| c.call_id).collect();
            let slow: Vec<_> = slow.into_iter().map(|c| c.call_id).collect();
            proptest::prop_assert_eq!(fast, slow);
        }
    }

    #[test]
    fn oversized_arguments_become_a_marker_with_the_same_answer() {
        let big = format!("{{\"text\":\"{}\"}}", "x".repeat(MAX_TOOL_ARGS_BYTES));
        let live = parse_args("t", &big).unwrap_err();
        let mut calls = vec![call("a", &big), call("b", r#"{"ok":1}"#)];
        cap_arguments(&mut calls, usize::MAX);
        assert!(calls[0].arguments.len() < 100, "{}", calls[0].arguments);
        assert_eq!(parse_args("t", &calls[0].arguments).unwrap_err(), live);
        assert_eq!(calls[1].arguments, r#"{"ok":1}"#);
    }

    #[test]
    fn arguments_over_the_response_budget_are_replaced_largest_first() {
        let mut calls = vec![call("a", &"1".repeat(300)), call("b", &"2".repeat(500)), call("c", &"3".repeat(100))];
        cap_arguments(&mut calls, 600);
        assert!(oversized_marker_parts(&calls[1].arguments).is_some());
        assert_eq!(calls[0].arguments.len(), 300);
        assert_eq!(calls[2].arguments.len(), 100);
    }
}
