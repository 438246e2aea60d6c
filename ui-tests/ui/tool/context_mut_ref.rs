use kuralle::ToolContext;

/// Echo.
#[kuralle::tool]
async fn echo(ctx: &mut ToolContext, text: String) -> String {
    let _ = ctx;
    text
}

fn main() {}
