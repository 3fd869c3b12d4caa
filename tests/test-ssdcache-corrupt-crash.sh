#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a cache file left by kill -9 in writeback mode
# (superblock not marked clean, clean and dirty pages) and then damaged
# never yields wrong data.
#
# One crashed cache is made: pages 0..39 read (clean), pages 8..15
# overwritten (dirty, flushed to the cache), then SIGKILL.  Each case
# damages a copy of it in one way and restarts nbdkit (writeback,
# nothing written back, so the backing file stays as it was).  Either
# nbdkit refuses to start with a message naming the cache file and the
# problem, or it starts and every page reads as the backing file's
# bytes or, for a dirty page that survived, as written; the dirty pages
# that read as the backing file's are exactly the lost ones the case
# expects, counted (dirty_dropped / damaged_entries) and logged loudly.
# Before each start, "ssdcache check" (tools/ssdcache) runs on the
# damaged file: it must find the same damage (exit 1; 2 for a file a
# start refuses as unreadable), name the damaged superblock copy, slot
# and page, list exactly the dirty pages that start loses as at risk,
# and predict the counters that start then shows.
#
# Layout (filter/core/layout.h): 4 KiB pages and 64 slots here, so the page
# table is one 4 KiB block at 8192 and the pool starts at 1 MiB.

source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd

snap="$tmpdir/snap.ssdcache"
page=4096
size=$((1024 * 1024))
pt=8192
pool=$((1024 * 1024))
random_file "$img" $size
cp "$img" "$tmpdir/orig.img"

args=( file "$img" ssdcache-file="$cache"
       ssdcache-size=256K ssdcache-page-size=4K ssdcache-mode=writeback
       ssdcache-writeback-idle=0 ssdcache-writeback-high=100
       ssdcache-writeback-on-exit=false ssdcache-stats="$stats" )

# -- the crashed cache ------------------------------------------------------

start_ssdcache -P "$pid" -U "$sock" "${args[@]}"
"$PYTHON" - "$sock" <<'PY'
import sys, nbd
h = nbd.NBD(); h.connect_unix(sys.argv[1])
h.pread(40 * 4096, 0)
for p in range(8, 16):
    h.pwrite(bytes([p * 17 % 251 + 1]) * 4096, p * 4096)
h.flush()
PY
crash_nbdkit "$pid"
cp "$cache" "$snap"
cmp "$img" "$tmpdir/orig.img" || fail "the crashed run wrote the backing file"

# cache_tool CMD ARGS...: inspect or damage $cache.
#   slot PAGE             slot holding PAGE (from the page table)
#   newest                index (0/1) of the newest superblock copy
#   flip OFFSET BIT       flip one bit
#   zero OFFSET LEN       write zeroes
#   garbage OFFSET LEN    write random bytes
#   future                newest copy: format version 2, checksum fixed
cache_tool ()
{
    "$PYTHON" - "$cache" "$@" <<'PY'
import os, struct, sys
path, cmd, args = sys.argv[1], sys.argv[2], [int(a) for a in sys.argv[3:]]
from ssdtest import crc32c
def sb_ok(raw):
    return raw[:8] == b"NBDKSSDC" and \
        struct.unpack_from("<I", raw, 4092)[0] == crc32c(raw[:4092])
with open(path, "r+b") as f:
    if cmd == "slot":
        f.seek(8192); raw = f.read(64 * 64)
        for s in range(64):
            e = raw[s * 64:(s + 1) * 64]
            if struct.unpack_from("<I", e, 60)[0] != crc32c(e[:60]):
                continue
            if e[52] != 0 and struct.unpack_from("<Q", e, 0)[0] == args[0]:
                print(s)
    elif cmd in ("newest", "future"):
        best, gen = None, -1
        for i in range(2):
            f.seek(i * 4096); raw = f.read(4096)
            g = struct.unpack_from("<Q", raw, 88)[0]
            if sb_ok(raw) and g > gen:
                best, gen = i, g
        if cmd == "newest":
            print(best)
        else:
            f.seek(best * 4096); raw = bytearray(f.read(4096))
            struct.pack_into("<I", raw, 8, 2)
            struct.pack_into("<I", raw, 4092, crc32c(bytes(raw[:4092])))
            f.seek(best * 4096); f.write(raw)
    elif cmd == "flip":
        f.seek(args[0]); b = f.read(1)[0]
        f.seek(args[0]); f.write(bytes([b ^ (1 << args[1])]))
    elif cmd == "zero":
        f.seek(args[0]); f.write(bytes(args[1]))
    elif cmd == "garbage":
        f.seek(args[0]); f.write(os.urandom(args[1]))
    else:
        sys.exit("unknown command " + cmd)
PY
}

