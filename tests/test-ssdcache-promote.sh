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

requires "$PYTHON" -c 'import nbd'
requires nbdkit --filter=stats null --version

random_file "$tmpdir/disk.img" $((16 * 1024 * 1024))

# read.py URI OFFSET... : read 64K at each offset, in order.
cat > "$tmpdir/read.py" <<'PY'
import sys
import nbd
h = nbd.NBD(); h.connect_uri(sys.argv[1])
data = open(sys.argv[2], "rb").read()
for off in (int(x) for x in sys.argv[3:]):
    assert h.pread(65536, off) == data[off:off + 65536], off
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
[ "$(backend_read_ops "$tmpdir/bs-once")" -eq 1 ] || fail "1 read: backend ops"
[ "$(stat_get "$tmpdir/ss-once" fills)" -eq 0 ] ||
    fail "promote=2: a page read once was cached"
[ "$(stat_get "$tmpdir/ss-once" promote_skipped)" -eq 1 ] ||
    fail "promote=2: promote_skipped is not 1"

# promote=2, P read twice: the second read also goes to the backend and
# caches the page; the third read is a hit.  Q, read once in between,
# stays out.
run 2 thrice $P $Q $P $P
[ "$(backend_read_ops "$tmpdir/bs-thrice")" -eq 3 ] ||
    fail "promote=2: expected 3 backend reads (P, Q, P), got $(backend_read_ops "$tmpdir/bs-thrice")"
[ "$(stat_get "$tmpdir/ss-thrice" fills)" -eq 1 ] ||
    fail "promote=2: only P should have been cached"
[ "$(stat_get "$tmpdir/ss-thrice" read_hits)" -eq 1 ] ||
    fail "promote=2: the third read of P was not a hit"
[ "$(stat_get "$tmpdir/ss-thrice" promote_skipped)" -eq 2 ] ||
    fail "promote=2: promote_skipped is not 2"

# Default (1): the first read caches, the second is a hit.
run 1 default $P $P
[ "$(backend_read_ops "$tmpdir/bs-default")" -eq 1 ] ||
    fail "promote=1: the second read went to the backend"
[ "$(stat_get "$tmpdir/ss-default" promote_skipped)" -eq 0 ] ||
    fail "promote=1: promote_skipped counted"

# promote=3: cached on the third miss, hit on the fourth.
run 3 three $P $P $P $P
[ "$(backend_read_ops "$tmpdir/bs-three")" -eq 3 ] ||
    fail "promote=3: expected 3 backend reads"

# NBD_CMD_CACHE (a client's explicit prefetch) is not subject to it.
rm -f "$tmpdir/c-cmd"
run_ssdcache file "$tmpdir/disk.img" \
             ssdcache-file="$tmpdir/c-cmd" ssdcache-size=4M ssdcache-promote=2 \
             ssdcache-stats="$tmpdir/ss-cmd" \
             --run 'nbdsh -u "$uri" -c "h.cache(65536, '$P')"'
[ "$(stat_get "$tmpdir/ss-cmd" fills)" -eq 1 ] ||
    fail "promote=2: NBD_CMD_CACHE did not cache the page"

# Bad values.
expect_ssdcache_failure "ssdcache-promote: " \
    file "$tmpdir/disk.img" ssdcache-promote=0
expect_ssdcache_failure "ssdcache-promote: " \
    file "$tmpdir/disk.img" ssdcache-promote=256
