#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# scripts/bench-pressure's error row: 300 random reads and writes (512 B
# to 200 KiB, one at a time) over an export whose backend fails 10% of
# requests, checked against a model.  A failed write leaves its bytes
# unknown (the backend or the cache may or may not have them); a read
# that succeeds must match every known byte.  Prints "wrong_reads: N".
#
# Usage: pressure-errors.py SOCKET BACKING-FILE [OPS] [SEED]
import random
import sys

import nbd


def matches(got, model, known, off, n):
    """Do the known bytes of [off, off+n) read as the model says?"""
    k = known[off:off + n]
    pos = 0
    while pos < n:
        start = k.find(1, pos)          # the next known run
        if start == -1:
            return True
        end = k.find(0, start)
        if end == -1:
            end = n
        if got[start:end] != model[off + start:off + end]:
            return False
        pos = end
    return True


def main():
    sock, backing = sys.argv[1], sys.argv[2]
    ops = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    rnd = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 7)
    with open(backing, "rb") as fp:
        model = bytearray(fp.read())
    known = bytearray(b"\1" * len(model))
    h = nbd.NBD()
    h.connect_unix(sock)
    size = h.get_size()
    wrong = errors = 0
    for i in range(ops):
        n = rnd.randint(512, 200 * 1024)
        off = rnd.randrange(0, size - n)
        if rnd.random() < 0.5:
            data = rnd.randbytes(n)
            try:
                h.pwrite(data, off)
                model[off:off + n] = data
                known[off:off + n] = b"\1" * n
            except nbd.Error:
                errors += 1
                known[off:off + n] = b"\0" * n
        else:
            try:
                got = h.pread(n, off)
            except nbd.Error:
                errors += 1
                continue
            if not matches (got, model, known, off, n):
                wrong += 1
    h.shutdown()
    print("errors: %d" % errors)
    print("wrong_reads: %d" % wrong)


if __name__ == "__main__":
    main()
