#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: multi-conn is advertised only where a FLUSH
# on one connection covers the writes of every connection, and then it
# does: data written on connection A, a FLUSH on connection B, kill -9
# of nbdkit, a restart: A's data is there.
#
# The plugin is the file plugin with nbdkit's multi-conn filter in
# multi-conn-mode=disable under the cache, so that it offers no
# multi-conn of its own, and nbdkit's log filter under that, which
# shows the FUA flag of what the filter sends to the plugin:
#
# 1. writeback, ssdcache-flush=cache and =backend: both connections are
#    told multi-conn; A writes whole pages, part of a page, part of a
#    page three times (its slot is then rewritten in place, unsealed:
#    recovery uses it only if a flush sealed it) and zeroes (which go
#    to the plugin itself, so with FUA), B flushes, kill -9.
# 2. a connection told multi-conn in writeback mode, then a switch to
#    writethrough (ssdcache ctl): A's writes now go to the plugin, with
#    FUA; B flushes, kill -9.
# 3. writethrough and writearound over that plugin: no multi-conn; over
#    the file plugin alone (which offers it): multi-conn in every mode.
source "$(dirname "$0")/functions.sh"
set -e -u -x

requires "$PYTHON" -c 'import nbd'
requires nbdinfo --version
requires nbdcopy --version
requires nbdkit --filter=multi-conn null --version
requires nbdkit --filter=log null --version

ctl_sock="$tmpdir/ctl.sock"
belog="$tmpdir/backend.log"
size=$((8 * 1024 * 1024))
export sock size

# The plugin without multi-conn, its requests logged.
no_mc=(--filter=multi-conn --filter=log file "$img"
       multi-conn-mode=disable logfile="$belog" logappend=true)

# connect_two MODE-SWITCH: connections A and B, both must be told
# multi-conn; A writes, B flushes; the expected image is saved as
# $tmpdir/expected.img.  With MODE-SWITCH "writethrough", the mode is
# switched (ssdcache ctl) after both connected and before A writes.
connect_two ()
{
    cp "$img" "$tmpdir/expected.img"
    switch="$1" "$PYTHON" - "$tmpdir/expected.img" <<'PY'
import os, subprocess, sys
import nbd

uri = "nbd+unix:///?socket=" + os.environ["sock"]
a = nbd.NBD(); a.connect_uri(uri)
b = nbd.NBD(); b.connect_uri(uri)
for name, h in (("A", a), ("B", b)):
    assert h.can_multi_conn(), "connection %s was not told multi-conn" % name
if os.environ["switch"]:
    subprocess.run([os.environ["SSDCACHE_TOOL"], "ctl", os.environ["ctl_sock"],
                    "mode", os.environ["switch"]], check=True,
                   stdout=subprocess.DEVNULL)

exp = open(sys.argv[1], "r+b")
def write(off, data):
    a.pwrite(data, off)
    exp.seek(off); exp.write(data)
page = 65536
write(0, os.urandom(2 * page))              # whole pages
write(5 * page + 1000, os.urandom(3000))    # part of a page
write(40 * page - 512, os.urandom(page))    # across two pages
for i in range(3):                # rewritten in place: only a flush
    write(20 * page + 4096, os.urandom(8192))  # makes it count
a.zero(2 * page, 9 * page)                  # goes to the plugin
exp.seek(9 * page); exp.write(bytes(2 * page))
exp.close()
b.flush()
# A stays connected: nbdkit is killed with both connections open.
print("A wrote, B flushed")
sys.stdout.flush()
os.kill(int(open(os.environ["pidfile"]).read()), 9)
PY
}

# check_after_restart: nbdkit on the same cache file and plugin
# (writethrough) serves exactly the expected image.
check_after_restart ()
{
    run_ssdcache "${no_mc[@]}" ssdcache-file="$cache" \
        --run 'nbdcopy "$uri" '"'$tmpdir/after.img'"
    cmp "$tmpdir/expected.img" "$tmpdir/after.img" ||
        fail "$1: data written on A and flushed on B is not there after kill -9"
}

export ctl_sock pidfile="$pid"

# -- 1. writeback ---------------------------------------------------------
for flush in cache backend; do
    random_file "$img" $size
    rm -f "$cache" "$belog"
    start_ssdcache -P "$pid" -U "$sock" "${no_mc[@]}" ssdcache-file="$cache" \
        ssdcache-mode=writeback ssdcache-flush=$flush \
        ssdcache-writeback-idle=0 ssdcache-writeback-on-exit=false
    connect_two ""
    _wait_gone "$(cat "$pid")" 30 || fail "nbdkit survived kill -9"
    unset "_live_pids[$(cat "$pid")]"
    rm -f "$pid"
    cat "$belog"
    grep -E 'Zero .*fua=1' "$belog" ||
        fail "writeback, flush=$flush: a zero sent to the plugin without FUA"
    check_after_restart "writeback, ssdcache-flush=$flush"
done

# -- 2. told multi-conn in writeback, then switched to writethrough ------
random_file "$img" $size
rm -f "$cache" "$belog"
start_ssdcache -P "$pid" -U "$sock" "${no_mc[@]}" ssdcache-file="$cache" \
    ssdcache-mode=writeback ssdcache-control="$ctl_sock" \
    ssdcache-writeback-idle=0
connect_two writethrough
_wait_gone "$(cat "$pid")" 30 || fail "nbdkit survived kill -9"
unset "_live_pids[$(cat "$pid")]"
rm -f "$pid"
cat "$belog"
# Every write A sent to the plugin after the switch had FUA.
if grep -E ' Write .*fua=0' "$belog"; then
    fail "after the switch to writethrough, a write went without FUA"
fi
grep -E ' Write .*fua=1' "$belog" ||
    fail "after the switch to writethrough, no write reached the plugin"
check_after_restart "switched to writethrough"

# -- 3. what each mode is told --------------------------------------------
random_file "$img" $size
for mode in writethrough writearound writeback; do
    rm -f "$cache"
    run_ssdcache "${no_mc[@]}" ssdcache-file="$cache" ssdcache-mode=$mode \
        --run 'nbdinfo "$uri"' > "$tmpdir/info"
    cat "$tmpdir/info"
    case $mode in
        writeback) want=true ;;
        *) want=false ;;
    esac
    grep -E "can_multi_conn:[[:space:]]+$want\$" "$tmpdir/info" ||
        fail "$mode over a plugin without multi-conn: can_multi_conn is not $want"
    rm -f "$cache"
    run_ssdcache file "$img" ssdcache-file="$cache" ssdcache-mode=$mode \
        --run 'nbdinfo "$uri"' > "$tmpdir/info"
    grep -E "can_multi_conn:[[:space:]]+true\$" "$tmpdir/info" ||
        fail "$mode over the file plugin: can_multi_conn is not true"
done
