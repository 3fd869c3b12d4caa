#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: "ssdcache check" of a hostile cache file takes
# bounded memory (issue 27, item 12).
#
# A cache file whose superblocks are valid but whose page table (4 Mi
# entries, 256 MiB) is random bytes, each entry's state byte "dirty":
# every entry is damaged, and names a page of its own.  The tool
# kept a record with a message for each (about 1 GB); now it keeps the
# first CF_PROBLEMS_MAX and counts the rest.  It must finish, report
# damage (exit 1), say how many problems it did not list, and peak at
# under 400 MB resident.  (Resident, not an address-space limit: ASan
# reserves terabytes of address space and fails under "ulimit -v".)
source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdkit null --version
[ -x "$SSDCACHE_TOOL" ] || fail "ssdcache tool not found: $SSDCACHE_TOOL"

nbdkit -U - --filter="$SSDCACHE_FILTER" null 16M ssdcache-file="$cache" \
    ssdcache-size=16M ssdcache-page-size=4K --run 'nbdinfo --size "$uri"'
nslots=$((4 * 1024 * 1024))
"$PYTHON" - "$cache" $nslots <<'PY'
import os, struct, sys
from ssdtest import crc32c
path, nslots = sys.argv[1], int(sys.argv[2])
mib = 1 << 20
pool = (8192 + nslots * 64 + mib - 1) // mib * mib
with open(path, "r+b") as f:
    for copy in (0, 4096):
        f.seek(copy)
        raw = bytearray(f.read(4096))
        struct.pack_into("<Q", raw, 40, nslots)
        struct.pack_into("<Q", raw, 56, pool)
        struct.pack_into("<Q", raw, 64, nslots * 4096)
        struct.pack_into("<I", raw, 4092, crc32c(bytes(raw[:4092])))
        f.seek(copy)
        f.write(raw)
    f.seek(8192)
    left = nslots * 64
    while left:
        n = min(left, 16 * mib)
        chunk = bytearray(os.urandom(n))
        chunk[52::64] = b"\x02" * (n // 64)    # each says "dirty"
        f.write(chunk)
        left -= n
    f.truncate(pool + nslots * 4096)
PY
# Prints the tool's exit status and its peak resident set in KiB.  (In
# an ASan build, freed buffers wait in a 256 MB quarantine by default;
# a small one keeps the figure about the tool's own memory.)
read -r status peak < <(ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=16" \
    "$PYTHON" - "$SSDCACHE_TOOL" "$cache" "$tmpdir/out" <<'PY'
import resource, subprocess, sys
tool, cache, out = sys.argv[1:4]
with open(out, "wb") as f:
    rc = subprocess.run([tool, "check", cache], stdout=f,
                        stderr=subprocess.STDOUT).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
PY
)
tail -5 "$tmpdir/out"
echo "peak resident: $peak KiB"
[ "$status" -eq 1 ] || fail "ssdcache check exited $status, expected 1 (damage)"
[ "$peak" -lt 400000 ] || fail "ssdcache check peaked at $peak KiB resident"
grep -q "^damage: [0-9]* more problems, not listed" "$tmpdir/out" ||
    fail "no count of the problems not listed"
[ "$(grep -c '^damage:' "$tmpdir/out")" -le 1001 ] ||
    fail "more problems listed than kept"
