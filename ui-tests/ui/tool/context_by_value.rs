use kuralle::ToolContext;

/// Echo.
#[kuralle::tool]
async fn echo(ctx: ToolContext, text: String) -> String {
    let _ = ctx;
    text
}

fn main() {}
