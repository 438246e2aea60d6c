//! Chat-completion chunk payloads, one per line: events or a typed error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = kuralle::models::assemble_events(text.lines());
});
