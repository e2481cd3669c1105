#!/bin/sh
# demo.sh [BUILD] - runs the example batch program in parallel without and
# with lockshim against a private redis-server, and shows the ledgers.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
procs=6
entries=40
work=$(mktemp -d /tmp/lockshim-demo.XXXXXX)
redis_pid=

cleanup() {
	[ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT INT TERM

cc -O2 -shared -fPIC -o "$work/libledger.so" "$here/ledger.c"
cc -O2 -o "$work/batch" "$here/batch.c" -L"$work" -lledger -Wl,-rpath,"$work"

redis-server --port 0 --unixsocket "$work/redis.sock" --unixsocketperm 700 \
	--save '' --appendonly no --logfile "$work/redis.log" >/dev/null &
redis_pid=$!
i=0
until [ -S "$work/redis.sock" ]; do
	i=$((i + 1))
	[ $i -gt 500 ] && { echo "redis-server did not start" >&2; exit 1; }
	sleep 0.01
done
sed "s|^redis = .*|redis = { socket = \"$work/redis.sock\"; };|" "$here/ledger.cfg" >"$work/ledger.cfg"

expected=$((procs * entries))
run_batch() { # $1: "plain" or "guarded"
	echo 0 >"$work/ledger-$1"
	start=$(date +%s.%N)
	n=0
	pids=
	while [ $n -lt $procs ]; do
		if [ "$1" = plain ]; then
			"$work/batch" "$work/ledger-$1" $entries &
		else
			"$build/lockshim" run -c "$work/ledger.cfg" -- "$work/batch" "$work/ledger-$1" $entries &
		fi
		pids="$pids $!"
		n=$((n + 1))
	done
	for p in $pids; do
		wait "$p"
	done
	end=$(date +%s.%N)
	got=$(cat "$work/ledger-$1")
	printf '%-8s %d processes x %d entries: balance %d of %d expected (%d lost) in %.2f s\n' \
		"$1" $procs $entries "$got" $expected $((expected - got)) \
		"$(awk "BEGIN { print $end - $start }")"
}

echo "lockshim demo: $procs copies of a legacy batch job post to one ledger file"
run_batch plain
run_batch guarded
echo "the guarded run used: $build/lockshim run -c ledger.cfg -- ./batch LEDGER $entries"
