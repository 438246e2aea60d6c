/// A struct is not a tool; the misspelt argument is reported too.
#[kuralle::tool(descripton = "Echo.")]
struct Echo;

fn main() {}
