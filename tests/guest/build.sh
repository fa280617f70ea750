#!/usr/bin/env bash
# Builds the qswitch test guest from Debian packages only:
#   OUTDIR/vmlinux             uncompressed kernel (PVH entry) from linux-image-6.1.0-*-amd64
#   OUTDIR/initramfs.cpio.gz   busybox-static, iperf3, ethtool (+ their libraries), the virtio
#                              net modules and tests/guest/init as /init
#   OUTDIR/manifest.txt        package names and versions used
# and installs what running it needs (qemu-system-x86, ...). Usage: build.sh [OUTDIR]
# (default $QS_GUEST_DIR or /var/cache/qswitch-guest). Does nothing when the outputs exist
# and are newer than this script and tests/guest/init. Concurrent runs serialise on
# OUTDIR/.lock. Exit status 77: a needed Debian package could not be installed or
# downloaded (the caller may skip); any other non-zero status is a real failure.
# QS_GUEST_KERNEL_PKG=<package> pins the kernel package (default: what linux-image-amd64
# depends on, its -unsigned variant when apt offers one).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${1:-${QS_GUEST_DIR:-/var/cache/qswitch-guest}}
INIT=$HERE/init
SELF=$HERE/build.sh
export DEBIAN_FRONTEND=noninteractive LC_ALL=C

T0=$(date +%s%N)
say() { printf '[guest build %5.1fs] %s\n' "$((($(date +%s%N) - T0) / 1000000))e-3" "$*"; }
die() {
    say "error: $*" >&2
    exit "${2:-1}"
}

# fresh "OUTPUTS" "INPUTS": true when every output exists and is newer than every input.
fresh() {
    local o i
    for o in $1; do
        [ -s "$o" ] || return 1
        for i in $2; do
            [ "$o" -nt "$i" ] || return 1
        done
    done
}

# --- 1. Debian packages for the build and for running guests --------------------------------
pkg_installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
APT_UPDATED=
apt_update() {
    [ -n "$APT_UPDATED" ] && return 0
    say "apt-get update"
    apt-get update -qq -o DPkg::Lock::Timeout=300 || die "apt-get update failed" 77
    APT_UPDATED=1
}
need=()
for p in qemu-system-x86 busybox-static iperf3 ethtool xz-utils zstd gzip; do
    pkg_installed "$p" || need+=("$p")
done
command -v flock >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "not root: cannot install ${need[*]}" 77
    say "installing ${need[*]}"
    if ! apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 "${need[@]}" >/dev/null; then
        apt_update
        apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 "${need[@]}" >/dev/null ||
            die "apt-get install ${need[*]} failed" 77
    fi
    say "installed ${need[*]}"
fi

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock -w 1200 9 || die "timed out waiting for $OUT/.lock"

VMLINUX=$OUT/vmlinux
INITRD=$OUT/initramfs.cpio.gz
KDIR=$OUT/kernel # modules/, kernel.txt
if fresh "$VMLINUX $KDIR/kernel.txt" "$SELF" && fresh "$INITRD" "$SELF $INIT $VMLINUX"; then
    say "up to date: $VMLINUX $INITRD"
    exit 0
fi

