#!/bin/bash
# (A copy of ../shared/fresh-debian.sh, which .ci/run prefers when it is there: a clean
# clone of this repository alone must still be able to prove the bare-machine set-up.)
# fresh-debian.sh [--keep] [COMMAND...]
#
# Proves the README's set-up on a machine that has nothing: runs COMMAND (default: "make test")
# as root in a clean clone of the current repository (committed state of HEAD, plus ../shared
# beside it), inside a minimal Debian 12 root file system made with debootstrap that has only
# make and git besides the base system. The packages a fresh machine lacks (compilers,
# libraries, redis-server, pytest) are missing there too, so a Makefile that only works on the
# second try, or a missing install step, fails here.
#
#   ../shared/fresh-debian.sh                  # make test, from nothing
#   ../shared/fresh-debian.sh 'make demo'      # any command line, run by bash in the clone
#   ../shared/fresh-debian.sh --keep 'make'    # keep the root file system for a look afterwards
#
# Needs root and debootstrap (apt-get install debootstrap). The bare root file system is made
# once (about 30 s, 220 MB) and cached in $FRESH_DEBIAN_CACHE (default /var/tmp/fresh-debian);
# every run works on a fresh copy of it, which is removed afterwards unless --keep.
# The Debian mirror is the one this machine's apt already uses. Exit status: COMMAND's own.
set -euo pipefail

keep=0
if [ "${1:-}" = "--keep" ]; then keep=1; shift; fi
cmd="${*:-make test}"

[ "$(id -u)" -eq 0 ] || { echo "fresh-debian: must run as root" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "fresh-debian: apt-get install -y debootstrap" >&2; exit 2; }
repo=$(git rev-parse --show-toplevel 2>/dev/null) || { echo "fresh-debian: run inside a git checkout" >&2; exit 2; }
name=$(basename "$repo")

mirror=$(grep -h -m1 -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | head -1 || true)
[ -n "$mirror" ] || mirror=$(grep -h -m1 -E '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | head -1 || true)
[ -n "$mirror" ] || { echo "fresh-debian: no Debian mirror found in this machine's apt sources" >&2; exit 2; }

cache=${FRESH_DEBIAN_CACHE:-/var/tmp/fresh-debian}
base="$cache/bookworm-minbase-make-git"
mkdir -p "$cache"
if [ ! -f "$base/.complete" ]; then
    echo "fresh-debian: making the bare Debian 12 root file system (once) ..." >&2
    rm -rf "$base"
    debootstrap --variant=minbase --include=make,git,ca-certificates bookworm "$base" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
        { echo "fresh-debian: debootstrap failed, see $cache/debootstrap.log" >&2; exit 2; }
    touch "$base/.complete"
fi

work=$(mktemp -d "$cache/run.XXXXXX")
root="$work/root"
cleanup() {
    for m in dev/pts dev proc sys; do
        mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m" 2>/dev/null || true
    done
    if [ "$keep" -eq 1 ]; then
        echo "fresh-debian: kept $root (chroot $root; rm -rf $work when done)" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT

cp -a "$base" "$root"
rm -f "$root/.complete"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
mkdir -p "$root/src"
git clone -q "$repo" "$root/src/$name"
if [ -d "$repo/../shared" ]; then cp -a "$repo/../shared" "$root/src/shared"; fi
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys" 2>/dev/null || true
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts" 2>/dev/null || true

echo "fresh-debian: running '$cmd' in a clean clone on bare Debian 12" >&2
set +e
chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 /bin/bash -c "cd /src/$name && $cmd"
rc=$?
set -e
echo "fresh-debian: '$cmd' exited $rc" >&2
exit $rc
