//! The expansions name everything through absolute paths: user items called `Result`,
//! `Option`, `Box`, `Ok`, `Some`, `String`, `Vec` in scope change nothing, and a
//! `#![no_implicit_prelude]` module can use both macros.
#![deny(warnings)]
#![allow(dead_code, non_camel_case_types, clippy::all)]

struct Result;
struct Option;
struct Box;
struct Ok;
struct Some;
struct String;
struct Vec;
struct Value;
struct Send;
struct Duration;
struct Deserialize;
struct Serialize;
struct JsonSchema;

mod traps {
    // Shadow the glob-importable names too.
    pub(crate) fn drop() {}
    pub(crate) struct None;
}

/// Echo back the text.
#[kuralle::tool(parallel_safe = |_| true, timeout = "1s")]
async fn echo(
    /// The text.
    text: std::string::String,
    times: std::option::Option<u8>,
) -> std::result::Result<std::string::String, std::fmt::Error> {
    let _ = times;
    std::result::Result::Ok(text)
}

/// Count, with progress.
#[kuralle::tool]
async fn count(to: u32, ctx: &kuralle::ToolContext) -> u32 {
    let _ = ctx;
    for i in 0..to {
        kuralle::progress!(i);
    }
    to
}

/// You are a hygiene test.
#[kuralle::agent(id = "hygiene", tools = [Echo, Count], max_steps = 2)]
struct Hygienic;

mod no_prelude {
    #![no_implicit_prelude]

    /// Echo back the text.
    #[::kuralle::tool(parallel_safe)]
    pub(crate) async fn shout(
        /// The text.
        text: ::std::string::String,
        ctx: &::kuralle::ToolContext,
    ) -> ::std::result::Result<::std::string::String, ::std::fmt::Error> {
        let _ = ctx;
        ::std::result::Result::Ok(text)
    }

    /// You are loud.
    #[::kuralle::agent(id = "loud", tools = [Shout])]
    pub(crate) struct Loud;
}

#[tokio::test]
async fn hygienic_expansions_work() {
    use kuralle::{Agent, Tool};
    let out = Echo.call(serde_json::json!({"text": "hi"}), kuralle::ToolContext::detached()).await;
    assert_eq!(out, std::result::Result::Ok(serde_json::json!("hi")));
    assert_eq!(Hygienic.definition().tools.len(), 2);
    assert_eq!(no_prelude::Loud.definition().tools.len(), 1);
    let out = no_prelude::Shout.call(serde_json::json!({"text": "hi"}), kuralle::ToolContext::detached()).await;
    assert_eq!(out, std::result::Result::Ok(serde_json::json!("hi")));
    let _ = (Result, Option, Box, Ok, Some, String, Vec, Value, Send, Duration, Deserialize, Serialize, JsonSchema);
    traps::drop();
    let _ = traps::None;
}
