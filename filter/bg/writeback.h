/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the writeback thread.
 *
 * Owns the background thread that writes dirty pages back to the
 * backend (through a backend context of its own): the watermarks, idle
 * cleaning, and full passes on demand (client FLUSH in flush-to-backend
 * mode).  The passes are engine/clean.c's.  Locks: the lock table in
 * docs/design.md.
 */
#ifndef SSDCACHE_WRITEBACK_H
#define SSDCACHE_WRITEBACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache.h"

/* Start / stop the background thread (stop waits for it). */
extern int writeback_start (struct cache *c, const struct cache_backend *be);
extern void writeback_stop (struct cache *c);

/* Wake the thread: somebody waits for a clean slot.  Lock free. */
extern void writeback_kick (struct cache *c);

/* The next length of the hot window (ms), given its length now and how
 * many of the sampled pages that background cleaning wrote back were
 * dirty again one window later (writeback.c).  Pure.
 */
extern uint64_t writeback_hot_next (uint64_t hot_ms, size_t sampled,
                                    size_t redirtied);

/* Is the thread running? */
extern bool writeback_running (struct cache *c);

/* Ask the thread for a full pass (and backend flush), without waiting. */
extern void writeback_request (struct cache *c);

/* Ask the thread for a full pass (and backend flush) and wait for it. */
extern int writeback_request_all (struct cache *c, int *err);

#endif /* SSDCACHE_WRITEBACK_H */
