/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the writeback engine.
 *
 * Owns the background thread that writes dirty pages back to the
 * backend (through a backend context of its own), the watermarks, the
 * rate limit and idle cleaning, and full passes on demand (client FLUSH
 * in flush-to-backend mode, shutdown, mode switch).
 *
 * Locking: wb->lock protects the request/answer generations and the
 * stop flag; wb->pass_lock makes passes run one at a time (it is held
 * across backend I/O, but only passes wait for it).  Pages are range
 * locked (without waiting: busy pages are retried later) while their
 * dirty data is read from the cache and written to the backend, and
 * again while their entries are marked clean after the backend flush.
 * Lock order: c->lock is never held while taking wb->lock.
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

/* Write back dirty pages until at most target remain (0: all), using
 * be, in backend offset order, adjacent pages coalesced; limited: keep
 * to ssdcache-writeback-rate (background cleaning only: never a flush,
 * an exit or a mode switch, which wait for it).  Returns 0, 1
 * if some pages were busy and skipped, -1 (*err) if some page could not
 * be written back (it stays dirty).
 */
extern int writeback_pass (struct cache *c, const struct cache_backend *be,
                           uint64_t target, bool limited, int *err);

/* Write back the dirty sectors of one page now, from the caller's
 * thread: slot s holds page, is pinned (the pin stays), and the page is
 * range locked by the caller.  The backend is flushed, then the slot is
 * marked clean.  For a writer that needs a slot when there is none.
 */
extern int writeback_page_locked (struct cache *c,
                                  const struct cache_backend *be,
                                  uint64_t page, uint32_t s, int *err);

/* The next length of the hot window (ms), given its length now and how
 * many of the sampled pages that background cleaning wrote back were
 * dirty again one window later (writeback.c).  Pure.
 */
extern uint64_t writeback_hot_next (uint64_t hot_ms, size_t sampled,
                                    size_t redirtied);

/* Ask the thread for a full pass (and backend flush) and wait for it. */
extern int writeback_request_all (struct cache *c, int *err);

#endif /* SSDCACHE_WRITEBACK_H */
