#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: hostile parameters and cache paths.
#
# Each case must either work (and then serve the right data) or make
# nbdkit refuse to start with a message naming the parameter or the
# file - never crash (death by a signal, a sanitizer report) or hang.
#
# - huge sizes: 1E, INT64_MAX, 32T over a small backend (capped to the
#   backend), sizes that do not parse (16E, 2^64), and a 20T backend
#   (null plugin) with 4K pages (more slots than 32 bits hold: "too
#   many pages", refused before anything is allocated);
# - writeback parameters at and beyond their limits (a percentage of
#   2^32 + 1 must not wrap around to 1);
# - ssdcache-file: a directory, a symlink to a cache file (the same
#   cache, warm), a dangling symlink (the target is created), a symlink
#   into a missing directory, an immutable file (chattr +i), a file on
#   a read-only bind mount, a file on a 2M tmpfs that cannot hold the
#   cache ("not enough space"; a smaller cache then works there).
# Cases that need root or a filesystem feature are skipped with a note
# when unavailable.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdinfo --version
requires nbdcopy --version
requires truncate --version

size=$((4 * 1024 * 1024))
random_file "$img" $size
notes=()

# status_ok STATUS WHAT: fail on death by a signal or a hang.
status_ok ()
{
    if [ "$1" -eq 124 ]; then
        fail "$2: nbdkit hung (30 s)"
    fi
    if [ "$1" -gt 128 ]; then
        fail "$2: nbdkit died with signal $(($1 - 128))"
    fi
    if grep -Eq 'AddressSanitizer|LeakSanitizer|runtime error:' "$tmpdir/err"; then
        fail "$2: sanitizer report"
    fi
}

# works BACKEND-FILE ARGS...: nbdkit serves BACKEND-FILE through the
# cache and a full read equals it.
works ()
{
    local f="$1" status=0
    shift
    rm -f "$tmpdir/copy.img"
    run_ssdcache --timeout 30 file "$f" "$@" \
                 --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"' \
                 2> "$tmpdir/err" || status=$?
    cat "$tmpdir/err"
    status_ok $status "$*"
    [ $status -eq 0 ] || fail "nbdkit failed: $*"
    cmp "$f" "$tmpdir/copy.img" || fail "wrong data read: $*"
}

# refused PATTERN BACKEND-FILE ARGS...: nbdkit must not serve, and its
# errors must match PATTERN (the parameter or the file).
refused ()
{
    local pattern="$1" f="$2"
    shift 2
    refused_plugin "$pattern" file "$f" "$@"
}

# refused_plugin PATTERN PLUGIN ARGS...: the same over any plugin.
refused_plugin ()
{
    local pattern="$1" status=0
    shift
    run_ssdcache --timeout 30 "$@" \
                 --run 'nbdinfo --size "$uri"' > /dev/null 2> "$tmpdir/err" ||
        status=$?
    cat "$tmpdir/err"
    status_ok $status "$*"
    [ $status -ne 0 ] || fail "nbdkit did not refuse: $*"
    grep -Eq -- "$pattern" "$tmpdir/err" ||
        fail "the error does not match \"$pattern\": $*"
}

c="$tmpdir/c.ssdcache"

# -- sizes -------------------------------------------------------------------

for s in 1E 9223372036854775807 32T 16T; do
    rm -f "$c"
    works "$img" ssdcache-file="$c" ssdcache-size=$s
    # Capped to the backend: the cache file is not much bigger than it.
    [ "$(stat -c %s "$c")" -le $((2 * size + 4 * 1024 * 1024)) ] ||
        fail "ssdcache-size=$s made a $(stat -c %s "$c") byte cache file for a $size byte backend"
    works "$img" ssdcache-file="$c" ssdcache-page-size=4K ssdcache-size=$s \
          ssdcache-reset=true
done
rm -f "$c"
refused ssdcache-size "$img" ssdcache-file="$c" ssdcache-size=16E
refused ssdcache-size "$img" ssdcache-file="$c" ssdcache-size=18446744073709551616
refused ssdcache-size "$img" ssdcache-file="$c" ssdcache-size=9223372036854775808
refused ssdcache-page-size "$img" ssdcache-file="$c" ssdcache-page-size=1E
refused ssdcache-page-size "$img" ssdcache-file="$c" ssdcache-page-size=4294971392

# A 5P backend (nbdkit's null plugin: no file): with 4K pages it has
# more than 2^40 pages, which the page table cannot number.  Refused
# before anything is allocated (the cache file stays empty).
rm -f "$c"
refused_plugin 'at most 1099511627776 pages.*ssdcache-page-size' null 5P \
               ssdcache-file="$c" ssdcache-size=20T ssdcache-page-size=4K
