#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: the ssdcache tool (tools/ssdcache) on caches
# in use, closed, and after kill -9 (usage and bad input:
# test-ssdcache-tool-input.sh).
#
# 3. A cache in use: with nbdkit running on it (writeback, nothing
#    written back), info reports the geometry, the flags, the lock
#    holder and as many dirty pages as the filter's own dirty_pages at
#    exit; check warns that it is in use.  Neither takes the lock (they
#    also work while flock(1) holds it) nor changes the file.
# 4. After a clean stop: info and check (exit 0) on the closed cache;
#    one damaged data byte: check exits 1 naming the slot and page.
# 5. After kill -9 with unsealed and copied-on-write pages: check says
#    what is unsealed without calling it damage (exit 0), and its
#    prediction of the next start's counters is what the filter counts.
# 6. JSON (info and check, --json) parses, with an identity that holds
#    a quote, a backslash, a tab and a byte that is not UTF-8.
# The corruption cases are checked in test-ssdcache-corrupt.sh and
# test-ssdcache-corrupt-crash.sh.

source "$(dirname "$0")/functions.sh"
set -e -x

requires "$PYTHON" -c 'import nbd'
requires flock --version

source "$(dirname "$0")/tool.sh-inc"

# -- 3. a cache in use --------------------------------------------------------

rm -f "$cache" "$stats"
start_ssdcache -P "$pid" -U "$sock" "${args[@]}"
# Pages 0-39 read (clean), 8-15 written (dirty) and flushed, page 8
# written again (a copy on write: two versions on disk), pages 50 and
# 51 written in place four times each without a flush (unsealed).
"$PYTHON" - "$sock" <<'PY'
import sys, nbd
h = nbd.NBD(); h.connect_unix(sys.argv[1])
h.pread(40 * 4096, 0)
for p in range(8, 16):
    h.pwrite(bytes([p]) * 4096, p * 4096)
h.flush()
h.pwrite(b"\x88" * 4096, 8 * 4096)
for p in (50, 51):
    for i in range(4):
        h.pwrite(bytes([i + 1]) * 512, p * 4096)
PY
nbdkit_pid="$(cat "$pid")"
md5_before="$(md5sum < "$cache")"
"$tool" info "$cache" > "$tmpdir/info-live"
cat "$tmpdir/info-live"
"$tool" info --json "$cache" > "$tmpdir/info-live.json"
json_ok "$tmpdir/info-live.json"
[ "$(value "$tmpdir/info-live" in_use_by_pid)" = "$nbdkit_pid" ] ||
    fail "info does not name nbdkit ($nbdkit_pid) as the lock holder"
[ "$(value "$tmpdir/info-live" clean_shutdown)" = no ] ||
    fail "a cache in use reads as closed cleanly"
[ "$(value "$tmpdir/info-live" may_hold_dirty_data)" = yes ] ||
    fail "a writeback cache in use says it holds no dirty data"
[ "$(value "$tmpdir/info-live" last_mode)" = writeback ] || fail "last_mode"
[ "$(value "$tmpdir/info-live" format_version)" = 1 ] || fail "format_version"
[ "$(value "$tmpdir/info-live" page_size)" = 4096 ] || fail "page_size"
[ "$(value "$tmpdir/info-live" sector_size)" = 512 ] || fail "sector_size"
[ "$(value "$tmpdir/info-live" slots)" = 64 ] || fail "slots"
[ "$(value "$tmpdir/info-live" backend_size)" = $size ] || fail "backend_size"
[ "$(value "$tmpdir/info-live" page_table_offset)" = 8192 ] || fail "pt offset"
[ "$(value "$tmpdir/info-live" pool_offset)" = 1048576 ] || fail "pool offset"
grep -Fq "$(basename "$img")" <<< "$(value "$tmpdir/info-live" identity)" ||
    fail "the identity does not name the backing file"
live_dirty="$(stat_get "$tmpdir/info-live" dirty_pages)"
[ "$live_dirty" -eq 10 ] || fail "info: $live_dirty dirty pages, expected 10"
[ "$(stat_get "$tmpdir/info-live" older_versions)" -ge 1 ] ||
    fail "info: no older version of the page copied on write"
[ "$(stat_get "$tmpdir/info-live" unsealed_slots)" -ge 1 ] ||
    fail "info: no unsealed slot after rewrites in place"
# check on a cache in use: a warning naming the process.
status=0
"$tool" check "$cache" > "$tmpdir/check-live" 2> "$tmpdir/check-live.err" ||
    status=$?
cat "$tmpdir/check-live" "$tmpdir/check-live.err"
grep -q "is in use by process $nbdkit_pid" "$tmpdir/check-live.err" ||
    fail "check does not warn that the cache is in use"
[ $status -eq 0 ] || fail "check on a quiet cache in use: exit status $status"
[ "$(md5sum < "$cache")" = "$md5_before" ] || fail "info or check changed the cache"
stop_nbdkit "$pid"
[ "$(stat_get "$stats" dirty_pages)" -eq "$live_dirty" ] ||
    fail "the filter counts $(stat_get "$stats" dirty_pages) dirty pages, info $live_dirty"

# flock(1) itself holds the lock now: info still works, and names it.
flock -x "$cache" "$tool" info "$cache" > "$tmpdir/info-flock"
grep -Eq '^in_use_by_pid: [0-9]+$' "$tmpdir/info-flock" ||
    fail "info under flock(1) does not see the lock"

# -- 4. closed cleanly ----------------------------------------------------------

