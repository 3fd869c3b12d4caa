#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: the cache device fails under a running server.
#
# An LD_PRELOAD shim (shim/faultio.c) makes I/O on the cache file fail
# with EIO (or ENOSPC: a full filesystem) while a trigger file exists.  The filter must switch to
# degraded mode (counter "degraded"), keep serving correct data from the
# backend, write back dirty pages it can still read, and report dirty
# pages it cannot read (EIO), never serving stale or zero data.
source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd
shim="$(shim_path faultio)"

size=$((8 * 1024 * 1024))

run_case ()                 # run_case MODE OPS FAILING-MIX EXTRA-ARGS...
{
    local mode="$1" ops="$2" mix="$3"
    shift 3
    random_file "$tmpdir/disk.img" $size
    cp "$tmpdir/disk.img" "$tmpdir/model.img"
    rm -f "$tmpdir/c" "$trigger" "$tmpdir/stats"
    export LD_PRELOAD="$shim" FAULTIO_PATH="$tmpdir/c"
    export FAULTIO_TRIGGER="$trigger" FAULTIO_OPS="$ops"
    start_ssdcache -P "$pid" -U "$sock" \
                   file "$tmpdir/disk.img" ssdcache-file="$tmpdir/c" \
                   ssdcache-size=2M ssdcache-page-size=4K ssdcache-mode="$mode" \
                   ssdcache-stats="$tmpdir/stats" "$@"
    unset LD_PRELOAD
    # Healthy for a while, then the cache device fails.
    "$PYTHON" "$random_io" --socket "$sock" --connections 2 --ops 1500 \
              --seed 1 --mix read=55,write=40,flush=5 \
              --model "$tmpdir/model.img" --save-model "$tmpdir/model.img" \
              --no-final-verify
    touch "$trigger"
    "$PYTHON" "$random_io" --socket "$sock" --connections 2 --ops 1500 \
              --seed 2 --mix "$mix" \
              --model "$tmpdir/model.img" --save-model "$tmpdir/model.img"
    rm -f "$trigger"
    # The device works again (still degraded for this run).
    "$PYTHON" "$random_io" --socket "$sock" --connections 2 --ops 500 \
              --seed 3 --mix read=50,write=40,zero=5,flush=5 \
              --model "$tmpdir/model.img" --save-model "$tmpdir/model.img"
    stop_nbdkit "$pid"
    cat "$tmpdir/stats"
    expect_stat "$tmpdir/stats" degraded -eq 1 \
        "$mode/$ops: the filter did not switch to degraded mode"
    expect_stat "$tmpdir/stats" cache_errors -gt 0 "$mode/$ops"
    cmp "$tmpdir/disk.img" "$tmpdir/model.img" ||
        fail "$mode/$ops: backing file differs from the model"
}

all=read=55,write=35,zero=5,flush=5
run_case writethrough rw $all
run_case writearound rw $all
# The cache's filesystem is full: writes to the cache file fail with
# ENOSPC (the pool is preallocated, so only another writer or a
# filesystem that cannot preallocate gets here).
export FAULTIO_ERRNO=28
run_case writethrough w $all
unset FAULTIO_ERRNO
# Writes to the cache fail, reads still work: dirty data is written
# back (by the flushes), then everything passes through.  While the
# device refuses writes, a write to a page that was dirty when it failed
# gets EIO (the cache file could not record that the page was written
# back: test-ssdcache-degraded-restart.sh), so this phase only reads
# and flushes; the writes come once the device works again.
run_case writeback w read=80,flush=20 \
         ssdcache-writeback-idle=0 ssdcache-writeback-high=100

# Dirty data that can no longer be read back is reported, not replaced.
truncate -s $size "$tmpdir/zero.img"
rm -f "$tmpdir/c" "$trigger"
export LD_PRELOAD="$shim" FAULTIO_PATH="$tmpdir/c"
export FAULTIO_TRIGGER="$trigger" FAULTIO_OPS=rw
start_ssdcache -P "$pid" -U "$sock" \
               file "$tmpdir/zero.img" ssdcache-file="$tmpdir/c" \
               ssdcache-mode=writeback ssdcache-writeback-idle=0 \
               ssdcache-writeback-high=100 ssdcache-writeback-on-exit=false \
               ssdcache-stats="$tmpdir/stats"
unset LD_PRELOAD
"$PYTHON" - "$sock" "$trigger" <<'PY'
import sys
from ssdtest import connect, expect_error
h = connect(sys.argv[1])
h.pwrite(b"D" * 65536, 0)          # dirty, only in the cache
h.flush()
open(sys.argv[2], "w").close()     # the cache device fails
expect_error("read of unreadable dirty data", h.pread, 65536, 0,
             errno="EIO")
# Clean pages still read (from the backend): zeroes.
if h.pread(4096, 1 << 20) != bytes(4096):
    sys.exit("clean page read wrong data")
PY
rm -f "$trigger"
stop_nbdkit "$pid"
cat "$tmpdir/stats"
expect_stat "$tmpdir/stats" dirty_lost -gt 0 "lost dirty data was not counted"

# Writethrough's deferred cache update (ssdcache-defer-writes) fails in
# the background thread: the page's cached copy is stale from then on
# and must never be served; the filter degrades and the backend (which
# has the write) serves it.  The first write unseals the page, so the
# second makes no entry write: its only cache-file write is the queued
# one.
random_file "$tmpdir/disk.img" $size
rm -f "$tmpdir/c" "$trigger" "$tmpdir/stats"
export LD_PRELOAD="$shim" FAULTIO_PATH="$tmpdir/c"
export FAULTIO_TRIGGER="$trigger" FAULTIO_OPS=w
start_ssdcache -P "$pid" -U "$sock" \
               file "$tmpdir/disk.img" ssdcache-file="$tmpdir/c" \
               ssdcache-stats="$tmpdir/stats"
unset LD_PRELOAD
"$PYTHON" - "$sock" "$trigger" "$tmpdir/disk.img" <<'PY'
import sys, time
from ssdtest import connect
h = connect(sys.argv[1])
off = 65536 + 4096
for o in range(0, 1 << 20, 65536):   # cached before each answer (a
    h.pread(65536, o)                #  bigger miss may be stored after)
h.pwrite(b"1" * 1024, off)
time.sleep(0.1)                    # the queued write is in the file
open(sys.argv[2], "w").close()     # the cache device refuses writes
h.pwrite(b"2" * 1024, off)
time.sleep(0.1)                    # the queued write has failed
got = h.pread(65536, 65536)
with open(sys.argv[3], "rb") as f:
    f.seek(65536)
    want = f.read(65536)
if want[4096:5120] != b"2" * 1024:
    sys.exit("the backing file does not hold the second write")
if got != want:
    sys.exit("after a deferred write failed, the page read back is not "
             "the backing file's (stale cached copy served?)")
PY
rm -f "$trigger"
stop_nbdkit "$pid"
cat "$tmpdir/stats"
expect_stat "$tmpdir/stats" writes_deferred -eq 2 \
    "the two writes were not both deferred"
expect_stat "$tmpdir/stats" degraded -eq 1 \
    "a failed deferred write did not degrade the cache"
