#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: writeback with a cache much smaller than the
# data written ("dirty-full").  A 32M backing file behind a 1M cache of
# 4K pages takes random writes, zeroes, flushes and reads over two
# connections (random-io.py, checked against a model): no read may
# return wrong data, dirty pages must be written back and evicted
# (never dropped), and after a clean exit (writeback-on-exit defaults
# to true) the backing file alone must equal the model.
#
# Run 1 uses the default watermarks.  Run 2 restarts on the same cache
# with ssdcache-writeback-high=100 and a slow writeback rate, so the
# cache really fills with dirty data and writes have to wait (or go
# to the backend): still no wrong data, nothing lost.

source "$(dirname "$0")/functions.sh"
set -e -x

requires "$PYTHON" -c 'import nbd'

size=$((32 * 1024 * 1024))
random_file "$img" $size
cp "$img" "$tmpdir/model0.img"
seed="${RANDOM_IO_SEED:-$RANDOM}"

common=( file "$img"
         ssdcache-file="$cache" ssdcache-size=1M ssdcache-page-size=4K
         ssdcache-mode=writeback )
mix=read=40,write=50,zero=5,flush=5

check_stats ()
{
    local st="$1" v
    cat "$st"
    for v in dirty_lost dirty_dropped writeback_errors verify_failures; do
        [ "$(stat_get "$st" $v)" -eq 0 ] || fail "$st: $v is not 0"
    done
}

# Run 1: default watermarks.
start_ssdcache -P "$pid" -U "$sock" "${common[@]}" \
               ssdcache-stats="$tmpdir/stats1"
"$PYTHON" "$random_io" --socket "$sock" --connections 2 --depth 8 \
          --ops 2500 --seed "$seed" --mix "$mix" --max-len 256K \
          --model "$tmpdir/model0.img" --save-model "$tmpdir/model1.img" \
          --timeout 50
stop_nbdkit "$pid"
check_stats "$tmpdir/stats1"
cmp "$img" "$tmpdir/model1.img" ||
    fail "run 1: after a clean exit the backing file does not equal the model"
written="$(stat_get "$tmpdir/stats1" bytes_written)"
[ "$written" -ge $((16 * 1024 * 1024)) ] ||
    fail "run 1 wrote only $written bytes: not much more than the 1M cache"
[ "$(stat_get "$tmpdir/stats1" pages_written_back)" -gt 0 ] ||
    fail "run 1: no page was written back"
[ "$(stat_get "$tmpdir/stats1" evictions)" -gt 0 ] ||
    fail "run 1: no page was evicted"

# Run 2: the cache fills with dirty data.
start_ssdcache -P "$pid" -U "$sock" "${common[@]}" \
               ssdcache-stats="$tmpdir/stats2" \
               ssdcache-writeback-high=100 ssdcache-writeback-low=90 \
               ssdcache-writeback-idle=0 ssdcache-writeback-rate=4M
"$PYTHON" "$random_io" --socket "$sock" --connections 3 --depth 8 \
          --ops 1500 --seed "$((seed + 1))" --mix "$mix" --max-len 128K \
          --hot-fraction 0.05 \
          --model "$tmpdir/model1.img" --save-model "$tmpdir/model2.img" \
          --timeout 50
stop_nbdkit "$pid"
check_stats "$tmpdir/stats2"
cmp "$img" "$tmpdir/model2.img" ||
    fail "run 2: after a clean exit the backing file does not equal the model"
[ "$(stat_get "$tmpdir/stats2" pages_written_back)" -gt 0 ] ||
    fail "run 2: no page was written back"
full=$(stat_get "$tmpdir/stats2" write_through_full)
[ "$full" -gt 0 ] ||
    fail "run 2: the cache never filled with dirty data (write_through_full is 0)"

# Run 3: every slot holds a durable (flushed) dirty page and a client
# overwrites part of one of them.  The page can not be changed in place
# (copy on write, design invariant 4) and there is no free slot: the
# write must wait for writeback (or go to the backend), then succeed
# with the right data - not fail, not hang.
cache3="$tmpdir/small.ssdcache"
random_file "$tmpdir/small.img" $((8 * 1024 * 1024))
start_ssdcache -P "$pid" -U "$sock" \
               file "$tmpdir/small.img" ssdcache-file="$cache3" \
               ssdcache-size=1M ssdcache-page-size=64K ssdcache-mode=writeback \
               ssdcache-writeback-high=100 ssdcache-writeback-low=90 \
               ssdcache-writeback-idle=0 ssdcache-stats="$tmpdir/stats3"
nbdsh -u "$(sock_uri "$sock")" -c '
import time
h.pwrite(b"A" * (1024 * 1024), 0)        # 16 dirty pages: the whole cache
h.flush()                                 # durable on the cache
t = time.monotonic()
try:
    h.pwrite(b"B" * 1024, 4096)           # part of page 0: copy on write
except nbd.Error as e:
    raise SystemExit("FAIL: partial write to a durable dirty page in a "
                     "full cache failed after %.1f s: %s" %
                     (time.monotonic() - t, e))
took = time.monotonic() - t
print("partial write took %.2f s" % took)
assert took < 30, "partial write took %.1f s" % took
exp = bytearray(b"A" * (1024 * 1024))
exp[4096:5120] = b"B" * 1024
assert h.pread(1024 * 1024, 0) == exp, "wrong data after the write"
'
stop_nbdkit "$pid"
check_stats "$tmpdir/stats3"
cmp -n $((1024 * 1024)) "$tmpdir/small.img" <(
    head -c 4096 /dev/zero | tr '\0' A
    head -c 1024 /dev/zero | tr '\0' B
    head -c $((1024 * 1024 - 5120)) /dev/zero | tr '\0' A ) ||
    fail "run 3: the backing file does not hold the data after a clean exit"
