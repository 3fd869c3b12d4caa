#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a writethrough rewrite whose deferred cache
# write failed is never sealed, not even at close.
#
# Writethrough queues small rewrites of a cached page (io/defer.c): the
# slot is unsealed on disk first, the backend gets the data, and the
# new bytes reach the cache file a moment later.  When that late write
# fails the cache degrades and the slot keeps its older bytes on disk.
# At a clean stop nothing may seal that slot: a checksum computed from
# the older bytes would verify, and the next start would serve them
# although the backend holds the newer write.  (Found by check-chaos:
# "after a clean restart in writethrough mode ... lost completed
# writes".)
#
# Here the shim (shim/faultio.c) fails the cache file's 512-byte writes
# only: the unsealing entry (64 bytes) and the fill (a whole page) go
# through, the queued 512-byte rewrite does not.  After a clean stop
# and a restart without the shim, the page must read as the backend.

source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd
shim="$(shim_path faultio)"

truncate -s 1M "$img"

# Buffered even under make check-direct: direct I/O writes whole 4 KiB
# blocks, and the shim tells the writes apart by their size.
args=( file "$img" ssdcache-file="$cache" ssdcache-page-size=4K
       ssdcache-mode=writethrough ssdcache-direct=false )

export LD_PRELOAD="$shim" FAULTIO_PATH="$cache"
export FAULTIO_TRIGGER="$trigger" FAULTIO_OPS=w FAULTIO_SIZES=512
start_ssdcache -P "$pid" -U "$sock" "${args[@]}" 2> "$log"
unset LD_PRELOAD

"$PYTHON" - "$sock" "$trigger" <<'PY'
import sys, nbd
sock, trigger = sys.argv[1:3]
h = nbd.NBD(); h.connect_unix(sock)
h.pwrite(b"O" * 4096, 0)            # whole page: cached after the backend
h.flush()
if h.pread(4096, 0) != b"O" * 4096:
    sys.exit("page 0 does not read back")
open(trigger, "w").close()          # 512-byte cache writes fail now
h.pwrite(b"N" * 512, 512)           # queued rewrite: fails later
h.flush()                           # the queue is written out by now
want = b"O" * 512 + b"N" * 512 + b"O" * 3072
if h.pread(4096, 0) != want:
    sys.exit("page 0 is not the write just acknowledged")
h.shutdown()
PY

stop_nbdkit "$pid"
cat "$log"
grep -q "writing deferred data" "$log" ||
    fail "the queued rewrite did not fail: the test proves nothing"
rm -f "$trigger"

start_ssdcache -P "$pid" -U "$sock" "${args[@]}"
"$PYTHON" - "$sock" <<'PY'
import sys, nbd
h = nbd.NBD(); h.connect_unix(sys.argv[1])
want = b"O" * 512 + b"N" * 512 + b"O" * 3072
got = h.pread(4096, 0)
if got != want:
    sys.exit("after a clean restart page 0 is not the backend's data: "
             "sector 1 reads %r" % got[512:520])
PY
stop_nbdkit "$pid"
