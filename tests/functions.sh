# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter tests: shared shell helpers.
#
# Sourced by every test-ssdcache-*.sh script:
#
#   source "$(dirname "$0")/functions.sh"
#   set -e -x
#
# Works under `make check` (tests/Makefile.am exports abs_top_builddir,
# abs_top_srcdir, SSDCACHE_FILTER and PYTHON) and when a script is run
# by hand from the build tree (cd tests && ./test-ssdcache-foo.sh).
# Safe under `set -u`, on Debian bookworm (nbdkit 1.32, libnbd 1.14)
# and trixie (nbdkit 1.42, libnbd 1.22).
#
# Provides:
#   requires CMD ARGS...      skip the test (exit 77) unless CMD succeeds
#   requires_libnbd [TOOL...] skip unless $PYTHON has the libnbd module
#                             and each libnbd TOOL (nbdsh, nbdcopy...) runs
#   requires_filter NAME...   skip unless nbdkit has each filter NAME
#   cleanup_fn CMD ARGS...    run CMD at exit (last registered runs first)
#   fail MESSAGE...           print "FAIL: MESSAGE" and exit 1
#   start_nbdkit -P PIDFILE ARGS...
#                             nbdkit in the background, wait until it is
#                             serving, kill it at exit
#   start_ssdcache -P PIDFILE ARGS...
#                             start_nbdkit with the filter under test
#                             first (outermost)
#   run_ssdcache [--timeout SECS] ARGS...
#                             nbdkit -U - with the filter under test
#                             first, in the foreground (ARGS usually
#                             end with --run COMMAND)
#   expect_ssdcache_failure PATTERN ARGS...
#                             expect_start_failure with the filter
#   stop_nbdkit PIDFILE       SIGTERM, wait for a clean exit
#   crash_nbdkit PIDFILE      SIGKILL, wait until it is gone
#   sock_uri SOCKET           NBD URI of a Unix socket
#   stat_get FILE NAME        a counter from an ssdcache-stats file
#   expect_stat FILE NAME OP N [WHY]
#                             that counter (or backend_read_bytes,
#                             backend_read_ops) compares to N by OP
#   expect_warm STATS BSTATS SIZE WHY
#                             a restart that read SIZE bytes was warm
#   wait_until SECS CMD...    poll CMD until it succeeds, for SECS at most
#   expect_export WHERE FILE WHY
#                             a full read of the export (nbdcopy) is FILE
#   write_flush WHERE OFFSET LENGTH CHAR
#                             write LENGTH bytes CHAR at OFFSET, flush
#   backend_read_bytes FILE   bytes read, from a stats filter statsfile
#   backend_read_ops FILE     read requests, from a stats filter statsfile
#   random_file FILE SIZE     FILE with SIZE random bytes
#   shim_path NAME            the LD_PRELOAD shim shim/NAME.c, built
#                             by make check
#   version_lt TOOL X.Y       TOOL's version (nbdkit, nbdfuse...: the
#                             number after its name in TOOL --version)
#                             is older than X.Y
#   $tmpdir                   a private directory, removed at exit
#   $img $cache $sock $pid    the usual names of a test's files in
#   $log $ctl $trigger        $tmpdir (see below)
#   $stats $bstats
#   $SSDCACHE_FILTER          absolute path of the filter under test
#   $SSDCACHE_TOOL            absolute path of the ssdcache tool
#   expect_check STATUS FILE [PATTERN...]
#                             "ssdcache check FILE" exits STATUS and its
#                             stdout and stderr match every PATTERN
#   expect_predicted STATS    the counters that check (the last
#                             expect_check) predicted for the next start
#                             are those in ssdcache-stats file STATS
#   $PYTHON, $random_io       interpreter with libnbd, random-io.py path;
#                             PYTHONPATH lets its scripts import ssdtest
#                             (whose last section has helpers for the
#                             Python of these tests: connect,
#                             expect_export, expect_file, expect_error)

# -- where things are ---------------------------------------------------

testsrcdir="$(cd "$(dirname "$0")" && pwd)"
: "${abs_top_srcdir:=$(cd "$testsrcdir/.." && pwd)}"
if [ -z "${abs_top_builddir:-}" ]; then
    if [ -d "$PWD/../filter" ]; then
        abs_top_builddir="$(cd "$PWD/.." && pwd)"
    else
        abs_top_builddir="$abs_top_srcdir"
    fi
fi
: "${SSDCACHE_FILTER:=$abs_top_builddir/filter/.libs/nbdkit-ssdcache-filter.so}"
: "${PYTHON:=/usr/bin/python3}"
random_io="$testsrcdir/random-io.py"
export abs_top_srcdir abs_top_builddir SSDCACHE_FILTER PYTHON random_io
# Python run by a test (a heredoc too) can "import ssdtest".
export PYTHONPATH="$testsrcdir${PYTHONPATH:+:$PYTHONPATH}"
: "${SSDCACHE_TOOL:=$abs_top_builddir/tools/ssdcache}"
export SSDCACHE_TOOL

# Keep the C locale so error messages and tool output are predictable.
export LANG=C LC_ALL=C

# -- cleanup ------------------------------------------------------------

_cleanup_cmds=()

# cleanup_fn CMD ARGS...: run CMD ARGS at exit, whatever the outcome.
cleanup_fn ()
{
    local quoted
    quoted="$(printf '%q ' "$@")"
    _cleanup_cmds+=("$quoted")
}

