#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a restart is warm for every export of a plugin
# that serves several (stats filter below the cache).

source "$(dirname "$0")/functions.sh"
source "$(dirname "$0")/exports.sh-inc"
set -e -x

requires nbdcopy --version
requires nbdkit --filter=stats null --version

rm -f "$cache" "$cache".*
read_all ()
{
    local e="$1" bstats="$tmpdir/bstats"
    rm -f "$bstats"
    run_ssdcache --filter=stats file dir="$dir" statsfile="$bstats" \
        ssdcache-file="$cache" ssdcache-size=32M \
        --run "nbdcopy --no-extents \"nbd+unix:///$e?socket=\$unixsocket\" \
               \"$tmpdir/copy\""
    cmp "$dir/$e" "$tmpdir/copy" || fail "$e read wrong"
    backend_read_bytes "$bstats"
}
for e in a.img b.img c.img; do read_all $e > /dev/null; done
for e in a.img b.img c.img; do
    size="$(stat -c %s "$dir/$e")"
    b="$(read_all $e)"
    [ "$b" -le $((size / 100)) ] ||
        fail "$e: the warm read took $b bytes from the backend"
done
