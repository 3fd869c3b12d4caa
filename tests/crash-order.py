#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: crash test of the flush order with the cache
# thrown away (ssdcache-writeback-order=flush).
#
# Each iteration starts nbdkit in writeback mode (ssdcache-flush=cache)
# over a file backend slowed by nbdkit's delay filter, on a small cache,
# and sends random asynchronous writes (sector aligned, 512 bytes to
# 256 KiB, none overlapping another in flight) with flushes in between.
# Every flush is issued with no write in flight, so that the export at
# flush k (F_k) is exact; V_k is every sector value written between
# flush k-1 and flush k (writes in flight at a kill included).
# Sometimes nbdkit is killed (SIGKILL) and restarted on the same cache
# (recovery) and the clients go on; then it is killed with writes in
# flight, the cache file is DELETED, and the backing file alone is
# checked: for some k, every sector must hold its value in F_k or a
# value written between flush k and flush k + 1 (what a power cut after
# flush k could leave on a real disk).  The backing file is the start
# of the next iteration.
#
# --order offset runs the same with the offset order, to show that the
# check fails there (the exit status is then 0 if some iteration found
# no flush point).
#
# Exit status: 0 all good, 1 a violation (details on stderr), 2 usage
# or environment error.  Needs the libnbd Python bindings: run with
# /usr/bin/python3.

import argparse
import array
import os
import random
import resource
import signal
import subprocess
import sys
import time
import zlib

import nbd

KiB = 1024
MiB = 1024 * KiB
SECTOR = 512


def info(msg):
    print("crash-order: " + msg, flush=True)


class Violation(Exception):
    pass


def sector_hashes(data, first=0, n=None):
    """CRC32 of every sector of data (from sector first, n of them)."""
    if n is None:
        n = len(data) // SECTOR - first
    out = array.array("I", bytes(4 * n))
    mv = memoryview(data)
    for i in range(n):
        o = (first + i) * SECTOR
        out[i] = zlib.crc32(mv[o:o + SECTOR])
    return out


class History:
    """F_k as sector hashes, and V_k: sector -> set of hashes."""

    def __init__(self, image):
        self.model = bytearray(image)
        self.cur = sector_hashes(self.model)
        self.flushes = [array.array("I", self.cur)]     # F_0
        self.vals = [{}, {}]                             # V_0 (unused), V_1
        self.changed = False

    def write(self, off, data):
        self.changed = True
        self.model[off:off + len(data)] = data
        first = off // SECTOR
        hs = sector_hashes(data)
        v = self.vals[-1]
        for i, h in enumerate(hs):
            self.cur[first + i] = h
            v.setdefault(first + i, set()).add(h)

    def flush(self):
        # (Flushes with no write between them share one image.)
        if self.changed:
            self.flushes.append(array.array("I", self.cur))
        else:
            self.flushes.append(self.flushes[-1])
        self.changed = False
        self.vals.append({})

    def restart(self, image):
        """After a restart on the same cache: the export as read back."""
        self.model = bytearray(image)
        self.cur = sector_hashes(self.model)
        self.changed = True

    def match(self, got):
        """The newest k the backing store may be at, or None."""
        for k in range(len(self.flushes) - 1, -1, -1):
            f = self.flushes[k]
            v = self.vals[k + 1] if k + 1 < len(self.vals) else {}
            if k + 1 < len(self.flushes) and f is self.flushes[k + 1] \
               and not v:
                continue                # the same flush point as k + 1
            ok = True
            for x in range(len(got)):
                h = got[x]
                if h != f[x] and h not in v.get(x, ()):
                    ok = False
                    break
            if ok:
                return k
        return None


