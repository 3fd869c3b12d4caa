/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter tests: an LD_PRELOAD shim that injects I/O
 * errors into one file (or a family of files).
 *
 * While the file named by $FAULTIO_TRIGGER exists, pread, pwrite and
 * fdatasync on any descriptor open on the file $FAULTIO_PATH fail with
 * errno $FAULTIO_ERRNO (a number, default EIO).  A $FAULTIO_PATH that
 * ends in '*' is a prefix: every file whose path starts with the rest
 * (a cache file and the per-export files named after it) is hit.
 *
 * Which calls fail can be narrowed:
 *
 *   FAULTIO_OPS    "rw" by default: reads ("r") and/or writes ("w",
 *                  which includes fdatasync); "s": fdatasync alone.
 *   FAULTIO_SIZES  a comma-separated list of byte counts, e.g.
 *                  "8192" or "4096,8192": only reads and writes of
 *                  exactly one of these sizes fail (fdatasync, which
 *                  has no size, then never fails).  Unset or empty:
 *                  any size.
 *   FAULTIO_RATE   the percentage (0 to 100, default 100) of the
 *                  matching calls that fail, chosen by a per-thread
 *                  pseudo-random sequence seeded from $FAULTIO_SEED
 *                  (default 1) and the thread id.
 *   FAULTIO_DELAY_MS  the matching calls do not fail: each waits this
 *                  many milliseconds, then goes to the C library (a
 *                  slow device).
 *
 * Everything else goes to the C library.  Used by
 * test-ssdcache-cache-errors.sh and chaos.py to make the cache device
 * fail under a running nbdkit.  Test code only: it is slow (an
 * access(2) and a readlink per call), which is fine there.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

/* Is size one of the sizes listed in $FAULTIO_SIZES (or is the list
 * unset or empty)?  size (size_t) -1: a call with no size.
 */
static bool
size_matches (size_t size)
{
  const char *sizes = getenv ("FAULTIO_SIZES");
  const char *p;

  if (sizes == NULL || *sizes == '\0')
    return true;
  if (size == (size_t) -1)
    return false;
  p = sizes;
  while (*p) {
    char *end;
    unsigned long long v = strtoull (p, &end, 10);

    if (end == p)
      break;                    /* malformed: stop here */
    if (v == size)
      return true;
    p = end;
    while (*p == ',' || *p == ' ')
      p++;
  }
  return false;
}

/* true for $FAULTIO_RATE percent of the calls (a per-thread xorshift
 * sequence, so that threads do not share state).
 */
static bool
rate_hit (void)
{
  static __thread uint64_t state;
  const char *rate = getenv ("FAULTIO_RATE");
  int pct = rate && *rate ? atoi (rate) : 100;

  if (pct >= 100)
    return true;
  if (pct <= 0)
    return false;
  if (state == 0) {
    const char *seed = getenv ("FAULTIO_SEED");
    state = (seed ? strtoull (seed, NULL, 10) : 1) * 0x9E3779B97F4A7C15ULL
      ^ (uint64_t) syscall (SYS_gettid);
    if (state == 0)
      state = 1;
  }
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return (int) (state % 100) < pct;
}

static bool
path_matches (const char *target, const char *path)
{
  size_t n = strlen (path);

  if (n > 0 && path[n - 1] == '*')
    return strncmp (target, path, n - 1) == 0;
  return strcmp (target, path) == 0;
}

static bool
should_fail (int fd, char op, size_t size)
{
  const char *path = getenv ("FAULTIO_PATH");
  const char *trigger = getenv ("FAULTIO_TRIGGER");
  const char *ops = getenv ("FAULTIO_OPS");
  char link[64], target[PATH_MAX];
  ssize_t n;

  if (path == NULL || trigger == NULL || access (trigger, F_OK) != 0)
    return false;
  if (ops && strchr (ops, op) == NULL &&
      !(op == 's' && strchr (ops, 'w') != NULL))
    return false;
  if (!size_matches (size))
    return false;
  snprintf (link, sizeof link, "/proc/self/fd/%d", fd);
  n = readlink (link, target, sizeof target - 1);
  if (n <= 0)
    return false;
  target[n] = '\0';
  if (!path_matches (target, path))
    return false;
  if (!rate_hit ())
    return false;
  if (getenv ("FAULTIO_DELAY_MS")) {
    /* Slow, not failing. */
    const long ms = atol (getenv ("FAULTIO_DELAY_MS"));
    const struct timespec ts = { ms / 1000, ms % 1000 * 1000000 };

    nanosleep (&ts, NULL);
    return false;
  }
  errno = getenv ("FAULTIO_ERRNO") ? atoi (getenv ("FAULTIO_ERRNO")) : EIO;
  return true;
}

#define NEXT(name) \
  static __typeof__ (name) *next_##name; \
  if (!next_##name) next_##name = dlsym (RTLD_NEXT, #name)

/* name (a pread or pwrite of the C library, buf of type buf_type),
 * failing where should_fail says for op.
 */
#define FAULT_IO(name, buf_type, op)                            \
  ssize_t                                                       \
  name (int fd, buf_type buf, size_t count, off_t offset)       \
  {                                                             \
    NEXT (name);                                                \
    if (should_fail (fd, op, count))                            \
      return -1;                                                \
    return next_##name (fd, buf, count, offset);                \
  }

FAULT_IO (pread, void *, 'r')
FAULT_IO (pread64, void *, 'r')
FAULT_IO (pwrite, const void *, 'w')
FAULT_IO (pwrite64, const void *, 'w')

int
fdatasync (int fd)
{
  NEXT (fdatasync);
  if (should_fail (fd, 's', (size_t) -1))
    return -1;
  return next_fdatasync (fd);
}
