#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: what clients are told (nbdinfo), and
# --dump-plugin.
#
# 1. Block size: the preferred block size is the cache page size where
#    the plugin states nothing (minimum 1, maximum 4294967295, as
#    nbdkit's cache filter does), at least the page size within the
#    plugin's maximum, and the plugin's own where its maximum is
#    smaller than a page (nbdkit's blocksize-policy filter plays such
#    a plugin).
# 2. Rotational: what the device of the cache file is (sysfs), else
#    (a cache file on tmpfs) the plugin's answer.
# 3. --dump-plugin (nbdkit 1.36 and later): the filter's key=value
#    lines; with an older nbdkit it must still work.
# (Multi-conn: test-ssdcache-multiconn.sh.)
source "$(dirname "$0")/functions.sh"
set -e -u -x

requires nbdinfo --version
requires nbdkit --filter=blocksize-policy null --version

truncate -s 16M "$img"

# info ARGS...: nbdinfo of the filter over ARGS, in $tmpdir/info.
info ()
{
    rm -f "$cache"
    run_ssdcache "$@" --run 'nbdinfo "$uri"' > "$tmpdir/info"
    cat "$tmpdir/info"
}
# field NAME: its value in $tmpdir/info.
field ()
{
    awk -v k="$1:" '$1 == k { print $2 }' "$tmpdir/info"
}
expect_sizes ()
{
    [ "$(field block_size_minimum)" = "$1" ] &&
        [ "$(field block_size_preferred)" = "$2" ] &&
        [ "$(field block_size_maximum)" = "$3" ] ||
        fail "block sizes $(field block_size_minimum)/$(field block_size_preferred)/$(field block_size_maximum), expected $1/$2/$3: ${*:4}"
}

# -- 1. block size --------------------------------------------------------
info file "$img" ssdcache-file="$cache"
expect_sizes 1 65536 4294967295 "default page size"
info file "$img" ssdcache-file="$cache" ssdcache-page-size=256K
expect_sizes 1 262144 4294967295 "256K pages"
policy=(--filter=blocksize-policy file "$img" blocksize-minimum=512
        blocksize-preferred=4096)
info "${policy[@]}" blocksize-maximum=1M ssdcache-file="$cache"
expect_sizes 512 65536 1048576 "a plugin that prefers 4K, at most 1M"
info "${policy[@]}" blocksize-maximum=32K ssdcache-file="$cache"
expect_sizes 512 4096 32768 "a plugin that takes at most 32K"
info --filter=blocksize-policy file "$img" blocksize-minimum=512 \
    blocksize-preferred=1M blocksize-maximum=2M \
    ssdcache-file="$cache"
expect_sizes 512 1048576 2097152 "a plugin that prefers more than a page"

# -- 2. rotational --------------------------------------------------------
# The cache file's device, as the filter sees it: its queue in sysfs
# (the disk's, for a partition), or nothing (major 0: tmpfs, btrfs...).
sysfs_rotational ()
{
    "$PYTHON" - "$1" <<'PY'
import os, sys
st = os.stat(sys.argv[1])
maj, mnr = os.major(st.st_dev), os.minor(st.st_dev)
if maj != 0:
    for p in ("/sys/dev/block/%d:%d/queue/rotational",
              "/sys/dev/block/%d:%d/../queue/rotational"):
        try:
            v = open(p % (maj, mnr)).read().strip()
        except OSError:
            continue
        if v in ("0", "1"):
            print("true" if v == "1" else "false")
            break
PY
}
nbdkit -U - file "$img" --run 'nbdinfo "$uri"' > "$tmpdir/info"
plugin_rot="$(field is_rotational)"
[ -n "$plugin_rot" ] || fail "nbdinfo shows no is_rotational"

info file "$img" ssdcache-file="$cache"
want="$(sysfs_rotational "$cache")"
: "${want:=$plugin_rot}"
[ "$(field is_rotational)" = "$want" ] ||
    fail "cache in $tmpdir: is_rotational $(field is_rotational), expected $want"

if [ -d /dev/shm ] && [ -w /dev/shm ] &&
   [ -z "$(sysfs_rotational /dev/shm)" ]; then
    shmdir="$(mktemp -d /dev/shm/ssdcache-advertise.XXXXXX)"
    cleanup_fn rm -rf "$shmdir"
    rm -f "$cache"
    run_ssdcache file "$img" ssdcache-file="$shmdir/c.ssdcache" \
        --run 'nbdinfo "$uri"' > "$tmpdir/info"
    [ "$(field is_rotational)" = "$plugin_rot" ] ||
        fail "cache on tmpfs: is_rotational $(field is_rotational), expected the plugin's $plugin_rot"
fi

# -- 3. --dump-plugin -----------------------------------------------------
nbdkit --filter="$SSDCACHE_FILTER" null --dump-plugin > "$tmpdir/dump"
cat "$tmpdir/dump"
grep -q '^name=null$' "$tmpdir/dump" || fail "--dump-plugin: no plugin lines"
version="$(nbdkit --version | awk '{ print $2 }')"
major="${version%%.*}" minor="${version#*.}"
minor="${minor%%.*}"
if [ "$major" -gt 1 ] || [ "$minor" -ge 36 ]; then
    for kv in ssdcache_page_size_min=4096 ssdcache_page_size_max=2097152 \
              ssdcache_page_size_default=65536 \
              "ssdcache_default_dir=$NBDKIT_SSDCACHE_DIR"; do
        grep -qxF -- "$kv" "$tmpdir/dump" || fail "--dump-plugin: no $kv"
    done
    grep -Eq '^ssdcache_version=[0-9]+\.[0-9]+' "$tmpdir/dump" ||
        fail "--dump-plugin: no ssdcache_version"
else
    ! grep -q '^ssdcache_' "$tmpdir/dump" ||
        fail "nbdkit $version does not call .dump_plugin of filters"
fi
