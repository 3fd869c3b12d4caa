/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: logging shim for the filter (see log.h).
 *
 * Also defines the debug flags nbdkit sets with -D ssdcache.FLAG=N.
 */
#include <stdarg.h>

#include <nbdkit-filter.h>

#include "log.h"

NBDKIT_DLL_PUBLIC int ssdcache_debug_verbose = 0;
NBDKIT_DLL_PUBLIC int ssdcache_debug_recovery = 0;
NBDKIT_DLL_PUBLIC int ssdcache_debug_verify = 0;
NBDKIT_DLL_PUBLIC int ssdcache_debug_readahead = 0;
NBDKIT_DLL_PUBLIC int ssdcache_debug_warm = 0;
NBDKIT_DLL_PUBLIC int ssdcache_debug_order = 0;
NBDKIT_DLL_PUBLIC int ssdcache_debug_resize_kill = 0;
NBDKIT_DLL_PUBLIC int ssdcache_debug_evict_steps = 0;
NBDKIT_DLL_PUBLIC int ssdcache_debug_epoch_span = 0;

void
log_error (const char *fs, ...)
{
  va_list args;

  va_start (args, fs);
  nbdkit_verror (fs, args);
  va_end (args);
}

void
log_debug (const char *fs, ...)
{
  va_list args;

  va_start (args, fs);
  nbdkit_vdebug (fs, args);
  va_end (args);
}
