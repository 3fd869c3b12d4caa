/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter tests: an LD_PRELOAD shim that injects I/O
 * errors into one file.
 *
 * While the file named by $FAULTIO_TRIGGER exists, pread, pwrite and
 * fdatasync on any descriptor open on the file $FAULTIO_PATH fail with
 * errno $FAULTIO_ERRNO (a number, default EIO).  $FAULTIO_OPS ("rw" by
 * default) limits the failures to reads ("r") or writes ("w", which
 * includes fdatasync).  $FAULTIO_SIZES, a comma-separated list of byte
 * counts, limits them to preads and pwrites of those sizes (fdatasync
 * then never fails): e.g. 8192 fails a cache page's data write but not
 * its 64-byte entry write.  Everything else goes to the C library.
 *
 * Used by test-ssdcache-cache-errors.sh to make the cache device fail
 * under a running nbdkit.  Test code only: it is slow (a readlink per
 * call) and not thread-clever, which is fine there.
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
#include <unistd.h>

/* Is count one of $FAULTIO_SIZES (SIZE_MAX: not a read or write)? */
static bool
size_listed (size_t count)
{
  const char *sizes = getenv ("FAULTIO_SIZES");
  char *end;

  if (sizes == NULL || *sizes == '\0')
    return true;
  if (count == SIZE_MAX)
    return false;
  while (*sizes) {
    unsigned long long v = strtoull (sizes, &end, 10);
    if (end == sizes)
      return false;
    if (v == count)
      return true;
    sizes = *end == ',' ? end + 1 : end;
  }
  return false;
}

static bool
should_fail (int fd, char op, size_t count)
{
  const char *path = getenv ("FAULTIO_PATH");
  const char *trigger = getenv ("FAULTIO_TRIGGER");
  const char *ops = getenv ("FAULTIO_OPS");
  char link[64], target[PATH_MAX];
  ssize_t n;

  if (path == NULL || trigger == NULL || access (trigger, F_OK) != 0)
    return false;
  if (ops && strchr (ops, op) == NULL)
    return false;
  if (!size_listed (count))
    return false;
  snprintf (link, sizeof link, "/proc/self/fd/%d", fd);
  n = readlink (link, target, sizeof target - 1);
  if (n <= 0)
    return false;
  target[n] = '\0';
  if (strcmp (target, path) != 0)
    return false;
  errno = getenv ("FAULTIO_ERRNO") ? atoi (getenv ("FAULTIO_ERRNO")) : EIO;
  return true;
}

#define NEXT(name) \
  static __typeof__ (name) *next_##name; \
  if (!next_##name) next_##name = dlsym (RTLD_NEXT, #name)

ssize_t
pread (int fd, void *buf, size_t count, off_t offset)
{
  NEXT (pread);
  if (should_fail (fd, 'r', count))
    return -1;
  return next_pread (fd, buf, count, offset);
}

ssize_t
pread64 (int fd, void *buf, size_t count, off_t offset)
{
  NEXT (pread64);
  if (should_fail (fd, 'r', count))
    return -1;
  return next_pread64 (fd, buf, count, offset);
}

ssize_t
pwrite (int fd, const void *buf, size_t count, off_t offset)
{
  NEXT (pwrite);
  if (should_fail (fd, 'w', count))
    return -1;
  return next_pwrite (fd, buf, count, offset);
}

ssize_t
pwrite64 (int fd, const void *buf, size_t count, off_t offset)
{
  NEXT (pwrite64);
  if (should_fail (fd, 'w', count))
    return -1;
  return next_pwrite64 (fd, buf, count, offset);
}

int
fdatasync (int fd)
{
  NEXT (fdatasync);
  if (should_fail (fd, 'w', SIZE_MAX))
    return -1;
  return next_fdatasync (fd);
}
