#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: plugins that serve several exports: file dir=
# starts daemonised and with --run, lists its exports and serves each,
# with a cache file of its own that ssdcache info names.

source "$(dirname "$0")/functions.sh"
source "$(dirname "$0")/exports.sh-inc"
set -e -x

requires nbdcopy --version
requires nbdinfo --version

# Daemonised (no -f): the server forks, must survive it and serve.
sock="$tmpdir/d.sock"
nbdkit -P "$tmpdir/d.pid" -U "$sock" --filter="$SSDCACHE_FILTER" \
       file dir="$dir" ssdcache-file="$cache" ssdcache-size=16M
# nbdkit binds the socket before it forks, and the child writes the
# pidfile after the parent has exited: wait for the pid.
for i in $(seq 300); do [ -s "$tmpdir/d.pid" ] && break; sleep 0.1; done
pid="$(cat "$tmpdir/d.pid")"
[ -n "$pid" ] || fail "the daemon wrote no pidfile in 30 s"
cleanup_fn kill "$pid"
nbdinfo --list "nbd+unix:///?socket=$sock" > "$tmpdir/list"
cat "$tmpdir/list"
for e in a.img b.img c.img; do
    grep -q "export=\"$e\"" "$tmpdir/list" || fail "nbdinfo --list: no $e"
done
[ "$(nbdinfo --size "$(uri_of c.img "$sock")")" = $((8 * 1024 * 1024)) ] ||
    fail "c.img: wrong size"
nbdcopy "$(uri_of b.img "$sock")" "$tmpdir/b.copy"
cmp "$dir/b.img" "$tmpdir/b.copy" || fail "b.img read wrong (daemon)"
kill "$pid"
for i in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
! kill -0 "$pid" 2>/dev/null || fail "the daemon did not exit in 30 s"
ls -l "$tmpdir"
# file dir= has no default export: its cache file is not left behind.
[ ! -e "$cache" ] || fail "the unused default export's cache file stayed"
# nbdinfo --list opened every export: one cache file each.
[ "$(ls "$cache".* | wc -l)" -eq 3 ] ||
    fail "expected a cache file for each of the three exports"
# ssdcache info names the export of each file.
for e in a.img b.img c.img; do
    n=0
    for f in "$cache".*; do
        "$SSDCACHE_TOOL" info "$f" | grep -q "^identity: .* export=$e\$" &&
            n=$((n + 1))
    done
    [ $n -eq 1 ] || fail "ssdcache info: $n cache files for export $e"
done

# Captive (--run).  (The file plugin in dir mode has no default
# export: "" fails as it does without the filter.)
run_ssdcache --timeout 60 file dir="$dir" ssdcache-file="$cache" \
    ssdcache-size=16M \
    --run '! nbdinfo --size "$uri" &&
           nbdcopy "nbd+unix:///a.img?socket=$unixsocket" "$tmpdir/a.copy"'
cmp "$dir/a.img" "$tmpdir/a.copy" || fail "a.img read wrong (--run)"
