#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: after the cache device failed (degraded mode),
# the next start never brings back dirty data that was written back and
# then overwritten on the backend.
#
# Writeback mode, a dirty page A (flushed to the cache).  Then writes to
# the cache file fail (LD_PRELOAD shim, shim/faultio.c): a write to A
# first writes A back, but the entry saying "clean" cannot be written.
# The filter must not let newer data for A reach the backend while the
# cache file still says "A is dirty" (that old data would be written
# back over it at the next start): the write fails with EIO while the
# device refuses, and works once the entry could be rewritten.  After
# kill -9 and a restart every page reads as the last write that was
# acknowledged, and so does the backing file after a clean stop.
#
# Case 1: the device still fails at kill -9.  Case 2: it recovered
# before the next write to A.  Case 3: a FLUSH in degraded mode writes A
# back first (the entry cannot be rewritten either), then A is written.

source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd
shim="$(shim_path faultio)"

cache="$tmpdir/c"
size=$((2 * 1024 * 1024))

args=( file "$img" ssdcache-file="$cache"
       ssdcache-page-size=4K ssdcache-mode=writeback
       ssdcache-writeback-idle=0 ssdcache-writeback-high=100
       ssdcache-writeback-on-exit=false ssdcache-stats="$stats" )

# The client: case NAME.  Prints what page A (offset 0) and page B
# (offset 64K, dirty, never touched again) must read afterwards.
cat > "$tmpdir/client.py" <<'PY'
import errno, os, sys
import nbd
sock, trigger, case = sys.argv[1:4]
h = nbd.NBD(); h.connect_unix(sock)
v1, v2, b1 = b"1" * 4096, b"2" * 4096, b"B" * 4096
h.pwrite(v1, 0)
h.pwrite(b1, 65536)
h.flush()
open(trigger, "w").close()          # writes to the cache file fail now
if case == "flush":
    h.flush()                        # degraded flush: all written back
acked = v1
try:
    h.pwrite(v2, 0)
    acked = v2
    print("write of A accepted while the device fails", file=sys.stderr)
except nbd.Error as e:
    print("write of A refused while the device fails:", e, file=sys.stderr)
    if e.errno != errno.EIO and "EIO" not in str(e):
        sys.exit("expected EIO, got %s" % e)
if case == "recovers":
    os.unlink(trigger)               # the device works again
    v3 = b"3" * 4096
    h.pwrite(v3, 0)                  # must work now
    acked = v3
if h.pread(4096, 0) != acked:
    sys.exit("A does not read as the last acknowledged write")
h.flush()
open(sys.argv[4], "wb").write(acked[:1])
PY

run_case ()
{
    local case="$1" want
    truncate -s 0 "$img"
    truncate -s $size "$img"
    rm -f "$cache" "$trigger"
    export LD_PRELOAD="$shim" FAULTIO_PATH="$cache"
    export FAULTIO_TRIGGER="$trigger" FAULTIO_OPS=w
    start_ssdcache -P "$pid" -U "$sock" "${args[@]}"
    unset LD_PRELOAD
    "$PYTHON" "$tmpdir/client.py" "$sock" "$trigger" "$case" "$tmpdir/want"
    crash_nbdkit "$pid"
    rm -f "$trigger"
    want="$(cat "$tmpdir/want")"

    # Restart on the same cache file (the device works again).
    start_ssdcache -P "$pid" -U "$sock" "${args[@]/ssdcache-writeback-on-exit=false/ssdcache-writeback-on-exit=true}"
    "$PYTHON" - "$sock" "$want" <<'PY'
import sys, nbd
h = nbd.NBD(); h.connect_unix(sys.argv[1])
if h.pread(4096, 0) != sys.argv[2].encode() * 4096:
    sys.exit("after the restart A is not the last acknowledged write: "
             "stale data came back (%r)" % h.pread(8, 0))
if h.pread(4096, 65536) != b"B" * 4096:
    sys.exit("after the restart B lost its dirty data")
PY
    stop_nbdkit "$pid"
    cat "$stats"
    "$PYTHON" - "$img" "$want" <<'PY'
import sys
d = open(sys.argv[1], "rb").read()
if d[:4096] != sys.argv[2].encode() * 4096:
    sys.exit("backing file: A is not the last acknowledged write")
if d[65536:65536 + 4096] != b"B" * 4096:
    sys.exit("backing file: B was not written back")
PY
}

run_case still-failing
run_case recovers
run_case flush
