#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""chaos.py: the chaos harness of nbdkit-ssdcache-filter (design.md,
invariants 12 and 14; issue 27).

A run is a series of segments.  Each segment draws a configuration
from its seed (the plugin, the page and cache sizes, the mode and
writeback order, the writeback knobs, warm-up, readahead, flush
semantics, export names, faults, a slow backend), makes fresh backing
data, starts nbdkit with the filter, and for its time:

  * client threads, one libnbd handle each (synchronous calls, several
    export names), send reads, writes, zeroes, trims, flushes and
    NBD_CMD_CACHE, of random sizes (sector to several pages, some
    unaligned), hot spots and sequential bursts.  Two requests of which
    one modifies never overlap in flight, nor do two that modify share
    a sector, so the model stays exact;
  * a driver thread, at random: switches the mode (`ssdcache ctl SOCK
    mode ...`), drains (with and without --wait), invalidates, asks for
    status, restarts nbdkit cleanly (SIGTERM) or kills it (-9) and
    restarts it (sometimes in another mode, ssdcache-mode=; sometimes
    with the cache files deleted where the contract allows it), and
    turns cache-file faults (ENOSPC/EIO from tests/shim/faultio.c,
    FAULTIO_SIZES/RATE, a trigger file) and backend errors (nbdkit's
    error filter after ssdcache, error-file=) on and off;
  * a watchdog fails the run when a request, a control command, a
    start or a SIGTERM takes longer than --hang-seconds (30): it first
    writes every nbdkit thread's stack (gdb -batch -p PID -ex 'thread
    apply all bt') and the tail of nbdkit's log (-v) to the log.  Over
    a slow backend (the delay filter) dirty data is capped to what
    writeback drains in DRAIN_SECONDS, so that what waits for it ends
    well within the bound.

The model (ssdtest.Disk) knows per 512-byte sector what a read may
return: the last completed write, zero or trim (trimmed: anything), or
after a failed write the old or the new data until a read says which.
Every read is checked.  A completed FLUSH makes durable every write
completed before it was issued, on any connection of the export's
cache; a FUA write is durable when it completes.  After kill -9 and a
restart every sector must hold its durable value or a value written
since (complete or in flight); after a clean stop everything completed.
After each kill the backing store alone is checked against the
contract: in writethrough and writearound (and in writeback once
drained with nothing written since) it holds every completed write
(those in flight: old or new); in writeback with the flush order it
equals the export at some completed flush k plus a subset of the
writes between flush k and k + 1 (ssdtest.FlushHistory); in writeback
with the offset order nothing is promised.  At the end of a segment
nbdkit stops cleanly and the backing store must equal the model.

Plugins: file FILE (one disk under every name), file dir=DIR (a disk
per name), ssh (an sshd of the test's own on loopback, one disk under
every name) and curl (a lighttpd of its own, read only).

Failures: "hang" (with the stacks), "wrong read" (a read, or the
export after a restart, outside the model; with the history of the
first bad sector), "contract" (the backing file after a kill or a
clean stop), "crash" (nbdkit exited by itself, with its log) and
"error" (a request failed with no fault injected in that server's
life, or the harness could not go on).

Output: one line per segment and one at the end with the counts (ops,
reads checked, kills, restarts, mode switches, faults injected, hangs,
wrong reads, contract violations); exit status 0 if nothing failed, 1
otherwise, 2 for a usage or environment error.  A failure prints the
seed, the segment's seed and configuration and the command that
replays it (the threads make a replay likely, not certain, to take
the same path).  The work directory (backing files, caches, nbdkit
logs, chaos.log) is removed after a pass; --keep keeps it after a
failure.

Focus: item1 alternates writeback and writethrough with cache faults
(ENOSPC on 8 KiB writes) on only under writethrough and a 2-page hot
spot; item2 the flush order, a 300 ms backend write delay, many
zeroes, flushes and mode switches; item3 writeback, kills and switches
to writethrough; item5 ssh, ssdcache-warm=all, readahead, 8
connections reading 256 MiB with sequential bursts.

Options (see --help): --seed, --minutes or --iterations (segments),
--segment-seconds, --mode/--order/--plugin to pin those, --focus
item1|item2|item3|item5 to weight the draw toward the configurations
that found issue 27's items, --one-cache (always
ssdcache-exports=one for plugins that serve one disk under every
name: without it the filter of c57a799 gives each name a cache of its
own, issue 27 item 4, and the model sees stale reads), --hang-seconds,
--workdir, --keep, -v.

