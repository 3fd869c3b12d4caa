#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a crash after a switch out of writeback never
# brings back data older than the backend (issue 27, item 3).
#
# In writeback a page is written whole and flushed (its dirty data is
# durable in slot A), then 4 KiB of it are rewritten: copy on write to
# slot B, A kept on disk until B is flushed.  A switch to writethrough
# writes B back (clean now, A still on disk).  A writethrough write
# elsewhere in the page must not rewrite B in place while A is on disk:
# were B then dropped by a crash (its rewrite is unsealed until the
# next flush), recovery would find A's dirty data, serve it and write
# it back over the backend's newer data.  After kill -9 and a restart,
# the export and the backing file must hold all three writes.
source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd nbdsh

cache="$tmpdir/c"
truncate -s 1M "$img"

nbd () { bounded 60 nbdsh -u "$(sock_uri "$sock")" -c "$1"; }

for mode in writethrough writearound; do
    rm -f "$cache"
    truncate -s 0 "$img"; truncate -s 1M "$img"
    start_ssdcache -P "$pid" -U "$sock" file "$img" \
        ssdcache-file="$cache" ssdcache-size=4M ssdcache-page-size=64K \
        ssdcache-mode=writeback ssdcache-writeback-idle=0 \
        ssdcache-writeback-high=100 ssdcache-control="$ctl"
    nbd 'h.pwrite(b"\x01" * 65536, 65536); h.flush()'
    nbd 'h.pwrite(b"\x02" * 4096, 65536)'
    ctl_bounded "$ctl" mode "$mode"
    nbd 'h.pwrite(b"\x03" * 4096, 65536 + 32768)'
    crash_nbdkit "$pid"

    start_ssdcache -P "$pid" -U "$sock" file "$img" \
        ssdcache-file="$cache" ssdcache-size=4M ssdcache-page-size=64K \
        ssdcache-mode=writethrough
    # The page at 64K as written, in $tmpdir/want.
    nbd '
import os
want = bytearray(b"\x01" * 65536)
want[0:4096] = b"\x02" * 4096
want[32768:36864] = b"\x03" * 4096
open(os.environ["tmpdir"] + "/want", "wb").write(want)
got = h.pread(65536, 65536)
assert got == bytes(want), "export: %r" % sorted(set(got))
'
    stop_nbdkit "$pid"
    cmp -n 65536 -i 65536:0 "$img" "$tmpdir/want" ||
        fail "$mode: the backing file lost a write"
done