# Where the interesting pages live (read from the undamaged copy).
cp "$snap" "$cache"
clean_slot="$(cache_tool slot 30)"
dirty_slot="$(cache_tool slot 12)"
dirty_slot2="$(cache_tool slot 14)"
[ -n "$clean_slot" ] && [ -n "$dirty_slot" ] && [ -n "$dirty_slot2" ] ||
    fail "pages 30, 12 and 14 are not all in the crashed cache"
newest="$(cache_tool newest)"
oldest=$((1 - newest))

# The reader: every page of the export against the backing file and the
# written pattern; prints how many dirty pages read as the backing's.
cat > "$tmpdir/check.py" <<'PY'
import sys, nbd
h = nbd.NBD(); h.connect_unix(sys.argv[1])
backing = open(sys.argv[2], "rb").read()
lost = 0
for p in range(256):
    got = h.pread(4096, p * 4096)
    want = backing[p * 4096:(p + 1) * 4096]
    written = bytes([p * 17 % 251 + 1]) * 4096
    if 8 <= p < 16 and got == written:
        continue
    if got != want:
        sys.exit("page %d: WRONG DATA (neither the backing file's nor written)" % p)
    if 8 <= p < 16:
        lost += 1
print(lost)
PY

# check NAME LOST [LOG-PATTERN]: nbdkit must start; exactly LOST dirty
# pages read as the backing file's (all others as written), every clean
# page as the backing file's, and the log must match LOG-PATTERN.
check ()
{
    local name="$1" lost="$2" pattern="${3:-}" status=0
    rm -f "$stats"
    run_ssdcache --timeout 60 "${args[@]}" \
        --run "'$PYTHON' '$tmpdir/check.py' \"\$unixsocket\" '$img'" \
        > "$tmpdir/out" 2> "$tmpdir/log" || status=$?
    cat "$tmpdir/out" "$tmpdir/log"
    [ $status -eq 0 ] || fail "$name: nbdkit or the check failed ($status)"
    cat "$stats"
    [ "$(cat "$tmpdir/out")" -eq "$lost" ] ||
        fail "$name: $(cat "$tmpdir/out") dirty pages lost, expected $lost"
    if [ -n "$pattern" ]; then
        grep -Eq -- "$pattern" "$tmpdir/log" ||
            fail "$name: the log does not match \"$pattern\""
    fi
    cmp "$img" "$tmpdir/orig.img" || fail "$name: the backing file changed"
    # What ssdcache check predicted for this start, if it ran.
    if [ -f "$tmpdir/check.predicted" ]; then
        expect_predicted "$stats"
    fi
}

# at_risk N: the last check listed N pages as dirty data at risk.
at_risk ()
{
    local n
    n="$(grep -Ec "^at risk: slot [0-9]+: page" "$tmpdir/check.out" || true)"
    [ "$n" -eq "$1" ] || fail "ssdcache check: $n dirty pages at risk, expected $1"
}

letter ()                       # copy index -> A or B
{
    [ "$1" -eq 0 ] && echo A || echo B
}

