# SPDX-License-Identifier: BSD-3-Clause
"""benchlib: what the benchmark scripts share (scripts/bench,
bench-pressure, bench-warm, bench-advertise, ab-iozone, profile-hit,
ram-per-slot), so that each does not grow its own copy.

  JOBS, job_path   the fio job files: bench/ at the top of the tree
  find_filter      the ssdcache filter to measure
  stack            nbdkit's arguments for filters (top first) over a
                   plugin
  Server           a background nbdkit on a Unix socket: the tests'
                   ssdtest.Nbdkit (-f -P PIDFILE -U SOCKET, its output
                   in a log file, ready once it answers the NBD
                   handshake, stopped with SIGTERM and waited for,
                   killed with SIGKILL and reaped; killed at exit if
                   still running), plus its URI, a command prefix
                   (valgrind) and a start that does not wait (for a
                   caller that times the start-up)
  captive          `nbdkit -U - ... --run CMD`: nbdkit serves while CMD
                   runs, then exits with CMD's status
  fio              one job file against a URI (or a file), its ${NAME}
                   variables from the environment fio is given; the
                   JSON parsed by parse_fio (IOPS, MiB/s, mean latency,
                   clat p50 / p99 / p99.9 / max)
  median, spread, merge_runs   repeated runs
  parse_size, fmt_size, fio_time, loadavg, parse_stats (nbdkit's stats
  filter), parse_ssd_stats (ssdcache-stats=), header (a script's top
  comment, for --help)

A script imports it as

    sys.dont_write_bytecode = True
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import benchlib

(no __pycache__ in scripts/ or tests/, which "make dist" would copy).
Needs /usr/bin/python3 on Debian (the libnbd bindings).
"""

import atexit
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys

sys.dont_write_bytecode = True

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
JOBS = os.path.join(TOP, "bench")

sys.path.insert(0, os.path.join(TOP, "tests"))
import ssdtest                                  # noqa: E402

StartError = ssdtest.StartError
Hang = ssdtest.Hang
wait_for = ssdtest.wait_for
Httpd = ssdtest.Httpd
ctl = ssdtest.ctl
kill_all = ssdtest.kill_all

# A server still running when the script ends (an exception, ^C) is
# killed, not left behind.
atexit.register(kill_all)


# -- the filter -------------------------------------------------------------

