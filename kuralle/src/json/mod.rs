//! JSON as the journal keeps it: [`JsonText`] (a value held as its text), the length of a
//! value's text ([`json_len`]), and canonical JSON (RFC 8785), which journal keys hash.

pub(crate) mod canonical;
mod len;
mod text;

pub(crate) use len::json_len;
pub use text::JsonText;
