#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: an export whose plugin failed once to give its
# size is served once the plugin answers again (issue 27, item 9).
#
# An sh plugin (it asks for the export name: the export is attached by
# its first connection) fails get_size while a trigger file exists, as
# a remote backend might fail for a moment.  That connection is
# refused; the next one, without the trigger, must be served: one
# failure must not disable the export until nbdkit restarts.
source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdkit sh --version
requires nbdinfo --version

random_file "$img" $((1024 * 1024))
cat > "$tmpdir/plugin.sh" <<EOF
#!/usr/bin/env bash
case "\$1" in
    open) echo "\$3" > /dev/null ;;
    get_size)
        if [ -e "$trigger" ]; then echo "EIO backend away" >&2; exit 1; fi
        stat -c %s "$img" ;;
    pread) dd if="$img" skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none ;;
    *) exit 2 ;;
esac
EOF
chmod +x "$tmpdir/plugin.sh"
start_ssdcache -P "$tmpdir/pid" -U "$tmpdir/sock" -r sh "$tmpdir/plugin.sh" \
    ssdcache-file="$tmpdir/c"
uri="nbd+unix:///disk?socket=$tmpdir/sock"
touch "$trigger"
if nbdinfo --size "$uri" 2>/dev/null; then
    fail "served although the plugin gave no size"
fi
rm "$trigger"
[ "$(nbdinfo --size "$uri")" -eq $((1024 * 1024)) ] ||
    fail "the export stayed refused after one failed get_size"
nbdcopy "$uri" "$tmpdir/copy"
cmp "$img" "$tmpdir/copy" || fail "wrong data"
stop_nbdkit "$tmpdir/pid"