[ ! -s "$c" ] || fail "the refused 5P cache left a $(stat -c %s "$c") byte file"
# 20T of 4K pages, beyond 2^32 pages: the last page is cached (its page
# number needs more than 32 bits), and read again from the cache.
rm -f "$c"
run_ssdcache --timeout 30 null 20T \
             ssdcache-file="$c" ssdcache-size=4M ssdcache-page-size=4K \
             ssdcache-stats="$tmpdir/st" ssdcache-readahead=off \
             --run 'nbdsh -u "$uri" -c "
for i in range(2):
    assert h.pread(4096, 20 * 2**40 - 4096) == bytes(4096)
    assert h.pread(4096, 2**44) == bytes(4096)
"' || fail "a 4M cache of 4K pages over a 20T backend does not work"
expect_stat "$tmpdir/st" read_hits -eq 2 "20T of 4K pages"
expect_stat "$tmpdir/st" read_misses -eq 2 "20T of 4K pages"
# Just under 16T (fewer than 2^32 - 1 pages of 4K), but a 20T cache
# would be more than 2^32 slots (the spare quarter): refused too.
rm -f "$c"
refused_plugin 'ssdcache-size.*too many pages' null 16383G \
               ssdcache-file="$c" ssdcache-size=20T ssdcache-page-size=4K
[ ! -s "$c" ] || fail "the refused 20T cache left a $(stat -c %s "$c") byte file"
# The same backend with 64K pages and a modest cache works.
run_ssdcache --timeout 30 null 20T \
             ssdcache-file="$c" ssdcache-size=4M ssdcache-reset=true \
             --run 'nbdsh -u "$uri" -c "assert h.pread(65536, 20 * 2**40 - 65536) == bytes(65536)"' ||
    fail "a 4M cache over a 20T backend does not work"
rm -f "$c"

# -- writeback parameters at their limits ------------------------------------

rm -f "$c"
refused ssdcache-writeback-high "$img" ssdcache-file="$c" ssdcache-writeback-high=4294967297
refused ssdcache-writeback-high "$img" ssdcache-file="$c" ssdcache-writeback-high=101
refused ssdcache-writeback-low "$img" ssdcache-file="$c" ssdcache-writeback-low=-1
refused ssdcache-writeback-idle "$img" ssdcache-file="$c" ssdcache-writeback-idle=4294967296
refused ssdcache-writeback-rate "$img" ssdcache-file="$c" ssdcache-writeback-rate=16E
# The largest accepted values work (writes, flush to the backend).
cp "$img" "$tmpdir/wb.img"
run_ssdcache --timeout 30 file "$tmpdir/wb.img" \
             ssdcache-file="$tmpdir/wb.ssdcache" ssdcache-mode=writeback \
             ssdcache-flush=backend ssdcache-writeback-idle=4294967295 \
             ssdcache-writeback-rate=9223372036854775807 \
             ssdcache-writeback-high=100 ssdcache-writeback-low=100 \
             --run 'nbdsh -u "$uri" -c "