def find_filter(path=None, installed=True):
    """The filter to measure: PATH if given, else $SSDCACHE_FILTER, else
    this tree's build, else (INSTALLED) nbdkit's installed "ssdcache".
    Exits with a message if there is none."""
    cands = [path] if path else [os.environ.get("SSDCACHE_FILTER") or
                                 os.path.join(TOP, "filter", ".libs",
                                              "nbdkit-ssdcache-filter.so")]
    for c in cands:
        if os.path.exists(c):
            return os.path.abspath(c)
    if installed and not path:
        r = subprocess.run(["nbdkit", "--filter=ssdcache", "null",
                            "--dump-plugin"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        if r.returncode == 0:
            return "ssdcache"
    sys.exit("%s: ssdcache filter not found (tried %s%s); build it with "
             "'make' or set SSDCACHE_FILTER" % (
                 os.path.basename(sys.argv[0]), ", ".join(cands),
                 " and the installed 'ssdcache'" if installed and not path
                 else ""))


# -- nbdkit -----------------------------------------------------------------

def stack(filters, plugin, *params):
    """nbdkit's arguments for FILTERS (names or paths, top first) over
    PLUGIN with PARAMS (plugin and filter parameters, in any order, each
    "key=value" or a list of them)."""
    args = ["--filter=" + f for f in filters] + [plugin]
    for p in params:
        args += [p] if isinstance(p, str) else list(p)
    return args


class Server(ssdtest.Nbdkit):
    """A background nbdkit serving ARGS (see stack) on WORKDIR/NAME.sock,
    its pidfile WORKDIR/NAME.pid, stdout and stderr appended to LOG
    (default WORKDIR/NAME.log).  ENV: more environment (TMPDIR=...).
    PREFIX: a command nbdkit runs under (valgrind ...).

    start() returns once nbdkit answers the NBD handshake (StartError if
    it exits first, Hang after timeout s); stop() sends SIGTERM and
    waits (a writeback cache writes back first: the default bound is
    long); kill() is SIGKILL.  As a context manager: started, then
    stopped, or killed after an exception."""

    def __init__(self, args, workdir, name="nbdkit", env=None, log=None,
                 prefix=()):
        ssdtest.Nbdkit.__init__(self, args, workdir, name=name, env=env,
                                log=log)
        if len(self.sock.encode()) >= 108:
            raise ValueError("socket path too long for a Unix socket (a "
                             "shorter scratch directory?): " + self.sock)
        self.prefix = list(prefix)

    def argv(self):
        return self.prefix + ssdtest.Nbdkit.argv(self)

    @property
    def uri(self):
        return "nbd+unix:///?socket=" + self.sock

    def start(self, timeout=300):
        ssdtest.Nbdkit.start(self, timeout)

    def stop(self, timeout=1800):
        return ssdtest.Nbdkit.stop(self, timeout, stacks=False)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc, val, tb):
        if exc is None:
            self.stop()
        else:
            self.kill()


def captive(args, run, env=None, timeout=None):
    """`nbdkit -U - ARGS --run RUN`: nbdkit serves while the shell
    command RUN runs ($uri, $unixsocket ... are nbdkit's), then exits
    with RUN's status.  Returns a CompletedProcess (text stdout and
    stderr); after TIMEOUT s nbdkit and RUN are killed (process group)
    and the status is -9."""
    cmd = ["nbdkit", "-U", "-"] + list(args) + ["--run", run]
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True,
                         env=e, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        err += "\nnbdkit --run: killed after %g s" % timeout
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def quote(argv):
    return " ".join(shlex.quote(a) for a in argv)


# -- fio --------------------------------------------------------------------

class FioError(Exception):
    """fio failed, or its job file lacks a variable."""


def job_path(job):
    """A job file: a name in bench/ (iozone.fio) or a path."""
    return job if os.sep in job else os.path.join(JOBS, job)


def job_vars(path, section=None):
    """The ${NAME}s that job file PATH uses in [global] and in SECTION
    (in every section if None)."""
    names, cur = set(), "global"
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith(("#", ";")):
                continue
            m = re.match(r"^\[(.+)\]$", line)
            if m:
                cur = m.group(1)
                continue
            if section is None or cur in ("global", section):
                names |= set(re.findall(r"\$\{(\w+)\}", line))
    return names


def fio_time(secs):
    """SECS (a float) as a fio time: 1.5 -> 1500ms."""
    return "%dms" % int(round(float(secs) * 1000))


def fio(job, variables, out, section=None, log=None, sync=True,
        timeout=3600):
    """Run fio on job file JOB (see job_path), only its SECTION if given,
    with VARIABLES in the environment for its ${NAME}s (every one it
    uses must be given: fio would substitute an empty string), its JSON
    in OUT and its other output appended to LOG (default: discarded),
    after a sync(2) if SYNC (no job pays for the dirty page cache of the
    one before).  Returns parse_fio(OUT); FioError if fio fails, gives
    no result or takes more than TIMEOUT s."""
    path = job_path(job)
    variables = {k: str(v) for k, v in variables.items()}
    missing = job_vars(path, section) - set(variables)
    if missing:
        raise FioError("%s needs %s" % (os.path.basename(path), ", ".join(
            "${%s}" % n for n in sorted(missing))))
    cmd = ["fio", "--output-format=json", "--output=" + out]
    if section:
        cmd.append("--section=" + section)
    cmd.append(path)
    env = dict(os.environ)
    env.update(variables)
    what = "%s%s" % (os.path.basename(path), ":" + section if section else "")
    if sync:
        os.sync()
    logf = open(log, "a") if log else subprocess.DEVNULL
    try:
        if log:
            logf.write("+ %s %s\n" % (" ".join(
                "%s=%s" % (k, shlex.quote(v)) for k, v in
                sorted(variables.items())), quote(cmd)))
            logf.flush()
        try:
            r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=logf,
                               stderr=logf, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise FioError("fio %s: not done within %d s" % (what, timeout))
    finally:
        if log:
            logf.close()
    if r.returncode != 0:
        raise FioError("fio %s failed (status %d%s)" % (
            what, r.returncode, ", see " + log if log else ""))
    res = parse_fio(out)
    if res is None:
        raise FioError("fio %s: no result in %s" % (what, out))
    return res


def _pct(clat, p):
    for k, v in (clat.get("percentile") or {}).items():
        if abs(float(k) - p) < 1e-6:
            return v / 1e6
    return None


def parse_fio(path):
    """The first job (or group) of fio's JSON in PATH: iops, kiops,
    bw_mib, lat_us (mean completion latency, both directions), io_bytes,
    runtime_s, and the clat percentiles of the direction with the most
    I/Os in ms: p50_ms, p99_ms, p999_ms, max_ms (a percentile fio did
    not report is left out).  None if there is no result."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    i = text.find("{")        # fio may print notes before the JSON
    if i < 0:
        return None
    try:
        j = json.loads(text[i:])["jobs"][0]
    except (ValueError, KeyError, IndexError):
        return None
    iops = bw = latsum = 0.0
    ios = nbytes = 0
    main = None
    for k in ("read", "write"):
        s = j.get(k) or {}
        n = s.get("total_ios", 0)
        if not n:
            continue
        iops += s.get("iops", 0.0)
        bw += s.get("bw_bytes", s.get("bw", 0) * 1024)
        nbytes += s.get("io_bytes", 0)
        latsum += s.get("lat_ns", {}).get("mean", 0.0) * n
        if main is None or n > main[0]:
            main = (n, s)
        ios += n
    if ios == 0:
        return None
    out = dict(iops=iops, kiops=iops / 1000.0, bw_mib=bw / 1048576.0,
               lat_us=latsum / ios / 1000.0, io_bytes=nbytes,
               runtime_s=j.get("job_runtime", 0) / 1000.0)
    clat = main[1].get("clat_ns") or {}
    for key, p in (("p50_ms", 50.0), ("p99_ms", 99.0), ("p999_ms", 99.9)):
        v = _pct(clat, p)
        if v is not None:
            out[key] = v
    if "max" in clat:
        out["max_ms"] = clat["max"] / 1e6
    return out


# -- repeated runs ------------------------------------------------------------

def median(vals):
    """The median of VALS without the Nones; None if none is left."""
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def spread(vals):
    """(min, max) of VALS without the Nones; (None, None) if none."""
    vals = [v for v in vals if v is not None]
    return (min(vals), max(vals)) if vals else (None, None)


def merge_runs(rs):
    """Repeated runs of one test (dicts of numbers, None for a failed
    run): the median of each key all of them have, kiops_min and
    kiops_max, and runs (their number).  None if every run failed."""
    rs = [r for r in rs if r]
    if not rs:
        return None
    if len(rs) == 1:
        return dict(rs[0], runs=1)
    keys = set.intersection(*(set(r) for r in rs))
    out = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k in keys}
    if "kiops" in keys:
        out["kiops_min"], out["kiops_max"] = spread([r["kiops"] for r in rs])
    out["runs"] = len(rs)
    return out


# -- sizes, counters, the machine -----------------------------------------------

def parse_size(s):
    """1024, 4K, 1.5M, 2GiB ... in bytes (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", str(s))
    if not m:
        raise ValueError("bad size: %s" % s)
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    return int(float(m.group(1)) * mult[m.group(2).lower()])


def fmt_size(n):
    """Bytes in the largest unit that divides them: 64M, 3K, 100."""
    for unit, sh in (("G", 30), ("M", 20), ("K", 10)):
        if n % (1 << sh) == 0 and n >= (1 << sh):
            return "%d%s" % (n >> sh, unit)
    return str(n)


def loadavg():
    """The 1-minute load average (None if unknown)."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
         "TiB": 1 << 40, "PiB": 1 << 50}


def parse_stats(path):
    """nbdkit's stats filter file ("read: N ops, T s, X UNIT, ...", sizes
    rounded by nbdkit to 2 decimals): read_ops, read_bytes, write_ops,
    write_bytes.  None if the file is missing."""
    out = dict(read_ops=0, read_bytes=0, write_ops=0, write_bytes=0)
    try:
        with open(path) as f:
            for line in f:
                m = re.match(r"^(read|write): (\d+) ops, [\d.]+ s, "
                             r"([\d.]+) (\w+)", line)
                if m:
                    out[m.group(1) + "_ops"] = int(m.group(2))
                    out[m.group(1) + "_bytes"] = int(
                        float(m.group(3)) * UNITS.get(m.group(4), 1))
    except OSError:
        return None
    return out


def parse_ssd_stats(path):
    """The filter's ssdcache-stats= file ("name: N" lines) as a dict of
    ints; None if the file is missing."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(":")
                try:
                    out[k.strip()] = int(v.split()[0])
                except (ValueError, IndexError):
                    pass
    except OSError:
        return None
    return out


def header(path):
    """The comment at the top of script PATH (after the #! and SPDX
    lines), without the "# ": its --help."""
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if i == 0 and line.startswith("#!"):
                continue
            if not line.startswith("#"):
                break
            if "SPDX-License-Identifier" in line:
                continue
            out.append(re.sub(r"^# ?", "", line.rstrip("\n")))
    return "\n".join(out)
