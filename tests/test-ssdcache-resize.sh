#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a new ssdcache-size resizes an existing cache
# and keeps its pages.  4 KiB pages and sizes whose page tables end on
# either side of a 1 MiB boundary, so that the page pool moves (by 256
# slots): grow, then shrink, each keeping what the new geometry holds;
# an interrupted resize starts empty; dirty data is written back before
# a resize, and a read-only server keeps the size; a shrink keeps the
# hottest pages, also when killed while it moves them.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdcopy --version
requires_filter stats
[ -x "$SSDCACHE_TOOL" ] || fail "ssdcache tool not found: $SSDCACHE_TOOL"

size=$((96 * 1024 * 1024))
random_file "$img" $size
log="$tmpdir/log"

# serve SIZE [ARGS...]: read the whole export through a cache of SIZE
# into copy.img, which must equal $want (the backend counted below the
# cache, nbdkit's log in $log; ARGS: --filter=F below it, and more
# parameters).
want="$img"
serve ()
{
    local csize="$1" a filters=() params=()
    shift
    for a; do
        case "$a" in --filter=*) filters+=("$a") ;; *) params+=("$a") ;; esac
    done
    rm -f "$bstats" "$stats"
    run_ssdcache --filter=stats "${filters[@]}" file "$img" "${params[@]}" \
                 statsfile="$bstats" \
                 ssdcache-file="$cache" ssdcache-size="$csize" \
                 ssdcache-page-size=4K ssdcache-stats="$stats" \
                 --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"' \
                 2> "$log" || { cat "$log"; fail "nbdkit failed"; }
    cat "$log" "$bstats"
    cmp "$want" "$tmpdir/copy.img" || fail "data read differs (size $csize)"
    # A page kept in the wrong slot fails its checksum when read.
    expect_stat "$stats" verify_failures -eq 0 "size $csize"
}

info_field ()
{
    "$SSDCACHE_TOOL" info "$cache" | awk -v k="$1:" '$1 == k { print $2 }'
}

expect_slots ()
{
    [ "$(info_field slots)" -eq "$1" ] ||
        fail "the cache has $(info_field slots) slots, expected $1 ($2)"
}

# 48M: 12288 slots, the pool at 1 MiB; 96M: 24576, the pool at 2 MiB.
serve 48M
expect_slots 12288 "first start"
filled=$(info_field clean_slots)
[ "$filled" -gt 10000 ] || fail "only $filled pages cached by a full read"

# Grow: old slot i + 256 is new slot i; the first 256 are dropped.
serve 96M
expect_slots 24576 "grown"
expect_stat "$stats" loaded_slots -ge $((filled - 256)) "grown"
expect_stat "$stats" bytes_from_cache -ge $(((filled - 256) * 4096 * 9 / 10)) \
    "grown"
serve 96M
expect_warm "$stats" "$bstats" $size "all of the grown cache in use"

# Shrink: old slot i - 256 is new slot i; 12032 of them fit.
serve 48M
expect_slots 12288 "shrunk"
expect_stat "$stats" loaded_slots -ge 12032 "shrunk"
"$SSDCACHE_TOOL" check "$cache"

# Killed at each step of a resize (-D ssdcache.resize_kill): before its
# last superblock the next start finds an interrupted resize and starts
# empty, after it the cache has its new size and its pages.
for step in 1 2 3 4 5; do
    serve 48M
    status=0
    rm -f "$tmpdir/sock"        # left by the kill before
    timeout 60 nbdkit -f -U "$tmpdir/sock" -D ssdcache.resize_kill=$step \
        --filter="$SSDCACHE_FILTER" file "$img" ssdcache-file="$cache" \
        ssdcache-size=96M ssdcache-page-size=4K || status=$?
    [ $status -eq 137 ] || fail "step $step: nbdkit exit status $status"
    if [ $step -lt 5 ]; then
        [ "$(info_field resize_interrupted)" = yes ] ||
            fail "step $step: ssdcache info does not show the resize"
        serve 96M
        grep -q "change of its size was interrupted" "$log" ||
            fail "step $step: no message about the interrupted resize"
        expect_stat "$stats" loaded_slots -eq 0 "killed at step $step"
    else
        serve 96M
        expect_stat "$stats" loaded_slots -ge $((12288 - 256)) "step 5"
    fi
    expect_slots 24576 "killed at step $step, restarted"
done

# Dirty data: written back before the resize, never lost; when it
# cannot be written back (the backend fails writes), the size stays.
cp "$img" "$tmpdir/orig.img"
random_file "$tmpdir/new.bin" $((8 * 1024 * 1024))
run_ssdcache file "$img" ssdcache-file="$cache" ssdcache-size=48M \
             ssdcache-page-size=4K ssdcache-mode=writeback \
             ssdcache-writeback-idle=600000 ssdcache-writeback-high=100 \
             ssdcache-writeback-on-exit=false \
             --run 'nbdcopy "$tmpdir/new.bin" "$uri"'