# refused NAME PATTERN: nbdkit must refuse to start, naming the cache
# file, with a message matching PATTERN.
refused ()
{
    local name="$1" pattern="$2"
    rm -f "$tmpdir/check.predicted"     # nothing starts to compare with
    expect_ssdcache_failure "$pattern" "${args[@]}"
    grep -Fq -- "$cache" "$tmpdir/err" ||
        fail "$name: the error does not name the cache file"
}

# fresh: a new copy of the crashed cache.
fresh ()
{
    cp "$snap" "$cache"
}

# -- 0. undamaged: everything survives -------------------------------------
fresh
expect_check 0 "$cache" "^result: clean$" "^dirty_pages: 8$" "^clean_shutdown: no$"
check intact 0
expect_stat "$stats" dirty_pages -eq 8 "intact: not 8 dirty pages"

# -- 1. superblocks --------------------------------------------------------
for copy in $newest $oldest; do
    c="$(letter $copy)" o="$(letter $((1 - copy)))"
    fresh
    cache_tool flip $((copy * 4096 + 40)) 3                # one bit (nslots)
    expect_check 1 "$cache" \
        "^damage: superblock copy $c is damaged \(superblock checksum mismatch\): a start uses copy $o" \
        "^result: damage found: 1 problem, 0 with dirty data at risk$"
    check "superblock $copy bit" 0 "superblock copy [AB] is damaged"
    fresh
    cache_tool zero $((copy * 4096)) 512                   # a whole sector
    expect_check 1 "$cache" \
        "^damage: superblock copy $c is damaged \(not an ssdcache superblock \(bad magic\)\): a start uses copy $o" \
        "^result: damage found: 1 problem, 0 with dirty data at risk$"
    check "superblock $copy sector" 0 "superblock copy [AB] is damaged"
done
fresh
cache_tool flip 40 3
cache_tool flip $((4096 + 200)) 0
expect_check 1 "$cache" \
    "^damage: no valid superblock \(copy A: superblock checksum mismatch; copy B: superblock checksum mismatch\): a start refuses this file"
refused "both superblocks, one bit each" "no valid superblock"
fresh
cache_tool zero 0 8192
expect_check 1 "$cache" "^damage: both superblocks are zeroed, but the page table behind them is not"
refused "both superblocks zeroed" "both superblocks are zeroed"
fresh
cache_tool future
expect_check 2 "$cache" \
    "^ssdcache: $cache: superblock copy $(letter $newest) is in format version 2, newer than this tool supports \(1\)"
[ "$(wc -l < "$tmpdir/check.out")" -eq 1 ] || fail "future format: not one message"
refused "future format version" "format version 2, newer than this filter"

# -- 2. page-table entries ----------------------------------------------------
fresh
cache_tool flip $((pt + clean_slot * 64 + 9)) 5
expect_check 1 "$cache" \
    "^damage: slot $clean_slot: entry fails its checks \(checksum mismatch; as read, unverified: clean page 30\)" \
    "^at risk: DIRTY DATA MAY BE LOST: 1 damaged entry in a cache that may hold dirty data" \
    "^damaged_entries: 1$" "^dirty_pages: 8$"
at_risk 0
check "entry of a clean page, one bit" 0 "entries are damaged"
expect_stat "$stats" damaged_entries -eq 1
fresh
cache_tool flip $((pt + dirty_slot * 64 + 2)) 1
expect_check 1 "$cache" \
    "^damage: slot $dirty_slot: entry fails its checks \(checksum mismatch; as read, unverified: dirty page [0-9]+\)" \
    "^at risk: slot $dirty_slot: page [0-9]+ \(as read, unverified: the entry is damaged\)" \
    "^at risk: DIRTY DATA MAY BE LOST: 1 damaged entry" "^dirty_pages: 7$"
