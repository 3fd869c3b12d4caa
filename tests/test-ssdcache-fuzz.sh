#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a short libFuzzer run of the on-disk decoder.
#
# Builds tests/fuzz/fuzz-layout.c with clang -fsanitize=fuzzer,address,
# undefined (as "make fuzz" does; the rest of the project may be built
# with gcc) and fuzzes layout_sb_decode / layout_entry_decode for
# $SSDCACHE_FUZZ_SECONDS seconds (default 20) starting from the seed
# corpus tests/fuzz/corpus/.  Any crash, sanitizer report, violated
# invariant or timeout fails the test; the input that caused it is
# printed (hex) and copied to tests/fuzz/ in the build directory
# (replay it with: tests/fuzz/replay-layout FILE).
# Skipped (77) if clang or its libFuzzer runtime (Debian
# libclang-rt-dev) is missing.
source "$(dirname "$0")/functions.sh"
set -e -x

: "${FUZZ_CC:=clang}"
seconds="${SSDCACHE_FUZZ_SECONDS:-20}"
fuzzdir="$abs_top_srcdir/tests/fuzz"

requires "$FUZZ_CC" --version
# libFuzzer runtime present?
cat > "$tmpdir/probe.c" <<'PROBE'
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput (const uint8_t *d, size_t n) { return 0; }
PROBE
requires "$FUZZ_CC" -fsanitize=fuzzer,address,undefined \
    -o "$tmpdir/probe" "$tmpdir/probe.c"

# Keep these flags in step with FUZZ_CFLAGS in tests/Makefile.am.
"$FUZZ_CC" -g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=all \
    -I"$abs_top_srcdir/filter/core" -I"$fuzzdir" \
    -o "$tmpdir/fuzz-layout" \
    "$fuzzdir/fuzz-layout.c" "$abs_top_srcdir/filter/core/layout.c" -lisal

nseeds=$(find "$fuzzdir/corpus" -type f | wc -l)
[ "$nseeds" -gt 0 ] || fail "no seed corpus in $fuzzdir/corpus"

# New inputs go to the first directory (a scratch one): the seed corpus
# in the source tree is only read.  ASan/UBSan reports abort; libFuzzer's
# own default exit code for a crash is 77, which make check would take
# for "skipped", hence -error_exitcode.
mkdir "$tmpdir/corpus" "$tmpdir/artifacts"
status=0
( cd "$tmpdir" &&
  ASAN_OPTIONS=abort_on_error=0:detect_leaks=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ./fuzz-layout -max_total_time="$seconds" -max_len=8192 -timeout=10 \
      -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 \
      -artifact_prefix="$tmpdir/artifacts/" \
      "$tmpdir/corpus" "$fuzzdir/corpus" ) > "$tmpdir/fuzz.out" 2>&1 ||
    status=$?
tail -n 40 "$tmpdir/fuzz.out"

found=$(find "$tmpdir/artifacts" -type f | sort)
if [ $status -ne 0 ] || [ -n "$found" ]; then
    for f in $found; do
        echo "=== $(basename "$f") ($(stat -c %s "$f") bytes) ==="
        od -A d -t x1 "$f" | head -n 40
        mkdir -p "$abs_top_builddir/tests/fuzz"
        cp "$f" "$abs_top_builddir/tests/fuzz/" || :
    done
    fail "the fuzzer found a problem (exit status $status)"
fi
# It must really have run (a fuzzer that exits at once proves nothing).
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmpdir/fuzz.out")
[ -n "$runs" ] && [ "$runs" -gt "$nseeds" ] ||
    fail "the fuzzer ran ${runs:-no} inputs"
echo "fuzzed $runs inputs in ${seconds}s, no problem found"
