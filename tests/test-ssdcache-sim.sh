#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: the trace simulator (tools/ssdcache-sim).
#
# 1. Exact hit counts on tiny traces, computed by hand (below).
# 2. Trace file parsing (hex, comments, multi-page requests, errors).
# 3. The goals of the cache-intelligence issue on the built-in traces:
#    - hot set + scans: the default policy keeps >= 90% of the hot set
#      through a scan, LRU and CLOCK (nearly) none of it;
#    - Zipf(1.2): the default >= CLOCK and LRU, within 10% of MIN;
#    - loop 10% larger than the cache: the default far above CLOCK/LRU
#      (which get 0).

source "$(dirname "$0")/functions.sh"
set -e -x

sim="$abs_top_builddir/tools/ssdcache-sim"
[ -x "$sim" ] || fail "$sim not built"

# cell TABLEFILE ROW COLUMN: the cell of the row named ROW, COLUMN
# counted from 1 after the name, without %.
cell ()
{
    awk -F'|' -v row="$2" -v col="$3" '
        { name = $2; gsub (/^ +| +$/, "", name) }
        name == row { v = $(col + 2); gsub (/[ %]/, "", v); print v }' "$1"
}

check_eq ()                     # what got expected
{
    [ "$2" = "$3" ] || fail "$1: got '$2', expected '$3'"
}

# ge A B: A >= B (decimals).
ge ()
{
    awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 >= b + 0) }'
}

ps=4096

# simulate NAME: the simulator's hit counts (3-page cache, $ps-byte
# pages) for the trace $tmpdir/NAME.trace, in $tmpdir/NAME.out.
simulate ()
{
    "$sim" --cache-pages 3 --page-size $ps --counts \
           --trace "$tmpdir/$1.trace" > "$tmpdir/$1.out"
    cat "$tmpdir/$1.out"
}

# -- 1. A 3-page cache and the trace A B C A D A B E A B ----------------
#
# LRU: A B C miss; A hit; D evicts B; A hit; B evicts C; E evicts D;
#   A, B hit.  4 hits.
# CLOCK (hand at slot 0, insert sets the reference bit): A B C fill
#   slots 0 1 2; A hits.  D: the hand clears all three bits, takes
#   slot 0 (A).  A: takes slot 1 (B).  B: takes slot 2 (C).  E: clears
#   all, takes slot 0 (D).  A, B hit.  3 hits.
# S3-FIFO (S target 1 page, ghost of 4): A B C into S; A hits.  D:
#   A (re-used) moves to M, B is evicted to the ghost; A hits.  B: C is
#   evicted, B is in the ghost so it goes to M.  E: D is evicted.  A, B
#   hit in M.  4 hits.
# MIN: A B C miss, A hits; D evicts C (never used again); A, B hit;
#   E evicts D (never used again); A, B hit.  5 hits.  With bypass: 5.
# No request continues another (pages 10 20 30 ...): the sequential
# cutoff changes nothing.
{
    echo "# tiny trace: A=10 B=20 C=30 D=40 E=50 (pages of $ps bytes)"
    for p in 10 20 30 10 40 10 20 50 10 20; do
        echo "$((p * ps)) $ps r"
    done
} > "$tmpdir/tiny.trace"
simulate tiny
check_eq "tiny clock"       "$(cell "$tmpdir/tiny.out" "clock" 1)" 3
check_eq "tiny clock +seq"  "$(cell "$tmpdir/tiny.out" "clock +seq" 1)" 3
check_eq "tiny s3fifo"      "$(cell "$tmpdir/tiny.out" "s3fifo (default)" 1)" 4
check_eq "tiny s3fifo +seq" "$(cell "$tmpdir/tiny.out" "s3fifo +seq" 1)" 4
check_eq "tiny LRU"         "$(cell "$tmpdir/tiny.out" "LRU (reference)" 1)" 4
check_eq "tiny MIN"         "$(cell "$tmpdir/tiny.out" "MIN (Belady)" 1)" 5
check_eq "tiny MIN+bypass"  "$(cell "$tmpdir/tiny.out" "MIN+bypass" 1)" 5
grep -q '^| accesses | 10 |' "$tmpdir/tiny.out" || fail "tiny: accesses"

