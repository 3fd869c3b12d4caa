#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: clients cannot make the server open unlimited
# caches (issue 27, item 4; design invariant 13).
#
#  1. A plugin that opens without a client connection cannot tell
#     export names apart: every name gets the one cache (no new file,
#     fd or thread per name), and in writeback a write under one name
#     is read under another.
#  2. file dir= (a disk per name) with ssdcache-exports-max=2: a third
#     name while two have clients is refused with a clear error and
#     nothing is created for it; once a client leaves, its export gives
#     back its fd and threads, and the third is served.
#  3. The export that was closed is warm when it comes back; when room
#     is needed, its file is removed instead.
#  4. At the limit, a client that comes right after another left is
#     served: nbdkit closes the connection after the client is gone,
#     and closing its export's cache takes time (here 1.5 s: a slow
#     sync, LD_PRELOAD shim), so the newcomer waits for that close.
#     (With the default export and b.img's client, which stays, three
#     are open.)
source "$(dirname "$0")/functions.sh"
set -e -x

requires "$PYTHON" -c 'import nbd'
requires nbdsh --version
requires nbdcopy --version
requires nbdkit --filter=stats null --version

cache="$tmpdir/cache"
uri_of () { echo "nbd+unix:///$1?socket=$sock"; }
nbd () { bounded 60 nbdsh -u "$(uri_of "$1")" -c "$2"; }
cache_fds () { ls -l /proc/"$(cat "$pid")"/fd | grep -c "$cache" || true; }
threads () { ls /proc/"$(cat "$pid")"/task | wc -l; }
# (nbdkit's threads of connections just closed may still be exiting.)
threads_at_most () { [ "$(threads)" -le "$1" ]; }

# -- 1. one disk under every name ---------------------------------------

truncate -s 4M "$tmpdir/disk.img"
start_ssdcache -P "$pid" -U "$sock" file "$tmpdir/disk.img" \
    ssdcache-file="$cache" ssdcache-size=4M ssdcache-mode=writeback \
    ssdcache-writeback-idle=0 ssdcache-writeback-high=100
nbd "" 'h.pread(4096, 0)'
fds=$(cache_fds); nthreads=$(threads)
for i in $(seq 40); do
    nbd "name$i" "h.pwrite(bytes([$i]) * 4096, $i * 4096)"
done
nbd "other" '
for i in range(1, 41):
    assert h.pread(4096, i * 4096) == bytes([i]) * 4096, i
'
[ "$(cache_fds)" -eq "$fds" ] || fail "new names opened cache files"
wait_until 30 threads_at_most "$nthreads" ||
    fail "new names started threads ($(threads), $nthreads before)"
ls "$cache".* 2>/dev/null && fail "a cache file per name was created"
stop_nbdkit "$pid"

# -- 2. a disk per name, at most two caches open ---------------------------

dir="$tmpdir/images"
mkdir "$dir"
for e in a b c; do random_file "$dir/$e.img" $((2 * 1024 * 1024)); done
rm -f "$cache" "$cache".*
start_ssdcache -P "$pid" -U "$sock" --filter=stats file dir="$dir" \
    statsfile="$tmpdir/bstats" ssdcache-file="$cache" ssdcache-size=6M \
    ssdcache-exports-max=2 -D ssdcache.exports=1 2> "$tmpdir/log"
# The default export ("", which file dir= lacks) keeps one of the two.
hold_client a "$(uri_of a.img)" 'h.pread(2 * 1024 * 1024, 0)'
fds=$(cache_fds)
if nbdsh -u "$(uri_of b.img)" -c 'h.pread(512, 0)' 2> "$tmpdir/err"; then
    fail "a third export was served with ssdcache-exports-max=2"
fi
cat "$tmpdir/err"
grep -q "export 'b.img' refused: .*(ssdcache-exports-max=2)" "$tmpdir/log" ||
    fail "no clear error for the export over the limit"
[ "$(cache_fds)" -eq "$fds" ] || fail "the refused export opened a file"
ls "$cache".* | grep -c . | grep -qx 1 ||
    fail "the refused export created a cache file"
