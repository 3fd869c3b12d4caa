#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: a short run of the chaos harness (chaos.py).
#
# Four segments with fixed seeds, about 15 s of load each, so 60 to 90
# seconds in all: model-checked reads, writes, zeroes, trims, flushes
# and cache requests from several connections and export names while
# the driver switches modes, drains, invalidates, restarts nbdkit,
# kills it with -9 (the backing file is then checked against the
# contract), and injects cache-file faults and backend errors; a
# watchdog fails on any request or command taking longer than 60 s
# (generous: nothing correct takes that long, even on a loaded
# machine) and logs every thread's stack.
#
#   1. file FILE, writeback, flush order
#   2. file dir=DIR (an export per name), writethrough, offset order
#   3. file FILE, writearound, offset order, cache faults likely
#   4. ssh (an sshd of the test's own), writeback, flush order, warm-up,
#      readahead and 8 connections (skipped without sshd or the ssh
#      plugin: scripts/deps installs them)
#
# `make check-chaos` runs the same harness for minutes in every mode
# and order.  CHAOS_TEST_SEED=S changes the seeds.
source "$(dirname "$0")/functions.sh"
set -e

requires "$PYTHON" -c 'import nbd'
[ -x "$SSDCACHE_TOOL" ] || fail "ssdcache tool not found: $SSDCACHE_TOOL (make)"
[ -f "$abs_top_builddir/tests/shim/.libs/faultio.so" ] ||
    fail "faultio shim not built (make check builds it)"
command -v gdb >/dev/null ||
    echo "$0: warning: no gdb: a hang would be reported without stacks"

chaos="$testsrcdir/chaos.py"
seed="${CHAOS_TEST_SEED:-27}"
status=0

run_chaos ()
{
    local t0=$SECONDS
    echo "== chaos.py $*"
    if ! "$PYTHON" "$chaos" --hang-seconds 60 --iterations 1 \
         --segment-seconds 15 --workdir "$tmpdir/chaos" "$@"; then
        status=1
    fi
    rm -rf "$tmpdir/chaos"
    echo "== $((SECONDS - t0)) s"
}

run_chaos --seed "$seed" --plugin file --mode writeback --order flush
run_chaos --seed "$((seed + 1))" --plugin dir --mode writethrough \
          --order offset
run_chaos --seed "$((seed + 2))" --plugin file --mode writearound \
          --order offset
if [ -x /usr/sbin/sshd ] && nbdkit ssh --version >/dev/null 2>&1; then
    run_chaos --seed "$((seed + 3))" --plugin ssh --mode writeback \
              --order flush --focus item5 --size 32
else
    echo "$0: no sshd or nbdkit ssh plugin: the ssh part is skipped"
fi
exit $status
