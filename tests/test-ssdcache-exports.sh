#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: plugins that serve several exports.
#
#  1. file dir= starts (daemonised and with --run), lists its exports
#     and serves each, with a cache of its own.
#  2. Model-checked random I/O over three exports of two sizes at once
#     through one nbdkit (two connections each), in every mode; at exit
#     each backing file holds what its model says.
#  3. A restart is warm for every export (stats filter below the cache).
#  4. One budget: a busy export takes the clean slots of an idle one and
#     hits as often as with a cache of its own of that size.
#  5. The nbd plugin over a second nbdkit with two exports, and an sh
#     plugin with list_exports: each export right.
#  6. Bad input: an export the plugin lacks gets the plugin's error; a
#     name with '/' and odd bytes works (sh); one export whose size
#     changed is refused, the others are served.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdcopy --version
requires nbdinfo --version
requires nbdkit --filter=stats null --version
requires nbdkit sh --version
requires nbdkit nbd --version
requires "$PYTHON" -c 'import nbd'

dir="$tmpdir/images"
mkdir "$dir"
random_file "$dir/a.img" $((4 * 1024 * 1024))
random_file "$dir/b.img" $((4 * 1024 * 1024))
random_file "$dir/c.img" $((8 * 1024 * 1024))
cache="$tmpdir/cache"
uri_of () { echo "nbd+unix:///$1?socket=$2"; }

# -- 1. start-up --------------------------------------------------------

# Daemonised (no -f): the server forks, must survive it and serve.
sock="$tmpdir/d.sock"
nbdkit -P "$tmpdir/d.pid" -U "$sock" --filter="$SSDCACHE_FILTER" \
       file dir="$dir" ssdcache-file="$cache" ssdcache-size=16M
for i in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
pid="$(cat "$tmpdir/d.pid")"
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
for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
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

# -- 2. model-checked random I/O over three exports ---------------------

