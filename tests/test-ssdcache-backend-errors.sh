#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: backend errors in every mode.
#
# Part 1: nbdkit's error filter below ssdcache (over the file plugin)
# fails backend reads, writes/zeroes, or every request, at 10 %, 50 %
# and 100 %, in writethrough, writearound, writeback with
# ssdcache-flush=cache and with ssdcache-flush=backend.
# Part 2: backend FLUSH errors.  nbdkit 1.32's error filter cannot fail
# flushes, so the backend is nbdkit's eval plugin serving a file with
# dd, whose flush fails while a trigger file exists.
#
# In every run a Python client does random reads, writes, zeroes and
# flushes (some FUA) on one connection while the errors are on, with a
# model of the disk:
# - every failed request fails with EIO (the errno reaches the client);
# - a successful read returns the model's data; a byte last touched by
#   a failed write or zero may hold its old value or the failed
#   request's value, nothing else, and once read it must stay as read
#   (so no stale copy can be served after another copy was);
# - the runs where errors are certain must show them to the client
#   (or, in writeback, in writeback_errors);
# then the errors stop (the trigger file is removed) and
# - every byte reads back right (as above), a FLUSH succeeds;
# - in writeback the dirty data is written back by the background
#   thread (the backing file equals the export within 10 s);
# - nbdkit exits cleanly (SIGTERM, status 0, no sanitizer report),
#   the backing file equals what the client read, no dirty data is left
#   or lost, and a restart on the same cache reads exactly the file.

source "$(dirname "$0")/functions.sh"
set -e -x

requires "$PYTHON" -c 'import nbd'
requires nbdcopy --version
requires nbdkit --filter=error null --version
requires nbdkit eval --version
requires dd --version

img="$tmpdir/disk.img"
cache="$tmpdir/disk.ssdcache"
sock="$tmpdir/sock"
pid="$tmpdir/nbdkit.pid"
trigger="$tmpdir/trigger"
log="$tmpdir/nbdkit.log"
stats="$tmpdir/stats"
size=$((4 * 1024 * 1024))
random_file "$img" $size
seed="${RANDOM_IO_SEED:-$RANDOM}"
echo "seed: $seed"

cat > "$tmpdir/drive.py" <<'EOF'
import argparse, errno, os, random, sys, time
import nbd

p = argparse.ArgumentParser()
p.add_argument("--socket", required=True)
p.add_argument("--backing", required=True)
p.add_argument("--trigger", required=True)
p.add_argument("--ops", type=int, default=300)
p.add_argument("--seed", type=int, required=True)
p.add_argument("--mix", default="read=45,write=35,zero=8,flush=12")
p.add_argument("--fua-prob", type=float, default=0.1)
p.add_argument("--max-len", type=int, default=65536)
p.add_argument("--save", required=True, help="final contents read")
# What the error phase must show (checked after it):
p.add_argument("--expect", default="",
               help="comma list: read-errors, write-errors, any-errors, "
               "all-writes-fail, all-flushes-fail, backing-unchanged")
p.add_argument("--linger", type=float, default=0,
               help="seconds to wait, errors still on, after the ops "
               "(lets background writeback run into the errors)")
p.add_argument("--writeback", action="store_true",
               help="after the errors stop, wait for the backing file "
               "to catch up")
a = p.parse_args()
rng = random.Random(a.seed)

history = []                     # the last requests, shown on failure

