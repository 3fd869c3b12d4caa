#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: ssdcache-writeback-order=flush with the cache
# thrown away.  crash-order.py kills nbdkit (kill -9, sometimes with
# restarts on the same cache in between) during random writes and
# flushes over a slowed backend, deletes the cache file and checks that
# the backing file alone equals the export at some client flush plus
# some of the writes made after it.  First a self-test: with the offset
# order the same run must find a backing file that matches no flush
# point.  Then a few runs with narrow epoch spans, the counters, and a
# bad value of the parameter.
# `make check-crash-order` runs 500 iterations.  Set CRASH_ORDER_SEED
# to repeat a run.

source "$(dirname "$0")/functions.sh"
set -e -x

requires "$PYTHON" -c 'import nbd'

crash="$testsrcdir/crash-order.py"
seed="${CRASH_ORDER_SEED:-$RANDOM}"

# The checker must catch an inconsistent backend.
"$PYTHON" "$crash" --order offset --iterations 24 --stop-at-first \
          --seed "$seed" \
          --filter "$SSDCACHE_FILTER" --workdir "$tmpdir/offset" \
          > "$tmpdir/offset.log" 2>&1 || {
    cat "$tmpdir/offset.log"
    fail "with the offset order every backing file matched a flush point: the checker sees nothing"
}
grep -q "matches NO flush point" "$tmpdir/offset.log" ||
    fail "crash-order.py --order offset failed for another reason"
rm -rf "$tmpdir/offset"

"$PYTHON" "$crash" --iterations "${CRASH_ORDER_ITERATIONS:-10}" \
          --seed "$seed" --filter "$SSDCACHE_FILTER" --workdir "$tmpdir/flush"
rm -rf "$tmpdir/flush"

# Again with the page table's epoch bases moving every few syncs
# (-D ssdcache.epoch_span=8, not 65532): rebases all the time, and
# bases that move past a floor the client flushes left behind.
"$PYTHON" "$crash" --iterations 4 --epoch-span 8 \
          --seed "$seed" --filter "$SSDCACHE_FILTER" --workdir "$tmpdir/span"
rm -rf "$tmpdir/span"

# The counters: the flush point the backend matches, and the lag.  40
# flushes at cache speed over a slow backend (writes take 20 ms); once
# the clients stop, the backend catches up with all of them.
truncate -s 16M "$img"
stats="$tmpdir/stats"
cat > "$tmpdir/writes.sh" <<END
nbdsh -u "\$1" -c '
import os
for i in range(40):
    h.pwrite(os.urandom(65536), (i % 8) * 65536)
    h.flush()
'
# Idle writeback catches up once the client stops: wait for the
# stats file to say so (bounded: the checks below then fail).
for i in \$(seq 600); do
    if [ "\$(awk '\$1 == "order_flush_point:" { print \$2 }' "$stats")" = 40 ] &&
       [ "\$(awk '\$1 == "order_lag_flushes:" { print \$2 }' "$stats")" = 0 ] &&
       [ "\$(awk '\$1 == "order_behind_bytes:" { print \$2 }' "$stats")" = 0 ]; then
        break
    fi
    sleep 0.1
done
cp "$stats" "$tmpdir/stats.after"
END
run_ssdcache --filter=delay file "$img" delay-write=20ms \
             ssdcache-file="$tmpdir/c" ssdcache-size=8M \
             ssdcache-mode=writeback ssdcache-writeback-order=flush \
             ssdcache-stats="$stats" ssdcache-stats-interval=1 \
             --run "bash $tmpdir/writes.sh \"\$uri\""
cat "$tmpdir/stats.after"
# (Idle writeback, after a second without requests, caught up.)
[ "$(stat_get "$tmpdir/stats.after" order_flush_point)" -eq 40 ] ||
    fail "the backend should hold all 40 flushes"
[ "$(stat_get "$tmpdir/stats.after" order_lag_flushes)" -eq 0 ] ||
    fail "the backend should lag no flush"
[ "$(stat_get "$tmpdir/stats.after" order_retained)" -eq 0 ] ||
    fail "older versions kept after everything was written back"
[ "$(stat_get "$tmpdir/stats.after" order_behind_bytes)" -eq 0 ] ||
    fail "dirty data left behind the flush point"

expect_ssdcache_failure "ssdcache-writeback-order: expected flush or offset" \
                        file "$img" ssdcache-file="$tmpdir/c2" \
                        ssdcache-writeback-order=lba
