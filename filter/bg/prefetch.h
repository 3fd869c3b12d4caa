/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: prefetch, the threads that run readahead's reads.
 *
 * Owns the prefetch workers (which read from the backend through a
 * context of their own, a piece of a range each, and store into the
 * cache), their queue of ranges
 * to prefetch, and the per-connection readahead state (struct
 * prefetch_conn: a struct readahead, see readahead.h, and its lock).
 * A client read only records what it did and maybe queues a range: it
 * never waits for a prefetch.  Ranges already queued or being read are
 * never queued twice; pages already cached are skipped when the range
 * is read; pages are stored through the engine's usual clean-fill path,
 * so readahead never evicts dirty data and never waits for a slot.
 *
 * Locking: pf->lock protects the queue, the pieces being read and the
 * stop flag; it is never held across I/O.  pc->lock protects one
 * connection's readahead state.  Lock order: pc->lock, then pf->lock;
 * neither is held while taking c->lock.
 */
#ifndef SSDCACHE_PREFETCH_H
#define SSDCACHE_PREFETCH_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"

struct prefetch_conn;

/* Start / stop the prefetch workers (stop waits for them, dropping what
 * is still queued).  Readahead works only while they run.
 */
extern int prefetch_start (struct cache *c, const struct cache_backend *be);
extern void prefetch_stop (struct cache *c);

/* Readahead state for a new client connection: NULL when readahead is
 * off or not running (the connection then never prefetches).
 */
extern struct prefetch_conn *prefetch_conn_new (struct cache *c);
extern void prefetch_conn_free (struct prefetch_conn *pc);

/* After a client read of [offset, offset+count) on pc's connection:
 * used bytes came from prefetched pages read for the first time;
 * fill_limit: where the sequential cutoff of its stream stops caching
 * (UINT64_MAX: nowhere), so no prefetch reaches past it.
 */
extern void prefetch_note_read (struct cache *c, struct prefetch_conn *pc,
                                uint64_t offset, uint32_t count,
                                uint64_t used, uint64_t fill_limit);

/* Around each client read of pc's connection (pc may be NULL): the
 * bytes it has in flight.
 */
extern void prefetch_read_begin (struct prefetch_conn *pc, uint32_t count);
extern void prefetch_read_end (struct prefetch_conn *pc, uint32_t count);

/* Wait until nothing is queued or being read (tests). */
extern void prefetch_drain (struct cache *c);

#endif /* SSDCACHE_PREFETCH_H */
