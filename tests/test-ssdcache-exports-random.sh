#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: model-checked random I/O over three exports of
# two sizes at once through one nbdkit (two connections each), in every
# mode; at exit each backing file holds what its model says.

source "$(dirname "$0")/functions.sh"
source "$(dirname "$0")/exports.sh-inc"
set -e -x

requires "$PYTHON" -c 'import nbd'

models ()
{
    local m="$1" sock="$2" seed="$3" e pids=()
    for e in a b c; do
        "$PYTHON" "$random_io" --uri "$(uri_of $e.img "$sock")" \
            --connections 2 --ops 1500 --seed $((seed + ${#pids[@]})) \
            --model "$tmpdir/$e.start" --save-model "$tmpdir/$e.model" \
            --max-len 128K --flush-at-end \
            --mix read=55,write=35,zero=5,flush=3,cache=2 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do
        wait "$p" || fail "random I/O mismatch ($m)"
    done
}

for mode in writethrough writeback writearound; do
    rm -f "$cache" "$cache".*
    start_ssdcache -P "$tmpdir/m.pid" -U "$tmpdir/m.sock" \
        file dir="$dir" ssdcache-file="$cache" ssdcache-size=8M \
        ssdcache-page-size=16K ssdcache-mode=$mode
    # The models start from the backing files; copy them first.
    for e in a b c; do cp "$dir/$e.img" "$tmpdir/$e.start"; done
    models $mode "$tmpdir/m.sock" 7
    stop_nbdkit "$tmpdir/m.pid"
    for e in a b c; do
        cmp "$tmpdir/$e.model" "$dir/$e.img" ||
            fail "$mode: $e.img differs from its model after exit"
    done
done
