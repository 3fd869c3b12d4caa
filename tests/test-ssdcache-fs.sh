#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter under a real file system, in writethrough and
# writeback modes: ext4 on the export (nbdfuse and a loop device, see
# fs_attach in functions.sh).  A tree of a few hundred files of varied
# sizes is written with their checksums kept outside the export, the
# file system is unmounted, checked with e2fsck -fn, mounted again and
# every checksum verified.  Then nbdkit stops, a new one starts on the
# same cache file, and the second mount and full read of the tree must
# be served warm: backend reads are counted by nbdkit's stats filter
# below ssdcache.  At the end the backing file alone must hold a clean
# file system (in writeback mode: written back at the clean stop).

source "$(dirname "$0")/functions.sh"
set -e -x

requires_fs_stack

size=$((256 * 1024 * 1024))   # the export; the cache holds all of it
nfiles="${FS_FILES:-300}"
seed="${FS_SEED:-$$}"
echo "seed: $seed"

# make_tree MNT SUMS: NFILES files of varied sizes (empty, a few bytes,
# rarely block aligned, up to 2 MiB) in 40 directories two levels deep
# under MNT/tree; SUMS gets their sha256sum lines (of the data as it was
# written, not as read back), relative to MNT; $tree_bytes their size.
make_tree ()
{
    local mnt="$1" sums="$2" i r n path
    { set +x; } 2>/dev/null     # 300 files: too much for the log
    RANDOM=$seed
    tree_bytes=0
    : > "$sums"
    for (( i = 0; i < nfiles; i++ )); do
        path="tree/d$((i % 10))/s$((i / 10 % 4))/f$i"
        mkdir -p "$mnt/${path%/*}"
        r=$((RANDOM % 100))
        n=$((RANDOM * 32768 + RANDOM))
        if [ $r -lt 5 ]; then n=0                            # empty
        elif [ $r -lt 40 ]; then n=$((n % 4096))             # < 4 KiB
        elif [ $r -lt 75 ]; then n=$((4096 + n % 61440))     # < 64 KiB
        elif [ $r -lt 95 ]; then n=$((65536 + n % 458752))   # < 512 KiB
        else n=$((524288 + n % 1572864))                     # < 2 MiB
        fi
        tree_bytes=$((tree_bytes + n))
        head -c "$n" /dev/urandom | tee "$mnt/$path" | sha256sum |
            awk -v p="$path" '{ print $1 "  " p }' >> "$sums"
    done
    set -x
    [ "$(wc -l < "$sums")" -eq "$nfiles" ] || fail "make_tree wrote $(wc -l < "$sums") files"
}

# verify_tree MNT SUMS: every file there, whole, with its checksum
# (this reads the whole tree).
verify_tree ()
{
    (cd "$1" && sha256sum --quiet -c "$2") ||
        fail "the tree read back from the file system differs ($1)"
    [ "$(find "$1/tree" -type f | wc -l)" -eq "$nfiles" ] ||
        fail "$1/tree does not hold $nfiles files"
}

# verify_and_stop: mount the attached file system, check the tree,
# detach it and stop nbdkit.
verify_and_stop ()
{
    fs_mount "$d/fs"
    verify_tree "$d/fs/mnt" "$sums"
    fs_umount "$d/fs"
    fs_detach "$d/fs"
    stop_nbdkit "$d/pid"
    cat "$bstats" "$stats"
}

for mode in writethrough writeback; do
    d="$tmpdir/$mode"
    mkdir -p "$d"
    img="$d/disk.img"
    sums="$d/sums"              # outside the export
    bstats="$d/backend.stats"
    stats="$d/ssdcache.stats"
    truncate -s $size "$img"
    args=( -U "$d/sock" --filter=stats file "$img" statsfile="$bstats"
           ssdcache-file="$d/disk.ssdcache" ssdcache-size=$size
           ssdcache-mode=$mode ssdcache-stats="$stats" )

    # Run 1: make the file system and the tree, check it.
    start_ssdcache -P "$d/pid" "${args[@]}"
    fs_attach "$d/fs" "$d/sock"
    # No lazy initialisation: no kernel thread writing inode tables in
    # the background, during the counted run.
    mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$fs_dev"
    fs_mount "$d/fs"
    make_tree "$d/fs/mnt" "$sums"
    fs_umount "$d/fs"
    # A new FUSE file and loop device for the check and the read back:
    # the kernel's caches of the old ones (the FUSE file's pages, the
    # loop device's buffers) are gone, so every read reaches nbdkit.
    fs_detach "$d/fs"
    fs_attach "$d/fs" "$d/sock"
    e2fsck -fn "$fs_dev" || fail "e2fsck found errors after writing the tree ($mode)"
    verify_and_stop

    # Run 2: a new nbdkit on the same cache file, the same mount and
    # full read of the tree.
    rm -f "$bstats" "$stats"
    start_ssdcache -P "$d/pid" "${args[@]}"
    fs_attach "$d/fs" "$d/sock"
    verify_and_stop

    [ "$(stat_get "$stats" loaded_slots)" -gt 0 ] ||
        fail "run 2 loaded nothing from the cache file ($mode)"
    [ "$(stat_get "$stats" read_hits)" -gt 0 ] || fail "run 2 had no read hits ($mode)"
    fromcache="$(stat_get "$stats" bytes_from_cache)"
    backend="$(backend_read_bytes "$bstats")"
    # The whole tree went through nbdkit (no kernel cache kept it).
    [ $((fromcache + backend)) -ge "$tree_bytes" ] ||
        fail "run 2 read only $((fromcache + backend)) bytes, the tree has $tree_bytes ($mode)"
    # Run 2 asks for nothing that run 1 did not read through nbdkit
    # (the same mount and full read of the tree; e2fsck read all the
    # metadata before), and the cache holds the whole export, so nothing
    # was evicted: what run 1 read is all hits.  What else comes from the
    # backend is readahead: the kernel's (the loop device reads its FUSE
    # file through the page cache) takes other windows around the
    # metadata than in run 1, whose mount followed e2fsck, and the
    # filter's own prefetches a few pages past what run 1 read.  Measured: 72 to 324 KiB of 31 to 36 MiB read, a
    # few 64 KiB pages.  Allowed: 1 MiB (16 pages) plus 1% of the bytes
    # read (from the cache plus from the backend); a cold or half-cold
    # cache reads tens of MiB from the backend.
    [ $((backend - 1048576)) -le $(( (fromcache + backend) / 100 )) ] ||
        fail "run 2 read $backend bytes from the backend and $fromcache from the cache: not warm ($mode)"

    # The backing file alone holds a clean file system.
    e2fsck -fn "$img" || fail "the backing file's file system has errors ($mode)"
    rm -f "$img" "$d/disk.ssdcache"
done