_run_cleanups ()
{
    local status=$? i
    set +e
    for (( i = ${#_cleanup_cmds[@]} - 1; i >= 0; i-- )); do
        eval "${_cleanup_cmds[i]}"
    done
    exit $status
}
trap _run_cleanups EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# -- basic checks -------------------------------------------------------

# fail MESSAGE...: the test failed.
fail ()
{
    echo "$0: FAIL: $*" >&2
    exit 1
}

# requires CMD ARGS...: skip (exit 77) unless CMD ARGS runs successfully.
requires ()
{
    if ! ( "$@" ) </dev/null >/dev/null 2>&1; then
        echo "$0: test skipped because this failed: $*"
        exit 77
    fi
}

# The filter under test must have been built: a missing filter is a
# failure, not a reason to skip.
if [ ! -f "$SSDCACHE_FILTER" ]; then
    fail "filter not found: $SSDCACHE_FILTER (build it first: make)"
fi
requires nbdkit --version
requires nbdkit file --version

# requires_libnbd [TOOL...]: skip unless $PYTHON has the libnbd Python
# bindings and each libnbd TOOL (nbdsh, nbdcopy, nbdinfo...) runs.
requires_libnbd ()
{
    local t
    requires "$PYTHON" -c 'import nbd'
    for t in "$@"; do
        requires "$t" --version
    done
}

# requires_filter NAME...: skip unless nbdkit has each filter NAME.
requires_filter ()
{
    local f
    for f in "$@"; do
        requires nbdkit --filter="$f" null --version
    done
}

# -- private temporary directory ----------------------------------------

# /var/tmp rather than /tmp: it is on disk on most systems, and the
# cache file may be opened with O_DIRECT, which tmpfs refuses.
tmpdir="$(mktemp -d "${TMPDIR:-/var/tmp}/ssdcache-$(basename "$0" .sh).XXXXXX")"
cleanup_fn rm -rf "$tmpdir"
export tmpdir
# nbdkit -U - creates its socket under $TMPDIR: keep that private too.
export TMPDIR="$tmpdir"
# Nothing may land in the user's own cache directory.
export NBDKIT_SSDCACHE_DIR="$tmpdir/default-cache-dir"
export XDG_CACHE_HOME="$tmpdir/xdg-cache"

# The usual names of a test's files, so that tests need not repeat
# them (a test may still choose others): the backing image, the cache
# file, nbdkit's socket, pid file and log, the control socket, the
# trigger file of the error filter or the faultio shim, the filter's
# ssdcache-stats file and the statsfile of nbdkit's stats filter.
img="$tmpdir/disk.img"
cache="$tmpdir/disk.ssdcache"
sock="$tmpdir/sock"
pid="$tmpdir/nbdkit.pid"
log="$tmpdir/nbdkit.log"
ctl="$tmpdir/ctl.sock"
trigger="$tmpdir/trigger"
stats="$tmpdir/stats"
bstats="$tmpdir/backend.stats"

# nbdsh runs "python3 -mnbd": make sure "python3" is an interpreter
# that has the libnbd bindings ($PYTHON), whatever comes first on PATH.
if ! python3 -c 'import nbd' >/dev/null 2>&1 &&
   "$PYTHON" -c 'import nbd' >/dev/null 2>&1; then
    mkdir "$tmpdir/bin"
    ln -s "$(command -v "$PYTHON")" "$tmpdir/bin/python3"
    export PATH="$tmpdir/bin:$PATH"
fi

# -- the whole suite with direct I/O (make check-direct) ----------------

# With SSDCACHE_TEST_DIRECT set (and not 0), every nbdkit that loads the
# ssdcache filter, from the tests or from the Python helpers they run,
# gets ssdcache-direct=true added to its parameters (unless the command
# says ssdcache-direct= itself): an "nbdkit" wrapper first on PATH.
if [ -n "${SSDCACHE_TEST_DIRECT:-}" ] && [ "$SSDCACHE_TEST_DIRECT" != 0 ] &&
   [ -z "${_ssdcache_direct_wrapped:-}" ]; then
    _real_nbdkit="$(command -v nbdkit)"
    mkdir -p "$tmpdir/direct-bin"
    cat > "$tmpdir/direct-bin/nbdkit" <<END_OF_WRAPPER
#!/bin/bash
# functions.sh, SSDCACHE_TEST_DIRECT: ssdcache-direct=true for the filter.
uses=0 given=0
for a in "\$@"; do
    case "\$a" in
        ssdcache-direct=*) given=1 ;;
        --filter=*ssdcache*|*nbdkit-ssdcache-filter*) uses=1 ;;
    esac
done
if [ \$uses = 1 ] && [ \$given = 0 ]; then
    exec "$_real_nbdkit" "\$@" ssdcache-direct=true
fi
exec "$_real_nbdkit" "\$@"
END_OF_WRAPPER
    chmod +x "$tmpdir/direct-bin/nbdkit"
    export PATH="$tmpdir/direct-bin:$PATH"
    export _ssdcache_direct_wrapped=1
    echo "$0: SSDCACHE_TEST_DIRECT: nbdkit runs the filter with ssdcache-direct=true"
fi

# -- nbdkit in the background -------------------------------------------

# start_nbdkit -P PIDFILE ARGS...: start "nbdkit -f -P PIDFILE ARGS..."
# in the background (stderr goes to the test log), wait until it has
# written PIDFILE (it is serving by then) and make sure it is killed at
# exit.  $NBDKIT_VERBOSE=1 adds -v.
start_nbdkit ()
{
    local pidfile pid i
    if [ "$1" != "-P" ] || [ -z "$2" ]; then
        fail "start_nbdkit: the first arguments must be -P PIDFILE"
    fi
    pidfile="$2"
    shift 2
    rm -f "$pidfile"
    # A server killed with SIGKILL leaves its socket behind.
    local prev= a
    for a in "$@"; do
        if [ "$prev" = "-U" ] && [ "$a" != "-" ] && [ -S "$a" ]; then
            rm -f "$a"
        fi
        prev="$a"
    done
    nbdkit ${NBDKIT_VERBOSE:+-v} -f -P "$pidfile" "$@" &
    pid=$!
    _live_pids[$pid]=1
    cleanup_fn _kill_nbdkit_pid "$pid"
    for (( i = 0; i < 300; i++ )); do
        if [ -s "$pidfile" ]; then
            break
        fi
        if ! kill -0 "$pid" 2>/dev/null ||
           [ "$(ps -o stat= -p "$pid" 2>/dev/null | cut -c1)" = "Z" ]; then
            wait "$pid" || true
            unset "_live_pids[$pid]"
            fail "nbdkit exited during start-up: nbdkit $*"
        fi
        sleep 0.1
    done
    [ -s "$pidfile" ] || fail "nbdkit did not write $pidfile in 30s: nbdkit $*"
    [ "$(cat "$pidfile")" = "$pid" ] ||
        fail "pidfile $pidfile holds $(cat "$pidfile"), expected $pid"
}

# Servers started by start_nbdkit and not yet reaped: only those are
# ever signalled (a reaped pid may belong to someone else by now).
declare -A _live_pids=()

_kill_nbdkit_pid ()
{
    local pid="$1"
    [ -n "${_live_pids[$pid]:-}" ] || return 0
    kill -TERM "$pid" 2>/dev/null
    if ! _wait_gone "$pid" 10; then
        kill -KILL "$pid" 2>/dev/null
        _wait_gone "$pid" 10
    fi
    unset "_live_pids[$pid]"
}

# _wait_gone PID SECONDS: wait for PID to exit; sets _exit_status when
# PID is a child of this shell.
_wait_gone ()
{
    local pid="$1" secs="$2" i
    _exit_status=
    for (( i = 0; i < secs * 10; i++ )); do
        if ! kill -0 "$pid" 2>/dev/null; then
            break
        fi
        # A zombie child still answers kill -0: reap it.
        if [ "$(ps -o stat= -p "$pid" 2>/dev/null | cut -c1)" = "Z" ]; then
            break
        fi
        sleep 0.1
    done
    # Still running: kill -0 answers and ps shows a live (non-zombie)
    # state.  An empty ps answer means it was reaped in between: gone.
    local st
    st="$(ps -o stat= -p "$pid" 2>/dev/null | cut -c1)"
    if kill -0 "$pid" 2>/dev/null && [ -n "$st" ] && [ "$st" != "Z" ]; then
        return 1
    fi
    if wait "$pid" 2>/dev/null; then
        _exit_status=0
    else
        _exit_status=$?
    fi
    return 0
}

# stop_nbdkit PIDFILE: clean shutdown (SIGTERM); fails the test if
# nbdkit does not exit within 30 s or exits with an error.
stop_nbdkit ()
{
    _end_nbdkit stop_nbdkit TERM "$1" "did not exit after SIGTERM"
    if [ -n "$_exit_status" ] && [ "$_exit_status" -ne 0 ]; then
        fail "nbdkit (pid $_ended_pid) exited with status $_exit_status after SIGTERM"
    fi
}

# crash_nbdkit PIDFILE: SIGKILL, as a crash would.
crash_nbdkit ()
{
    _end_nbdkit crash_nbdkit KILL "$1" "survived SIGKILL"
}

# _end_nbdkit CALLER SIGNAL PIDFILE FAILURE: send SIGNAL to the server
# of PIDFILE (one start_nbdkit started), wait up to 30 s until it is
# gone (else fail: "nbdkit (pid N) FAILURE") and forget it.  Sets
# _ended_pid, and _exit_status as _wait_gone does.
_end_nbdkit ()
{
    local pid
    pid="$(cat "$3")"
    [ -n "${_live_pids[$pid]:-}" ] || fail "$1: $pid is not a server we started"
    kill -"$2" "$pid"
    _wait_gone "$pid" 30 || fail "nbdkit (pid $pid) $4"
    unset "_live_pids[$pid]"
    rm -f "$3"
    _ended_pid=$pid
}

# expect_start_failure PATTERN NBDKIT-ARGS...: "nbdkit -U - NBDKIT-ARGS"
# must refuse to serve: nbdkit exits with an error and a client run by
# --run can not use the export.  It must not hang (30 s limit), and
# stderr must match the extended regular expression PATTERN.  stderr is
# left in $tmpdir/err.
expect_start_failure ()
{
    local pattern="$1" status=0
    shift
    timeout 30 nbdkit -U - "$@" --run 'nbdinfo --size "$uri"' \
            > "$tmpdir/out" 2> "$tmpdir/err" || status=$?
    cat "$tmpdir/out" "$tmpdir/err"
    if [ $status -eq 124 ]; then
        fail "nbdkit hung (30 s) instead of failing: nbdkit $*"
    fi
    [ $status -ne 0 ] || fail "nbdkit did not refuse to start: nbdkit $*"
    grep -Eq -- "$pattern" "$tmpdir/err" ||
        fail "the error does not match \"$pattern\": nbdkit $*"
}

# -- the filter under test ----------------------------------------------

# Each loads $SSDCACHE_FILTER as the first (outermost) filter, before the
# other filters and the plugin in ARGS.  With SSDCACHE_TEST_DIRECT the
# nbdkit they run is the wrapper above, which adds ssdcache-direct=true.

# start_ssdcache -P PIDFILE ARGS...: start_nbdkit -P PIDFILE
# --filter=ssdcache ARGS... (ARGS: -U SOCKET, more filters, the plugin
# and the parameters).
start_ssdcache ()
{
    if [ "$1" != "-P" ] || [ -z "$2" ]; then
        fail "start_ssdcache: the first arguments must be -P PIDFILE"
    fi
    local pidfile="$2"
    shift 2
    start_nbdkit -P "$pidfile" --filter="$SSDCACHE_FILTER" "$@"
}

# run_ssdcache [--timeout SECS] ARGS...: "nbdkit -U -
# --filter=ssdcache ARGS..." in the foreground; its exit status.  With
# --timeout, nbdkit is killed after SECS seconds (status 124, as with
# timeout(1)).
run_ssdcache ()
{
    local t=()
    if [ "$1" = "--timeout" ]; then
        t=(timeout "$2")
        shift 2
    fi
    "${t[@]}" nbdkit -U - --filter="$SSDCACHE_FILTER" "$@"
}

# expect_ssdcache_failure PATTERN ARGS...: expect_start_failure PATTERN
# --filter=ssdcache ARGS...
expect_ssdcache_failure ()
{
    local pattern="$1"
    shift
    expect_start_failure "$pattern" --filter="$SSDCACHE_FILTER" "$@"
}

# sock_uri SOCKET: the NBD URI of a Unix socket.
sock_uri ()
{
    echo "nbd+unix:///?socket=$1"
}

# -- a client that stays connected --------------------------------------
#
#   hold_client NAME URI CODE   nbdsh on URI runs the Python CODE (its
#                               handle is h), then stays connected; the
#                               call returns once CODE has run (fails
#                               the test if the client failed first)
#   release_client NAME         let it disconnect, and wait for it
#
# For a test that needs an export kept open (its cache attached, its
# threads running) while it looks at something else.  A client still
# held at exit is killed.

declare -A _held_clients

hold_client ()
{
    local name="$1" uri="$2" code="$3" said=""
    rm -f "$tmpdir/$name.held" "$tmpdir/$name.release"
    mkfifo "$tmpdir/$name.held" "$tmpdir/$name.release"
    (
        HELD="$tmpdir/$name.held" RELEASE="$tmpdir/$name.release" \
            nbdsh -u "$uri" -c "$code" -c '
import os
open(os.environ["HELD"], "w").write("held\n")
open(os.environ["RELEASE"]).read()
' || echo failed > "$tmpdir/$name.held"
    ) &
    _held_clients[$name]=$!
    cleanup_fn kill "$!"
    read -r said < "$tmpdir/$name.held"
    [ "$said" = held ] || fail "hold_client $name: the client failed"
}

release_client ()
{
    local name="$1"
    echo > "$tmpdir/$name.release"
    wait "${_held_clients[$name]}"
    unset "_held_clients[$name]"
}

# -- statistics ---------------------------------------------------------

# stat_get FILE NAME: print counter NAME from an ssdcache-stats file
# ("name: value" lines); fails the test if it is missing or not a number.
stat_get ()
{
    local v
    [ -f "$1" ] || fail "stats file $1 was not written"
    v="$(awk -F': *' -v n="$2" '$1 == n { print $2; exit }' "$1")"
    [ -n "$v" ] || fail "counter $2 missing from $1"
    case "$v" in
        *[!0-9]*) fail "counter $2 in $1 is not a number: $v" ;;
    esac
    echo "$v"
}

