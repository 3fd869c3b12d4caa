# SPDX-License-Identifier: BSD-3-Clause
"""ssdtest: the shared Python test module of nbdkit-ssdcache-filter.

Everything a Python harness of the project needs, so that each one
does not grow its own copy:

  paths            where the filter, the ssdcache tool and the
                   LD_PRELOAD shims of the build tree are
                   (filter_path, tool_path, shim_path)
  Nbdkit           one nbdkit process: started in the foreground
                   (-f -P PIDFILE -U SOCKET) with its stderr in a log
                   file, ready once a client can connect to it (never
                   by waiting for a file or sleeping), stopped with
                   SIGTERM and waited for (a bound: a hang otherwise),
                   killed with SIGKILL and reaped; the stacks of all
                   its threads (gdb) and the tail of its log;
                   writeback_args, its ssdcache-writeback-* parameters
  read_all         a whole export through a libnbd handle
  shutdown_quietly disconnect a handle whose server may be gone
  aio_poll         one round of libnbd's aio loop over some handles
  ctl              `ssdcache ctl SOCKET CMD...` with a timeout
  Disk             a model of one export: per 512-byte sector the
                   value(s) a read may return now, what a kill -9 may
                   leave, and optionally the flush history that
                   ssdcache-writeback-order=flush promises for the
                   backing store alone (FlushHistory); its checks
                   return Mismatches
  Origins          where a sector's data came from (the writes and
                   starting images of the last rounds), for reports
  RangeTable       which byte ranges have requests in flight, so that
                   a driver never issues overlapping requests of which
                   one modifies (the model stays exact)
  Sshd, Httpd      an OpenSSH server and a lighttpd of the test's own on
                   loopback, for the ssh and curl plugins
  wait_for         poll a condition with a deadline
  crc32c           the checksum of the cache file's format (to forge
                   superblocks and entries in tests)

Conventions: sizes in bytes; a "sector" is 512 bytes; a value of a
sector is its 512 bytes, a frozenset of such values (any of them), or
ANY (anything: trimmed data).  Exceptions: Hang (something took longer
than its bound), StartError, EnvError (the environment lacks
something; a harness may skip), ReadError (read_all), and the
harness's own failures.

Needs Python 3.9+; Nbdkit.connect, Nbdkit.wait_serving and aio_poll
use the libnbd bindings (run with /usr/bin/python3 on Debian).
"""

import errno
import os
import select
import signal
import socket
import subprocess
import time
import zlib

try:
    import nbd
except ImportError:             # the model and the paths work without
    nbd = None

KiB = 1024
MiB = 1024 * KiB
SECTOR = 512


class EnvError(Exception):
    """Something the test needs is missing or unusable (not a bug of
    the filter)."""


class StartError(Exception):
    """nbdkit exited during start-up, or never served."""


class Hang(Exception):
    """A request, a command or a shutdown took longer than its bound."""


# -- where things are ---------------------------------------------------

_HERE = os.path.dirname(os.path.abspath(__file__))


def _builddir():
    d = os.environ.get("abs_top_builddir")
    if d:
        return d
    # Run by hand from the source tree (an in-tree build).
    return os.path.dirname(_HERE)


def filter_path():
    """The filter under test: $SSDCACHE_FILTER or the build tree's."""
    p = os.environ.get("SSDCACHE_FILTER") or os.path.join(
        _builddir(), "filter", ".libs", "nbdkit-ssdcache-filter.so")
    return os.path.abspath(p)


def tool_path():
    """The ssdcache tool: $SSDCACHE_TOOL or the build tree's."""
    p = os.environ.get("SSDCACHE_TOOL") or os.path.join(
        _builddir(), "tools", "ssdcache")
    return os.path.abspath(p)


def shim_path(name):
    """The LD_PRELOAD shim built from tests/shim/NAME.c (make check
    builds it)."""
    return os.path.join(_builddir(), "tests", "shim", ".libs", name + ".so")


# -- waiting --------------------------------------------------------------

def crc32c(data):
    """CRC32C (Castagnoli), as the cache file's format uses it."""
    crc = 0xffffffff
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82f63b78 if crc & 1 else 0)
    return crc ^ 0xffffffff


