#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: live metrics.  With ssdcache-stats-interval=1
# the ssdcache-stats file is rewritten every second while a fio job
# runs: two reads more than one interval apart differ, and every read
# parses, in each of ssdcache-stats-format=json, prometheus and text
# (the file is replaced by rename, never seen half written, even read
# in a tight loop).  A failing backend shows in backend_errors.

source "$(dirname "$0")/functions.sh"
set -e -x

requires fio --version
requires nbdsh --version

truncate -s 64M "$img"

# check_json FILE / check_prom FILE / check_text FILE: parses, and
# holds the fields of the issue (hits, misses, hit ratio, bytes from
# cache and backend, dirty bytes, writeback throughput, errors,
# degraded).
check_json ()
{
    $PYTHON - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("read_hits", "read_misses", "hit_ratio", "bytes_from_cache",
          "bytes_from_backend", "dirty_bytes", "writeback_bytes_per_second",
          "backend_errors", "cache_errors", "degraded"):
    assert k in d, k
assert 0 <= d["hit_ratio"] <= 1
PY
}
check_prom ()
{
    $PYTHON - "$1" <<'PY'
import re, sys
seen = {}
types = {}
for line in open(sys.argv[1]):
    line = line.rstrip("\n")
    m = re.match(r"# TYPE (ssdcache_[a-z0-9_]+) (counter|gauge)$", line)
    if m:
        types[m.group(1)] = m.group(2)
        continue
    m = re.match(r"(ssdcache_[a-z0-9_]+) (-?[0-9.]+(e[+-]?[0-9]+)?)$", line)
    assert m, "not exposition format: %r" % line
    assert m.group(1) in types, "no TYPE for " + m.group(1)
    if types[m.group(1)] == "counter":
        assert m.group(1).endswith("_total"), m.group(1)
    seen[m.group(1)] = float(m.group(2))
for k in ("ssdcache_read_hits_total", "ssdcache_hit_ratio",
          "ssdcache_dirty_bytes", "ssdcache_degraded",
          "ssdcache_backend_errors_total"):
    assert k in seen, k
PY
}
check_text ()
{
    for c in read_hits read_misses dirty_bytes \
             writeback_bytes_per_second backend_errors degraded; do
        stat_get "$1" $c > /dev/null
    done
    grep -Eq '^hit_ratio: (0|1)\.[0-9]{4}$' "$1" ||
        fail "no hit_ratio in $1"
}

for fmt in json prometheus text; do
    stats="$tmpdir/stats.$fmt"
    rm -f "$tmpdir/cache.$fmt" "$stats"
    start_ssdcache -P "$tmpdir/pid.$fmt" -U "$tmpdir/sock.$fmt" \
                   file "$img" ssdcache-file="$tmpdir/cache.$fmt" \
                   ssdcache-size=32M ssdcache-mode=writeback \
                   ssdcache-stats="$stats" ssdcache-stats-interval=1 \
                   ssdcache-stats-format=$fmt
    # Written at start already.
    for i in $(seq 50); do [ -f "$stats" ] && break; sleep 0.1; done
    [ -f "$stats" ] || fail "$fmt: no stats file at start"
    fio --name=load --ioengine=nbd \
        --uri="nbd+unix:///?socket=$tmpdir/sock.$fmt" --rw=randrw \
        --bs=4k --iodepth=4 --size=64M --time_based --runtime=5 \
        --output=/dev/null &
    fio_pid=$!
    cp "$stats" "$tmpdir/first"
    # A tight loop of reads while the writer renames new versions in.
    for i in $(seq 30); do
        cp "$stats" "$tmpdir/snap"
        case $fmt in
            json) check_json "$tmpdir/snap" ;;
            prometheus) check_prom "$tmpdir/snap" ;;
            text) check_text "$tmpdir/snap" ;;
        esac
        sleep 0.05
    done
    # A new version comes every interval (1 s): wait for one, bounded.
    for i in $(seq 300); do
        cp "$stats" "$tmpdir/second"
        cmp -s "$tmpdir/first" "$tmpdir/second" || break
        sleep 0.1
    done
    wait $fio_pid
    cmp -s "$tmpdir/first" "$tmpdir/second" &&
        fail "$fmt: the stats file did not change in 30 s of load"
    kill "$(cat "$tmpdir/pid.$fmt")"
    for i in $(seq 100); do
        kill -0 "$(cat "$tmpdir/pid.$fmt")" 2>/dev/null || break
        sleep 0.1
    done
    ls "$tmpdir"/stats.$fmt.* 2>/dev/null &&
        fail "$fmt: a temporary stats file was left behind"
done

# The last version, at exit, counts the reads and writes of the run.
[ "$(stat_get "$tmpdir/stats.text" read_ops)" -gt 0 ] ||
    fail "no reads counted"
[ "$(stat_get "$tmpdir/stats.text" write_ops)" -gt 0 ] ||
    fail "no writes counted"

# A failing backend: nbdkit's error filter below the cache.
stats="$tmpdir/stats.err"
run_ssdcache --filter=error file "$img" error-pread-rate=1 \
             ssdcache-file="$tmpdir/cache.err" ssdcache-size=32M \
             ssdcache-stats="$stats" \
             --run 'nbdsh -u "$uri" -c "
try:
    h.pread(4096, 0)
except nbd.Error:
    pass
"' || :
[ "$(stat_get "$stats" backend_errors)" -gt 0 ] ||
    fail "a failed backend read is not in backend_errors"