Run it with /usr/bin/python3 (the libnbd bindings); `make check-chaos`
runs it for CHAOS_MINUTES in each mode and order, and
test-ssdcache-chaos.sh a short run in `make check`.
"""

import argparse
import collections
import errno
import faulthandler
import hashlib
import itertools
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ssdtest as T            # noqa: E402

try:
    import nbd
except ImportError:
    print("chaos: the libnbd Python bindings are missing (run with "
          "/usr/bin/python3)", file=sys.stderr)
    sys.exit(2)

KiB, MiB, SECTOR = T.KiB, T.MiB, T.SECTOR
DRAIN_SECONDS = 10      # see choose_config: dirty data over a slow backend
MODES = ("writethrough", "writeback", "writearound")
ORDERS = ("offset", "flush")
PLUGINS = ("file", "dir", "ssh", "curl")
FOCUS = ("item1", "item2", "item3", "item5")
KINDS = ("read", "write", "zero", "trim", "flush", "cache")
MODIFYING = ("write", "zero", "trim")


class Failure(Exception):
    """A bug found: kind is "hang", "wrong read", "contract" or
    "error"."""

    def __init__(self, kind, msg):
        Exception.__init__(self, msg)
        self.kind = kind


def log(msg):
    print("chaos: " + msg, flush=True)


# -- configurations ---------------------------------------------------------

def choose_config(rng, args):
    """A segment's configuration, from its own random sequence."""
    focus = args.focus
    c = {}
    plugins = {"file": 4, "dir": 3, "ssh": 2, "curl": 1}
    if not args.have_ssh:
        plugins.pop("ssh")
    if not args.have_curl:
        plugins.pop("curl")
    c["plugin"] = args.plugin or _weighted(rng, plugins)
    if focus in ("item1", "item2", "item3") and not args.plugin:
        c["plugin"] = rng.choice(["file", "dir"]) if focus != "item3" \
            else "file"
    if focus == "item5" and not args.plugin:
        c["plugin"] = "ssh" if args.have_ssh else "file"
    p = c["plugin"]
    c["mode"] = args.mode or (
        "writeback" if focus in ("item1", "item2", "item3")
        else rng.choice(MODES))
    if p == "curl":
        c["mode"] = "writethrough" if c["mode"] == "writeback" \
            else c["mode"]
    c["order"] = args.order or ("flush" if focus == "item2" else
                                "offset" if focus in ("item1", "item3")
                                else rng.choice(ORDERS))
    c["page"] = rng.choice([4, 8, 16, 32, 64, 64]) * KiB
    if focus in ("item1", "item3"):
        c["page"] = rng.choice([16, 32, 64]) * KiB
    if p in ("ssh", "curl"):
        c["size"] = rng.choice([16, 32]) * MiB
    else:
        c["size"] = rng.choice([4, 8, 16, 32]) * MiB
    if focus == "item5":
        c["size"] = 256 * MiB if p == "ssh" else 64 * MiB
    if args.size:
        c["size"] = args.size
    # Small enough to evict and to write around; never below 16 pages.
    frac = rng.choice([0.05, 0.1, 0.25, 0.5, 1.0])
    if focus == "item5":
        frac = 0.5
    c["cache"] = max(16 * c["page"], int(c["size"] * frac) //
                     c["page"] * c["page"])
    c["flush"] = rng.choice(["cache", "cache", "backend"])
    c["high"] = rng.choice([10, 50, 90])
    c["low"] = min(c["high"], rng.choice([0, 5, 10]))
    c["idle"] = rng.choice([0, 50, 1000])
    c["rate"] = rng.choice([0, 0, 0, 4 * MiB])
    c["depth"] = rng.choice([1, 4, 8])
    c["max_dirty"] = rng.choice([0, 0, 30, 60])
    c["max_age"] = rng.choice([0, 0, 1, 5])
    c["seq_cutoff"] = rng.choice([0, 256 * KiB, 4 * MiB])
    c["warm"] = rng.random() < (1.0 if focus == "item5" else 0.25)
    c["readahead"] = "auto" if focus == "item5" else \
        rng.choice(["auto", "auto", "off", "256K"])
    # Export names.
    if p == "dir":
        c["names"] = ["a", "b", "c"][:rng.randint(1, 3)]
    elif p == "curl":
        c["names"] = [""]
    else:
        c["names"] = ["", "n1", "n2"][:rng.choice([1, 1, 2, 3])]
    c["one_cache"] = p in ("file", "ssh") and len(c["names"]) > 1 and \
        (args.one_cache or rng.random() < 0.5)
    c["conns"] = 8 if focus == "item5" else rng.randint(2, 6)
    # A slow backend (the delay filter).
    c["delay_write"] = 0
    c["delay_read"] = 0
    if focus == "item2":
        c["delay_write"] = 300
    elif rng.random() < 0.25:
        c["delay_write"] = rng.choice([50, 100, 300])
    if rng.random() < 0.1 and focus != "item5":
        c["delay_read"] = rng.choice([5, 20])
    # Over a slow backend, dirty data is capped to what writeback drains
    # in DRAIN_SECONDS, one page at a time: a request that must wait for
    # it (a write around the cache in the flush order, a mode switch)
    # is then slow, never longer than the watchdog allows.  Without a
    # cap a 32 MiB cache over a 300 ms backend holds 20 minutes of
    # writeback: slowness as documented, not a hang.
    c["max_dirty_bytes"] = 0
    if c["delay_write"]:
        c["max_dirty_bytes"] = DRAIN_SECONDS * 1000 // c["delay_write"] * \
            c["page"]
    # Backend errors (the error filter) and cache-file faults (faultio).
    c["berr"] = None
    if p != "curl" and rng.random() < (0.0 if focus else 0.4):
        c["berr"] = {"rate": rng.choice([10, 30, 60]),
                     "ops": rng.choice([["pwrite"], ["pwrite", "zero",
                                                     "trim"],
                                        ["pwrite", "pread"]])}
    c["cfault"] = None
    if focus == "item1" or (not focus and rng.random() < 0.4):
        c["cfault"] = {
            "errno": "ENOSPC" if focus == "item1" else
            rng.choice(["ENOSPC", "EIO"]),
            "sizes": "8192" if focus == "item1" else
            rng.choice(["", "8192", "8192", "4096,8192", "65536"]),
            "rate": 100 if focus == "item1" else rng.choice([20, 50, 100]),
            "ops": "w" if focus == "item1" else rng.choice(["w", "w", "rw"]),
        }
    # Request mix and sizes.
    mix = {"read": 40, "write": 30, "zero": 6, "trim": 4, "flush": 8,
           "cache": 3}
    if focus == "item5":
        mix = {"read": 90, "write": 0, "zero": 0, "trim": 0, "flush": 0,
               "cache": 5}
    if focus == "item2":
        mix.update(zero=15, flush=12)
    if focus == "item1":
        # Pages copied on write and not flushed since when the mode
        # switches: few flushes.
        mix.update(write=40, flush=2, trim=1)
    if focus == "item3":
        mix.update(flush=12, trim=1)
    if p == "curl":
        mix.update(write=0, zero=0, trim=0, flush=0)
    c["mix"] = mix
    c["unaligned"] = 0.0 if focus else rng.choice([0.0, 0.05, 0.15])
    # A hot spot: hot_p of the requests go to the first hot_pages pages.
    c["hot_pages"], c["hot_p"] = (2, 0.8) if focus == "item1" else (8, 0.35)
    c["seq"] = 0.6 if focus == "item5" else rng.choice([0.1, 0.3])
    # The driver.
    act = {"mode": 4, "drain": 1, "drain_wait": 2, "invalidate": 1,
           "status": 1, "restart": 1, "kill": 2, "quiet_kill": 1,
           "cfault": 2 if c["cfault"] else 0,
           "berr": 2 if c["berr"] else 0}
    if focus == "item1":
        act.update(mode=6, kill=0, quiet_kill=0, restart=0, cfault=4)
    if focus == "item2":
        act.update(mode=6, kill=1, quiet_kill=0, restart=0)
    if focus == "item3":
        act.update(mode=6, kill=5, quiet_kill=0, restart=0, drain=0,
                   drain_wait=0)
    if focus == "item5":
        act = {"status": 1, "invalidate": 1, "restart": 1, "kill": 1}
    if p == "curl":
        act.update(mode=1, drain=0, drain_wait=0, quiet_kill=0)
    c["actions"] = act
    c["interval"] = rng.choice([0.2, 0.5, 1.0, 2.0])
    if focus == "item5":
        c["interval"] = 5.0
    return c


def _weighted(rng, d):
    keys = sorted(d)
    return rng.choices(keys, [d[k] for k in keys])[0]


