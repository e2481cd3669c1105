#!/bin/bash
# prove.sh - the package's whole life on a bare Debian 12 machine, as root,
# from the repository root: scripts/fresh-debian.sh packaging/prove.sh
#
# Builds the package (make deb), installs it with apt-get (which pulls its
# Depends), guards mv with `lockshim run` against a redis-server started
# here, finds both man pages with man -w, enables the system-wide preload
# (lockshim enable) and sees mv guarded through it while sh and ls stay
# silent, then purges the package: no preload line, no file of the package
# left, and every program still works. Prints "prove: ok" at the end; any
# step failing stops it with a line saying which.
set -euo pipefail

step() { echo "prove: $*"; }
fail() { echo "prove: FAILED: $*" >&2; exit 1; }
port=6391

step "build dependencies, redis-server, man-db"
scripts/install-deps.sh --build >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q dpkg-dev redis-server man-db >/dev/null
step "make deb"
make -s deb >/dev/null
deb=$(ls build/lockshim_*_amd64.deb)
step "apt-get install ./$deb"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "./$deb" >/dev/null
files=$(dpkg -L lockshim | while read -r f; do [ -f "$f" ] && echo "$f"; done)

redis-server --port "$port" --bind 127.0.0.1 --save '' --daemonize yes >/dev/null
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true' EXIT
cfg=/etc/lockshim/lockshim.cfg
cat > "$cfg" <<CFG
redis = { host = "127.0.0.1"; port = $port; };
log_level = "debug";
programs = ( "mv" );
locks = ( { symbols = ( "rename", "renameat", "renameat2" ); key = "prove:{symbol}"; } );
CFG
tmp=$(mktemp -d)
touch "$tmp/a" "$tmp/c"

step "lockshim run -- mv"
out=$(lockshim run -c "$cfg" -- mv "$tmp/a" "$tmp/b" 2>&1)
grep -q "acquired lockshim:prove:" <<<"$out" || fail "lockshim run did not guard mv: $out"
step "man -w"
{ man -w lockshim && man -w 5 lockshim.cfg; } >/dev/null || fail "man pages not found"
step "lockshim enable"
lockshim enable
grep -qx /usr/lib/x86_64-linux-gnu/lockshim/liblockshim.so /etc/ld.so.preload || fail "no preload line"
out=$(mv "$tmp/c" "$tmp/d" 2>&1)
grep -q "acquired lockshim:prove:" <<<"$out" || fail "mv not guarded through the preload: $out"
out=$(sh -c true 2>&1; ls / 2>&1 >/dev/null)
[ -z "$out" ] || fail "an out-of-scope program said something: $out"

step "apt-get purge lockshim"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -q lockshim >/dev/null
if [ -e /etc/ld.so.preload ] && grep -q liblockshim /etc/ld.so.preload; then
	fail "the preload line is left"
fi
for f in $files; do [ ! -e "$f" ] || fail "$f is left"; done
[ ! -e /etc/lockshim ] || fail "/etc/lockshim is left"
out=$(sh -c true 2>&1; ls / 2>&1 >/dev/null; mv "$tmp/d" "$tmp/e" 2>&1)
[ -z "$out" ] || fail "programs print after the purge: $out"
rm -rf "$tmp"
step "ok"
