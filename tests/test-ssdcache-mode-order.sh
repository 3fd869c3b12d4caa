#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a mode switch under the flush order ends
# (issue 27, item 2).
#
# With ssdcache-writeback-order=flush a zero waits, holding its range,
# for the older flush generations to reach the backend; the cleaning
# passes it waits for only try-lock ranges.  A mode switch raised a
# barrier that refused those try-locks until every range was released:
# the zero, the switch and every later request waited for each other
# for ever.  Here a slow backend (delay-write=300ms) keeps the zero
# waiting while the switch comes; the switch, the zero and an
# unrelated read must all end, and the data must be right.
source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd nbdsh
requires_filter delay

ready="$tmpdir/ready"
truncate -s 4M "$img"
mkfifo "$ready"

for to in writethrough writearound; do
    rm -f "$tmpdir/c"
    start_ssdcache -P "$pid" -U "$sock" --filter=delay file "$img" \
        delay-write=300ms ssdcache-file="$tmpdir/c" ssdcache-size=4M \
        ssdcache-page-size=64K ssdcache-mode=writeback \
        ssdcache-writeback-order=flush ssdcache-control="$ctl"
    # Twenty dirty pages, one flush (generation 1); then a zero that
    # must wait for generation 1 on the backend.  The client says when
    # the zero is on its way.
    READY="$ready" bounded 120 nbdsh -u "$(sock_uri "$sock")" -c '
import os
for p in range(20):
    h.pwrite(bytes([p + 1]) * 65536, p * 65536)
h.flush()
cookie = h.aio_zero(65536, 40 * 65536)
with open(os.environ["READY"], "w") as f:
    f.write("zeroing\n")
while not h.aio_command_completed(cookie):
    h.poll(-1)
' &
    client=$!
    read -r line < "$ready"
    ctl_bounded "$ctl" mode "$to"
    bounded 60 nbdsh -u "$(sock_uri "$sock")" -c '
assert h.pread(65536, 3 * 65536) == bytes([4]) * 65536
'
    wait $client || fail "$to: the client failed"
    bounded 60 nbdsh -u "$(sock_uri "$sock")" -c '
for p in range(20):
    assert h.pread(65536, p * 65536) == bytes([p + 1]) * 65536, p
assert h.pread(65536, 40 * 65536) == bytes(65536)
'
    stop_nbdkit "$pid"
done
