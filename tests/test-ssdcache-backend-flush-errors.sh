#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: backend FLUSH errors in every mode.
#
# nbdkit 1.32's error filter cannot fail flushes, so the backend is
# nbdkit's eval plugin serving a file with dd, whose flush fails while
# the trigger file exists.  In writethrough, writearound and writeback
# with ssdcache-flush=backend every client FLUSH must fail (EIO); in
# writeback the failed flushes hold writeback back (writeback_errors).
# Every request is checked against a model of the disk, and after the
# errors stop everything reads back right, and the backing file and a
# restart on the cache agree (backend-errors.sh-inc: run;
# backend-errors.py).

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdkit eval --version
requires dd --version
source "$(dirname "$0")/backend-errors.sh-inc"

start_s=$SECONDS
evalb=( eval
        get_size="stat -c %s '$img'"
        pread="dd if='$img' bs=64K skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none"
        pwrite="dd of='$img' bs=64K seek=\$4 oflag=seek_bytes iflag=fullblock conv=notrunc status=none"
        can_write='exit 0'
        can_flush='exit 0'
        flush="if [ -e '$trigger' ]; then echo 'EIO injected flush error' >&2; exit 1; fi" )
# (no zero: nbdkit turns zeroes into writes)
for m in writethrough:cache writearound:cache writeback:cache writeback:backend; do
    mode="${m%:*}" flush="${m#*:}"
    dargs="--ops 120 --max-len 32768 --fua-prob 0.2"
    case "$mode:$flush" in
        writeback:cache)   exp= ;;
        writeback:backend) exp=all-flushes-fail
                           dargs="--ops 60 --max-len 32768 --fua-prob 0.05 --mix read=45,write=45,flush=10" ;;
        *)                 exp=all-flushes-fail ;;
    esac
    run "flush 100%" "$mode" "$flush" "$exp" "$dargs" -- "${evalb[@]}"
    if [ "$mode" = writeback ]; then
        # Flush failures hold writeback back too.
        [ "$(stat_get "$stats" writeback_errors)" -gt 0 ] ||
            fail "flush errors: $mode flush=$flush: writeback_errors is 0"
    fi
done
echo "total: $((SECONDS - start_s)) s"
