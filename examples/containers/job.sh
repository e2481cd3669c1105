#!/bin/sh
# job.sh ROUND PROCS ENTRIES - one job container's part of the example
# (examples/containers/run.sh): waits for /data/ROUND.go, then runs PROCS
# copies of the legacy batch program posting ENTRIES entries each to
# /data/ledger-ROUND, and writes when it started and ended to
# /data/ROUND.time.<host name>. Exits 1 if any copy failed.
# LD_PRELOAD and LOCKSHIM_CONFIG, when the container has them, reach every
# program here: the shim guards post_entry in batch; sh, sleep and date are
# out of the config's `programs`, so it leaves them alone without a word.
set -eu
round=$1
procs=$2
entries=$3
until [ -e "/data/$round.go" ]; do sleep 0.01; done
start=$(date +%s.%N)
pids=
n=0
while [ "$n" -lt "$procs" ]; do
	/opt/ledger/batch "/data/ledger-$round" "$entries" &
	pids="$pids $!"
	n=$((n + 1))
done
rc=0
for p in $pids; do
	wait "$p" || rc=1
done
echo "$start $(date +%s.%N)" >"/data/$round.time.$(uname -n)"
exit $rc
