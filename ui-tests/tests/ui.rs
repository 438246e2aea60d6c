//! Compile-fail and compile-pass tests of `#[tool]` and `#[agent]`.
//!
//! The `.stderr` files belong to the workspace toolchain (rustc 1.95.0). Regenerate them with
//! `TRYBUILD=overwrite cargo test -p kuralle-ui-tests --test ui` and review the diff like code.

#[test]
fn tool() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/tool/*.rs");
}

#[test]
fn agent() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/agent/*.rs");
}

#[test]
fn pass() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
}
