#!/bin/sh
# install-deps.sh - make sure the Debian packages lockshim needs are present.
#
# As root, installs what is missing with apt-get. Otherwise prints the exact
# command to run and exits 1. With --print, only lists what is missing.
# With --bench, also what `make bench` needs (redis-py, the peer it measures).
set -eu

PKGS="gcc g++ make libc6-dev libhiredis-dev libconfig-dev redis-server python3 python3-pytest"
if [ "${1:-}" = "--bench" ]; then
	PKGS="$PKGS python3-redis util-linux"
	shift
fi

missing=""
for p in $PKGS; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing="$missing $p"
	fi
done

if [ -z "$missing" ]; then
	exit 0
fi
if [ "${1:-}" = "--print" ]; then
	echo "$missing"
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "lockshim: missing Debian packages:$missing" >&2
	echo "install them with: sudo apt-get install -y$missing" >&2
	exit 1
fi
echo "lockshim: installing:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
