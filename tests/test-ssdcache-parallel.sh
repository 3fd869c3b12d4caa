#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: no lock is held across backend I/O.
#
# The backend is slowed down with nbdkit's delay filter (below the
# cache).  While one connection waits for a slow miss, another
# connection must be served its cache hits at once: a cache that held a
# global lock across the backend read would make it wait too.
source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdkit --filter=delay null --version
requires "$PYTHON" -c 'import nbd'

random_file "$tmpdir/disk.img" $((8 * 1024 * 1024))

cat > "$tmpdir/check.py" <<'PY'
import sys, threading, time
import nbd

uri = sys.argv[1]
a = nbd.NBD(); a.connect_uri(uri)
b = nbd.NBD(); b.connect_uri(uri)
page = 65536

# Warm page 0 (slow: goes to the backend once).
b.pread(page, 0)

# A miss on another page takes the backend delay (2 s) ...
t0 = time.monotonic()
miss = threading.Thread(target=lambda: a.pread(page, 64 * page))
miss.start()
time.sleep(0.3)
# ... while hits on the warm page must not wait for it.
t1 = time.monotonic()
for i in range(50):
    b.pread(4096, (i % 16) * 4096)
hits = time.monotonic() - t1
miss.join()
total = time.monotonic() - t0
print("50 hits took %.3f s while a 2 s miss was in flight (miss: %.3f s)"
      % (hits, total))
if total < 1.5:
    sys.exit("the miss did not go to the delayed backend (%.3f s)" % total)
if hits > 1.0:
    sys.exit("cache hits waited for the backend: %.3f s" % hits)
PY

run_ssdcache --filter=delay \
             file "$tmpdir/disk.img" delay-read=2 \
             ssdcache-file="$tmpdir/c.ssdcache" \
             --run '"$PYTHON" "$tmpdir/check.py" "$uri"'
