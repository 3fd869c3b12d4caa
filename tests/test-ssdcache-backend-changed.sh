#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: the backing file changed while the cache was
# offline, with the same identity (same path, same size).
#
# Without ssdcache-verify (the default, documented behaviour): the
# identity only sees the parameters and the size, so the cache cannot
# notice, and it serves the OLD cached data for the pages it holds
# (pages it does not hold come from the changed file).
# ssdcache-reset=true does not help either: it only acts when the
# identity, size or page size differ.
#
# With ssdcache-verify=lazy each cached page is compared with the
# backend on its first use after start: the edited pages are dropped
# and re-read (verify_mismatches), so the new data is served, and the
# cache holds the new data for the next start.
#
# Also: a new ssdcache-id (plus ssdcache-reset=true for the same cache
# file), or deleting the cache file.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdcopy --version
requires nbdsh --version

size=$((4 * 1024 * 1024))
random_file "$img" $size
cp "$img" "$tmpdir/old.img"

# read_all [PARAMS...]: the whole export, through the cache, into copy.img.
read_all ()
{
    rm -f "$tmpdir/copy.img"
    run_ssdcache file "$img" \
                 ssdcache-file="$cache" ssdcache-stats="$tmpdir/stats" "$@" \
                 --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
    cat "$tmpdir/stats"
}

# 1. Cache the first half of the file only (4M file, 64K pages).
run_ssdcache file "$img" \
             ssdcache-file="$cache" ssdcache-size=4M ssdcache-page-size=64K \
             --run 'nbdsh -u "$uri" -c "h.pread(2 * 1024 * 1024, 0)"'

# 2. Change the whole file behind the cache's back: same path, same
#    size, new contents (in place, like an edit by another program).
random_file "$tmpdir/new.img" $size
dd if="$tmpdir/new.img" of="$img" bs=1M conv=notrunc status=none
cmp -s "$img" "$tmpdir/old.img" && fail "the file did not change"

# 3. Without ssdcache-verify: the first half (cached) is the OLD data,
#    the second half (not cached) the new data.
read_all
half=$((size / 2))
cmp -n $half "$tmpdir/copy.img" "$tmpdir/old.img" ||
    fail "without ssdcache-verify the cached half is not the old data: the documented behaviour changed"
cmp -i $half:$half "$tmpdir/copy.img" "$img" ||
    fail "the uncached half does not come from the changed file"
[ "$(stat_get "$tmpdir/stats" loaded_slots)" -ge $((half / 65536)) ] ||
    fail "the cache was not loaded warm"

[ "$(stat_get "$tmpdir/stats" verify_mismatches)" -eq 0 ] ||
    fail "verify_mismatches counted without ssdcache-verify"

# 4. ssdcache-reset=true with the same identity does not re-initialise
#    the cache (it acts only on a mismatch).
read_all ssdcache-reset=true
cmp -n $half "$tmpdir/copy.img" "$tmpdir/old.img" ||
    fail "ssdcache-reset=true now empties a matching cache: update this test and the docs"
[ "$(stat_get "$tmpdir/stats" loaded_slots)" -gt 0 ] ||
    fail "ssdcache-reset=true: expected the matching cache to be kept (loaded_slots 0)"

# 4b. ssdcache-verify=lazy: every byte is the changed file's, each of
#     the 32 cached pages was found to differ, and the debug flag logs
#     them.
read_all ssdcache-verify=lazy -v -D ssdcache.verify=1 2> "$tmpdir/log"
cmp "$tmpdir/copy.img" "$img" ||
    fail "ssdcache-verify=lazy: the data served is not the changed file's"
[ "$(stat_get "$tmpdir/stats" verify_mismatches)" -eq $((half / 65536)) ] ||
    fail "ssdcache-verify=lazy: verify_mismatches is not $((half / 65536))"
grep -q "ssdcache-verify: page 5 " "$tmpdir/log" ||
    fail "ssdcache-verify=lazy: -D ssdcache.verify=1 did not log the mismatch"
# ... and the cache now holds the new data: a start without it is
# right and warm.
read_all
cmp "$tmpdir/copy.img" "$img" ||
    fail "after a ssdcache-verify=lazy run the cache still holds old data"
[ "$(stat_get "$tmpdir/stats" read_hits)" -gt 0 ] ||
    fail "after a ssdcache-verify=lazy run the cache is not warm"
# With nothing changed, ssdcache-verify=lazy finds no mismatch.
read_all ssdcache-verify=lazy
cmp "$tmpdir/copy.img" "$img" || fail "ssdcache-verify=lazy, unchanged: wrong data"
[ "$(stat_get "$tmpdir/stats" verify_mismatches)" -eq 0 ] ||
    fail "ssdcache-verify=lazy, unchanged: mismatches counted"

# 4c. Writeback: a dirty sector wins over the changed backend; the clean
#     rest of its page comes from the changed backend.
run_ssdcache file "$img" \
             ssdcache-file="$cache" ssdcache-mode=writeback \
             ssdcache-writeback-on-exit=false ssdcache-writeback-idle=0 \
             --run 'nbdsh -u "$uri" -c "h.pwrite(b\"W\" * 512, 4096); h.flush()"'
random_file "$tmpdir/new2.img" 65536
dd if="$tmpdir/new2.img" of="$img" bs=64K count=1 conv=notrunc status=none
cp "$img" "$tmpdir/expect.img"
printf 'W%.0s' $(seq 512) | dd of="$tmpdir/expect.img" bs=512 seek=8 \
    conv=notrunc status=none
read_all ssdcache-verify=lazy ssdcache-mode=writeback \
         ssdcache-writeback-on-exit=true
cmp "$tmpdir/copy.img" "$tmpdir/expect.img" ||
    fail "ssdcache-verify=lazy, writeback: dirty sector or changed clean data wrong"
cmp "$img" "$tmpdir/expect.img" ||
    fail "ssdcache-verify=lazy, writeback: the file after writeback is wrong"

# 5. What works: a new ssdcache-id with ssdcache-reset=true on the same
#    cache file...
rm -f "$cache"
read_all
read_all ssdcache-id=after-the-edit ssdcache-reset=true
cmp "$tmpdir/copy.img" "$img" ||
    fail "with a new ssdcache-id and ssdcache-reset=true the data is not the file's"
[ "$(stat_get "$tmpdir/stats" loaded_slots)" -eq 0 ] ||
    fail "a new ssdcache-id: the old cache was loaded"
# ... and is then warm with the new data (under the new id).
read_all ssdcache-id=after-the-edit
cmp "$tmpdir/copy.img" "$img" || fail "new id, second run: wrong data"
[ "$(stat_get "$tmpdir/stats" loaded_slots)" -gt 0 ] || fail "new id, second run: not warm"

# 6. ... and deleting the cache file (back to the automatic identity).
rm -f "$cache"
read_all
cmp "$tmpdir/copy.img" "$img" || fail "after deleting the cache file the data is not the file's"
