#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: extents in writeback mode.  Data written over
# a hole of a sparse backing file, not flushed and not written back
# yet (high watermark 100%, no idle writeback), lives only in the
# cache: block status must report it as data (never hole or zero), so
# that `nbdinfo --map` shows it and `nbdcopy` (which skips what
# extents call zero) copies the right bytes.  nbdkit's own cache filter
# is run the same way for comparison only (printed, not checked).

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdinfo --version
requires nbdcopy --version
requires "$PYTHON" -c 'import nbd'

size=$((8 * 1024 * 1024))

# 1M of data, then a hole.
truncate -s $size "$img"
head -c $((1024 * 1024)) /dev/urandom | dd of="$img" conv=notrunc status=none
nbdkit -U - file "$img" --run 'nbdinfo --map "$uri"' > "$tmpdir/map0"
cat "$tmpdir/map0"
grep -q hole "$tmpdir/map0" || {
    echo "$0: the file system does not report holes"; exit 77; }

# The writes (offset length), all over the hole: unaligned, a 1 KiB
# sector-aligned one, a whole page, one spanning pages, one at the end.
writes="2098153 300000
5243392 1024
6291456 65536
3211264 1
7340032 131073
8388000 608"

# write_all URI: do the writes (data from a fixed seed), no flush.
write_all ()
{
    WRITES="$writes" nbdsh -u "$1" -c '
import os, random
rng = random.Random(1)
for line in os.environ["WRITES"].splitlines():
    off, n = map(int, line.split())
    h.pwrite(bytes(rng.randrange(1, 256) for _ in range(n)), off)
'
}

# The expected contents.
cp "$img" "$tmpdir/expected.img"
WRITES="$writes" EXP="$tmpdir/expected.img" "$PYTHON" -c '
import os, random
rng = random.Random(1)
with open(os.environ["EXP"], "r+b") as f:
    for line in os.environ["WRITES"].splitlines():
        off, n = map(int, line.split())
        f.seek(off)
        f.write(bytes(rng.randrange(1, 256) for _ in range(n)))
'

# check_map MAPFILE: every written byte is in an extent of type data.
check_map ()
{
    WRITES="$writes" MAP="$1" "$PYTHON" -c '
import json, os, sys
exts = json.load(open(os.environ["MAP"]))
bad = 0
for line in os.environ["WRITES"].splitlines():
    off, n = map(int, line.split())
    for e in exts:
        lo, hi = e["offset"], e["offset"] + e["length"]
        if lo < off + n and off < hi and e["type"] & 3:
            print("written range [%d, %d) overlaps extent [%d, %d) %s" %
                  (off, off + n, lo, hi, e["description"]))
            bad += 1
    covered = sum(min(off + n, e["offset"] + e["length"]) - max(off, e["offset"])
                  for e in exts
                  if e["offset"] < off + n and off < e["offset"] + e["length"])
    if covered != n:
        print("written range [%d, %d): extents cover %d bytes" % (off, off + n, covered))
        bad += 1
sys.exit(1 if bad else 0)
'
}

args=( file "$img" ssdcache-file="$cache"
       ssdcache-size=4M ssdcache-page-size=64K ssdcache-mode=writeback
       ssdcache-writeback-high=100 ssdcache-writeback-idle=0
       ssdcache-stats="$tmpdir/stats" )
start_ssdcache -P "$pid" -U "$sock" "${args[@]}"
uri="$(sock_uri "$sock")"
write_all "$uri"

# The data must not be in the backing file yet, or this tests nothing.
cmp -s "$img" "$tmpdir/expected.img" &&
    fail "the writes reached the backing file already: nothing to test"

nbdinfo --map "$uri" | tee "$tmpdir/map.txt"
nbdinfo --map --json "$uri" > "$tmpdir/map.json"
check_map "$tmpdir/map.json" ||
    fail "nbdinfo --map reports dirty (unflushed) data as hole or zero"

# nbdcopy uses extents: it must copy the dirty data.
nbdcopy "$uri" "$tmpdir/copy.img"
cmp "$tmpdir/copy.img" "$tmpdir/expected.img" ||
    fail "nbdcopy (with extents) copied wrong data"
nbdcopy --no-extents "$uri" "$tmpdir/copy2.img"
cmp "$tmpdir/copy2.img" "$tmpdir/expected.img" ||
    fail "nbdcopy --no-extents copied wrong data"

# Still dirty after all that (nbdcopy did not make it clean by accident).
cmp -s "$img" "$tmpdir/expected.img" &&
    fail "the writes reached the backing file during the checks"

# A restart (clean exit without writeback) must still report it right.
stop_nbdkit "$pid"
start_ssdcache -P "$pid" -U "$sock" "${args[@]}" ssdcache-writeback-on-exit=false
nbdinfo --map --json "$uri" > "$tmpdir/map2.json"
check_map "$tmpdir/map2.json" ||
    fail "after a restart, dirty data is reported as hole or zero"
nbdcopy "$uri" "$tmpdir/copy.img"
cmp "$tmpdir/copy.img" "$tmpdir/expected.img" ||
    fail "after a restart, nbdcopy copied wrong data"

# Clean exit writes it all back.
stop_nbdkit "$pid"
cmp "$img" "$tmpdir/expected.img" ||
    fail "after a clean exit the backing file lacks the data"

# For comparison only: nbdkit's own cache filter in writeback mode.
rm -f "$img"
truncate -s $size "$img"
head -c $((1024 * 1024)) "$tmpdir/expected.img" |
    dd of="$img" conv=notrunc status=none
start_nbdkit -P "$pid" -U "$sock" --filter=cache file "$img" cache=writeback
write_all "$uri"
echo "nbdkit cache filter (cache=writeback), for comparison:"
nbdinfo --map "$uri" || :
nbdinfo --map --json "$uri" > "$tmpdir/map3.json" || :
if check_map "$tmpdir/map3.json"; then
    echo "nbdkit cache filter: dirty data reported as data"
else
    echo "nbdkit cache filter: dirty data reported as hole/zero (known)"
fi
nbdcopy "$uri" "$tmpdir/copy3.img" || :
cmp -s "$tmpdir/copy3.img" "$tmpdir/expected.img" &&
    echo "nbdkit cache filter: nbdcopy right" ||
    echo "nbdkit cache filter: nbdcopy copied wrong data"
stop_nbdkit "$pid"
