#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: nbdinfo sees the export through the filter
# with the right size and flags, and nbdsh can read and write it.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdinfo --version
requires nbdsh --version
requires nbdcopy --version

size=$((4 * 1024 * 1024 + 12288))   # not a multiple of the page size
random_file "$img" $size
cp "$img" "$tmpdir/orig.img"

run ()
{
    run_ssdcache file "$img" \
                 ssdcache-file="$cache" "$@"
}

# Size as seen by nbdinfo.
got="$(run --run 'nbdinfo --size "$uri"')"
[ "$got" = "$size" ] || fail "nbdinfo --size: expected $size, got $got"

# Full nbdinfo output mentions the size and says the export is writable.
run --run 'nbdinfo "$uri"' > "$tmpdir/info.out"
cat "$tmpdir/info.out"
grep -E "export-size:[[:space:]]+$size" "$tmpdir/info.out" ||
    fail "nbdinfo did not report export-size $size"
grep -E "is_read_only:[[:space:]]+false" "$tmpdir/info.out" ||
    fail "nbdinfo says the export is read-only"
run --run 'nbdinfo --can write "$uri"' ||
    fail "nbdinfo --can write: the export is not writable"

# The filter must not be the reason a cache file is missing.
[ -f "$cache" ] || fail "the cache file $cache was not created"

# Read and write through nbdsh; check against the backing file.
export img size
run --run 'nbdsh -u "$uri" -c -' <<'PY'
import os
img = os.environ["img"]
size = int(os.environ["size"])
assert h.get_size() == size, h.get_size()
with open(img, "rb") as f:
    disk = f.read()

def check(off, n):
    got = h.pread(n, off)
    exp = disk[off:off + n]
    assert got == exp, "read off=%d len=%d differs from the file" % (off, n)

# Reads of various shapes, twice (miss, then hit).
for _ in range(2):
    check(0, 512)
    check(1, 1)
    check(65535, 2)                    # across a page boundary
    check(100000, 300001)              # many pages, unaligned both ends
    check(size - 12288, 12288)         # the partial last page
    check(size - 1, 1)
    check(0, size)

# Writes: unaligned, reaching the file, read back from the cache.
w = bytes((i * 7 + 3) & 0xff for i in range(70000))
h.pwrite(w, 123457)
assert h.pread(len(w), 123457) == w
h.pwrite(b"\xa5" * 10, size - 10)
assert h.pread(10, size - 10) == b"\xa5" * 10
h.flush()
with open(img, "rb") as f:
    f.seek(123457)
    assert f.read(len(w)) == w, "the write did not reach the backing file"
    f.seek(size - 10)
    assert f.read(10) == b"\xa5" * 10, "the tail write did not reach the file"
disk = bytearray(disk)
disk[123457:123457 + len(w)] = w
disk[size - 10:] = b"\xa5" * 10
check(0, size)
PY

# A fresh run (warm cache) still reads what the file holds now.
run --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
cmp "$img" "$tmpdir/copy.img" || fail "second run reads differ from the file"
if cmp -s "$img" "$tmpdir/orig.img"; then
    fail "the writes did not change the backing file"
fi
