#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: writeback crash test (kill -9 with writes in
# flight), 20 iterations of crash-writeback.py, some restarts with
# another cache size (resized, often killed mid-way first).  Every byte
# read back after a restart must be the data it had at the last
# completed FLUSH (or FUA write) or the data of a write issued after
# it; a clean exit with ssdcache-writeback-on-exit=true must leave the
# backing file complete.  `make check-crash` runs 1000 iterations
# (CRASH_RESIZE=0.5 adds resizes).  Then 8 with resizes that move the
# page pool, 6 with the pressure paths forced (dirty cap, backend
# errors, depth, age), and 6 with sequential streams going around the
# cache.
#
# First a short self-test: crash-writeback.py --sabotage deletes the
# cache file at each crash, so flushed data is lost, and the checker
# must report it.  Set CRASH_WB_SEED to repeat a run.

source "$(dirname "$0")/functions.sh"
set -e -x

requires "$PYTHON" -c 'import nbd'

crash="$testsrcdir/crash-writeback.py"
seed="${CRASH_WB_SEED:-$RANDOM}"

# The checker must catch lost data.
if "$PYTHON" "$crash" --iterations 2 --seed "$seed" --sabotage \
             --filter "$SSDCACHE_FILTER" --workdir "$tmpdir/sabotage" \
             > "$tmpdir/sabotage.log" 2>&1; then
    cat "$tmpdir/sabotage.log"
    fail "crash-writeback.py --sabotage passed: the checker does not see lost data"
fi
grep -q "neither the last flushed data" "$tmpdir/sabotage.log" || {
    cat "$tmpdir/sabotage.log"
    fail "crash-writeback.py --sabotage failed for another reason"
}
rm -rf "$tmpdir/sabotage"

"$PYTHON" "$crash" --iterations "${CRASH_WB_ITERATIONS:-20}" --seed "$seed" \
          --resize 0.3 \
          --filter "$SSDCACHE_FILTER" --workdir "$tmpdir/crash"

# Resizes that move the page pool: with a 64 MiB backend and 4 KiB
# pages, a cache of 72 MiB has a page table of more than 1 MiB, so that
# a resize to or from it moves every kept page to another slot.
"$PYTHON" "$crash" --iterations "${CRASH_WB_MOVE_ITERATIONS:-8}" \
          --seed "$((seed + 3))" --resize 0.8 --size $((64 * 1024 * 1024)) \
          --fix page_size=4096 \
          --filter "$SSDCACHE_FILTER" --workdir "$tmpdir/move"

# The paths of a cache under pressure, forced: writes sent through at a
# dirty cap of 10%, writeback's writes failing in error windows (per-run
# backoff), several requests in flight, the age limit.
"$PYTHON" "$crash" --iterations "${CRASH_WB_PRESSURE_ITERATIONS:-6}" \
          --seed "$((seed + 1))" --fix max_dirty=10 --fix errors=1 \
          --fix depth=8 --fix max_age=1 \
          --filter "$SSDCACHE_FILTER" --workdir "$tmpdir/pressure"

# Sequential streams going around the cache: 40% of the writes continue
# one, with a cutoff of 256 KiB and a high watermark of 10%.
"$PYTHON" "$crash" --iterations "${CRASH_WB_SEQ_ITERATIONS:-6}" \
          --seed "$((seed + 2))" --fix seq=40 --fix seq_cutoff=262144 \
          --fix high=10 --fix low=0 --fix max_dirty=0 \
          --filter "$SSDCACHE_FILTER" --workdir "$tmpdir/seq" \
          > "$tmpdir/seq.log" 2>&1 || {
    cat "$tmpdir/seq.log"
    fail "crash-writeback.py failed with sequential streams"
}
cat "$tmpdir/seq.log"
around="$(sed -n 's/.* \([0-9]*\) sequential writes around the cache.*/\1/p' \
          "$tmpdir/seq.log")"
[ -n "$around" ] && [ "$around" -gt 0 ] ||
    fail "no sequential write went around the cache"