touch -d '2000-01-01' "$cache"
md5_before="$(md5sum < "$cache")"
"$tool" info "$cache" > "$tmpdir/info"
cat "$tmpdir/info"
[ "$(value "$tmpdir/info" in_use_by_pid)" = none ] || fail "in use after stop"
[ "$(value "$tmpdir/info" clean_shutdown)" = yes ] || fail "not closed cleanly"
[ "$(stat_get "$tmpdir/info" dirty_pages)" -eq "$live_dirty" ] ||
    fail "dirty pages changed at a clean stop"
[ "$(stat_get "$tmpdir/info" dirty_bytes)" -eq $((8 * 4096 + 2 * 512)) ] ||
    fail "dirty_bytes: $(stat_get "$tmpdir/info" dirty_bytes)"
[ "$(stat_get "$tmpdir/info" unsealed_slots)" -eq 0 ] ||
    fail "unsealed slots in a cache closed cleanly"
[ "$(stat_get "$tmpdir/info" damaged_entries)" -eq 0 ] || fail "damaged entries"
expect_check 0 "$cache" "^result: clean$" "^loaded_slots: 42$" \
    "^dirty_pages: $live_dirty$"
"$tool" check --json "$cache" > "$tmpdir/check.json"
json_ok "$tmpdir/check.json"
[ "$(md5sum < "$cache")" = "$md5_before" ] || fail "info or check changed the cache"
[ "$(stat -c %Y "$cache")" -eq "$(date -d 2000-01-01 +%s)" ] ||
    fail "info or check changed the cache's modification time"

# One damaged byte in the data of dirty page 12: check exits 1 and names
# it; the original is left alone.
cp "$cache" "$tmpdir/damaged"
slot12="$("$PYTHON" - "$cache" <<'PY'
import struct, sys
raw = open(sys.argv[1], "rb").read()
for s in range(64):
    e = raw[8192 + s * 64:8192 + s * 64 + 64]
    if e[52] == 2 and struct.unpack_from("<Q", e, 0)[0] == 12:
        print(s)
PY
)"
[ -n "$slot12" ] || fail "page 12 is not in the cache"
printf '\x55' | dd of="$tmpdir/damaged" bs=1 seek=$((1048576 + slot12 * 4096 + 77)) \
    conv=notrunc status=none
expect_check 1 "$tmpdir/damaged" \
    "^damage: slot $slot12: dirty page 12: data checksum mismatch: reads of it will fail with EIO" \
    "^at risk: slot $slot12: page 12 \(bytes 49152-53247\)" \
    "^result: damage found: 1 problem, 1 with dirty data at risk"
"$tool" check --json "$tmpdir/damaged" > "$tmpdir/damaged.json" || true
json_ok "$tmpdir/damaged.json"
"$PYTHON" - "$tmpdir/damaged.json" "$slot12" <<'PY' || fail "check --json"
import json, sys
j = json.load(open(sys.argv[1]))
slot = int(sys.argv[2])
assert j["exit_status"] == 1 and j["result"] == "damage found", j
assert [(d["what"], d["slot"], d["page"]) for d in j["damage"]] == \
    [("data", slot, 12)], j["damage"]
assert [(r["slot"], r["page"]) for r in j["dirty_at_risk"]] == [(slot, 12)]
assert j["next_start"]["verify_failures"] == 1
PY

# -- 5. after kill -9: unsealed pages are not damage --------------------------

start_ssdcache -P "$pid" -U "$sock" "${args[@]}"
"$PYTHON" - "$sock" <<'PY'
import sys, nbd
h = nbd.NBD(); h.connect_unix(sys.argv[1])
h.pread(256 * 4096, 0)
h.pwrite(b"\x99" * 4096, 9 * 4096)          # over flushed dirty data
for i in range(4):                           # in place, unflushed
    h.pwrite(bytes([i + 7]) * 1024, 60 * 4096 + 1024)
PY
crash_nbdkit "$pid"
expect_check 0 "$cache" \
    "^result: clean$" "^clean_shutdown: no$" \
    "^note: unsealed slots have no data checksum"
[ "$(stat_get "$tmpdir/check.out" data_unsealed)" -ge 1 ] ||
    fail "check: no unsealed slot after rewrites in place and kill -9"
rm -f "$stats"
run_ssdcache "${args[@]}" --run 'nbdcopy "$uri" /dev/null'
cat "$stats"
[ "$(stat_get "$stats" unsealed_dropped)" -ge 1 ] ||
    fail "the filter dropped no unsealed page"
expect_predicted "$stats"

# -- 6. JSON with an identity that needs escaping -----------------------------

odd=$'we"ird\\ \t tab \xff byte'
run_ssdcache file "$img" ssdcache-file="$tmpdir/odd.ssdcache" \
    ssdcache-size=256K ssdcache-id="$odd" --run 'nbdcopy "$uri" /dev/null'
"$tool" info --json "$tmpdir/odd.ssdcache" > "$tmpdir/odd.json"
cat "$tmpdir/odd.json"
grep -Fq '\u00ff' "$tmpdir/odd.json" || fail "the byte 0xff is not escaped"
"$PYTHON" - "$tmpdir/odd.json" <<'PY' || fail "info --json: identity"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["identity"] == 'ssdcache-id=we"ird\\ \t tab \u00ff byte', j["identity"]
assert j["clean_shutdown"] is True and j["in_use_by_pid"] is None
assert j["free_slots"] + j["clean_slots"] + j["dirty_slots"] + \
    j["unsealed_slots"] + j["damaged_entries"] == j["slots"]
PY
"$tool" check --json "$tmpdir/odd.ssdcache" > "$tmpdir/odd-check.json"
json_ok "$tmpdir/odd-check.json"
"$tool" info "$tmpdir/odd.ssdcache" | grep -Fq 'identity: ssdcache-id=we"ird\x5c \x09 tab' ||
    fail "info: control characters in the identity are not escaped"
