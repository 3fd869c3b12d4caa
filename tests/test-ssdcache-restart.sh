#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: warm restart after a clean stop.  Pass 1
# reads the whole disk (everything comes from the backend), the server
# stops cleanly, pass 2 on a new server reads the whole disk again and
# must take (almost) nothing from the backend.  Backend traffic is
# counted by nbdkit's stats filter placed below ssdcache.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdcopy --version
requires_filter stats

size=$((8 * 1024 * 1024))
random_file "$img" $size

run ()
{
    rm -f "$bstats" "$stats"
    run_ssdcache --filter=stats file "$img" \
                 statsfile="$bstats" ssdcache-file="$cache" ssdcache-size=8M \
                 ssdcache-stats="$stats" \
                 --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
    cat "$bstats" "$stats"
    cmp "$img" "$tmpdir/copy.img" || fail "data read differs from the file ($1)"
}

# Pass 1: cold.
run "pass 1"
expect_stat "$bstats" backend_read_bytes -ge $size "pass 1"
expect_stat "$stats" read_misses -gt 0 "pass 1"

# Pass 2: warm.
run "pass 2"
expect_warm "$stats" "$bstats" $size "pass 2, after a clean restart"
expect_stat "$stats" read_hits -gt 0 "pass 2"
expect_stat "$stats" bytes_from_cache -ge $((size - size / 64)) "pass 2"

# Pass 3: after changing the file behind the cache's back, with the
# cache told to reset, the data must be the new file's.  (Sanity check
# that pass 2 was not served from somewhere else.)
random_file "$img" $size
rm -f "$bstats" "$stats"
run_ssdcache --filter=stats file "$img" \
             statsfile="$bstats" ssdcache-file="$cache" ssdcache-size=8M \
             ssdcache-reset=true ssdcache-id=forced-new-identity \
             --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
cmp "$img" "$tmpdir/copy.img" || fail "after a reset the data is not the file's"
[ "$(backend_read_bytes "$bstats")" -ge $size ] ||
    fail "after a reset the data did not come from the backend"