# expect_stat FILE NAME OP N [WHY]: counter NAME of the ssdcache-stats
# file FILE compares to N by the test(1) operator OP (-eq, -gt, -le...),
# or the test fails, saying WHY and the value.  NAME backend_read_bytes
# or backend_read_ops reads that of nbdkit's stats filter file FILE.
expect_stat ()
{
    local file="$1" name="$2" op="$3" want="$4" why="${5:-}" v
    case "$name" in
        backend_read_bytes|backend_read_ops) v="$("$name" "$file")" ;;
        *) v="$(stat_get "$file" "$name")" ;;
    esac
    [ "$v" "$op" "$want" ] ||
        fail "${why:+$why: }$name is $v, expected $op $want"
}

# expect_warm STATS BSTATS SIZE WHY: a restart that read all SIZE bytes
# of the export was warm: it read at most SIZE / 64 bytes from the
# backend (nbdkit's stats filter file BSTATS) and loaded at least 90 %
# of the 64K pages (ssdcache-stats file STATS).
expect_warm ()
{
    expect_stat "$2" backend_read_bytes -le $(($3 / 64)) "$4"
    expect_stat "$1" loaded_slots -ge $(($3 / 65536 * 9 / 10)) "$4"
}

# backend_read_bytes FILE: bytes read through nbdkit's stats filter
# (from its "read: N ops, T s, X UNIT, ..." line; 0 if no line).
backend_read_bytes ()
{
    _stats_filter_field "$1" read bytes
}

