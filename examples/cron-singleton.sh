#!/bin/sh
# A cron job that must never run twice at once, however slow a run is:
#   */5 * * * *  /usr/share/doc/leasefs/examples/cron-singleton.sh /run/leases
# flock -n gives up at once while the previous run still holds the lease,
# and the lease's epoch numbers the runs (it only ever goes up, across
# daemon restarts too), so each run can stamp what it writes.
set -eu
leases=${1:-/run/leases}
lock=$leases/cron-singleton.lock
exec 9>>"$lock"
if ! flock -n 9; then
    echo "previous run still going; skipping"
    exit 0
fi
run=$(getfattr --absolute-names --only-values -n user.leasefs.epoch "$lock")
echo "run $run starting"
${JOB:-true}
echo "run $run done"
