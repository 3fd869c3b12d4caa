#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: backend write errors during writeback.
# nbdkit's error filter sits below ssdcache and fails every backend
# write (EIO) while a trigger file exists.
#
# flush=cache: client writes and flushes succeed (the data is durable
# on the cache), reads return the new data from the cache, writeback
# fails and counts writeback_errors; once the trigger is gone the
# pages (still dirty) are retried and written back, and the backing
# file equals the model, before and after a clean exit.
#
# flush=backend: FLUSH (and a FUA write) must fail while the backend
# refuses writes; after the trigger is gone a FLUSH succeeds and the
# backing file has the data.

source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd
requires_filter error

size=$((16 * 1024 * 1024))
random_file "$img" $size
cp "$img" "$tmpdir/model0.img"
seed="${RANDOM_IO_SEED:-$RANDOM}"

args=( --filter=error file "$img"
       error-pwrite=EIO error-pwrite-rate=100% error-file="$trigger"
       ssdcache-file="$cache" ssdcache-size=8M ssdcache-page-size=64K
       ssdcache-mode=writeback ssdcache-writeback-idle=100 )

# -- flush=cache ---------------------------------------------------------

touch "$trigger"
start_ssdcache -P "$pid" -U "$sock" "${args[@]}" ssdcache-flush=cache \
               ssdcache-stats="$tmpdir/stats1" 2> "$log"
# Writes, flushes, FUA writes and reads (checked against the model)
# while every backend write fails.  Under 2M in total, in a 8M cache.
"$PYTHON" "$random_io" --socket "$sock" --connections 2 --ops 120 \
          --seed "$seed" --mix read=50,write=45,flush=5 --max-len 64K \
          --fua-prob 0.1 --hot-fraction 0 \
          --model "$tmpdir/model0.img" --save-model "$tmpdir/model1.img" \
          --timeout 30
cmp -s "$img" "$tmpdir/model1.img" && fail "no write happened"
# Let writeback try (idle after 100 ms, retries every second).
wait_until 5 grep -q "writeback.*failed" "$log" ||
    { cat "$log"; fail "no writeback failure was logged while the backend failed writes"; }
cat "$log"
cmp "$img" "$tmpdir/model0.img" ||
    fail "the backing file changed although every backend write failed"
# Reads still right (from the cache), after the failed writebacks.
"$PYTHON" "$random_io" --socket "$sock" --ops 50 --mix read=1 \
          --model "$tmpdir/model1.img" --timeout 30

# The errors stop: the dirty pages are retried and written back.
rm "$trigger"
wait_until 10 cmp -s "$img" "$tmpdir/model1.img" ||
    fail "10 s after the backend recovered, writeback has not written the data"
stop_nbdkit "$pid"
cat "$tmpdir/stats1"
cmp "$img" "$tmpdir/model1.img" ||
    fail "after a clean exit the backing file does not equal the model"
expect_stat "$tmpdir/stats1" writeback_errors -gt 0 "run 1"
expect_stat "$tmpdir/stats1" dirty_lost -eq 0 "run 1"
expect_stat "$tmpdir/stats1" pages_written_back -gt 0 "run 1"

# Same again, but the errors stop only at shutdown: the clean exit
# (writeback-on-exit=true) must write everything back.
touch "$trigger"
start_ssdcache -P "$pid" -U "$sock" "${args[@]}" ssdcache-flush=cache \
               ssdcache-stats="$tmpdir/stats2" 2> "$log"
"$PYTHON" "$random_io" --socket "$sock" --connections 2 --ops 120 \
          --seed "$((seed + 1))" --mix read=50,write=45,flush=5 \
          --max-len 64K --hot-fraction 0 \
          --model "$tmpdir/model1.img" --save-model "$tmpdir/model2.img" \
          --timeout 30
wait_until 5 grep -q "writeback.*failed" "$log" || :
cmp "$img" "$tmpdir/model1.img" ||
    fail "run 2: the backing file changed although every backend write failed"
rm "$trigger"
stop_nbdkit "$pid"
cat "$log" "$tmpdir/stats2"
cmp "$img" "$tmpdir/model2.img" ||
    fail "run 2: after a clean exit the backing file does not equal the model"
expect_stat "$tmpdir/stats2" writeback_errors -gt 0 "run 2"
expect_stat "$tmpdir/stats2" dirty_lost -eq 0 "run 2"

# -- flush=backend -------------------------------------------------------

cp "$img" "$tmpdir/model3.img"
touch "$trigger"
start_ssdcache -P "$pid" -U "$sock" "${args[@]}" ssdcache-flush=backend \
               ssdcache-stats="$tmpdir/stats3" 2> "$log"
TRIGGER="$trigger" IMG="$img" nbdsh -u "$(sock_uri "$sock")" -c '
import os
from ssdtest import expect_error, expect_export, expect_file
data = os.urandom(200000)
h.pwrite(data, 1000000)
expect_error("flush=backend: FLUSH while the backend fails every write",
             h.flush)
expect_error("flush=backend: a FUA write while the backend fails every "
             "write", h.pwrite, os.urandom(4096), 3 * 65536 + 512,
             nbd.CMD_FLAG_FUA)
# The data is still served (from the cache).
assert h.pread(200000, 1000000) == data, "wrong data read back"
with open(os.environ["IMG"], "rb") as f:
    f.seek(1000000)
    assert f.read(200000) != data, "the data reached the backing file?"
os.unlink(os.environ["TRIGGER"])
h.flush()
expect_file(os.environ["IMG"], 1000000, data,
            "flush=backend: after a successful FLUSH the backing file")
# The failed FUA write may or may not have been applied (its data is
# undefined), but the cache and the backend must agree after FLUSH.
expect_export(h, os.environ["IMG"],
              "after FLUSH the cache and backend disagree", 3 * 65536 + 512,
              4096)
'
stop_nbdkit "$pid"
cat "$log" "$tmpdir/stats3"
expect_stat "$tmpdir/stats3" writeback_errors -gt 0 "flush=backend"
expect_stat "$tmpdir/stats3" dirty_lost -eq 0 "flush=backend"
