#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a full scan does not flush the hot set, and
# the hot set is remembered across a restart (policy hints in entries).
#
# Run 1 reads a 4M hot set three times and stops cleanly.  Run 2 reads
# the whole 64M disk once (a backup-style scan) through an 8M cache.
# Run 3 reads the hot set again: with the scan-resistant default policy
# (S3-FIFO) it must come almost entirely from the cache; with CLOCK the
# scan has evicted it.  Backend reads are counted by nbdkit's stats
# filter below the cache.
source "$(dirname "$0")/functions.sh"
set -e -x

requires_libnbd
requires_filter stats

random_file "$tmpdir/disk.img" $((64 * 1024 * 1024))

cat > "$tmpdir/read.py" <<'PY'
import sys
import nbd
h = nbd.NBD(); h.connect_uri(sys.argv[1])
start, length, passes = (int(x) for x in sys.argv[2:5])
for _ in range(passes):
    for off in range(start, start + length, 65536):
        h.pread(65536, off)
PY

hot_start=$((16 * 1024 * 1024)) hot_len=$((4 * 1024 * 1024))

hot_backend_bytes ()        # hot_backend_bytes POLICY
{
    local c="$tmpdir/c-$1"
    rm -f "$c"
    local args=(--filter=stats
                file "$tmpdir/disk.img" ssdcache-file="$c"
                ssdcache-size=8M ssdcache-policy="$1"
                statsfile="$tmpdir/stats-$1")
    run_ssdcache "${args[@]}" \
                 --run '"$PYTHON" "$tmpdir/read.py" "$uri" '"$hot_start $hot_len"' 3'
    run_ssdcache "${args[@]}" \
                 --run 'nbdcopy "$uri" /dev/null'
    run_ssdcache "${args[@]}" \
                 --run '"$PYTHON" "$tmpdir/read.py" "$uri" '"$hot_start $hot_len"' 1'
    backend_read_bytes "$tmpdir/stats-$1"
}

s3=$(hot_backend_bytes s3fifo)
clock=$(hot_backend_bytes clock)
echo "hot pass after scan: backend read $s3 bytes (s3fifo), $clock bytes (clock)"

# S3-FIFO keeps at least 90% of the hot set through the scan.
[ "$s3" -le $((hot_len / 10)) ] ||
    fail "the scan flushed the hot set: $s3 bytes re-read from the backend"
# CLOCK loses most of it (this is what the test would catch if the
# default policy or the hint persistence broke).
[ "$clock" -ge $((hot_len / 2)) ] ||
    fail "CLOCK kept the hot set ($clock bytes re-read): the test is not testing"
