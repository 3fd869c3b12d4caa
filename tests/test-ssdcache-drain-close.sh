#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a drain that waits while the export's last
# connection closes (issue 27, item 7).
#
# An export attached by its connections stops its writeback thread
# when the last one closes.  A "ctl drain --wait" waiting for that
# thread at that moment must get an answer (done, or an error), and the
# thread's state must not be freed under it (a use after free: the
# sanitizer phase of scripts/test reports it).  nbdkit must then still
# serve and stop cleanly.
source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd nbdsh
requires_filter delay

dir="$tmpdir/images"
mkdir "$dir"
truncate -s 4M "$dir/a.img"
mkfifo "$tmpdir/written" "$tmpdir/end"

start_ssdcache -P "$pid" -U "$sock" --filter=delay file dir="$dir" \
    delay-write=10ms ssdcache-file="$tmpdir/c" ssdcache-size=8M \
    ssdcache-mode=writeback ssdcache-writeback-idle=0 \
    ssdcache-writeback-high=100 ssdcache-writeback-depth=1 \
    ssdcache-control="$ctl"
for i in $(seq 10); do
    WRITTEN="$tmpdir/written" END="$tmpdir/end" I=$i \
    nbdsh -u "nbd+unix:///a.img?socket=$sock" -c '
import os
for p in range(32):
    h.pwrite(bytes([int(os.environ["I"])]) * 65536, p * 65536)
open(os.environ["WRITTEN"], "w").write("written\n")
open(os.environ["END"]).read()
' &
    client=$!
    read -r _ < "$tmpdir/written"
    bounded 60 "$SSDCACHE_TOOL" ctl "$ctl" drain --wait > "$tmpdir/drain" 2>&1 &
    drain=$!
    echo > "$tmpdir/end"        # the last connection closes meanwhile
    wait $client
    wait $drain || true          # done, or "writeback failed"
    cat "$tmpdir/drain"
    kill -0 "$(cat "$pid")" || fail "nbdkit died (iteration $i)"
done
nbdsh -u "nbd+unix:///a.img?socket=$sock" -c '
assert h.pread(65536, 31 * 65536) == bytes([10]) * 65536
'
stop_nbdkit "$pid"
