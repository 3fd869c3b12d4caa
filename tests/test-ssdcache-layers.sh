#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-ssdcache-filter: the source layout is the architecture.
#
# scripts/check-layers on the built tree: #includes and calls (read
# from the objects with nm) go one way, filter -> bg -> engine -> io ->
# core, no two files of the filter call each other around a circle, and
# no function takes more than seven parameters.

source "$(dirname "$0")/functions.sh"
set -e -x

python3 "$abs_top_srcdir/scripts/check-layers" "$abs_top_srcdir" \
    "$abs_top_builddir"