WORK=$(mktemp -d "$OUT/.work.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# --- 2. kernel: vmlinux and the virtio net modules --------------------------------------------
# The modules virtio_net needs, in load order (those built into the kernel are skipped).
MODULES="virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio virtio_pci failover net_failover virtio_net"

pick_kernel() {
    if [ -n "${QS_GUEST_KERNEL_PKG:-}" ]; then
        echo "$QS_GUEST_KERNEL_PKG"
        return
    fi
    local dep
    dep=$(apt-cache depends linux-image-amd64 2>/dev/null |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-6\.1\.0-[0-9]+-amd64$/ { print $2; exit }')
    if [ -z "$dep" ]; then # fall back to the highest ABI apt knows
        dep=$(apt-cache pkgnames linux-image-6.1.0- 2>/dev/null |
            grep -E '^linux-image-6\.1\.0-[0-9]+-amd64$' | sort -V | tail -n1)
    fi
    [ -n "$dep" ] || return 1
    if apt-cache show "$dep-unsigned" >/dev/null 2>&1; then echo "$dep-unsigned"; else echo "$dep"; fi
}

# extract_vmlinux VMLINUZ OUT: the logic of the kernel's scripts/extract-vmlinux: find each
# compression magic, decompress from there, keep the first result that is an ELF file.
extract_vmlinux() {
    local img=$1 out=$2 spec magic cmd off
    for spec in \
        '\xfd\x37\x7a\x58\x5a\x00|xz -dc --single-stream' \
        '\x28\xb5\x2f\xfd|zstd -dcq' \
        '\x1f\x8b\x08|gzip -dc' \
        '\x02\x21\x4c\x18|lz4 -dc' \
        '\x42\x5a\x68|bzip2 -dc' \
        '\x5d\x00\x00\x00|xz -dc --format=lzma'; do
        magic=${spec%%|*}
        cmd=${spec#*|}
        command -v "${cmd%% *}" >/dev/null || continue
        for off in $(grep -obUaP "$magic" "$img" 2>/dev/null | cut -d: -f1 | head -n 20); do
            tail -c +"$((off + 1))" "$img" | $cmd >"$out" 2>/dev/null || true
            if [ "$(head -c 4 "$out" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; then
                say "vmlinux: ${cmd%% *} stream at offset $off"
                return 0
            fi
        done
    done
    return 1
}

if fresh "$VMLINUX $KDIR/kernel.txt $KDIR/modules/order" "$SELF"; then
    say "kernel up to date: $(cat "$KDIR/kernel.txt")"
else
    KPKG=$(pick_kernel) || {
        apt_update
        KPKG=$(pick_kernel)
    } || die "no linux-image-6.1.0-*-amd64 package known to apt" 77
    chown _apt "$WORK" 2>/dev/null || true # apt-get download runs as _apt
    say "downloading $KPKG"
    if ! (cd "$WORK" && apt-get download -qq "$KPKG" 2>/dev/null); then
        apt_update
        KPKG=$(pick_kernel) || die "no linux-image-6.1.0-*-amd64 package known to apt" 77
        (cd "$WORK" && apt-get download -qq "$KPKG") || die "apt-get download $KPKG failed" 77
    fi
    DEB=$(ls "$WORK"/*.deb)
    KVER=$(dpkg-deb -f "$DEB" Version)
    say "downloaded $(basename "$DEB") ($(du -h --apparent-size "$DEB" | cut -f1))"
    mkdir -p "$WORK/x"
    # Like dpkg -x, but only the members needed (much faster than unpacking 400 MB).
    dpkg-deb --fsys-tarfile "$DEB" | tar -x -C "$WORK/x" --wildcards \
        './boot/vmlinuz-*' './lib/modules/*/modules.builtin' \
        './lib/modules/*/kernel/drivers/virtio/*' './lib/modules/*/kernel/drivers/net/*.ko*' \
        './lib/modules/*/kernel/net/core/*.ko*'
    rm -f "$DEB"
    VMLINUZ=$(ls "$WORK"/x/boot/vmlinuz-*)
    KREL=${VMLINUZ##*/vmlinuz-}
    say "unpacked kernel $KREL"
    extract_vmlinux "$VMLINUZ" "$WORK/vmlinux" || die "could not extract vmlinux from $VMLINUZ"
    MDIR=$WORK/x/lib/modules/$KREL
    rm -rf "$WORK/kernel"
    mkdir -p "$WORK/kernel/modules"
    order=()
    for m in $MODULES; do
        f=$(find "$MDIR/kernel" -name "$m.ko*" | head -n1)
        if [ -z "$f" ]; then
            grep -q "/$m\.ko\$" "$MDIR/modules.builtin" || die "module $m not in $KPKG"
            continue # built in
        fi
        case "$f" in
        *.ko) cp "$f" "$WORK/kernel/modules/$m.ko" ;;
        *.ko.xz) xz -dc "$f" >"$WORK/kernel/modules/$m.ko" ;;
        *.ko.zst) zstd -dcq "$f" >"$WORK/kernel/modules/$m.ko" ;;
        *.ko.gz) gzip -dc "$f" >"$WORK/kernel/modules/$m.ko" ;;
        *) die "unknown module file $f" ;;
        esac
        order+=("$m")
    done
    printf '%s\n' "${order[@]}" >"$WORK/kernel/modules/order"
    echo "$KPKG $KVER $KREL" >"$WORK/kernel/kernel.txt"
    rm -rf "$KDIR"
    mv "$WORK/kernel" "$KDIR"
    mv "$WORK/vmlinux" "$VMLINUX"
    say "kernel: $KPKG $KVER, vmlinux $(du -h --apparent-size "$VMLINUX" | cut -f1), modules: ${order[*]}"