import os
d = os.urandom(300000)
h.pwrite(d, 12345)
h.flush()
assert h.pread(300000, 12345) == d
with open(\"$tmpdir/wb.img\", \"rb\") as f:
    f.seek(12345)
    assert f.read(300000) == d, \"FLUSH did not reach the backend\"
"' 2> "$tmpdir/err" || { status=$?; cat "$tmpdir/err"; status_ok $status "writeback limits"; fail "writeback at the largest parameter values failed"; }

# -- ssdcache-file paths -----------------------------------------------------

# A directory.
mkdir "$tmpdir/dir"
refused "ssdcache-file.*$tmpdir/dir" "$img" ssdcache-file="$tmpdir/dir"

# A symlink to a cache file: the same cache (warm, same file).
rm -f "$c"
works "$img" ssdcache-file="$c" ssdcache-size=4M ssdcache-stats="$tmpdir/st"
ln -s "$c" "$tmpdir/link.ssdcache"
works "$img" ssdcache-file="$tmpdir/link.ssdcache" ssdcache-stats="$tmpdir/st"
[ "$(stat_get "$tmpdir/st" loaded_slots)" -gt 0 ] ||
    fail "through a symlink the cache was not the same (nothing loaded)"
[ -L "$tmpdir/link.ssdcache" ] || fail "the symlink was replaced"

# A dangling symlink: the target is created (or a clear error).
ln -s "$tmpdir/target.ssdcache" "$tmpdir/dangling.ssdcache"
works "$img" ssdcache-file="$tmpdir/dangling.ssdcache"
[ -f "$tmpdir/target.ssdcache" ] || fail "the dangling symlink's target was not created"
[ "$(stat -c %a "$tmpdir/target.ssdcache")" = 600 ] ||
    fail "the cache file created through a symlink has mode $(stat -c %a "$tmpdir/target.ssdcache")"

# A symlink into a directory that does not exist.
ln -s "$tmpdir/no-such-dir/x.ssdcache" "$tmpdir/bad-link.ssdcache"
refused "ssdcache-file.*bad-link.ssdcache" "$img" ssdcache-file="$tmpdir/bad-link.ssdcache"

# A file that cannot be opened for writing.  Root ignores permission
# bits, so as root use an immutable file (chattr +i); otherwise mode 0400.
rm -f "$c"
works "$img" ssdcache-file="$c" ssdcache-size=1M
if [ "$(id -u)" -ne 0 ]; then
    chmod 0400 "$c"
    refused "ssdcache-file.*$c" "$img" ssdcache-file="$c"
    chmod 0600 "$c"
elif chattr +i "$c" 2>/dev/null; then
    cleanup_fn chattr -i "$c"
    refused "ssdcache-file.*$c" "$img" ssdcache-file="$c"
    chattr -i "$c"
else
    notes+=("immutable cache file: chattr +i not supported on $(df --output=fstype "$tmpdir" | tail -1)")
fi

# A cache file on a read-only bind mount (root only).
mkdir "$tmpdir/rw" "$tmpdir/ro"
cp "$c" "$tmpdir/rw/c.ssdcache"
if [ "$(id -u)" -eq 0 ] &&
   mount --bind "$tmpdir/rw" "$tmpdir/ro" 2>/dev/null; then
    cleanup_fn umount "$tmpdir/ro"
    if mount -o remount,ro,bind "$tmpdir/ro" 2>/dev/null; then
        refused "ssdcache-file.*$tmpdir/ro/c.ssdcache" "$img" \
                ssdcache-file="$tmpdir/ro/c.ssdcache"
        refused "ssdcache-file.*$tmpdir/ro/new.ssdcache" "$img" \
                ssdcache-file="$tmpdir/ro/new.ssdcache"
    else
        notes+=("read-only bind mount: remount,ro not permitted")
    fi
    umount "$tmpdir/ro"
else
    notes+=("read-only bind mount: needs root and mount --bind")
fi

# A filesystem too small for the cache: a 2M tmpfs, an 8M cache.
mkdir "$tmpdir/small"
if [ "$(id -u)" -eq 0 ] &&
   mount -t tmpfs -o size=2M ssdcache-test "$tmpdir/small" 2>/dev/null; then
    cleanup_fn umount "$tmpdir/small"
    refused "ssdcache-size.*not enough space" "$img" \
            ssdcache-file="$tmpdir/small/c.ssdcache" ssdcache-size=8M \
            ssdcache-page-size=64K
    # The failed attempt left nothing that trips up a cache that fits.
    [ ! -s "$tmpdir/small/c.ssdcache" ] ||
        fail "the refused cache left $(stat -c %s "$tmpdir/small/c.ssdcache") bytes on the small filesystem"
    works "$img" ssdcache-file="$tmpdir/small/c.ssdcache" ssdcache-size=512K \
          ssdcache-page-size=64K
    works "$img" ssdcache-file="$tmpdir/small/c.ssdcache"
    # Just under 2^32 slots (15T of 4K pages, over a 15T null backend):
    # accepted as a size, so formatting starts; on the small
    # filesystem it must fail cleanly, and must not first allocate the
    # in-memory page table for 4 billion slots.
    status=0
    run_ssdcache --timeout 30 null 15T \
                 ssdcache-file="$tmpdir/small/huge.ssdcache" ssdcache-size=15T \
                 ssdcache-page-size=4K \
                 --run 'nbdinfo --size "$uri"' > /dev/null 2> "$tmpdir/err" ||
        status=$?
    cat "$tmpdir/err"
    status_ok $status "15T of 4K pages on a 2M filesystem"
    [ $status -ne 0 ] || fail "a 15T cache on a 2M filesystem was not refused"
    grep -Eq "ssdcache-size|ssdcache-file" "$tmpdir/err" ||
        fail "15T cache on a 2M filesystem: the error names neither ssdcache-size nor ssdcache-file"
    [ ! -s "$tmpdir/small/huge.ssdcache" ] ||
        fail "the refused 15T cache left a non-empty file"
    umount "$tmpdir/small"
else
    notes+=("small filesystem: needs root and mount -t tmpfs")
fi

for n in "${notes[@]}"; do
    echo "$0: note: case skipped: $n"
done
