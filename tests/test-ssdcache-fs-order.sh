#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a lost cache under a real file system, with
# ssdcache-writeback-order=flush.  ext4 on the export (nbdfuse and a
# loop device, see fs_attach in functions.sh), writeback mode with
# flushes at cache speed over a backend slowed by the delay filter.  A
# writer creates files and fsyncs each (and its directory) before it
# logs it; every 24 files it pauses until the stats file shows the
# backend holding every flush (a checkpoint: the files logged before
# it are behind the reported flush point).  nbdkit is killed with
# SIGKILL at a random moment, the CACHE FILE IS DELETED, and the
# backing file alone is mounted (the journal is replayed): every file
# logged before the last checkpoint must be there with its checksum,
# and e2fsck -fn must find nothing.  The next round starts a new cache
# on that backing file (and expects every file it holds intact).
#
# FS_ORDER_ORDER=offset runs it with the offset order instead (whose
# gauges stay 0: every checkpoint passes at once), FS_ORDER_ARGS adds
# nbdkit parameters.  With writeback held back, the offset order fails
# it and the flush order passes (docs/design.md, invariant 9):
#   FS_ORDER_ORDER=offset FS_ORDER_ARGS="ssdcache-writeback-idle=600000
#   ssdcache-writeback-high=30 ssdcache-writeback-low=0" FS_ORDER_ROUNDS=4

source "$(dirname "$0")/functions.sh"
set -e -x

requires_fs_stack

size=$((128 * 1024 * 1024))
rounds="${FS_ORDER_ROUNDS:-3}"
seed="${FS_ORDER_SEED:-$$}"
order="${FS_ORDER_ORDER:-flush}"
echo "seed: $seed"
RANDOM=$seed

d="$tmpdir/order"
mkdir -p "$d"
img="$d/disk.img"
cache="$d/disk.ssdcache"
stats="$d/stats"
log="$d/fsynced.log"            # outside the export: "NAME SHA256"
marks="$d/checkpoints"          # lines of $log behind the flush point
: > "$log"
: > "$marks"
truncate -s $size "$img"
args=( -U "$d/sock" --filter=delay file "$img" delay-write=10ms
       ssdcache-file="$cache" ssdcache-size=32M ssdcache-mode=writeback
       ssdcache-flush=cache ssdcache-writeback-order=$order
       ssdcache-stats="$stats" ssdcache-stats-interval=1 ${FS_ORDER_ARGS:-} )

# caught_up: the stats file, computed after now, shows the backend
# holding every client flush.  (A new file is computed after the one
# before it was written: two new ones make sure.)
caught_up ()
{
    local t0 i new=0
    t0="$(stat -c %Y "$stats" 2>/dev/null || echo 0)"
    for (( i = 0; i < 300; i++ )); do
        sleep 0.1
        [ "$(stat -c %Y "$stats" 2>/dev/null || echo 0)" -gt "$t0" ] ||
            continue
        t0="$(stat -c %Y "$stats")"
        new=$((new + 1))
        [ $new -ge 2 ] || continue
        [ "$(stat_get "$stats" order_lag_flushes)" -eq 0 ] &&
            [ "$(stat_get "$stats" order_behind_bytes)" -eq 0 ] &&
            return 0
    done
    return 1
}

# checkpoint: once the backend has caught up, the files logged so far
# are behind the flush point (run by fs_writer every 24 files).
checkpoint ()
{
    if caught_up; then
        wc -l < "$log" >> "$marks"
    fi
}

# The backing file alone, on a loop device of our own: mounted (the
# journal is replayed), the checkpointed files checked, unmounted.
alone_loop=
alone_detach ()
{
    if [ -n "$alone_loop" ]; then
        umount -l "$d/alone" 2>/dev/null || true
        losetup -d "$alone_loop" 2>/dev/null || true
        alone_loop=
    fi
}
cleanup_fn alone_detach

check_alone ()
{
    local upto n
    upto="$(tail -n 1 "$marks")"
    upto="${upto:-0}"
    mkdir -p "$d/alone"
    alone_loop="$(losetup -f --show "$img")"
    mount "$alone_loop" "$d/alone" ||
        fail "the backing file alone does not mount after the cache was lost"
    head -n "$upto" "$log" | awk '{ print $2 "  " $1 }' > "$tmpdir/sums"
    (cd "$d/alone" && sha256sum --quiet -c "$tmpdir/sums") ||
        fail "a file fsynced before the reported flush point is missing or differs"
    n="$(wc -l < "$log")"
    echo "round $1: $upto of $n fsynced files were behind the flush point: all there"
    # The others may have been lost with the crash; those that were not
    # are on the backing file now, behind every later flush point.
    while read -r name sum; do
        if [ -f "$d/alone/$name" ] &&
           [ "$(sha256sum < "$d/alone/$name")" = "$sum  -" ]; then
            echo "$name $sum"
        fi
    done < "$log" > "$tmpdir/kept"
    mv "$tmpdir/kept" "$log"
    wc -l < "$log" >> "$marks"
    umount "$d/alone"
    e2fsck -fn "$alone_loop" ||
        fail "e2fsck found errors on the backing file alone (round $1)"
    losetup -d "$alone_loop"
    alone_loop=
}

start_ssdcache -P "$d/pid" "${args[@]}"
fs_attach "$d/fs" "$d/sock"
cleanup_fn kill_writer
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$fs_dev"
fs_mount "$d/fs"

for (( r = 1; r <= rounds; r++ )); do
    fs_writer "$d/fs/mnt/r$r" "r$r" "$log" 24 checkpoint &
    writer_pid=$!
    # At least two checkpoints, then a crash at a random moment.
    before="$(wc -l < "$marks")"
    for (( i = 0; i < 900; i++ )); do
        [ "$(wc -l < "$marks")" -lt $((before + 2)) ] || break
        kill -0 "$writer_pid" 2>/dev/null || fail "the writer stopped (round $r)"
        sleep 0.1
    done
    [ "$(wc -l < "$marks")" -ge $((before + 2)) ] ||
        fail "the backend never caught up in 90 s (round $r)"
    sleep "$((RANDOM % 3)).$((RANDOM % 10))"
    cat "$stats"
    crash_nbdkit "$d/pid"
    kill_writer
    fs_teardown "$d/fs"
    rm -f "$cache"*             # the cache is lost for good
    check_alone "$r"

    # A new cache on what the backing file holds.
    start_ssdcache -P "$d/pid" "${args[@]}"
    fs_attach "$d/fs" "$d/sock"
    fs_mount "$d/fs"
done

fs_umount "$d/fs"
fs_detach "$d/fs"
crash_nbdkit "$d/pid"
