#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a cached clean page dropped while the cache
# device refuses writes (the man page, CACHE DEVICE FAILURES).
#
# Its entry still says "clean" with the old data, which verifies; the
# backend gets the newer data.  After kill -9 a plain start would serve
# the old copy, so the filter logs the first such page at once, telling
# the user to start the next time with ssdcache-verify=lazy; a start
# with it must serve the backend's data.  (check-chaos found the crash
# case: the message used to come only at a clean shutdown.)
source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdsh --version
shim="$(shim_path faultio)"

random_file "$img" $((1024 * 1024))
args=(file "$img" ssdcache-file="$tmpdir/c" ssdcache-size=1M
      ssdcache-page-size=4K ssdcache-mode=writethrough
      ssdcache-stats="$tmpdir/stats")

LD_PRELOAD="$shim" FAULTIO_PATH="$tmpdir/c" FAULTIO_TRIGGER="$trigger" \
FAULTIO_OPS=w start_ssdcache -P "$pid" -U "$sock" "${args[@]}" 2> "$log"
bounded 60 nbdsh -u "$(sock_uri "$sock")" -c '
h.pread(65536, 0)                        # pages 0-15 cached
h.flush()
'
touch "$trigger"                         # the device refuses writes
bounded 60 nbdsh -u "$(sock_uri "$sock")" -c '
h.pwrite(b"N" * 4096, 8192)
assert h.pread(4096, 8192) == b"N" * 4096
'
cat "$log"
grep -q "refused to record that cached page 2 was dropped.*start the next time with ssdcache-verify=lazy" "$log" ||
    fail "the unrecorded drop of a clean page was not logged at once"
crash_nbdkit "$pid"
rm -f "$trigger"

start_ssdcache -P "$pid" -U "$sock" "${args[@]}" ssdcache-verify=lazy
bounded 60 nbdsh -u "$(sock_uri "$sock")" -c '
assert h.pread(4096, 8192) == b"N" * 4096, "the old copy came back"
'
stop_nbdkit "$pid"
[ "$(stat_get "$tmpdir/stats" verify_mismatches)" -ge 1 ] ||
    fail "ssdcache-verify=lazy found no stale page"
