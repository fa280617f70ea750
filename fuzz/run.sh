#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 20) with cargo-fuzz on the nightly
# toolchain. Skips, with a visible message, when no nightly toolchain is installed.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-20}
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "== fuzz: skipped (no nightly toolchain; cargo-fuzz needs one)"
    exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "== fuzz: installing cargo-fuzz"
    cargo install -q cargo-fuzz
fi
for t in frame desc_chain config control_json; do
    echo "== fuzz $t (${secs}s)"
    cargo +nightly fuzz run "$t" -- -max_total_time="$secs" -rss_limit_mb=2048 2>&1 | tail -3
done
