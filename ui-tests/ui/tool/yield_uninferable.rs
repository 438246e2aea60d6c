use kuralle::progress;

/// Count.
#[kuralle::tool]
async fn count(to: u32) -> u32 {
    progress!(Default::default());
    to
}

fn main() {}
