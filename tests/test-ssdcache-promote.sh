#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: n-hit promotion (ssdcache-promote).
#
# With ssdcache-promote=2 a page read once is not cached: its second
# read still goes to the backend (counted by nbdkit's stats filter
# below the cache, and in promote_skipped); read twice it is cached, and
# the third read is served from the cache.  With the default (1) the
# first read caches it.  Readahead is off so that only the reads below
# touch the backend.
source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd
requires_filter stats

random_file "$tmpdir/disk.img" $((16 * 1024 * 1024))

# read.py URI OFFSET... : read 64K at each offset, in order.
cat > "$tmpdir/read.py" <<'PY'
import sys
from ssdtest import connect, expect_export
h = connect(sys.argv[1])
for off in (int(x) for x in sys.argv[3:]):
    expect_export(h, sys.argv[2], "read at %d" % off, off, 65536)
PY

# run PROMOTE NAME OFFSETS...: one nbdkit, reads in order; counters in
# $tmpdir/bs-NAME (backend, stats filter) and $tmpdir/ss-NAME (ssdcache).
run ()
{
    local promote="$1" name="$2"
    shift 2
    rm -f "$tmpdir/c-$name"
    run_ssdcache --filter=stats \
                 file "$tmpdir/disk.img" statsfile="$tmpdir/bs-$name" \
                 ssdcache-file="$tmpdir/c-$name" ssdcache-size=4M \
                 ssdcache-readahead=off ssdcache-promote="$promote" \
                 ssdcache-stats="$tmpdir/ss-$name" \
                 --run '"$PYTHON" "$tmpdir/read.py" "$uri" "$tmpdir/disk.img" '"$*"
    cat "$tmpdir/bs-$name" "$tmpdir/ss-$name"
}

P=$((5 * 1024 * 1024))     # the page read again and again
Q=$((9 * 1024 * 1024))     # a page read once

# promote=2, P read once: not cached.
run 2 once $P
expect_stat "$tmpdir/bs-once" backend_read_ops -eq 1 "promote=2, 1 read"
expect_stat "$tmpdir/ss-once" fills -eq 0 "promote=2: a page read once was cached"
expect_stat "$tmpdir/ss-once" promote_skipped -eq 1 "promote=2, 1 read"

# promote=2, P read twice: the second read also goes to the backend and
# caches the page; the third read is a hit.  Q, read once in between,
# stays out.
run 2 thrice $P $Q $P $P
expect_stat "$tmpdir/bs-thrice" backend_read_ops -eq 3 "promote=2: P, Q, P"
expect_stat "$tmpdir/ss-thrice" fills -eq 1 "promote=2: only P should be cached"
expect_stat "$tmpdir/ss-thrice" read_hits -eq 1 "promote=2: the third read of P"
expect_stat "$tmpdir/ss-thrice" promote_skipped -eq 2 "promote=2, P Q P P"

# Default (1): the first read caches, the second is a hit.
run 1 default $P $P
expect_stat "$tmpdir/bs-default" backend_read_ops -eq 1 "promote=1, P P"
expect_stat "$tmpdir/ss-default" promote_skipped -eq 0 "promote=1, P P"

# promote=3: cached on the third miss, hit on the fourth.
run 3 three $P $P $P $P
expect_stat "$tmpdir/bs-three" backend_read_ops -eq 3 "promote=3, P P P P"

# NBD_CMD_CACHE (a client's explicit prefetch) is not subject to it.
rm -f "$tmpdir/c-cmd"
run_ssdcache file "$tmpdir/disk.img" \
             ssdcache-file="$tmpdir/c-cmd" ssdcache-size=4M ssdcache-promote=2 \
             ssdcache-stats="$tmpdir/ss-cmd" \
             --run 'nbdsh -u "$uri" -c "h.cache(65536, '$P')"'
expect_stat "$tmpdir/ss-cmd" fills -eq 1 \
    "promote=2: NBD_CMD_CACHE did not cache the page"

# Bad values.
expect_ssdcache_failure "ssdcache-promote: " \
    file "$tmpdir/disk.img" ssdcache-promote=0
expect_ssdcache_failure "ssdcache-promote: " \
    file "$tmpdir/disk.img" ssdcache-promote=256
