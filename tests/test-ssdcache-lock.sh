#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: one cache file, one owner.  While a server
# uses a cache file, a second nbdkit on the same file fails at start
# ("in use by another process"), even for another backing file; once
# the first one has exited the file can be used again.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdinfo --version
requires nbdcopy --version

random_file "$img" $((1024 * 1024))

start_ssdcache -P "$pid" -U "$sock" \
               file "$img" ssdcache-file="$cache"
# The first server works.
[ "$(nbdinfo --size "$(sock_uri "$sock")")" -eq $((1024 * 1024)) ]

second ()
{
    expect_ssdcache_failure "in use by another process" "$@"
}

# Same backend, same cache file.
second file "$img" ssdcache-file="$cache"
# Another backend (even with a reset asked for) must not take it over.
cp "$img" "$tmpdir/other.img"
second file "$tmpdir/other.img" ssdcache-file="$cache" ssdcache-reset=true
# Through a symlink to the cache file.
ln -s "$cache" "$tmpdir/link.ssdcache"
second file "$img" ssdcache-file="$tmpdir/link.ssdcache"

# The first server is unharmed.
nbdcopy --no-extents "$(sock_uri "$sock")" "$tmpdir/copy.img"
cmp "$img" "$tmpdir/copy.img" || fail "the first server's data changed"
stop_nbdkit "$pid"

# Free again: a new server starts.
run_ssdcache file "$img" ssdcache-file="$cache" \
             --run 'nbdinfo --size "$uri"' ||
    fail "the cache file could not be used after its owner exited"
