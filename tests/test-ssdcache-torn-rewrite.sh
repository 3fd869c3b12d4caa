#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a cache-file write that fails in the middle of
# a rewrite in place neither hangs nor loses the write (issue 27,
# item 1).
#
# An LD_PRELOAD shim fails 8 KiB writes to the cache file with ENOSPC
# (a sparse cache file on a full file system): the entry that unseals
# a cached page is written, its data is not.  The slot may then be
# torn and must be dropped; dropping it settles its older versions,
# which syncs the cache file as a client flush does, and that must not
# wait for the rewrite's own hold on c->inplace.  The write, a flush
# and a read after it must all end, with the data right.
source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd nbdsh
shim="$(shim_path faultio)"

cache="$tmpdir/c"

nbd () { bounded 60 nbdsh -u "$(sock_uri "$sock")" -c "$1"; }

random_file "$img" $((1024 * 1024))
cp "$img" "$tmpdir/model.img"
export LD_PRELOAD="$shim" FAULTIO_PATH="$cache" FAULTIO_TRIGGER="$trigger"
export FAULTIO_SIZES=8192 FAULTIO_ERRNO=28 FAULTIO_OPS=w
start_ssdcache -P "$pid" -U "$sock" file "$img" \
    ssdcache-file="$cache" ssdcache-size=4M ssdcache-page-size=64K \
    ssdcache-mode=writeback ssdcache-writeback-idle=0 \
    ssdcache-writeback-high=100 ssdcache-control="$ctl" \
    ssdcache-stats="$tmpdir/stats"
unset LD_PRELOAD
# A durable dirty page, then a copy of it (copy on write).
nbd 'h.pwrite(b"\x01" * 65536, 65536); h.flush()'
nbd 'h.pwrite(b"\x02" * 4096, 65536)'
ctl_bounded "$ctl" mode writethrough
# Rewrites of the cached clean page in place, the second failing.
nbd 'h.pwrite(b"\x03" * 4096, 65536 + 4096)'
touch "$trigger"
nbd 'h.pwrite(b"\x04" * 8192, 65536 + 16384); h.flush()'
rm "$trigger"
# The page at 64K as written, in $tmpdir/want.
nbd '
import os
want = bytearray(b"\x01" * 65536)
want[0:4096] = b"\x02" * 4096
want[4096:8192] = b"\x03" * 4096
want[16384:24576] = b"\x04" * 8192
open(os.environ["tmpdir"] + "/want", "wb").write(want)
got = h.pread(65536, 65536)
assert got == bytes(want), "export: %r" % sorted(set(got))
h.flush()
'
stop_nbdkit "$pid"
cat "$tmpdir/stats"
expect_stat "$tmpdir/stats" cache_errors -gt 0 \
    "the failing cache write was not reached"
cmp -n 65536 -i 65536:0 "$img" "$tmpdir/want" ||
    fail "the backing file lost a write"
