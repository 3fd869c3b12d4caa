#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter tests: random I/O verified against a model.
#
# Opens one or more NBD connections (to one or more servers) and issues
# random reads, writes, zeroes, trims, flushes and cache (prefetch)
# requests at unaligned offsets, round-robin over the connections and
# with several requests in flight per connection.  A model of the
# expected export contents is kept (ssdtest.Disk, tests/ssdtest.py);
# every read is checked against it, and at the end the whole export is
# read back and checked.
# Exits 0 when everything matched, 1 on any mismatch or request error,
# 2 on a usage error.
#
# Requests that could change data never overlap another request in
# flight, so the expected contents of every byte are always known (a
# trimmed byte is "unknown" unless --trim-reads-zero says otherwise).
#
# Examples:
#   random-io.py --socket /tmp/s --connections 2 --model backing.img \
#                --ops 2000 --seed 1 --save-model /tmp/expected.img
#   random-io.py --uri "$uri" --model-zero --mix read=1 --ops 100
#
# For crash tests, --durable-model FILE keeps in FILE what the last
# completed flush made durable, and --save-model FILE the final
# expected contents.
#
# Needs the libnbd Python bindings (Debian: python3-libnbd), so run it
# with the system interpreter (/usr/bin/python3).

import argparse
import os
import random
import sys
import time

import nbd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ssdtest as T            # noqa: E402

MODIFYING = ("write", "zero", "trim")
DEFAULT_MIX = "read=55,write=35,zero=4,trim=3,flush=2,cache=1"
KINDS = ("read", "write", "zero", "trim", "flush", "cache")


def parse_size(text):
    """Parse 123, 4K, 64k, 16M, 1G (powers of 1024)."""
    text = text.strip()
    mult = 1
    suffixes = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if text and text[-1].lower() in suffixes:
        mult = suffixes[text[-1].lower()]
        text = text[:-1]
    value = int(text, 0) * mult
    if value < 0:
        raise argparse.ArgumentTypeError("negative size")
    return value


def parse_mix(text):
    mix = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, weight = item.partition("=")
        if name not in KINDS:
            raise argparse.ArgumentTypeError("unknown operation %r" % name)
        mix[name] = float(weight) if weight else 1.0
    if not mix or sum(mix.values()) <= 0:
        raise argparse.ArgumentTypeError("empty operation mix")
    return mix


class Trimmed:
    """Which bytes a trim left undefined, byte by byte: the one thing
    the model (ssdtest.Disk) can not say here.  Disk makes every sector
    a trim touches ANY as a whole, and a later partial write of an ANY
    sector leaves it ANY; random-io.py trims and writes at any byte, and
    checks every byte no trim left undefined.  So a trim (unless it must
    read as zero) leaves the Disk's data alone and is marked here; a
    completed write or zero clears its bytes."""

    def __init__(self, size):
        self.size = size
        self.mask = None            # bytearray, 1 = undefined; lazily

    def mark(self, off, n):
        if self.mask is None:
            self.mask = bytearray(self.size)
        self.mask[off:off + n] = b"\x01" * n

    def clear(self, off, n):
        if self.mask is not None:
            self.mask[off:off + n] = bytes(n)

    def covers(self, off, n):
        """Is any byte of [off, off+n) undefined?"""
        return self.mask is not None and self.mask.find(1, off, off + n) >= 0


def first_diff(m, mask):
    """(offset, expected byte, got byte) of the first byte of Mismatch m
    that its sector's value does not allow, bytes marked in mask (None:
    no byte) aside; None if a value allows every other byte."""
    base = m.sector * T.SECTOR + m.lo
    got = m.got
    n = len(got)
    vals = [m.expected] if isinstance(m.expected, bytes) else \
        sorted(m.expected)
    best = None
    for v in vals:
        exp = v[m.lo:m.lo + n]
        d = None
        pos = 0
        while pos < n and d is None:
            a, b = pos, n           # the next run of defined bytes
            if mask is not None:
                a = mask.find(0, base + pos, base + n) - base
                if a < 0:
                    break
                b = mask.find(1, base + a, base + n) - base
                b = n if b < 0 else b
            if exp[a:b] != got[a:b]:
                j = next(j for j in range(a, b) if exp[j] != got[j])
                d = (base + j, exp[j], got[j])
            pos = b
        if d is None:
            return None
        if best is None or d[0] > best[0]:
            best = d
    return best


