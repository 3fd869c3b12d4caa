#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: crash test of the flush order with the cache
# thrown away (ssdcache-writeback-order=flush).
#
# Each iteration starts nbdkit in writeback mode (ssdcache-flush=cache)
# over a file backend slowed by nbdkit's delay filter, on a small cache
# (page size, cache size, writeback depth and watermarks, dirty cap and
# a rate of failing backend writes chosen at random),
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
# no flush point; --stop-at-first ends there).
#
# Exit status: 0 all good, 1 a violation (details on stderr), 2 usage
# or environment error.  Needs the libnbd Python bindings: run with
# /usr/bin/python3.

import argparse
import os
import random
import resource
import sys
import time

import nbd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ssdtest as T            # noqa: E402

KiB = T.KiB
MiB = T.MiB
SECTOR = T.SECTOR


def info(msg):
    print("crash-order: " + msg, flush=True)


class Violation(Exception):
    pass


class KillHistory(T.FlushHistory):
    """T.FlushHistory with what a kill -9 of nbdkit over the file plugin
    leaves, as strong as this test has always checked (what ssdtest's
    restart handling should offer as an option):

    - a write in flight at the kill may be in the backing file between
      the flush before it and the next flush only: the process is gone
      and nothing of it lands later (FlushHistory.restarted keeps it
      possible at every later flush point, as a remote backend may
      still apply it);
    - the export as read back after the restart is part of every later
      flush point, but is no write allowed between two flushes
      (FlushHistory.restarted adds it as a write completed at the
      restart, allowed until the next flush).

    It uses FlushHistory's records: [issue seq, completion seq, first
    sector, hashes]."""

    def __init__(self, disk):
        T.FlushHistory.__init__(self, disk)
        self.disk = disk
        self.readback = None    # (seq, sector -> hash): for the next flush

    def restarted(self, cur):
        # Numbers between the Disk's last one and its next (fractions:
        # its counter is not this model's to move).
        kill = self.disk.seq + 0.25
        for rec in self.byw.values():
            rec[1] = kill       # done at the kill: in V up to next flush
        self.byw = {}
        state = self.completed_state()
        now = T.sector_hashes(cur)
        self.readback = (self.disk.seq + 0.5,
                         {s: now[s] for s in range(len(now))
                          if now[s] != state[s]})

    def flushed(self, iseq, cseq):
        # The export as read back joins the flush points from here on:
        # completed before this flush, issued after every flush (so in
        # no V).
        if self.readback is not None:
            seq, diff = self.readback
            self.readback = None
            for s, h in diff.items():
                self.writes.append([float("inf"), seq, s, [{h}]])
        T.FlushHistory.flushed(self, iseq, cseq)


def server_args(args, cfg):
    """nbdkit's arguments after the ones ssdtest.Nbdkit adds."""
    c = cfg
    below = ["--filter=error"] if c["errors"] else []
    a = ["--filter=" + args.filter] + below + ["--filter=delay",
         "file", args.image,
         "delay-write=%dms" % c["delay_ms"],
         "ssdcache-file=" + args.cache,
         "ssdcache-size=%d" % c["cache_size"],
         "ssdcache-page-size=%d" % c["page_size"],
         "ssdcache-mode=writeback", "ssdcache-flush=cache",
         "ssdcache-writeback-order=" + args.order,
         "ssdcache-writeback-on-exit=false"] + T.writeback_args(c)
    if c["errors"]:
        # Backend writes fail now and then (writeback's, and those of
        # writes that go around the cache); not reads, so that the
        # recovered export can always be read back, and not flushes:
        # nbdkit 1.32's error filter cannot fail them.
        a += ["error=EIO", "error-pwrite-rate=%d%%" % c["errors"]]
    return a


def start(srv):
    try:
        srv.start(timeout=60)
    except (T.StartError, T.Hang) as e:
        raise Violation("nbdkit did not start: %s" % e)


