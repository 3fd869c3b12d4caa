#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter with no ssdcache-file: the cache file is made
# in $NBDKIT_SSDCACHE_DIR (created, mode 0700), named
# <16 hex digits>.ssdcache, mode 0600, one per backend; a second run
# on the same backend finds it and is warm.  Without
# NBDKIT_SSDCACHE_DIR, $XDG_CACHE_HOME/nbdkit-ssdcache is used.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdcopy --version
requires nbdkit --filter=stats null --version

other="$tmpdir/other.img"
size=$((2 * 1024 * 1024))
random_file "$img" $size
random_file "$other" $size
dir="$tmpdir/dir"
export NBDKIT_SSDCACHE_DIR="$dir"
stats="$tmpdir/stats"
bstats="$tmpdir/backend.stats"

run ()
{
    local f="$1"
    shift
    rm -f "$stats" "$bstats"
    run_ssdcache --filter=stats file "$f" \
                 statsfile="$bstats" ssdcache-stats="$stats" "$@" \
                 --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
    cmp "$f" "$tmpdir/copy.img" || fail "data read differs from $f"
}

[ ! -e "$dir" ]
run "$img"
ls -la "$dir"
[ -d "$dir" ] || fail "$dir was not created"
[ "$(stat -c %a "$dir")" = 700 ] || fail "$dir has mode $(stat -c %a "$dir"), not 700"
files=( "$dir"/*.ssdcache )
[ ${#files[@]} -eq 1 ] && [ -f "${files[0]}" ] ||
    fail "expected one *.ssdcache file in $dir, found: $(ls -A "$dir")"
name="$(basename "${files[0]}")"
[[ "$name" =~ ^[0-9a-f]{16}\.ssdcache$ ]] ||
    fail "cache file name $name is not <16 hex digits>.ssdcache"
[ "$(stat -c %a "${files[0]}")" = 600 ] ||
    fail "${files[0]} has mode $(stat -c %a "${files[0]}"), not 600"
[ "$(ls -A "$dir" | wc -l)" -eq 1 ] || fail "stray files in $dir: $(ls -A "$dir")"

# Second run: same file, warm.
run "$img"
[ "$(ls -A "$dir" | wc -l)" -eq 1 ] || fail "second run made another file: $(ls -A "$dir")"
b="$(backend_read_bytes "$bstats")"
[ "$b" -le $((size / 64)) ] || fail "second run read $b bytes from the backend: not warm"
[ "$(stat_get "$stats" loaded_slots)" -gt 0 ] || fail "second run loaded no slot"

# Another backend gets another file; the first one is untouched.
sum1="$(md5sum < "${files[0]}")"
run "$other"
[ "$(ls -A "$dir"/*.ssdcache | wc -l)" -eq 2 ] ||
    fail "another backend did not get its own cache file: $(ls -A "$dir")"
[ "$(md5sum < "${files[0]}")" = "$sum1" ] ||
    fail "running another backend modified the first backend's cache file"
# ... and the first is still warm.
run "$img"
b="$(backend_read_bytes "$bstats")"
[ "$b" -le $((size / 64)) ] || fail "first backend not warm after another ran"

# Without NBDKIT_SSDCACHE_DIR: $XDG_CACHE_HOME/nbdkit-ssdcache.
unset NBDKIT_SSDCACHE_DIR
export XDG_CACHE_HOME="$tmpdir/xdg"
run "$img"
ls -la "$XDG_CACHE_HOME/nbdkit-ssdcache"
[ "$(ls "$XDG_CACHE_HOME"/nbdkit-ssdcache/*.ssdcache | wc -l)" -eq 1 ] ||
    fail "no cache file under \$XDG_CACHE_HOME/nbdkit-ssdcache"
[ "$(ls "$XDG_CACHE_HOME"/nbdkit-ssdcache/)" = "$name" ] ||
    fail "the file name depends on the directory"
