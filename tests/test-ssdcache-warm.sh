#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: warm-up (ssdcache-warm=all).
#
#  1. With no client at all, the whole image is read into the cache
#     (warm_progress_pct reaches 100); a full read then takes nothing
#     from the backend (stats filter below the cache).  Over the curl
#     plugin (a file:// URL: read-only), in writeback mode.
#  2. Killed with SIGKILL half way (rate limited), the restarted server
#     passes over what was warmed: it reads again at most 2% of the
#     image.
#  3. A cache smaller than the image: the warm-up stops when the cache
#     is full, says so once, and evicts nothing (pages a client read
#     before stay cached).

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdcopy --version
requires nbdkit --filter=stats null --version
requires nbdkit curl --version

stats="$tmpdir/stats"
bstats="$tmpdir/bstats"
size=$((32 * 1024 * 1024))
random_file "$img" $size
ctl () { "$SSDCACHE_TOOL" ctl "$tmpdir/ctl.sock" "$@"; }
field () { awk -v k="$1:" '$1 == k { print $2 }'; }

# wait_progress PCT: until the warm-up passed PCT% (30 s at most).
wait_progress ()
{
    local i p
    for i in $(seq 300); do
        p="$(ctl stats | field warm_progress_pct)"
        [ "${p:-0}" -ge "$1" ] && return 0
        sleep 0.1
    done
    fail "warm-up did not reach $1% (at ${p:-?}%)"
}

# -- 1. all of it, without a client -------------------------------------

start_ssdcache -P "$tmpdir/pid" -U "$sock" -D ssdcache.warm=1 \
    --filter=stats curl "file://$img" statsfile="$bstats" \
    ssdcache-file="$cache" ssdcache-size=64M ssdcache-mode=writeback \
    ssdcache-warm=all ssdcache-control="$tmpdir/ctl.sock"
wait_progress 100
ctl stats > "$tmpdir/st1"
[ "$(field warm_bytes < "$tmpdir/st1")" -eq $size ] ||
    fail "warm-up read $(field warm_bytes < "$tmpdir/st1") bytes, not $size"
[ "$(field read_ops < "$tmpdir/st1")" -eq 0 ] || fail "a client read?"
nbdcopy --no-extents "$(sock_uri "$sock")" "$tmpdir/copy"
stop_nbdkit "$tmpdir/pid"
cmp "$img" "$tmpdir/copy" || fail "the warmed export reads wrong"
b="$(backend_read_bytes "$bstats")"
[ "$b" -le $((size + size / 100)) ] ||
    fail "a full read after warming took $((b - size)) bytes more from the backend"

# -- 2. killed half way, resumed ----------------------------------------

rm -f "$cache" "$bstats"
start_ssdcache -P "$tmpdir/pid" -U "$sock" file "$img" \
    ssdcache-file="$cache" ssdcache-size=64M ssdcache-warm=all \
    ssdcache-warm-rate=8M ssdcache-control="$tmpdir/ctl.sock"
wait_progress 50
crash_nbdkit "$tmpdir/pid"
start_ssdcache -P "$tmpdir/pid" -U "$sock" --filter=stats file "$img" \
    statsfile="$bstats" ssdcache-file="$cache" ssdcache-size=64M \
    ssdcache-warm=all ssdcache-control="$tmpdir/ctl.sock" \
    ssdcache-stats="$stats"
wait_progress 100
stop_nbdkit "$tmpdir/pid"
loaded="$(stat_get "$stats" loaded_slots)"
again=$(( $(backend_read_bytes "$bstats") - (size - loaded * 65536) ))
echo "after the kill: $loaded pages kept, $again bytes read again"
[ "$loaded" -gt 0 ] || fail "nothing warmed survived the kill"
[ "$again" -le $((size / 50)) ] ||
    fail "the restart read $again bytes again (more than 2% of $size)"

# -- 3. a cache smaller than the image ----------------------------------

rm -f "$cache"
# A client reads the first MiB (no warm-up yet)...
run_ssdcache file "$img" ssdcache-file="$cache" ssdcache-size=8M \
    --run 'nbdcopy --no-extents "$uri" - | head -c 1048576 > /dev/null || :'
rm -f "$bstats"
# ... then the warm-up fills the rest of the cache and stops.
start_ssdcache -P "$tmpdir/pid" -U "$sock" -v --filter=stats file "$img" \
    statsfile="$bstats" ssdcache-file="$cache" ssdcache-size=8M \
    ssdcache-warm=all ssdcache-control="$tmpdir/ctl.sock" \
    ssdcache-stats="$stats" 2> "$tmpdir/log"
for i in $(seq 300); do
    [ "$(ctl stats | field warm_full)" = 1 ] && break
    sleep 0.1
done
ctl stats > "$tmpdir/st3"
[ "$(field warm_full < "$tmpdir/st3")" = 1 ] || fail "warm-up did not stop full"
[ "$(field evictions < "$tmpdir/st3")" -eq 0 ] ||
    fail "warm-up evicted $(field evictions < "$tmpdir/st3") pages"
[ "$(grep -c 'warm: the cache is full' "$tmpdir/log")" -eq 1 ] ||
    fail "the full cache was not reported exactly once"
stop_nbdkit "$tmpdir/pid"
# The first MiB is still cached: reading it takes nothing more.
rm -f "$bstats"
run_ssdcache --filter=stats file "$img" statsfile="$bstats" \
    ssdcache-file="$cache" ssdcache-size=8M \
    --run 'nbdsh -u "$uri" -c "h.pread(1048576, 0)"'
[ "$(backend_read_bytes "$bstats")" -eq 0 ] ||
    fail "pages a client read were evicted by the warm-up"
