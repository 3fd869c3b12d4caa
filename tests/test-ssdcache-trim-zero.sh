#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: zero and trim requests on cached pages go to
# the backend and leave the cache correct (the zeroed range reads as
# zero, never the old cached data), extents pass through unchanged
# (same map as the file plugin alone), flush and FUA work.  After a
# restart the data still equals the file.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdsh --version
requires nbdinfo --version
requires nbdcopy --version
requires "$PYTHON" -c 'import nbd'

stats="$tmpdir/stats"
size=$((4 * 1024 * 1024))
random_file "$img" $size
export img size

run ()
{
    run_ssdcache file "$img" \
                 ssdcache-file="$cache" ssdcache-stats="$stats" "$@"
}

run --run 'nbdsh -u "$uri" -c -' <<'PY'
import os
img = os.environ["img"]
size = int(os.environ["size"])
Z = lambda n: bytes(n)

def file_bytes(off, n):
    with open(img, "rb") as f:
        f.seek(off)
        return f.read(n)

assert h.can_zero(), "the filter does not advertise zero"
assert h.can_trim(), "the filter does not advertise trim"
assert h.can_flush(), "the filter does not advertise flush"

# Everything cached, in 64K reads (a miss of 256K or more may be stored
# after its answer, and the zeroes below must find the pages cached).
disk = bytearray(b"".join(h.pread(65536, o) for o in range(0, size, 65536)))
assert disk == file_bytes(0, size)
assert h.pread(size, 0) == disk             # and hits

# Zero, unaligned, inside and across cached pages.
for off, n, flags in ((1000, 5000, 0),
                      (65536 - 300, 700, nbd.CMD_FLAG_NO_HOLE),
                      (200000, 3 * 65536 + 17, 0),
                      (size - 100, 100, 0)):
    h.zero(n, off, flags)
    disk[off:off + n] = Z(n)
    lo, hi = max(0, off - 100), min(size, off + n + 100)
    assert h.pread(hi - lo, lo) == disk[lo:hi], \
        "zero at %d+%d reads stale data" % (off, n)

# Zero with FUA, whole pages.
if h.can_fua():
    h.zero(2 * 65536, 1024 * 1024, nbd.CMD_FLAG_FUA)
else:
    h.zero(2 * 65536, 1024 * 1024)
disk[1024 * 1024:1024 * 1024 + 2 * 65536] = Z(2 * 65536)

# Trim cached pages: whole pages and an unaligned range.  The file
# plugin punches holes, so they read back as zero.
for off, n in ((2 * 1024 * 1024, 4 * 65536), (3 * 1024 * 1024 + 12345, 100000)):
    h.trim(n, off)
    disk[off:off + n] = Z(n)
    got = h.pread(n, off)
    assert got == Z(n), "trim at %d+%d: cached data still served" % (off, n)

# Writes after zero/trim (into the same pages), with FUA.
h.pwrite(b"\x77" * 5000, 2 * 1024 * 1024 + 1000,
         nbd.CMD_FLAG_FUA if h.can_fua() else 0)
disk[2 * 1024 * 1024 + 1000:2 * 1024 * 1024 + 6000] = b"\x77" * 5000

h.flush()
assert h.pread(size, 0) == disk, "disk differs from the model"
assert file_bytes(0, size) == disk, "backing file differs from the model"
open(os.environ["tmpdir"] + "/expected.img", "wb").write(disk)
PY
cat "$stats"
cmp "$img" "$tmpdir/expected.img"
[ "$(stat_get "$stats" pages_invalidated)" -gt 0 ] ||
    fail "zero/trim invalidated no cached page"

# Extents: the same map as the file plugin without the filter.
nbdkit -U - file "$img" --run 'nbdinfo --map "$uri"' > "$tmpdir/map.plain"
run --run 'nbdinfo --map "$uri"' > "$tmpdir/map.cached"
cat "$tmpdir/map.plain"
diff -u "$tmpdir/map.plain" "$tmpdir/map.cached" ||
    fail "extents through the filter differ from the file plugin's"
grep -q hole "$tmpdir/map.plain" ||
    echo "note: the file system did not punch holes; extents check is weak"

# Restart: everything still equals the file.
run --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
cmp "$img" "$tmpdir/copy.img" || fail "after a restart the data differs from the file"

# Dropping cached pages must reach the cache file: cache everything,
# zero and trim cached pages, stop without reading them again; after a
# restart the zeroes must be read, not the old cached copies.
run --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
cmp "$img" "$tmpdir/copy.img"
run --run 'nbdsh -u "$uri" -c -' <<'PY'
h.zero(200000, 300001)
h.zero(65536, 1024 * 1024, nbd.CMD_FLAG_NO_HOLE)
h.trim(3 * 65536, 2 * 1024 * 1024 + 65536)
h.trim(1000, 3 * 1024 * 1024 + 100)
h.flush()
PY
run --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
cmp "$img" "$tmpdir/copy.img" ||
    fail "after a restart, zeroed or trimmed pages were served from the old cache"

# Random zero/trim/write/read mix.
cp "$img" "$tmpdir/before.img"
run --run '"$PYTHON" "$random_io" --uri "$uri" --connections 2 --ops 1000 \
             --mix read=50,write=15,zero=15,trim=15,flush=5 \
             --model "$tmpdir/before.img" --save-model "$tmpdir/expected.img" \
             --trim-reads-zero'
cmp "$img" "$tmpdir/expected.img" || fail "backing file differs from the model"
