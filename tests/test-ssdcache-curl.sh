#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter over a real HTTP backend (read-only).  The
# test starts its own lighttpd (a child of the test) on a free loopback
# port, serving images with Range support, and reads one through
# nbdkit's curl plugin with ssdcache stacked on top (nbdkit -r):
#
# 1. cold: a full read equals the file, and it came from HTTP (nbdkit's
#    stats filter below ssdcache counts backend reads);
# 2. warm restart: random reads checked against the file and a full
#    read, taking (almost) nothing from HTTP;
# 3. identity: another URL (another file of the same size) on the same
#    cache file is refused ("built for another backend") and the cache
#    of the first URL is left intact; with ssdcache-reset=true the other
#    file's data is served.

source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd nbdcopy
requires nbdkit curl --version
requires_filter stats

# -- a lighttpd of our own ------------------------------------------------

www="$tmpdir/www"
mkdir "$www"
size=$((8 * 1024 * 1024))
random_file "$www/disk.img" $size
random_file "$www/other.img" $size

start_httpd "$www" disk.img

url="http://127.0.0.1:$http_port/disk.img"
other_url="http://127.0.0.1:$http_port/other.img"
cache="$tmpdir/http.ssdcache"

# read_url URL COMMAND [PARAMS...]: nbdkit -r, ssdcache over the stats
# filter over curl at URL, running COMMAND.
read_url ()
{
    local u="$1" cmd="$2"
    shift 2
    rm -f "$stats" "$bstats"
    run_ssdcache -r --filter=stats \
                 curl url="$u" statsfile="$bstats" \
                 ssdcache-file="$cache" ssdcache-stats="$stats" "$@" \
                 --run "$cmd"
    cat "$stats" "$bstats"
}

copy='nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'

# -- 1. cold ---------------------------------------------------------------

read_url "$url" "$copy" ssdcache-size=8M ssdcache-page-size=64K
cmp "$www/disk.img" "$tmpdir/copy.img" || fail "cold read differs from the file"
expect_stat "$bstats" backend_read_bytes -ge $size "cold read from HTTP"
expect_stat "$stats" read_misses -gt 0 "cold read had no misses"
expect_stat "$stats" cache_errors -eq 0 "cold read"

# -- 2. warm restart ---------------------------------------------------------

seed="${RANDOM_IO_SEED:-$RANDOM}"
echo "random-io seed: $seed"
rm -f "$tmpdir/copy.img"
read_url "$url" \
    '"$PYTHON" "$random_io" --uri "$uri" --connections 2 --ops 500 \
        --seed '"$seed"' --mix read=1 --max-len 256K \
        --model "'"$www/disk.img"'" --timeout 30 &&
     '"$copy"
cmp "$www/disk.img" "$tmpdir/copy.img" || fail "warm read differs from the file"
expect_warm "$stats" "$bstats" $size "warm restart over HTTP"
expect_stat "$stats" read_hits -gt 0 "warm restart had no hits"

# -- 3. identity: another URL -------------------------------------------------

expect_ssdcache_failure "built for another backend" \
    -r curl url="$other_url" ssdcache-file="$cache"
# The refusal left the first URL's cache alone: still warm.
read_url "$url" "$copy"
cmp "$www/disk.img" "$tmpdir/copy.img" || fail "read after the refusal differs"
expect_stat "$bstats" backend_read_bytes -le $((size / 64)) \
    "the refused start damaged the cache"

# With a reset, the other URL's data is served (from HTTP, not the old
# cache), then warm.
read_url "$other_url" "$copy" ssdcache-reset=true
cmp "$www/other.img" "$tmpdir/copy.img" ||
    fail "after ssdcache-reset=true the data is not the other URL's"
expect_stat "$bstats" backend_read_bytes -ge $size \
    "after a reset the data did not come from HTTP"
read_url "$other_url" "$copy"
cmp "$www/other.img" "$tmpdir/copy.img" || fail "warm read of the other URL differs"
expect_stat "$bstats" backend_read_bytes -le $((size / 64)) \
    "the other URL's cache is not warm after a restart"
# And now the first URL is the stranger.
expect_ssdcache_failure "built for another backend" \
    -r curl url="$url" ssdcache-file="$cache"
