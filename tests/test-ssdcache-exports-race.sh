#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: two first connections to a new export name at
# once are both served (issue 27, item 10).
#
# The first connection to a name opens its cache file, which locks it.
# Two first connections at once raced: the loser's own open found the
# file locked, by its own process, and failed with "in use by another
# process".  Here pairs of clients connect at once to each of 16 new
# names of file dir=; every one must be served.
source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdcopy --version

dir="$tmpdir/images"
mkdir "$dir"
for i in $(seq 16); do random_file "$dir/$i.img" 65536; done
start_ssdcache -P "$tmpdir/pid" -U "$tmpdir/sock" file dir="$dir" \
    ssdcache-file="$tmpdir/c" ssdcache-exports-max=64 2> "$tmpdir/log"
for i in $(seq 16); do
    uri="nbd+unix:///$i.img?socket=$tmpdir/sock"
    nbdcopy "$uri" "$tmpdir/a.$i" & a=$!
    nbdcopy "$uri" "$tmpdir/b.$i" & b=$!
    wait $a || fail "export $i.img: the first client was refused"
    wait $b || fail "export $i.img: the second client was refused"
    cmp "$dir/$i.img" "$tmpdir/a.$i" && cmp "$dir/$i.img" "$tmpdir/b.$i" ||
        fail "export $i.img: wrong data"
done
stop_nbdkit "$tmpdir/pid"
! grep "in use by another process" "$tmpdir/log" ||
    fail "a connection found its own process holding the cache file"
