#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: sequential cutoff (ssdcache-seq-cutoff).
#
# A 16M sequential copy through an 8M cache: with a 1M cutoff only the
# start of the stream is cached (the rest bypasses the cache and is
# counted in seq_bypassed), the data is still right, and random reads
# are cached as usual; without the cutoff the whole stream goes through
# the cache.
source "$(dirname "$0")/functions.sh"
set -e -x

random_file "$tmpdir/disk.img" $((16 * 1024 * 1024))
common=(file "$tmpdir/disk.img"
        ssdcache-size=8M ssdcache-page-size=64K)

rm -f "$tmpdir/c1"
run_ssdcache "${common[@]}" ssdcache-file="$tmpdir/c1" ssdcache-seq-cutoff=1M \
             ssdcache-stats="$tmpdir/s1" \
             --run 'nbdcopy --connections=1 --requests=1 --request-size=262144 "$uri" "$tmpdir/out1.img"'
cmp "$tmpdir/disk.img" "$tmpdir/out1.img"
cat "$tmpdir/s1"
fills=$(stat_get "$tmpdir/s1" fills)
bypassed=$(stat_get "$tmpdir/s1" seq_bypassed)
# One reader, one request at a time: exactly 1M of 64K pages (and at
# most a boundary page) is cached; readahead does not prefetch past the
# cutoff either.
[ "$fills" -le 17 ] || fail "the stream filled $fills pages past the cutoff"
[ "$bypassed" -ge 239 ] || fail "only $bypassed pages bypassed the cache"

# nbdcopy's default: several connections with many requests in flight,
# which reach the filter out of order and may look like new streams for
# a while: the cutoff still holds back most of the copy.
rm -f "$tmpdir/c2"
run_ssdcache "${common[@]}" ssdcache-file="$tmpdir/c2" ssdcache-seq-cutoff=1M \
             ssdcache-stats="$tmpdir/s1p" \
             --run 'nbdcopy --request-size=262144 "$uri" "$tmpdir/out1p.img"'
cmp "$tmpdir/disk.img" "$tmpdir/out1p.img"
fills=$(stat_get "$tmpdir/s1p" fills)
[ "$fills" -le 128 ] || fail "parallel copy: $fills pages filled past the cutoff"

# Random (non-sequential) reads are still cached.
run_ssdcache "${common[@]}" ssdcache-file="$tmpdir/c1" ssdcache-seq-cutoff=1M \
             ssdcache-stats="$tmpdir/s2" \
             --run 'nbdsh -u "$uri" -c "
import random
random.seed(1)
for i in range(40):
    h.pread(4096, random.randrange(0, 16 * 1024 * 1024 // 4096) * 4096)
"'
[ "$(stat_get "$tmpdir/s2" fills)" -ge 20 ] ||
    fail "random reads were not cached with the cutoff on"

# Without the cutoff the stream goes through the cache.
rm -f "$tmpdir/c3"
run_ssdcache "${common[@]}" ssdcache-file="$tmpdir/c3" ssdcache-stats="$tmpdir/s3" \
             --run 'nbdcopy --request-size=262144 "$uri" "$tmpdir/out3.img"'
cmp "$tmpdir/disk.img" "$tmpdir/out3.img"
[ "$(stat_get "$tmpdir/s3" fills)" -ge 200 ] ||
    fail "without the cutoff the stream was not cached"
[ "$(stat_get "$tmpdir/s3" seq_bypassed)" -eq 0 ] ||
    fail "seq_bypassed counted with the cutoff off"
