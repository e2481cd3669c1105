#!/bin/sh
# install-deps.sh - make sure the Debian packages lockshim needs are present.
#
#   install-deps.sh            as root, installs what is missing with apt-get;
#                              otherwise prints the exact command and exits 1
#   install-deps.sh --check    only says what is missing (exit 1) or nothing (exit 0)
#   install-deps.sh --print    prints the missing package names
#   --build                    only what building needs (`make`), not the tests
#   --bench                    also what `make bench` needs (redis-py, taskset)
#
# On a system without dpkg it checks nothing and exits 0: the compiler will
# say what is missing there.
set -eu

BUILD_PKGS="gcc make libc6-dev libhiredis-dev libconfig-dev libcapstone-dev libmbedtls-dev libpq-dev libzookeeper-mt-dev libcurl4-openssl-dev libjson-c-dev scdoc"
TEST_PKGS="g++ redis-server python3 python3-pytest python3-prometheus-client sqlite3 curl openssl groff-base golang-go dpkg-dev lintian podman runc iproute2 debootstrap postgresql zookeeper etcd-server etcd-client"
BENCH_PKGS="python3-redis util-linux"

mode=install
set_build=0
set_bench=0
for a in "$@"; do
	case "$a" in
	--check) mode=check ;;
	--print) mode=print ;;
	--build) set_build=1 ;;
	--bench) set_bench=1 ;;
	*) echo "usage: install-deps.sh [--check|--print] [--build|--bench]" >&2; exit 2 ;;
	esac
done
PKGS=$BUILD_PKGS
[ $set_build -eq 1 ] || PKGS="$PKGS $TEST_PKGS"
[ $set_bench -eq 0 ] || PKGS="$PKGS $BENCH_PKGS"

command -v dpkg-query >/dev/null 2>&1 || exit 0
# shellcheck disable=SC2086
missing=$(dpkg-query -W -f='${Package} ${Status}\n' $PKGS 2>/dev/null |
	awk '$NF == "installed" { ok[$1] = 1 } END { for (p in ok) print p }' |
	awk -v want="$PKGS" 'BEGIN { n = split(want, w, " ") } { have[$1] = 1 }
		END { for (i = 1; i <= n; i++) if (!(w[i] in have)) printf " %s", w[i] }')

[ -z "$missing" ] && exit 0
case $mode in
print)
	echo "$missing"
	exit 0
	;;
check)
	echo "lockshim: missing Debian packages:$missing" >&2
	echo "lockshim: install them with: apt-get install -y$missing (as root; or run 'make deps')" >&2
	exit 1
	;;
esac
if [ "$(id -u)" -ne 0 ]; then
	echo "lockshim: missing Debian packages:$missing" >&2
	echo "lockshim: install them with: sudo apt-get install -y$missing" >&2
	exit 1
fi
echo "lockshim: installing:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
