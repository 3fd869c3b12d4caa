#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter over a real SSH backend.  The test starts its
# own OpenSSH server (sshd, as a child of the test) on a free loopback
# port, with its own host key, user key and authorized_keys in
# $tmpdir, and serves an image through nbdkit's ssh plugin (SFTP) with
# ssdcache stacked on top:
#
# 1. writethrough: random reads and writes, every read checked against
#    a model; the file on the SSH server equals the model afterwards;
#    a full read equals the file.
# 2. warm restart: a new nbdkit on the same cache file reads the whole
#    image again and takes (almost) nothing from the SSH backend
#    (nbdkit's stats filter below ssdcache counts backend reads).
# 3. writeback: writes complete in the cache (the file on the server
#    is untouched while background writeback is held off), and a clean
#    exit writes everything back: the file then equals the model.
# 4. writeback with ssdcache-flush=backend: a FLUSH makes the file on
#    the server current while nbdkit still runs.

source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd nbdcopy
requires nbdkit ssh --version
requires_filter stats
requires test -x /usr/sbin/sshd
requires command -v ssh-keygen

start_sshd

size=$((8 * 1024 * 1024))
random_file "$img" $size

ssh_plugin_args "$img"

# Plain nbdkit ssh works, or the set-up is broken (not a filter bug).
nbdkit -U - "${ssh_args[@]}" --run 'nbdinfo --size "$uri"' > "$tmpdir/size" ||
    fail "nbdkit's ssh plugin cannot read $img through the test's sshd"
[ "$(cat "$tmpdir/size")" -eq $size ] || fail "ssh plugin size is $(cat "$tmpdir/size")"

cache="$tmpdir/wt.ssdcache"
seed="${RANDOM_IO_SEED:-$RANDOM}"
echo "random-io seed: $seed"

# -- 1. writethrough: reads and writes through ssh -----------------------

cp "$img" "$tmpdir/model0.img"
rm -f "$stats" "$bstats"
start_ssdcache -P "$pid" -U "$sock" --filter=stats \
               "${ssh_args[@]}" statsfile="$bstats" \
               ssdcache-file="$cache" ssdcache-size=8M ssdcache-page-size=64K \
               ssdcache-stats="$stats"
"$PYTHON" "$random_io" --socket "$sock" --connections 2 --ops 400 \
          --seed "$seed" --mix read=55,write=35,zero=5,flush=5 \
          --max-len 128K --skip-unsupported \
          --model "$tmpdir/model0.img" --save-model "$tmpdir/model1.img" \
          --timeout 30
# Writethrough: every write is on the server before it completes.
cmp "$img" "$tmpdir/model1.img" ||
    fail "writethrough: the file on the ssh server differs from the model"
cmp -s "$img" "$tmpdir/model0.img" && fail "no write reached the ssh server"
# Fill the rest of the cache: a full read, equal to the file.
expect_export "$sock" "$img" "writethrough: full read differs from the file"
stop_nbdkit "$pid"
cat "$stats" "$bstats"
expect_stat "$stats" write_ops -gt 0 "writethrough"
expect_stat "$stats" read_misses -gt 0 "writethrough"
expect_stat "$stats" cache_errors -eq 0 "writethrough"
expect_stat "$bstats" backend_read_bytes -gt 0 "cold run read nothing from ssh"

# -- 2. warm restart: (almost) nothing read over ssh ---------------------

rm -f "$stats" "$bstats" "$tmpdir/copy.img"
start_ssdcache -P "$pid" -U "$sock" --filter=stats \
               "${ssh_args[@]}" statsfile="$bstats" \
               ssdcache-file="$cache" ssdcache-stats="$stats"
expect_export "$sock" "$img" "warm read differs from the file"
stop_nbdkit "$pid"
cat "$stats" "$bstats"
expect_warm "$stats" "$bstats" $size "warm restart over ssh"
expect_stat "$stats" bytes_from_cache -ge $((size - size / 64)) "warm restart"

# -- 3. writeback: dirty in the cache, written back at a clean exit ------

cp "$img" "$tmpdir/model2.img"
rm -f "$stats"
# Background writeback held off (idle writeback off, high watermark
# 100 %), so the writes stay in the cache until the clean exit.  The
# cache gets all the room it may have (the image plus a quarter for
# older versions of rewritten pages): a writer that finds no free slot
# makes writeback clean everything, and then this step would not test
# what it says.
start_ssdcache -P "$pid" -U "$sock" \
               "${ssh_args[@]}" \
               ssdcache-file="$tmpdir/wb.ssdcache" ssdcache-size=32M \
               ssdcache-page-size=64K ssdcache-mode=writeback \
               ssdcache-writeback-idle=0 ssdcache-writeback-high=100 \
               ssdcache-writeback-low=100 ssdcache-stats="$stats"
"$PYTHON" "$random_io" --socket "$sock" --connections 2 --ops 400 \
          --seed "$((seed + 1))" --mix read=50,write=40,zero=5,flush=5 \
          --max-len 128K --skip-unsupported \
          --model "$tmpdir/model2.img" --save-model "$tmpdir/model3.img" \
          --timeout 30
cmp -s "$tmpdir/model2.img" "$tmpdir/model3.img" && fail "writeback: nothing was written"
# Whole-page zeroes go straight to the backend in writeback mode, so
# the file may have changed there; but it must not equal the model
# yet (the writes are still in the cache).
cmp -s "$img" "$tmpdir/model3.img" &&
    fail "writeback: the ssh server already has every write although writeback was held off"
stop_nbdkit "$pid"
cat "$stats"
cmp "$img" "$tmpdir/model3.img" ||
    fail "writeback: after a clean exit the file on the ssh server differs from the model"
expect_stat "$stats" pages_written_back -gt 0 "writeback"
expect_stat "$stats" writeback_errors -eq 0 "writeback"
expect_stat "$stats" dirty_pages -eq 0 "writeback: dirty pages left after exit"

# And the written-back data reads back right through a warm cache.
run_ssdcache "${ssh_args[@]}" \
             ssdcache-file="$tmpdir/wb.ssdcache" ssdcache-mode=writeback \
             --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
cmp "$img" "$tmpdir/copy.img" || fail "writeback: warm read after exit differs"

# -- 4. writeback, ssdcache-flush=backend: FLUSH reaches the server ------

start_ssdcache -P "$pid" -U "$sock" \
               "${ssh_args[@]}" \
               ssdcache-file="$tmpdir/wb.ssdcache" ssdcache-mode=writeback \
               ssdcache-flush=backend ssdcache-writeback-idle=0 \
               ssdcache-writeback-high=100 ssdcache-writeback-low=100
IMG="$img" nbdsh -u "$(sock_uri "$sock")" -c '
import os
data = os.urandom(3 * 65536 + 1000)
off = 5 * 65536 + 300
h.pwrite(data, off)
with open(os.environ["IMG"], "rb") as f:
    f.seek(off)
    if f.read(len(data)) == data:
        raise SystemExit("FAIL: the write reached the server before any flush")
h.flush()
with open(os.environ["IMG"], "rb") as f:
    f.seek(off)
    if f.read(len(data)) != data:
        raise SystemExit("FAIL: flush=backend: after FLUSH the file on the "
                         "ssh server lacks the data")
assert h.pread(len(data), off) == data
'
stop_nbdkit "$pid"
cat "$tmpdir/sshd.log"
