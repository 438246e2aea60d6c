use kuralle::progress;

/// Count to `to`.
#[kuralle::tool(timeout = "5 seconds")]
async fn count(to: u32) -> u32 {
    for i in 0..to {
        progress!(i);
    }
    to
}

fn main() {}