class Server:
    def __init__(self, args, cfg):
        self.args = args
        self.cfg = cfg
        self.sock = os.path.join(args.workdir, "sock")
        self.pidfile = os.path.join(args.workdir, "nbdkit.pid")
        self.log = os.path.join(args.workdir, "nbdkit.log")
        self.proc = None

    def argv(self):
        c = self.cfg
        a = ["nbdkit", "-U", self.sock, "-P", self.pidfile, "-f",
             "--filter=" + self.args.filter, "--filter=delay",
             "file", self.args.image,
             "delay-write=%dms" % c["delay_ms"],
             "ssdcache-file=" + self.args.cache,
             "ssdcache-size=%d" % c["cache_size"],
             "ssdcache-page-size=%d" % c["page_size"],
             "ssdcache-mode=writeback", "ssdcache-flush=cache",
             "ssdcache-writeback-order=" + self.args.order,
             "ssdcache-writeback-depth=%d" % c["depth"],
             "ssdcache-writeback-high=%d" % c["high"],
             "ssdcache-writeback-low=%d" % c["low"],
             "ssdcache-writeback-idle=%d" % c["idle"],
             "ssdcache-writeback-on-exit=false"]
        if c["max_dirty"]:
            a.append("ssdcache-writeback-max-dirty=%d%%" % c["max_dirty"])
        return a

    def start(self):
        for f in (self.pidfile, self.sock):
            if os.path.exists(f):
                os.unlink(f)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while not (os.path.exists(self.pidfile) and
                   os.path.getsize(self.pidfile) > 0):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise Violation("nbdkit did not start: %s\n%s" % (
                    " ".join(self.argv()), self.log_tail()))
            time.sleep(0.01)

    def log_tail(self, n=20):
        try:
            with open(self.log, "rb") as f:
                return "\n".join(f.read().decode("utf-8", "replace")
                                 .splitlines()[-n:])
        except OSError:
            return ""

    def kill(self):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Client:
    def __init__(self, args, rng, hist, sock):
        self.args = args
        self.rng = rng
        self.hist = hist
        self.h = nbd.NBD()
        self.h.connect_unix(sock)
        self.inflight = {}              # cookie -> (off, len)
        self.writes = self.flushes = 0

    def overlaps(self, off, n):
        return any(off < o + l and o < off + n
                   for o, l in self.inflight.values())

    def reap(self, block):
        if block and self.inflight:
            self.h.poll(-1)
        for cookie in list(self.inflight):
            if self.h.aio_command_completed(cookie):
                del self.inflight[cookie]

    def issue_write(self):
        size = self.args.size
        n = self.rng.choice([1, 2, 8, 16, 64, 128, 512]) * SECTOR
        if self.rng.random() < 0.5:
            n = self.rng.randrange(1, 513) * SECTOR
        off = self.rng.randrange(0, (size - n) // SECTOR + 1) * SECTOR
        if self.rng.random() < 0.5:          # a hot region
            off = self.rng.randrange(0, min(size, 2 * MiB) // SECTOR) * SECTOR
            off = min(off, size - n)
        if self.overlaps(off, n):
            return
        data = self.rng.randbytes(n)
        # The history first: the write may reach the backend at once.
        self.hist.write(off, data)
        cookie = self.h.aio_pwrite(nbd.Buffer.from_bytearray(
            bytearray(data)), off)
        self.inflight[cookie] = (off, n)
        self.writes += 1

    def flush(self):
        while self.inflight:
            self.reap(True)
        self.hist.flush()
        self.h.flush()
        self.flushes += 1

    def run(self, seconds, flush_p):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.rng.random() < flush_p:
                self.flush()
                continue
            while len(self.inflight) >= self.args.qd:
                self.reap(True)
            self.issue_write()
            self.reap(False)

    def read_all(self):
        out = bytearray()
        for off in range(0, self.args.size, 4 * MiB):
            out += self.h.pread(min(4 * MiB, self.args.size - off), off)
        return out


def choose_cfg(rng):
    ps = rng.choice([4 * KiB, 16 * KiB, 64 * KiB])
    return {
        "page_size": ps,
        "cache_size": rng.choice([1, 2, 4, 8]) * MiB,
        "delay_ms": rng.choice([0, 1, 2]),
        "depth": rng.choice([1, 4, 8]),
        "high": rng.choice([10, 50, 90]),
        "low": 5,
        "idle": rng.choice([0, 50, 1000]),
        "max_dirty": rng.choice([0, 0, 30]),
    }


def iteration(args, rng, it):
    cfg = choose_cfg(rng)
    with open(args.image, "rb") as f:
        hist = History(f.read())
    if os.path.exists(args.cache):
        os.unlink(args.cache)
    srv = Server(args, cfg)
    srv.start()
    restarts = rng.choice([0, 0, 1, 2])
    cl = None
    clients = []
    try:
        cl = Client(args, rng, hist, srv.sock)
        clients.append(cl)
        for r in range(restarts + 1):
            cl.run(rng.uniform(0.2, args.seconds), rng.choice([0.02, 0.1]))
            srv.kill()
            if r == restarts:
                break
            # Restarted on the same cache: recovery, then more writes.
            srv.start()
            cl = Client(args, rng, hist, srv.sock)
            clients.append(cl)
            hist.restart(cl.read_all())
    finally:
        srv.kill()
    os.unlink(args.cache)               # the cache is lost for good
    with open(args.image, "rb") as f:
        got = sector_hashes(f.read())
    k = hist.match(got)
    desc = ("page %d KiB, cache %d MiB, delay %d ms, depth %d, %d restarts, "
            "%d writes, %d flushes" % (
                cfg["page_size"] // KiB, cfg["cache_size"] // MiB,
                cfg["delay_ms"], cfg["depth"], restarts, cl.writes if cl
                else 0, len(hist.flushes) - 1))
    if k is None:
        info("iteration %d: the backing file matches NO flush point (%s)"
             % (it, desc))
        return False
    if args.verbose:
        info("iteration %d: backing file at flush %d of %d (%s; %d MiB)" % (
            it, k, len(hist.flushes) - 1, desc,
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024))
    return True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", required=True)
    p.add_argument("--filter", default="ssdcache")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--size", type=int, default=8 * MiB)
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--qd", type=int, default=8)
    p.add_argument("--order", choices=["flush", "offset"], default="flush")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    os.makedirs(args.workdir, exist_ok=True)
    args.image = os.path.join(args.workdir, "back.img")
    args.cache = os.path.join(args.workdir, "cache.img")
    with open(args.image, "wb") as f:
        f.write(random.Random(seed + 1).randbytes(args.size))
    info("seed %d, %d iterations, order %s" % (seed, args.iterations,
                                                args.order))
    bad = 0
    t0 = time.monotonic()
    for it in range(1, args.iterations + 1):
        # Each iteration in a child of its own (its own random sequence):
        # nothing an iteration leaves behind (handles with writes in
        # flight at the kill) adds up.
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                ok = iteration(args, random.Random(seed * 1000003 + it), it)
                os._exit(0 if ok else 3)
            except Violation as e:
                print("crash-order: " + str(e), file=sys.stderr, flush=True)
                os._exit(1)
            except BaseException as e:
                print("crash-order: %r" % e, file=sys.stderr, flush=True)
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        if rc == 3:
            bad += 1
            if args.order == "flush":
                return 1
        elif rc != 0:
            return 1
    info("%d of %d iterations matched no flush point (%.0f s)" % (
        bad, args.iterations, time.monotonic() - t0))
    if args.order == "offset":
        return 0 if bad > 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
