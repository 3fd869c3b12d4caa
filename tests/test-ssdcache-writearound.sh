#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter, ssdcache-mode=writearound: writes go to the
# backing file and the cached copies are dropped, so a read after a
# write returns the new data (never the cached old data), also after
# a restart; random I/O over two connections matches the model.

source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd nbdsh nbdcopy
requires_filter stats

size=$((4 * 1024 * 1024))
random_file "$img" $size
export img

run ()
{
    rm -f "$stats" "$bstats"
    run_ssdcache --filter=stats file "$img" \
                 statsfile="$bstats" ssdcache-file="$cache" ssdcache-mode=writearound \
                 ssdcache-stats="$stats" "$@"
}

run --run 'nbdsh -u "$uri" -c -' <<'PY'
import os
from ssdtest import expect_export, expect_file
img = os.environ["img"]

# Fill the cache with the first 2M, read it again (hits); in 64K reads,
# which are cached before their answers (bigger misses may be after).
old = b"".join(h.pread(65536, o) for o in range(0, 2 * 1024 * 1024, 65536))
expect_file(img, 0, old, "the first 2M read are not the file's")
assert h.pread(len(old), 0) == old

# Unaligned write over cached pages; the backing file has it at once.
new = bytes((i * 31 + 7) & 0xff for i in range(300000))
off = 100001
h.pwrite(new, off)
expect_file(img, off, new, "write did not reach the backing file")
got = h.pread(len(new) + 2000, off - 1000)
exp = old[off - 1000:off] + new + old[off + len(new):off + len(new) + 1000]
assert got == exp, "read after write returned stale data"
# Small write inside a single cached page, with FUA.
if h.can_fua():
    h.pwrite(b"\x5a" * 100, 70000, nbd.CMD_FLAG_FUA)
else:
    h.pwrite(b"\x5a" * 100, 70000)
assert h.pread(100, 70000) == b"\x5a" * 100
expect_file(img, 70000, b"\x5a" * 100, "small FUA write")
# Whole-page write on a cached page.
h.pwrite(b"\xc3" * 65536, 1024 * 1024)
assert h.pread(65536, 1024 * 1024) == b"\xc3" * 65536
# The whole disk reads as the file now.
expect_export(h, img, "disk differs from the file")
h.flush()
PY
cat "$stats" "$bstats"
expect_stat "$stats" pages_invalidated -gt 0 "writearound invalidated no page"
expect_stat "$stats" read_hits -gt 0

# Restart: the dropped pages must not come back from the cache file.
run --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
cat "$stats" "$bstats"
cmp "$img" "$tmpdir/copy.img" || fail "after a restart stale cached data was served"

# The invalidation must reach the cache file: cache everything, write
# over cached pages and stop without reading them again; after a
# restart the new data must be read, not the old cached copies.
run --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
run --run 'nbdsh -u "$uri" -c -' <<'PY'
h.pwrite(b"\xee" * 200000, 500001)                 # partial + whole pages
h.pwrite(b"\xdd" * 65536, 2 * 1024 * 1024)         # exactly one page
h.pwrite(b"\xcc" * 10, 3 * 1024 * 1024 + 7)        # inside one page
PY
run --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
cmp "$img" "$tmpdir/copy.img" ||
    fail "after a restart, pages overwritten in writearound mode were served stale"

# Random I/O, two connections, writearound.
cp "$img" "$tmpdir/before.img"
run --run '"$PYTHON" "$random_io" --uri "$uri" --connections 2 --ops 1500 \
             --model "$tmpdir/before.img" --save-model "$tmpdir/expected.img" \
             --trim-reads-zero'
cat "$stats"
cmp "$img" "$tmpdir/expected.img" || fail "backing file differs from the model"
run --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
cmp "$img" "$tmpdir/copy.img" || fail "after random writearound I/O and a restart the data differs"
