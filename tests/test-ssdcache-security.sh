#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: only its owner can place a cache (design
# invariant 11, issue 18).
#
# With no ssdcache-file, nbdkit must refuse to start, with one message
# naming the directory or file and what is wrong, and leave the target
# untouched (checksum before and after), when:
#  - the default directory was created by another user (nobody), for
#    each fallback: NBDKIT_SSDCACHE_DIR, XDG_CACHE_HOME, HOME and
#    /var/tmp/nbdkit-ssdcache-UID (the issue's case: a 0777 directory
#    of nobody's with a symlink named like the cache file, and
#    ssdcache-reset=true);
#  - the directory is writable by group or by others;
#  - the directory is a symbolic link;
#  - the cache file is a symbolic link, is another user's, or is
#    writable by others;
#  - the cache file is not a cache, with ssdcache-reset=true (also for
#    an explicit ssdcache-file: a foreign file is never overwritten).
# The normal default path still works: parents created 0700, the file
# 0600, and the second run is warm (nbdkit's stats filter below the
# cache counts backend reads).  Encryption: test-ssdcache-luks.sh.
#
# Needs root (to act as a second user, nobody, with setpriv or
# runuser); cases that cannot run here are listed, and the test then
# exits 77 after running all the others.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdinfo --version
requires nbdsh --version
requires nbdkit --filter=stats null --version

size=$((2 * 1024 * 1024))
random_file "$img" $size
skipped=()
other_uid=65534

# as_other CMD...: run CMD as the second user (uid 65534, nobody).
as_other ()
{
    if command -v setpriv >/dev/null; then
        setpriv --reuid=$other_uid --regid=$other_uid --clear-groups -- "$@"
    else
        runuser -u "$(id -nu $other_uid)" -- "$@"
    fi
}
can_act_as_other=no
if [ "$(id -u)" -eq 0 ] && as_other true 2>/dev/null; then
    can_act_as_other=yes
fi

# A shared, world-writable directory like /var/tmp (sticky), where the
# other user can create things: $tmpdir itself is private.
shared="$(mktemp -d /var/tmp/ssdcache-security-shared.XXXXXX)"
cleanup_fn rm -rf "$shared"
chmod 1777 "$shared"

# sum PATH: a checksum of what PATH is: a file's type, mode, owner and
# contents; a symlink's target; a directory's whole tree.
sum ()
{
    if [ -d "$1" ] && [ ! -L "$1" ]; then
        (cd "$1" && find . -printf '%p %y %m %U %s %l\n' | sort &&
             find . -type f -exec md5sum {} + | sort) | md5sum
    else
        { stat -c '%F %a %u %s %N' "$1"; [ -L "$1" ] || md5sum < "$1"; } |
            md5sum
    fi
}

# run ENV... -- PARAMS...: nbdkit with no ssdcache-file, the default
# directory variables unset except those in ENV (NAME=VALUE), the stats
# filter below the cache; reads the whole disk.
bstats="$tmpdir/backend.stats"
stats="$tmpdir/ssdcache.stats"
run ()
{
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    rm -f "$bstats" "$stats"
    env -u NBDKIT_SSDCACHE_DIR -u XDG_CACHE_HOME -u HOME "${envs[@]}" \
        nbdkit -U - --filter="$SSDCACHE_FILTER" --filter=stats file "$img" \
        statsfile="$bstats" ssdcache-stats="$stats" "$@" \
        --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"'
    cmp "$img" "$tmpdir/copy.img" || fail "data read differs from the disk"
}

# refused MESSAGE TARGET ENV... -- PARAMS...: as run, but nbdkit must
# refuse to start with exactly one error, which contains MESSAGE (a
# fixed string), and TARGET must be as it was.
refused ()
{
    local msg="$1" target="$2" before status=0 envs=()
    shift 2
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    before="$(sum "$target")"
    env -u NBDKIT_SSDCACHE_DIR -u XDG_CACHE_HOME -u HOME "${envs[@]}" \
        timeout 30 nbdkit -U - --filter="$SSDCACHE_FILTER" file "$img" "$@" \
        --run 'nbdinfo --size "$uri"' > "$tmpdir/out" 2> "$tmpdir/err" ||
        status=$?
    cat "$tmpdir/out" "$tmpdir/err"
    [ $status -ne 124 ] || fail "nbdkit hung: ${envs[*]} $*"
    [ $status -ne 0 ] || fail "nbdkit did not refuse: ${envs[*]} $*"
    grep -Fq -- "$msg" "$tmpdir/err" ||
        fail "the error does not say \"$msg\": ${envs[*]} $*"
    [ "$(grep -c 'error' "$tmpdir/err")" -eq 1 ] ||
        fail "expected one error message: ${envs[*]} $*"
    [ "$(sum "$target")" = "$before" ] ||
        fail "$target changed: ${envs[*]} $*"
}

