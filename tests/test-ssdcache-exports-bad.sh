#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: bad exports: one the plugin lacks gets the
# plugin's error; one whose size changed is refused while the others
# are served, and is served again after ssdcache-reset=true.

source "$(dirname "$0")/functions.sh"
source "$(dirname "$0")/exports.sh-inc"
set -e -x

requires nbdcopy --version
requires nbdinfo --version

rm -f "$cache" "$cache".*
start_ssdcache -P "$tmpdir/b.pid" -U "$tmpdir/b.sock" file dir="$dir" \
    ssdcache-file="$cache" ssdcache-size=16M
if nbdinfo "$(uri_of nope.img "$tmpdir/b.sock")" 2> "$tmpdir/err"
then
    fail "an export that does not exist was served"
fi
cat "$tmpdir/err"
# The file plugin's own error (open: No such file or directory).
# (Not nbdinfo --size: libnbd 1.22's prints no server error there.)
grep -q "No such file or directory" "$tmpdir/err" ||
    fail "the client did not get the plugin's error for a missing export"
nbdcopy "$(uri_of a.img "$tmpdir/b.sock")" "$tmpdir/copy"
nbdcopy "$(uri_of b.img "$tmpdir/b.sock")" "$tmpdir/copy"
stop_nbdkit "$tmpdir/b.pid"

# b.img grows: its cache is refused, a.img is still served (warm).
truncate -s 6M "$dir/b.img"
start_ssdcache -P "$tmpdir/b.pid" -U "$tmpdir/b.sock" file dir="$dir" \
    ssdcache-file="$cache" ssdcache-size=16M
if nbdinfo --size "$(uri_of b.img "$tmpdir/b.sock")" 2> "$tmpdir/err"; then
    fail "b.img served although its size changed"
fi
nbdcopy "$(uri_of a.img "$tmpdir/b.sock")" "$tmpdir/copy"
cmp "$dir/a.img" "$tmpdir/copy" || fail "a.img wrong after b.img changed"
stop_nbdkit "$tmpdir/b.pid"
# ... and reset on request.
run_ssdcache --timeout 60 file dir="$dir" ssdcache-file="$cache" \
    ssdcache-size=16M ssdcache-reset=true \
    --run 'nbdcopy "nbd+unix:///b.img?socket=$unixsocket" "$tmpdir/copy"'
cmp "$dir/b.img" "$tmpdir/copy" || fail "b.img wrong after a reset"
