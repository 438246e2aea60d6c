//! Compile-fail and compile-pass tests of `#[tool]` and `#[agent]`.
//!
//! The `.stderr` files belong to the toolchain they were written on, rustc 1.95: rustc's
//! wording changes between releases, so on any other compiler these tests are ignored (the
//! MSRV build is checked by clippy's `incompatible_msrv` lint against `rust-version`).
//! Regenerate them with `TRYBUILD=overwrite cargo test -p kuralle-ui-tests --test ui` and
//! review the diff like code: one mistake per file, one error per mistake, on its token.

#[rustversion::attr(not(stable(1.95)), ignore = "the .stderr files are rustc 1.95's wording")]
#[test]
fn tool() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/tool/*.rs");
}

#[rustversion::attr(not(stable(1.95)), ignore = "the .stderr files are rustc 1.95's wording")]
#[test]
fn agent() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/agent/*.rs");
}

#[rustversion::attr(not(stable(1.95)), ignore = "the .stderr files are rustc 1.95's wording")]
#[test]
fn pass() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
}