# backend_read_ops FILE: read requests through nbdkit's stats filter.
backend_read_ops ()
{
    _stats_filter_field "$1" read ops
}

_stats_filter_field ()
{
    [ -f "$1" ] || fail "stats filter file $1 was not written"
    awk -v op="$2" -v what="$3" '
        $1 == op ":" {
            # e.g.  read: 12 ops, 0.000744 s, 3.00 MiB, 3.94 GiB/s op, ...
            split($0, f, ", ")
            sub(/^[a-z]+: /, "", f[1])
            if (what == "ops") { split(f[1], a, " "); print a[1]; found = 1; exit }
            split(f[3], b, " ")
            m = 1
            if (b[2] == "KiB") m = 1024
            else if (b[2] == "MiB") m = 1024 * 1024
            else if (b[2] == "GiB") m = 1024 * 1024 * 1024
            else if (b[2] == "TiB") m = 1024 * 1024 * 1024 * 1024
            else if (b[2] != "bytes") {
                print "bad unit " b[2] > "/dev/stderr"; found = 1; exit 1
            }
            printf "%d\n", b[1] * m
            found = 1
            exit
        }
        END { if (!found) print 0 }
    ' "$1"
}

# -- waiting -------------------------------------------------------------

# wait_until SECS CMD ARGS...: run CMD every 0.1 s until it succeeds;
# fails (returns 1) if it has not after SECS seconds.
wait_until ()
{
    local secs="$1" i
    shift
    for (( i = 0; i < secs * 10; i++ )); do
        "$@" && return 0
        sleep 0.1
    done
    "$@"
}

# -- data ---------------------------------------------------------------

