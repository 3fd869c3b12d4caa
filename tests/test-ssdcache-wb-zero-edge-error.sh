#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a writeback zero whose edge page cannot be
# completed.
#
# Writeback, cold cache, backend reads fail (nbdkit's error filter): a
# zero covering a partial page, a whole page and a partial page.  The
# whole page goes to the backend; each edge page becomes dirty zeroes
# in the cache, which needs the partly zeroed sector from the backend -
# that read fails.  The zero must then fail (EIO), or, if it succeeds,
# read back as zeroes once the errors stop.  Never: success and the old
# data.  nbdkit then exits cleanly, with no sanitizer report.

source "$(dirname "$0")/functions.sh"
set -e -x

requires nbdkit --filter=error null --version
source "$(dirname "$0")/backend-errors.sh-inc"

touch "$trigger"
rm -f "$cache"
start_ssdcache -P "$pid" -U "$sock" \
               --filter=error file "$img" error-file="$trigger" \
               error-pread=EIO error-pread-rate=100% \
               ssdcache-file="$cache" ssdcache-size=4M ssdcache-page-size=16K \
               ssdcache-mode=writeback 2> "$log"
TRIGGER="$trigger" nbdsh -u "$(sock_uri "$sock")" -c '
import errno, os
ps = 16384
off, n = 1000, 2 * ps                    # [1000, 33768): pages 0 (part), 1, 2 (part)
try:
    h.zero(n, off)
    ok = True
except nbd.Error as e:
    print("zero failed: %s" % e)
    assert e.errnum == errno.EIO, "errno %d, expected EIO" % e.errnum
    ok = False
os.unlink(os.environ["TRIGGER"])
got = h.pread(n, off)
if ok and got != bytes(n):
    bad = next(i for i in range(n) if got[i] != 0)
    raise SystemExit("FAIL: a writeback zero of [%d, %d) returned success "
                     "but byte %d is not zero (the edge page could not be "
                     "completed from the failing backend)" %
                     (off, off + n, off + bad))
' || { cat "$log"; fail "writeback zero with failing backend reads"; }
stop_nbdkit "$pid"
check_log "zero edge"
