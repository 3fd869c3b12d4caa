#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter tests: the client of the backend error tests
# (backend-errors.sh-inc: run).
#
# On one connection, while the trigger file exists (the backend fails
# requests), random reads, writes, zeroes and flushes (some FUA), at
# unaligned offsets, checked against a model of the disk (ssdtest.Disk,
# per 512-byte sector):
# - every failed request fails with EIO (the errno reaches the client);
# - a successful read returns the model's data; a sector last touched
#   by a failed write or zero may hold its old value or the failed
#   request's value, nothing else, and once read it must stay as read
#   (so no stale copy can be served after another copy was);
# - --expect: the errors the client must have seen.
# Then the trigger file is removed (the errors stop), and every byte
# must read back right, twice, a FLUSH succeed, and the backing file
# equal what was read (--writeback: within 10 s of writeback).  What
# was read is saved to --save.  Exits 0 if all went well, 1 otherwise.

import argparse
import errno
import os
import random
import sys
import time

import nbd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ssdtest as T            # noqa: E402

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
        print("backend-errors.py: history: " + line, file=sys.stderr)
    print("backend-errors.py: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


h = nbd.NBD()
h.connect_uri("nbd+unix:///?socket=" + a.socket)
size = h.get_size()
with open(a.backing, "rb") as f:
    initial = f.read()
if len(initial) != size:
    fail("backing file size %d, export size %d" % (len(initial), size))
if size % T.SECTOR:
    fail("the model needs a size that is a multiple of %d" % T.SECTOR)
disk = T.Disk(initial)


def check_read(off, got, what):
    bad = disk.check_read(off, got)
    if bad:
        fail("%s: read of %d bytes at %d returned data outside the model "
             "(a failed request leaves its old or its new value, fixed "
             "once read):\n  %s" % (what, len(got), off,
                                     "\n  ".join(str(b) for b in bad)))


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
        tok = disk.flush_begin()
        try:
            h.flush()
        except nbd.Error as e:
            history.append("%d flush failed: %s" % (i, e))
            check_errno(e, "flush")
            count("flush_err")
            return
        disk.flush_end(tok)
        count("flush_ok")
        history.append("%d flush ok" % i)
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
    buf = os.urandom(n) if k == "write" else None
    w = disk.begin(k, off, n, buf, fua)
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
        disk.end(w, False)
        return
    history.append(what + " ok")
    count("write_ok")
    disk.end(w, True)


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
print("backend-errors.py: error phase:", sorted(counts.items()))

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
# Every sector was read whole: the model knows each one's value now.
if disk.alt:
    fail("model: %d sectors still uncertain after a full read" %
         len(disk.alt))
data = bytes(disk.cur)
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
print("backend-errors.py: ok")