# expect_export WHERE FILE WHY: a full read of the export (nbdcopy
# --no-extents, to $tmpdir/copy.img) equals FILE, or the test fails
# saying WHY.  WHERE is an NBD URI or the path of a Unix socket.
expect_export ()
{
    local uri="$1"
    case "$uri" in
        nbd*://*) ;;
        *) uri="$(sock_uri "$1")" ;;
    esac
    nbdcopy --no-extents "$uri" "$tmpdir/copy.img" || fail "$3: nbdcopy failed"
    cmp "$2" "$tmpdir/copy.img" || fail "$3"
}

# write_flush WHERE OFFSET LENGTH CHAR: write LENGTH bytes CHAR (one
# character, e.g. W) at OFFSET of the export (an NBD URI or the path of
# a Unix socket), then flush (ssdtest.write_flush).
write_flush ()
{
    "$PYTHON" -c 'import sys, ssdtest; ssdtest.write_flush(*sys.argv[1:])' "$@"
}

# random_file FILE SIZE: FILE filled with SIZE random bytes.
random_file ()
{
    head -c "$2" /dev/urandom > "$1.tmp"
    [ "$(stat -c %s "$1.tmp")" -eq "$2" ] || fail "could not create $1"
    mv "$1.tmp" "$1"
}

# -- versions -------------------------------------------------------------

# version_lt TOOL X.Y: TOOL's version is older than X.Y (a behaviour of
# one nbdkit or libnbd version is worked around only in that version).
version_lt ()
{
    local v
    v="$("$1" --version 2>/dev/null | awk -v t="$(basename "$1")" '$1 == t { print $2; exit }')"
    [ -n "$v" ] || fail "version_lt: no version from $1 --version"
    "$PYTHON" -c 'import sys
v = [int(x) for x in sys.argv[1].split(".")[:2]]
w = [int(x) for x in sys.argv[2].split(".")[:2]]
sys.exit(0 if v < w else 1)' "$v" "$2"
}

# -- LD_PRELOAD shims -----------------------------------------------------

# shim_path NAME: the path of the LD_PRELOAD shim built from
# shim/NAME.c (check_LTLIBRARIES in tests/Makefile.am: make check
# builds it, without sanitizer flags, next to the tests).  A missing
# shim is a failure, like a missing filter.
shim_path ()
{
    local so="$abs_top_builddir/tests/shim/.libs/$1.so"
    [ -f "$so" ] || fail "shim not built: $so (build it: make check)"
    echo "$so"
}

# -- the ssdcache tool --------------------------------------------------

# expect_check STATUS FILE [PATTERN...]: "ssdcache check FILE" must exit
# with STATUS, and its output (stdout and stderr together, left in
# $tmpdir/check.out) must match each extended regular expression
# PATTERN.  The tool must have been built (make), like the filter.
expect_check ()
{
    local want="$1" file="$2" status=0 pattern
    shift 2
    [ -x "$SSDCACHE_TOOL" ] ||
        fail "ssdcache tool not found: $SSDCACHE_TOOL (build it first: make)"
    "$SSDCACHE_TOOL" check "$file" > "$tmpdir/check.out" 2>&1 || status=$?
    cat "$tmpdir/check.out"
    cp "$tmpdir/check.out" "$tmpdir/check.predicted"
    [ "$status" -eq "$want" ] ||
        fail "ssdcache check $file exited with $status, expected $want"
    for pattern in "$@"; do
        grep -Eq -- "$pattern" "$tmpdir/check.out" ||
            fail "ssdcache check $file: the output does not match \"$pattern\""
    done
}

# expect_predicted STATS: the counters the last expect_check predicted
# for the next start (its "next start" lines, saved as
# $tmpdir/check.predicted) must equal those of the filter's
# ssdcache-stats file STATS, written by that start.
expect_predicted ()
{
    local c want got
    [ -f "$tmpdir/check.predicted" ] || fail "expect_predicted: no prediction"
    for c in loaded_slots dirty_pages dropped_entries damaged_entries \
             dirty_dropped unsealed_dropped verify_failures; do
        want="$(stat_get "$tmpdir/check.predicted" $c)"
        got="$(stat_get "$1" $c)"
        [ "$want" -eq "$got" ] ||
            fail "$c: ssdcache check predicted $want, the filter counted $got"
    done
    rm -f "$tmpdir/check.predicted"
}

# -- real file systems: nbdfuse, a loop device, a mount -------------------

# There is no kernel NBD client here: the export becomes a file through
# FUSE (nbdfuse), a loop device turns that file into a block device,
# and a real file system is made and mounted on it:
#
#   requires_fs_stack       skip (exit 77) unless /dev/fuse, losetup
#                           and loop devices are there (and usable)
#   fs_attach DIR SOCKET    nbdfuse: the export served on SOCKET as the
#                           file DIR/fuse/disk; a loop device on it,
#                           in $fs_dev.  Registers fs_teardown DIR to
#                           run at exit
#   fs_mount DIR [OPTS]     mount $fs_dev on DIR/mnt (mount -o OPTS)
#   fs_umount DIR           unmount DIR/mnt; fails the test if it can't
#   fs_detach DIR           clean teardown (unmount, losetup -d,
#                           fusermount3 -u, nbdfuse exits); fails the
#                           test on any error
#   fs_writer DIR TAG LOG [N CMD...]
#                           files written and fsynced in DIR, each logged
#                           in LOG once durable (CMD after every N)
#   kill_writer             kill and wait for the writer in $writer_pid
#   fs_teardown DIR         teardown that never fails and never leaves
#                           a mount, a loop device or a FUSE mount
#                           behind, also after nbdkit was killed:
#                           umount -l, losetup -d, fusermount3 -u (lazy
#                           and the FUSE connection aborted if busy)
#
# What is attached is recorded in files under DIR, so a teardown run at
# exit (trap) finds it whatever the test did, and only ever detaches
# the loop device it attached itself (the kernel's backing file name
# is checked first: a free loop device may be someone else's by then).
# DIR is a directory of the test's own, e.g. $tmpdir/fs; one stack per
# DIR at a time.  The commands need root (loop devices, mount).

