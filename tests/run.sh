#!/usr/bin/env bash
# Runs every qswitch test: style (rustfmt, clippy), unit and integration tests (cargo test,
# release build), including the privileged ones (namespaces, TAPs, iperf3) when run as root.
# Installs the Debian packages the privileged tests use when they are missing.
#
# A test that cannot run here (not root, one CPU, no QEMU, testpmd or chromium) prints
# "skipped: REASON" and passes, or fails when QSWITCH_REQUIRE_PRIVILEGED=1 (.ci/run sets
# it). The last line counts those skips, and apart from them the `#[ignore]`d measurements:
#     tests: N passed, N failed, N skipped (N measurements not run: #[ignore])
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ]; then
    need=()
    command -v iperf3 >/dev/null || need+=(iperf3)
    command -v ping >/dev/null || need+=(iputils-ping)
    command -v ip >/dev/null || need+=(iproute2)
    command -v ss >/dev/null || need+=(iproute2)
    command -v python3 >/dev/null || need+=(python3)
    command -v chromium >/dev/null || need+=(chromium)
    [ -x /usr/lib/cni/host-local ] || need+=(containernetworking-plugins)
    command -v dnsmasq >/dev/null || need+=(dnsmasq-base)
    command -v ovs-vswitchd >/dev/null || need+=(openvswitch-switch)
    [ -x /usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk ] || need+=(openvswitch-switch-dpdk)
    command -v lldpd >/dev/null || need+=(lldpd)
    command -v nfcapd >/dev/null || need+=(nfdump)
    command -v tshark >/dev/null || need+=(tshark)
    command -v nmap >/dev/null || need+=(nmap)
    python3 -c 'import prometheus_client' 2>/dev/null || need_pip=1
    if [ ${#need[@]} -gt 0 ]; then
        echo "== installing ${need[*]}"
        apt-get update -qq
        echo "wireshark-common wireshark-common/install-setuid boolean false" |
            debconf-set-selections
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
    if ! command -v cnitool >/dev/null && command -v go >/dev/null; then
        echo "== installing cnitool (go install)"
        GOBIN=/usr/local/bin go install github.com/containernetworking/cni/cnitool@v1.3.1 ||
            echo "   cnitool could not be installed: the CNI tests will skip"
    fi
    if [ "${need_pip:-0}" = 1 ]; then
        echo "== installing prometheus_client (pip)"
        python3 -m pip install -q --break-system-packages prometheus_client >/dev/null 2>&1 ||
            { apt-get install -y -qq python3-pip >/dev/null &&
              python3 -m pip install -q --break-system-packages prometheus_client >/dev/null; }
    fi
else
    echo "== not root: privileged tests (namespaces, TAPs, iperf3) will be skipped"
fi

echo "== rustfmt"
cargo fmt --all --check
echo "== clippy"
cargo clippy --workspace --all-targets --release -- -D warnings
# The packaged binary is built without the lab (packaging/build-deb.sh): it must build clean too.
cargo clippy -p qswitch --bin qswitch --release --no-default-features -- -D warnings
echo "== the packaged binaries (profile dist, qswitch without the lab; tests/package.rs packages them)"
cargo build --profile dist --no-default-features -p qswitch --bin qswitch -p qswitch-cni --bin qswitch-cni
echo "== tests"
log=$(mktemp)
skips=$(mktemp)
trap 'rm -f "$log" "$skips"' EXIT
export QSWITCH_SKIP_LOG=$skips
status=0
cargo test --workspace --release -- --test-threads=2 2>&1 | tee "$log" || status=$?
echo "== fuzz (brief)"
./fuzz/run.sh "${QSWITCH_FUZZ_SECONDS:-15}" || status=$?
if [ -s "$skips" ]; then
    echo "== skipped (cannot run here)"
    sed 's/^/   /' "$skips"
fi
# A skipped test passed as far as libtest knows: count it as skipped, not passed. The
# `#[ignore]`d functions are measurements run by hand (each says how in its comment), not
# checks: they are counted apart.
awk -v real="$(grep -c '' "$skips")" -v fuzz="$(grep -c '^fuzz:' "$skips")" \
    '/^test result:/ { p += $4; f += $6; i += $8 }
     END { printf "tests: %d passed, %d failed, %d skipped (%d measurements not run: #[ignore])\n", p - (real - fuzz), f, real, i }' "$log"
exit "$status"
