#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: with ssdcache-flush=backend a FLUSH ends while
# clients rewrite the same pages without pause, and the backend then
# has what was written before it (issue 27, item 8).
#
# Such a FLUSH writes every dirty page back, from the client's own
# thread; pages other requests hold are waited for one at a time
# (unit test test_wb_flush_backend_hot holds one on purpose).  Four
# connections rewrite the same eight pages with many requests in
# flight while a fifth flushes; every flush must end (60 s bound).
# (c57a799 passes this too: its polling found the pages free often
# enough here.)
source "$(dirname "$0")/functions.sh"
set -e -x

requires "$PYTHON" -c 'import nbd'
requires nbdkit --filter=delay null --version

truncate -s 4M "$img"
start_ssdcache -P "$pid" -U "$sock" --filter=delay file "$img" \
    delay-write=2ms ssdcache-file="$tmpdir/c" ssdcache-size=4M \
    ssdcache-page-size=64K ssdcache-mode=writeback ssdcache-flush=backend

bounded 300 "$PYTHON" - "$(sock_uri "$sock")" "$img" <<'PY'
import sys, threading, time
import nbd

uri, img = sys.argv[1], sys.argv[2]
stop = threading.Event()

def rewriter(k):
    h = nbd.NBD()
    h.connect_uri(uri)
    n = 0
    while not stop.is_set():
        cookies = [h.aio_pwrite(bytes([k + 1]) * 4096,
                                (i % 8) * 65536 + k * 4096)
                   for i in range(16)]
        for c in cookies:
            while not h.aio_command_completed(c):
                h.poll(-1)
        n += 1
    h.shutdown()

threads = [threading.Thread(target=rewriter, args=(k,)) for k in range(4)]
for t in threads:
    t.start()
h = nbd.NBD()
h.connect_uri(uri)
for i in range(5):
    h.pwrite(bytes([100 + i]) * 512, 60 * 65536)
    t0 = time.monotonic()
    h.flush()
    print("flush %d: %.2f s" % (i, time.monotonic() - t0), flush=True)
    with open(img, "rb") as f:
        f.seek(60 * 65536)
        assert f.read(512) == bytes([100 + i]) * 512, "flush %d" % i
stop.set()
for t in threads:
    t.join()
PY
stop_nbdkit "$pid"
