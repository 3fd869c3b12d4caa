#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: "ssdcache ctl SOCK mode writethrough" answers
# OK only once the backend has every write, even when asked again.
#
# A switch out of writeback writes the dirty data back.  When that
# fails (here nbdkit's error filter fails every backend write while a
# trigger file exists), the command reports the error and the cache is
# in writethrough with its dirty data still to go back.  Asked again,
# the command must write that data back (and fail again while the
# backend fails) rather than answer OK because the mode is already
# writethrough: a user, or check-chaos, takes OK to mean the backing
# file alone is current (found by check-chaos, writeback/offset).

source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd
requires_filter error

cache="$tmpdir/c"
ctl="$tmpdir/ctl"
truncate -s 1M "$img"

start_ssdcache -P "$pid" -U "$sock" --filter=error file "$img" \
               error-pwrite=EIO error-pwrite-rate=100% error-file="$trigger" \
               ssdcache-file="$cache" ssdcache-page-size=4K \
               ssdcache-mode=writeback ssdcache-writeback-idle=0 \
               ssdcache-writeback-high=100 ssdcache-control="$ctl"

write_flush "$sock" 0 8192 W

touch "$trigger"                          # the backend refuses writes
for attempt in 1 2; do
    if out="$(ctl_bounded "$ctl" mode writethrough 2>&1)"; then
        fail "mode writethrough (attempt $attempt) answered OK while" \
             "the dirty data could not be written back: $out"
    fi
    echo "$out"
done
rm "$trigger"                             # the backend works again
ctl_bounded "$ctl" mode writethrough
cmp -n 8192 "$img" <("$PYTHON" -c 'import sys; sys.stdout.buffer.write(b"W" * 8192)') ||
    fail "mode writethrough answered OK, but the backing file lacks the write"
stop_nbdkit "$pid"