# A loop of 4 pages over a 3-page cache, 12 accesses: 1 2 3 4 1 2 3 4 ...
# LRU and CLOCK: every access misses (0).  MIN: 1 2 3 miss; 4 evicts 3
# (furthest); 1 2 hit; 3 evicts 2; 4 hits; 1 hits; 2 evicts 1; 3 hits;
# 4 hits.  6 hits.
# S3-FIFO (M is a CLOCK over the slots, its hand at slot 0): 1 2 3 into
# S in slots 0 1 2.  4: S is over target, 1 (unused) goes to the ghost;
# 4 into slot 0.  1: evicts 2 (slot 1) from S to the ghost; 1 is a
# ghost hit: slot 1, in M.  2: evicts 3 (slot 2) from S, 2 to M in
# slot 2.  3: evicts 4 (slot 0) from S (S is now empty), 3 to M in
# slot 0.  4: S is empty: the hand takes slot 0 (3, never re-used, not
# remembered: evicted from M); 4 is a ghost hit, to M in slot 0.
# 1 (slot 1) and 2 (slot 2) hit.  3: not in the ghost: the hand passes
# slots 1 and 2 (their frequencies 1 -> 0) and takes slot 0 (4); 3 into
# S.  4: not in the ghost: S holds 3 (target 1): 3 goes to the ghost,
# 4 into S.  2 hits.
{
    for i in 0 1 2; do
        for p in 1 2 3 4; do
            printf '0x%x 0x%x w\n' $((p * 2 * ps)) $ps
        done
    done
} > "$tmpdir/loop.trace"
simulate loop
check_eq "loop clock"  "$(cell "$tmpdir/loop.out" "clock" 1)" 0
check_eq "loop LRU"    "$(cell "$tmpdir/loop.out" "LRU (reference)" 1)" 0
check_eq "loop MIN"    "$(cell "$tmpdir/loop.out" "MIN (Belady)" 1)" 6
check_eq "loop s3fifo" "$(cell "$tmpdir/loop.out" "s3fifo (default)" 1)" 2

# -- 2. Parsing ------------------------------------------------------------
# Comments, blank lines, hex, a request over 3 pages, sub-page requests.
# Pages 0 1 2 miss, then 2 and 0 hit, in any policy: 2 hits of 5.
cat > "$tmpdir/parse.trace" <<EOF
# offset length r|w

0x0 0x3000 r
  8192 4096 W
0 1 r
EOF
simulate parse
for row in "clock" "s3fifo (default)" "LRU (reference)" "MIN (Belady)"; do
    check_eq "parse $row" "$(cell "$tmpdir/parse.out" "$row" 1)" 2
done
grep -q '^| accesses | 5 |' "$tmpdir/parse.out" || fail "parse: accesses"

printf '0 4096 r\n0 4096 x\n' > "$tmpdir/bad.trace"
if "$sim" --trace "$tmpdir/bad.trace" 2> "$tmpdir/err"; then
    fail "a bad trace line was accepted"
fi
grep -q 'bad.trace:2' "$tmpdir/err" || fail "error does not name the line"
if "$sim" --gen nosuch 2> /dev/null; then
    fail "an unknown generator was accepted"
fi

# -- 3. The goals on the built-in traces --------------------------------
"$sim" --cache-pages 1000 --requests 200000 --seed 1 > "$tmpdir/gen.out"
cat "$tmpdir/gen.out"
# Columns: 1 zipf, 2 hotset, 3 hotset hot-after-scan, 4 loop, 5 mix.
def="s3fifo (default)"
zipf_def=$(cell "$tmpdir/gen.out" "$def" 1)
zipf_clock=$(cell "$tmpdir/gen.out" "clock" 1)
zipf_lru=$(cell "$tmpdir/gen.out" "LRU (reference)" 1)
zipf_min=$(cell "$tmpdir/gen.out" "MIN (Belady)" 1)
hot_def=$(cell "$tmpdir/gen.out" "$def" 3)
hot_clock=$(cell "$tmpdir/gen.out" "clock" 3)
hot_lru=$(cell "$tmpdir/gen.out" "LRU (reference)" 3)
loop_def=$(cell "$tmpdir/gen.out" "$def" 4)
loop_clock=$(cell "$tmpdir/gen.out" "clock" 4)
loop_lru=$(cell "$tmpdir/gen.out" "LRU (reference)" 4)

ge "$hot_def" 90 || fail "hot set after a scan: $hot_def% < 90%"
ge 5 "$hot_clock" || fail "CLOCK kept the hot set through a scan?"
ge 5 "$hot_lru" || fail "LRU kept the hot set through a scan?"
ge "$zipf_def" "$zipf_clock" || fail "zipf: $zipf_def% < CLOCK $zipf_clock%"
ge "$zipf_def" "$zipf_lru" || fail "zipf: $zipf_def% < LRU $zipf_lru%"
ge "$zipf_def" "$(awk -v m="$zipf_min" 'BEGIN { print 0.9 * m }')" ||
    fail "zipf: $zipf_def% not within 10% of MIN $zipf_min%"
ge 1 "$loop_clock" || fail "loop: CLOCK $loop_clock% (expected ~0)"
ge 1 "$loop_lru" || fail "loop: LRU $loop_lru% (expected ~0)"
ge "$loop_def" 50 || fail "loop: $loop_def% (expected far above CLOCK)"

# Deterministic for a seed.
"$sim" --cache-pages 1000 --requests 200000 --seed 1 > "$tmpdir/gen2.out"
cmp "$tmpdir/gen.out" "$tmpdir/gen2.out" || fail "not deterministic"
