#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: crash test of writeback mode (kill -9).
#
# Each iteration starts nbdkit with ssdcache-mode=writeback over a file
# backend on a small cache (so eviction and writeback run all the
# time), opens two connections and sends batches of random
# asynchronous writes (unaligned offsets and lengths, 1 KiB writes,
# multi-page writes) with flushes and FUA writes in between.  What was
# durable is tracked by ssdtest.Disk, per 512-byte sector:
#
#   D  the data the export must have kept: the data every completed
#      write had when the last completed FLUSH was issued, plus that of
#      every completed FUA write;
#   W  the value after each write completed since, and the value of
#      each write in flight.
#
# nbdkit is then killed with SIGKILL at a random moment with writes in
# flight, restarted on the same cache file, and the whole export is
# read back (Disk.check_after_crash): every sector must hold its value
# in D or in W; a sector of a write in flight at the kill, or one that
# two writes in flight shared (bytes apart), may mix them byte by byte.
# Reads during the run must return the completed writes
# (Disk.check_read).  The data read back is the starting point of the
# next iteration.  Per iteration the flush semantics
# (ssdcache-flush=cache|backend), page size, cache size, watermarks
# and idle time are chosen at random; sometimes the server restarts in
# writethrough or writearound mode (which must write all dirty data
# back before serving), and sometimes it is stopped cleanly with or
# without ssdcache-writeback-on-exit.  At the end nbdkit is stopped
# cleanly (SIGTERM, writeback-on-exit=true) and the backing file must
# equal the final model.
#
# With --mode writethrough every server runs in writethrough mode
# (ssdcache-defer-writes on, the default: small rewrites of cached data
# reach the cache file from a background thread): the same check holds
# after each kill, and besides, the restarted server must serve
# exactly the backing file, which has every completed write: a cached
# copy older than the backend (an update lost with the kill, not
# dropped at the restart) shows up as a difference.
#
# Exit status: 0 all good, 1 a violation (details on stderr), 2 usage
# or environment error.
#
# Needs the libnbd Python bindings: run with /usr/bin/python3.

import argparse
import itertools
import os
import random
import sys
import threading
import time

import nbd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ssdtest as T            # noqa: E402

MiB = T.MiB
KiB = T.KiB
SECTOR = T.SECTOR


def info(msg):
    print("crash-writeback: " + msg, flush=True)


class Violation(Exception):
    pass


# -- the server --------------------------------------------------------

class Server(T.Nbdkit):
    """One nbdkit (ssdtest.Nbdkit) on the shared backing file and cache
    file, with the configuration it runs with."""

    counter = 0

    def __init__(self, args, cfg, mode, on_exit):
        Server.counter += 1
        self.no = Server.counter
        self.cfg = cfg
        self.mode = mode
        self.on_exit = on_exit
        wd = args.workdir
        self.stats = os.path.join(wd, "stats.%d" % self.no)
        self.control = os.path.join(wd, "ctl.%d" % self.no)
        T.Nbdkit.__init__(self, self.nbdkit_args(args), wd,
                          verbose=args.debug,
                          debug=(["ssdcache.verbose=1"] if args.debug
                                 else []) +
                          T.epoch_span_debug(args.epoch_span),
                          log=os.path.join(wd, "nbdkit.%d.log" % self.no))

    def nbdkit_args(self, args):
        """nbdkit's arguments after the ones ssdtest.Nbdkit adds."""
        c = self.cfg
        a = ["--filter=" + args.filter,
             # Writeback's own writes fail while the trigger file exists
             # (an error window, Client.error_window): clients send
             # nothing then.
             "--filter=error",
             "file", args.image,
             "error-pwrite=EIO", "error-pwrite-rate=50%",
             "error-file=" + args.trigger,
             "ssdcache-file=" + args.cache,
             "ssdcache-size=%d" % c["cache_size"],
             "ssdcache-page-size=%d" % c["page_size"],
             "ssdcache-mode=" + self.mode,
             "ssdcache-stats=" + self.stats,
             "ssdcache-control=" + self.control,
             "ssdcache-writeback-on-exit=" + ("true" if self.on_exit
                                              else "false")]
        if args.direct:
            a += ["ssdcache-direct=true"]
        if self.mode == "writeback":
            a += ["ssdcache-flush=" + c["flush"]] + T.writeback_args(c)
        return a

    def describe(self):
        return "server #%d: %s" % (self.no, self.command())

    def start(self):
        try:
            T.Nbdkit.start(self, timeout=60)
        except (T.StartError, T.Hang) as e:
            raise Violation("server #%d: %s" % (self.no, e))

    def handles(self, n):
        return [self.connect(name="crash-wb-%d" % i) for i in range(n)]

    def get_counter(self, name):
        """A counter of the running server (its control socket)."""
        r = T.ctl(self.control, "stats")
        if not r.ok:
            raise Violation("%s: ssdcache ctl stats: %s" % (
                self.describe(), r))
        for line in r.out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() == name:
                return int(v)
        raise T.EnvError("counter %s missing from the control socket" % name)

    def switch_mode(self, mode):
        """Switch the running server to mode over its control socket (a
        thread of its own: it returns once the writes that saw the old
        mode have ended, and leaving writeback once all is written
        back).  Errors are ignored: the server may be killed meanwhile.
        """
        def run():
            try:
                T.ctl(self.control, "mode", mode, timeout=120)
            except T.Hang:
                pass
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    def stop(self):
        """Clean shutdown; returns the counters of the stats file."""
        try:
            rc = T.Nbdkit.stop(self, timeout=90)
        except T.Hang as e:
            raise Violation("server #%d: %s" % (self.no, e))
        if rc != 0:
            raise Violation("nbdkit exited with status %d after SIGTERM\n"
                            "%s\n%s" % (rc, self.describe(), self.log_tail()))
        return self.read_stats()

    def read_stats(self):
        stats = {}
        try:
            with open(self.stats) as f:
                for line in f:
                    k, _, v = line.partition(":")
                    v = v.strip()
                    if v.isdigit():
                        stats[k.strip()] = int(v)
        except FileNotFoundError:
            raise Violation("nbdkit did not write its stats file %s\n%s" % (
                self.stats, self.describe()))
        return stats


