#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: exports share one budget: a busy export takes
# the clean slots of an idle one and hits as often as with a cache of
# its own of that size; the files stay within the budget on disk.

source "$(dirname "$0")/functions.sh"
source "$(dirname "$0")/exports.sh-inc"
set -e -x

requires nbdcopy --version
requires nbdsh --version

# c.img (8M) is read first and fills the whole 4M budget, then idles
# (its client stays connected, so its cache stays open); a.img (4M) is
# then read twice.  Its second read must hit as often as with a 4M
# cache of its own.  (An export whose last client left is parked
# instead: test-ssdcache-exports-limit.sh.)
hits_of_a ()
{
    local stats="$1"
    f="$(grep -l '^export: a.img$' "$stats".*)"
    stat_get "$f" read_hits
}
rm -f "$cache" "$cache".* "$tmpdir/st".*
start_ssdcache -P "$tmpdir/s.pid" -U "$tmpdir/s.sock" file dir="$dir" \
    ssdcache-file="$cache" ssdcache-size=4M ssdcache-readahead=off \
    ssdcache-stats="$tmpdir/st" -D ssdcache.exports=1
hold_client c "$(uri_of c.img "$tmpdir/s.sock")" '
for off in range(0, h.get_size(), 1 << 20):
    h.pread(1 << 20, off)'
sleep 1.5                       # c.img idle (EXPORTS_IDLE_MS)
nbdcopy --no-extents "$(uri_of a.img "$tmpdir/s.sock")" "$tmpdir/copy"
nbdcopy --no-extents "$(uri_of a.img "$tmpdir/s.sock")" "$tmpdir/copy"
cmp "$dir/a.img" "$tmpdir/copy" || fail "a.img read wrong (budget)"
release_client c
stop_nbdkit "$tmpdir/s.pid"
shared="$(hits_of_a "$tmpdir/st")"
cfile="$(grep -l '^export: c.img$' "$tmpdir/st".*)"
[ "$(stat_get "$cfile" slots_given)" -gt 0 ] ||
    fail "the idle export gave no slot to the busy one"
# Space on disk stays within the budget, plus each file's superblocks
# and entries (its first MiB) and what the file system keeps for a
# file with holes (ext4: an extent block of 4 KiB once a file has more
# than four extents): less than half a page (64K) per file, so one
# slot too many still fails.
used=$(( $(du -B1 -c "$cache".* | tail -1 | cut -f1) ))
nfiles=$(ls "$cache".* | wc -l)
[ "$used" -le $(( (4 + nfiles) * 1024 * 1024 + nfiles * 32 * 1024)) ] ||
    fail "the per-export cache files take $used bytes for a 4M budget"

rm -f "$cache" "$cache".* "$tmpdir/st".*
start_ssdcache -P "$tmpdir/s.pid" -U "$tmpdir/s.sock" file dir="$dir" \
    ssdcache-file="$cache" ssdcache-size=4M ssdcache-readahead=off \
    ssdcache-stats="$tmpdir/st"
nbdcopy --no-extents "$(uri_of a.img "$tmpdir/s.sock")" "$tmpdir/copy"
nbdcopy --no-extents "$(uri_of a.img "$tmpdir/s.sock")" "$tmpdir/copy"
stop_nbdkit "$tmpdir/s.pid"
alone="$(hits_of_a "$tmpdir/st")"
echo "a.img hits: $shared shared, $alone alone"
[ "$shared" -ge "$alone" ] ||
    fail "a.img hit $shared times with a shared budget, $alone alone"
