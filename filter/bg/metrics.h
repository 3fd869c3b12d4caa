/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: live metrics (ssdcache-stats).
 *
 * Owns the thread that rewrites the counters file every interval while
 * nbdkit runs, atomically (a temporary file in the same directory,
 * renamed over it), in the chosen format.  Locks: the lock table in
 * docs/design.md (m->lock: the stop flag and the last sample).
 */
#ifndef SSDCACHE_METRICS_H
#define SSDCACHE_METRICS_H

#include "cache.h"
#include "stats.h"

struct metrics;

/* Write path now, then every interval_s seconds (0: only when
 * metrics_stop is called).  Returns NULL on error (logged).
 */
extern struct metrics *metrics_start (struct cache *c, const char *path,
                                      enum stats_format format,
                                      unsigned interval_s);

/* Stop the thread and write the file a last time.  NULL: nothing. */
extern void metrics_stop (struct metrics *m);

/* Write the counters of c to path atomically.  Returns 0 or -1
 * (logged).
 */
extern int metrics_write_file (struct cache *c, const char *path,
                               enum stats_format format,
                               double writeback_bytes_per_s);

#endif /* SSDCACHE_METRICS_H */
