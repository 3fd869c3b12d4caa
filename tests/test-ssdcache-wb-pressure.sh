#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: writeback under pressure.
#
#  1. Bypass: a 1 MiB cache over a slow backend (delay filter) takes far
#     more writes than it holds; writes that find no room go to the
#     backend (write_through_full) instead of waiting, and the data is
#     right (random-io.py model) before and after exit.
#  2. Backoff: a backend whose writes fail in one region only (sh
#     plugin, while a trigger file exists): that region's pages stay
#     dirty and the rest is written back all the same; once the errors
#     stop, everything is.
#  3. Cap: ssdcache-writeback-max-dirty=256K on 64 KiB pages: the cache
#     never holds more than 4 dirty pages (sampled over the control
#     socket under load), dirty_cap_writes counts the writes sent
#     through, the data is right.
#  4. Age: ssdcache-writeback-max-age=1 with the watermarks and idle
#     cleaning out of the way: dirty data is written back within a few
#     seconds, and without the limit it stays.
#  5. Sequential: nbdcopy (16 requests in flight) copies 16 MiB onto an
#     8 MiB cache whose writeback is slow: past the high watermark the
#     stream goes around the cache (seq_write_bypassed) although its
#     requests arrive out of order; with ssdcache-writeback-seq-cutoff=0
#     none does; the data is right both times.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdkit --filter=delay null --version
requires nbdkit sh --version
requires "$PYTHON" -c 'import nbd'
requires nbdsh --version

stats="$tmpdir/stats"
size=$((16 * 1024 * 1024))
field () { awk -v k="$1:" '$1 == k { print $2 }'; }
ctl () { "$SSDCACHE_TOOL" ctl "$tmpdir/ctl.sock" "$@"; }

# -- 1. bypass ----------------------------------------------------------

random_file "$img" $size
cp "$img" "$tmpdir/model0.img"
start_ssdcache -P "$tmpdir/pid" -U "$sock" --filter=delay file "$img" \
    delay-write=2ms ssdcache-file="$cache" ssdcache-size=1M \
    ssdcache-mode=writeback ssdcache-stats="$stats" \
    ssdcache-control="$tmpdir/ctl.sock"
"$PYTHON" "$random_io" --socket "$sock" --connections 2 --depth 8 \
    --ops 3000 --seed 11 --max-len 64K --mix read=40,write=55,flush=5 \
    --model "$tmpdir/model0.img" --save-model "$tmpdir/model1.img"
# (Drained before the stop: nbdkit's delay filter refuses to sleep once
# the server shuts down, which would fail the writeback at exit.)
ctl drain --wait
stop_nbdkit "$tmpdir/pid"
cmp "$img" "$tmpdir/model1.img" ||
    fail "bypass: after exit the backing file differs from the model"
[ "$(stat_get "$stats" write_through_full)" -gt 0 ] ||
    fail "bypass: no write went around the full cache"

# -- 2. backoff ---------------------------------------------------------

# Pages 0-3 (64 KiB pages) of the backend fail to be written while the
# trigger exists; the rest works.  With ssdcache-writeback-depth=16 a
# pass writes groups of 4 MiB / 16 = 4 pages: 0-3 is one run.
cat > "$tmpdir/plugin.sh" <<EOF
#!/usr/bin/env bash
case "\$1" in
    get_size) stat -c %s "$img" ;;
    pread) dd if="$img" skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none ;;
    pwrite)
        if [ -e "$trigger" ] && [ "\$4" -lt $((4 * 65536)) ]; then
            echo "EIO injected" >&2; exit 1
        fi
        dd of="$img" seek=\$4 oflag=seek_bytes conv=notrunc status=none ;;
    thread_model) echo parallel ;;
    can_write|can_flush) exit 0 ;;
    flush) sync "$img" ;;
    *) exit 2 ;;
esac
EOF
chmod +x "$tmpdir/plugin.sh"
rm -f "$cache"
start_ssdcache -P "$tmpdir/pid" -U "$sock" sh "$tmpdir/plugin.sh" \
    ssdcache-file="$cache" ssdcache-size=8M ssdcache-mode=writeback \
    ssdcache-writeback-idle=50 ssdcache-writeback-depth=16 \
    ssdcache-control="$tmpdir/ctl.sock"
touch "$trigger"
# The client stays connected while writeback works: the sh plugin asks
# for the export name, so this export's threads (and its control
# socket) use its connections (a last close would write back once and
# stop them).
hold_client writer "$(sock_uri "$sock")" '
for p in range(16):                       # pages 0-3 fail, 4-15 do not
    h.pwrite(bytes([p + 1]) * 65536, p * 65536)'
# wait_status FIELD OP VALUE: until "ctl status" says FIELD OP VALUE
# (-eq, -le, ...), at most 60 s.
wait_status ()
{
    local i v
    for (( i = 0; i < 600; i++ )); do
        v="$(ctl status | field "$1")"
        [ -n "$v" ] && [ "$v" "$2" "$3" ] && return 0
        sleep 0.1
    done
    fail "backoff: $1 never became $2 $3 (last: $v)"
}
wait_status dirty_pages -eq 4
ctl stats > "$tmpdir/st"
[ "$(field dirty_pages < "$tmpdir/st")" -eq 4 ] ||
    fail "backoff: expected the 4 failing pages dirty, the rest written back"