requires_fs_stack ()
{
    if [ ! -c /dev/fuse ]; then
        echo "$0: test skipped: no /dev/fuse"
        exit 77
    fi
    if ! command -v losetup >/dev/null 2>&1; then
        echo "$0: test skipped: no losetup"
        exit 77
    fi
    if ! losetup -f >/dev/null 2>&1; then
        echo "$0: test skipped: no free loop device (losetup -f failed)"
        exit 77
    fi
    # Everything else is installed by scripts/deps: missing is a failure.
    local c
    for c in nbdfuse mount umount mkfs.ext4 e2fsck; do
        command -v "$c" >/dev/null 2>&1 || fail "$c is not installed"
    done
}

declare -A _fs_registered=()

# _fs_mounted PATH: PATH is a mount point (from /proc/self/mountinfo:
# stat(2) would fail with ENOTCONN on a FUSE mount whose daemon died).
_fs_mounted ()
{
    awk -v p="$1" '$5 == p { found = 1 } END { exit !found }' \
        /proc/self/mountinfo
}

# _fs_loop_ours DIR: the loop device recorded in DIR is still attached
# to the file DIR/fuse/disk (same backing file name as right after
# losetup).
_fs_loop_ours ()
{
    local dev back sys
    [ -s "$1/loopdev" ] && [ -s "$1/loopback" ] || return 1
    dev="$(cat "$1/loopdev")"
    back="$(cat "$1/loopback")"
    sys="/sys/block/$(basename "$dev")/loop/backing_file"
    [ -r "$sys" ] && [ "$(cat "$sys" 2>/dev/null)" = "$back" ]
}

fs_attach ()
{
    local dir="$1" sock="$2" pid i dev
    [ -n "$dir" ] && [ -n "$sock" ] || fail "usage: fs_attach DIR SOCKET"
    mkdir -p "$dir/fuse" "$dir/mnt"
    dir="$(cd "$dir" && pwd -P)"
    if [ -z "${_fs_registered[$dir]:-}" ]; then
        cleanup_fn fs_teardown "$dir"
        _fs_registered[$dir]=1
    fi
    [ ! -s "$dir/nbdfuse.pid" ] || fail "fs_attach: a stack is already attached in $dir"
    rm -f "$dir/nbdfuse.ready"
    # libnbd 1.14's nbdfuse aborts on an assertion when the server goes
    # away under it (kill -9): no core file there.  Its mount is then
    # dead, every request fails, and fs_teardown unmounts it.
    local nocore=
    if version_lt nbdfuse 1.16; then
        nocore=1
    fi
    ( [ -z "$nocore" ] || ulimit -c 0
      exec nbdfuse -P "$dir/nbdfuse.ready" "$dir/fuse/disk" --unix "$sock" ) &
    pid=$!
    echo "$pid" > "$dir/nbdfuse.pid"
    for (( i = 0; i < 300; i++ )); do
        [ ! -s "$dir/nbdfuse.ready" ] || break
        kill -0 "$pid" 2>/dev/null || fail "nbdfuse exited during start-up"
        sleep 0.1
    done
    [ -s "$dir/nbdfuse.ready" ] || fail "nbdfuse did not start in 30 s"
    _fs_mounted "$dir/fuse" || fail "nbdfuse is running but $dir/fuse is not mounted"
    dev="$(losetup -f --show "$dir/fuse/disk")" ||
        fail "losetup could not attach $dir/fuse/disk"
    echo "$dev" > "$dir/loopdev"
    cat "/sys/block/$(basename "$dev")/loop/backing_file" > "$dir/loopback"
    fs_dev="$dev"
}

fs_mount ()
{
    local dir="$1"
    [ -s "$dir/loopdev" ] || fail "fs_mount: nothing attached in $dir"
    fs_dev="$(cat "$dir/loopdev")"
    mount ${2:+-o "$2"} "$fs_dev" "$dir/mnt" || fail "mount $fs_dev failed"
}

fs_umount ()
{
    local dir
    dir="$(cd "$1" && pwd -P)"
    _fs_mounted "$dir/mnt" || return 0
    umount "$dir/mnt" || fail "umount $dir/mnt failed"
}

fs_detach ()
{
    local dir i pid
    dir="$(cd "$1" && pwd -P)"
    fs_umount "$dir"
    if _fs_loop_ours "$dir"; then
        losetup -d "$(cat "$dir/loopdev")" || fail "losetup -d failed"
        for (( i = 0; i < 100; i++ )); do
            _fs_loop_ours "$dir" || break
            sleep 0.1
        done
        ! _fs_loop_ours "$dir" || fail "the loop device is still attached"
    fi
    rm -f "$dir/loopdev" "$dir/loopback"
    if _fs_mounted "$dir/fuse"; then
        _fs_fuse_unmount "$dir/fuse" || fail "could not unmount $dir/fuse"
    fi
    if [ -s "$dir/nbdfuse.pid" ]; then
        pid="$(cat "$dir/nbdfuse.pid")"
        _wait_gone "$pid" 10 || fail "nbdfuse did not exit after the unmount"
        wait "$pid" 2>/dev/null || true
        rm -f "$dir/nbdfuse.pid"
    fi
}

# _fs_fuse_unmount PATH [-z]: fusermount3 -u (umount where fuse3's
# fusermount3 is not installed; as root that is the same).
_fs_fuse_unmount ()
{
    if command -v fusermount3 >/dev/null 2>&1; then
        fusermount3 -u ${2:+"$2"} "$1"
    else
        umount ${2:+-l} "$1"
    fi
}