models ()
{
    local m="$1" sock="$2" seed="$3" e pids=()
    for e in a b c; do
        "$PYTHON" "$random_io" --uri "$(uri_of $e.img "$sock")" \
            --connections 2 --ops 1500 --seed $((seed + ${#pids[@]})) \
            --model "$tmpdir/$e.start" --save-model "$tmpdir/$e.model" \
            --max-len 128K --flush-at-end \
            --mix read=55,write=35,zero=5,flush=3,cache=2 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do
        wait "$p" || fail "random I/O mismatch ($m)"
    done
}

for mode in writethrough writeback writearound; do
    rm -f "$cache" "$cache".*
    start_ssdcache -P "$tmpdir/m.pid" -U "$tmpdir/m.sock" \
        file dir="$dir" ssdcache-file="$cache" ssdcache-size=8M \
        ssdcache-page-size=16K ssdcache-mode=$mode
    # The models start from the backing files; copy them first.
    for e in a b c; do cp "$dir/$e.img" "$tmpdir/$e.start"; done
    models $mode "$tmpdir/m.sock" 7
    stop_nbdkit "$tmpdir/m.pid"
    for e in a b c; do
        cmp "$tmpdir/$e.model" "$dir/$e.img" ||
            fail "$mode: $e.img differs from its model after exit"
    done
done

# -- 3. warm restart for every export -----------------------------------

rm -f "$cache" "$cache".*
read_all ()
{
    local e="$1" bstats="$tmpdir/bstats"
    rm -f "$bstats"
    run_ssdcache --filter=stats file dir="$dir" statsfile="$bstats" \
        ssdcache-file="$cache" ssdcache-size=32M \
        --run "nbdcopy --no-extents \"nbd+unix:///$e?socket=\$unixsocket\" \
               \"$tmpdir/copy\""
    cmp "$dir/$e" "$tmpdir/copy" || fail "$e read wrong"
    backend_read_bytes "$bstats"
}
for e in a.img b.img c.img; do read_all $e > /dev/null; done
for e in a.img b.img c.img; do
    size="$(stat -c %s "$dir/$e")"
    b="$(read_all $e)"
    [ "$b" -le $((size / 100)) ] ||
        fail "$e: the warm read took $b bytes from the backend"
done

# -- 4. one budget, shared ----------------------------------------------

# c.img (8M) is read first and fills the whole 4M budget, then idles
# (its client stays connected, so its cache stays open); a.img (4M) is
# then read twice.  Its second read must hit as often as with a 4M
# cache of its own.  (An export whose last client left is parked
# instead: test-ssdcache-exports-limit.sh.)
hits_of_a ()
{
    local stats="$1"
    f="$(grep -l '^export: a.img$' "$stats".*)"
    stat_get "$f" read_hits
}
rm -f "$cache" "$cache".* "$tmpdir/st".*
start_ssdcache -P "$tmpdir/s.pid" -U "$tmpdir/s.sock" file dir="$dir" \
    ssdcache-file="$cache" ssdcache-size=4M ssdcache-readahead=off \
    ssdcache-stats="$tmpdir/st" -D ssdcache.exports=1
mkfifo "$tmpdir/c-read" "$tmpdir/c-end"
READ="$tmpdir/c-read" END="$tmpdir/c-end" \
nbdsh -u "$(uri_of c.img "$tmpdir/s.sock")" -c '
import os
for off in range(0, h.get_size(), 1 << 20):
    h.pread(1 << 20, off)
open(os.environ["READ"], "w").write("read\n")
open(os.environ["END"]).read()
' &
holder=$!
cleanup_fn kill $holder
read -r _ < "$tmpdir/c-read"
sleep 1.5                       # c.img idle (EXPORTS_IDLE_MS)
nbdcopy --no-extents "$(uri_of a.img "$tmpdir/s.sock")" "$tmpdir/copy"
nbdcopy --no-extents "$(uri_of a.img "$tmpdir/s.sock")" "$tmpdir/copy"
cmp "$dir/a.img" "$tmpdir/copy" || fail "a.img read wrong (budget)"
echo > "$tmpdir/c-end"
wait $holder
stop_nbdkit "$tmpdir/s.pid"
shared="$(hits_of_a "$tmpdir/st")"
cfile="$(grep -l '^export: c.img$' "$tmpdir/st".*)"
[ "$(stat_get "$cfile" slots_given)" -gt 0 ] ||
    fail "the idle export gave no slot to the busy one"
# Space on disk stays within the budget, plus each file's superblocks
# and entries (its first MiB).
used=$(( $(du -B1 -c "$cache".* | tail -1 | cut -f1) ))
nfiles=$(ls "$cache".* | wc -l)
[ "$used" -le $(( (4 + nfiles) * 1024 * 1024)) ] ||
    fail "the per-export cache files take $used bytes for a 4M budget"

rm -f "$cache" "$cache".* "$tmpdir/st".*
start_ssdcache -P "$tmpdir/s.pid" -U "$tmpdir/s.sock" file dir="$dir" \
    ssdcache-file="$cache" ssdcache-size=4M ssdcache-readahead=off \
    ssdcache-stats="$tmpdir/st"
nbdcopy --no-extents "$(uri_of a.img "$tmpdir/s.sock")" "$tmpdir/copy"
nbdcopy --no-extents "$(uri_of a.img "$tmpdir/s.sock")" "$tmpdir/copy"
stop_nbdkit "$tmpdir/s.pid"
alone="$(hits_of_a "$tmpdir/st")"
echo "a.img hits: $shared shared, $alone alone"
[ "$shared" -ge "$alone" ] ||
    fail "a.img hit $shared times with a shared budget, $alone alone"

# -- 5. nbd and sh plugins ----------------------------------------------

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
import nbd, sys
for name, path in (("one", "a.img"), ("x/y\tz", "c.img")):
    h = nbd.NBD()
    h.set_export_name(name)
    h.connect_unix(sys.argv[1])
    want = open("'"$dir"'/" + path, "rb").read()
    got = b"".join(h.pread(1 << 20, o) for o in range(0, h.get_size(), 1 << 20))
    assert got == want, name
    h.shutdown()
PY'
[ "$(ls "$cache".* | wc -l)" -ge 1 ] || fail "sh plugin: no per-export cache"

# -- 6. bad input -------------------------------------------------------

rm -f "$cache" "$cache".*
start_ssdcache -P "$tmpdir/b.pid" -U "$tmpdir/b.sock" file dir="$dir" \
    ssdcache-file="$cache" ssdcache-size=16M
if nbdinfo "$(uri_of nope.img "$tmpdir/b.sock")" 2> "$tmpdir/err"
then
    fail "an export that does not exist was served"
fi
cat "$tmpdir/err"
# The file plugin's own error (open: No such file or directory).
# (Not nbdinfo --size: libnbd 1.22's prints no server error there.)
grep -q "No such file or directory" "$tmpdir/err" ||
    fail "the client did not get the plugin's error for a missing export"
nbdcopy "$(uri_of a.img "$tmpdir/b.sock")" "$tmpdir/copy"
nbdcopy "$(uri_of b.img "$tmpdir/b.sock")" "$tmpdir/copy"
stop_nbdkit "$tmpdir/b.pid"

# b.img grows: its cache is refused, a.img is still served (warm).
truncate -s 6M "$dir/b.img"
start_ssdcache -P "$tmpdir/b.pid" -U "$tmpdir/b.sock" file dir="$dir" \
    ssdcache-file="$cache" ssdcache-size=16M
if nbdinfo --size "$(uri_of b.img "$tmpdir/b.sock")" 2> "$tmpdir/err"; then
    fail "b.img served although its size changed"
fi
nbdcopy "$(uri_of a.img "$tmpdir/b.sock")" "$tmpdir/copy"
cmp "$dir/a.img" "$tmpdir/copy" || fail "a.img wrong after b.img changed"
stop_nbdkit "$tmpdir/b.pid"
# ... and reset on request.
run_ssdcache --timeout 60 file dir="$dir" ssdcache-file="$cache" \
    ssdcache-size=16M ssdcache-reset=true \
    --run 'nbdcopy "nbd+unix:///b.img?socket=$unixsocket" "$tmpdir/copy"'
cmp "$dir/b.img" "$tmpdir/copy" || fail "b.img wrong after a reset"
