#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a writeback write that does not fit beside
# the flush order's older versions goes around the cache in one piece.
#
# With ssdcache-writeback-order=flush, a page rewritten after a client
# flush keeps its older version until the backend has that flush.
# Those slots cannot be evicted, like dirty ones; when they were not
# counted, a write with more new pages than evictable slots went into
# the cache page by page, and each page that found no slot went to the
# backend by itself, waiting for the flush order each time (found by
# check-chaos: a 200 KiB zero over a slow backend took minutes).
#
# Here the backend refuses writes (nbdkit's error filter), so that
# nothing older is written back and the 16-slot cache keeps 4 dirty
# pages and 8 older versions; then an 8-page write comes.  It must go
# around (write_through_full), adding no dirty page; it fails, as the
# backend does.
source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd nbdsh
requires_filter error

errfile="$tmpdir/backend-fails"
truncate -s 8M "$img"
touch "$errfile"

start_ssdcache -P "$pid" -U "$sock" --filter=error file "$img" \
    error-pwrite=EIO error-pwrite-rate=100% error-pwrite-file="$errfile" \
    ssdcache-file="$tmpdir/c" ssdcache-size=1M ssdcache-page-size=64K \
    ssdcache-mode=writeback ssdcache-writeback-order=flush \
    ssdcache-writeback-idle=0 ssdcache-writeback-seq-cutoff=0 \
    ssdcache-control="$ctl"

# Pages 0-3 written and flushed three times: 4 dirty, 8 older kept.
bounded 60 nbdsh -u "$(sock_uri "$sock")" -c '
for g in range(3):
    for p in range(4):
        h.pwrite(bytes([g + 1]) * 65536, p * 65536)
    h.flush()
'
ctl_bounded "$ctl" stats > "$tmpdir/before"
expect_stat "$tmpdir/before" dirty_pages -eq 4 \
    "expected 4 dirty pages before the big write"

bounded 60 nbdsh -u "$(sock_uri "$sock")" -c '
from ssdtest import expect_error
expect_error("the write while the backend fails", h.pwrite,
             b"\x09" * (8 * 65536), 32 * 65536)
'
ctl_bounded "$ctl" stats > "$tmpdir/after"
cat "$tmpdir/after"
expect_stat "$tmpdir/after" write_through_full -eq 1 \
    "the write should have gone around the cache, once"
expect_stat "$tmpdir/after" dirty_pages -eq 4 \
    "the write dirtied pages in the cache: it went in page by page"

# The backend works again: everything reaches it, the data is right.
rm -f "$errfile"
bounded 60 nbdsh -u "$(sock_uri "$sock")" -c '
h.pwrite(b"\x09" * (8 * 65536), 32 * 65536)
h.flush()
for p in range(4):
    assert h.pread(65536, p * 65536) == bytes([3]) * 65536, p
assert h.pread(8 * 65536, 32 * 65536) == b"\x09" * (8 * 65536)
'
stop_nbdkit "$pid"
cmp -n 262144 "$img" <(for p in 0 1 2 3; do
    head -c 65536 /dev/zero | tr '\0' '\3'; done) ||
    fail "the backing file lacks the flushed pages"