# -- what must survive --------------------------------------------------

def format_mismatches(bad, page_size):
    """The Mismatches of the crash check, with the page of each and how
    many of its bytes no allowed value explains."""
    return "\n".join("  %s (page %d, 512-byte sector %d of it; %d bad "
                     "byte(s) in this sector)" % (
                         m, m.sector * SECTOR // page_size,
                         m.sector * SECTOR % page_size // SECTOR,
                         m.odd_bytes())
                     for m in bad)


class Model:
    """What the export must hold: the model disk (ssdtest.Disk), where
    its data came from (ssdtest.Origins), the next write's number."""

    def __init__(self, data):
        self.disk = T.Disk(data)
        self.origins = T.Origins(unit="iterations")
        self.ids = itertools.count()


def read_all(h, size):
    try:
        return T.read_all(h, size)
    except T.ReadError as e:
        raise Violation(str(e))


def read_backing(args):
    with open(args.image, "rb") as f:
        return f.read()


def compare_backing(args, disk, what):
    """The backing file must hold every completed write (disk.cur)."""
    bad = disk.check_current(read_backing(args), flight=False,
                             limit=disk.nsect)
    if bad:
        fb = bad[0].first_byte()
        raise Violation("%s: the backing file differs from the model at %s; "
                        "%d 4K blocks differ" % (
                            what, "offset %d (expected 0x%02x, got 0x%02x)"
                            % fb if fb else bad[0],
                            len({m.sector * SECTOR // 4096 for m in bad})))


# -- the client ---------------------------------------------------------

class Op:
    """A request in flight: w is a write's ssdtest.Write, token a
    flush's (Disk.flush_begin)."""
    __slots__ = ("kind", "conn", "cookie", "off", "n", "buf", "w", "id",
                 "fua", "token", "issued", "subs")

    def __init__(self, kind, conn):
        self.kind = kind
        self.conn = conn
        self.cookie = None
        self.off = 0
        self.n = 0
        self.buf = None
        self.w = None
        self.id = None
        self.fua = False
        self.token = None
        self.issued = time.monotonic()
        self.subs = None

    def __str__(self):
        s = "%s conn=%d" % (self.kind, self.conn)
        if self.kind in ("write", "read"):
            s += " off=%d len=%d" % (self.off, self.n)
        if self.id is not None:
            s += " id=%d%s" % (self.id, " FUA" if self.fua else "")
        return s


class Client:
    """Requests on the handles against the model disk (ssdtest.Disk);
    the writes are numbered by ids (shared across iterations) and
    recorded in origins (ssdtest.Origins)."""

    def __init__(self, args, rng, disk, handles, cfg, ids, origins):
        self.args = args
        self.rng = rng
        self.disk = disk
        self.ids = ids
        self.origins = origins
        self.h = handles
        self.cfg = cfg
        self.size = args.size
        self.inflight = []
        self.server = None
        self.pending_flush = None
        self.multi_conn = handles[0].can_multi_conn()
        self.counts = {"write": 0, "fua": 0, "flush": 0, "read": 0}
        self.switcher = None
        self.hot = rng.randrange(0, self.size - args.hot_size + 1, 4096)
        self.seq_pos = rng.randrange(0, self.size, 64 * KiB)
        self.seq_around = 0

    # generating

    def gen_range(self):
        r = self.rng.random()
        rng = self.rng
        if r < 0.25:
            n = 1024
        elif r < 0.5:
            n = rng.randint(1, 8192)
        elif r < 0.85:
            n = rng.randint(4096, 98304)
        else:
            n = rng.randint(128 * 1024, 512 * 1024)
        if rng.random() < 0.6:
            lo, hi = self.hot, self.hot + self.args.hot_size
        else:
            lo, hi = 0, self.size
        n = min(n, hi - lo)
        off = rng.randint(lo, hi - n)
        if n == 1024 and rng.random() < 0.8:
            off -= off % 1024
        elif rng.random() < 0.2:
            off -= off % 4096
        return off, n

    def overlaps_inflight(self, off, n):
        for op in self.inflight:
            if op.kind in ("write", "read") and \
               off < op.off + op.n and op.off < off + n:
                return True
        return False

    def busy(self, conn):
        return sum(1 for op in self.inflight if op.conn == conn)

    # issuing

    def gen_seq(self):
        """The next write of the sequential stream, or None."""
        if self.rng.random() * 100 >= self.cfg.get("seq", 0):
            return None
        n = self.rng.choice([64, 128, 256]) * KiB
        off = self.seq_pos if self.seq_pos + n <= self.size else 0
        if self.overlaps_inflight(off, n):
            return None
        self.seq_pos = off + n
        return off, n

    def issue_write(self, conn, fua=False):
        r = self.gen_seq()
        while r is None:
            off, n = self.gen_range()
            if not self.overlaps_inflight(off, n):
                r = off, n
        off, n = r
        op = Op("write", conn)
        op.off, op.n = off, n
        data = self.rng.randbytes(n)
        op.buf = bytearray(data)
        op.id = next(self.ids)
        op.fua = fua
        op.w = self.disk.begin("write", off, n, data, fua=fua)
        self.origins.add_write(op.w, "write #%d%s" % (
            op.id, " FUA" if fua else ""))
        op.cookie = self.h[conn].aio_pwrite(
            nbd.Buffer.from_buffer(op.buf), off,
            flags=nbd.CMD_FLAG_FUA if fua else 0)
        self.inflight.append(op)
        self.counts["fua" if fua else "write"] += 1

    def issue_flush(self, conn):
        """FLUSH covers the writes completed before it is issued."""
        op = Op("flush", conn)
        op.token = self.disk.flush_begin()
        if self.multi_conn:
            op.cookie = self.h[conn].aio_flush()
            op.subs = None
        else:
            op.subs = [(i, h.aio_flush()) for i, h in enumerate(self.h)]
        self.pending_flush = op
        self.inflight.append(op)

    # completing

    def complete(self, op):
        self.inflight.remove(op)
        if op.kind == "write":
            self.disk.end(op.w, True)
        elif op.kind == "read":
            bad = self.disk.check_read(op.off, op.buf, limit=1)
            if bad:
                fb = bad[0].first_byte()
                raise Violation("read %s returned wrong data at %s" % (
                    op, "offset %d: expected 0x%02x, got 0x%02x" % fb
                    if fb else bad[0]))
            self.counts["read"] += 1
        elif op.kind == "flush":
            self.disk.flush_end(op.token)
            self.pending_flush = None
            self.counts["flush"] += 1

    def cmd_done(self, op):
        """True if op finished; raises nbd.Error on a failed command."""
        if op.subs is not None:
            rest = []
            for i, c in op.subs:
                if not self.h[i].aio_command_completed(c):
                    rest.append((i, c))
            op.subs = rest
            return not rest
        return self.h[op.conn].aio_command_completed(op.cookie)

    def progress(self, timeout):
        """Move I/O forward on every connection, retire what finished."""
        T.aio_poll(self.h, timeout)
        for op in list(self.inflight):
            try:
                done = self.cmd_done(op)
            except nbd.Error as e:
                raise Violation("%s failed after %.3f s: %s\n%s" % (
                    op, time.monotonic() - op.issued, e,
                    self.server.log_tail() if self.server else ""))
            if done:
                self.complete(op)

    def wait_until(self, cond, what):
        last = time.monotonic()
        n = len(self.inflight)
        while not cond():
            self.progress(0.5)
            if len(self.inflight) != n:
                n = len(self.inflight)
                last = time.monotonic()
            elif time.monotonic() - last > self.args.timeout:
                raise Violation("no request completed for %d s while "
                                "waiting for %s; in flight: %s" % (
                                    self.args.timeout, what,
                                    "; ".join(map(str, self.inflight))))

    # phases

    def run_writes(self, nwrites, kill=False, server=None):
        """Issue nwrites writes (with reads, flushes and FUA writes mixed
        in).  With kill, SIGKILL the server at a random moment after the
        last one is issued, with requests still in flight; returns how
        many were in flight then."""
        depth = self.args.depth
        since_sync = 0
        top = 15 if self.args.sabotage else 60
        sync_every = self.rng.randint(10, top)
        for i in range(nwrites):
            conn = i % len(self.h)
            self.wait_until(lambda: self.busy(conn) < depth, "a free slot")
            if self.rng.random() < 0.1:
                self.issue_read_sync(conn)
            since_sync += 1
            if since_sync >= sync_every:
                since_sync = 0
                sync_every = self.rng.randint(10, top)
                self.sync_point(conn)
            else:
                self.issue_write(conn)
            if self.rng.random() < 0.3:
                self.progress(0)
            if self.cfg["errors"] and self.rng.random() < 0.02:
                self.error_window()
            if (self.args.switch_prob and server is not None and
                    (self.switcher is None or not self.switcher.is_alive())
                    and self.kill_rng.random() < self.args.switch_prob):
                mode = self.kill_rng.choice(["writethrough", "writearound",
                                             "writeback"])
                self.switcher = server.switch_mode(mode)
                self.counts["switch"] = self.counts.get("switch", 0) + 1
        if not kill:
            self.wait_until(lambda: not self.inflight, "the last requests")
            return 0
        # Let the requests run for a random moment (or not at all),
        # then kill -9 with some still in flight.
        if self.kill_rng.random() < 0.6:
            t_end = time.monotonic() + self.kill_rng.uniform(0, 0.01)
            while time.monotonic() < t_end and len(self.inflight) > 1:
                self.progress(0.001)
        # Make sure writes are in flight: a last burst, not waited for.
        for i in range(self.kill_rng.randint(1, depth)):
            conn = i % len(self.h)
            if self.busy(conn) < depth + 2:
                self.issue_write(conn)
        in_flight = sum(1 for op in self.inflight if op.kind == "write")
        self.seq_around = server.get_counter("seq_write_bypassed")
        server.kill()
        return in_flight

    def error_window(self):
        """Nothing in flight, then for a moment half of the backend
        writes fail (writeback's: clients send nothing meanwhile), so
        that failed runs back off while others are written back."""
        self.wait_until(lambda: not self.inflight, "requests before an "
                        "error window")
        open(self.args.trigger, "w").close()
        time.sleep(self.rng.uniform(0.05, 0.3))
        os.unlink(self.args.trigger)
        self.counts["error_windows"] = self.counts.get("error_windows", 0) + 1

    def issue_read_sync(self, conn):
        # Reads go through aio_pread with a buffer we own so the data
        # can be checked at completion.
        for _ in range(20):
            off, n = self.gen_range()
            if not self.overlaps_inflight(off, n):
                break
        else:
            return
        op = Op("read", conn)
        op.off, op.n = off, n
        op.buf = bytearray(n)
        op.cookie = self.h[conn].aio_pread(nbd.Buffer.from_buffer(op.buf),
                                           off)
        self.inflight.append(op)

    def sync_point(self, conn):
        """A FLUSH (possibly with writes still in flight) or a FUA
        write."""
        if self.rng.random() < self.args.fua_prob:
            self.issue_write(conn, fua=True)
            return
        if self.pending_flush is not None:
            self.wait_until(lambda: self.pending_flush is None,
                            "the previous flush")
        if self.rng.random() < 0.5:
            self.wait_until(lambda: not any(o.kind == "write"
                                            for o in self.inflight),
                            "writes before a flush")
        self.issue_flush(conn)


# -- the driver ---------------------------------------------------------

def geometry(cfg):
    return (cfg["page_size"], cfg["cache_size"])


FIXED = {}


def choose_cfg(rng, prev=None, sabotage=False):
    cfg = choose_cfg1(rng, prev)
    cfg.update(FIXED)
    if sabotage:
        # Keep dirty data in the cache so that losing it shows: no
        # early writeback, and no write going around the cache.
        cfg.update(flush="cache", high=100, low=90, idle=0, max_dirty=0,
                   max_age=0, seq=0)
    return cfg


def choose_cfg1(rng, prev=None):
    if prev is not None and rng.random() < 0.7:
        page_size, cache_size = geometry(prev)
    else:
        page_size = rng.choice([4096, 65536])
        cache_size = rng.choice([2, 3, 4]) * MiB
    high, low = rng.choice([(50, 10), (50, 10), (25, 5), (90, 40), (10, 0)])
    return {
        "page_size": page_size,
        "cache_size": cache_size,
        "flush": rng.choice(["cache", "backend"]),
        "high": high,
        "low": low,
        "idle": rng.choice([0, 50, 1000]),
        "rate": rng.choice([0, 0, 0, 32 * MiB]),
        "depth": rng.choice([1, 4, 8]),
        "max_dirty": rng.choice([0, 0, 10, 50]),   # % of the cache
        "max_age": rng.choice([0, 0, 1]),
        "errors": rng.choice([0, 0, 1]),           # error windows
        # Sequential streams that go around the cache: the cutoff, and
        # the % of writes that continue the stream.
        "seq_cutoff": rng.choice([0, 256 * KiB, MiB, 4 * MiB]),
        "seq": rng.choice([0, 10, 40]),
    }


def describe_cfg(cfg):
    return ("page %dK cache %dM flush=%s high=%d low=%d idle=%d rate=%d "
            "depth=%d max_dirty=%d%% max_age=%d errors=%d seq_cutoff=%d "
            "seq=%d%%" % (
                cfg["page_size"] // 1024, cfg["cache_size"] // MiB,
                cfg["flush"], cfg["high"], cfg["low"], cfg["idle"],
                cfg["rate"], cfg["depth"], cfg["max_dirty"],
                cfg["max_age"], cfg["errors"], cfg["seq_cutoff"],
                cfg["seq"]))


def pool_offset(args, page_size, cache_size):
    """Where the page pool of a cache of that geometry starts: after
    the two superblocks and 64 bytes an entry, at the next MiB.  The
    filter gives a cache at most a quarter more slots than the backend
    has pages (open.c: wanted_slots)."""
    npages = (args.size + page_size - 1) // page_size
    slots = min(cache_size // page_size, npages + max(npages // 4, 16))
    end = 2 * 4096 + slots * 64
    return (end + MiB - 1) // MiB * MiB


def resize_cfgs(args, rng, cfg, next_cfg, totals):
    """With --resize, sometimes: the server after the kill runs with
    another cache size on the same cache file (it writes back and
    resizes at start), and so does the next iteration's.  Returns the
    configurations of the restart and of the next iteration, and whether
    they resize."""
    if args.resize == 0 or rng.random() >= args.resize:
        return cfg, next_cfg, False
    sizes = [2 * MiB, 3 * MiB, 4 * MiB, 6 * MiB]
    if pool_offset(args, cfg["page_size"], 72 * MiB) != \
       pool_offset(args, cfg["page_size"], 6 * MiB):
        # A page table of more than 1 MiB (over 16,384 slots: a backend
        # of 52 MiB or more with 4 KiB pages): the page pool starts 1 MiB
        # further, and a resize to or from this size moves every kept
        # page to another slot (resize.c).
        sizes += [72 * MiB] * 4     # (half of the resizes)
    size = rng.choice([s for s in sizes if s != cfg["cache_size"]])
    totals["resize"] += 1
    totals["resize_move"] += pool_offset(args, cfg["page_size"], size) != \
        pool_offset(args, cfg["page_size"], cfg["cache_size"])
    return (dict(cfg, cache_size=size),
            dict(next_cfg, page_size=cfg["page_size"], cache_size=size), True)


def interrupt_resize(args, rng, cfg, vmode, totals):
    """Start a server of the new size and kill it during its start-up:
    at one of the resize's steps (-D ssdcache.resize_kill), or after a
    random delay (in the writeback before the resize, or elsewhere)."""
    step = rng.choice([0, 1, 2, 3, 4, 5, 6, 7])
    s = Server(args, cfg, vmode, on_exit=False)
    if step:
        s.debug.append("ssdcache.resize_kill=%d" % step)
        s.spawn()
        try:
            s.wait_serving(60)
        except T.StartError:
            pass                  # killed at the step, as asked
    else:
        s.spawn()
        time.sleep(rng.uniform(0, 0.1))
    s.kill()
    totals["resize_kill"] += 1


def check_stats(server, stats):
    for k in ("dirty_lost", "writeback_errors"):
        if stats.get(k, 0) != 0:
            raise Violation("%s: counter %s is %d, expected 0\n%s" % (
                server.describe(), k, stats[k], server.log_tail()))


def close_handles(hs):
    """Disconnect every handle of list hs and empty it."""
    for h in hs:
        T.shutdown_quietly(h)
    hs.clear()


def make_backing(args, rng):
    """Random data in some 1M chunks, holes elsewhere."""
    with open(args.image, "wb") as f:
        f.truncate(args.size)
        for off in range(0, args.size, MiB):
            if rng.random() < 0.5:
                f.seek(off)
                f.write(rng.randbytes(min(MiB, args.size - off)))
    with open(args.image, "rb") as f:
        return f.read()


def run(args):
    rng = random.Random(args.seed)           # configurations, kills
    data_rng = random.Random(args.seed + 1)  # requests and data
    os.makedirs(args.workdir, exist_ok=True)
    args.image = os.path.join(args.workdir, "backing.img")
    args.cache = os.path.join(args.workdir, "cache.ssdcache")
    args.trigger = os.path.join(args.workdir, "backend-errors")
    if os.path.exists(args.trigger):
        os.unlink(args.trigger)
    if os.path.exists(args.cache):
        os.unlink(args.cache)
    state = Model(make_backing(args, rng))
    totals = {"unsealed": 0, "seq_around": 0, "write": 0, "fua": 0, "flush": 0, "read": 0, "inflight": 0,
              "restart_wt": 0, "clean_restart": 0, "new_cache": 0,
              "resize": 0, "resize_kill": 0, "resize_move": 0}

    cfg = choose_cfg(rng, None, args.sabotage)
    server = Server(args, cfg, args.mode, on_exit=rng.random() < 0.5)
    server.start()
    t_start = time.monotonic()
    for it in range(args.iterations):
        try:
            cfg, server = iteration(args, rng, data_rng, state, totals, it,
                                    cfg, server)
        except Violation as e:
            raise Violation("iteration %d (%s): %s" % (
                it, describe_cfg(cfg), e))
    finish(args, server, state, totals, t_start)


def iteration(args, rng, data_rng, state, totals, it, cfg, server):
    if True:
        t0 = time.monotonic()
        last = it + 1 == args.iterations
        hs = server.handles(2)
        disk = state.disk
        state.origins.start("iteration %d" % it, disk.cur)
        client = Client(args, data_rng, disk, hs, cfg, state.ids,
                        state.origins)
        client.server = server
        client.kill_rng = random.Random(rng.random())
        nwrites = rng.randint(args.min_writes, args.max_writes)
        in_flight = client.run_writes(nwrites, kill=True, server=server)
        close_handles(hs)
        client.h = []
        for k in ("write", "fua", "flush", "read"):
            totals[k] += client.counts[k]
        totals["switch"] = totals.get("switch", 0) + \
            client.counts.get("switch", 0)
        totals["inflight"] += in_flight
        totals["seq_around"] += client.seq_around

        if args.sabotage:
            # Self-test: lose the cache at the crash; the check must
            # notice (flushed data only the cache had is gone).
            os.unlink(args.cache)
        next_cfg = cfg if last else choose_cfg(rng, cfg, args.sabotage)
        cfg, next_cfg, resized = resize_cfgs(args, rng, cfg, next_cfg,
                                             totals)
        same_geo = geometry(next_cfg) == geometry(cfg)
        r = rng.random()
        if args.mode == "writethrough":
            vmode = "writethrough"
        else:
            vmode = "writeback" if r < 0.75 else \
                "writethrough" if r < 0.9 else "writearound"
        continuing = vmode == args.mode and same_geo and \
            (last or rng.random() < 0.75)
        if continuing:
            vserver = Server(args, next_cfg, args.mode,
                             on_exit=True if last else rng.random() < 0.5)
        else:
            vserver = Server(args, cfg, vmode,
                             on_exit=True if not same_geo
                             else rng.random() < 0.5)
        if resized and rng.random() < 0.7:
            interrupt_resize(args, rng, cfg, vmode, totals)
        vserver.start()
        h = vserver.handles(1)[0]
        got = read_all(h, args.size)
        close_handles([h])
        bad = disk.check_after_crash(got, limit=20)
        if bad:
            done, flying = disk.unflushed()
            raise Violation(
                "after kill -9 and restart, %s%s sector(s) hold bytes that "
                "are neither the last flushed data nor data written since:"
                "\n%s\n"
                "where the bytes read come from:\n%s\n"
                "crashed: %s\nrestarted: %s\n%d write(s) since the last "
                "completed flush, %d in flight at the kill\n"
                "log of the crashed server:\n%s\n"
                "log of the restarted server:\n%s" % (
                    len(bad), "+" if len(bad) >= 20 else "",
                    format_mismatches(bad, cfg["page_size"]),
                    state.origins.explain(bad, got, read_backing(args)),
                    server.describe(), vserver.describe(),
                    done + flying, in_flight,
                    server.log_tail(), vserver.log_tail()))
        disk.rebase(got)
        if args.mode == "writethrough":
            compare_backing(args, disk, "iteration %d: restarted after kill "
                            "-9 in writethrough mode (the backing file has "
                            "every completed write; the cache must not "
                            "serve an older copy)" % it)
        elif vmode != "writeback":
            totals["restart_wt"] += 1
            compare_backing(args, disk, "iteration %d: restarted in %s mode "
                            "(dirty data must be written back before "
                            "serving)" % (it, vmode))
        line = ("iteration %d: %s; %d writes, %d FUA, %d flushes, %d reads, "
                "%d in flight at kill; restart %s" % (
                    it, describe_cfg(cfg), client.counts["write"],
                    client.counts["fua"], client.counts["flush"],
                    client.counts["read"], in_flight, vmode))
        if continuing:
            server = vserver
        else:
            stats = vserver.stop()
            check_stats(vserver, stats)
            totals["unsealed"] += stats.get("unsealed_dropped", 0)
            if vserver.on_exit or vmode != "writeback":
                compare_backing(args, disk,
                                "iteration %d: clean exit of %s" % (
                                    it, vserver.describe()))
            if not same_geo:
                os.unlink(args.cache)
                totals["new_cache"] += 1
                line += ", new cache"
            else:
                totals["clean_restart"] += 1
                line += ", clean restart (on-exit=%s)" % (
                    "true" if vserver.on_exit else "false")
            server = Server(args, next_cfg, args.mode,
                            on_exit=True if last else rng.random() < 0.5)
            server.start()
            if same_geo:
                h = server.handles(1)[0]
                again = read_all(h, args.size)
                close_handles([h])
                bad = disk.check_current(again, flight=False, limit=1)
                if bad:
                    fb = bad[0].first_byte()
                    raise Violation(
                        "iteration %d: after a clean restart the export "
                        "changed at %s\nstopped: %s\nstarted: %s" % (
                            it, "offset %d: expected 0x%02x, got 0x%02x" % fb
                            if fb else bad[0],
                            vserver.describe(), server.describe()))
        info(line + " (%.1fs)" % (time.monotonic() - t0))
        return next_cfg, server


def finish(args, server, state, totals, t_start):
    stats = server.stop()
    check_stats(server, stats)
    if not server.on_exit:
        raise T.EnvError("internal: the last server must write back at exit")
    compare_backing(args, state.disk, "final clean exit (writeback-on-exit"
                    "=true)")
    info("PASS: seed %d, %d iterations in %.1fs: %d writes, %d FUA writes, "
         "%d flushes, %d checked reads, %d writes in flight at kills, %d "
         "restarts in writethrough/writearound, %d clean restarts, %d new "
         "caches, %d resizes after kills (%d of them killed at first, %d "
         "moving the page pool), "
         "%d unsealed (unflushed) pages dropped after kills, %d "
         "sequential writes around the cache before kills, %d mode "
         "switches at run time; final "
         "stats: pages_written_back=%d evictions=%d cow_copies=%d" % (
             args.seed, args.iterations, time.monotonic() - t_start,
             totals["write"], totals["fua"], totals["flush"], totals["read"],
             totals["inflight"], totals["restart_wt"],
             totals["clean_restart"], totals["new_cache"],
             totals["resize"], totals["resize_kill"], totals["resize_move"],
             totals["unsealed"],
             totals["seq_around"], totals.get("switch", 0),
             stats.get("pages_written_back", -1),
             stats.get("evictions", -1), stats.get("cow_copies", -1)))


def main():
    p = argparse.ArgumentParser(
        description="kill -9 crash test of ssdcache writeback mode.")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--mode", choices=["writeback", "writethrough"],
                   default="writeback",
                   help="the mode of the crashed servers (default "
                   "writeback)")
    p.add_argument("--seed", type=int, default=None,
                   help="random seed (default: random, printed)")
    p.add_argument("--filter", default=None,
                   help="the filter .so (default: $SSDCACHE_FILTER or "
                   "../filter/.libs/nbdkit-ssdcache-filter.so)")
    p.add_argument("--workdir", default=None,
                   help="directory for the backing file, cache and logs "
                   "(default: a new directory under /var/tmp, removed "
                   "after a pass)")
    p.add_argument("--size", type=int, default=32 * MiB,
                   help="backing file size, a multiple of 512 (default 32M)")
    p.add_argument("--hot-size", type=int, default=6 * MiB,
                   help="size of the region most writes go to (default 6M)")
    p.add_argument("--min-writes", type=int, default=50)
    p.add_argument("--max-writes", type=int, default=400)
    p.add_argument("--depth", type=int, default=8,
                   help="requests in flight per connection (default 8)")
    p.add_argument("--fua-prob", type=float, default=0.3,
                   help="probability a sync point is a FUA write rather "
                   "than a FLUSH (default 0.3)")
    p.add_argument("--switch-prob", type=float, default=0.0,
                   help="per write, the chance of a mode switch at run "
                   "time (ssdcache ctl mode) while writes run (default 0)")
    p.add_argument("--debug", action="store_true",
                   help="run nbdkit with -v -D ssdcache.verbose=1 (logs in "
                   "the workdir)")
    p.add_argument("--direct", action="store_true",
                   help="run nbdkit with ssdcache-direct=true (O_DIRECT)")
    p.add_argument("--sabotage", action="store_true",
                   help="self-test: delete the cache file after each kill; "
                   "the run must then FAIL")
    p.add_argument("--fix", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="always use this setting (page_size, cache_size, "
                   "flush, high, low, idle, rate, depth, max_dirty (%% "
                   "of the cache, 0: none), max_age (s), errors (1: "
                   "windows where half of writeback's writes fail), "
                   "seq_cutoff, seq (%% of writes that continue a "
                   "sequential stream); sizes in bytes): to search one "
                   "configuration hard")
    p.add_argument("--resize", type=float, default=0.0,
                   help="per iteration, the chance that the server after "
                   "the kill (and the next iteration) has another "
                   "ssdcache-size on the same cache file; most such "
                   "restarts are killed first during the resize "
                   "(default 0)")
    p.add_argument("--timeout", type=int, default=90,
                   help="fail if no request completes for this long")
    T.add_epoch_span_option(p)
    args = p.parse_args()
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little")
    if args.size <= 0 or args.size % SECTOR:
        print("crash-writeback: --size must be a multiple of 512",
              file=sys.stderr)
        return 2
    for kv in args.fix:
        k, _, v = kv.partition("=")
        if k not in ("page_size", "cache_size", "flush", "high", "low",
                     "idle", "rate", "depth", "max_dirty", "max_age",
                     "errors", "seq_cutoff", "seq") or not v:
            print("crash-writeback: bad --fix %s" % kv, file=sys.stderr)
            return 2
        FIXED[k] = v if k == "flush" else int(v)
    if args.filter is None:
        args.filter = os.environ.get("SSDCACHE_FILTER") or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "filter",
            ".libs", "nbdkit-ssdcache-filter.so")
    args.filter = os.path.abspath(args.filter)
    if not os.path.isfile(args.filter):
        print("crash-writeback: filter not found: %s" % args.filter,
              file=sys.stderr)
        return 2
    made = False
    if args.workdir is None:
        import tempfile
        args.workdir = tempfile.mkdtemp(prefix="ssdcache-crash-wb-",
                                        dir="/var/tmp")
        made = True
    args.workdir = os.path.abspath(args.workdir)
    if args.hot_size > args.size:
        args.hot_size = args.size
    info("seed %d, %d iterations, workdir %s" % (
        args.seed, args.iterations, args.workdir))
    try:
        run(args)
    except Violation as e:
        print("crash-writeback: FAIL (seed %d): %s" % (args.seed, e),
              file=sys.stderr, flush=True)
        print("crash-writeback: rerun with --seed %d; logs in %s" % (
            args.seed, args.workdir), file=sys.stderr)
        return 1
    except T.EnvError as e:
        print("crash-writeback: ERROR: %s" % e, file=sys.stderr)
        return 2
    finally:
        T.kill_all()     # the servers this run started, if running
    if made:
        import shutil
        shutil.rmtree(args.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
