#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a backend whose size (130000 bytes) is not a
# multiple of the page size.  The size is reported exactly, the last
# partial page reads and writes correctly, reads past the end fail, and
# the backing file ends up with exactly the data written.  Done with
# 64K pages (one partial page of 64464 bytes) and 4K pages.

source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd nbdinfo nbdsh nbdcopy

size=130000
export img size

for ps in 64K 4K; do
    random_file "$img" $size
    cp "$img" "$tmpdir/before.img"
    cache="$tmpdir/odd-$ps.ssdcache"
    run ()
    {
        run_ssdcache file "$img" \
                     ssdcache-file="$cache" ssdcache-page-size=$ps "$@"
    }

    got="$(run --run 'nbdinfo --size "$uri"')"
    [ "$got" = "$size" ] || fail "page size $ps: nbdinfo --size says $got, not $size"

    # Full reads (cold, then hot), tail reads, reads past the end, tail
    # writes.
    run --run 'nbdsh -u "$uri" -c -' <<'PY'
import os
from ssdtest import expect_error
img = os.environ["img"]
size = int(os.environ["size"])
assert h.get_size() == size
disk = bytearray(open(img, "rb").read())

def check(off, n, what):
    got = h.pread(n, off)
    assert got == disk[off:off + n], "%s: read off=%d len=%d differs" % (what, off, n)

for rnd in ("cold", "warm"):
    check(0, size, rnd + " full read")
    check(size - 1, 1, rnd + " last byte")
    check(size - 100, 100, rnd + " tail")
    check(126976, size - 126976, rnd + " last 4K page")   # 130000 = 31*4096 + 3024
    check(65536, size - 65536, rnd + " last 64K page")
    check(65000, 1000, rnd + " across the 64K boundary")

for off, n in ((size - 1, 2), (size, 1), (size - 10, 4096), (size + 4096, 512)):
    expect_error("read off=%d len=%d past the end" % (off, n), h.pread, n, off)

# Writes at the tail, then read back (from the cache).
writes = [
    (size - 7, b"\x11" * 7),
    (size - 3000, bytes(range(256)) * 10),
    (126976 - 5, b"\x22" * 10),               # across the last 4K boundary
    (65536 - 100, b"\x33" * 200),             # across the 64K boundary
    (65536, bytes((i * 13) & 0xff for i in range(size - 65536))),  # whole last 64K page
]
for off, data in writes:
    h.pwrite(data, off)
    disk[off:off + len(data)] = data
    check(off, len(data), "read back after write at %d" % off)
expect_error("write past the end", h.pwrite, b"x" * 10, size - 5)
check(0, size, "full read after writes")
h.flush()
open(os.environ["tmpdir"] + "/expected.img", "wb").write(disk)
PY
    cmp "$img" "$tmpdir/expected.img" ||
        fail "page size $ps: the backing file is not what was written"
    [ "$(stat -c %s "$img")" -eq $size ] ||
        fail "page size $ps: the backing file changed size"

    # Random I/O over the tail, restart (warm), and a full read.
    cp "$img" "$tmpdir/before.img"
    run --run '"$PYTHON" "$random_io" --uri "$uri" --connections 2 \
                 --ops 500 --max-len 20000 --hot-fraction 0.1 --hot-prob 0 \
                 --model "$tmpdir/before.img" --save-model "$tmpdir/expected.img" \
                 --trim-reads-zero'
    cmp "$img" "$tmpdir/expected.img" ||
        fail "page size $ps: random I/O left the file different from the model"
    run --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
    cmp "$img" "$tmpdir/copy.img" || fail "page size $ps: warm full read differs"
done
