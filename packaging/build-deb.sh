#!/bin/sh
# Builds target/debian/qswitch_*.deb: the packaged binaries (qswitch, and the CNI plugin
# qswitch-cni), then the man page and shell completions generated from qswitch's clap CLI
# (`qswitch man`, `qswitch completions SHELL`) into target/dist/packaging/, then `cargo deb`.
#
# The packaged binaries are not the source tree's: they are built with the `dist` profile (the
# release build without debug info), and qswitch without the `lab` feature, so a hypervisor
# host gets no `bench`, `demo` or load generator, no apt-get and no DPDK C source
# (docs/architecture.md, "What the package ships"). With --no-build, reuses existing
# target/dist binaries. Needs cargo-deb (`cargo install cargo-deb`).
set -eu
cd "$(dirname "$0")/.."
if [ "${1:-}" != "--no-build" ]; then
    cargo build --profile dist --no-default-features -p qswitch --bin qswitch \
        -p qswitch-cni --bin qswitch-cni
fi
target=${CARGO_TARGET_DIR:-target}
bin=$target/dist/qswitch
out=$target/dist/packaging
mkdir -p "$out"
"$bin" man | gzip -9n > "$out/qswitch.1.gz"
"$bin" completions bash > "$out/qswitch.bash"
"$bin" completions zsh > "$out/_qswitch"
"$bin" completions fish > "$out/qswitch.fish"
cargo deb -p qswitch --no-build --profile dist --no-strip
