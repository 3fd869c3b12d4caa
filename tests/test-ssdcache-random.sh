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

requires "$PYTHON" -c 'import nbd'
requires nbdcopy --version

stats="$tmpdir/stats"
random_file "$img" $((16 * 1024 * 1024))
cp "$img" "$tmpdir/before.img"

seed="${RANDOM_IO_SEED:-$RANDOM}"
echo "random-io seed: $seed"

# Pass 1: 64K pages, three connections, reads and writes.
run_ssdcache file "$img" \
             ssdcache-file="$cache" ssdcache-size=2M ssdcache-page-size=64K \
             ssdcache-stats="$stats" \
             --run '"$PYTHON" "$random_io" --uri "$uri" --connections 3 \
                      --ops 3000 --seed '"$seed"' --max-len 300K \
                      --model "$tmpdir/before.img" \
                      --save-model "$tmpdir/expected.img" --trim-reads-zero'
cat "$stats"
cmp "$img" "$tmpdir/expected.img" ||
    fail "the backing file differs from the model after pass 1"
evictions="$(stat_get "$stats" evictions)"
[ "$evictions" -gt 0 ] || fail "evictions = $evictions, expected > 0"
hits="$(stat_get "$stats" read_hits)"
[ "$hits" -gt 0 ] || fail "read_hits = $hits, expected > 0"
writes="$(stat_get "$stats" write_ops)"
[ "$writes" -gt 0 ] || fail "write_ops = $writes, expected > 0"
[ "$(stat_get "$stats" cache_errors)" -eq 0 ] || fail "cache errors in pass 1"

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
loaded="$(stat_get "$stats" loaded_slots)"
[ "$loaded" -gt 0 ] || fail "loaded_slots = $loaded after a clean restart"

# Pass 3: small pages (4K) on a new cache file, two connections, more
# small requests so one request spans many pages.
run_ssdcache file "$img" \
             ssdcache-file="$tmpdir/small.ssdcache" ssdcache-size=512K \
             ssdcache-page-size=4K ssdcache-stats="$stats" \
             --run '"$PYTHON" "$random_io" --uri "$uri" --connections 2 \
                      --ops 2000 --seed '"$((seed + 2))"' --max-len 64K \
                      --model "$tmpdir/copy.img" \
                      --save-model "$tmpdir/expected.img" --trim-reads-zero'
cat "$stats"
cmp "$img" "$tmpdir/expected.img" ||
    fail "the backing file differs from the model after pass 3"
[ "$(stat_get "$stats" evictions)" -gt 0 ] || fail "no evictions in pass 3"
