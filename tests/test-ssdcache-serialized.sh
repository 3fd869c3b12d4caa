#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: warm-up, readahead and writeback over a plugin
# that serialises requests never use one plugin context from two
# threads at once (issue 27, item 5).
#
# 1. An sh plugin of thread model serialize_requests that records any
#    call made on a handle while another call is still on it (each call
#    holds a lock of its handle for 10 ms): none may be recorded, in
#    every mode, with warm-up, readahead and writeback on the contexts
#    the filter borrows from the connections.
# 2. nbdkit's ssh plugin (thread model serialize_requests) over a sshd
#    of the test's own, with ssdcache-warm=all and adaptive readahead;
#    eight connections read at random with sequential bursts (and
#    write, in writeback), every read checked.  Two threads in one
#    libssh session lost each other's replies: a thread then sat in
#    sftp_read for ever, every client read of its range waited on it,
#    and SIGTERM did not end nbdkit.
# 3. The same over the curl plugin and a lighttpd of the test's own,
#    read-only.
# Every client run and every stop is bounded.
source "$(dirname "$0")/functions.sh"
set -e -x

requires "$PYTHON" -c 'import nbd'
requires nbdkit ssh --version
requires nbdkit sh --version
requires command -v flock
requires nbdkit curl --version

size=$((32 * 1024 * 1024))
random_file "$img" $size

cat > "$tmpdir/client.py" <<'PY'
# Eight connections: random reads, bursts of sequential ones, and in
# writeback some writes, each connection in a region of its own.
import os, random, sys, threading
import nbd

uri, img, write = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
nops = int(sys.argv[4]) if len(sys.argv) > 4 else 200
size = os.path.getsize(img)
model = bytearray(open(img, "rb").read())
region = size // 8
errors = []

def client(k):
    rnd = random.Random(k)
    h = nbd.NBD()
    h.connect_uri(uri)
    lo = k * region
    for _ in range(nops):
        if rnd.random() < 0.3:
            off = lo + rnd.randrange(0, region - 16 * 65536, 4096)
            spans = [(off + i * 65536, 65536) for i in range(16)]
        else:
            n = rnd.choice((4096, 16384, 65536))
            spans = [(lo + rnd.randrange(0, region - n, 512), n)]
        if len(spans) > 1 and rnd.random() < 0.5:
            # A pause after a burst: the warm-up reads in such gaps,
            # while readahead still reads ahead of the burst.
            threading.Event().wait(rnd.uniform(0.05, 0.2))
        for off, n in spans:
            if write and rnd.random() < 0.1:
                data = rnd.randbytes(n)
                h.pwrite(data, off)
                model[off:off + n] = data
            elif h.pread(n, off) != model[off:off + n]:
                errors.append("connection %d: wrong data at %d" % (k, off))
                return
    h.shutdown()

threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if errors:
    sys.exit("\n".join(errors))
PY

# -- 1. an sh plugin that tells two calls at once on a handle -------------

small="$tmpdir/small.img"
random_file "$small" $((16 * 1024 * 1024))
mkdir "$tmpdir/locks"
clash="$tmpdir/clash"
cat > "$tmpdir/plugin.sh" <<EOF
#!/usr/bin/env bash
# Each call on handle \$2 holds the lock of that handle; one that finds
# it taken was made while another call was on the handle.
call () {
    exec 9> "$tmpdir/locks/\$1"
    flock -n 9 || echo "\$1 \$2" >> "$clash"
    sleep 0.01
}
case "\$1" in
    thread_model) echo serialize_requests ;;
    open) echo "h\$\$" ;;
    get_size) stat -c %s "$small" ;;
    pread) call "\$2" pread
           dd if="$small" skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none ;;
    pwrite) call "\$2" pwrite
            dd of="$small" seek=\$4 oflag=seek_bytes conv=notrunc status=none ;;
    flush) call "\$2" flush ;;
    can_write|can_flush) exit 0 ;;
    *) exit 2 ;;
esac
EOF
chmod +x "$tmpdir/plugin.sh"
for mode in writethrough writeback writearound; do
    rm -f "$tmpdir/c" "$clash"
    start_ssdcache -P "$pid" -U "$sock" sh "$tmpdir/plugin.sh" \
        ssdcache-file="$tmpdir/c" ssdcache-size=8M ssdcache-mode=$mode \
        ssdcache-warm=all ssdcache-writeback-idle=50
    w=0; [ $mode = writeback ] && w=1
    bounded 300 "$PYTHON" "$tmpdir/client.py" "$(sock_uri "$sock")" \
        "$small" $w 12
    stop_nbdkit "$pid"
    if [ -s "$clash" ]; then
        cat "$clash"
        fail "$mode: calls at once on one handle of a serialising plugin"
    fi
done

# -- 2. the ssh plugin ----------------------------------------------------

start_sshd
ssh_plugin_args "$img"
for mode in writethrough writeback writearound; do
    rm -f "$tmpdir/c"
    start_ssdcache -P "$pid" -U "$sock" "${ssh_args[@]}" \
        ssdcache-file="$tmpdir/c" ssdcache-size=16M ssdcache-mode=$mode \
        ssdcache-warm=all ssdcache-stats="$tmpdir/stats"
    w=0; [ $mode = writeback ] && w=1
    bounded 300 "$PYTHON" "$tmpdir/client.py" "$(sock_uri "$sock")" "$img" $w
    # A clean stop ends every thread (the writeback at exit included).
    stop_nbdkit "$pid"
    grep -E "^(warm_bytes|prefetch_requests|read_ops):" "$tmpdir/stats"
    bounded 120 nbdkit -U - "${ssh_args[@]}" \
        --run "nbdcopy \"\$uri\" $tmpdir/after.img"
    if [ $mode != writeback ]; then
        cmp "$img" "$tmpdir/after.img" || fail "$mode: the image changed"
    fi
done

# -- 3. the curl plugin (read-only) ----------------------------------------

mkdir "$tmpdir/www"
mv "$img" "$tmpdir/www/disk.img"
img="$tmpdir/www/disk.img"
start_httpd "$tmpdir/www" disk.img
for mode in writethrough writearound; do
    rm -f "$tmpdir/c"
    start_ssdcache -P "$pid" -U "$sock" -r curl \
        url="http://127.0.0.1:$http_port/disk.img" \
        ssdcache-file="$tmpdir/c" ssdcache-size=16M ssdcache-mode=$mode \
        ssdcache-warm=all
    bounded 300 "$PYTHON" "$tmpdir/client.py" "$(sock_uri "$sock")" "$img" 0
    stop_nbdkit "$pid"
done
