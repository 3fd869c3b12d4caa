#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: rewriting a page whose dirty data is durable,
# while the cache is full of dirty data and writeback is slow.
#
# The new version cannot get a slot of its own (the old one may not be
# overwritten in place: it was flushed), so it must reach the backend
# some other way, and the old cached version must never be served or
# written back over it.
source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd
truncate -s 10M "$tmpdir/disk.img"

cat > "$tmpdir/t.py" <<'PY'
import sys
import nbd
h = nbd.NBD(); h.connect_uri(sys.argv[1])
ps = 65536
for p in range(4):                     # fill the 4-slot cache, dirty
    h.pwrite(b'A' * ps, p * ps)
h.flush()                              # now durable: copy on write only
h.pwrite(b'B' * ps, 0)                 # whole page
h.pwrite(b'C' * 1024, ps + 4096)       # part of a page
if h.pread(ps, 0) != b'B' * ps:
    sys.exit("page 0 reads old data after a whole-page rewrite")
want = bytearray(b'A' * ps); want[4096:5120] = b'C' * 1024
if h.pread(ps, ps) != want:
    sys.exit("page 1 reads wrong data after a partial rewrite")
h.flush()
PY

run_ssdcache file "$tmpdir/disk.img" \
             ssdcache-file="$tmpdir/c" ssdcache-size=256K ssdcache-mode=writeback \
             ssdcache-writeback-rate=64K ssdcache-writeback-idle=0 \
             ssdcache-stats="$tmpdir/stats" \
             --run '"$PYTHON" "$tmpdir/t.py" "$uri"'
cat "$tmpdir/stats"

# After the clean exit (writeback-on-exit) the backing file is right.
"$PYTHON" - "$tmpdir/disk.img" <<'PY'
import sys
ps = 65536
d = open(sys.argv[1], 'rb').read(4 * ps)
want = bytearray(b'A' * 4 * ps)
want[0:ps] = b'B' * ps
want[ps + 4096:ps + 5120] = b'C' * 1024
if d != want:
    sys.exit("backing file is wrong after clean exit")
PY
