#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: ssdcache-direct=true (O_DIRECT on the cache
# file), over a cache file on disk ($tmpdir is under /var/tmp).
#
#  1. writethrough, 64K pages and a cache 1/8 of the data (evictions):
#     random I/O checked against a model; the cache file descriptor of
#     the running server really has O_DIRECT (/proc/PID/fdinfo);
#  2. a clean restart with direct I/O serves every byte warm and right;
#  3. writeback with 4K pages (512-byte sectors: sub-block writes, so
#     read-modify-write of data and of every page-table entry), 3
#     connections, then a clean stop: the backing file holds every write;
#  4. the writeback kill -9 crash test with direct I/O;
#  5. a file system that refuses O_DIRECT (an LD_PRELOAD shim) stops
#     nbdkit at start with a message naming ssdcache-direct, and the
#     same cache opens without it.
source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd nbdcopy

size=$((16 * 1024 * 1024))
seed="${RANDOM_IO_SEED:-$RANDOM}"
echo "random-io seed: $seed"

# The open flags of the descriptor of PID open on FILE, in octal.
fd_flags ()
{
    local p="$1" f="$2" fd
    for fd in /proc/"$p"/fd/*; do
        if [ "$(readlink "$fd")" = "$f" ]; then
            awk '$1 == "flags:" { print $2 }' /proc/"$p"/fdinfo/"${fd##*/}"
            return 0
        fi
    done
    return 1
}

# -- 1. writethrough, random I/O -----------------------------------------
random_file "$img" $size
cp "$img" "$tmpdir/before.img"
start_ssdcache -P "$pid" -U "$sock" file "$img" \
               ssdcache-file="$cache" ssdcache-size=2M ssdcache-page-size=64K \
               ssdcache-direct=true ssdcache-stats="$stats"
flags="$(fd_flags "$(cat "$pid")" "$cache")" ||
    fail "nbdkit has no descriptor open on $cache"
# O_DIRECT is 040000 on x86, 0200000 on arm64/ppc: ask Python.
odirect="$("$PYTHON" -c 'import os; print(os.O_DIRECT)')"
(( 8#$flags & odirect )) ||
    fail "the cache file is open without O_DIRECT (flags $flags)"
"$PYTHON" "$random_io" --socket "$sock" --connections 3 --ops 3000 \
          --seed "$seed" --max-len 300K --model "$tmpdir/before.img" \
          --save-model "$tmpdir/expected.img" --trim-reads-zero
stop_nbdkit "$pid"
cat "$stats"
cmp "$img" "$tmpdir/expected.img" ||
    fail "writethrough: the backing file differs from the model"
expect_stat "$stats" evictions -gt 0 "writethrough"
expect_stat "$stats" read_hits -gt 0 "writethrough"
expect_stat "$stats" cache_errors -eq 0 "writethrough"
expect_stat "$stats" degraded -eq 0 "writethrough"

# -- 2. warm restart -------------------------------------------------------
run_ssdcache file "$img" ssdcache-file="$cache" \
             ssdcache-direct=true ssdcache-stats="$stats" \
             --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
cat "$stats"
cmp "$img" "$tmpdir/copy.img" || fail "the restarted cache served wrong data"
expect_stat "$stats" loaded_slots -gt 0 "not warm after restart"
expect_stat "$stats" read_hits -gt 0 "no hits after restart"
expect_stat "$stats" cache_errors -eq 0 "warm restart"

# -- 3. writeback, 4K pages, sub-block writes --------------------------------
rm -f "$cache"
cp "$img" "$tmpdir/before.img"
run_ssdcache file "$img" ssdcache-file="$cache" \
             ssdcache-size=1M ssdcache-page-size=4K ssdcache-mode=writeback \
             ssdcache-direct=true ssdcache-stats="$stats" \
             --run '"$PYTHON" "$random_io" --uri "$uri" --connections 3 \
                      --ops 3000 --seed '"$((seed + 1))"' --max-len 20K \
                      --mix read=50,write=40,zero=5,flush=4,cache=1 \
                      --model "$tmpdir/before.img" \
                      --save-model "$tmpdir/expected.img"'
cat "$stats"
cmp "$img" "$tmpdir/expected.img" ||
    fail "writeback: the backing file differs from the model after a clean stop"
expect_stat "$stats" pages_written_back -gt 0 "writeback"
expect_stat "$stats" cache_errors -eq 0 "writeback"
expect_stat "$stats" degraded -eq 0 "writeback"

# -- 4. writeback crash test -------------------------------------------------
"$PYTHON" "$testsrcdir/crash-writeback.py" --direct \
          --iterations "${CRASH_DIRECT_ITERATIONS:-5}" --seed "$seed" \
          --filter "$SSDCACHE_FILTER" --workdir "$tmpdir/crash"
rm -rf "$tmpdir/crash"

# -- 5. a file system without direct I/O -----------------------------------
shim="$(shim_path nodirect)"
LD_PRELOAD="$shim" NODIRECT_PATH="$cache" \
    expect_ssdcache_failure "ssdcache-direct: .*does not support direct I/O" \
    file "$img" ssdcache-file="$cache" ssdcache-direct=true
LD_PRELOAD="$shim" NODIRECT_PATH="$cache" \
    run_ssdcache file "$img" ssdcache-file="$cache" ssdcache-direct=false \
    --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
cmp "$img" "$tmpdir/copy.img" || fail "wrong data without direct I/O"