# -- the normal default path ---------------------------------------------

# Missing parents are created 0700; the file is 0600; warm on restart.
dir="$tmpdir/new/parents/cache"
run NBDKIT_SSDCACHE_DIR="$dir" --
for d in "$tmpdir/new" "$tmpdir/new/parents" "$dir"; do
    [ "$(stat -c '%a %u' "$d")" = "700 $(id -u)" ] ||
        fail "$d: mode and owner $(stat -c '%a %u' "$d"), expected 700 $(id -u)"
done
files=( "$dir"/*.ssdcache )
[ ${#files[@]} -eq 1 ] && [ -f "${files[0]}" ] || fail "no cache file in $dir"
cachefile="${files[0]}"
name="$(basename "$cachefile")"
[ "$(stat -c '%a %u' "$cachefile")" = "600 $(id -u)" ] ||
    fail "$cachefile: mode and owner $(stat -c '%a %u' "$cachefile")"
[ "$(backend_read_bytes "$bstats")" -ge $size ] || fail "first run not cold"
run NBDKIT_SSDCACHE_DIR="$dir" --
b="$(backend_read_bytes "$bstats")"
[ "$b" -le $((size / 64)) ] || fail "second run read $b bytes from the backend: not warm"
[ "$(stat_get "$stats" loaded_slots)" -gt 0 ] || fail "second run loaded no slot"
# A directory of the user's own that others can read is accepted.
chmod 0755 "$dir"
run NBDKIT_SSDCACHE_DIR="$dir/" --
chmod 0700 "$dir"

# -- directories ------------------------------------------------------------

# Writable by group, by others.
for mode in 0770 0707 0777; do
    d="$tmpdir/writable-$mode"
    mkdir "$d"
    chmod $mode "$d"
    refused "cache directory $d is writable by group or others (mode $mode)" \
            "$d" NBDKIT_SSDCACHE_DIR="$d" --
done
# A symbolic link to a directory of the user's own.
mkdir -m 0700 "$tmpdir/real"
ln -s "$tmpdir/real" "$tmpdir/link"
refused "cache directory $tmpdir/link is a symbolic link" "$tmpdir/real" \
        NBDKIT_SSDCACHE_DIR="$tmpdir/link" --
refused "cache directory $tmpdir/link is a symbolic link" "$tmpdir/real" \
        NBDKIT_SSDCACHE_DIR="$tmpdir/link/" --
# Not a directory.
echo "not a directory" > "$tmpdir/plain"
refused "cache directory $tmpdir/plain is not a directory" "$tmpdir/plain" \
        NBDKIT_SSDCACHE_DIR="$tmpdir/plain" --

# Created by another user, for each fallback.
if [ $can_act_as_other = yes ]; then
    victim="$tmpdir/victim"
    printf 'precious\n' > "$victim"
    chmod 0644 "$victim"
    # NBDKIT_SSDCACHE_DIR: nobody's own directory (not even writable by
    # others), holding a planted "cache file".
    d="$shared/by-other"
    as_other mkdir -m 0755 "$d"
    as_other sh -c "echo planted > '$d/$name'"
    refused "cache directory $d is owned by uid $other_uid, not by this process (uid 0)" \
            "$d" NBDKIT_SSDCACHE_DIR="$d" --
    # XDG_CACHE_HOME and HOME.
    as_other mkdir -p "$shared/xdg/nbdkit-ssdcache" "$shared/home/.cache/nbdkit-ssdcache"
    refused "cache directory $shared/xdg/nbdkit-ssdcache is owned by uid $other_uid" \
            "$shared/xdg" XDG_CACHE_HOME="$shared/xdg" --
    refused "cache directory $shared/home/.cache/nbdkit-ssdcache is owned by uid $other_uid" \
            "$shared/home" HOME="$shared/home" --
    # A symlink to a directory of the user's own, planted by nobody.
    as_other ln -s "$tmpdir/real" "$shared/planted-link"
    refused "cache directory $shared/planted-link is a symbolic link" \
            "$tmpdir/real" NBDKIT_SSDCACHE_DIR="$shared/planted-link" --
    # The issue: /var/tmp/nbdkit-ssdcache-0 made by nobody, mode 0777,
    # with a symlink named like the cache file to a file root owns, and
    # ssdcache-reset=true.  Only if that directory does not exist (it
    # would be a real cache of this machine's root).
    vt="/var/tmp/nbdkit-ssdcache-$(id -u)"
    if [ ! -e "$vt" ] && [ ! -L "$vt" ]; then
        cleanup_fn rm -rf "$vt"
        as_other mkdir -m 0777 "$vt"
        as_other ln -s "$victim" "$vt/$name"
        v="$(sum "$victim")"
        refused "cache directory $vt is owned by uid $other_uid" "$vt" \
                -- ssdcache-reset=true
        [ "$(sum "$victim")" = "$v" ] || fail "the symlink's target changed"
        rm -rf "$vt"
    else
        skipped+=("/var/tmp fallback: $vt exists already")
    fi
else
    skipped+=("directories and files of another user: need root and setpriv or runuser")
fi

# -- the default cache file ---------------------------------------------------

# A symlink named like the cache file, to a file of the user's own,
# with ssdcache-reset=true.
d="$tmpdir/files"
mkdir -m 0700 "$d"
printf 'nine byte' > "$tmpdir/target"
ln -s "$tmpdir/target" "$d/$name"
refused "default cache file $d/$name is a symbolic link" "$tmpdir/target" \
        NBDKIT_SSDCACHE_DIR="$d" -- ssdcache-reset=true
refused "default cache file $d/$name is a symbolic link" "$d" \
        NBDKIT_SSDCACHE_DIR="$d" -- ssdcache-reset=true
rm "$d/$name"
# A dangling one (open would create its target).
ln -s "$tmpdir/not-there" "$d/$name"
refused "default cache file $d/$name is a symbolic link" "$d" \
        NBDKIT_SSDCACHE_DIR="$d" --
[ ! -e "$tmpdir/not-there" ] || fail "the dangling symlink's target was created"
rm "$d/$name"
# Not a cache, with ssdcache-reset=true: never re-initialised.
printf 'precious data, not a cache\n' > "$d/$name"
chmod 0600 "$d/$name"
refused "is not an ssdcache cache" "$d/$name" \
        NBDKIT_SSDCACHE_DIR="$d" -- ssdcache-reset=true
grep -Fq "delete it" "$tmpdir/err" || fail "the message does not say to delete the file"
# Writable by others; another user's.
cp "$cachefile" "$d/$name"
chmod 0606 "$d/$name"
refused "default cache file $d/$name is writable by group or others (mode 0606)" \
        "$d/$name" NBDKIT_SSDCACHE_DIR="$d" -- ssdcache-reset=true
chmod 0600 "$d/$name"
if [ "$(id -u)" -eq 0 ]; then
    chown $other_uid "$d/$name"
    refused "default cache file $d/$name is owned by uid $other_uid" \
            "$d/$name" NBDKIT_SSDCACHE_DIR="$d" -- ssdcache-reset=true
    chown 0 "$d/$name"
else
    skipped+=("cache file of another user: needs root (chown)")
fi
# Once it is the user's own cache again, it is used (warm).
run NBDKIT_SSDCACHE_DIR="$d" --
[ "$(stat_get "$stats" loaded_slots)" -gt 0 ] || fail "the copied cache was not used"

# -- an explicit ssdcache-file ------------------------------------------------

# Trusted as given (a symlink works, see test-ssdcache-hostile-params.sh),
# but a foreign file is still never overwritten by a reset.
printf 'a disk image, say\n' > "$tmpdir/foreign"
refused "cache file $tmpdir/foreign is not an ssdcache cache" "$tmpdir/foreign" \
        -- ssdcache-file="$tmpdir/foreign" ssdcache-reset=true
ln -s "$tmpdir/foreign" "$tmpdir/foreign-link"
refused "cache file $tmpdir/foreign-link is not an ssdcache cache" "$tmpdir/foreign" \
        -- ssdcache-file="$tmpdir/foreign-link" ssdcache-reset=true
# Zeroes, even with data far into the file, are not blank.
truncate -s 64M "$tmpdir/sparse"
printf 'x' | dd of="$tmpdir/sparse" bs=1 seek=$((40 << 20)) conv=notrunc status=none
refused "(byte $((40 << 20)) is not zero)" "$tmpdir/sparse" \
        -- ssdcache-file="$tmpdir/sparse" ssdcache-reset=true
# An empty or all-zero file is a new cache.
truncate -s 0 "$tmpdir/sparse"
truncate -s 64M "$tmpdir/sparse"
run -- ssdcache-file="$tmpdir/sparse"

if [ ${#skipped[@]} -gt 0 ]; then
    for s in "${skipped[@]}"; do
        echo "$0: case skipped: $s"
    done
    exit 77
fi
