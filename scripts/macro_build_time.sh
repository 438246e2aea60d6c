#!/usr/bin/env bash
# Measures what `#[tool]` costs at compile time: generates two throwaway crates under
# ${OUT:-/tmp/kuralle-macro-build-time}, one with 100 `#[tool]` fns and one with the same 100
# fns without the attribute, builds the dependencies once, then times a clean build of each
# crate alone (`cargo clean -p` + `cargo build`), so only the crate itself is measured.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/kuralle-macro-build-time}"
N="${N:-100}"
rm -rf "$OUT" && mkdir -p "$OUT"

cat > "$OUT/Cargo.toml" <<TOML
[workspace]
resolver = "3"
members = ["with_tool", "without_tool"]
[workspace.dependencies]
kuralle = { path = "$ROOT/kuralle", default-features = false }
serde = { version = "1", features = ["derive"] }
schemars = "1.2"
TOML

for crate in with_tool without_tool; do
  mkdir -p "$OUT/$crate/src"
  cat > "$OUT/$crate/Cargo.toml" <<TOML
[package]
name = "$crate"
version = "0.0.0"
edition = "2024"
publish = false
[dependencies]
kuralle.workspace = true
serde.workspace = true
schemars.workspace = true
TOML
  {
    echo "//! $N tools."
    echo "#![allow(dead_code, unused)]"
    for i in $(seq 1 "$N"); do
      echo "/// Tool number $i: combine the inputs."
      [ "$crate" = with_tool ] && echo "#[kuralle::tool(parallel_safe)]"
      echo "pub async fn tool_$i("
      echo "    /// The first value."
      echo "    a: i64,"
      echo "    b: Option<String>, c: Vec<u32>) -> Result<String, std::fmt::Error> {"
      echo "    Ok(format!(\"{a} {b:?} {c:?}\"))"
      echo "}"
    done
  } > "$OUT/$crate/src/lib.rs"
done
# Doc comments on params are only legal through #[tool]; strip them from the plain crate.
sed -i '/    \/\/\/ The first value./d' "$OUT/without_tool/src/lib.rs"

cd "$OUT"
cargo build -q -p with_tool 2>/dev/null || cargo build -p with_tool
cargo build -q -p without_tool
for crate in without_tool with_tool; do
  cargo clean -q -p "$crate"
  start=$(date +%s.%N)
  cargo build -q -p "$crate"
  end=$(date +%s.%N)
  printf '%s: %.2f s (debug, clean build of the crate alone)\n' "$crate" "$(echo "$end - $start" | bc)"
done
