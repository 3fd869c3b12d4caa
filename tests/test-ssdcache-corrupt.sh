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
# Layout (filter/core/layout.h): superblocks at 0 and 4096, page table at
# 8192 with 64 bytes per slot, pool at round_up(8192 + nslots*64, 1M),
# slot i's data at pool + i*page_size.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdcopy --version
requires "$PYTHON" --version
requires nbdinfo --version

img="$tmpdir/disk.img"
cache="$tmpdir/disk.ssdcache"
stats="$tmpdir/stats"
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
[ "$(stat_get "$stats" loaded_slots)" -gt 0 ] || fail "the cache is not warm"
fsize="$(stat -c %s "$cache")"
[ "$fsize" -ge $((pool + nslots * page)) ] ||
    fail "cache file is $fsize bytes, expected >= $((pool + nslots * page)) for $nslots slots"

mapfile -t used < <(used_slots)
echo "slots in use: ${used[*]}"
[ ${#used[@]} -ge 8 ] || fail "only ${#used[@]} slots hold data after reading everything"

# Damage the data of three slots (in the middle of the page and at its
# first bytes) and the entries of two others.
poke $((pool + ${used[0]} * page + 1000)) 100
poke $((pool + ${used[2]} * page)) 1
poke $((pool + ${used[4]} * page + page - 4096)) 4096
poke $((8192 + ${used[5]} * 64 + 8)) 1
poke $((8192 + ${used[6]} * 64 + 40)) 2
run
vf="$(stat_get "$stats" verify_failures)"
[ "$vf" -eq 3 ] || fail "verify_failures = $vf, expected 3 (three slots damaged)"
de="$(stat_get "$stats" dropped_entries)"
[ "$de" -eq 2 ] || fail "dropped_entries = $de, expected 2 (two entries damaged)"
ls="$(stat_get "$stats" loaded_slots)"
[ "$ls" -eq $(( ${#used[@]} - 2 )) ] ||
    fail "loaded_slots = $ls, expected $(( ${#used[@]} - 2 )) (all but the two damaged entries)"
# The damaged slots have been refilled: another run is clean.
run
[ "$(stat_get "$stats" verify_failures)" -eq 0 ] ||
    fail "verify failures on a run after the damaged slots were replaced"

# Damage the entries of every used slot a little: still correct.
for s in "${used[@]}"; do
    poke $((8192 + s * 64 + (s % 64))) 1
done
run
de="$(stat_get "$stats" dropped_entries)"
[ "$de" -eq ${#used[@]} ] || fail "dropped_entries = $de, expected ${#used[@]}"

# One superblock copy damaged (first A, then B): the server starts.
run
poke 24 1
run
run    # both copies rewritten by now
poke $((4096 + 24)) 1
run

# Both damaged: refused, naming the file.
poke 30 1
poke $((4096 + 30)) 1
expect_ssdcache_failure "$cache" file "$img" \
    ssdcache-file="$cache" ssdcache-size=$size ssdcache-page-size=$page
