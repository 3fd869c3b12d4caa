#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: writeback with ssdcache-flush=cache keeps
# flushed data durable on the cache alone.  Nothing is written back
# (ssdcache-writeback-high=100, ssdcache-writeback-idle=0): after
# FLUSH (or a FUA write) and kill -9, the backing file must still be
# untouched (so the data really was only in the cache), a restart must
# serve the new data from the cache, and a clean exit (writeback-on-
# exit=true) must put it in the backing file.  A restart in
# writethrough or writearound mode must write the dirty data back
# before it serves anything.

source "$(dirname "$0")/functions.sh"
set -e -x

requires "$PYTHON" -c 'import nbd'
requires nbdcopy --version

size=$((8 * 1024 * 1024))
random_file "$img" $size
uri="$(sock_uri "$sock")"

# The cache is as big as the backend: no slot is ever short, so
# nothing is written back for want of room either.
geometry=( file "$img" ssdcache-file="$cache"
           ssdcache-size=8M ssdcache-page-size=64K )
wb=( ssdcache-mode=writeback ssdcache-flush=cache
     ssdcache-writeback-high=100 ssdcache-writeback-idle=0 )

# write_flush SEED EXPECTED: writes (a 1 KiB sector write, unaligned
# ones, whole pages, one across pages), then FLUSH, then a FUA write;
# EXPECTED gets the resulting contents.  Then one more write that is
# never flushed (it may or may not survive: it is left out of
# EXPECTED, so it goes to a region the checks skip: the last 64K).
write_flush ()
{
    SEED="$1" EXP="$2" IMG="$img" nbdsh -u "$uri" -c '
import os, random
rng = random.Random(int(os.environ["SEED"]))
exp = bytearray(open(os.environ["IMG"], "rb").read())
def w(off, n, flags=0):
    data = rng.randbytes(n)
    h.pwrite(data, off, flags)
    exp[off:off + n] = data
w(5 * 1024, 1024)                 # one sector-aligned 1 KiB
w(100000, 70000)                  # unaligned, across pages
w(1024 * 1024, 3 * 65536)         # whole pages
w(2 * 1024 * 1024 + 7, 1)         # one byte
for i in range(20):               # more, at random
    n = rng.randint(1, 100000)
    w(rng.randint(3 * 1024 * 1024, 7 * 1024 * 1024 - n), n)
h.flush()
w(7 * 1024 * 1024 + 333, 5000, nbd.CMD_FLAG_FUA)
h.pwrite(b"unflushed" * 100, 8 * 1024 * 1024 - 65536)
open(os.environ["EXP"], "wb").write(exp)
'
}

# same_but_tail A B: equal except maybe the last 64K.
same_but_tail ()
{
    cmp -n $((size - 65536)) "$1" "$2"
}

# -- flush=cache, kill -9, restart in writeback mode ---------------------

cp "$img" "$tmpdir/orig.img"
start_ssdcache -P "$pid" -U "$sock" "${geometry[@]}" "${wb[@]}"
write_flush 1 "$tmpdir/exp1.img"
crash_nbdkit "$pid"
cmp "$img" "$tmpdir/orig.img" ||
    fail "the backing file changed: the data was written back, so this does not test durability on the cache"

start_ssdcache -P "$pid" -U "$sock" "${geometry[@]}" "${wb[@]}" \
               ssdcache-stats="$tmpdir/stats1"
nbdcopy --no-extents "$uri" "$tmpdir/copy.img"
same_but_tail "$tmpdir/copy.img" "$tmpdir/exp1.img" ||
    fail "after FLUSH and kill -9 the restarted server lost flushed data"
cmp "$img" "$tmpdir/orig.img" ||
    fail "the backing file changed on a writeback-mode restart"
# Clean exit: writeback-on-exit is true by default.
stop_nbdkit "$pid"
cat "$tmpdir/stats1"
[ "$(stat_get "$tmpdir/stats1" dirty_lost)" -eq 0 ] || fail "dirty_lost is not 0"
same_but_tail "$img" "$tmpdir/exp1.img" ||
    fail "after a clean exit the backing file lacks the flushed data"
cmp "$img" "$tmpdir/copy.img" ||
    fail "after a clean exit the backing file differs from what was served"

# -- the same, restart in writethrough (then writearound) mode ------------

for mode in writethrough writearound; do
    cp "$img" "$tmpdir/orig.img"
    start_ssdcache -P "$pid" -U "$sock" "${geometry[@]}" "${wb[@]}"
    write_flush 2 "$tmpdir/exp2.img"
    crash_nbdkit "$pid"
    cmp "$img" "$tmpdir/orig.img" ||
        fail "the backing file changed before the $mode restart"

    start_ssdcache -P "$pid" -U "$sock" "${geometry[@]}" \
                   ssdcache-mode=$mode ssdcache-stats="$tmpdir/stats-$mode"
    # nbdkit writes its pidfile before the filter's .after_fork (where
    # the dirty data is written back) and serves nothing until that
    # returns: once one request is answered, the data must be there.
    nbdsh -u "$uri" -c 'h.pread(512, 0)'
    same_but_tail "$img" "$tmpdir/exp2.img" ||
        fail "a restart in $mode mode serves before writing back the dirty data"
    nbdcopy --no-extents "$uri" "$tmpdir/copy.img"
    cmp "$tmpdir/copy.img" "$img" ||
        fail "$mode restart: served data differs from the backing file"
    stop_nbdkit "$pid"
    cat "$tmpdir/stats-$mode"
    [ "$(stat_get "$tmpdir/stats-$mode" pages_written_back)" -gt 0 ] ||
        fail "$mode restart: pages_written_back is 0"
    [ "$(stat_get "$tmpdir/stats-$mode" dirty_lost)" -eq 0 ] ||
        fail "$mode restart: dirty_lost is not 0"
done