[ "$(field writeback_errors < "$tmpdir/st")" -gt 0 ] ||
    fail "backoff: no writeback error was counted"
rm "$trigger"
wait_status dirty_pages -eq 0
release_client writer
stop_nbdkit "$tmpdir/pid"
"$PYTHON" -c '
import sys
data = open(sys.argv[1], "rb").read()
for p in range(16):
    assert data[p * 65536:(p + 1) * 65536] == bytes([p + 1]) * 65536, p
' "$img" || fail "backoff: the backing file does not have the data"

# -- 3. cap -------------------------------------------------------------

random_file "$img" $size
cp "$img" "$tmpdir/model0.img"
rm -f "$cache"
start_ssdcache -P "$tmpdir/pid" -U "$sock" --filter=delay file "$img" \
    delay-write=1ms ssdcache-file="$cache" ssdcache-size=8M \
    ssdcache-mode=writeback ssdcache-writeback-max-dirty=256K \
    ssdcache-writeback-high=90 ssdcache-control="$tmpdir/ctl.sock" \
    ssdcache-stats="$stats"
"$PYTHON" "$random_io" --socket "$sock" --connections 2 --depth 4 \
    --ops 2000 --seed 12 --max-len 32K --mix read=30,write=65,flush=5 \
    --model "$tmpdir/model0.img" --save-model "$tmpdir/model1.img" &
io=$!
most=0
while kill -0 $io 2>/dev/null; do
    d="$(ctl status | field dirty_pages)"
    [ -n "$d" ] && [ "$d" -gt "$most" ] && most=$d
    sleep 0.05
done
wait $io || fail "cap: random I/O mismatch"
ctl drain --wait
stop_nbdkit "$tmpdir/pid"
echo "cap: at most $most dirty pages seen"
[ "$most" -le 4 ] || fail "cap: $most dirty pages with a cap of 4"
[ "$(stat_get "$stats" dirty_cap_writes)" -gt 0 ] ||
    fail "cap: no write was sent through at the cap"
cmp "$img" "$tmpdir/model1.img" || fail "cap: backing file differs"

# -- 4. age -------------------------------------------------------------

dirty_after ()
{
    rm -f "$cache"
    start_ssdcache -P "$tmpdir/pid" -U "$sock" file "$img" \
        ssdcache-file="$cache" ssdcache-size=8M ssdcache-mode=writeback \
        ssdcache-writeback-high=100 ssdcache-writeback-low=100 \
        ssdcache-writeback-idle=0 ssdcache-control="$tmpdir/ctl.sock" "$@"
    nbdsh -u "$(sock_uri "$sock")" -c 'h.pwrite(b"x" * 200000, 12345)'
    # Without a limit, 4 s in which nothing may be written back; with
    # one, until it is all written back (bounded: the check then fails).
    if [ $# -eq 0 ]; then
        sleep 4
    else
        for i in $(seq 600); do
            [ "$(ctl status | field dirty_pages)" = 0 ] && break
            sleep 0.1
        done
    fi
    ctl status | field dirty_pages
    stop_nbdkit "$tmpdir/pid"
}
[ "$(dirty_after)" -gt 0 ] || fail "age: without a limit nothing stayed dirty"
[ "$(dirty_after ssdcache-writeback-max-age=1)" -eq 0 ] ||
    fail "age: dirty data older than ssdcache-writeback-max-age stayed"

# -- 5. sequential ------------------------------------------------------

seq_copy ()
{
    rm -f "$cache" "$stats"
    random_file "$tmpdir/src.img" $size
    start_ssdcache -P "$tmpdir/pid" -U "$sock" --filter=delay file "$img" \
        delay-write=1ms ssdcache-file="$cache" ssdcache-size=8M \
        ssdcache-mode=writeback ssdcache-writeback-rate=1M \
        ssdcache-control="$tmpdir/ctl.sock" ssdcache-stats="$stats" "$@"
    nbdcopy --connections=1 --requests=16 --request-size=262144 \
        "$tmpdir/src.img" "$(sock_uri "$sock")"
    ctl drain --wait
    stop_nbdkit "$tmpdir/pid"
    cmp "$img" "$tmpdir/src.img" || fail "sequential: backing file differs"
}
seq_copy
n=$(stat_get "$stats" seq_write_bypassed)
echo "sequential: $n of 64 writes went around the cache"
# The first 4 MiB fill the cache to its high watermark; the rest (48
# writes) goes around.
[ "$n" -ge 40 ] || fail "sequential: only $n writes went around the cache"
seq_copy ssdcache-writeback-seq-cutoff=0
[ "$(stat_get "$stats" seq_write_bypassed)" -eq 0 ] ||
    fail "sequential: writes went around with the cutoff off"
