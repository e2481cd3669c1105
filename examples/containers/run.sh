#!/bin/bash
# examples/containers/run.sh - the ledger demo (`make demo`) across containers:
# a legacy batch job in two containers and Redis in a third, one shared data
# volume; first without the shim (plain), then with it bind-mounted read-only
# and preloaded in the job containers (guarded). Prints both results in
# `make demo`'s form. Run from the repository root after `make`, as root.
#
# Needs podman (rootful) and runc: `apt-get install podman runc`. No image
# registry is needed: the image is imported from a minimal Debian 12 root
# (tests/integration/support/debroot.py's cached one, or debootstrap's), and
# redis-server is installed into it with apt-get. Containerfile beside this
# script builds the same image where a registry is reachable.
# runc and explicit ulimits: crun cannot set rlimits on some hosts.
#
# Every container, image, volume and network it makes is named
# "$LOCKSHIM_EXAMPLE_PREFIX-..." (default lockshim-ex-<random>) and removed
# on exit, failure and Ctrl-C. LOCKSHIM_BUILD: the build directory (build).
set -euo pipefail

containers=2
procs=3
entries=40
build=${LOCKSHIM_BUILD:-build}
prefix=${LOCKSHIM_EXAMPLE_PREFIX:-lockshim-ex-$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')}
roots=${LOCKSHIM_TEST_ROOTS:-/var/tmp/lockshim-roots}
here=examples/containers
run_opts=(--runtime runc --ulimit nofile=20000:20000 --ulimit nproc=1024:1024)
base_image=localhost/$prefix-base:latest
redis_image=localhost/$prefix-redis:latest
net=$prefix-net
vol=$prefix-data
work=

say() { echo "run.sh: $*" >&2; }
die() { say "$*"; exit 1; }

cleanup() {
	local ids=()
	mapfile -t ids < <(podman ps -a -q --filter "name=^$prefix-" 2>/dev/null || true)
	[ ${#ids[@]} -eq 0 ] || podman rm -f -t 0 "${ids[@]}" >/dev/null 2>&1 || true
	podman volume rm -f "$vol" >/dev/null 2>&1 || true
	podman network rm -f "$net" >/dev/null 2>&1 || true
	podman rmi -f "$redis_image" "$base_image" >/dev/null 2>&1 || true
	[ -z "$work" ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

[ -f "$here/run.sh" ] || die "run me from the repository root"
[ "$(id -u)" -eq 0 ] || die "run me as root (rootful podman)"
command -v podman >/dev/null || die "podman is missing: apt-get install -y podman runc"
shim=$(realpath "$build/liblockshim.so" 2>/dev/null) || die "no $build/liblockshim.so: run make first"
work=$(mktemp -d /tmp/lockshim-ex.XXXXXX)
# podman run's standard error, and that of the conmon it leaves behind (which
# says when it cannot reach syslog), go to $work/podman.log, shown on failure.
say "objects named $prefix-*"

# The legacy program, built on the host (same Debian release as the image).
mkdir "$work/ledger"
cc -O2 -shared -fPIC -o "$work/ledger/libledger.so" examples/ledger.c
cc -O2 -o "$work/ledger/batch" examples/batch.c -L"$work/ledger" -lledger -Wl,-rpath,/opt/ledger
cp "$here/job.sh" "$work/ledger/"

# The image: a minimal Debian 12 root, imported; redis-server added to a copy.
root=$roots/bookworm-minbase
if [ ! -f "$root/.complete" ]; then
	mirror=$(grep -h -m1 '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | head -1 || true)
	command -v debootstrap >/dev/null || die "no cached root in $roots and no debootstrap: apt-get install -y debootstrap"
	say "no cached root in $roots: debootstrap into $work/root (a minute)"
	root=$work/root
	debootstrap --variant=minbase bookworm "$root" "${mirror:-http://deb.debian.org/debian}" >"$work/debootstrap.log" 2>&1 ||
		die "debootstrap failed; see $work/debootstrap.log"
fi
say "making $base_image from $root"
tar -C "$root" --exclude=./.complete -c . | podman import -q - "$base_image" >/dev/null
say "making $redis_image (apt-get install redis-server)"
podman run "${run_opts[@]}" --name "$prefix-build" "$base_image" sh -c \
	'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null && apt-get clean' \
	>"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; die "apt-get in the image failed"; }
podman commit -q "$prefix-build" "$redis_image" >/dev/null
podman rm "$prefix-build" >/dev/null

podman network create "$net" >/dev/null
podman volume create "$vol" >/dev/null
data=$(podman volume inspect -f '{{.Mountpoint}}' "$vol")
podman run "${run_opts[@]}" -d --name "$prefix-redis" --network "$net" --network-alias redis \
	"$redis_image" redis-server --bind 0.0.0.0 --protected-mode no --save '' --appendonly no \
	>/dev/null 2>>"$work/podman.log" || { cat "$work/podman.log" >&2; die "the Redis container did not start"; }
i=0
until [ "$(podman exec "$prefix-redis" redis-cli ping 2>/dev/null)" = PONG ]; do
	i=$((i + 1))
	[ $i -le 100 ] || die "the Redis container did not answer"
	sleep 0.1
done
say "Redis answers in $prefix-redis"
# The jobs reach it as "redis" by an /etc/hosts entry: a user network has
# name resolution only with netavark's aardvark-dns or CNI's dnsname plugin,
# and podman may run with neither.
redis_ip=$(podman inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$prefix-redis")
[ -n "$redis_ip" ] || die "no address for $prefix-redis"

expected=$((containers * procs * entries))
round() { # $1: plain or guarded
	local r=$1 n=1 names=() c rc=0 got times
	local opts=("${run_opts[@]}" -d --network "$net" --add-host "redis:$redis_ip" -v "$vol:/data"
		-v "$work/ledger:/opt/ledger:ro")
	if [ "$r" = guarded ]; then
		opts+=(-v "$shim:/opt/lockshim/liblockshim.so:ro" -v "$PWD/$here/ledger.cfg:/opt/lockshim/ledger.cfg:ro"
			-e LD_PRELOAD=/opt/lockshim/liblockshim.so -e LOCKSHIM_CONFIG=/opt/lockshim/ledger.cfg)
	fi
	echo 0 >"$data/ledger-$r"
	while [ $n -le $containers ]; do
		names+=("$prefix-$r-$n")
		podman run "${opts[@]}" --name "$prefix-$r-$n" "$base_image" \
			/opt/ledger/job.sh "$r" $procs $entries >/dev/null 2>>"$work/podman.log" ||
			{ cat "$work/podman.log" >&2; die "$prefix-$r-$n did not start"; }
		n=$((n + 1))
	done
	touch "$data/$r.go"
	for c in "${names[@]}"; do
		if [ "$(podman wait "$c")" != 0 ]; then
			say "$c failed:"
			podman logs "$c" >&2 || true
			rc=1
		fi
	done
	[ $rc -eq 0 ] || die "the $r round failed"
	got=$(cat "$data/ledger-$r")
	times=$(cat "$data/$r".time.*)
	printf '%-8s %d containers x %d processes x %d entries: balance %d of %d expected (%d lost) in %.2f s\n' \
		"$r" $containers $procs $entries "$got" $expected $((expected - got)) \
		"$(echo "$times" | awk 'NR == 1 || $1 < s { s = $1 } NR == 1 || $2 > e { e = $2 } END { print e - s }')"
	podman rm "${names[@]}" >/dev/null
}

echo "lockshim containers example: $containers containers x $procs copies of a legacy batch job post to one ledger on a shared volume, Redis in a third container"
round plain
round guarded
echo "the guarded containers ran: podman run -v $build/liblockshim.so:/opt/lockshim/liblockshim.so:ro -v $here/ledger.cfg:/opt/lockshim/ledger.cfg:ro -e LD_PRELOAD=/opt/lockshim/liblockshim.so -e LOCKSHIM_CONFIG=/opt/lockshim/ledger.cfg ..."
