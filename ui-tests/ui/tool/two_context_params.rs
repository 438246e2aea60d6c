use kuralle::ToolContext;

/// Echo.
#[kuralle::tool]
async fn echo(ctx: &ToolContext, text: String, again: &ToolContext) -> String {
    let _ = (ctx, again);
    text
}

fn main() {}
