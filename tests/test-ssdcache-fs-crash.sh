#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter under a real file system, killed: ext4 on the
# export (nbdfuse and a loop device, see fs_attach in functions.sh), in
# each mode.  A writer creates files in a loop; for each one it writes
# it, fsyncs the file, fsyncs its directory, and only then records its
# name and checksum in a log kept outside the export.  nbdkit is killed
# with SIGKILL while that goes on; the stack is torn down, a new nbdkit
# starts on the same cache file, and the mount (which replays the
# journal) must hold every file the log names, with the right checksum,
# from this crash and every earlier one.  Then e2fsck -fn must find
# nothing.  At the end the backing file alone must hold a clean file
# system.

source "$(dirname "$0")/functions.sh"
set -e -x

requires_fs_stack

size=$((128 * 1024 * 1024))
iterations="${FS_CRASH_ITERATIONS:-5}"
seed="${FS_CRASH_SEED:-$$}"
echo "seed: $seed"
RANDOM=$seed

# verify_logged MNT LOG: every file LOG names is in MNT with its checksum.
verify_logged ()
{
    local n
    n="$(wc -l < "$2")"
    awk '{ print $2 "  " $1 }' "$2" > "$tmpdir/sums"
    (cd "$1" && sha256sum --quiet -c "$tmpdir/sums") ||
        fail "a file whose fsync had completed is missing or differs after the crash"
    echo "verified $n fsynced files"
}

for mode in writethrough writeback writearound; do
    d="$tmpdir/$mode"
    mkdir -p "$d"
    img="$d/disk.img"
    log="$d/fsynced.log"        # outside the export
    : > "$log"
    truncate -s $size "$img"
    args=( -U "$d/sock" file "$img" ssdcache-file="$d/disk.ssdcache"
           ssdcache-size=$size ssdcache-mode=$mode )

    start_ssdcache -P "$d/pid" "${args[@]}"
    fs_attach "$d/fs" "$d/sock"
    cleanup_fn kill_writer      # after fs_attach: runs before its teardown
    mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$fs_dev"
    fs_mount "$d/fs"

    for (( it = 1; it <= iterations; it++ )); do
        before="$(wc -l < "$log")"
        fs_writer "$d/fs/mnt/i$it" "i$it" "$log" &
        writer_pid=$!
        # A random number of files fsynced (5 to 44), then a crash
        # wherever the writer is when that is seen (it goes on while
        # the log is polled).  A count, not a time: on a fast machine
        # a time let the writer fill the file system.
        want=$((before + 5 + RANDOM % 40))
        for (( i = 0; i < 1200; i++ )); do
            [ "$(wc -l < "$log")" -lt $want ] || break
            kill -0 "$writer_pid" 2>/dev/null || fail "the writer stopped before the crash ($mode)"
            sleep 0.1
        done
        [ "$(wc -l < "$log")" -ge $want ] ||
            fail "the writer fsynced fewer than $((want - before)) files in 120 s ($mode)"
        crash_nbdkit "$d/pid"
        kill_writer
        echo "$mode, crash $it: $(( $(wc -l < "$log") - before )) files fsynced"
        fs_teardown "$d/fs"

        # Restart on the same cache file; the mount replays the journal.
        start_ssdcache -P "$d/pid" "${args[@]}"
        fs_attach "$d/fs" "$d/sock"
        fs_mount "$d/fs"
        verify_logged "$d/fs/mnt" "$log"
        fs_umount "$d/fs"
        e2fsck -fn "$fs_dev" || fail "e2fsck found errors after crash $it ($mode)"
        fs_mount "$d/fs"
    done

    verify_logged "$d/fs/mnt" "$log"
    fs_umount "$d/fs"
    fs_detach "$d/fs"
    stop_nbdkit "$d/pid"
    # The backing file alone (writeback: written back at the clean stop).
    e2fsck -fn "$img" || fail "the backing file's file system has errors ($mode)"
    rm -f "$img" "$d/disk.ssdcache"
done