release_client a
# a.img's client left: its cache goes (bounded wait for the close).
for (( i = 0; i < 300; i++ )); do
    [ "$(cache_fds)" -lt "$fds" ] && break
    sleep 0.1
done
[ "$(cache_fds)" -lt "$fds" ] || fail "the idle export kept its cache file"
nbd b.img 'h.pread(2 * 1024 * 1024, 0)'

# -- 3. warm when it comes back; removed when room is needed ------------

before=$(backend_read_bytes "$tmpdir/bstats" 2>/dev/null || echo 0)
stop_nbdkit "$pid"
start_ssdcache -P "$pid" -U "$sock" --filter=stats file dir="$dir" \
    statsfile="$tmpdir/bstats" ssdcache-file="$cache" ssdcache-size=6M \
    ssdcache-exports-max=2 -D ssdcache.exports=1 2> "$tmpdir/log"
nbd a.img 'h.pread(2 * 1024 * 1024, 0)'        # parked when it ends
nbd a.img 'h.pread(2 * 1024 * 1024, 0)'        # opened again, warm
stop_nbdkit "$pid"
cat "$tmpdir/bstats"
b="$(backend_read_bytes "$tmpdir/bstats")"
[ "$b" -le $((2 * 1024 * 1024 + 65536)) ] ||
    fail "the export opened again read $b bytes from the backend"
# 6M of room: a.img (parked, 2M) must go for b.img and c.img (2M each)
# once the others are read again; nothing over the budget stays.
start_ssdcache -P "$pid" -U "$sock" file dir="$dir" \
    ssdcache-file="$cache" ssdcache-size=4M ssdcache-exports-max=2
nbd a.img 'h.pread(2 * 1024 * 1024, 0)'
nbd b.img 'h.pread(2 * 1024 * 1024, 0)'
nbd c.img 'h.pread(2 * 1024 * 1024, 0)'
stop_nbdkit "$pid"
for f in "$cache".*; do
    "$SSDCACHE_TOOL" info "$f" | grep "^identity:"
    ! "$SSDCACHE_TOOL" info "$f" | grep -q "^identity: .* export=a.img\$" ||
        fail "the parked export a.img kept its file: it gave no room"
done
used=$(( $(du -B1 -c "$cache".* | tail -1 | cut -f1) ))
nfiles=$(ls "$cache".* | wc -l)
[ "$used" -le $(( (4 + nfiles) * 1024 * 1024)) ] ||
    fail "the cache files take $used bytes for a 4M budget"
for e in a b c; do
    nbdkit -U - --filter="$SSDCACHE_FILTER" file dir="$dir" \
        ssdcache-file="$cache" ssdcache-size=4M \
        --run "nbdcopy \"nbd+unix:///$e.img?socket=\$unixsocket\" $tmpdir/copy"
    cmp "$dir/$e.img" "$tmpdir/copy" || fail "$e.img read wrong"
done

# -- 4. the next client while the last one's cache is closing ---------

rm -f "$cache" "$cache".*
export LD_PRELOAD="$(shim_path faultio)" FAULTIO_PATH="$cache*" \
    FAULTIO_TRIGGER="$tmpdir/slow" FAULTIO_OPS=s FAULTIO_DELAY_MS=1500
start_ssdcache -P "$pid" -U "$sock" file dir="$dir" \
    ssdcache-file="$cache" ssdcache-size=6M ssdcache-exports-max=3
unset LD_PRELOAD FAULTIO_PATH FAULTIO_TRIGGER FAULTIO_OPS FAULTIO_DELAY_MS
hold_client b "$(uri_of b.img)" 'h.pread(4096, 0)'
touch "$tmpdir/slow"            # a sync of a cache file takes 1.5 s
nbd a.img 'h.pread(4096, 0)'    # so closing its cache does
nbd c.img 'h.pread(4096, 0)' ||
    fail "c.img refused while a.img's cache was closing"
rm "$tmpdir/slow"
release_client b
stop_nbdkit "$pid"