def fail(msg):
    for line in history[-40:]:
        print("drive.py: history: " + line, file=sys.stderr)
    print("drive.py: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)

h = nbd.NBD()
h.connect_uri("nbd+unix:///?socket=" + a.socket)
size = h.get_size()
with open(a.backing, "rb") as f:
    initial = f.read()
if len(initial) != size:
    fail("backing file size %d, export size %d" % (len(initial), size))

# The model: data holds the value of every known byte, and for a byte
# marked unknown one candidate (its value before the failed requests);
# alts holds the other candidates: (offset, bytes) of failed writes and
# zeroes, cut back whenever a byte becomes known again.
data = bytearray(initial)
unknown = bytearray(size)
alts = []

def cut_alts(off, n):
    global alts
    out = []
    for (o, b) in alts:
        e = o + len(b)
        if e <= off or o >= off + n:
            out.append((o, b))
            continue
        if o < off:
            out.append((o, b[:off - o]))
        if e > off + n:
            out.append((off + n, b[off + n - o:]))
    alts = out

def set_known(off, buf):
    data[off:off + len(buf)] = buf
    unknown[off:off + len(buf)] = bytes(len(buf))
    cut_alts(off, len(buf))

def set_unknown(off, buf):
    unknown[off:off + len(buf)] = b"\x01" * len(buf)
    alts.append((off, bytes(buf)))

def seg_ok(off, got):
    """Does got (read at off, all bytes unknown) match, byte by byte,
    one of the candidates?"""
    n = len(got)
    cands = [memoryview(data)[off:off + n]]
    for (o, b) in alts:
        if o <= off and o + len(b) >= off + n:
            cands.append(memoryview(b)[off - o:off - o + n])
    if any(got == c for c in cands):
        return True
    if n > 64:
        half = n // 2
        return seg_ok(off, got[:half]) and seg_ok(off + half, got[half:])
    for i in range(n):
        x = off + i
        if got[i] == data[x]:
            continue
        if not any(o <= x < o + len(b) and b[x - o] == got[i]
                   for (o, b) in alts):
            return False
    return True

def check_read(off, got, what):
    n = len(got)
    mask = unknown[off:off + n]
    pos = 0
    while pos < n:
        u = mask[pos] == 1
        end = mask.find(b"\x00" if u else b"\x01", pos)
        if end < 0:
            end = n
        seg = got[pos:end]
        if u:
            if not seg_ok(off + pos, seg):
                fail("%s: bytes %d-%d hold neither their old value nor "
                     "the value of a failed request" %
                     (what, off + pos, off + end - 1))
        elif seg != data[off + pos:off + end]:
            for i in range(pos, end):
                if got[i] != data[off + i]:
                    break
            fail("%s: wrong data at byte %d: expected 0x%02x, got 0x%02x "
                 "(read %d bytes at %d)" %
                 (what, off + i, data[off + i], got[i], n, off))
        pos = end
    set_known(off, got)          # what was read must stay so

counts = {}
def count(k):
    counts[k] = counts.get(k, 0) + 1

def check_errno(e, what):
    if e.errnum != errno.EIO:
        fail("%s failed with errno %s (%s), expected EIO" %
             (what, e.errnum, e))

kinds, weights = [], []
for item in a.mix.split(","):
    k, _, w = item.partition("=")
    kinds.append(k)
    weights.append(float(w))

def rand_range():
    n = rng.randint(1, a.max_len)
    if rng.random() < 0.3:
        n = max(4096, n // 4096 * 4096)
    off = rng.randrange(0, size - n + 1)
    if rng.random() < 0.3:
        off = off // 4096 * 4096
    return off, n

def do_op(i):
    k = rng.choices(kinds, weights)[0]
    if k == "flush":
        try:
            h.flush()
            count("flush_ok")
            history.append("%d flush ok" % i)
        except nbd.Error as e:
            history.append("%d flush failed: %s" % (i, e))
            check_errno(e, "flush")
            count("flush_err")
        return
    off, n = rand_range()
    what = "%d %s [%d, %d) (%d bytes)" % (i, k, off, off + n, n)
    if k == "read":
        try:
            got = h.pread(n, off)
        except nbd.Error as e:
            history.append(what + " failed: %s" % e)
            check_errno(e, "read")
            count("read_err")
            return
        history.append(what + " ok")
        count("read_ok")
        check_read(off, got, "op %d read" % i)
        return
    fua = rng.random() < a.fua_prob
    flags = nbd.CMD_FLAG_FUA if fua else 0
    what += " fua" if fua else ""
    buf = os.urandom(n) if k == "write" else bytes(n)
    try:
        if k == "write":
            h.pwrite(buf, off, flags)
        else:
            h.zero(n, off, flags)
    except nbd.Error as e:
        history.append(what + " failed: %s" % e)
        check_errno(e, k)
        count("write_err")
        if fua:
            count("fua_err")
        set_unknown(off, buf)
        return
    history.append(what + " ok")
    count("write_ok")
    set_known(off, buf)

# -- the error phase --------------------------------------------------------
if not os.path.exists(a.trigger):
    fail("the trigger file does not exist at the start")
for i in range(a.ops):
    do_op(i)
if a.linger:
    time.sleep(a.linger)
with open(a.backing, "rb") as f:
    backing_now = f.read()
os.unlink(a.trigger)
print("drive.py: error phase:", sorted(counts.items()))

exp = set(x for x in a.expect.split(",") if x)
errs = counts.get("read_err", 0) + counts.get("write_err", 0) + \
    counts.get("flush_err", 0)
if "read-errors" in exp and not counts.get("read_err"):
    fail("no read failed although backend reads failed")
if "write-errors" in exp and not counts.get("write_err"):
    fail("no write failed although backend writes failed")
if "any-errors" in exp and errs == 0:
    fail("no request failed although backend requests failed")
if "all-writes-fail" in exp and counts.get("write_ok"):
    fail("%d writes succeeded although every backend write failed" %
         counts["write_ok"])
if "all-flushes-fail" in exp:
    if counts.get("flush_ok"):
        fail("%d flushes succeeded although the backend could not flush" %
             counts["flush_ok"])
    if not counts.get("flush_err"):
        fail("no flush was issued")
if "backing-unchanged" in exp and backing_now != initial:
    fail("the backing file changed although every backend request failed")

# -- the errors are gone ------------------------------------------------------
chunk = 256 * 1024
for off in range(0, size, chunk):
    check_read(off, h.pread(min(chunk, size - off), off), "final read")
# Read twice: the first read may fill the cache, the second must agree.
for off in range(0, size, chunk):
    check_read(off, h.pread(min(chunk, size - off), off), "second final read")
h.flush()
if a.writeback:
    for t in range(100):
        with open(a.backing, "rb") as f:
            if f.read() == data:
                break
        time.sleep(0.1)
with open(a.backing, "rb") as f:
    backing_now = f.read()
if backing_now != data:
    first = next(i for i in range(size) if backing_now[i] != data[i])
    fail("after the errors stopped (and a FLUSH%s) the backing file differs "
         "from what the client reads, first at byte %d" %
         (", and 10 s of writeback" if a.writeback else "", first))
with open(a.save, "wb") as f:
    f.write(data)
h.shutdown()
print("drive.py: ok")
EOF

# check_log: no crash report in the log.
check_log ()
{
    if grep -Eq 'AddressSanitizer|LeakSanitizer|runtime error:|Segmentation|Aborted' "$log"; then
        cat "$log"
        fail "$1: sanitizer or crash report in the nbdkit log"
    fi
}

# run LABEL MODE FLUSH EXPECT EXTRA-DRIVER-ARGS -- BACKEND-ARGS...
run=0
run ()
{
    local label="$1" mode="$2" flush="$3" expect="$4" dargs="$5" wb= linger=0
    local t0=$SECONDS t1
    shift 6
    run=$((run + 1))
    [ "$mode" = writeback ] && { wb=--writeback; linger=1.5; }
    # Each run starts cold (every miss goes to the backend): the last
    # run ended with a clean exit, nothing is dirty.
    rm -f "$cache" "$stats"
    touch "$trigger"
    local size_opt=ssdcache-size=2M
    [ "$mode" = writeback ] && size_opt=ssdcache-size=4M
    start_ssdcache -P "$pid" -U "$sock" "$@" \
                   ssdcache-file="$cache" "$size_opt" ssdcache-page-size=16K \
                   ssdcache-mode="$mode" ssdcache-flush="$flush" \
                   ssdcache-writeback-idle=100 ssdcache-stats="$stats" \
                   2> "$log"
    "$PYTHON" "$tmpdir/drive.py" --socket "$sock" --backing "$img" \
              --trigger "$trigger" --seed $((seed + run)) \
              --save "$tmpdir/expected.img" --expect "$expect" \
              --linger "$linger" $wb $dargs ||
        { cat "$log"; fail "$label: $mode flush=$flush: client check failed"; }
    stop_nbdkit "$pid"
    check_log "$label"
    cat "$stats"
    cmp "$img" "$tmpdir/expected.img" ||
        fail "$label: $mode: after a clean exit the backing file differs"
    [ "$(stat_get "$stats" dirty_pages)" -eq 0 ] ||
        fail "$label: $mode: dirty pages left after a clean exit"
    [ "$(stat_get "$stats" dirty_lost)" -eq 0 ] ||
        fail "$label: $mode: dirty_lost is not 0"
    if [ "$mode" = writeback ] && [[ "$label" == *100%* ]]; then
        [ "$(stat_get "$stats" writeback_errors)" -gt 0 ] ||
            fail "$label: writeback: writeback_errors is 0 although the backend failed"
    fi
    t1=$SECONDS
    # A restart on the same cache (warm) reads exactly the file.
    run_ssdcache "$@" ssdcache-file="$cache" \
                 ssdcache-mode="$mode" \
                 --run 'nbdcopy --no-extents "$uri" "$tmpdir/copy.img"' 2> "$log" ||
        { cat "$log"; fail "$label: $mode: restart on the cache failed"; }
    check_log "$label restart"
    cmp "$img" "$tmpdir/copy.img" ||
        fail "$label: $mode: a restart on the cache reads other data than the file"
    echo "run $run ($label, $mode flush=$flush): $((t1 - t0)) s + restart $((SECONDS - t1)) s"
}

start_s=$SECONDS

# -- part 0: a zero whose edge page cannot be completed ----------------------

# Writeback, cold cache, backend reads fail: a zero covering a partial
# page, a whole page and a partial page.  The whole page goes to the
# backend; each edge page becomes dirty zeroes in the cache, which
# needs the partly zeroed sector from the backend - that read fails.
# The zero must then fail (EIO), or, if it succeeds, read back as
# zeroes once the errors stop.  Never: success and the old data.
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

# -- part 1: error filter ----------------------------------------------------

errf=( --filter=error file "$img" error-file="$trigger" )
for m in writethrough:cache writearound:cache writeback:cache writeback:backend; do
    mode="${m%:*}" flush="${m#*:}"
    dargs=
    case "$mode:$flush" in
        writeback:backend)
            all_fail= wr=any-errors
            # A FLUSH that fails here waits for the writeback retry
            # (about 1 s): fewer flushes, to keep the test short.
            dargs="--ops 100 --mix read=45,write=40,zero=12,flush=3 --fua-prob 0.02" ;;
        writeback:*)       all_fail= wr= ;;
        *)                 all_fail=all-writes-fail, wr=write-errors ;;
    esac
    # (writeback: a write completes in the cache, so backend write
    # errors do not fail client writes, except with flush=backend where
    # FLUSH and FUA writes write back first.  The error filter cannot
    # fail FLUSH itself: part 2 does.)
    run "all requests 10%" "$mode" "$flush" any-errors "$dargs" -- \
        "${errf[@]}" error=EIO error-rate=10%
    run "reads 50%" "$mode" "$flush" read-errors "$dargs" -- \
        "${errf[@]}" error-pread=EIO error-pread-rate=50%
    run "writes 50%" "$mode" "$flush" "$wr" "$dargs" -- \
        "${errf[@]}" error-pwrite=EIO error-pwrite-rate=50% \
        error-zero=EIO error-zero-rate=50% error-trim=EIO error-trim-rate=50%
    run "all requests 100%" "$mode" "$flush" \
        "${all_fail}read-errors,backing-unchanged" "--ops 150 $dargs" -- \
        "${errf[@]}" error=EIO error-rate=100%
