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

requires "$PYTHON" -c 'import nbd'
requires nbdcopy --version
requires nbdkit curl --version
requires nbdkit --filter=stats null --version

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
stats="$tmpdir/ssdcache.stats"
bstats="$tmpdir/backend.stats"

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
[ "$(backend_read_bytes "$bstats")" -ge $size ] ||
    fail "cold read took only $(backend_read_bytes "$bstats") bytes from HTTP"
[ "$(stat_get "$stats" read_misses)" -gt 0 ] || fail "cold read had no misses"
[ "$(stat_get "$stats" cache_errors)" -eq 0 ] || fail "cache_errors is not 0"

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
b="$(backend_read_bytes "$bstats")"
[ "$b" -le $((size / 64)) ] ||
    fail "warm restart read $b bytes over HTTP (limit $((size / 64)))"
[ "$(stat_get "$stats" loaded_slots)" -ge $((size / 65536 * 9 / 10)) ] ||
    fail "warm restart loaded only $(stat_get "$stats" loaded_slots) slots"
[ "$(stat_get "$stats" read_hits)" -gt 0 ] || fail "warm restart had no hits"

# -- 3. identity: another URL -------------------------------------------------

expect_ssdcache_failure "built for another backend" \
    -r curl url="$other_url" ssdcache-file="$cache"
# The refusal left the first URL's cache alone: still warm.
read_url "$url" "$copy"
cmp "$www/disk.img" "$tmpdir/copy.img" || fail "read after the refusal differs"
[ "$(backend_read_bytes "$bstats")" -le $((size / 64)) ] ||
    fail "the refused start damaged the cache (backend read $(backend_read_bytes "$bstats") bytes)"

# With a reset, the other URL's data is served (from HTTP, not the old
# cache), then warm.
read_url "$other_url" "$copy" ssdcache-reset=true
cmp "$www/other.img" "$tmpdir/copy.img" ||
    fail "after ssdcache-reset=true the data is not the other URL's"
[ "$(backend_read_bytes "$bstats")" -ge $size ] ||
    fail "after a reset the data did not come from HTTP"
read_url "$other_url" "$copy"
cmp "$www/other.img" "$tmpdir/copy.img" || fail "warm read of the other URL differs"
[ "$(backend_read_bytes "$bstats")" -le $((size / 64)) ] ||
    fail "the other URL's cache is not warm after a restart"
# And now the first URL is the stranger.
expect_ssdcache_failure "built for another backend" \
    -r curl url="$url" ssdcache-file="$cache"
