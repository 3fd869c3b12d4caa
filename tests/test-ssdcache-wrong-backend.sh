#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a cache built for one backend is never
# applied to another.  A different backing file (same size) is refused
# ("built for another backend"); a different size under the same
# ssdcache-id is refused ("backend size"); ssdcache-reset=true starts
# over and serves the new backend's data.  The same file reached
# through a symlink is the same backend.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdcopy --version
requires nbdinfo --version

size=$((2 * 1024 * 1024))
a="$tmpdir/a.img"
b="$tmpdir/b.img"
d="$tmpdir/d.img"
random_file "$a" $size
random_file "$b" $size
random_file "$d" $((size + 1024 * 1024))
cache="$tmpdir/c.ssdcache"

# read_all FILE [PARAMS...]: serve FILE through the cache, copy the
# whole export out, compare with FILE.
read_all ()
{
    local f="$1"
    shift
    rm -f "$tmpdir/copy.img"
    run_ssdcache file "$f" \
                 ssdcache-file="$cache" ssdcache-size=1M "$@" \
                 --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
    cmp "$f" "$tmpdir/copy.img" || fail "data read for $f is not $f's ($*)"
}

# must_refuse PATTERN FILE [PARAMS...]: nbdkit must refuse to start
# (not hang) with an error matching PATTERN.
must_refuse ()
{
    local pattern="$1" f="$2"
    shift 2
    expect_ssdcache_failure "$pattern" file "$f" \
                            ssdcache-file="$cache" ssdcache-size=1M "$@"
}

# Build the cache for A (twice: the second run is warm).
read_all "$a"
read_all "$a"

# Same file through a symlink: same backend.
ln -s "$a" "$tmpdir/a-link.img"
read_all "$tmpdir/a-link.img"

# B, same size, other path: refused.
must_refuse "built for another backend" "$b"
# The refusal must not have damaged the cache: A still works.
read_all "$a"

# With a reset B is served correctly, and then the cache is B's.
read_all "$b" ssdcache-reset=true
read_all "$b"
must_refuse "built for another backend" "$a"

# Same ssdcache-id, different size: refused.
rm -f "$cache"
read_all "$a" ssdcache-id=disk1
read_all "$a" ssdcache-id=disk1
must_refuse "backend size" "$d" ssdcache-id=disk1
# The user-given id replaces the automatic identity: B (same size as
# A) under the same id is accepted.  (This is what the id is for: the
# user vouches that it is the same disk.)  So only check it starts.
run_ssdcache file "$b" \
             ssdcache-file="$cache" ssdcache-size=1M ssdcache-id=disk1 --run true ||
    fail "same ssdcache-id and size was refused"
# Reset with the new size: D is served correctly.
read_all "$d" ssdcache-id=disk1 ssdcache-reset=true
read_all "$d" ssdcache-id=disk1
