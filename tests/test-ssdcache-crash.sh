#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: warm restart after kill -9.  A server reads
# the whole disk, then takes random writes (writethrough: they are in
# the backing file when they complete), then is killed with SIGKILL.
# The restarted server must load the cache warm (almost nothing read
# from the backend, counted by nbdkit's stats filter below ssdcache),
# and every byte it serves must be the backing file's: no stale page
# may survive the crash.

source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd nbdcopy nbdsh
requires_filter stats

size=$((8 * 1024 * 1024))
random_file "$img" $size
cp "$img" "$tmpdir/before.img"
seed="${RANDOM_IO_SEED:-$RANDOM}"

args=( --filter=stats file "$img"
       statsfile="$bstats" ssdcache-file="$cache" ssdcache-size=8M
       ssdcache-stats="$stats" )

# Run 1: read everything, write some, crash.
start_ssdcache -P "$pid" -U "$sock" "${args[@]}"
expect_export "$sock" "$img" "run 1 read data that is not the file's"
"$PYTHON" "$random_io" --socket "$sock" --connections 2 --ops 400 \
          --seed "$seed" --mix read=50,write=40,zero=5,trim=5 \
          --trim-reads-zero --model "$tmpdir/before.img" \
          --save-model "$tmpdir/expected.img" --flush-at-end
# (The final flush matters: writes to cached pages change them in a way
# a crash undoes until a flush seals them; run 2b crashes without one.)
crash_nbdkit "$pid"
cmp "$img" "$tmpdir/expected.img" ||
    fail "the backing file does not hold the completed writes"

# Run 2: restart after the crash, read everything.
start_ssdcache -P "$pid" -U "$sock" "${args[@]}"
expect_export "$sock" "$img" \
    "after kill -9 the restarted server served data that is not the file's"
stop_nbdkit "$pid"
cat "$bstats" "$stats"
expect_stat "$stats" loaded_slots -ge $((size / 65536 / 2)) \
    "after kill -9 the cache is not warm"
# Pages touched by partial writes, zeroes and trims may be gone; the
# rest must come from the cache.
expect_stat "$bstats" backend_read_bytes -le $((size / 2)) \
    "run 2 read too much of the $size bytes from the backend: the cache is not warm"

# Run 2b: cache everything, change cached pages (writes, zeroes,
# trims) without reading them again, kill -9, restart: the changed
# pages must not come back from the cache file.
start_ssdcache -P "$pid" -U "$sock" "${args[@]}"
expect_export "$sock" "$img" "run 2b: the first full read is not the file"
nbdsh -u "$(sock_uri "$sock")" -c - <<'PY'
h.pwrite(b"\x5a" * 200000, 100001)
h.pwrite(b"\x6b" * 65536, 1024 * 1024)
h.pwrite(b"\x7c" * 10, 2 * 1024 * 1024 + 5)
h.zero(150000, 3 * 1024 * 1024 + 1)
h.trim(2 * 65536, 4 * 1024 * 1024)
h.trim(777, 5 * 1024 * 1024 + 3)
PY
crash_nbdkit "$pid"
start_ssdcache -P "$pid" -U "$sock" "${args[@]}"
expect_export "$sock" "$img" \
    "after kill -9, pages changed before the crash were served stale"
stop_nbdkit "$pid"

# Run 3: plain crash after a cold read whose pages are all stored (a
# miss is stored after its answer: drain --wait waits for that), no
# writes: the restart must read (almost) nothing from the backend.
rm -f "$cache" "$stats"
start_ssdcache -P "$pid" -U "$sock" "${args[@]}" ssdcache-control="$ctl"
nbdcopy --no-extents "$(sock_uri "$sock")" "$tmpdir/copy.img"
ctl_bounded "$ctl" drain --wait
crash_nbdkit "$pid"
start_ssdcache -P "$pid" -U "$sock" "${args[@]}"
expect_export "$sock" "$img" "run 3 served data that is not the file's"
stop_nbdkit "$pid"
cat "$bstats" "$stats"
expect_stat "$bstats" backend_read_bytes -le $((size / 64)) \
    "after kill -9 of a read-only run, too much came from the backend"

# Writethrough under the writeback crash test's client (random
# unaligned and 1 KiB writes, flushes, FUA, reads checked against the
# model, kill -9 with requests in flight), with small rewrites of cached
# pages deferred (ssdcache-defer-writes): after every kill the
# restarted server must serve exactly the backing file.
"$PYTHON" "$testsrcdir/crash-writeback.py" --mode writethrough \
          --iterations "${CRASH_WT_ITERATIONS:-10}" --seed "$seed" \
          --filter "$SSDCACHE_FILTER" --workdir "$tmpdir/crash-wt"
