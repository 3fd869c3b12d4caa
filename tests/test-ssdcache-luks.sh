#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: encryption with nbdkit's luks filter.
#
# With the luks filter above ssdcache, data round-trips, a restart is
# served from the cache (nbdkit's stats filter below it counts backend
# reads), and the cache file holds neither plaintext of a known pattern
# nor the passphrase; with luks below ssdcache (the control) the cache
# does hold the plaintext, so the check can see it, but the identity
# summary in the cache file masks the passphrase given in the clear.
# The LUKS image is made with cryptsetup or qemu-img.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdsh --version
requires nbdkit --filter=stats null --version
requires nbdkit --filter=luks null --version

bstats="$tmpdir/backend.stats"
stats="$tmpdir/ssdcache.stats"

luks="$tmpdir/luks.img"
printf 'correct horse battery staple' > "$tmpdir/pw"
truncate -s 16M "$luks"
made_luks=no
if command -v cryptsetup >/dev/null &&
     cryptsetup luksFormat --batch-mode --type luks1 \
                --pbkdf-force-iterations 1000 --key-file "$tmpdir/pw" "$luks"; then
    made_luks=yes
elif command -v qemu-img >/dev/null && rm -f "$luks" &&
     qemu-img create -f luks --object secret,id=s0,file="$tmpdir/pw" \
              -o key-secret=s0,iter-time=10 "$luks" 16M; then
    made_luks=yes
fi
if [ $made_luks = no ]; then
    echo "$0: neither cryptsetup nor qemu-img can make a LUKS image"
    exit 77
fi
marker="SSDCACHE-PLAINTEXT-MARKER"
write='
m = b"'$marker'-%08d\n"
data = b"".join(m % i for i in range(1024 * 1024 // len(m % 0)))
data += bytes(1024 * 1024 - len(data))
h.pwrite(data, 4096)
h.flush()
assert h.pread(len(data), 4096) == data
'
check='
m = b"'$marker'-%08d\n"
data = b"".join(m % i for i in range(1024 * 1024 // len(m % 0)))
data += bytes(1024 * 1024 - len(data))
assert h.pread(len(data), 4096) == data, "LUKS data did not round-trip"
'
export write check
# luks (first, the outermost) above ssdcache: ciphertext cached.
lc="$tmpdir/luks-above.ssdcache"
nbdkit -U - --filter=luks --filter="$SSDCACHE_FILTER" --filter=stats \
       file "$luks" passphrase=+"$tmpdir/pw" ssdcache-file="$lc" \
       statsfile="$bstats" --run 'nbdsh -u "$uri" -c "$write"'
rm -f "$bstats"
nbdkit -U - --filter=luks --filter="$SSDCACHE_FILTER" --filter=stats \
       file "$luks" passphrase=+"$tmpdir/pw" ssdcache-file="$lc" \
       statsfile="$bstats" ssdcache-stats="$stats" \
       --run 'nbdsh -u "$uri" -c "$check"'
[ "$(stat_get "$stats" loaded_slots)" -gt 0 ] || fail "luks: the cache was not used"
b="$(backend_read_bytes "$bstats")"
[ "$b" -le $((256 * 1024)) ] || fail "luks: the restart read $b bytes from the backend: the ciphertext was not cached"
if grep -aqF "$marker" "$lc"; then
    fail "luks above ssdcache: the cache file holds plaintext"
fi
if grep -aqF "$marker" "$luks"; then
    fail "the LUKS image holds plaintext: not encrypted?"
fi
if grep -aqF "correct horse" "$lc"; then
    fail "the passphrase is in the cache file"
fi
# The control: luks below ssdcache caches plaintext, and the check
# above would have seen it.  Here ssdcache sees the passphrase
# (given in the clear this time): the identity summary in the
# cache file must mask it.
lb="$tmpdir/luks-below.ssdcache"
nbdkit -U - --filter="$SSDCACHE_FILTER" --filter=luks file "$luks" \
       passphrase="$(cat "$tmpdir/pw")" ssdcache-file="$lb" \
       --run 'nbdsh -u "$uri" -c "$check"'
grep -aqF "$marker" "$lb" ||
    fail "luks below ssdcache: no plaintext found in the cache: the check cannot see it"
if grep -aqF "correct horse" "$lb"; then
    fail "luks below ssdcache: the passphrase is in the cache file"
fi