[ "$(info_field dirty_slots)" -eq 2048 ] || fail "the writes are not dirty"
cmp "$img" "$tmpdir/orig.img" || fail "the backend changed before writeback"
dd if="$tmpdir/new.bin" of="$tmpdir/orig.img" conv=notrunc status=none
want="$tmpdir/orig.img"

serve 96M --filter=error error-pwrite=EIO error-pwrite-rate=100% \
      ssdcache-mode=writeback ssdcache-writeback-on-exit=false
grep -q "keeps its size" "$log" || fail "failed writeback: no message"
expect_slots 12288 "failed writeback"
cmp "$img" "$tmpdir/orig.img" && fail "the failing backend was written"

serve 96M
cmp "$img" "$tmpdir/orig.img" || fail "the dirty data was not written back"
expect_slots 24576 "dirty, grown"
[ "$(info_field dirty_slots)" -eq 0 ] || fail "dirty slots left"

# A shrink keeps the hottest pages: a fresh 96M cache, filled by one
# read in order (page i in slot i, the free list's order), then the
# second half of the export read again (hot), in slots that a 48M
# cache drops; shrunk to 48M, those move over the colder pages of the
# first half, so that the second half then comes (nearly) all from the
# cache.  Killed while pages move, the old cache stays whole: every
# page reads back right, none failing its checksum.
want="$img"
cat > "$tmpdir/half.py" <<'PY'
import sys
import nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
half = h.get_size() // 2
for off in range(half, 2 * half, 1 << 20):
    h.pread(1 << 20, off)
PY
# hot_96M: a fresh 96M cache, filled, then its second half read again
# (every page stored as it is read: without fill behind, which drops
# what it cannot keep up with, so that on a loaded machine some pages
# would be cold).
hot_96M ()
{
    rm -f "$cache"
    serve 96M ssdcache-fill-behind=false
    run_ssdcache file "$img" ssdcache-file="$cache" ssdcache-size=96M \
                 ssdcache-page-size=4K ssdcache-fill-behind=false \
                 --run '"$PYTHON" "$tmpdir/half.py" "$uri"'
}
# hot_half_48M WHY: a start at 48M reads the hot half, which must come
# from the cache (at most 4 MiB from the backend), no page failing its
# checksum.
hot_half_48M ()
{
    rm -f "$bstats" "$stats"
    run_ssdcache -v --filter=stats file "$img" statsfile="$bstats" \
                 ssdcache-file="$cache" ssdcache-size=48M ssdcache-page-size=4K \
                 ssdcache-stats="$stats" \
                 --run '"$PYTHON" "$tmpdir/half.py" "$uri"' 2> "$log" ||
        { cat "$log"; fail "nbdkit failed ($1)"; }
    grep -E "resized from|verify" "$log" || :
    cat "$bstats"
    expect_slots 12288 "$1"
    from_backend=$(backend_read_bytes "$bstats")
    [ "$from_backend" -le $((4 * 1024 * 1024)) ] ||
        fail "$1: $from_backend bytes of the hot half read from the backend"
    expect_stat "$stats" verify_failures -eq 0 "$1"
}
hot_96M
hot_half_48M "shrunk, hot"
moved=( [0]="$(sed -n 's/.*resized from .*, \([0-9]*\) of them moved.*/\1/p' "$log")" )
[ -n "${moved[0]}" ] && [ "${moved[0]}" -ge 8000 ] ||
    fail "hot pages moved: '${moved[0]}'"

# Killed while pages move (after their data, after their entries):
# the old cache restarts whole (a moved page in one slot or the
# other), or the shrink completes and keeps the hot half.
for step in 6 7; do
    for next in old new; do
        hot_96M
        status=0
        rm -f "$tmpdir/sock"
        timeout 60 nbdkit -f -U "$tmpdir/sock" -D ssdcache.resize_kill=$step \
            --filter="$SSDCACHE_FILTER" file "$img" ssdcache-file="$cache" \
            ssdcache-size=48M ssdcache-page-size=4K || status=$?
        [ $status -eq 137 ] || fail "step $step: nbdkit exit status $status"
        if [ $next = old ]; then
            serve 96M
            expect_slots 24576 "killed at step $step, restarted"
            # (The pages moved over are gone: their slots are FREE at
            # step 6, hold the hot pages, whose old entries lose, at 7.)
            expect_stat "$stats" loaded_slots -ge 12288 "killed at step $step"
        else
            hot_half_48M "killed at step $step, then shrunk"
            moved[$step]=$(sed -n 's/.*, \([0-9]*\) of them moved.*/\1/p' "$log")
            serve 48M
        fi
    done
done
# At step 7 the pages of the first batch had their new entries, which
# won: they did not have to move again.
[ "${moved[7]}" -lt "${moved[6]}" ] ||
    fail "moved again after step 7: ${moved[7]}, after step 6: ${moved[6]}"
