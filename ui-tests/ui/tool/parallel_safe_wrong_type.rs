/// Read a file.
#[kuralle::tool(parallel_safe = "yes")]
async fn read_file(path: String) -> String {
    path
}

fn main() {}
