/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: fill behind, the thread that stores a client's
 * read misses after the client has its answer.
 *
 * Owns the thread and its queue of jobs (struct cache_fill_job, made by
 * engine/read.c): a read miss of at least 256 KiB of whole pages is
 * answered from memory and its pages queued here; the thread stores
 * them (cache_fill_job_run) unless a page changed meanwhile.  The queue
 * holds at most BEHIND_MAX_BYTES of data: when it is full the cache
 * cannot keep up with the stream, and the pages are not stored at all
 * (counter fills_behind_dropped).  (The stores still take CPU time a
 * stream could use: docs/performance.md, "Big cold reads".)
 *
 * Locking: b->lock protects the queue, its byte count and the stop
 * flag; it is never held across I/O nor while taking another lock.
 */
#ifndef SSDCACHE_BEHIND_H
#define SSDCACHE_BEHIND_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"

#define BEHIND_MAX_BYTES (64u << 20)
#define BEHIND_NICE 19           /* the thread's nice value */

/* Start the thread.  Stop it (dropping what is still queued: call
 * behind_drain first to store it): only where nobody can be in
 * behind_drain, that is at cache_close (through the engine's hook) or
 * at exit; a last client's leaving only drains.
 */
extern int behind_start (struct cache *c);
extern void behind_stop (struct cache *c);

/* Wait until the jobs queued before the call are done (a clean stop,
 * ctl drain --wait); jobs queued meanwhile are not waited for.
 */
extern void behind_drain (struct cache *c);

#endif /* SSDCACHE_BEHIND_H */