at_risk 1
check "entry of a dirty page, one bit" 1 "DIRTY DATA MAY BE LOST"
expect_stat "$stats" damaged_entries -eq 1
fresh
cache_tool zero $pt 4096
expect_check 1 "$cache" \
    "^damage: slots 0-63: 64 entries fail their checks \(all zeroes\): a start drops them" \
    "^at risk: DIRTY DATA MAY BE LOST: 64 damaged entries" \
    "^loaded_slots: 0$" "^damaged_entries: 64$"
check "page-table block zeroed" 8 "DIRTY DATA MAY BE LOST: 64 page-table entries"
expect_stat "$stats" damaged_entries -eq 64
fresh
cache_tool garbage $((pt + dirty_slot * 64)) 64
cache_tool garbage $((pt + clean_slot * 64)) 64
expect_check 1 "$cache" \
    "^damage: slot $dirty_slot: entry fails its checks" \
    "^damage: slot $clean_slot: entry fails its checks" \
    "^at risk: DIRTY DATA MAY BE LOST: 2 damaged entries" \
    "^damaged_entries: 2$" "^dirty_pages: 7$"
check "random garbage in two entries" 1 "DIRTY DATA MAY BE LOST: 2 page-table"
expect_stat "$stats" damaged_entries -eq 2

# -- 3. data pages ------------------------------------------------------------
fresh
cache_tool flip $((pool + clean_slot * page + 1234)) 6
expect_check 1 "$cache" \
    "^damage: slot $clean_slot: clean page 30: data checksum mismatch: it is dropped on first use and read from the backend again" \
    "^verify_failures: 1$" \
    "^result: damage found: 1 problem, 0 with dirty data at risk$"
at_risk 0
check "data of a clean page, one bit" 0
expect_stat "$stats" verify_failures -eq 1
fresh
cache_tool flip $((pool + dirty_slot2 * page + 4000)) 2
expect_check 1 "$cache" \
    "^damage: slot $dirty_slot2: dirty page 14: data checksum mismatch: after an unclean shutdown" \
    "^at risk: slot $dirty_slot2: page 14 \(bytes 57344-61439\): data checksum mismatch: DIRTY DATA LOST at the next use" \
    "^dirty_dropped: 1$" \
    "^result: damage found: 1 problem, 1 with dirty data at risk$"
at_risk 1
check "data of a dirty page, one bit" 1 "DIRTY DATA LOST: dirty page 14 "
expect_stat "$stats" dirty_dropped -eq 1

# -- 4. truncation ------------------------------------------------------------
fresh
lost=0
for p in 8 9 10 11 12 13 14 15; do
    [ "$(cache_tool slot $p)" -ge "$dirty_slot" ] && lost=$((lost + 1))
done
truncate -s $((pool + dirty_slot * page + 100)) "$cache"
expect_check 1 "$cache" \
    "^damage: the file is truncated: $((pool + dirty_slot * page + 100)) of $(stat -c %s "$snap") bytes; the data of slots $dirty_slot and up is gone" \
    "^damage: slot $dirty_slot: dirty page 12: its data lay past the end of the truncated file" \
    "^at risk: slot $dirty_slot: page 12 \(bytes 49152-53247\): its data was cut off" \
    "^dirty_dropped: $lost$"
at_risk $lost
check "truncated inside the pool" $lost "truncated: .* of .* bytes"
expect_stat "$stats" dirty_dropped -eq $lost
expect_stat "$stats" cache_errors -eq 0 "cache errors after truncation"
[ "$(stat -c %s "$cache")" -eq "$(stat -c %s "$snap")" ] ||
    fail "the truncated file was not extended back"
fresh
truncate -s $((pt + 1000)) "$cache"
expect_check 2 "$cache" \
    "^ssdcache: $cache: truncated: $((pt + 1000)) bytes, but its page table alone ends at byte $((pt + 64 * 64))"
[ "$(wc -l < "$tmpdir/check.out")" -eq 1 ] || fail "truncated page table: not one message"
refused "truncated inside the page table" "is truncated: .*page table"
