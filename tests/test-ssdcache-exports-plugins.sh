#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: several exports through the nbd plugin (over a
# second nbdkit) and an sh plugin with list_exports (a name with '/'
# and a tab): each export right, each with its own cache.

source "$(dirname "$0")/functions.sh"
source "$(dirname "$0")/exports.sh-inc"
set -e -x

requires_libnbd nbdcopy
requires nbdkit sh --version
requires nbdkit nbd --version

start_nbdkit -P "$tmpdir/r.pid" -U "$tmpdir/r.sock" file dir="$dir"
rm -f "$cache" "$cache".*
run_ssdcache --timeout 60 nbd socket="$tmpdir/r.sock" dynamic-export=true \
    ssdcache-file="$cache" ssdcache-size=16M \
    --run 'for e in a.img c.img; do
               nbdcopy "nbd+unix:///$e?socket=$unixsocket" "$tmpdir/$e.nbd"
           done'
cmp "$dir/a.img" "$tmpdir/a.img.nbd" || fail "nbd plugin: a.img wrong"
cmp "$dir/c.img" "$tmpdir/c.img.nbd" || fail "nbd plugin: c.img wrong"
stop_nbdkit "$tmpdir/r.pid"

# An sh plugin whose exports are "one" (a.img) and "x/y\tz" (c.img).
cat > "$tmpdir/plugin.sh" <<EOF
#!/usr/bin/env bash
f () { case "\$1" in one) echo "$dir/a.img" ;; *) echo "$dir/c.img" ;; esac; }
case "\$1" in
    list_exports) printf 'one\nx/y\tz\n' ;;
    default_export) echo one ;;
    open) echo "\$3" ;;
    get_size) stat -c %s "\$(f "\$2")" ;;
    pread) dd if="\$(f "\$2")" skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none ;;
    can_write) exit 3 ;;
    *) exit 2 ;;
esac
EOF
chmod +x "$tmpdir/plugin.sh"
rm -f "$cache" "$cache".*
run_ssdcache --timeout 60 sh "$tmpdir/plugin.sh" \
    ssdcache-file="$cache" ssdcache-size=16M \
    --run '"$PYTHON" - "$unixsocket" <<PY
import sys
from ssdtest import connect, expect_export
for name, path in (("one", "a.img"), ("x/y\tz", "c.img")):
    h = connect(sys.argv[1], name)
    expect_export(h, "'"$dir"'/" + path, name, chunk=1 << 20)
    h.shutdown()
PY'
[ "$(ls "$cache".* | wc -l)" -ge 1 ] || fail "sh plugin: no per-export cache"
