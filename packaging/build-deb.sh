#!/bin/sh
# Builds target/debian/qswitch_*.deb: the release binaries (qswitch, qswitch-cni), then the man page and shell
# completions generated from the clap CLI (`qswitch man`, `qswitch completions SHELL`) into
# target/release/packaging/, then `cargo deb`. With --no-build, reuses an existing release build.
# Needs cargo-deb (`cargo install cargo-deb`).
set -eu
cd "$(dirname "$0")/.."
if [ "${1:-}" != "--no-build" ]; then
    cargo build --release -p qswitch --bin qswitch -p qswitch-cni --bin qswitch-cni
fi
bin=target/release/qswitch
out=target/release/packaging
mkdir -p "$out"
"$bin" man | gzip -9n > "$out/qswitch.1.gz"
"$bin" completions bash > "$out/qswitch.bash"
"$bin" completions zsh > "$out/_qswitch"
"$bin" completions fish > "$out/qswitch.fish"
cargo deb -p qswitch --no-build
