#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a damaged cache file never yields wrong data.
# After a clean stop we damage the cache file directly:
#  - page-table entries (one byte changed): those entries are dropped;
#  - data of cached pages (different bytes written into the slot): the
#    data CRC fails on first use, the slot is dropped (verify_failures)
#    and the data comes from the backend;
#  - one superblock copy: the other one is used, the server starts;
#  - both superblock copies: the server refuses to start, naming the
#    cache file.
# Before each start, "ssdcache check" (tools/ssdcache) must find the same
# damage (exit 1, naming each damaged slot or superblock copy, no dirty
# data at risk), predict the counters that start then shows, and call
# the undamaged cache clean (exit 0).
# Layout (filter/core/layout.h): superblocks at 0 and 4096, page table at
# 8192 with 64 bytes per slot, pool at round_up(8192 + nslots*64, 1M),
# slot i's data at pool + i*page_size.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdcopy --version
requires "$PYTHON" --version
requires nbdinfo --version

page=65536
size=$((2 * 1024 * 1024))
nslots=$((size / page))
pool=$(( (8192 + nslots * 64 + 1048575) / 1048576 * 1048576 ))
random_file "$img" $size

run ()
{
    rm -f "$stats"
    run_ssdcache file "$img" \
                 ssdcache-file="$cache" ssdcache-size=$size ssdcache-page-size=$page \
                 ssdcache-stats="$stats" "$@" \
                 --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
    cat "$stats"
    cmp "$img" "$tmpdir/copy.img" ||
        fail "data served from a damaged cache differs from the backing file"
}

# poke OFFSET LENGTH: replace LENGTH bytes at OFFSET of the cache file
# by their complement (so they certainly differ).
poke ()
{
    "$PYTHON" - "$cache" "$1" "$2" <<'PY'
import sys
path, off, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "r+b") as f:
    f.seek(off)
    old = f.read(n)
    assert len(old) == n, "cache file too short for offset %d" % off
    f.seek(off)
    f.write(bytes(b ^ 0xff for b in old))
PY
}

# used_slots: slots whose data area is not all zero (in use).
used_slots ()
{
    "$PYTHON" - "$cache" $pool $page $nslots <<'PY'
import sys
path, pool, page, nslots = sys.argv[1], *map(int, sys.argv[2:])
with open(path, "rb") as f:
    for i in range(nslots):
        f.seek(pool + i * page)
        if f.read(page).strip(b"\0"):
            print(i)
PY
}

# Fill the cache (cold, then warm).
run
run
expect_stat "$stats" loaded_slots -gt 0 "the cache is not warm"
fsize="$(stat -c %s "$cache")"
[ "$fsize" -ge $((pool + nslots * page)) ] ||
    fail "cache file is $fsize bytes, expected >= $((pool + nslots * page)) for $nslots slots"

mapfile -t used < <(used_slots)
echo "slots in use: ${used[*]}"
[ ${#used[@]} -ge 8 ] || fail "only ${#used[@]} slots hold data after reading everything"
expect_check 0 "$cache" "^result: clean$" "^loaded_slots: ${#used[@]}$"

# no_risk: the last check named no dirty data at risk (there is none).
no_risk ()
{
    if grep -q "^at risk" "$tmpdir/check.out"; then
        fail "ssdcache check: dirty data at risk in a cache without any"
    fi
}

# Damage the data of three slots (in the middle of the page and at its
# first bytes) and the entries of two others.
poke $((pool + ${used[0]} * page + 1000)) 100
poke $((pool + ${used[2]} * page)) 1
poke $((pool + ${used[4]} * page + page - 4096)) 4096
poke $((8192 + ${used[5]} * 64 + 8)) 1
poke $((8192 + ${used[6]} * 64 + 40)) 2
expect_check 1 "$cache" \
    "^damage: slot ${used[0]}: clean page [0-9]+: data checksum mismatch: it is dropped on first use" \
    "^damage: slot ${used[2]}: clean page [0-9]+: data checksum mismatch" \
    "^damage: slot ${used[4]}: clean page [0-9]+: data checksum mismatch" \
    "^damage: slot ${used[5]}: entry fails its checks \(checksum mismatch; as read" \
    "^damage: slot ${used[6]}: entry fails its checks \(checksum mismatch; as read" \
    "^verify_failures: 3$" "^damaged_entries: 2$" \
    "^result: damage found: 5 problems, 0 with dirty data at risk$"
no_risk
run
expect_predicted "$stats"
vf="$(stat_get "$stats" verify_failures)"
[ "$vf" -eq 3 ] || fail "verify_failures = $vf, expected 3 (three slots damaged)"
de="$(stat_get "$stats" dropped_entries)"
[ "$de" -eq 2 ] || fail "dropped_entries = $de, expected 2 (two entries damaged)"
ls="$(stat_get "$stats" loaded_slots)"
[ "$ls" -eq $(( ${#used[@]} - 2 )) ] ||
    fail "loaded_slots = $ls, expected $(( ${#used[@]} - 2 )) (all but the two damaged entries)"
# The damaged slots have been refilled: another run is clean.
run
expect_stat "$stats" verify_failures -eq 0 \
    "verify failures on a run after the damaged slots were replaced"
expect_check 0 "$cache" "^result: clean$"

# Damage the entries of every used slot a little: still correct.
for s in "${used[@]}"; do
    poke $((8192 + s * 64 + (s % 64))) 1
done
expect_check 1 "$cache" "^damaged_entries: ${#used[@]}$"
n="$(grep -Ec "^damage: slot [0-9]+: entry fails its checks" "$tmpdir/check.out")"
[ "$n" -eq ${#used[@]} ] || fail "ssdcache check names $n damaged entries, expected ${#used[@]}"
no_risk
run
expect_predicted "$stats"
de="$(stat_get "$stats" dropped_entries)"
[ "$de" -eq ${#used[@]} ] || fail "dropped_entries = $de, expected ${#used[@]}"

# One superblock copy damaged (first A, then B): the server starts.
run
poke 24 1
expect_check 1 "$cache" \
    "^damage: superblock copy A is damaged \(superblock checksum mismatch\): a start uses copy B" \
    "^result: damage found: 1 problem, 0 with dirty data at risk$"
run
expect_predicted "$stats"
run    # both copies rewritten by now
expect_check 0 "$cache" "^result: clean$"
poke $((4096 + 24)) 1
expect_check 1 "$cache" \
    "^damage: superblock copy B is damaged \(superblock checksum mismatch\): a start uses copy A" \
    "^result: damage found: 1 problem, 0 with dirty data at risk$"
run
expect_predicted "$stats"

# Both damaged: refused, naming the file.
poke 30 1
poke $((4096 + 30)) 1
expect_check 1 "$cache" \
    "^damage: no valid superblock \(copy A: superblock checksum mismatch; copy B: superblock checksum mismatch\): a start refuses this file" \
    "^result: damage found: 1 problem"
status=0
"$SSDCACHE_TOOL" info "$cache" > "$tmpdir/out" 2> "$tmpdir/err" || status=$?
cat "$tmpdir/out" "$tmpdir/err"
[ $status -eq 2 ] || fail "ssdcache info without a valid superblock: exit status $status"
grep -Fq "$cache: no valid superblock" "$tmpdir/err" ||
    fail "ssdcache info: the message does not name the file and the problem"
expect_ssdcache_failure "$cache" file "$img" \
    ssdcache-file="$cache" ssdcache-size=$size ssdcache-page-size=$page
