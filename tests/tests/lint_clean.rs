//! The expansions add no warnings to a strict crate: `deny(warnings, missing_docs)` here, and
//! `clippy::pedantic` under `cargo clippy --workspace --all-targets -- -D warnings`.
#![deny(warnings, missing_docs, unreachable_pub)]
#![deny(clippy::pedantic)]

/// Public tools of this crate.
pub mod tools {
    use kuralle::{ToolContext, progress};

    /// Why a lookup failed.
    #[derive(Debug)]
    pub struct LookupError;

    impl std::fmt::Display for LookupError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("not found")
        }
    }

    /// Recover from a failed lookup.
    ///
    /// # Errors
    /// Never.
    pub fn recover(_: LookupError, input: &LookupOrderInput) -> Result<String, LookupError> {
        Ok(format!("order {} is unknown", input.order_id))
    }

    /// Look an order up.
    ///
    /// # Errors
    /// When the order does not exist.
    #[kuralle::tool(parallel_safe, timeout = "5s", on_error = recover)]
    pub async fn lookup_order(
        /// The order id.
        order_id: String,
        ctx: &ToolContext,
        verbose: Option<bool>,
    ) -> Result<String, LookupError> {
        let _ = (ctx, verbose);
        if order_id.is_empty() { Err(LookupError) } else { Ok(order_id) }
    }

    /// Count to `to`.
    #[kuralle::tool(idempotency_key = |input: &CountInput| input.to.to_string())]
    pub async fn count(to: u32) -> u32 {
        for i in 0..to {
            progress!(i);
        }
        to
    }

    /// Say hello.
    #[kuralle::tool]
    async fn hello(name: String) -> String {
        format!("hello {name}")
    }

    /// A support agent.
    ///
    /// Be kind.
    #[kuralle::agent(id = "support", tools = [LookupOrder, Count, Hello], max_steps = 3)]
    pub struct Support;
}

#[test]
fn strict_crate_compiles() {
    use kuralle::Agent;
    assert_eq!(tools::Support.definition().tools.len(), 3);
}