def wait_for(cond, timeout, what, poll=0.05, event=None):
    """Return once cond() is true; Hang if it is still false after
    timeout seconds.  Between tries it waits poll seconds, or until
    event (a threading.Event) is set."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return
        if time.monotonic() > deadline:
            raise Hang("%s: not done within %g s" % (what, timeout))
        if event is not None:
            event.wait(poll)
        else:
            time.sleep(poll)


# -- nbdkit ---------------------------------------------------------------

def gdb_stacks(pid, timeout=120):
    """Every thread's stack of process pid, as gdb prints them, threads
    with the same stack printed once (or why there are none)."""
    try:
        r = subprocess.run(["gdb", "-batch", "-p", str(pid),
                            "-ex", "thread apply all bt"],
                           stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=timeout)
    except FileNotFoundError:
        return "(no gdb: install it, scripts/deps lists it)"
    except subprocess.TimeoutExpired:
        return "(gdb did not finish within %d s)" % timeout
    out = r.stdout.decode("utf-8", "replace")
    stacks = group_stacks(out)
    return stacks or out + r.stderr.decode("utf-8", "replace")


def group_stacks(text):
    """gdb's "thread apply all bt" output with the threads that have the
    same frames (addresses and arguments aside) printed once."""
    import re
    groups = {}
    order = []
    thread = None
    frames = []

    def done():
        if thread is None:
            return
        key = tuple(re.sub(r"0x[0-9a-f]+ in |\(.*\) (at|from) ", "", f)
                    for f in frames)
        if key not in groups:
            groups[key] = []
            order.append((key, frames))
        groups[key].append(thread)

    for line in text.splitlines():
        if line.startswith("Thread "):
            done()
            m = re.search(r"\(LWP (\d+)\)", line)
            name = re.search(r'"([^"]*)"\):', line)
            thread = "LWP %s%s" % (m.group(1) if m else "?",
                                   " " + name.group(1) if name else "")
            frames = []
        elif line.startswith("#") and thread is not None:
            frames.append(line)
    done()
    out = []
    for key, frames in order:
        who = groups[key]
        out.append("%d thread(s): %s" % (len(who), ", ".join(who[:8]) +
                                         (", ..." if len(who) > 8 else "")))
        out += ["  " + f for f in frames]
    return "\n".join(out)


class Nbdkit:
    """One nbdkit process serving on a Unix socket.

    args: everything after the options this class adds (filters, the
    plugin, parameters).  workdir holds the socket, the pidfile and the
    log (stderr and stdout of nbdkit, appended to across restarts).
    env: extra environment (e.g. LD_PRELOAD).  verbose: -v; debug:
    a list of -D flags ("ssdcache.verbose=1").
    """

    def __init__(self, args, workdir, name="nbdkit", env=None,
                 verbose=False, debug=(), log=None):
        self.args = list(args)
        self.workdir = workdir
        self.name = name
        self.env = dict(env or {})
        self.verbose = verbose
        self.debug = list(debug)
        self.sock = os.path.join(workdir, name + ".sock")
        self.pidfile = os.path.join(workdir, name + ".pid")
        self.log = log or os.path.join(workdir, name + ".log")
        self.proc = None

    def argv(self):
        a = ["nbdkit", "-f", "-P", self.pidfile, "-U", self.sock]
        if self.verbose:
            a.append("-v")
        for d in self.debug:
            a += ["-D", d]
        return a + self.args

    def command(self):
        """The command line, as a shell would take it (for reports)."""
        env = " ".join("%s=%s" % kv for kv in sorted(self.env.items()))
        return (env + " " if env else "") + " ".join(
            _shell_quote(a) for a in self.argv())

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout=60):
        """Start nbdkit and return once it serves; StartError if it
        exits first, Hang if it does not serve within timeout s."""
        self.spawn()
        self.wait_serving(timeout)

    def spawn(self):
        """Start nbdkit and return at once (start waits for it)."""
        for f in (self.sock, self.pidfile):
            try:
                os.unlink(f)        # a killed server leaves them behind
            except FileNotFoundError:
                pass
        env = dict(os.environ)
        env.update(self.env)
        with open(self.log, "ab") as log:
            log.write(("=== %s: %s\n" % (time.strftime("%H:%M:%S"),
                                        self.command())).encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, env=env)
        _LIVE.add(self)

    def wait_serving(self, timeout=60):
        """Wait until a client completes the NBD handshake's start on the
        socket (nbdkit is serving), or the process exits."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self._reaped()
                raise StartError("nbdkit exited with status %d during "
                                 "start-up: %s\n%s" % (
                                     self.proc.returncode, self.command(),
                                     self.log_tail()))
            if self._handshake():
                return
            if time.monotonic() > deadline:
                raise Hang("nbdkit did not serve within %d s: %s" % (
                    timeout, self.command()))
            # Not listening yet: wait for the process a moment (it may
            # exit, which the next round reports).
            try:
                self.proc.wait(0.02)
            except subprocess.TimeoutExpired:
                pass

    def _handshake(self):
        """True if nbdkit answers on the socket with the NBD greeting."""
        if nbd is not None:
            h = nbd.NBD()
            try:
                h.set_opt_mode(True)
                h.connect_unix(self.sock)
                h.opt_abort()
                return True
            except nbd.Error:
                return False
            # (libnbd 1.14 handles have no close(): the last reference
            # closes the connection.)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as so:
            so.settimeout(10)
            try:
                so.connect(self.sock)
                return so.recv(8) == b"NBDMAGIC"
            except OSError:
                return False

    def connect(self, export="", name=None):
        """A new libnbd handle connected to export (synchronous use)."""
        h = nbd.NBD()
        if name:
            h.set_handle_name(name)
        h.set_export_name(export)
        h.connect_unix(self.sock)
        return h

    def stop(self, timeout=30, stacks=True):
        """SIGTERM, and wait for the exit; returns the exit status.  A
        server still running after timeout s is a Hang (its stacks in
        the message when stacks is true); it is killed then."""
        if not self.alive():
            self._reaped()
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            dump = self.stacks() if stacks else ""
            tail = self.log_tail()
            self.kill()
            raise Hang("nbdkit did not exit within %d s of SIGTERM: %s\n"
                       "stacks:\n%s\nlog:\n%s" % (timeout, self.command(),
                                                   dump, tail))
        self._reaped()
        return rc

    def kill(self):
        """SIGKILL, as a crash would, and reap the process."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self._reaped()

    def _reaped(self):
        _LIVE.discard(self)

    def stacks(self):
        """Every thread's stack (gdb), if the process runs."""
        if not self.alive():
            return "(nbdkit is not running)"
        return gdb_stacks(self.proc.pid)

    def log_tail(self, n=40):
        return log_tail(self.log, n)


_WRITEBACK_KNOBS = ("high", "low", "idle", "rate", "depth", "max_age",
                    "seq_cutoff")


def add_epoch_span_option(parser):
    """--epoch-span N, for epoch_span_debug."""
    parser.add_argument("--epoch-span", type=int, default=0,
                        help="-D ssdcache.epoch_span=N: the page table's "
                        "epoch bases move every few syncs")


def epoch_span_debug(span):
    """The debug flag that narrows the page table's epoch span (none
    for 0)."""
    return ["ssdcache.epoch_span=%d" % span] if span else []


def writeback_args(cfg):
    """The ssdcache-writeback-* parameters of a harness's configuration
    (the keys of _WRITEBACK_KNOBS it has, and max_dirty_bytes or
    max_dirty, % of the cache, when not 0)."""
    a = ["ssdcache-writeback-%s=%d" % (k.replace("_", "-"), cfg[k])
         for k in _WRITEBACK_KNOBS if k in cfg]
    if cfg.get("max_dirty_bytes"):
        a.append("ssdcache-writeback-max-dirty=%d" % cfg["max_dirty_bytes"])
    elif cfg.get("max_dirty"):
        a.append("ssdcache-writeback-max-dirty=%d%%" % cfg["max_dirty"])
    return a


class ReadError(Exception):
    """A read of read_all failed: off, n and the nbd.Error."""

    def __init__(self, off, n, error):
        Exception.__init__(self, "reading back [%d, %d) failed: %s" % (
            off, off + n, error))
        self.off = off
        self.n = n
        self.error = error


def read_all(h, size, chunk=4 * MiB):
    """The bytes [0, size) of the export of libnbd handle h, read
    chunk bytes at a time; ReadError if a read fails."""
    out = bytearray()
    for off in range(0, size, chunk):
        n = min(chunk, size - off)
        try:
            out += h.pread(n, off)
        except nbd.Error as e:
            raise ReadError(off, n, e)
    return bytes(out)


def shutdown_quietly(h):
    """Disconnect libnbd handle h; an error (a dead server) is no
    matter."""
    try:
        h.shutdown()
    except nbd.Error:
        pass


