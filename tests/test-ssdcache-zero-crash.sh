#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a zero or trim that reached the backend never
# leaves an older cached copy behind, not even after kill -9 before the
# request was answered.
#
# A zero or trim of whole pages goes to the backend and the cached
# copies go.  Were they dropped after the backend call, a crash between
# the two would leave a copy that verifies but is older than the
# backend: the export would serve it and, once it is evicted, change
# under the client without a write (check-chaos: "restarted in
# writethrough mode after kill -9: the backing file differs from the
# export").  The backend here is the eval plugin over a file: its zero
# and trim write zeroes, then, while the FIFO $zeroed exists, say so
# through it and wait for $release to reach its end (the test holds it
# open); the test kills nbdkit there.  After a restart the page must
# read as the backing file.  Clean cached pages, in writethrough and in
# writeback (zero.c), zero and trim; and in writeback a page with dirty
# and clean sectors ("mixed"), which must be written back and dropped
# before the backend call: recovered after the crash, its clean
# sectors would be older than the backend.

source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd
requires nbdkit eval --version

zeroed="$tmpdir/zeroed"
release="$tmpdir/release"

zeroes="dd if=/dev/zero of='$img' bs=64K seek=\$4 count=\$3 oflag=seek_bytes iflag=count_bytes conv=notrunc status=none"
park="if [ -p '$zeroed' ]; then echo > '$zeroed'; cat '$release' > /dev/null; fi"
backend=( eval
          get_size="stat -c %s '$img'"
          pread="dd if='$img' bs=64K skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none"
          pwrite="dd of='$img' bs=64K seek=\$4 oflag=seek_bytes iflag=fullblock conv=notrunc status=none"
          can_write='exit 0' can_flush='exit 0' flush='exit 0'
          can_zero='exit 0' zero="$zeroes; $park"
          can_trim='exit 0' trim="$zeroes; $park" )

run_case ()
{
    local mode="$1" op="$2" mixed="${3:-}"
    # (No writeback in the background: the dirty sector stays dirty.)
    local args=( "${backend[@]}" ssdcache-file="$cache"
                 ssdcache-page-size=4K ssdcache-mode="$mode"
                 ssdcache-writeback-idle=0 ssdcache-writeback-high=100 )

    rm -f "$cache" "$zeroed" "$release"
    "$PYTHON" -c 'import sys; open(sys.argv[1], "wb").write(b"X" * 65536)' "$img"
    start_ssdcache -P "$pid" -U "$sock" "${args[@]}"
    mkfifo "$zeroed" "$release"
    exec 4<> "$release"                    # the backend waits until closed
    # One connection throughout: the last one to close writes back.
    "$PYTHON" - "$sock" "$op" "$mixed" <<'PY' &
import sys, nbd
h = nbd.NBD(); h.connect_unix(sys.argv[1])
if h.pread(4096, 4096) != b"X" * 4096:     # page 1 cached now
    sys.exit("page 1 does not read as the backing file")
if sys.argv[3]:
    h.pwrite(b"D" * 512, 4096)             # one dirty sector, 7 clean
h.flush()
try:
    if sys.argv[2] == "zero":
        h.zero(4096, 4096)
    else:
        h.trim(4096, 4096)
except nbd.Error:
    pass                                   # killed under it
PY
    local client=$!
    # Once the backend has zeroed page 1 (the cache has not answered):
    bounded 60 head -c1 "$zeroed" > /dev/null
    crash_nbdkit "$pid"
    rm -f "$zeroed"
    exec 4>&-                              # the parked backend ends
    wait "$client" || true

    start_ssdcache -P "$pid" -U "$sock" "${args[@]}"
    "$PYTHON" - "$sock" "$img" "$mode $op" "$mixed" <<'PY'
import sys, nbd
h = nbd.NBD(); h.connect_unix(sys.argv[1])
back = open(sys.argv[2], "rb").read()[4096:8192]
# (A dirty sector 0 may be ahead of the backend; the others may not.)
got = h.pread(4096, 4096)
for i in range(1 if sys.argv[4] else 0, 8):
    if got[i * 512:(i + 1) * 512] != back[i * 512:(i + 1) * 512]:
        sys.exit("%s: after kill -9 the cache serves an older copy of "
                 "page 1 (sector %d) than the backend holds"
                 % (sys.argv[3], i))
if back != bytes(4096):
    sys.exit("%s: the backend was not zeroed" % sys.argv[3])
PY
    stop_nbdkit "$pid"
}

for mode in writethrough writeback; do
    for op in zero trim; do
        run_case "$mode" "$op"
    done
done
run_case writeback zero mixed
run_case writeback trim mixed