# fs_writer DIR TAG LOG [N CMD...]: create DIR, then files DIR/f1,
# DIR/f2, ... (0 to 192 KiB, rarely block aligned) until something fails
# or it is killed.  A file is in LOG ("TAG/fN SHA256") only once it and
# its directory were fsynced (coreutils sync FILE is fsync(2)).  After
# every N files, CMD runs (the fs crash tests run it in the background).
fs_writer ()
{
    local dir="$1" tag="$2" log="$3" every="${4:-0}"
    local tmp="$tmpdir/writer.data" i=0 n sum
    shift 3; shift $(( $# > 0 ))
    { set +e +x; } 2>/dev/null
    mkdir "$dir" && sync "$dir" && sync "${dir%/*}" || exit 1
    while :; do
        i=$((i + 1))
        n=$(( (RANDOM * 32768 + RANDOM) % 196608 ))
        head -c "$n" /dev/urandom > "$tmp" || exit 1
        sum="$(sha256sum < "$tmp")" || exit 1
        cp "$tmp" "$dir/f$i" || exit 0
        sync "$dir/f$i" || exit 0
        sync "$dir" || exit 0
        echo "$tag/f$i ${sum%% *}" >> "$log"
        if (( every > 0 && i % every == 0 )); then
            "$@"
        fi
    done
}

# kill_writer: kill the background writer whose pid is in $writer_pid,
# if one runs, and wait for it (the fs crash tests; register it with
# cleanup_fn after fs_attach, so that at exit it runs before that
# stack's teardown).  A writer blocked on a dead export is not
# uninterruptible for long: its requests fail.
writer_pid=
kill_writer ()
{
    [ -n "$writer_pid" ] || return 0
    kill -KILL "$writer_pid" 2>/dev/null || true
    _wait_gone "$writer_pid" 30 || true
    wait "$writer_pid" 2>/dev/null || true
    writer_pid=
}

fs_teardown ()
{
    local dir="$1" i pid conn errexit=
    [ -d "$dir" ] || return 0
    dir="$(cd "$dir" && pwd -P)"
    case "$-" in *e*) errexit=1 ;; esac
    set +e
    # The file system, lazily: a busy mount or a dead export can not
    # make this hang or fail.
    _fs_mounted "$dir/mnt" && umount -l "$dir/mnt"
    # The loop device: losetup -d detaches it once the lazily unmounted
    # file system lets go of it (at once if nothing holds it).
    if _fs_loop_ours "$dir"; then
        losetup -d "$(cat "$dir/loopdev")"
        for (( i = 0; i < 300; i++ )); do
            _fs_loop_ours "$dir" || break
            sleep 0.1
        done
        _fs_loop_ours "$dir" &&
            echo "$0: fs_teardown: $(cat "$dir/loopdev") still in use; it detaches when released" >&2
    fi
    rm -f "$dir/loopdev" "$dir/loopback"
    # The FUSE mount: a normal unmount, else abort the connection (every
    # request then fails at once) and unmount lazily.
    if _fs_mounted "$dir/fuse" && ! _fs_fuse_unmount "$dir/fuse"; then
        conn="$(awk -v p="$dir/fuse" '$5 == p { split($3, d, ":"); print d[2] }' \
                    /proc/self/mountinfo)"
        if [ -n "$conn" ] && [ -w "/sys/fs/fuse/connections/$conn/abort" ]; then
            echo 1 > "/sys/fs/fuse/connections/$conn/abort"
        fi
        _fs_fuse_unmount "$dir/fuse" -z
    fi
    # nbdfuse exits once unmounted; only the process started here is
    # ever signalled.
    if [ -s "$dir/nbdfuse.pid" ]; then
        pid="$(cat "$dir/nbdfuse.pid")"
        if ! _wait_gone "$pid" 5; then
            kill -TERM "$pid" 2>/dev/null
            sleep 1
            kill -KILL "$pid" 2>/dev/null
        fi
        wait "$pid" 2>/dev/null
        rm -f "$dir/nbdfuse.pid"
    fi
    [ -z "$errexit" ] || set -e
    return 0
}

# -- bounds: nothing may wait forever (design invariant 12) ---------------

# dump_stacks PID: every thread's stack of process PID (gdb), to stderr.
dump_stacks ()
{
    echo "$0: stacks of pid $1:" >&2
    if command -v gdb >/dev/null 2>&1; then
        timeout 60 gdb -batch -p "$1" -ex 'thread apply all bt' 2>&1 |
            grep -v '^\[New LWP' >&2 || true
    else
        echo "(gdb is not installed)" >&2
    fi
}

# bounded SECS CMD ARGS...: run CMD; if it has not ended after SECS
# seconds, dump the stacks of every nbdkit this test started, kill CMD
# and fail the test ("hung").  Otherwise CMD's exit status.
bounded ()
{
    local secs="$1" status=0 p
    shift
    timeout -k 5 "$secs" "$@" || status=$?
    if [ $status -eq 124 ] || [ $status -eq 137 ]; then
        for p in "${!_live_pids[@]}"; do
            dump_stacks "$p"
        done
        fail "hung: not done after $secs s: $*"
    fi
    return $status
}

# ctl SOCKET COMMAND...: "ssdcache ctl SOCKET COMMAND", bounded (60 s).
ctl_bounded ()
{
    bounded 60 "$SSDCACHE_TOOL" ctl "$@"
}

# -- an SSH server of the test's own ------------------------------------

# start_sshd: an OpenSSH server (a child of the test, stopped at exit)
# on a free loopback port, with its own host key, user key and
# authorized_keys in $tmpdir/ssh.  Skips the test (77) where sshd
# cannot run.  Sets $ssh_port and $sshdir.
start_sshd ()
{
    local attempt i log="$tmpdir/sshd.log"
    requires test -x /usr/sbin/sshd
    requires command -v ssh-keygen
    sshdir="$tmpdir/ssh"
    mkdir -m 0700 "$sshdir"
    ssh-keygen -q -t ed25519 -N '' -C ssdcache-test-host -f "$sshdir/host_key"
    ssh-keygen -q -t ed25519 -N '' -C ssdcache-test-user -f "$sshdir/user_key"
    cp "$sshdir/user_key.pub" "$sshdir/authorized_keys"
    # As root, sshd insists on its privilege separation directory (on a
    # systemd host the sshd service creates it): the standard one.
    if [ "$(id -u)" -eq 0 ] && [ ! -d /run/sshd ]; then
        mkdir -p -m 0755 /run/sshd || {
            echo "$0: test skipped: cannot create /run/sshd for sshd"; exit 77; }
    fi
    _sshd_pid=
    cleanup_fn _stop_sshd
    # The free port found may be taken before sshd binds it: retry.
    for (( attempt = 0; attempt < 5; attempt++ )); do
        ssh_port="$(_free_port)"
        _sshd_config > "$sshdir/sshd_config"
        if ! /usr/sbin/sshd -t -f "$sshdir/sshd_config" 2> "$log"; then
            echo "$0: test skipped: sshd refuses its configuration: $(cat "$log")"
            exit 77
        fi
        /usr/sbin/sshd -D -e -f "$sshdir/sshd_config" 2> "$log" &
        _sshd_pid=$!
        for (( i = 0; i < 100; i++ )); do
            grep -q "Server listening on 127.0.0.1 port $ssh_port" "$log" && break
            kill -0 "$_sshd_pid" 2>/dev/null || break
            sleep 0.1
        done
        grep -q "Server listening on 127.0.0.1 port $ssh_port" "$log" && break
        cat "$log"
        _stop_sshd
    done
    [ -n "$_sshd_pid" ] || {
        echo "$0: test skipped: sshd could not be started on loopback: $(cat "$log")"
        exit 77
    }
    echo "[127.0.0.1]:$ssh_port $(cut -d' ' -f1,2 "$sshdir/host_key.pub")" \
         > "$sshdir/known_hosts"
}

_sshd_config ()
{
    cat <<END_OF_CONFIG
Port $ssh_port
ListenAddress 127.0.0.1
HostKey $sshdir/host_key
PidFile $sshdir/sshd.pid
AuthorizedKeysFile $sshdir/authorized_keys
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowTcpForwarding no
X11Forwarding no
PrintMotd no
MaxSessions 64
MaxStartups 64
Subsystem sftp internal-sftp
END_OF_CONFIG
}

_stop_sshd ()
{
    _stop_daemon _sshd_pid
}

# _free_port: a TCP port on 127.0.0.1 that was free a moment ago (the
# caller retries if it is taken before its server binds it).
_free_port ()
{
    "$PYTHON" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

# _stop_daemon VAR: SIGTERM the server (a child of the test) whose pid
# is in the variable VAR, if any, wait for it and empty VAR.
_stop_daemon ()
{
    local pid="${!1:-}"
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        printf -v "$1" '%s' ''
    fi
}

# ssh_plugin_args IMAGE: the array ssh_args: nbdkit's ssh plugin
# reading IMAGE through start_sshd's server (config= : no ssh client
# configuration of the user or the system is read).
ssh_plugin_args ()
{
    ssh_args=( ssh host=127.0.0.1 port="$ssh_port" user="$(id -un)"
               path="$1" identity="$sshdir/user_key"
               known-hosts="$sshdir/known_hosts" config= timeout=20 )
}

# -- an HTTP server of the test's own -----------------------------------

# start_httpd DIR FILE: lighttpd (a child of the test, stopped at exit)
# serving DIR on a free loopback port; ready once a Range request for
# FILE (a name in DIR) gets exactly its bytes.  Skips the test (77)
# where lighttpd cannot run.  Sets $http_port.
start_httpd ()
{
    local www="$1" probe="$2" attempt i log="$tmpdir/lighttpd.log"
    requires test -x /usr/sbin/lighttpd
    _httpd_pid=
    cleanup_fn _stop_httpd
    for (( attempt = 0; attempt < 5; attempt++ )); do
        http_port="$(_free_port)"
        cat > "$tmpdir/lighttpd.conf" <<END_OF_CONFIG
server.document-root = "$www"
server.port = $http_port
server.bind = "127.0.0.1"
server.pid-file = "$tmpdir/lighttpd.pid"
server.errorlog = "$log"
END_OF_CONFIG
        if ! /usr/sbin/lighttpd -tt -f "$tmpdir/lighttpd.conf" > "$tmpdir/lt.err" 2>&1; then
            echo "$0: test skipped: lighttpd refuses its configuration: $(cat "$tmpdir/lt.err")"
            exit 77
        fi
        /usr/sbin/lighttpd -D -f "$tmpdir/lighttpd.conf" 2>> "$log" &
        _httpd_pid=$!
        for (( i = 0; i < 100; i++ )); do
            _range_ok "http://127.0.0.1:$http_port/$probe" "$www/$probe" && break
            kill -0 "$_httpd_pid" 2>/dev/null || break
            sleep 0.1
        done
        _range_ok "http://127.0.0.1:$http_port/$probe" "$www/$probe" && break
        cat "$log" || :
        _stop_httpd
    done
    [ -n "$_httpd_pid" ] || {
        echo "$0: test skipped: lighttpd could not be started on loopback"
        exit 77
    }
}

# _range_ok URL FILE: a Range request gets "206 Partial Content" and
# exactly the bytes of FILE asked for.
_range_ok ()
{
    "$PYTHON" - "$1" "$2" <<'END_OF_PYTHON'
import sys, urllib.request
req = urllib.request.Request(sys.argv[1], headers={"Range": "bytes=1000-1999"})
try:
    with urllib.request.urlopen(req, timeout=5) as r:
        body = r.read()
        status = r.status
except OSError:
    sys.exit(1)
with open(sys.argv[2], "rb") as f:
    f.seek(1000)
    want = f.read(1000)
sys.exit(0 if status == 206 and body == want else 1)
END_OF_PYTHON
}

_stop_httpd ()
{
    _stop_daemon _httpd_pid
}
