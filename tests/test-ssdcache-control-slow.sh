#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a slow control client cannot hold the control
# socket (issue 27, item 6).
#
# One thread answers ssdcache-control, one client at a time.  A client
# that sends a byte every second and never a whole line must be dropped
# once CONTROL_TIMEOUT_MS (5 s) have passed since it connected, not
# kept as long as it trickles: another client's "status" is answered
# within a few seconds, and a SIGTERM ends nbdkit while such a client
# is connected.
source "$(dirname "$0")/functions.sh"
set -e -x

requires "$PYTHON" -c 'import socket'

truncate -s 1M "$tmpdir/disk.img"

# slow_client: connect, then one byte a second for 60 s (no newline);
# says on $tmpdir/connected once it is connected.
slow_client ()
{
    "$PYTHON" - "$ctl" "$tmpdir/connected" <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
open(sys.argv[2], "w").write("connected\n")
for _ in range(60):
    try:
        s.send(b"s")
    except OSError:
        break
    time.sleep(1)
PY
    slow=$!
    cleanup_fn kill $slow
}

start_ssdcache -P "$pid" -U "$sock" file "$tmpdir/disk.img" \
    ssdcache-file="$tmpdir/c" ssdcache-control="$ctl"
mkfifo "$tmpdir/connected"
slow_client
read -r _ < "$tmpdir/connected"
t0=$SECONDS
bounded 20 "$SSDCACHE_TOOL" ctl "$ctl" status > "$tmpdir/status" ||
    fail "status failed"
cat "$tmpdir/status"
grep -q "^mode: writethrough$" "$tmpdir/status" ||
    fail "status was not answered"
echo "status answered after $((SECONDS - t0)) s"
kill $slow 2>/dev/null || true
wait $slow 2>/dev/null || true

# A stop while a slow client is connected: nbdkit ends (stop_nbdkit
# fails after 30 s).
slow_client
read -r _ < "$tmpdir/connected"
stop_nbdkit "$pid"
