#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a page dropped while an older version of it
# is still on the cache file and the device cannot sync.
#
# In writeback a rewrite of a flushed dirty page is copied on write;
# the older slot stays on the cache file until the copy is synced.
# Dropping the copy first frees that older version (cache_settle).
# When the device refused the sync, the copy's entry was freed all the
# same, so after kill -9 the older dirty version came back and was
# written back over newer data (found by check-chaos).  Now the copy's
# entry stays, hiding the older version; it is stale (clean, older than
# the backend), which the filter logs, and a start with
# ssdcache-verify=lazy then serves the backend's data.
source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdsh --version
shim="$(shim_path faultio)"

truncate -s 1M "$img"
args=(file "$img" ssdcache-file="$tmpdir/c" ssdcache-size=1M
      ssdcache-page-size=64K ssdcache-mode=writeback
      ssdcache-writeback-idle=0 ssdcache-writeback-high=100)

LD_PRELOAD="$shim" FAULTIO_PATH="$tmpdir/c" FAULTIO_TRIGGER="$trigger" \
FAULTIO_OPS=s start_ssdcache -P "$pid" -U "$sock" "${args[@]}" 2> "$log"
bounded 60 nbdsh -u "$(sock_uri "$sock")" -c '
h.pwrite(b"1" * 65536, 0)             # dirty, made durable by the flush
h.flush()
h.pwrite(b"2" * 4096, 0)              # copied on write
'
touch "$trigger"                       # fdatasync fails from now on
bounded 60 nbdsh -u "$(sock_uri "$sock")" -c '
try:
    h.flush()                          # degraded: written back
except nbd.Error:
    pass
h.pwrite(b"3" * 4096, 0)               # around the cache: the copy goes
assert h.pread(4096, 0) == b"3" * 4096
'
cat "$log"
grep -q "start the next time with ssdcache-verify=lazy" "$log" ||
    fail "the stale entry left on the cache file was not logged"
crash_nbdkit "$pid"
rm -f "$trigger"
cmp -n 4096 "$img" <(head -c 4096 /dev/zero | tr '\0' 3) ||
    fail "the backing file lacks the last write"

start_ssdcache -P "$pid" -U "$sock" "${args[@]}" ssdcache-verify=lazy
bounded 60 nbdsh -u "$(sock_uri "$sock")" -c '
got = h.pread(65536, 0)
assert got[:4096] == b"3" * 4096, "older data came back: %r" % got[:4]
assert got[4096:] == b"1" * 61440
'
stop_nbdkit "$pid"
cmp -n 4096 "$img" <(head -c 4096 /dev/zero | tr '\0' 3) ||
    fail "older data was written back over the last write"
