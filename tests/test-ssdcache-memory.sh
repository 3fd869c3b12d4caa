#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter over the memory plugin (a backend that starts
# empty): random writes, zeroes, trims and reads over two connections
# match the model, with a fresh cache file each time (a memory disk
# can not be told apart from its previous incarnation).

source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd
requires nbdkit memory --version

seed="${RANDOM_IO_SEED:-$RANDOM}"

# Big cache (nothing evicted) then small cache (eviction).
for cs in 10M 1M; do
    rm -f "$tmpdir/mem.ssdcache"
    run_ssdcache memory 10M \
                 ssdcache-file="$tmpdir/mem.ssdcache" ssdcache-size=$cs \
                 ssdcache-stats="$stats" \
                 --run '"$PYTHON" "$random_io" --uri "$uri" --connections 2 \
                          --ops 2000 --seed '"$seed"' --model-zero --trim-reads-zero \
                          --mix read=50,write=35,zero=6,trim=5,flush=2,cache=2'
    cat "$stats"
    expect_stat "$stats" write_ops -gt 0 "no writes counted"
    expect_stat "$stats" read_hits -gt 0 "no read hits with a $cs cache"
done
expect_stat "$stats" evictions -gt 0 "no evictions with a 1M cache"

