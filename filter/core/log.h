/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: logging shim.
 *
 * The core modules (pool, cache) report through these two functions so
 * that they do not depend on nbdkit.  log-nbdkit.c maps them to
 * nbdkit_error/nbdkit_debug in the filter; log-stderr.c maps them to
 * stderr for the unit tests.
 */
#ifndef SSDCACHE_LOG_H
#define SSDCACHE_LOG_H

extern void log_error (const char *fs, ...)
  __attribute__ ((format (printf, 1, 2)));
extern void log_debug (const char *fs, ...)
  __attribute__ ((format (printf, 1, 2)));

/* Debug flags, set with -D ssdcache.FLAG=1 (see the man page). */
extern int ssdcache_debug_verbose;   /* every cache decision */
extern int ssdcache_debug_recovery;  /* page table load details */
extern int ssdcache_debug_verify;    /* ssdcache-verify: each page that
                                        differs from the backend */
extern int ssdcache_debug_readahead; /* streams, windows, prefetches */
extern int ssdcache_debug_warm;      /* warm-up requests */
extern int ssdcache_debug_order;     /* flush order: generations */
extern int ssdcache_debug_resize_kill; /* tests: SIGKILL at this step of
                                          a resize (resize.c) */
extern int ssdcache_debug_evict_steps; /* tests: the policy's step limit
                                          (CACHE_EVICT_STEPS) */
extern int ssdcache_debug_epoch_span; /* tests: the page table's epoch
                                         span (pagetable_test_epoch_span) */

#endif /* SSDCACHE_LOG_H */
