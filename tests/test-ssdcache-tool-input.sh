#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: the ssdcache tool's usage and bad input.
#
# 1. Usage: --help, --version, a missing, unknown or extra argument.
# 2. Bad input to info and to check: a missing file, a directory, an
#    empty, an all-zero and a foreign file, a cache cut short inside
#    its page table or its superblocks, a future format version: exit
#    2 and one line on stderr naming the file; nothing on stdout.
# What the tool says of good caches: test-ssdcache-tool.sh.

source "$(dirname "$0")/functions.sh"
set -e -x

requires "$PYTHON" -c 'import nbd'

source "$(dirname "$0")/tool.sh-inc"

# -- 1. usage ---------------------------------------------------------------

"$tool" --help > "$tmpdir/out"
grep -q '^  info FILE' "$tmpdir/out" || fail "--help does not list info"
grep -q '^  check FILE' "$tmpdir/out" || fail "--help does not list check"
"$tool" --version | grep -Eq '^ssdcache [0-9]' || fail "--version"
"$tool" info --help | grep -q -- '--json' || fail "info --help"
"$tool" check --help | grep -q -- '--json' || fail "check --help"
status=0; "$tool" > /dev/null 2>&1 || status=$?
[ $status -eq 2 ] || fail "no arguments: exit status $status, expected 2"
tool_fails frobnicate "$img"
grep -q "unknown command 'frobnicate'" "$tmpdir/err" || fail "unknown command"
tool_fails --frobnicate
grep -q "unknown option '--frobnicate'" "$tmpdir/err" || fail "unknown option"
tool_fails info --frobnicate "$img"
grep -q "info: unknown option '--frobnicate'" "$tmpdir/err" ||
    fail "unknown option of info"
tool_fails check -x "$img"
tool_fails info
grep -q "no cache FILE" "$tmpdir/err" || fail "info without a file"
tool_fails check "$img" "$img"
grep -q "one FILE only" "$tmpdir/err" || fail "check with two files"

# -- 2. bad input -------------------------------------------------------------

bad_input "$tmpdir/missing.ssdcache" "cannot open: No such file or directory"
mkdir "$tmpdir/dir"
bad_input "$tmpdir/dir" "is a directory"
: > "$tmpdir/empty"
bad_input "$tmpdir/empty" "not an ssdcache cache file: it is empty"
head -c 3M /dev/zero > "$tmpdir/zero"
bad_input "$tmpdir/zero" "not an ssdcache cache file: .*all zeroes"
bad_input "$img" "not an ssdcache cache file: no superblock"

# A real cache to cut and change: made and closed by nbdkit.
run_ssdcache "${args[@]}" --run 'nbdcopy "$uri" /dev/null'
cp "$cache" "$tmpdir/cut"
truncate -s 12000 "$tmpdir/cut"
bad_input "$tmpdir/cut" "truncated: 12000 bytes, but its page table"
truncate -s 5000 "$tmpdir/cut"
bad_input "$tmpdir/cut" "truncated: 5000 bytes, too small"
cp "$cache" "$tmpdir/future"
"$PYTHON" - "$tmpdir/future" <<'PY'
import struct, sys
from ssdtest import crc32c
with open(sys.argv[1], "r+b") as f:
    raw = bytearray(f.read(4096))
    struct.pack_into("<I", raw, 8, 2)
    struct.pack_into("<I", raw, 4092, crc32c(bytes(raw[:4092])))
    f.seek(0); f.write(raw)
PY
bad_input "$tmpdir/future" "copy A is in format version 2, newer than this tool"
