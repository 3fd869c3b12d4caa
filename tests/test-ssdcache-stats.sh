#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: ssdcache-stats=FILE is written at exit with
# every counter as "name: value" (and the derived hit_ratio,
# dirty_bytes and writeback_bytes_per_second); reading the disk twice
# in one run shows hits, misses, fills and bytes from both sides.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdsh --version

stats="$tmpdir/stats"
size=$((2 * 1024 * 1024))
random_file "$img" $size
export size

counters="read_ops read_hits read_misses read_partial bytes_from_cache
          bytes_from_backend write_ops bytes_written pages_updated
          pages_invalidated fills evictions bypassed verify_failures
          cache_errors loaded_slots dropped_entries"

run_ssdcache file "$img" \
             ssdcache-file="$cache" ssdcache-stats="$stats" \
             --run 'nbdsh -u "$uri" -c "
# In 64K reads: a miss of 256K or more may be stored after its answer.
a = b\"\".join(h.pread(65536, o) for o in range(0, $size, 65536))
b = b\"\".join(h.pread(65536, o) for o in range(0, $size, 65536))
assert a == b
h.pwrite(b\"x\" * 4096, 8192)
assert h.pread(4096, 8192) == b\"x\" * 4096
"'
cat "$stats"
for c in $counters; do
    stat_get "$stats" $c > /dev/null
done
[ "$(stat_get "$stats" read_ops)" -ge 2 ] || fail "read_ops < 2"
[ "$(stat_get "$stats" read_hits)" -gt 0 ] || fail "reading twice gave no hits"
[ "$(stat_get "$stats" read_misses)" -gt 0 ] || fail "a cold read gave no misses"
[ "$(stat_get "$stats" fills)" -gt 0 ] || fail "no fills"
[ "$(stat_get "$stats" bytes_from_backend)" -ge $size ] ||
    fail "bytes_from_backend < $size after a cold full read"
[ "$(stat_get "$stats" bytes_from_cache)" -ge $size ] ||
    fail "bytes_from_cache < $size after a warm full read"
[ "$(stat_get "$stats" write_ops)" -eq 1 ] || fail "write_ops != 1"
[ "$(stat_get "$stats" bytes_written)" -eq 4096 ] || fail "bytes_written != 4096"
[ "$(stat_get "$stats" pages_updated)" -ge 1 ] || fail "the write updated no cached page"
# Writethrough: the update of the cached copy was queued
# (ssdcache-defer-writes), and the read right after it waited for it.
[ "$(stat_get "$stats" writes_deferred)" -eq 1 ] || fail "writes_deferred != 1"
[ "$(stat_get "$stats" deferred_waits)" -le 1 ] || fail "deferred_waits > 1"
[ "$(stat_get "$stats" verify_failures)" -eq 0 ] || fail "verify failures on a fresh cache"
[ "$(stat_get "$stats" cache_errors)" -eq 0 ] || fail "cache errors on a fresh cache"

# Without deferral the same write updates the copy at once (the page is
# read first: after a start it is used only once it has verified).
run_ssdcache file "$img" \
             ssdcache-file="$cache" ssdcache-stats="$stats" \
             ssdcache-defer-writes=false \
             --run 'nbdsh -u "$uri" -c "
h.pread(65536, 0)
h.pwrite(b\"y\" * 4096, 8192)
assert h.pread(4096, 8192) == b\"y\" * 4096
"'
[ "$(stat_get "$stats" writes_deferred)" -eq 0 ] ||
    fail "ssdcache-defer-writes=false: writes were deferred"
[ "$(stat_get "$stats" pages_updated)" -eq 1 ] ||
    fail "ssdcache-defer-writes=false: the write updated no cached page"

# Lines are exactly "name: number" (hit_ratio: a fraction with four
# decimals); no counter twice.
bad="$(grep -Ev '^[a-z_]+: [0-9]+$|^hit_ratio: [01]\.[0-9]{4}$' "$stats" || true)"
[ -z "$bad" ] || fail "malformed lines in $stats: $bad"
dups="$(cut -d: -f1 "$stats" | sort | uniq -d)"
[ -z "$dups" ] || fail "counters listed twice: $dups"

# The file is rewritten (not appended to) by the next run, and a warm
# start shows loaded slots.
run_ssdcache file "$img" \
             ssdcache-file="$cache" ssdcache-stats="$stats" --run true
cat "$stats"
[ "$(grep -c '^read_ops:' "$stats")" -eq 1 ] || fail "stats file appended to"
[ "$(stat_get "$stats" read_ops)" -eq 0 ] || fail "read_ops not 0 in a run with no reads"
[ "$(stat_get "$stats" loaded_slots)" -gt 0 ] || fail "no loaded slots on a warm start"
