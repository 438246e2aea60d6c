#[derive(serde::Deserialize)]
struct Point {
    x: i64,
}

/// Move to a point.
#[kuralle::tool]
async fn move_to(point: Point) -> i64 {
    point.x
}

fn main() {}
