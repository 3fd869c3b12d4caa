#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: bad parameters fail at start (nbdkit exits
# with an error before serving) with a message naming the parameter.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdinfo --version

random_file "$img" $((4 * 1024 * 1024))
mkdir "$tmpdir/a-directory"

# good PARAMS...: this must work (so the failures below are due to the
# one bad parameter, not to the set-up).
good ()
{
    run_ssdcache --timeout 30 file "$img" "$@" \
                 --run 'nbdinfo --size "$uri"' ||
        fail "nbdkit failed with good parameters: $*"
}

# bad NAME PARAMS...: must fail at start (--run true: before serving);
# stderr must name NAME.  Problems are collected and reported at the
# end, so one run shows all of them.
problems=()
bad ()
{
    local name="$1" status=0
    shift
    run_ssdcache --timeout 30 file "$img" "$@" \
                 --run true 2> "$tmpdir/err" || status=$?
    cat "$tmpdir/err"
    if [ $status -eq 0 ]; then
        problems+=("accepted: $*")
    elif [ $status -eq 124 ]; then
        problems+=("hung: $*")
    elif ! grep -q -- "$name" "$tmpdir/err"; then
        problems+=("error does not name $name: $* => $(tr '\n' ' ' < "$tmpdir/err")")
    fi
}

c="ssdcache-file=$tmpdir/c.ssdcache"

good "$c"
good "$c" ssdcache-size=1M ssdcache-page-size=64K ssdcache-reset=true

bad ssdcache-size      "$c" ssdcache-size=0 ssdcache-reset=true
bad ssdcache-size      "$c" ssdcache-size=-1M ssdcache-reset=true
bad ssdcache-size      "$c" ssdcache-size=lots ssdcache-reset=true
bad ssdcache-size      "ssdcache-file=$tmpdir/n2.ssdcache" ssdcache-size=1K
bad ssdcache-page-size "ssdcache-file=$tmpdir/n3.ssdcache" ssdcache-page-size=3000
bad ssdcache-page-size "ssdcache-file=$tmpdir/n3.ssdcache" ssdcache-page-size=1K
bad ssdcache-page-size "ssdcache-file=$tmpdir/n3.ssdcache" ssdcache-page-size=2K
bad ssdcache-page-size "ssdcache-file=$tmpdir/n3.ssdcache" ssdcache-page-size=4M
bad ssdcache-page-size "ssdcache-file=$tmpdir/n3.ssdcache" ssdcache-page-size=0
bad ssdcache-page-size "ssdcache-file=$tmpdir/n3.ssdcache" ssdcache-page-size=big
bad ssdcache-mode      "$c" ssdcache-mode=bogus
bad ssdcache-file      ssdcache-file=/nonexistent-dir/x.ssdcache
bad ssdcache-file      ssdcache-file="$tmpdir/a-directory"
bad ssdcache-file      ssdcache-file=
bad ssdcache-reset     "$c" ssdcache-reset=maybe
bad ssdcache-defer-writes "$c" ssdcache-defer-writes=maybe
good "$c" ssdcache-defer-writes=false
bad ssdcache-writeback-seq-cutoff "$c" ssdcache-writeback-seq-cutoff=2G
bad ssdcache-writeback-seq-cutoff "$c" ssdcache-writeback-seq-cutoff=lots
good "$c" ssdcache-mode=writeback ssdcache-writeback-seq-cutoff=0
bad ssdcache-resize-move "$c" ssdcache-resize-move=lots
good "$c" ssdcache-resize-move=0

# A cache smaller than one page: page size larger than the cache.
bad 'ssdcache-\(page-\)\?size' \
                       "ssdcache-file=$tmpdir/n4.ssdcache" ssdcache-size=64K \
                       ssdcache-page-size=128K

# The cache file must not have been created by the failed runs with
# bad geometry (or if it was, it must not be a usable cache that a
# later good run trips over).
good "ssdcache-file=$tmpdir/n3.ssdcache"

# Parameters that are good on their own are checked against an
# existing cache: a different page size needs a reset, and the error
# says so (a different size resizes it: test-ssdcache-resize.sh).
expect_ssdcache_failure "ssdcache-reset=true" \
                        file "$img" "$c" ssdcache-page-size=128K
good "$c" ssdcache-size=2M ssdcache-page-size=128K ssdcache-reset=true
good "$c"

if [ ${#problems[@]} -gt 0 ]; then
    printf '%s\n' "${problems[@]}" >&2
    fail "${#problems[@]} bad parameter case(s) mishandled (listed above)"
fi