done
echo "part 1: $((SECONDS - start_s)) s"

# -- part 2: backend flush errors (eval plugin) --------------------------------

evalb=( eval
        get_size="stat -c %s '$img'"
        pread="dd if='$img' bs=64K skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none"
        pwrite="dd of='$img' bs=64K seek=\$4 oflag=seek_bytes iflag=fullblock conv=notrunc status=none"
        can_write='exit 0'
        can_flush='exit 0'
        flush="if [ -e '$trigger' ]; then echo 'EIO injected flush error' >&2; exit 1; fi" )
# (no zero: nbdkit turns zeroes into writes)
for m in writethrough:cache writearound:cache writeback:cache writeback:backend; do
    mode="${m%:*}" flush="${m#*:}"
    dargs="--ops 120 --max-len 32768 --fua-prob 0.2"
    case "$mode:$flush" in
        writeback:cache)   exp= ;;
        writeback:backend) exp=all-flushes-fail
                           dargs="--ops 60 --max-len 32768 --fua-prob 0.05 --mix read=45,write=45,flush=10" ;;
        *)                 exp=all-flushes-fail ;;
    esac
    run "flush 100%" "$mode" "$flush" "$exp" "$dargs" -- "${evalb[@]}"
    if [ "$mode" = writeback ]; then
        # Flush failures hold writeback back too.
        [ "$(stat_get "$stats" writeback_errors)" -gt 0 ] ||
            fail "flush errors: $mode flush=$flush: writeback_errors is 0"
    fi
done
echo "total: $((SECONDS - start_s)) s"