def describe(c):
    s = ("plugin=%s names=%s%s conns=%d size=%dM page=%dK cache=%dK "
         "mode=%s order=%s flush=%s high=%d low=%d idle=%d rate=%d "
         "depth=%d max_dirty=%d max_age=%d seq_cutoff=%d warm=%s "
         "readahead=%s" % (
             c["plugin"], ",".join(n or '""' for n in c["names"]),
             " (one cache)" if c["one_cache"] else "", c["conns"],
             c["size"] // MiB, c["page"] // KiB, c["cache"] // KiB,
             c["mode"], c["order"], c["flush"], c["high"], c["low"],
             c["idle"], c["rate"], c["depth"], c["max_dirty"],
             c["max_age"], c["seq_cutoff"], c["warm"], c["readahead"]))
    if c["delay_write"] or c["delay_read"]:
        s += " delay=w%dms/r%dms" % (c["delay_write"], c["delay_read"])
    if c["max_dirty_bytes"]:
        s += " max_dirty_bytes=%dK" % (c["max_dirty_bytes"] // KiB)
    if c["berr"]:
        s += " backend-errors=%d%%:%s" % (c["berr"]["rate"],
                                          "+".join(c["berr"]["ops"]))
    if c["cfault"]:
        f = c["cfault"]
        s += " cache-faults=%s:%s:sizes=%s:%d%%" % (
            f["errno"], f["ops"], f["sizes"] or "any", f["rate"])
    return s


# -- the server -------------------------------------------------------------------

class Server:
    """nbdkit with the filter, as the segment's configuration says."""

    def __init__(self, seg):
        self.seg = seg
        self.cfg = seg.cfg
        self.nbdkit = None
        self.mode = None

    def argv(self, mode, verify):
        c = self.cfg
        seg = self.seg
        a = []
        if c["plugin"] == "curl":
            a.append("-r")
        a += ["--filter=" + seg.args.filter]
        if c["berr"]:
            a.append("--filter=error")
        if c["delay_write"] or c["delay_read"]:
            a.append("--filter=delay")
        a += seg.plugin_args
        a += ["ssdcache-file=" + seg.cache,
              "ssdcache-size=%d" % c["cache"],
              "ssdcache-page-size=%d" % c["page"],
              "ssdcache-mode=" + mode,
              "ssdcache-control=" + seg.ctlsock,
              "ssdcache-writeback-order=" + c["order"],
              "ssdcache-flush=" + c["flush"],
              "ssdcache-readahead=" + c["readahead"]]
        a += T.writeback_args(c)
        if verify:
            a.append("ssdcache-verify=lazy")
        if c["warm"]:
            a.append("ssdcache-warm=all")
        if c["one_cache"]:
            a.append("ssdcache-exports=one")
        if c["berr"]:
            a += ["error-file=" + seg.berr_trigger]
            for op in c["berr"]["ops"]:
                a += ["error-%s=EIO" % op,
                      "error-%s-rate=%d%%" % (op, c["berr"]["rate"])]
        if c["delay_write"]:
            a += ["delay-write=%dms" % c["delay_write"],
                  "delay-zero=%dms" % c["delay_write"],
                  "delay-trim=%dms" % c["delay_write"]]
        if c["delay_read"]:
            a.append("delay-read=%dms" % c["delay_read"])
        return a

    def env(self):
        f = self.cfg["cfault"]
        if not f:
            return {}
        return {"LD_PRELOAD": self.seg.args.faultio,
                "FAULTIO_PATH": self.seg.cache + "*",
                "FAULTIO_TRIGGER": self.seg.cfault_trigger,
                "FAULTIO_ERRNO": str(getattr(errno, f["errno"])),
                "FAULTIO_OPS": f["ops"],
                "FAULTIO_SIZES": f["sizes"],
                "FAULTIO_RATE": str(f["rate"]),
                "FAULTIO_SEED": str(self.seg.seed & 0xffffffff)}

    def start(self, mode, verify=False):
        """verify: with ssdcache-verify=lazy (see asks_verify)."""
        seg = self.seg
        self.mode = mode
        log = os.path.join(seg.dir, "nbdkit.log")
        self.log_from = os.path.getsize(log) if os.path.exists(log) else 0
        self.nbdkit = T.Nbdkit(self.argv(mode, verify), seg.dir,
                               name="nbdkit",
                               env=self.env(), verbose=True,
                               debug=["ssdcache.exports=1",
                                      "ssdcache.order=1"])
        # The watchdog takes the stacks at --hang-seconds and kills
        # nbdkit; the timeout here is a backstop.
        seg.watch_begin("nbdkit start", "start")
        try:
            self.nbdkit.start(timeout=seg.args.hang_seconds + 180)
        except T.Hang as e:
            raise Failure("hang", str(e))
        except T.StartError as e:
            raise Failure("error", str(e))
        finally:
            seg.watch_end("start")

    def lost_ranges(self):
        """The byte ranges this server declared lost ("DIRTY DATA LOST":
        dirty data the failing cache device could not give back, which
        the man page documents), from its log."""
        import re
        try:
            with open(self.nbdkit.log, "rb") as f:
                f.seek(self.log_from)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return []
        return [(int(a), int(b) + 1) for a, b in re.findall(
            r"DIRTY DATA LOST: slot \d+ \(page \d+, bytes (\d+)-(\d+)\)",
            text)]

    def asks_verify(self):
        """Did this server's log tell the user to start the next time
        with ssdcache-verify=lazy?  It does when the failing cache device
        refused to record that a cached clean page was dropped (the man
        page, CACHE DEVICE FAILURES: the one case where a restart needs
        the user's help).  The next start then follows that advice."""
        try:
            with open(self.nbdkit.log, "rb") as f:
                f.seek(self.log_from)
                return b"start the next time with ssdcache-verify=lazy" \
                    in f.read()
        except OSError:
            return False


# -- the segment ---------------------------------------------------------------------

class Domain:
    """One cache and its disk: the export names served by it, the
    model, and what the backing store is known to hold."""

    def __init__(self, names, disk, backing):
        self.names = names
        self.disk = disk
        self.backing = backing          # the backing file (local path)
        self.mode = None                # None: unknown
        self.steered = False            # the control socket steers it
        self.switching = False
        self.exact = False              # backend has every completed write
        self.drain = None               # a drain --wait in progress
        self.anchor = None              # a handle the driver keeps open


class Worker(threading.Thread):
    def __init__(self, seg, no, name, rng):
        threading.Thread.__init__(self, name="worker-%d" % no, daemon=True)
        self.seg = seg
        self.no = no
        self.export = name
        self.dom = seg.domain_of[name]
        self.rng = rng
        self.h = None
        self.gen = -1
        self.cursor = rng.randrange(0, self.dom.disk.size, SECTOR)
        self.parked = False
        self.caps = {}

    # -- requests ------------------------------------------------------------

    def gen_op(self):
        c = self.seg.cfg
        rng = self.rng
        size = self.dom.disk.size
        # (What the server offers may change with the mode and across
        # restarts: ask each connection, see loop.)
        kinds = [k for k in KINDS if c["mix"].get(k) and
                 self.caps.get(k, True)]
        kind = rng.choices(kinds, [c["mix"][k] for k in kinds])[0]
        if kind == "flush":
            return kind, 0, 0, False
        page = c["page"]
        r = rng.random()
        if r < 0.15:
            n = rng.choice([1, 2]) * SECTOR
        elif r < 0.35:
            n = 4 * KiB
        elif r < 0.55:
            n = 8 * KiB
        elif r < 0.65:
            n = 16 * KiB
        elif r < 0.80:
            n = page * rng.choice([1, 1, 2])
        else:
            n = rng.randint(1, 512) * SECTOR
        n = min(n, 256 * KiB, size)
        r = rng.random()
        if r < c["seq"]:
            off = self.cursor
        elif r < c["seq"] + c["hot_p"]:
            hot = max(n, min(size, c["hot_pages"] * page))
            off = rng.randrange(0, hot - n + 1, SECTOR)
        else:
            off = rng.randrange(0, size - n + 1, SECTOR)
        if rng.random() < 0.3:
            off -= off % min(page, 8 * KiB)   # within a page, aligned
        if off + n > size:
            off = size - n
        if rng.random() < c["unaligned"]:
            off = min(size - 1, off + rng.randrange(1, SECTOR))
            n = max(1, min(n - rng.randrange(0, SECTOR), size - off))
        self.cursor = (off + n) % size // SECTOR * SECTOR
        fua = (kind in ("write", "zero") and self.caps.get("fua", True) and
               rng.random() < 0.1)
        return kind, off, n, fua

    def run(self):
        try:
            self.loop()
        except Failure as e:
            self.seg.fail(e.kind, "%s: %s" % (self.name, e))
        except Exception:
            self.seg.fail("error", "%s crashed:\n%s" % (
                self.name, traceback.format_exc()))
        finally:
            self.close()

    def close(self):
        if self.h is not None:
            T.shutdown_quietly(self.h)
            self.h = None       # the last reference closes it

    def loop(self):
        seg = self.seg
        while True:
            gen = seg.gate(self)
            if gen is None:
                return
            if gen != self.gen:
                self.close()
                try:
                    self.h = seg.server.nbdkit.connect(
                        self.export, "chaos-%d" % self.no)
                except nbd.Error as e:
                    with seg.lock:
                        if seg.failure or seg.stopping or gen != seg.gen:
                            continue
                    seg.check_alive(5)
                    raise Failure("error", "cannot connect to export %r: "
                                  "%s" % (self.export, e))
                self.gen = gen
                self.caps = self.capabilities()
            self.one()

    def capabilities(self):
        """The requests this connection's server offers."""
        h = self.h
        try:
            return {"zero": h.can_zero(), "trim": h.can_trim(),
                    "flush": h.can_flush(), "cache": h.can_cache(),
                    "fua": h.can_fua()}
        except nbd.Error:
            return {}

    def one(self):
        seg = self.seg
        dom = self.dom
        disk = dom.disk
        kind, off, n, fua = self.gen_op()
        data = None
        if kind == "write":
            data = self.rng.randbytes(n)
        mod = kind in MODIFYING
        with seg.lock:
            while seg.ranges.conflicts(id(dom), off, n, mod):
                if seg.stopping or seg.paused:
                    return
                seg.cond.wait(0.5)
            if seg.stopping or seg.paused or self.gen != seg.gen:
                return
            key = seg.ranges.add(id(dom), off, n, mod) if kind != "flush" \
                else None
            w = tok = None
            if mod:
                w = disk.begin(kind, off, n, data, fua)
                if dom.mode != "writethrough" and dom.mode != "writearound":
                    dom.exact = False
                if dom.drain is not None:
                    dom.drain = False
            elif kind == "flush":
                tok = disk.flush_begin()
            wid = seg.watch_begin("%s %s off=%d len=%d%s" % (
                self.name, kind, off, n, " FUA" if fua else ""))
        err = None
        got = None
        flags = nbd.CMD_FLAG_FUA if fua else 0
        h = self.h
        try:
            if kind == "read":
                got = h.pread(n, off)
            elif kind == "write":
                h.pwrite(data, off, flags)
            elif kind == "zero":
                h.zero(n, off, flags)
            elif kind == "trim":
                h.trim(n, off, flags)
            elif kind == "flush":
                h.flush()
            elif kind == "cache":
                h.cache(n, off)
        except nbd.Error as e:
            err = e
        with seg.lock:
            seg.watch_end(wid)
            seg.trace.append((time.monotonic(), self.no, self.export, kind,
                              off, n, fua, "lost" if self.gen != seg.gen
                              else "error" if err else "ok",
                              T.zlib.crc32(data) if data else None))
            if key is not None:
                seg.ranges.remove(key)
            seg.cond.notify_all()
            if self.gen != seg.gen or seg.killing:
                # The server was killed under this request: it stays in
                # flight in the model (disk.rebase voids it).
                return
            seg.count("ops")
            if err is not None:
                self.error(kind, off, n, err)
                if w is not None:
                    disk.end(w, False)
                return
            if w is not None:
                disk.end(w, True)
            elif tok is not None:
                disk.flush_end(tok)
            elif kind == "read":
                bad = disk.check_read(off, got)
                seg.count("reads_checked")
                if bad:
                    raise Failure("wrong read", "read of %s off=%d len=%d "
                                  "returned wrong data:\n  %s" % (
                                      self.name_of(), off, n,
                                      "\n  ".join(str(b) for b in bad)))

    def name_of(self):
        return "export %r (connection %d)" % (self.export, self.no)

    def error(self, kind, off, n, e):
        seg = self.seg
        seg.count("errors")
        if seg.faults_seen:
            seg.check_alive()
            return
        seg.check_alive(5)
        raise Failure("error", "%s %s off=%d len=%d failed with no fault "
                      "injected: %s" % (self.name_of(), kind, off, n, e))


class Segment:
    def __init__(self, run, no, seed, cfg):
        self.run = run
        self.args = run.args
        self.no = no
        self.seed = seed
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.dir = os.path.join(run.workdir, "seg%03d" % no)
        os.makedirs(self.dir)
        self.cache = os.path.join(self.dir, "cache.ssdcache")
        self.ctlsock = os.path.join(self.dir, "ctl.sock")
        self.berr_trigger = os.path.join(self.dir, "backend-errors.on")
        self.cfault_trigger = os.path.join(self.dir, "cache-faults.on")
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.ranges = T.RangeTable()
        self.counts = dict.fromkeys(COUNTS, 0)
        self.failure = None
        self.stopping = False
        self.paused = False
        self.killing = False
        self.disconnect = False
        self.gen = 0
        self.nparked = 0
        self.faults_seen = False
        self.watch = {}
        self.watch_no = itertools.count(1)
        # The last requests and driver actions, for failure reports.
        self.trace = collections.deque(maxlen=50000)
        self.t0 = time.monotonic()
        self.server = Server(self)
        self.workers = []

    # -- bookkeeping -----------------------------------------------------------

    def count(self, k, n=1):
        self.counts[k] += n

    def watch_begin(self, what, key=None):
        """Start timing an activity for the watchdog (lock held or not:
        dict operations are atomic enough)."""
        if key is None:
            key = next(self.watch_no)
        self.watch[key] = (what, time.monotonic())
        return key

    def watch_end(self, key):
        self.watch.pop(key, None)

    def fail(self, kind, msg):
        """Record the first failure; stop the segment."""
        with self.lock:
            first = self.failure is None
            if first:
                self.failure = (kind, msg)
                self.count({"hang": "hangs", "wrong read": "wrong_reads",
                            "contract": "violations"}.get(kind, "errors"))
            self.stopping = True
            self.cond.notify_all()
        if first:
            hist = self.history_of(msg)
            if hist:
                msg += "\n" + hist
                with self.lock:
                    self.failure = (kind, msg)
            self.run.write_log("FAILURE (%s) in segment %d:\n%s" % (
                kind, self.no, msg))

    def check_alive(self, wait=0):
        """nbdkit must not die unless the driver kills it: a crash is a
        failure, with the end of its log.  wait: how long a dying nbdkit
        may take to exit (an abort dumps core first)."""
        srv = self.server.nbdkit
        if srv is None or self.killing:
            return
        try:
            rc = srv.proc.wait(wait) if wait else srv.proc.poll()
        except Exception:
            rc = None
        if rc is not None:
            raise Failure("crash", "nbdkit exited by itself (status %d):\n%s"
                          % (rc, srv.log_tail(60)))

    def note(self, what):
        """A driver action, in the trace."""
        self.trace.append((time.monotonic(), -1, None, what, 0, 0, False,
                           "", None))

    def history_of(self, msg):
        """The requests (and driver actions) since the segment began that
        touched any byte of the first sector named in msg, for the
        report."""
        import re
        m = re.search(r"sector (\d+) \(offset (\d+)\)", msg)
        if not m:
            return ""
        off = int(m.group(2))
        lines = []
        for t, who, export, kind, o, n, fua, res, crc in list(self.trace):
            if who < 0:
                lines.append("  %8.3f driver: %s off=0" % (t - self.t0,
                                                           kind))
            elif (o < off + SECTOR and off < o + n) or \
                    (kind == "flush" and res == "ok"):
                lines.append("  %8.3f conn %d %r: %s off=%d len=%d%s %s%s" % (
                    t - self.t0, who, export, kind, o, n, " FUA" if fua
                    else "", res, " crc32 %08x" % crc if crc is not None
                    else ""))
        # Flushes and driver actions are many: the requests that touched
        # the offset, and the last 40 flushes and actions.
        keep = set(i for i, l in enumerate(lines) if "off=%d" % 0 not in l
                   or " read " in l or " write " in l)
        rest = [i for i, l in enumerate(lines) if i not in keep]
        keep.update(rest[-40:])
        return "history of offset %d (seconds into the segment; the " \
            "requests that touched it, the last flushes and driver " \
            "actions):\n%s" % (off, "\n".join(
                lines[i] for i in sorted(keep)[-120:]))

    def hang(self, what):
        """Something took too long: stacks, log, then kill nbdkit so that
        every thread gets unstuck."""
        srv = self.server.nbdkit
        stacks = srv.stacks() if srv and srv.alive() else \
            "(nbdkit not running)"
        tail = srv.log_tail(80) if srv else ""
        self.fail("hang", "%s took longer than %d s\nnbdkit stacks:\n%s\n"
                  "last lines of nbdkit's log:\n%s" % (
                      what, self.args.hang_seconds, stacks, tail))
        with self.lock:
            self.killing = True
            self.gen += 1
        if srv:
            srv.kill()

    # -- the workers' gate -----------------------------------------------------

    def gate(self, w):
        """Where a worker waits while the driver pauses them; the server
        generation to use, or None to end."""
        with self.lock:
            if not (self.paused or self.killing or self.stopping):
                return self.gen
            disconnect = self.disconnect
        if disconnect:
            # nbdkit 1.32 does not exit on SIGTERM while a client is
            # connected: a clean stop needs every client gone.
            w.close()
            w.gen = -1
        with self.lock:
            w.parked = True
            self.nparked += 1
            self.cond.notify_all()
            while (self.paused or self.killing) and not self.stopping:
                self.cond.wait(1.0)
            self.nparked -= 1
            w.parked = False
            return None if self.stopping else self.gen

    def pause(self, disconnect=False):
        """Park every worker: their requests in flight end first (or
        fail, when the caller killed nbdkit).  disconnect: they close
        their connections too."""
        with self.lock:
            self.paused = True
            self.disconnect = disconnect
            self.cond.notify_all()
        deadline = time.monotonic() + self.args.hang_seconds + 30
        with self.lock:
            while self.nparked < len(self.workers) and self.failure is None:
                if time.monotonic() > deadline:
                    break
                self.cond.wait(0.5)

    def resume(self):
        with self.lock:
            self.paused = False
            self.killing = False
            self.disconnect = False
            self.cond.notify_all()

    # -- set-up ------------------------------------------------------------------

    def setup(self):
        c = self.cfg
        rng = self.rng
        p = c["plugin"]
        self.domain_of = {}
        self.domains = []

        def image(path):
            data = bytearray(c["size"])
            # Random data in some chunks, zeroes (holes) elsewhere.
            chunk = 1 * MiB
            for off in range(0, c["size"], chunk):
                if rng.random() < 0.6:
                    data[off:off + chunk] = rng.randbytes(chunk)
            with open(path, "wb") as f:
                f.write(data)
            return bytes(data)

        if p == "dir":
            d = os.path.join(self.dir, "disks")
            os.makedirs(d)
            for name in c["names"]:
                path = os.path.join(d, name)
                dom = Domain([name], T.Disk(image(path), name), path)
                self.domains.append(dom)
                self.domain_of[name] = dom
            self.plugin_args = ["file", "dir=" + d]
        else:
            if p == "curl":
                www = os.path.join(self.dir, "www")
                os.makedirs(www)
                path = os.path.join(www, "disk.img")
            else:
                path = os.path.join(self.dir, "disk.img")
            data = image(path)
            # One disk under every name, whatever the filter makes of
            # the names (one cache; or, before issue 27's fix and without
            # ssdcache-exports=one, a cache per name: item 4).
            dom = Domain(list(c["names"]), T.Disk(data), path)
            self.domains.append(dom)
            for name in c["names"]:
                self.domain_of[name] = dom
            if p == "file":
                self.plugin_args = ["file", path]
            elif p == "ssh":
                self.plugin_args = self.run.sshd().plugin_args(path)
            else:
                self.plugin_args = ["curl",
                                    self.run.httpd(www).url("disk.img")]
        self.domains[0].steered = True
        for i in range(c["conns"]):
            name = c["names"][i % len(c["names"])]
            self.workers.append(Worker(self, i, name, random.Random(
                self.seed * 7919 + i)))

    # -- the server's life ---------------------------------------------------------

    def start_server(self, mode, backend, verify=False):
        """Start nbdkit in mode and attach the exports in order (the
        control socket steers the first).  backend: "fresh" (the backing
        store holds every completed write), "recovering" (after a kill,
        on the same cache: the flush history goes on) or "unknown".
        verify: with ssdcache-verify=lazy."""
        for t in (self.cfault_trigger, self.berr_trigger):
            _unlink(t)
        self.faults_seen = False
        if verify:
            self.count("verify_starts")
        self.server.start(mode, verify)
        for dom in self.domains:
            dom.mode = mode
            dom.switching = False
            dom.drain = None
            try:
                dom.anchor = self.server.nbdkit.connect(dom.names[0],
                                                        "anchor")
            except nbd.Error as e:
                raise Failure("error", "cannot connect to export %r: %s\n%s"
                              % (dom.names[0], e,
                                 self.server.nbdkit.log_tail()))
            # A start in writethrough or writearound writes every dirty
            # page back before serving.
            fresh = backend == "fresh" or mode != "writeback"
            dom.exact = fresh
            if self.cfg["order"] != "flush" or mode != "writeback" or \
               self.cfg["plugin"] == "curl":
                dom.disk.stop_order()
            elif fresh:
                dom.disk.track_order()
            elif backend != "recovering":
                dom.disk.stop_order()

    def close_anchors(self):
        for dom in self.domains:
            if dom.anchor is not None:
                T.shutdown_quietly(dom.anchor)
                dom.anchor = None

    def read_export(self, dom):
        """The whole export through the domain's anchor handle."""
        wid = self.watch_begin("full read of export %r" % dom.names[0])
        try:
            return T.read_all(dom.anchor, dom.disk.size)
        except T.ReadError as e:
            if self.faults_seen:
                raise e.error
            raise Failure("error", "reading back export %r at %d failed: "
                          "%s" % (dom.names[0], e.off, e.error))
        finally:
            self.watch_end(wid)

    def backing(self, dom):
        with open(dom.backing, "rb") as f:
            return f.read()

    def apply_losses(self):
        """What the server declared lost is anything from now on, in
        every domain (the log does not say which export), and the flush
        order is broken for it."""
        for lo, hi in self.server.lost_ranges():
            for dom in self.domains:
                dom.disk.forget(lo, hi)
                dom.disk.stop_order()

    def check_backing(self, dom, when):
        """The backing store alone against what the contract allows for
        the domain's state; returns what was checked."""
        disk = dom.disk
        if self.cfg["plugin"] == "curl":
            return "read only"
        data = self.backing(dom)
        if dom.exact or (dom.mode in ("writethrough", "writearound") and
                         not dom.switching):
            bad = disk.check_current(data, flight=True)
            what = "every completed write"
        elif dom.mode == "writeback" and disk.history is not None:
            k, bad = disk.check_order(data)
            what = "a flush point (%s)" % (
                "flush %d" % k if k is not None else "none")
        else:
            return "nothing promised"
        if bad:
            raise Failure("contract", "%s: the backing file of export %r "
                          "breaks the contract (it must hold %s; mode %s, "
                          "order %s):\n  %s" % (
                              when, dom.names[0], what, dom.mode,
                              self.cfg["order"],
                              "\n  ".join(str(b) for b in bad)))
        return what

    # -- the driver's actions --------------------------------------------------------

    def ctl(self, *cmd):
        srv = self.server.nbdkit
        key = self.watch_begin("control command %s" % " ".join(cmd))
        try:
            while True:
                # The watchdog takes the stacks and kills nbdkit at
                # --hang-seconds; this timeout is a backstop.
                r = T.ctl(self.ctlsock, *cmd,
                          timeout=self.args.hang_seconds + 180)
                if not T.ctl_unreachable(r) or not srv.alive():
                    return r
                # The socket of a lazily attached export comes with it.
                if time.monotonic() - self.watch[key][1] > \
                        self.args.hang_seconds:
                    raise Failure("hang", "the control socket never "
                                  "answered: %s" % r)
                _wait_exit(srv, 0.05)
        except T.Hang as e:
            self.watch_end(key)
            self.hang(str(e))
            raise Failure("hang", str(e))
        finally:
            self.watch_end(key)

    def act(self, what):
        c = self.cfg
        rng = self.rng
        dom = next(d for d in self.domains if d.steered)
        if what == "mode":
            m = rng.choice([x for x in MODES if x != dom.mode] or MODES)
            if c["plugin"] == "curl":
                m = rng.choice(["writethrough", "writearound"])
            item1 = self.args.focus == "item1" and c["cfault"]
            if item1:
                # Issue 27 item 1: pages made and rewritten (copied on
                # write) in writeback, then the cache file fails under
                # writethrough.  Faults only there: the first fault
                # puts the cache in degraded mode.
                m = "writethrough" if dom.mode == "writeback" else \
                    "writeback"
                _unlink(self.cfault_trigger)
            with self.lock:
                dom.switching = True
                if m == "writeback":
                    dom.exact = dom.exact and not self.ranges.modifying(
                        id(dom))
                if m == "writeback" and c["order"] == "flush" and \
                   dom.mode in ("writethrough", "writearound") and \
                   c["plugin"] != "curl":
                    # The backend holds everything now; a write that
                    # completes during the switch may already be cached
                    # (dirty), so the history starts here, not once the
                    # switch is done.
                    dom.disk.track_order()
            r = self.ctl("mode", m)
            self.count("mode_switches")
            with self.lock:
                dom.switching = False
                if r.ok:
                    old = dom.mode
                    dom.mode = m
                    if m != "writeback":
                        # Leaving writeback writes everything back first.
                        dom.exact = True
                        dom.disk.stop_order()
                    elif old not in ("writethrough", "writearound",
                                     "writeback"):
                        dom.disk.stop_order()       # from an unknown mode
                else:
                    # A refused or failed switch: the mode is not known.
                    dom.mode = None
                    dom.exact = False
            if item1 and r.ok and m == "writethrough":
                with self.lock:
                    self.faults_seen = True
                open(self.cfault_trigger, "w").close()
                self.count("faults")
            return "mode %s: %s" % (m, "ok" if r.ok else r.err.strip())
        if what in ("drain", "drain_wait"):
            with self.lock:
                dom.drain = not self.ranges.modifying(id(dom))
            r = self.ctl("drain", "--wait") if what == "drain_wait" else \
                self.ctl("drain")
            with self.lock:
                if r.ok and what == "drain_wait" and dom.drain:
                    dom.exact = True
                    if dom.disk.history is not None:
                        dom.disk.track_order()
                dom.drain = None
            return "%s: %s" % (what, "ok" if r.ok else r.err.strip())
        if what == "invalidate":
            if rng.random() < 0.5:
                r = self.ctl("invalidate")
            else:
                off = rng.randrange(0, dom.disk.size, SECTOR)
                r = self.ctl("invalidate", str(off),
                             str(rng.randint(1, 64) * c["page"]))
            return "invalidate: %s" % ("ok" if r.ok else r.err.strip())
        if what == "status":
            r = self.ctl(rng.choice(["status", "stats"]))
            if not r.ok:
                raise Failure("error", "ctl status failed: %s" % r)
            return "status"
        if what in ("cfault", "berr"):
            t = self.cfault_trigger if what == "cfault" else \
                self.berr_trigger
            if os.path.exists(t):
                os.unlink(t)
                return "%s off" % what
            with self.lock:
                self.faults_seen = True
            open(t, "w").close()
            self.count("faults")
            return "%s on" % what
        if what == "restart":
            return self.restart(clean=True)
        if what in ("kill", "quiet_kill"):
            return self.restart(clean=False, quiet=what == "quiet_kill")
        raise ValueError(what)

    def degraded(self):
        """Is the steered cache degraded (every request around it after cache
        device errors)?"""
        r = self.ctl("status")
        for line in r.out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() == "degraded":
                return v.strip() not in ("0", "")
        return False

    def next_mode(self):
        if self.cfg["plugin"] == "curl":
            return "writethrough"
        if self.rng.random() < 0.6:
            return self.args.mode or self.cfg["mode"]
        return self.rng.choice(MODES)

    def restart(self, clean, quiet=False):
        """Stop (SIGTERM) or kill (-9) nbdkit, check, start it again."""
        c = self.cfg
        rng = self.rng
        srv = self.server.nbdkit
        mode = self.next_mode()
        if clean or quiet:
            self.pause(disconnect=clean)
            if self.failure:
                return "paused into a failure"
        if quiet:
            # Nothing in flight: after the drain the backend is current.
            self.act("drain_wait")
        if clean:
            current = self.stop_clean()
            self.start_server(mode, "fresh" if current else "unknown",
                              self.server.asks_verify())
            for dom in self.domains:
                got = self.read_export(dom)
                bad = dom.disk.check_current(got, flight=False)
                if bad:
                    raise Failure("wrong read", "after a clean restart in %s "
                                  "mode export %r lost completed writes:"
                                  "\n  %s" % (mode, dom.names[0],
                                              "\n  ".join(str(b)
                                                          for b in bad)))
            self.count("restarts")
            self.resume()
            return "clean restart in %s" % mode
        # kill -9
        with self.lock:
            self.killing = True
            self.gen += 1
        self.close_anchors()
        srv.kill()
        self.count("kills")
        self.pause()
        if self.failure:
            return "killed into a failure"
        checked = []
        deletable = c["plugin"] != "curl"
        self.apply_losses()
        for dom in self.domains:
            what = self.check_backing(dom, "after kill -9")
            checked.append(what)
            if what == "nothing promised":
                deletable = False
        delete = deletable and rng.random() < 0.3
        if delete:
            for f in os.listdir(self.dir):
                if f.startswith("cache.ssdcache"):
                    os.unlink(os.path.join(self.dir, f))
        self.start_server(mode, "fresh" if delete else "recovering",
                          not delete and self.server.asks_verify())
        for dom in self.domains:
            got = self.read_export(dom)
            if delete:
                bad = [] if got == self.backing(dom) else [
                    "the export differs from its backing file with no "
                    "cache"]
            else:
                bad = dom.disk.check_after_crash(got)
            if bad:
                raise Failure("wrong read", "after kill -9 and a restart in "
                              "%s mode export %r holds data that is neither "
                              "durable nor written since:\n  %s" % (
                                  mode, dom.names[0],
                                  "\n  ".join(str(b) for b in bad)))
            if mode != "writeback" and c["plugin"] != "curl" and \
               not delete:
                # A start in writethrough or writearound writes every
                # dirty page back before serving: the backing file must
                # read as the export (trimmed sectors aside: their data
                # is anything, and the cache may keep another copy).
                back = self.backing(dom)
                if back != got:
                    bad = [T.Mismatch(s, bytes(got[s * SECTOR:(s + 1) *
                                                  SECTOR]),
                                      back[s * SECTOR:(s + 1) * SECTOR])
                           for s in range(dom.disk.nsect)
                           if back[s * SECTOR:(s + 1) * SECTOR] !=
                           got[s * SECTOR:(s + 1) * SECTOR] and
                           dom.disk.crash_value(s) is not T.ANY]
                    if bad:
                        raise Failure("contract", "restarted in %s mode "
                                      "after kill -9: the backing file of "
                                      "export %r differs from the export "
                                      "(expected: the export):\n  %s" % (
                                          mode, dom.names[0], "\n  ".join(
                                              str(b) for b in bad[:8])))
            dom.disk.rebase(got)
            if delete and c["order"] == "flush" and mode == "writeback":
                dom.disk.track_order()
        self.count("restarts")
        self.resume()
        return "kill -9 (backend: %s)%s, restart in %s" % (
            "; ".join(checked), ", cache deleted" if delete else "", mode)

    # -- running -------------------------------------------------------------------

    def watchdog(self):
        while not self.done.wait(0.5):
            now = time.monotonic()
            for key, (what, t0) in list(self.watch.items()):
                if now - t0 > self.args.hang_seconds and \
                   self.failure is None:
                    self.hang(what)
                    return

    def run_segment(self, seconds):
        c = self.cfg
        self.done = threading.Event()
        self.setup()
        t0 = time.monotonic()
        wd = threading.Thread(target=self.watchdog, daemon=True)
        wd.start()
        actions = []
        try:
            self.start_server(c["mode"], "fresh")
            for w in self.workers:
                w.start()
            end = t0 + seconds
            acts = {k: v for k, v in c["actions"].items() if v}
            while time.monotonic() < end and self.failure is None:
                self.done.wait(self.rng.uniform(0.2, 2) * c["interval"])
                if self.failure is not None or time.monotonic() >= end:
                    break
                what = _weighted(self.rng, acts)
                self.note("begin " + what)
                res = self.act(what)
                self.note(res)
                actions.append(res)
                if c["cfault"] and self.failure is None and \
                   self.degraded() and self.rng.random() < 0.7:
                    # A degraded cache sends all around it until nbdkit
                    # restarts: restart it so the rest of the segment
                    # tests a cache again.
                    res = self.restart(clean=True)
                    self.note(res)
                    actions.append("degraded: " + res)
                if self.args.verbose:
                    log("segment %d: %s" % (self.no, res))
                self.run.write_log("segment %d: %s" % (self.no, res))
            if self.failure is None:
                self.finish()
        except Failure as e:
            self.fail(e.kind, str(e))
        except Exception:
            self.fail("error", "driver crashed:\n" + traceback.format_exc())
        finally:
            with self.lock:
                self.stopping = True
                self.cond.notify_all()
            if self.server.nbdkit and self.server.nbdkit.alive() and \
               self.failure is not None:
                self.server.nbdkit.kill()
            for w in self.workers:
                if w.is_alive():
                    w.join(self.args.hang_seconds + 30)
            self.close_anchors()
            if self.server.nbdkit:
                self.server.nbdkit.kill()
            self.done.set()
        return time.monotonic() - t0

    def stop_clean(self):
        """With the clients paused and disconnected: stop nbdkit with
        SIGTERM (writeback-on-exit=true, the default, writes everything
        back).  The backing store must then hold every completed write,
        unless faults were injected in this server's life, or a domain
        in writeback was not drained first with a slow backend (the
        delay filter aborts its sleeps at shutdown: writeback at exit
        fails and the dirty data stays in the cache, as documented).
        Returns whether the backing store is known to hold everything."""
        c = self.cfg
        for t in (self.cfault_trigger, self.berr_trigger):
            _unlink(t)
        slow = c["delay_write"] or c["delay_read"]
        drained = set()
        for dom in self.domains:
            if dom.steered and dom.mode == "writeback" and slow:
                with self.lock:
                    dom.drain = True
                if self.ctl("drain", "--wait").ok:
                    drained.add(id(dom))
                dom.drain = None
        faulted = self.faults_seen
        self.close_anchors()
        srv = self.server.nbdkit
        key = self.watch_begin("SIGTERM")
        try:
            rc = srv.stop(timeout=self.args.hang_seconds + 180, stacks=False)
        except T.Hang as e:
            raise Failure("hang", str(e))
        finally:
            self.watch_end(key)
        with self.lock:
            self.gen += 1
        if rc != 0:
            raise Failure("error", "nbdkit exited with status %d after "
                          "SIGTERM\n%s" % (rc, srv.log_tail()))
        current = not faulted
        self.apply_losses()
        for dom in self.domains:
            dom.disk.clean_stop()
            if faulted or c["plugin"] == "curl":
                continue
            if slow and dom.mode != "writethrough" and \
               dom.mode != "writearound" and id(dom) not in drained:
                current = False
                continue
            bad = dom.disk.check_current(self.backing(dom), flight=False)
            if bad:
                raise Failure("contract", "after a clean stop the backing "
                              "file of export %r lacks completed writes "
                              "(mode %s):\n  %s" % (
                                  dom.names[0], dom.mode,
                                  "\n  ".join(str(b) for b in bad)))
        return current

    def finish(self):
        """Stop the clients, stop nbdkit cleanly: the backing store must
        hold everything (see stop_clean)."""
        self.pause(disconnect=True)
        if self.failure:
            return
        self.stop_clean()


def _wait_exit(srv, secs):
    """Wait up to secs for nbdkit to exit (a pause between tries that
    ends early if it does)."""
    try:
        srv.proc.wait(secs)
    except Exception:
        pass


def _unlink(p):
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass


# -- the run ------------------------------------------------------------------------

class Run:
    def __init__(self, args):
        self.args = args
        self.workdir = args.workdir
        self.logfile = os.path.join(self.workdir, "chaos.log")
        self._sshd = None
        self._httpd = None
        self.totals = None

    def write_log(self, msg):
        with open(self.logfile, "a") as f:
            f.write(time.strftime("%H:%M:%S ") + msg + "\n")

    def sshd(self):
        if self._sshd is None:
            self._sshd = T.Sshd(self.workdir)
            self._sshd.start()
        return self._sshd

    def httpd(self, docroot):
        # One lighttpd per segment that uses curl (its own docroot).
        if self._httpd is not None:
            self._httpd.stop()
        self._httpd = T.Httpd(os.path.dirname(docroot), docroot)
        self._httpd.start()
        return self._httpd

    def stop_daemons(self):
        for d in (self._sshd, self._httpd):
            if d is not None:
                d.stop()

    def segment_seed(self, i):
        h = hashlib.sha256(("%d/%d" % (self.args.seed, i)).encode())
        return int.from_bytes(h.digest()[:6], "little")

    def replay(self, seg):
        a = self.args
        cmd = "%s --segment-seed %d --iterations 1 --segment-seconds %g" % (
            os.path.abspath(__file__), seg.seed, self.seconds_of(seg))
        for opt in ("mode", "order", "plugin", "focus"):
            if getattr(a, opt):
                cmd += " --%s %s" % (opt, getattr(a, opt))
        if a.size:
            cmd += " --size %d" % (a.size // MiB)
        if a.one_cache:
            cmd += " --one-cache"
        if a.hang_seconds != 30:
            cmd += " --hang-seconds %d" % a.hang_seconds
        return cmd

    def seconds_of(self, seg):
        return seg.seconds

    def main(self):
        a = self.args
        totals = dict.fromkeys(COUNTS, 0)
        self.totals = totals
        t_end = time.monotonic() + a.minutes * 60 if a.minutes else None
        i = 0
        failed = None
        t0 = time.monotonic()
        log("seed %d, workdir %s%s" % (
            a.seed, self.workdir, ", focus " + a.focus if a.focus else ""))
        while True:
            if a.iterations is not None and i >= a.iterations:
                break
            if t_end is not None and time.monotonic() >= t_end:
                break
            seed = a.segment_seed if a.segment_seed is not None else \
                self.segment_seed(i)
            cfg = choose_config(random.Random(seed), a)
            seg = Segment(self, i, seed, cfg)
            rng = random.Random(seed ^ 0x5eed)
            seg.seconds = a.segment_seconds or rng.choice([10, 20, 30, 45])
            if t_end is not None:
                seg.seconds = max(5, min(seg.seconds,
                                         t_end - time.monotonic()))
            self.write_log("segment %d seed %d: %s" % (i, seed,
                                                      describe(cfg)))
            took = seg.run_segment(seg.seconds)
            for k in totals:
                totals[k] += seg.counts[k]
            log("segment %d (seed %d, %s/%s, %s, %.0fs): %s" % (
                i, seed, cfg["mode"], cfg["order"], cfg["plugin"], took,
                summary(seg.counts)))
            if seg.failure:
                kind, msg = seg.failure
                print("chaos: FAIL (%s) in segment %d after %.0f s of the "
                      "run\nchaos: seed %d, segment seed %d\nchaos: "
                      "configuration: %s\nchaos: replay: %s\n%s" % (
                          kind, i, time.monotonic() - t0, a.seed, seed,
                          describe(cfg), self.replay(seg), msg),
                      file=sys.stderr, flush=True)
                failed = kind
                break
            i += 1
        log("%s: seed %d, %d segment(s) in %.0f s: %s" % (
            "FAIL" if failed else "PASS", a.seed, i + (1 if failed else 0),
            time.monotonic() - t0, summary(totals)))
        return 1 if failed else 0


# What a segment and a run count (summary prints them).
COUNTS = ("ops", "reads_checked", "kills", "restarts", "verify_starts",
          "mode_switches", "faults", "hangs", "wrong_reads", "violations",
          "errors")


def summary(c):
    return ("%d ops, %d reads checked, %d kills, %d restarts (%d with "
            "ssdcache-verify=lazy), %d mode switches, %d faults injected, "
            "%d hangs, %d wrong reads, %d contract violations, %d errors" % (
                c["ops"], c["reads_checked"], c["kills"], c["restarts"],
                c["verify_starts"], c["mode_switches"], c["faults"],
                c["hangs"], c["wrong_reads"], c["violations"],
                c["errors"]))


def main():
    p = argparse.ArgumentParser(
        description="Chaos harness of nbdkit-ssdcache-filter: model-"
        "checked I/O while modes switch, nbdkit restarts and is killed, "
        "and the cache file and the backend fail.")
    p.add_argument("--seed", type=int, default=None,
                   help="the run's seed (default: random, printed)")
    p.add_argument("--segment-seed", type=int, default=None,
                   help="run segments with this seed (a replay)")
    p.add_argument("--minutes", type=float, default=None,
                   help="run for this long (default: 1 segment)")
    p.add_argument("--iterations", type=int, default=None,
                   help="number of segments")
    p.add_argument("--segment-seconds", type=float, default=None,
                   help="length of a segment (default: drawn, 10-45 s)")
    p.add_argument("--mode", choices=MODES, help="start every nbdkit in "
                   "this mode (switches still happen)")
    p.add_argument("--order", choices=ORDERS,
                   help="ssdcache-writeback-order for every segment")
    p.add_argument("--plugin", choices=PLUGINS)
    p.add_argument("--focus", choices=FOCUS,
                   help="weight the draw toward an issue 27 item")
    p.add_argument("--size", type=int, default=None,
                   help="the export size in MiB (default: drawn)")
    p.add_argument("--one-cache", action="store_true",
                   help="always ssdcache-exports=one for plugins that "
                   "serve one disk under every name")
    p.add_argument("--hang-seconds", type=int, default=30,
                   help="a request or command taking longer is a hang "
                   "(default 30)")
    p.add_argument("--filter", default=None,
                   help="the filter (default $SSDCACHE_FILTER or the "
                   "build tree's)")
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true",
                   help="keep the work directory after a failure")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print every driver action")
    a = p.parse_args()
    # kill -USR1 PID prints every thread's Python stack (a harness bug).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1, 1 << 31)
    if a.size:
        a.size *= MiB
    if a.minutes is None and a.iterations is None:
        a.iterations = 1
    a.filter = os.path.abspath(a.filter or T.filter_path())
    if not os.path.isfile(a.filter):
        print("chaos: filter not found: %s" % a.filter, file=sys.stderr)
        return 2
    a.faultio = T.shim_path("faultio")
    if not os.path.isfile(a.faultio):
        print("chaos: shim not built: %s (make check builds it)" % a.faultio,
              file=sys.stderr)
        return 2
    a.have_ssh = T.Sshd.available() and a.plugin in (None, "ssh")
    a.have_curl = T.Httpd.available() and a.plugin in (None, "curl")
    if a.plugin == "ssh" and not a.have_ssh:
        print("chaos: no sshd or nbdkit ssh plugin", file=sys.stderr)
        return 2
    if a.plugin == "curl" and not a.have_curl:
        print("chaos: no lighttpd or nbdkit curl plugin", file=sys.stderr)
        return 2
    made = a.workdir is None
    if made:
        a.workdir = tempfile.mkdtemp(prefix="ssdcache-chaos.",
                                     dir=os.environ.get("TMPDIR", "/var/tmp"))
    os.makedirs(a.workdir, exist_ok=True)
    a.workdir = os.path.abspath(a.workdir)
    run = Run(a)
    rc = 2
    try:
        rc = run.main()
    except T.EnvError as e:
        print("chaos: environment: %s" % e, file=sys.stderr)
        rc = 2
    finally:
        T.kill_all()
        run.stop_daemons()
        if rc == 0 or not a.keep:
            if made or rc == 0:
                shutil.rmtree(a.workdir, ignore_errors=True)
        else:
            print("chaos: work directory kept: %s (chaos.log, seg*/nbdkit."
                  "log)" % a.workdir, file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
