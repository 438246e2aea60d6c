struct Report {
    lines: Vec<String>,
}

/// Build a report.
#[kuralle::tool]
async fn build_report(title: String) -> Report {
    Report { lines: vec![title] }
}

fn main() {}
