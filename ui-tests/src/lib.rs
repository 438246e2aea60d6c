//! Compile-fail and compile-pass tests of the kuralle macros (see `tests/ui.rs`).
