#!/usr/bin/env bash
# Measures what `#[tool]` costs at compile time: generates two throwaway crates under
# ${OUT:-/tmp/kuralle-macro-build-time}, one with 100 `#[tool]` fns and one with the same 100
# fns without the attribute, builds the dependencies once, then times clean debug builds of
# each crate alone (`cargo clean -p` + `cargo build`), so only the crate itself is measured.
#
# The two crates are built alternately for ${ROUNDS:-4} rounds, so load from other work on the
# machine falls on both alike. CPU time (user + sys of cargo and the rustc it waits for) is
# what the ratio is judged on; wall time is printed next to it. The last line is the ratio of
# the summed CPU times (goal: under 8x).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/kuralle-macro-build-time}"
N="${N:-100}"
ROUNDS="${ROUNDS:-4}"
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

# Prints "<cpu seconds> <wall seconds>" for one clean build of crate $1.
clean_build() {
  cargo clean -q -p "$1"
  local TIMEFORMAT='%U %S %R' t
  t=$( { time cargo build -q -p "$1" >/dev/null 2>&1; } 2>&1 )
  read -r user sys wall <<<"$t"
  echo "$(echo "$user + $sys" | bc) $wall"
}

cpu_with=0 cpu_without=0
for round in $(seq 1 "$ROUNDS"); do
  read -r c0 w0 <<<"$(clean_build without_tool)"
  read -r c1 w1 <<<"$(clean_build with_tool)"
  cpu_without=$(echo "$cpu_without + $c0" | bc)
  cpu_with=$(echo "$cpu_with + $c1" | bc)
  printf 'round %d: without_tool %.2f s CPU (%.2f s wall), with_tool %.2f s CPU (%.2f s wall): %.1fx\n' \
    "$round" "$c0" "$w0" "$c1" "$w1" "$(echo "$c1 / $c0" | bc -l)"
done
printf '%d #[tool] fns vs %d plain fns, clean debug build of the crate alone, %d alternating rounds: %.2f s / %.2f s CPU = %.1fx\n' \
  "$N" "$N" "$ROUNDS" "$(echo "$cpu_with / $ROUNDS" | bc -l)" "$(echo "$cpu_without / $ROUNDS" | bc -l)" \
  "$(echo "$cpu_with / $cpu_without" | bc -l)"