fi

# --- 3. initramfs -------------------------------------------------------------------------------
R=$WORK/root
mkdir -p "$R"/{bin,dev,proc,sys,tmp,run,etc,lib/modules}
cp "$INIT" "$R/init"
chmod 755 "$R/init"
cp /bin/busybox "$R/bin/busybox"
for a in $(/bin/busybox --list); do
    [ -e "$R/bin/$a" ] || ln -s busybox "$R/bin/$a"
done
# iperf3 and ethtool with the shared libraries ldd resolves, at the same paths.
for b in "$(command -v iperf3)" "$(command -v ethtool)"; do
    rm -f "$R/bin/$(basename "$b")" # busybox may have an applet of that name
    cp -L "$b" "$R/bin/"
    for lib in $(ldd "$b" | grep -oE '/[^ ]+'); do
        mkdir -p "$R$(dirname "$lib")"
        cp -L "$lib" "$R$lib"
    done
done
cp "$KDIR"/modules/* "$R/lib/modules/"
mknod -m 600 "$R/dev/console" c 5 1 || true # needs root; devtmpfs has them later anyway
mknod -m 666 "$R/dev/null" c 1 3 || true
echo 'root:x:0:0:root:/tmp:/bin/sh' >"$R/etc/passwd"
echo 'root:x:0:' >"$R/etc/group"
(cd "$R" && find . | sort | /bin/busybox cpio -o -H newc 2>/dev/null) | gzip -6 -n >"$WORK/initramfs.cpio.gz"
mv "$WORK/initramfs.cpio.gz" "$INITRD"
touch "$INITRD" # newer than vmlinux

ver() { dpkg-query -W -f='${Package} ${Version}\n' "$1"; }
{
    echo "kernel: $(cat "$KDIR/kernel.txt")"
    for p in busybox-static iperf3 ethtool qemu-system-x86; do ver "$p"; done
    for lib in $( (ldd "$(command -v iperf3)" && ldd "$(command -v ethtool)") | grep -oE '/[^ ]+' | sort -u); do
        owner=$( (dpkg -S "$lib" || dpkg -S "$(readlink -f "$lib")") 2>/dev/null | head -n1 | cut -d: -f1)
        echo "lib: $lib ($(ver "${owner:-?}" 2>/dev/null || echo "${owner:-?}"))"
    done
    echo "vmlinux: $(stat -c %s "$VMLINUX") bytes"
    echo "initramfs.cpio.gz: $(stat -c %s "$INITRD") bytes"
} >"$OUT/manifest.txt"
say "initramfs $(du -h --apparent-size "$INITRD" | cut -f1) ($(du -sh "$R" | cut -f1) unpacked)"
say "done: $VMLINUX $INITRD"
