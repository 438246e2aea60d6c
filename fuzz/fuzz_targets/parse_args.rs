//! Raw tool-call argument text, as a model sends it: a value or a clear error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match kuralle::parse_args("t", &text) {
        Ok(value) => assert!(value.is_object()),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