def aio_poll(handles, timeout):
    """Wait up to timeout s for the sockets of libnbd handles, let them
    move I/O on; True if one was ready."""
    rl, wl, fds = [], [], {}
    for h in handles:
        d = h.aio_get_direction()
        fd = h.aio_get_fd()
        fds[fd] = h
        if d & nbd.AIO_DIRECTION_READ:
            rl.append(fd)
        if d & nbd.AIO_DIRECTION_WRITE:
            wl.append(fd)
    r, w, _ = select.select(rl, wl, [], timeout)
    for fd in r:
        fds[fd].aio_notify_read()
    for fd in w:
        fds[fd].aio_notify_write()
    return bool(r or w)


def log_tail(path, n=40):
    """The last n lines of a log file, indented."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * KiB))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    return "\n".join("  | " + l for l in lines[-n:])


_LIVE = set()


def kill_all():
    """Kill every nbdkit this process started and has not reaped (for
    a harness's final cleanup)."""
    for s in list(_LIVE):
        s.kill()


def _shell_quote(s):
    if s and all(c.isalnum() or c in "@%+=:,./-_" for c in s):
        return s
    return "'" + s.replace("'", "'\\''") + "'"


# -- the control socket ---------------------------------------------------

class CtlResult:
    def __init__(self, rc, out, err):
        self.rc = rc
        self.out = out
        self.err = err

    @property
    def ok(self):
        return self.rc == 0

    def __str__(self):
        return "status %d%s%s" % (self.rc,
                                  ", " + self.out.strip() if self.out.strip()
                                  else "",
                                  ", " + self.err.strip() if self.err.strip()
                                  else "")


def ctl(sock, *cmd, timeout=30, tool=None):
    """Run `ssdcache ctl SOCK CMD...`; a CtlResult.  Hang if it takes
    longer than timeout seconds (the tool is killed)."""
    argv = [tool or tool_path(), "ctl", sock] + [str(c) for c in cmd]
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Hang("control command `%s` did not answer within %g s" % (
            " ".join(cmd), timeout))
    return CtlResult(r.returncode, r.stdout.decode("utf-8", "replace"),
                     r.stderr.decode("utf-8", "replace"))


def ctl_unreachable(r):
    """The control socket is not there (yet) or refuses connections:
    ctl exits 2 with the socket's error."""
    return r.rc == 2 and ("No such file" in r.err or "refused" in r.err)


def ctl_status(sock, timeout=30):
    """`ssdcache ctl SOCK status` as a dict (None if it failed)."""
    r = ctl(sock, "status", timeout=timeout)
    if not r.ok:
        return None
    out = {}
    for line in r.out.splitlines():
        k, _, v = line.partition(":")
        out[k.strip()] = v.strip()
    return out


# -- the model of a disk -------------------------------------------------

class _Any:
    """A sector whose value is not known: any data is allowed."""

    def __repr__(self):
        return "ANY"


ANY = _Any()
ZERO_SECTOR = bytes(SECTOR)


def union(*vals):
    """The union of sector values (bytes, frozensets of bytes, ANY)."""
    out = set()
    for v in vals:
        if v is ANY:
            return ANY
        if isinstance(v, frozenset):
            out |= v
        else:
            out.add(v)
    return next(iter(out)) if len(out) == 1 else frozenset(out)


def allows(val, got):
    """Does sector value val allow the bytes got (a whole sector)?"""
    if val is ANY:
        return True
    if isinstance(val, frozenset):
        return got in val
    return val == got


def allows_torn(val, got):
    """Does val allow got as a mix, byte by byte, of its candidates?  A
    write in flight at a crash need not be atomic, not even within a
    sector: a plugin may split it (the ssh plugin's SFTP writes end at
    32 KiB steps from an unaligned offset)."""
    if allows(val, got):
        return True
    if not isinstance(val, frozenset):
        return False
    cands = list(val)
    return all(any(v[i] == got[i] for v in cands) for i in range(len(got)))


def allows_part(val, lo, got):
    """Does val allow got as the bytes [lo, lo+len(got)) of the sector?"""
    if val is ANY:
        return True
    hi = lo + len(got)
    if isinstance(val, frozenset):
        return any(v[lo:hi] == got for v in val)
    return val[lo:hi] == got


def describe_value(val, limit=4):
    """A short description of a sector value, for reports."""
    def one(b):
        if b == ZERO_SECTOR:
            return "zeroes"
        return "%s... (crc32 %08x)" % (b[:8].hex(), zlib.crc32(b))
    if val is ANY:
        return "any data"
    if isinstance(val, frozenset):
        vs = sorted(val)
        s = " or ".join(one(v) for v in vs[:limit])
        return s + (" or %d more" % (len(vs) - limit) if len(vs) > limit
                    else "")
    return one(val)


def patch(val, lo, data):
    """Sector value val with bytes [lo, lo+len(data)) replaced."""
    if val is ANY:
        return ANY
    if isinstance(val, frozenset):
        return frozenset(v[:lo] + data + v[lo + len(data):] for v in val)
    return val[:lo] + data + val[lo + len(data):]


class Mismatch:
    """A sector whose data is not among the values allowed."""

    def __init__(self, sector, expected, got, lo=0):
        self.sector = sector
        self.expected = expected
        self.got = got
        self.lo = lo

    def __str__(self):
        part = "" if self.lo == 0 and len(self.got) == SECTOR else \
            " (bytes %d-%d of it)" % (self.lo, self.lo + len(self.got) - 1)
        got = self.got.hex()[:16] + "..." if len(self.got) > 8 else \
            self.got.hex()
        if len(self.got) == SECTOR:
            got = describe_value(bytes(self.got))
        return "sector %d (offset %d)%s: expected %s, got %s" % (
            self.sector, self.sector * SECTOR, part,
            describe_value(self.expected), got)

    def candidates(self):
        """The values allowed, as a list (empty for ANY)."""
        if self.expected is ANY:
            return []
        if isinstance(self.expected, frozenset):
            return sorted(self.expected)
        return [self.expected]

    def first_byte(self):
        """(offset, expected byte, got byte) of the first byte that
        differs, when one value is expected; None otherwise."""
        if not isinstance(self.expected, (bytes, bytearray)):
            return None
        for j, g in enumerate(self.got):
            e = self.expected[self.lo + j]
            if e != g:
                return self.sector * SECTOR + self.lo + j, e, g
        return None

    def odd_bytes(self):
        """How many bytes of got no allowed value has at their place
        (those that no byte-by-byte mix of the candidates explains)."""
        c = self.candidates()
        if not c:
            return 0
        return sum(1 for j, g in enumerate(self.got)
                   if all(v[self.lo + j] != g for v in c))


class Write:
    """A modifying request in flight in a Disk (see Disk.begin): its
    sectors' values when it was issued (vals), the change it makes to
    each sector it covers in part (parts: index in vals -> (first byte,
    new bytes, or None for a trim)), and the sectors it shares with
    another modifying request in flight (shared, or None)."""
    __slots__ = ("first", "vals", "iseq", "epoch", "fua", "kind", "parts",
                 "shared")

    def __init__(self, first, vals, iseq, epoch, fua, kind, parts=None):
        self.first = first
        self.vals = vals
        self.iseq = iseq
        self.epoch = epoch
        self.fua = fua
        self.kind = kind
        self.parts = parts or {}
        self.shared = None

    def value_on(self, s, base):
        """Sector s (one it covers in part) once this request changed
        base."""
        lo, piece = self.parts[s - self.first]
        return ANY if piece is None else patch(base, lo, piece)


class Disk:
    """A model of one export, per 512-byte sector.

    now:      what a read may return: cur[s] (bytes), unless alt has
              the sector (a frozenset of candidates after a failed
              write, collapsed by the next read; ANY after a trim).
    durable:  what survives kill -9: dur/dalt, the data at the newest
              completed FLUSH (a flush makes durable every write that
              completed before it was issued, on any connection: the
              cache's flush covers the whole export), plus FUA writes.
              pend[s] lists the (completion seq, value) of writes
              completed since; a crash may leave any of those, the
              durable value, or the value of a write in flight.

    The caller serialises the calls (one lock) and never has two
    requests in flight that overlap (in bytes) of which one modifies
    (RangeTable).  Requests may be unaligned; the model keeps whole
    sectors.  Two modifying requests in flight may share a sector, their
    bytes apart: the server may apply them in either order, so such a
    sector ("torn") takes its new value when each completes, and until
    it is durable a crash may leave any byte-by-byte mix of its
    candidates; a FUA one makes only its own bytes durable there.
    The size must be a multiple of 512.
    """

    def __init__(self, data, name=""):
        if len(data) % SECTOR:
            raise ValueError("the disk size must be a multiple of 512")
        self.name = name
        self.size = len(data)
        self.nsect = self.size // SECTOR
        self.cur = bytearray(data)
        self.alt = {}
        self.dur = bytearray(data)
        self.dalt = {}
        self.pend = {}
        self.flight = set()
        self.partial = {}       # sector -> Writes in flight covering part
        self.torn = set()       # pending sectors shared by such Writes
        self.seq = 0
        self.dseq = 0
        self.epoch = 0          # bumped by rebase: older Writes are void
        self.history = None     # FlushHistory, see track_order

    # -- values ----------------------------------------------------------

    def value(self, s):
        """The value(s) sector s may read as now."""
        v = self.alt.get(s)
        if v is not None:
            return v
        o = s * SECTOR
        return bytes(self.cur[o:o + SECTOR])

    def durable_value(self, s):
        v = self.dalt.get(s)
        if v is not None:
            return v
        o = s * SECTOR
        return bytes(self.dur[o:o + SECTOR])

    def _set(self, s, v):
        o = s * SECTOR
        if isinstance(v, bytes):
            self.cur[o:o + SECTOR] = v
            self.alt.pop(s, None)
        else:
            self.alt[s] = v

    def _new_values(self, kind, off, n, data):
        """The values [off, off+n) takes after the request, and the
        changes to the sectors it covers in part (see Write)."""
        first = off // SECTOR
        last = (off + n - 1) // SECTOR
        vals = []
        parts = {}
        for s in range(first, last + 1):
            so = s * SECTOR
            lo = max(off, so) - so
            hi = min(off + n, so + SECTOR) - so
            whole = lo == 0 and hi == SECTOR
            if kind == "trim":
                vals.append(ANY)
                if not whole:
                    parts[s - first] = (lo, None)
                continue
            if kind == "zero":
                piece = ZERO_SECTOR[:hi - lo]
            else:
                piece = bytes(data[so + lo - off:so + hi - off])
            if whole:
                vals.append(piece)
            else:
                vals.append(patch(self.value(s), lo, piece))
                parts[s - first] = (lo, piece)
        return first, vals, parts

    # -- requests ----------------------------------------------------------

    def begin(self, kind, off, n, data=None, fua=False):
        """A write ("write", data), zero or trim of [off, off+n) is
        issued: returns its Write, to pass to end()."""
        first, vals, parts = self._new_values(kind, off, n, data)
        self.seq += 1
        w = Write(first, vals, self.seq, self.epoch, fua, kind, parts)
        for i in parts:
            s = first + i
            others = self.partial.setdefault(s, set())
            for o in others:
                for x in (o, w):
                    if x.shared is None:
                        x.shared = set()
                    x.shared.add(s)
            if others and self.history is not None:
                self.history.shared(s)
            others.add(w)
        self.flight.add(w)
        if self.history is not None:
            self.history.issued(w)
        return w

    def end(self, w, ok):
        """The request of w completed (ok) or failed.  A failed one
        leaves each sector old or new, until a read says which.  A Write
        from before a rebase (a kill) is ignored: False then."""
        if w.epoch != self.epoch or w not in self.flight:
            return False
        self.flight.discard(w)
        for i in w.parts:
            ws = self.partial.get(w.first + i)
            ws.discard(w)
            if not ws:
                del self.partial[w.first + i]
        self.seq += 1
        cseq = self.seq
        for i, v in enumerate(w.vals):
            s = w.first + i
            shared = w.shared is not None and s in w.shared
            if shared:
                # Another request changed other bytes of it meanwhile.
                v = w.value_on(s, self.value(s))
            if not ok:
                v = union(self.value(s), v)
            self._set(s, v)
            if w.fua and ok and shared:
                # Durable now, but only its own bytes: the others'
                # may have been applied before or after it.
                self._set_durable(s, w.value_on(s, self.durable_value(s)))
                if s in self.pend:
                    self.pend[s] = [(c, w.value_on(s, x))
                                    for c, x in self.pend[s]]
            elif w.fua and ok:
                # Durable now; every older pending value is superseded
                # (no overlapping write was in flight with this one).
                self.pend.pop(s, None)
                self.torn.discard(s)
                self._set_durable(s, v)
            else:
                self.pend.setdefault(s, []).append((cseq, v))
                if shared:
                    self.torn.add(s)
        if self.history is not None:
            self.history.completed(w, cseq, ok)
        return True

    def flush_begin(self):
        """A FLUSH is issued: returns a token for flush_end."""
        self.seq += 1
        return (self.epoch, self.seq)

    def flush_end(self, token):
        """That FLUSH completed: every write completed before it was
        issued is durable."""
        epoch, t = token
        if epoch != self.epoch:
            return
        self.seq += 1
        if self.history is not None:
            self.history.flushed(t, self.seq)
        if t <= self.dseq:
            return
        self.dseq = t
        for s in list(self.pend):
            lst = self.pend[s]
            k = 0
            while k < len(lst) and lst[k][0] <= t:
                k += 1
            if k:
                self._set_durable(s, lst[k - 1][1])
                del lst[:k]
                if not lst:
                    del self.pend[s]
                    self.torn.discard(s)

    def _set_durable(self, s, v):
        o = s * SECTOR
        if isinstance(v, bytes):
            self.dur[o:o + SECTOR] = v
            self.dalt.pop(s, None)
        else:
            self.dalt[s] = v

    # -- checks -------------------------------------------------------------

    def check_read(self, off, got, limit=8):
        """A read of [off, off+len(got)) returned got: the mismatches
        (at most limit).  Whole sectors read collapse their candidates."""
        n = len(got)
        if not self.alt and self.cur[off:off + n] == got:
            return []
        bad = []
        first = off // SECTOR
        last = (off + n - 1) // SECTOR
        for s in range(first, last + 1):
            so = s * SECTOR
            lo = max(off, so) - so
            hi = min(off + n, so + SECTOR) - so
            g = bytes(got[so + lo - off:so + hi - off])
            v = self.alt.get(s)
            if v is None:
                if self.cur[so + lo:so + hi] != g:
                    bad.append(Mismatch(s, self.value(s), g, lo))
                continue
            if not allows_part(v, lo, g):
                bad.append(Mismatch(s, v, g, lo))
            elif lo == 0 and hi == SECTOR and v is not ANY:
                self._set(s, g)
            elif isinstance(v, frozenset):
                left = frozenset(x for x in v if x[lo:hi] == g)
                self._set(s, next(iter(left)) if len(left) == 1 else left)
            if len(bad) >= limit:
                break
        return bad

    def crash_value(self, s, flight=True):
        """What sector s may hold after kill -9 and a restart."""
        vals = [self.durable_value(s)]
        vals += [v for _, v in self.pend.get(s, ())]
        if flight:
            vals += self._flight_values(s)
        return union(*vals)

    def _flight_values(self, s):
        out = []
        for w in self.flight:
            if w.first <= s < w.first + len(w.vals):
                if w.shared is not None and s in w.shared:
                    # Its bytes on the sector as it is now (checked as
                    # a mix: the sector is in flight).
                    out.append(w.value_on(s, self.value(s)))
                else:
                    out.append(w.vals[s - w.first])
        return out

    def unflushed(self):
        """How many completed writes are not durable yet (on some
        sector), and how many are in flight."""
        return (len({c for lst in self.pend.values() for c, _ in lst}),
                len(self.flight))

    def check_after_crash(self, got, limit=8):
        """The whole export as read after kill -9 and a restart (got)
        against what may survive: the mismatches.  A sector of a write
        in flight may be torn (allows_torn), and so may one that writes
        in flight together changed (see the class)."""
        flight = self._flight_sectors()
        return self._check_image(got, self.dur, self.dalt,
                                 set(self.pend) | flight,
                                 lambda s: self.crash_value(s), limit,
                                 torn=flight | self.torn)

    def check_current(self, got, flight=True, limit=8):
        """An image (e.g. the backing file in writethrough mode) against
        the completed writes: each sector as the model says now, or, if
        flight, the value of a request in flight."""
        extra = self._flight_sectors() if flight else set()
        return self._check_image(
            got, self.cur, self.alt, extra,
            lambda s: union(self.value(s), *self._flight_values(s)),
            limit, torn=extra)

    def _flight_sectors(self):
        out = set()
        for w in self.flight:
            out.update(range(w.first, w.first + len(w.vals)))
        return out

    def _check_image(self, got, base, basealt, special, value, limit,
                     torn=frozenset()):
        if len(got) != self.size:
            return [_SizeMismatch(self.size, len(got))]
        bad = []
        special = set(special) | set(basealt)
        step = 64 * KiB
        spb = step // SECTOR
        by_block = {}
        for s in special:
            by_block.setdefault(s // spb, []).append(s)
        for o in range(0, self.size, step):
            e = min(o + step, self.size)
            sp = by_block.get(o // step)
            if not sp and base[o:e] == got[o:e]:
                continue
            for s in range(o // SECTOR, e // SECTOR):
                so = s * SECTOR
                g = bytes(got[so:so + SECTOR])
                if s in special:
                    v = value(s)
                    ok = allows_torn(v, g) if s in torn else allows(v, g)
                    if not ok:
                        bad.append(Mismatch(s, v, g))
                elif base[so:so + SECTOR] != g:
                    bad.append(Mismatch(s, bytes(base[so:so + SECTOR]), g))
                if len(bad) >= limit:
                    return bad
        return bad

    def forget(self, lo, hi):
        """Bytes [lo, hi) were declared lost by the server (dirty data
        it could not read back, logged): from now on they may read and
        survive as anything, until written again."""
        for s in range(lo // SECTOR, (hi + SECTOR - 1) // SECTOR):
            self.alt[s] = ANY
            self.dalt[s] = ANY
            self.pend.pop(s, None)
            self.torn.discard(s)

    # -- new starting points --------------------------------------------------

    def rebase(self, data):
        """After a kill and a restart: the export reads as data, which is
        now both current and durable; requests in flight are void."""
        self.cur = bytearray(data)
        self.dur = bytearray(data)
        self.alt = {}
        self.dalt = {}
        self.pend = {}
        self.flight = set()
        self.partial = {}
        self.torn = set()
        self.epoch += 1
        if self.history is not None:
            self.history.restarted(self.cur)

    def clean_stop(self):
        """nbdkit stopped cleanly (no request in flight): everything
        completed is kept."""
        self.dur = bytearray(self.cur)
        self.dalt = dict(self.alt)
        self.pend = {}
        self.torn = set()
        self.dseq = self.seq

    def image_hashes(self):
        """CRC32 of every sector of the current data (candidates as
        their own, see FlushHistory)."""
        return sector_hashes(self.cur)

    # -- the flush order -----------------------------------------------------

    def track_order(self):
        """Start (again) the flush history from the current data: the
        backing store is known to hold it (written back, drained, a new
        cache)."""
        self.history = FlushHistory(self)
        for w in self.flight:
            self.history.issued(w)

    def stop_order(self):
        self.history = None

    def check_order(self, got, limit=8):
        """The backing store alone (got) against the flush order: some
        completed flush k plus a subset of the writes after it.
        Returns (k, []) or (None, mismatches of the closest k)."""
        if self.history is None:
            raise ValueError("no flush history")
        return self.history.match(got, limit)


class _SizeMismatch(Mismatch):
    def __init__(self, want, got):
        Mismatch.__init__(self, 0, b"", b"")
        self.want = want
        self.gotsize = got

    def __str__(self):
        return "size %d, expected %d" % (self.gotsize, self.want)


def sector_hashes(data):
    """CRC32 of every 512-byte sector of data, as a list."""
    mv = memoryview(data)
    return [zlib.crc32(mv[o:o + SECTOR]) for o in range(0, len(data), SECTOR)]


def _hashes(v):
    """The set of CRC32s of a sector value, or None for ANY."""
    if v is ANY:
        return None
    if isinstance(v, frozenset):
        return {zlib.crc32(x) for x in v}
    return {zlib.crc32(v)}


class FlushHistory:
    """What ssdcache-writeback-order=flush promises for the backing
    store alone: at every moment it equals the export at some completed
    FLUSH k (F_k: every write completed before flush k was issued) plus
    a subset of the writes that were not yet complete then and were
    issued before the next completed flush was (V_k+1).

    Kept as CRC32s per sector: the base (the data when the history
    started, which the backing store had), then each completed write
    with its issue and completion sequence numbers, and each completed
    flush with its issue and completion numbers.  Failed writes, trims
    and the sectors that two writes in flight shared make their sectors
    free for the rest of the history ("loose"): the model cannot say
    which value the backend got.
    """

    def __init__(self, disk):
        self.base = sector_hashes(disk.cur)
        self.loose = {}            # sector -> set of hashes, or None: any
        for s, v in disk.alt.items():
            self._loosen(s, v)
        self.writes = []           # [iseq, cseq or None, first, hashes]
        self.byw = {}              # Write -> record
        self.flushes = []          # (issue seq, completion seq)

    def _loosen(self, s, v):
        h = _hashes(v)
        if h is None:
            self.loose[s] = None
        elif self.loose.get(s, set()) is not None:
            self.loose.setdefault(s, set()).update(h)

    def issued(self, w):
        rec = [w.iseq, None, w.first, [_hashes(v) for v in w.vals]]
        self.writes.append(rec)
        self.byw[w] = rec

    def completed(self, w, cseq, ok):
        rec = self.byw.pop(w, None)
        if rec is None:
            return
        if ok and w.kind != "trim" and not w.shared and all(
                h is not None and len(h) == 1 for h in rec[3]):
            rec[1] = cseq
        else:
            for i, v in enumerate(w.vals):
                self._loosen(w.first + i, v)
            rec[1] = None       # never part of an F_k; always possible

    def shared(self, s):
        """Two writes in flight share sector s: its value depends on
        their order, which the history does not keep."""
        self._loosen(s, ANY)

    def flushed(self, iseq, cseq):
        self.flushes.append((iseq, cseq))

    def completed_state(self):
        """Each sector's hash after every completed write, in order."""
        state = list(self.base)
        for rec in sorted((r for r in self.writes if r[1] is not None),
                          key=lambda r: r[1]):
            for i, h in enumerate(rec[3]):
                state[rec[2] + i] = next(iter(h))
        return state

    def restarted(self, cur):
        """After a restart on the same cache the export read as cur:
        the sectors that differ from the newest state are a write
        completed now (recovery's data), and writes in flight at the
        kill stay possible."""
        self.byw = {}
        state = self.completed_state()
        now = sector_hashes(cur)
        diff = [s for s in range(len(now)) if now[s] != state[s]]
        if diff:
            # After every number recorded so far (issues, completions
            # and flushes: all at most disk.seq) and before the next
            # one the disk hands out (disk.seq + 1).
            seq = max([r[0] for r in self.writes] +
                      [r[1] for r in self.writes if r[1] is not None] +
                      [x for f in self.flushes for x in f] + [0]) + 0.5
            for s in diff:
                self.writes.append([seq, seq, s, [{now[s]}]])

    def match(self, got, limit=8):
        gh = sector_hashes(got)
        n = len(self.base)
        if len(gh) != n:
            return None, [_SizeMismatch(n * SECTOR, len(got))]
        loose = self.loose

        def fine(s, h, extra):
            if s in loose and (loose[s] is None or h in loose[s]):
                return True
            e = extra.get(s)
            return e is not None and (None in e or h in e)

        # Points: the base (k = 0) and each completed flush by issue seq.
        points = [(0, 0)] + sorted(self.flushes)
        done = sorted((r for r in self.writes if r[1] is not None),
                      key=lambda r: r[1])
        state = list(self.base)
        diff = {s for s in range(n) if gh[s] != state[s]}
        wi = 0
        best = None
        for k, (t, c) in enumerate(points):
            while wi < len(done) and done[wi][1] < t:
                rec = done[wi]
                for i, h in enumerate(rec[3]):
                    s = rec[2] + i
                    state[s] = next(iter(h))
                    if gh[s] != state[s]:
                        diff.add(s)
                    else:
                        diff.discard(s)
                wi += 1
            # V: writes not complete at t, issued before the next
            # completed flush completed (any time, for the last).
            until = min((f[1] for f in self.flushes if f[0] > t),
                        default=None)
            extra = {}
            if diff:
                for rec in self.writes:
                    if rec[1] is not None and rec[1] < t:
                        continue
                    if until is not None and rec[0] > until:
                        continue
                    for i, h in enumerate(rec[3]):
                        s = rec[2] + i
                        if s in diff:
                            e = extra.setdefault(s, set())
                            if h is None:
                                e.add(None)
                            else:
                                e.update(h)
            bad = [s for s in sorted(diff) if not fine(s, gh[s], extra)]
            if not bad:
                return k, []
            if best is None or len(bad) < len(best[1]):
                best = (k, bad)
        k, bad = best
        return None, ["sector %d (offset %d): backing store's crc32 %08x "
                      "is in no allowed state (closest flush point %d of "
                      "%d; %d sectors off)" % (s, s * SECTOR, gh[s], k,
                                                len(points) - 1, len(bad))
                      for s in bad[:limit]]


class Origins:
    """Where the data of a sector came from, for reports: each sector
    value that the writes of the last few rounds (a harness's
    iterations) left, and each sector of the image each of them started
    from, by hash."""

    def __init__(self, keep=6, unit="rounds"):
        self.keep = keep
        self.unit = unit        # what a round is called, in reports
        self.rounds = []        # [(label, {hash: [description]})]

    def start(self, label, image):
        """A new round (label: "iteration 3") starting from image."""
        d = {}
        for s in range(0, len(image) - SECTOR + 1, SECTOR):
            d.setdefault(hash(bytes(image[s:s + SECTOR])), []).append(
                "the export's sector at offset %d at the start of %s" % (
                    s, label))
        self.rounds.append((label, d))
        del self.rounds[:-self.keep]

    def add_write(self, w, what):
        """A request of the current round (w: its Disk Write; what:
        "write #12 FUA"): the sector values it leaves."""
        if not self.rounds:
            return
        label, d = self.rounds[-1]
        for i, v in enumerate(w.vals):
            if isinstance(v, bytes):
                d.setdefault(hash(v), []).append("%s of %s, at offset %d" % (
                    what, label, (w.first + i) * SECTOR))

    def whence(self, sector):
        """The descriptions of where these 512 bytes were seen."""
        h = hash(bytes(sector))
        out = []
        for _, d in self.rounds:
            out += d.get(h, [])
        return out

    def explain(self, bad, image, backing=None, limit=4):
        """For the first sectors of the Mismatches bad (of image): where
        their bytes and the values allowed come from, and whether
        backing (the backing store's bytes, if given) holds the same
        there."""
        lines = []
        seen = set()
        for m in bad:
            s = m.sector * SECTOR
            if s in seen:
                continue
            seen.add(s)
            if len(seen) > limit:
                break
            sec = bytes(image[s:s + SECTOR])
            w = self.whence(sec)
            allowed = []
            for v in m.candidates()[:4]:
                o = self.whence(v) if len(v) == SECTOR else []
                allowed.append(o[-1] if o else "crc32 %08x (no write or "
                               "starting image known)" % zlib.crc32(v))
            lines.append("  sector at %d: its bytes are %s%s; allowed: %s" % (
                s, "; ".join(w[:4]) if w else
                "from nowhere known (no write or starting image of the "
                "last %d %s)" % (self.keep, self.unit),
                "" if backing is None else "; the backing file there " + (
                    "holds the same bytes" if backing[s:s + SECTOR] == sec
                    else "differs"),
                "any data" if m.expected is ANY else
                " or ".join(allowed)))
        return "\n".join(lines)


# -- ranges in flight ---------------------------------------------------------

class RangeTable:
    """Ranges of requests in flight, to keep the model exact: a read
    must not overlap (in bytes) a request that modifies, and two
    requests that modify must not share a 512-byte sector even where
    their bytes differ: Disk would have to take such a sector as torn
    after a crash, and the flush history as anything.  Not locked:
    the caller holds its model lock."""

    def __init__(self):
        self.ranges = {}        # key -> (disk key, off, end, modifies)
        self.next = 0

    def conflicts(self, dkey, off, n, modifies):
        end = off + n
        for d, o, e, m in self.ranges.values():
            if d != dkey or not (m or modifies):
                continue
            if m and modifies:
                if o // SECTOR <= (end - 1) // SECTOR and \
                   off // SECTOR <= (e - 1) // SECTOR:
                    return True
            elif o < end and off < e:
                return True
        return False

    def add(self, dkey, off, n, modifies):
        self.next += 1
        self.ranges[self.next] = (dkey, off, off + n, modifies)
        return self.next

    def remove(self, key):
        self.ranges.pop(key, None)

    def modifying(self, dkey=None):
        return any(m and (dkey is None or d == dkey)
                   for d, _, _, m in self.ranges.values())


# -- servers for the network plugins -----------------------------------------

def free_port():
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Daemon:
    """A server of the test's own on a free port of 127.0.0.1, its
    output in workdir/NAME.log."""

    def __init__(self, workdir, name):
        self.workdir = workdir
        self.name = name
        self.proc = None
        self.port = None
        self.log = os.path.join(workdir, name + ".log")

    @staticmethod
    def _available(binary, plugin):
        """True if binary can run and nbdkit has plugin."""
        return os.access(binary, os.X_OK) and \
            subprocess.run(["nbdkit", plugin, "--version"],
                           capture_output=True).returncode == 0

    def _start_on_free_port(self, argv_for):
        """Run the server until it listens, on a free port (5 tries);
        argv_for(port) writes its configuration, returns its command."""
        for attempt in range(5):
            self.port = free_port()
            argv = argv_for(self.port)
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=log)
            try:
                self._wait_listening(self.port)
                return
            except (EnvError, Hang):
                self.stop()
        raise EnvError("%s could not be started: %s" % (
            self.name, log_tail(self.log)))

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _wait_listening(self, port, timeout=30):
        def up():
            if self.proc.poll() is not None:
                raise EnvError("%s exited: %s" % (self.name,
                                                  log_tail(self.log)))
            try:
                with socket.create_connection(("127.0.0.1", port), 1):
                    return True
            except OSError:
                return False
        wait_for(up, timeout, "%s listening on port %d" % (self.name, port))


class Sshd(_Daemon):
    """An OpenSSH server of the test's own on 127.0.0.1 (host key, user
    key and authorized_keys in workdir), for nbdkit's ssh plugin:
    plugin_args(path) is the plugin and its parameters."""

    def __init__(self, workdir):
        _Daemon.__init__(self, workdir, "sshd")
        self.dir = os.path.join(workdir, "ssh")

    @staticmethod
    def available():
        """True if sshd and nbdkit's ssh plugin are installed."""
        return _Daemon._available("/usr/sbin/sshd", "ssh")

    def start(self):
        """Keys, then sshd on a free port, then known_hosts for it."""
        d = self.dir
        os.makedirs(d, mode=0o700, exist_ok=True)
        for k in ("host_key", "user_key"):
            if not os.path.exists(os.path.join(d, k)):
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "",
                                "-C", "ssdcache-test", "-f",
                                os.path.join(d, k)], check=True)
        with open(os.path.join(d, "user_key.pub")) as f, \
                open(os.path.join(d, "authorized_keys"), "w") as g:
            g.write(f.read())
        if os.getuid() == 0 and not os.path.isdir("/run/sshd"):
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self._start_on_free_port(self._config)
        with open(os.path.join(d, "host_key.pub")) as f:
            key = " ".join(f.read().split()[:2])
        with open(os.path.join(d, "known_hosts"), "w") as f:
            f.write("[127.0.0.1]:%d %s\n" % (self.port, key))

    def _config(self, port):
        """Write sshd_config for port; sshd's command line."""
        d = self.dir
        conf = os.path.join(d, "sshd_config")
        with open(conf, "w") as f:
            f.write("Port %d\nListenAddress 127.0.0.1\n"
                    "HostKey %s/host_key\nPidFile %s/sshd.pid\n"
                    "AuthorizedKeysFile %s/authorized_keys\n"
                    "StrictModes no\nUsePAM no\nPubkeyAuthentication yes\n"
                    "PasswordAuthentication no\n"
                    "KbdInteractiveAuthentication no\n"
                    "PermitRootLogin prohibit-password\n"
                    "AllowTcpForwarding no\nX11Forwarding no\n"
                    "PrintMotd no\nMaxStartups 64\nMaxSessions 64\n"
                    "Subsystem sftp internal-sftp\n" % (port, d, d, d))
        return ["/usr/sbin/sshd", "-D", "-e", "-f", conf]

    def plugin_args(self, path):
        import pwd
        user = pwd.getpwuid(os.getuid()).pw_name
        return ["ssh", "host=127.0.0.1", "port=%d" % self.port,
                "user=" + user, "path=" + path,
                "identity=" + os.path.join(self.dir, "user_key"),
                "known-hosts=" + os.path.join(self.dir, "known_hosts"),
                "config=", "timeout=20"]


class Httpd(_Daemon):
    """A lighttpd of the test's own on 127.0.0.1 serving docroot, for
    nbdkit's curl plugin: url(name) is a file's URL."""

    def __init__(self, workdir, docroot):
        _Daemon.__init__(self, workdir, "lighttpd")
        self.docroot = docroot

    @staticmethod
    def available():
        """True if lighttpd and nbdkit's curl plugin are installed."""
        return _Daemon._available("/usr/sbin/lighttpd", "curl")

    def start(self):
        """lighttpd on a free port."""
        self._start_on_free_port(self._config)

    def _config(self, port):
        """Write lighttpd.conf for port; lighttpd's command line."""
        conf = os.path.join(self.workdir, "lighttpd.conf")
        with open(conf, "w") as f:
            f.write('server.document-root = "%s"\nserver.port = %d\n'
                    'server.bind = "127.0.0.1"\n'
                    'server.errorlog = "%s"\n'
                    'server.max-connections = 256\n' % (
                        self.docroot, port, self.log))
        return ["/usr/sbin/lighttpd", "-D", "-f", conf]

    def url(self, name):
        return "http://127.0.0.1:%d/%s" % (self.port, name)


def errno_name(e):
    """The errno of an nbd.Error (or OSError) as a name, for reports."""
    n = getattr(e, "errno", None)
    return errno.errorcode.get(n, str(n)) if n else "?"


# -- helpers for the shell tests' Python ------------------------------------
#
# The steps that the Python of tests/*.sh (heredocs, nbdsh -c, "$PYTHON"
# -c) would otherwise each write again in its own words.  A failed
# check raises SystemExit("FAIL: ..."): the script, or nbdsh, exits 1
# with that message.
#
#   connect(where, export)     a connected libnbd handle
#   expect_export(h, path, what, off, n)
#                              the export's bytes [off, off + n) are
#                              those of the file path
#   expect_file(path, off, want, what)
#                              the file's bytes at off are want
#   expect_error(what, fn, *args, errno=None)
#                              fn(*args) fails with an nbd.Error (with
#                              that errno name); returns the error
#   write_flush(where, off, n, char)
#                              n bytes char at off, then flush
#                              (functions.sh write_flush)

def connect(where, export=""):
    """A libnbd handle connected to where: an NBD URI, or the path of a
    Unix socket (then the export named export)."""
    h = nbd.NBD()
    if "://" in where:
        h.connect_uri(where)
    else:
        h.set_export_name(export)
        h.connect_unix(where)
    return h


def _first_difference(got, want):
    for i in range(min(len(got), len(want))):
        if got[i] != want[i]:
            return i
    return min(len(got), len(want))


def expect_file(path, off, want, what):
    """The bytes of the file path at off are want, or fail with what and
    where the first difference is."""
    with open(path, "rb") as f:
        f.seek(off)
        got = f.read(len(want))
    if got != want:
        raise SystemExit("FAIL: %s: %s differs from the expected data at "
                         "offset %d" % (what, path,
                                        off + _first_difference(got, want)))


def expect_export(h, path, what, off=0, n=None, chunk=32 * MiB):
    """The bytes [off, off + n) of the export of handle h (n: to its
    end) are those of the file path at the same offsets, or fail with
    what and where the first difference is; n None also wants the
    file as big as the export.  Reads chunk bytes a request."""
    if n is None:
        n = h.get_size() - off
        if os.path.getsize(path) != h.get_size():
            raise SystemExit("FAIL: %s: the export has %d bytes, %s %d" % (
                what, h.get_size(), path, os.path.getsize(path)))
    with open(path, "rb") as f:
        f.seek(off)
        want = f.read(n)
    for o in range(0, n, chunk):
        got = h.pread(min(chunk, n - o), off + o)
        part = want[o:o + len(got)]
        if got != part:
            raise SystemExit("FAIL: %s: the export differs from %s at "
                             "offset %d" % (what, path,
                                            off + o +
                                            _first_difference(got, part)))


def expect_error(what, fn, *args, errno=None):
    """fn(*args) (a request of a libnbd handle) must fail with an
    nbd.Error, with the errno named errno ("EIO") if given; the error,
    printed and returned.  Fails with what otherwise."""
    try:
        fn(*args)
    except nbd.Error as e:
        print("%s: failed as it must: %s" % (what, e))
        if errno is not None and errno_name(e) != errno and \
           errno not in str(e):
            raise SystemExit("FAIL: %s: expected %s, got %s" %
                             (what, errno, e))
        return e
    raise SystemExit("FAIL: %s: it succeeded" % what)


def write_flush(where, off, n, char):
    """Write n bytes char (a one-character string: "W") at off of the
    export at where (see connect), then flush; off and n may be strings
    (from a shell)."""
    h = connect(where)
    h.pwrite(char.encode("latin-1") * int(n), int(off))
    h.flush()
    h.shutdown()
