#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: random reads and writes (plus zero, trim,
# flush and cache requests) at unaligned offsets over several
# connections, every read checked against a model of the disk.  The
# cache (2M) is much smaller than the data (16M), so eviction happens
# all the time.  Afterwards the backing file must equal the model, and
# a restarted server (warm cache) must still read exactly the file.

source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd nbdcopy

random_file "$img" $((16 * 1024 * 1024))
cp "$img" "$tmpdir/before.img"

seed="${RANDOM_IO_SEED:-$RANDOM}"
echo "random-io seed: $seed"
debug=()

# random_pass PASS MODEL RANDOM-IO-ARGS CACHE-ARGS...: random I/O
# (reads checked against MODEL) through the cache; the backing file
# must then equal the model saved in $tmpdir/expected.img.
random_pass ()
{
    local pass="$1" model="$2" io="$3"
    shift 3
    run_ssdcache "${debug[@]}" file "$img" ssdcache-stats="$stats" "$@" \
                 --run '"$PYTHON" "$random_io" --uri "$uri" '"$io"' \
                          --model "'"$model"'" \
                          --save-model "$tmpdir/expected.img" --trim-reads-zero'
    cat "$stats"
    cmp "$img" "$tmpdir/expected.img" ||
        fail "the backing file differs from the model after pass $pass"
}

# Pass 1: 64K pages, three connections, reads and writes.
random_pass 1 "$tmpdir/before.img" \
            "--connections 3 --ops 3000 --seed $seed --max-len 300K" \
            ssdcache-file="$cache" ssdcache-size=2M ssdcache-page-size=64K
expect_stat "$stats" evictions -gt 0 "pass 1"
expect_stat "$stats" read_hits -gt 0 "pass 1"
expect_stat "$stats" write_ops -gt 0 "pass 1"
expect_stat "$stats" cache_errors -eq 0 "cache errors in pass 1"

# Pass 2: restart on the same cache (warm, and must hold no stale
# page), read only, then read everything back.
cp "$img" "$tmpdir/before.img"
run_ssdcache file "$img" \
             ssdcache-file="$cache" ssdcache-stats="$stats" \
             --run '"$PYTHON" "$random_io" --uri "$uri" --connections 2 \
                      --ops 1000 --seed '"$((seed + 1))"' --mix read=1 \
                      --model "$tmpdir/before.img" &&
              nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
cat "$stats"
cmp "$img" "$tmpdir/copy.img" || fail "pass 2 read data that is not the file's"
expect_stat "$stats" loaded_slots -gt 0 "after a clean restart"

# Pass 3: small pages (4K) on a new cache file, two connections, more
# small requests so one request spans many pages.
random_pass 3 "$tmpdir/copy.img" \
            "--connections 2 --ops 2000 --seed $((seed + 2)) --max-len 64K" \
            ssdcache-file="$tmpdir/small.ssdcache" ssdcache-size=512K \
            ssdcache-page-size=4K
expect_stat "$stats" evictions -gt 0 "no evictions in pass 3"

# Pass 4: as pass 1, with the replacement policy held to one step per
# call, so that every eviction is spread over many calls that let go
# of the cache's lock in between (evict_set_step_limit), while three
# connections read, write and evict.
cp "$img" "$tmpdir/copy.img"
debug=(-D ssdcache.evict_steps=1)
random_pass 4 "$tmpdir/copy.img" \
            "--connections 3 --ops 2000 --seed $((seed + 3)) --max-len 300K" \
            ssdcache-file="$tmpdir/steps.ssdcache" ssdcache-size=2M \
            ssdcache-page-size=64K
expect_stat "$stats" evictions -gt 0 "no evictions in pass 4"
expect_stat "$stats" eviction_pauses -gt 0 "no eviction paused in pass 4"
expect_stat "$stats" cache_errors -eq 0 "cache errors in pass 4"