class Client:
    def __init__(self, args, rng, disk, srv):
        self.args = args
        self.rng = rng
        self.disk = disk
        self.h = srv.connect()
        self.inflight = {}              # cookie -> (off, len, Write)
        self.writes = self.flushes = self.failed = 0

    def overlaps(self, off, n):
        return any(off < o + l and o < off + n
                   for o, l, _ in self.inflight.values())

    def reap(self, block):
        if block and self.inflight:
            self.h.poll(-1)
        for cookie in list(self.inflight):
            try:
                done, ok = self.h.aio_command_completed(cookie), True
            except nbd.Error:
                done, ok = True, False  # (a backend error, --errors)
            if done:
                self.disk.end(self.inflight.pop(cookie)[2], ok)
                self.failed += not ok

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
        # The model first: the write may reach the backend at once.
        w = self.disk.begin("write", off, n, data)
        cookie = self.h.aio_pwrite(nbd.Buffer.from_bytearray(
            bytearray(data)), off)
        self.inflight[cookie] = (off, n, w)
        self.writes += 1

    def flush(self):
        while self.inflight:
            self.reap(True)
        tok = self.disk.flush_begin()
        try:
            self.h.flush()
        except nbd.Error:
            self.failed += 1            # no flush point
            return
        self.disk.flush_end(tok)
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
        return T.read_all(self.h, self.args.size)


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
        "errors": rng.choice([0, 0, 2, 10]),   # % of backend writes fail
    }


def iteration(args, rng, it):
    cfg = choose_cfg(rng)
    with open(args.image, "rb") as f:
        disk = T.Disk(f.read())
    disk.history = KillHistory(disk)    # (Disk.track_order, with it)
    if os.path.exists(args.cache):
        os.unlink(args.cache)
    srv = T.Nbdkit(server_args(args, cfg), args.workdir,
                   debug=T.epoch_span_debug(args.epoch_span))
    start(srv)
    restarts = rng.choice([0, 0, 1, 2])
    cl = None
    clients = []
    try:
        cl = Client(args, rng, disk, srv)
        clients.append(cl)
        for r in range(restarts + 1):
            cl.run(rng.uniform(0.2, args.seconds), rng.choice([0.02, 0.1]))
            srv.kill()
            if r == restarts:
                break
            # Restarted on the same cache: recovery, then more writes.
            start(srv)
            cl = Client(args, rng, disk, srv)
            clients.append(cl)
            disk.rebase(cl.read_all())
    finally:
        srv.kill()
    os.unlink(args.cache)               # the cache is lost for good
    with open(args.image, "rb") as f:
        got = f.read()
    k, _ = disk.check_order(got)
    desc = ("page %d KiB, cache %d MiB, delay %d ms, depth %d, backend "
            "errors %d%%, %d restarts, %d writes, %d failed requests, %d "
            "flushes" % (
                cfg["page_size"] // KiB, cfg["cache_size"] // MiB,
                cfg["delay_ms"], cfg["depth"], cfg["errors"], restarts,
                sum(x.writes for x in clients),
                sum(x.failed for x in clients), len(disk.history.flushes)))
    if k is None:
        info("iteration %d: the backing file matches NO flush point (%s)"
             % (it, desc))
        return False
    if args.verbose:
        info("iteration %d: backing file at flush %d of %d (%s; %d MiB)" % (
            it, k, len(disk.history.flushes), desc,
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
    p.add_argument("--stop-at-first", action="store_true",
                   help="end at the first iteration that matches no "
                   "flush point (a self-test of the checker)")
    T.add_epoch_span_option(p)
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
            if args.stop_at_first:
                args.iterations = it
                break
        elif rc != 0:
            return 1
    info("%d of %d iterations matched no flush point (%.0f s)" % (
        bad, args.iterations, time.monotonic() - t0))
    if args.order == "offset":
        return 0 if bad > 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
