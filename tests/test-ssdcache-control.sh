#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: runtime control (ssdcache-control=SOCKET and
# "ssdcache ctl").
#
#  - the socket is created mode 0600 and removed at exit;
#  - status, stats, invalidate (clean pages go, dirty ones stay);
#  - malformed and unknown commands get an error and change nothing; a
#    client that sends garbage, or goes away in the middle of a
#    command, leaves the server answering and nothing lost;
#  - mode switches and drains under a model-checked random I/O load:
#    0 mismatches, and after "drain --wait" the backing file alone holds
#    every write;
#  - no switch to writeback over a read-only plugin (pattern).

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdsh --version
[ -x "$SSDCACHE_TOOL" ] || fail "SSDCACHE_TOOL ($SSDCACHE_TOOL) not built"
random_io="$abs_top_srcdir/tests/random-io.py"

sock="$tmpdir/ctl.sock"
size=$((8 * 1024 * 1024))
random_file "$img" $size

ctl () { "$SSDCACHE_TOOL" ctl "$sock" "$@"; }
# ctl_fails PATTERN ARGS...: the command fails (status 1) saying PATTERN.
ctl_fails ()
{
    local pat="$1" r=0
    shift
    ctl "$@" 2> "$tmpdir/err" || r=$?
    [ $r -eq 1 ] || fail "ctl $*: status $r, expected 1"
    grep -q -- "$pat" "$tmpdir/err" || fail "ctl $*: no '$pat' in: $(cat "$tmpdir/err")"
}
field () { awk -F': *' -v k="$1" '$1 == k { print $2 }'; }
# The socket is made once the cache is attached, after nbdkit's pid file.
wait_socket ()
{
    for i in $(seq 100); do [ -S "$sock" ] && return; sleep 0.1; done
    fail "no control socket $sock"
}

start_ssdcache -P "$pid" -U "$tmpdir/nbd.sock" file "$img" \
               ssdcache-file="$tmpdir/cache" ssdcache-size=4M \
               ssdcache-page-size=4K ssdcache-control="$sock"
uri="nbd+unix:///?socket=$tmpdir/nbd.sock"
wait_socket
[ "$(stat -c %a "$sock")" = 600 ] || fail "socket mode $(stat -c %a "$sock")"
[ "$(stat -c %u "$sock")" = "$(id -u)" ] || fail "socket not the user's"

ctl status > "$tmpdir/out"
[ "$(field mode < "$tmpdir/out")" = writethrough ] || fail "mode"
ctl stats | grep -q '^read_ops: ' || fail "stats has no read_ops"

# Bad commands: an error, and nothing changes.
ctl_fails "unknown command" frobnicate
ctl_fails "usage: mode" mode bogus
ctl_fails "usage: mode" mode
ctl_fails "usage: drain" drain --now
ctl_fails "invalidate" invalidate x 4096
ctl_fails "invalidate" invalidate 0 0
ctl_fails "usage: invalidate" invalidate 1 2 3
ctl_fails "usage" ""
[ "$(ctl status | field mode)" = writethrough ] || fail "a bad command changed the mode"
# Garbage without a newline, too long, and a client that goes away in
# the middle of a drain: the server still answers.
$PYTHON - "$sock" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.sendall(b"x" * 5000)
print(s.recv(4096)); s.close()
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.sendall(b"drain --wait\n"); s.close()
PY
ctl status > /dev/null

# invalidate: clean cached pages go (the next read is a miss again).
nbdcopy "$uri" - > /dev/null
n=$(ctl invalidate | field dropped_pages)
[ "$n" -gt 0 ] || fail "invalidate dropped $n pages"
n=$(ctl invalidate 0 4096 | field dropped_pages)
[ "$n" -eq 0 ] || fail "invalidate of an empty cache dropped $n pages"

# Mode switches and drains under load, checked against a model.
cp "$img" "$tmpdir/before.img"
"$PYTHON" "$random_io" --uri "$uri" --connections 2 --ops 30000 \
          --seed 7 --max-len 64K --mix read=50,write=40,zero=5,flush=5 \
          --model "$tmpdir/before.img" --save-model "$tmpdir/expected.img" &
load=$!
for m in writeback writearound writeback writethrough writeback; do
    sleep 0.5
    ctl mode $m > /dev/null
    [ "$(ctl status | field mode)" = $m ] || fail "mode is not $m"
done
ctl drain > /dev/null
sleep 0.3
ctl drain --wait > /dev/null
wait $load || fail "the random I/O load saw a mismatch or an error"

# Dirty data stays through invalidate; drain --wait puts all of it in
# the backing file.
write_flush "$uri" $((1 << 20)) 8192 D
printf 'D%.0s' $(seq 8192) | dd of="$tmpdir/expected.img" bs=1 \
    seek=$((1 << 20)) conv=notrunc 2>/dev/null
[ "$(ctl status | field dirty_pages)" -gt 0 ] || fail "no dirty pages in writeback"
ctl invalidate > /dev/null
[ "$(ctl status | field dirty_pages)" -gt 0 ] || fail "invalidate dropped dirty data"
ctl drain --wait > /dev/null
[ "$(ctl status | field dirty_pages)" -eq 0 ] || fail "dirty pages after drain --wait"
cmp "$img" "$tmpdir/expected.img" ||
    fail "after drain --wait the backing file is not the export"
nbdcopy "$uri" "$tmpdir/export.img"
cmp "$img" "$tmpdir/export.img" || fail "the export is not the backing file"

# The socket goes at exit.
kill "$(cat "$pid")"
for i in $(seq 100); do kill -0 "$(cat "$pid")" 2>/dev/null || break; sleep 0.1; done
[ ! -e "$sock" ] || fail "the control socket is left after exit"

# No writeback over a read-only plugin.
start_ssdcache -P "$pid" -U "$tmpdir/nbd.sock" pattern size=8M \
               ssdcache-file="$tmpdir/cache.ro" ssdcache-size=4M \
               ssdcache-control="$sock"
wait_socket
ctl_fails "writable" mode writeback
[ "$(ctl status | field mode)" = writethrough ] || fail "mode changed"
