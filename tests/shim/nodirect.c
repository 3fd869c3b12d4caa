/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter tests: an LD_PRELOAD shim that makes the file
 * system refuse direct I/O.
 *
 * open and open64 of the file $NODIRECT_PATH with O_DIRECT fail with
 * EINVAL, as Linux does on a file system without direct I/O (tmpfs
 * before Linux 6.6).  Everything else goes to the C library.  Used by
 * test-ssdcache-direct.sh; test code only.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int
refused (const char *path, int flags)
{
  const char *p = getenv ("NODIRECT_PATH");

  if (!(flags & O_DIRECT) || p == NULL || strcmp (p, path) != 0)
    return 0;
  errno = EINVAL;
  return 1;
}

#define NEXT(name) \
  static __typeof__ (name) *next_##name; \
  if (!next_##name) next_##name = dlsym (RTLD_NEXT, #name)

/* name (open or open64), failing where refused says.  The mode is
 * there only with O_CREAT or O_TMPFILE.
 */
#define NODIRECT_OPEN(name)                                     \
  int                                                           \
  name (const char *path, int flags, ...)                       \
  {                                                             \
    mode_t mode = 0;                                            \
                                                                \
    NEXT (name);                                                \
    if (flags & (O_CREAT | O_TMPFILE)) {                        \
      va_list ap;                                               \
      va_start (ap, flags);                                     \
      mode = va_arg (ap, mode_t);                               \
      va_end (ap);                                              \
    }                                                           \
    if (refused (path, flags))                                  \
      return -1;                                                \
    return next_##name (path, flags, mode);                     \
  }

NODIRECT_OPEN (open)
NODIRECT_OPEN (open64)
