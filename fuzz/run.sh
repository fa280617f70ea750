#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 20) with cargo-fuzz on the nightly
# toolchain, installing cargo-fuzz when missing. Without a nightly toolchain it skips with a
# visible message; when QSWITCH_REQUIRE_PRIVILEGED is set (CI) it tries to install nightly
# and fails if it cannot: a CI machine that lost its fuzzer must not stay green.
#
# fuzz/Cargo.lock is not tracked: it is the workspace's Cargo.lock, copied here before each
# run, so the fuzz targets build against the same dependency versions as everything else and
# a test run leaves the tree unchanged (cargo adds libfuzzer-sys and drops what fuzz does
# not use, in the untracked copy).
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-20}
required() { [ -n "${QSWITCH_REQUIRE_PRIVILEGED:-}" ] && [ "${QSWITCH_REQUIRE_PRIVILEGED}" != 0 ]; }
skip() {
    if required; then
        echo "== fuzz: FAILED: $1 (QSWITCH_REQUIRE_PRIVILEGED is set)" >&2
        exit 1
    fi
    echo "== fuzz: skipped ($1)"
    [ -n "${QSWITCH_SKIP_LOG:-}" ] && echo "fuzz: $1" >>"$QSWITCH_SKIP_LOG"
    exit 0
}
if ! rustup run nightly rustc --version >/dev/null 2>&1 && required; then
    echo "== fuzz: installing the nightly toolchain"
    rustup toolchain install nightly --profile minimal >/dev/null 2>&1 || true
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    skip "no nightly toolchain; cargo-fuzz needs one (rustup toolchain install nightly)"
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "== fuzz: installing cargo-fuzz"
    cargo install -q cargo-fuzz || skip "cargo install cargo-fuzz failed"
fi
cp ../Cargo.lock Cargo.lock
# libFuzzer ends a run with exit(), which runs no Rust destructor: the vhost_messages
# target's socket directory (qswitch-fuzz-vhost-PID) outlives its process, so it is removed
# here once that process is gone.
tidy() {
    local d
    for d in "${TMPDIR:-/tmp}"/qswitch-fuzz-vhost-*; do
        [ -d "$d" ] || continue
        kill -0 "${d##*-}" 2>/dev/null || rm -rf -- "$d"
    done
}
trap tidy EXIT
for t in frame desc_chain config control_json vxlan guard gso gro vhost_messages lacp lldp ct erspan; do
    echo "== fuzz $t (${secs}s)"
    cargo +nightly fuzz run "$t" -- -max_total_time="$secs" -rss_limit_mb=2048 2>&1 | tail -3
done
