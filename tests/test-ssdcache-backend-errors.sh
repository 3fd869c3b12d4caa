#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: backend read and write errors in every mode.
#
# nbdkit's error filter below ssdcache (over the file plugin) fails
# backend reads, writes/zeroes, or every request, at 10 %, 50 % and
# 100 %, in writethrough, writearound, writeback with
# ssdcache-flush=cache and with ssdcache-flush=backend.  In each run a
# client checks every request against a model of the disk and the runs
# where errors are certain must show them to the client (or, in
# writeback, in writeback_errors); after the errors stop everything
# reads back right, and the backing file and a restart on the cache
# agree (backend-errors.sh-inc: run; backend-errors.py).
# Backend FLUSH errors: test-ssdcache-backend-flush-errors.sh.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdkit --filter=error null --version
source "$(dirname "$0")/backend-errors.sh-inc"

start_s=$SECONDS
errf=( --filter=error file "$img" error-file="$trigger" )
for m in writethrough:cache writearound:cache writeback:cache writeback:backend; do
    mode="${m%:*}" flush="${m#*:}"
    dargs=
    case "$mode:$flush" in
        writeback:backend)
            all_fail= wr=any-errors
            # A FLUSH that fails here waits for the writeback retry
            # (about 1 s): fewer flushes, to keep the test short.
            dargs="--ops 100 --mix read=45,write=40,zero=12,flush=3 --fua-prob 0.02" ;;
        writeback:*)       all_fail= wr= ;;
        *)                 all_fail=all-writes-fail, wr=write-errors ;;
    esac
    # (writeback: a write completes in the cache, so backend write
    # errors do not fail client writes, except with flush=backend where
    # FLUSH and FUA writes write back first.  The error filter cannot
    # fail FLUSH itself: test-ssdcache-backend-flush-errors.sh does.)
    run "all requests 10%" "$mode" "$flush" any-errors "$dargs" -- \
        "${errf[@]}" error=EIO error-rate=10%
    run "reads 50%" "$mode" "$flush" read-errors "$dargs" -- \
        "${errf[@]}" error-pread=EIO error-pread-rate=50%
    run "writes 50%" "$mode" "$flush" "$wr" "$dargs" -- \
        "${errf[@]}" error-pwrite=EIO error-pwrite-rate=50% \
        error-zero=EIO error-zero-rate=50% error-trim=EIO error-trim-rate=50%
    run "all requests 100%" "$mode" "$flush" \
        "${all_fail}read-errors,backing-unchanged" "--ops 150 $dargs" -- \
        "${errf[@]}" error=EIO error-rate=100%
done
echo "total: $((SECONDS - start_s)) s"
