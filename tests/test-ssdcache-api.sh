#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: the nbdkit-facing sources compile with
# gcc -Werror against the installed nbdkit headers (the filter API of
# this nbdkit version: scripts/check-nbdkit-api, which also takes other
# versions' headers).
source "$(dirname "$0")/functions.sh"
set -e -u -x

requires gcc --version
requires pkg-config --exists nbdkit

"$abs_top_srcdir/scripts/check-nbdkit-api" > "$tmpdir/out" 2>&1 || {
    cat "$tmpdir/out"
    fail "the filter does not compile cleanly against nbdkit $(nbdkit --version)"
}
cat "$tmpdir/out"