class Op:
    __slots__ = ("no", "kind", "off", "n", "flags", "conn", "cookie",
                 "buf", "issued", "snapshot")

    def __init__(self, no, kind, off, n, flags):
        self.no = no
        self.kind = kind
        self.off = off
        self.n = n
        self.flags = flags
        self.conn = None
        self.cookie = None
        self.buf = None
        self.issued = 0.0
        self.snapshot = None

    def __str__(self):
        f = []
        if self.flags & nbd.CMD_FLAG_FUA:
            f.append("fua")
        if self.flags & nbd.CMD_FLAG_NO_HOLE:
            f.append("no_hole")
        return "op #%d %s off=%d len=%d conn=%s%s" % (
            self.no, self.kind, self.off, self.n, self.conn,
            (" flags=" + "|".join(f)) if f else "")

    def overlaps(self, other):
        if self.kind == "flush" or other.kind == "flush":
            return False
        return self.off < other.off + other.n and other.off < self.off + self.n


class Runner:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.handles = []
        self.inflight = []          # list of Op
        self.counts = {k: 0 for k in KINDS}
        self.bytes = {k: 0 for k in KINDS}
        self.mismatches = 0
        self.errors = 0
        self.disk = None            # ssdtest.Disk: the expected contents
        self.trimmed = None         # Trimmed: what a trim left undefined
        self.durable_no = -1

    # -- connections -------------------------------------------------

    def connect(self):
        targets = [("uri", u) for u in self.args.uri]
        targets += [("socket", s) for s in self.args.socket]
        if not targets:
            usage("give at least one --uri or --socket")
        n = max(self.args.connections, len(targets))
        for i in range(n):
            kind, where = targets[i % len(targets)]
            h = nbd.NBD()
            h.set_handle_name("random-io-%d" % i)
            if kind == "uri":
                h.connect_uri(where)
            else:
                h.connect_unix(where)
            self.handles.append(h)
        h = self.handles[0]
        self.size = h.get_size()
        for other in self.handles[1:]:
            if other.get_size() != self.size:
                fail("connections disagree on the export size")
        self.caps = {
            "write": not h.is_read_only(),
            "zero": not h.is_read_only() and h.can_zero(),
            "trim": not h.is_read_only() and h.can_trim(),
            "flush": h.can_flush(),
            "cache": h.can_cache(),
            "read": True,
        }
        self.can_fua = h.can_fua()
        info("export size %d, %d connection(s), multi-conn %s, caps %s" % (
            self.size, len(self.handles), h.can_multi_conn(),
            ",".join(k for k, v in sorted(self.caps.items()) if v)))

    # -- model -------------------------------------------------------

    def load_model(self):
        a = self.args
        chosen = [x for x in (a.model, a.model_zero, a.model_export) if x]
        if len(chosen) != 1:
            usage("give exactly one of --model FILE, --model-zero, "
                  "--model-export")
        if a.model:
            with open(a.model, "rb") as f:
                data = f.read()
            if len(data) != self.size:
                fail("model file %s has %d bytes, export has %d" % (
                    a.model, len(data), self.size))
        elif a.model_zero:
            data = bytes(self.size)
        else:
            data = self.read_all(self.handles[0])
        # Disk keeps whole sectors: pad an odd size (the padding is never
        # addressed, and never saved).
        self.disk = T.Disk(bytes(data) + bytes(-len(data) % T.SECTOR))
        self.trimmed = Trimmed(self.size)

    def contents(self):
        """The expected contents now (a trimmed byte as it was before)."""
        return memoryview(self.disk.cur)[:self.size]

    def apply(self, op, ok):
        """Op, a write, zero or trim, completed (ok) or failed (then each
        sector holds the old or the new data, until a read says which).
        Applied to the model only now, begin and end together: no
        crash is checked here, so the model needs nothing of what is in
        flight (two modifying requests in flight never share a byte but
        may share a sector)."""
        kind = op.kind
        if kind == "trim":
            if not self.args.trim_reads_zero:
                self.trimmed.mark(op.off, op.n)
                return
            kind = "zero"
        # fua=True: nothing here needs what the Disk would keep for a
        # crash (its pending values would grow with every write).
        w = self.disk.begin(kind, op.off, op.n, op.buf, fua=True)
        self.disk.end(w, ok)
        if ok:
            self.trimmed.clear(op.off, op.n)

    def check(self, off, got):
        """None if a read of [off, off+len(got)) may return got, else
        (offset, expected byte, got byte) of the first difference."""
        mask = self.trimmed.mask if self.trimmed.covers(off, len(got)) \
            else None
        # With undefined bytes in the range every mismatch is needed:
        # the first ones may be only there.
        limit = 1 if mask is None else len(got) // T.SECTOR + 2
        for m in self.disk.check_read(off, got, limit):
            bad = first_diff(m, mask)
            if bad is not None:
                return bad
        return None

    def read_all(self, h):
        return T.read_all(h, self.size, chunk=1 << 20)

    # -- generating requests -----------------------------------------

    def gen_op(self, no):
        a = self.args
        rng = self.rng
        kinds = [k for k in a.mix if a.mix[k] > 0]
        kind = rng.choices(kinds, [a.mix[k] for k in kinds])[0]
        if kind == "flush":
            return Op(no, kind, 0, 0, 0)
        size = self.size
        r = rng.random()
        if r < 0.35:
            n = rng.randint(1, min(4096, a.max_len))
        elif r < 0.85:
            n = rng.randint(1, a.max_len)
        else:
            # A multiple of 4K, so whole pages are covered now and then.
            n = max(4096, (rng.randint(1, a.max_len) // 4096) * 4096)
        n = max(1, min(n, size))
        if rng.random() < a.hot_prob and a.hot_fraction > 0:
            region = max(n, int(size * a.hot_fraction))
        else:
            region = size
        off = rng.randint(0, region - n)
        if rng.random() < a.align_prob:
            off -= off % 4096
        flags = 0
        if kind in ("write", "zero") and self.can_fua and \
           rng.random() < a.fua_prob:
            flags |= nbd.CMD_FLAG_FUA
        if kind == "zero" and rng.random() < 0.5:
            flags |= nbd.CMD_FLAG_NO_HOLE
        op = Op(no, kind, off, n, flags)
        if kind == "write":
            op.buf = bytearray(rng.randbytes(n))
        return op

    # -- issuing and completing --------------------------------------

    def conflicts(self, op):
        modifies = op.kind in MODIFYING
        for p in self.inflight:
            if (modifies or p.kind in MODIFYING) and op.overlaps(p):
                return True
        return False

    def busy(self, conn):
        return sum(1 for p in self.inflight if p.conn == conn)

    def issue(self, op, conn):
        h = self.handles[conn]
        op.conn = conn
        op.issued = time.monotonic()
        if self.args.verbose:
            info("issue %s" % op)
        if op.kind == "read":
            op.buf = bytearray(op.n)
            op.cookie = h.aio_pread(nbd.Buffer.from_buffer(op.buf), op.off)
        elif op.kind == "write":
            op.cookie = h.aio_pwrite(nbd.Buffer.from_buffer(op.buf), op.off,
                                     flags=op.flags)
        elif op.kind == "zero":
            op.cookie = h.aio_zero(op.n, op.off, flags=op.flags)
        elif op.kind == "trim":
            op.cookie = h.aio_trim(op.n, op.off)
        elif op.kind == "cache":
            op.cookie = h.aio_cache(op.n, op.off)
        elif op.kind == "flush":
            if self.args.durable_model:
                # Writes completed before the flush is issued are the
                # ones it must make durable.
                op.snapshot = bytes(self.contents())
            op.cookie = h.aio_flush()
        self.inflight.append(op)

    def complete(self, op, error):
        self.inflight.remove(op)
        if error is not None:
            self.errors += 1
            report("ERROR: %s failed: %s" % (op, error))
            if op.kind in MODIFYING:
                self.apply(op, False)
            return
        self.counts[op.kind] += 1
        self.bytes[op.kind] += op.n
        if op.kind == "read":
            bad = self.check(op.off, op.buf)
            if bad is not None:
                self.mismatch(op, bad)
        elif op.kind in MODIFYING:
            self.apply(op, True)
        elif op.kind == "flush" and op.snapshot is not None:
            if op.no > self.durable_no:
                self.durable_no = op.no
                tmp = self.args.durable_model + ".tmp"
                with open(tmp, "wb") as f:
                    f.write(op.snapshot)
                os.rename(tmp, self.args.durable_model)
            op.snapshot = None

    def mismatch(self, op, bad):
        self.mismatches += 1
        if self.mismatches <= 10:
            where, exp, got = bad
            report("MISMATCH: %s: first difference at byte %d "
                   "(page offset %d in a 64K page): expected 0x%02x, got 0x%02x"
                   % (op, where, where % 65536, exp, got))

    def progress(self, timeout):
        """Move I/O forward on every connection, retire what finished;
        True if a connection was ready."""
        ready = T.aio_poll(self.handles, timeout)
        for op in list(self.inflight):
            try:
                done = self.handles[op.conn].aio_command_completed(op.cookie)
            except nbd.Error as e:
                self.complete(op, e)
                continue
            if done:
                self.complete(op, None)
        return ready

    def wait_until(self, cond):
        deadline = time.monotonic() + self.args.timeout
        while not cond():
            if self.progress(1.0):
                deadline = time.monotonic() + self.args.timeout
            elif time.monotonic() > deadline:
                oldest = min(self.inflight, key=lambda p: p.issued)
                fail("no progress for %ds; %d request(s) in flight, oldest "
                     "%s" % (self.args.timeout, len(self.inflight), oldest))

    def too_many_failures(self):
        return self.mismatches + self.errors >= self.args.max_failures

    # -- main loop ---------------------------------------------------

    def run(self):
        a = self.args
        for kind in a.mix:
            if a.mix[kind] > 0 and not self.caps[kind]:
                if a.skip_unsupported:
                    info("server can not %s: skipping it" % kind)
                    a.mix[kind] = 0
                else:
                    fail("the server does not support %s (use "
                         "--skip-unsupported to allow this)" % kind)
        if sum(a.mix.values()) <= 0:
            fail("nothing left to do")
        nconn = len(self.handles)
        start = time.monotonic()
        for no in range(a.ops):
            if self.too_many_failures():
                break
            op = self.gen_op(no)
            conn = no % nconn
            self.wait_until(lambda: not self.conflicts(op)
                            and self.busy(conn) < a.depth)
            self.issue(op, conn)
        self.wait_until(lambda: not self.inflight)
        elapsed = time.monotonic() - start
        if not a.no_final_verify and not self.too_many_failures():
            self.final_verify()
        self.summary(elapsed)
        if a.save_model:
            with open(a.save_model, "wb") as f:
                f.write(self.contents())
            if self.trimmed.covers(0, self.size):
                # Trimmed bytes are undefined: say which, so a caller
                # can ignore them when comparing.
                with open(a.save_model + ".unknown", "wb") as f:
                    f.write(self.trimmed.mask)
                info("%s.unknown marks the undefined (trimmed) bytes with "
                     "0x01" % a.save_model)
        if a.flush_at_end and self.caps["flush"]:
            for h in self.handles:
                h.flush()
        for h in self.handles:
            h.shutdown()
        return 1 if self.mismatches or self.errors else 0

    def final_verify(self):
        """Read everything back, spreading the reads over connections."""
        chunk = 1 << 20
        off = 0
        i = 0
        nconn = len(self.handles)
        while off < self.size:
            n = min(chunk, self.size - off)
            h = self.handles[i % nconn]
            op = Op(-1, "final-read", off, n, 0)
            op.conn = i % nconn
            try:
                data = h.pread(n, off)
            except nbd.Error as e:
                self.errors += 1
                report("ERROR: %s failed: %s" % (op, e))
            else:
                bad = self.check(off, data)
                if bad is not None:
                    self.mismatch(op, bad)
            if self.too_many_failures():
                break
            off += n
            i += 1

    def summary(self, elapsed):
        parts = ["%s=%d (%d bytes)" % (k, self.counts[k], self.bytes[k])
                 for k in KINDS if self.counts[k]]
        info("seed %s: %s in %.2fs; %d mismatch(es), %d error(s)" % (
            self.args.seed, ", ".join(parts) or "nothing", elapsed,
            self.mismatches, self.errors))


def info(msg):
    print("random-io: " + msg, flush=True)


def report(msg):
    print("random-io: " + msg, file=sys.stderr, flush=True)


def fail(msg):
    report("FAIL: " + msg)
    sys.exit(1)


def usage(msg):
    report("usage error: " + msg)
    sys.exit(2)


def main():
    p = argparse.ArgumentParser(
        description="Random NBD I/O verified against a model.")
    p.add_argument("--uri", action="append", default=[],
                   help="NBD URI to connect to (repeatable)")
    p.add_argument("--socket", action="append", default=[],
                   help="Unix socket to connect to (repeatable)")
    p.add_argument("--connections", "-C", type=int, default=2,
                   help="number of connections, spread round-robin over "
                   "the targets (default 2)")
    p.add_argument("--depth", type=int, default=4,
                   help="requests in flight per connection (default 4)")
    p.add_argument("--ops", type=int, default=1000,
                   help="number of random requests (default 1000)")
    p.add_argument("--seed", type=int,
                   default=int(os.environ.get("RANDOM_IO_SEED", "0")) or
                   random.SystemRandom().randint(1, 1 << 30),
                   help="random seed (default: $RANDOM_IO_SEED or random)")
    p.add_argument("--max-len", type=parse_size, default=256 * 1024,
                   help="largest request length (default 256K)")
    p.add_argument("--mix", type=parse_mix, default=parse_mix(DEFAULT_MIX),
                   help="operation weights (default %s)" % DEFAULT_MIX)
    p.add_argument("--model", metavar="FILE",
                   help="initial contents: this file (e.g. a copy of the "
                   "backing file taken before the server started)")
    p.add_argument("--model-zero", action="store_true",
                   help="initial contents: all zero")
    p.add_argument("--model-export", action="store_true",
                   help="initial contents: whatever the export reads now")
    p.add_argument("--save-model", metavar="FILE",
                   help="write the expected final contents to FILE")
    p.add_argument("--durable-model", metavar="FILE",
                   help="each time a flush completes, write to FILE the "
                   "contents it made durable (the model as it was when "
                   "the flush was issued), for crash tests")
    p.add_argument("--trim-reads-zero", action="store_true",
                   help="trimmed bytes must read as zero (default: "
                   "undefined, not checked)")
    p.add_argument("--fua-prob", type=float, default=0.1,
                   help="probability of FUA on writes/zeroes (default 0.1)")
    p.add_argument("--hot-fraction", type=float, default=0.1,
                   help="size of the hot region, a fraction of the export "
                   "(default 0.1)")
    p.add_argument("--hot-prob", type=float, default=0.5,
                   help="probability a request lands in the hot region "
                   "(default 0.5)")
    p.add_argument("--align-prob", type=float, default=0.2,
                   help="probability an offset is rounded down to 4K "
                   "(default 0.2)")
    p.add_argument("--skip-unsupported", action="store_true",
                   help="drop operations the server does not support "
                   "instead of failing")
    p.add_argument("--no-final-verify", action="store_true",
                   help="do not read the whole export back at the end")
    p.add_argument("--flush-at-end", action="store_true",
                   help="flush every connection before disconnecting")
    p.add_argument("--max-failures", type=int, default=20,
                   help="stop after this many mismatches/errors")
    p.add_argument("--timeout", type=int, default=60,
                   help="fail if no request completes for this long")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="print every request")
    args = p.parse_args()
    if args.connections < 1 or args.depth < 1 or args.max_len < 1:
        usage("--connections, --depth and --max-len must be positive")

    r = Runner(args)
    r.connect()
    r.load_model()
    info("seed %d, %d ops, max length %d, mix %s" % (
        args.seed, args.ops, args.max_len,
        ",".join("%s=%g" % kv for kv in args.mix.items())))
    sys.exit(r.run())


if __name__ == "__main__":
    main()
