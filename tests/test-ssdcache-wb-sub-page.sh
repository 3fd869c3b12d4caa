#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: sub-page writes in writeback mode never read
# the backend.  With 64K pages (512-byte sectors), 1 KiB sector-aligned
# writes into pages that are not cached must be stored as dirty
# sectors (per-sector valid/dirty bitmaps) without reading the rest of
# the page: nbdkit's stats filter below ssdcache must count 0 bytes
# read.  Reads of exactly those sectors come from the cache (0 bytes
# from the backend again); reads of whole pages merge the cached
# sectors with the backend data.  An unaligned small write may read at
# most its two edge sectors, never the whole page.

source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd
requires_filter stats

size=$((8 * 1024 * 1024))
random_file "$img" $size
cp "$img" "$tmpdir/orig.img"
uri="$(sock_uri "$sock")"

# server BSTATS ARGS...: ssdcache over the stats filter over the file.
server ()
{
    local bstats="$1"
    shift
    rm -f "$bstats"
    start_ssdcache -P "$pid" -U "$sock" --filter=stats file "$img" \
                   statsfile="$bstats" ssdcache-file="$cache" \
                   ssdcache-size=4M ssdcache-page-size=64K \
                   ssdcache-mode=writeback ssdcache-writeback-high=100 \
                   ssdcache-writeback-idle=0 "$@"
}

# The sector-aligned writes (offset length): 1 KiB in pages 3, 10
# (twice, apart), 20 (at its start and its end), one across pages 30
# and 31, a 512-byte one, a 3.5K one.
writes="$((3 * 65536 + 4096)) 1024
$((10 * 65536 + 1024)) 1024
$((10 * 65536 + 40960)) 1024
$((20 * 65536)) 1024
$((21 * 65536 - 1024)) 1024
$((31 * 65536 - 1024)) 2048
$((40 * 65536 + 512)) 512
$((50 * 65536 + 7680)) 3584"

# Run 1: the writes, nothing else.
server "$tmpdir/b1" ssdcache-stats="$tmpdir/s1" ssdcache-writeback-on-exit=false
WRITES="$writes" EXP="$tmpdir/expected.img" IMG="$img" nbdsh -u "$uri" -c '
import os, random
rng = random.Random(7)
exp = bytearray(open(os.environ["IMG"], "rb").read())
for line in os.environ["WRITES"].splitlines():
    off, n = map(int, line.split())
    data = rng.randbytes(n)
    h.pwrite(data, off)
    exp[off:off + n] = data
h.flush()
open(os.environ["EXP"], "wb").write(exp)
'
stop_nbdkit "$pid"
cat "$tmpdir/b1" "$tmpdir/s1"
cmp "$img" "$tmpdir/orig.img" ||
    fail "the backing file changed: nothing should have been written back"
expect_stat "$tmpdir/b1" backend_read_bytes -eq 0 \
    "sector-aligned sub-page writes"
expect_stat "$tmpdir/s1" bytes_from_backend -eq 0 \
    "ssdcache counted bytes_from_backend for sector-aligned writes"

# reread BSTATS CODE: a server that does not write back at exit; nbdsh
# runs CODE with exp (the expected disk) and writes (the (offset,
# length) pairs of $writes).
reread ()
{
    server "$1" ssdcache-writeback-on-exit=false
    WRITES="$writes" EXP="$tmpdir/expected.img" nbdsh -u "$uri" -c '
import os
from ssdtest import expect_export
exp = open(os.environ["EXP"], "rb").read()
writes = [tuple(map(int, l.split())) for l in os.environ["WRITES"].splitlines()]
' -c "$2"
    stop_nbdkit "$pid"
    cat "$1"
}

# Run 2: read back exactly the written sectors: all from the cache.
reread "$tmpdir/b2" '
for off, n in writes:
    got = h.pread(n, off)
    assert got == exp[off:off + n], "written sectors at %d read back wrong" % off
    # and a piece of them
    got = h.pread(100, off + n // 2 - 50)
    assert got == exp[off + n // 2 - 50:off + n // 2 + 50], "piece at %d wrong" % off
'
expect_stat "$tmpdir/b2" backend_read_bytes -eq 0 \
    "reading only the written sectors"

# Run 3: read whole pages and the whole disk: cached sectors merged
# with the backend's data.
reread "$tmpdir/b3" '
for off, n in writes:
    p = off // 65536 * 65536
    got = h.pread(65536, p)
    if got != exp[p:p + 65536]:
        bad = next(i for i in range(65536) if got[i] != exp[p + i])
        raise SystemExit("FAIL: page at %d: merged read wrong at byte %d" %
                         (p, p + bad))
    # a read across the edge of the written sectors
    lo = max(0, off - 700)
    assert h.pread(n + 1400, lo) == exp[lo:lo + n + 1400], "edge read at %d" % off
expect_export(h, os.environ["EXP"], "whole-disk read", chunk=1 << 20)
'
expect_stat "$tmpdir/b3" backend_read_bytes -gt 0 \
    "whole-page reads read nothing from the backend?"
cmp "$img" "$tmpdir/orig.img" ||
    fail "the backing file changed although nothing was to be written back"

# Run 4: unaligned small writes into uncached pages: at most the two
# edge sectors may be read, never the page.
server "$tmpdir/b4" ssdcache-writeback-on-exit=false
EXP="$tmpdir/expected.img" nbdsh -u "$uri" -c '
import os
exp = bytearray(open(os.environ["EXP"], "rb").read())
for k, (off, n) in enumerate([(60 * 65536 + 100, 1000), (61 * 65536 + 1000, 10),
                              (62 * 65536 + 65000, 1000)]):
    data = bytes([k + 1]) * n
    h.pwrite(data, off)
    exp[off:off + n] = data
open(os.environ["EXP"], "wb").write(exp)
'
stop_nbdkit "$pid"
cat "$tmpdir/b4"
# 3 writes, at most 2 edge sectors each.
expect_stat "$tmpdir/b4" backend_read_bytes -le $((3 * 2 * 512)) \
    "3 small unaligned writes (edge sectors only)"

# Clean exit with writeback: the backing file gets the merged data.
server "$tmpdir/b5"
nbdsh -u "$uri" -c 'pass'
stop_nbdkit "$pid"
cat "$tmpdir/b5"
cmp "$img" "$tmpdir/expected.img" ||
    fail "after writeback the backing file does not hold the merged data"
# Writeback writes only dirty sectors: it needs no backend read.
expect_stat "$tmpdir/b5" backend_read_bytes -eq 0 "writeback"
