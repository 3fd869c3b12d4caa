#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: model-based random soak, every mode.
#
# Aligned and unaligned reads, writes, zeroes, trims, flushes and cache
# requests over 3 connections, with a cache much smaller than the data,
# checked byte for byte against a model by random-io.py; the backing
# file must equal the model after a clean exit.  SOAK_OPS operations per
# mode (default 40000, so 120000 in all); `make check-soak` runs 10
# million.
source "$(dirname "$0")/functions.sh"
set -e -x

requires "$PYTHON" -c 'import nbd'
ops="${SOAK_OPS:-40000}"
seed="${SOAK_SEED:-$RANDOM}"
echo "soak: $ops operations per mode, seed $seed"

for mode in writethrough writearound writeback; do
    random_file "$tmpdir/disk.img" $((16 * 1024 * 1024))
    cp "$tmpdir/disk.img" "$tmpdir/model.img"
    rm -f "$tmpdir/c"
    run_ssdcache file "$tmpdir/disk.img" \
                 ssdcache-file="$tmpdir/c" ssdcache-size=2M ssdcache-page-size=4K \
                 ssdcache-mode="$mode" ssdcache-stats="$tmpdir/stats-$mode" \
                 --run '"$PYTHON" "$random_io" --uri "$uri" --connections 3 \
                        --depth 8 --ops '"$ops"' --seed '"$seed"' \
                        --max-len 128K \
                        --model "$tmpdir/model.img" --save-model "$tmpdir/model.img"'
    cat "$tmpdir/stats-$mode"
    # Trimmed bytes are undefined (random-io.py marks them in a mask).
    "$PYTHON" - "$tmpdir/disk.img" "$tmpdir/model.img" <<'PY' ||
import os, sys
disk = open(sys.argv[1], "rb").read()
model = open(sys.argv[2], "rb").read()
mask_file = sys.argv[2] + ".unknown"
mask = open(mask_file, "rb").read() if os.path.exists(mask_file) else None
bad = [i for i in range(0, len(disk), 4096)
       if disk[i:i + 4096] != model[i:i + 4096] and
       (mask is None or
        any(disk[j] != model[j] and not mask[j] for j in range(i, i + 4096)))]
if bad:
    sys.exit("differs at %d blocks, first at offset %d" % (len(bad), bad[0]))
PY
        fail "$mode: the backing file differs from the model after exit"
    rm -f "$tmpdir/model.img.unknown"
    [ "$(stat_get "$tmpdir/stats-$mode" evictions)" -gt 0 ] ||
        fail "$mode: the cache never filled: the soak is too small"
done
