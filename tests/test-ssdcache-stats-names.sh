#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a client's export name cannot forge counters
# in the ssdcache-stats file (issue 27, item 11).
#
# Over a plugin that serves any name (an sh plugin that asks for it),
# a client asks for an export whose name holds a newline and counter
# lines.  Each export's counters file names its export on one line:
# in the text and Prometheus formats the name is escaped, so the file
# has exactly one line per counter; in JSON it is a string.
source "$(dirname "$0")/functions.sh"
set -e -x

requires "$PYTHON" -c 'import nbd'
requires nbdkit sh --version

truncate -s 1M "$img"
cat > "$tmpdir/plugin.sh" <<EOF
#!/usr/bin/env bash
case "\$1" in
    get_size) stat -c %s "$img" ;;
    pread) dd if="$img" skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none ;;
    open) echo "\$3" > /dev/null ;;
    *) exit 2 ;;
esac
EOF
chmod +x "$tmpdir/plugin.sh"
name=$'forged\nread_hits: 999\nbackslash\\ and \x01'

for format in text prometheus json; do
    rm -f "$tmpdir"/stats* "$tmpdir"/c*
    NAME="$name" nbdkit -U - -r --filter="$SSDCACHE_FILTER" sh "$tmpdir/plugin.sh" \
        ssdcache-file="$tmpdir/c" ssdcache-stats="$tmpdir/stats" \
        ssdcache-stats-format=$format \
        --run "$PYTHON -c '
import nbd, os, sys
h = nbd.NBD()
h.set_export_name(os.environ[\"NAME\"])
h.connect_unix(sys.argv[1])
h.pread(4096, 0)
h.shutdown()' \"\$unixsocket\""
    f="$(grep -l "forged" "$tmpdir"/stats*)"
    cat "$f"
    case $format in
        text)
            [ "$(grep -c '^read_hits:' "$f")" -eq 1 ] ||
                fail "text: the export name forged a counter line"
            grep -qxF 'export: forged\nread_hits: 999\nbackslash\\ and \x01' "$f" ||
                fail "text: the name is not escaped as expected" ;;
        prometheus)
            [ "$(grep -c '^read_hits' "$f")" -eq 0 ] ||
                fail "prometheus: the export name forged a line" ;;
        json)
            "$PYTHON" - "$f" "$name" <<'PY' || fail "json: not the name"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["export"] == sys.argv[2], d["export"]
assert d["read_ops"] >= 1
PY
            ;;
    esac
done
