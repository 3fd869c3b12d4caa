/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: admission helpers (pure: no I/O, no nbdkit).
 *
 * Decide whether a miss should fill the cache at all.  Two independent
 * filters:
 *
 *  - Sequential cutoff (admit_seq): tracks up to nstreams concurrent
 *    sequential streams by the span of their requests.  A request up
 *    to ADMIT_SEQ_REORDER times its length ahead of or behind the end
 *    of that span still belongs to the stream: requests in flight
 *    together reach the filter in any order.  A stream's run counts
 *    the bytes of the span it wrote: a request behind the end counts
 *    only where one ahead of it had left a hole, so rewriting one block
 *    over and over is never a stream.  A stream with more than a
 *    quarter of its span in holes (random requests that land near each
 *    other) is not sequential.  Once a stream has run sequentially for
 *    cutoff bytes, the rest of it bypasses the cache (misses are served
 *    from the backend and not inserted; hits are still served from the
 *    cache).  A request that continues no stream starts a new one,
 *    replacing the least recently used stream.  Memory: 48 bytes per
 *    tracked stream.
 *
 *  - Promotion after N misses (admit_nhit): a page is admitted on its
 *    N-th miss within a window; before that a miss leaves it out.  A
 *    counting filter of nentries 8-bit counters keyed by a hash of the
 *    page number (two counters per page, the smaller counts: a count-min
 *    sketch with conservative update), aged by halving one counter per
 *    call, so each counter is halved every nentries calls.  Memory:
 *    nentries bytes, whatever the backend size.  Collisions can only
 *    admit a page early, never keep it out longer.
 *
 * Locking: none inside.  Each object must be used under one lock held
 * by the caller (e.g. the cache metadata lock, or a per-connection lock
 * for per-connection stream tracking).  Nothing here blocks or
 * allocates except the _new functions.
 */
#ifndef SSDCACHE_ADMIT_H
#define SSDCACHE_ADMIT_H

#include <stdbool.h>
#include <stdint.h>

#define ADMIT_SEQ_DEFAULT_CUTOFF  (4u << 20)   /* bytes */
#define ADMIT_SEQ_DEFAULT_STREAMS 16
#define ADMIT_SEQ_REORDER         8     /* requests that may overtake */
#define ADMIT_NHIT_DEFAULT_N      1            /* 1: admit every miss */

struct admit_seq;

/* cutoff 0 disables the filter (everything is admitted).  nstreams >= 1
 * (0 is taken as 1).  NULL on ENOMEM.
 */
extern struct admit_seq *admit_seq_new (uint64_t cutoff, unsigned nstreams);
extern void admit_seq_free (struct admit_seq *as);

/* Account a request [offset, offset + len) and return how many of its
 * leading bytes are admitted (0..len); the bytes after them are beyond
 * the stream's cutoff and should bypass the cache.  Pages wholly inside
 * the admitted prefix are admitted, a page straddling its end may be
 * treated either way (the caller rounds).
 */
extern uint64_t admit_seq_access (struct admit_seq *as, uint64_t offset,
                                  uint64_t len);

/* Bytes a stream whose request just ended at end may still run before
 * its cutoff (0 once past it); UINT64_MAX with the filter off or if no
 * tracked stream ends there (or a little past it, see above).
 */
extern uint64_t admit_seq_left (const struct admit_seq *as, uint64_t end);

/* Counters for the simulator and stats: requests seen, requests that
 * continued a stream, bytes refused.
 */
struct admit_seq_stats {
  uint64_t requests;
  uint64_t sequential;
  uint64_t bypassed_bytes;
};
extern void admit_seq_get_stats (const struct admit_seq *as,
                                 struct admit_seq_stats *st);

struct admit_nhit;

/* n: misses needed for admission (n <= 1: admit on the first miss, the
 * filter is then a no-op and allocates nothing).  nentries: counters
 * (rounded up to a power of 2, at least 64); a good size is a few times
 * the number of distinct pages expected to miss within a window, e.g.
 * 2 * the number of cache slots.  n is capped at 255.  NULL on ENOMEM.
 */
extern struct admit_nhit *admit_nhit_new (unsigned n, uint32_t nentries);
extern void admit_nhit_free (struct admit_nhit *an);

/* A miss on page: count it and return true if the page should now be
 * admitted (it has missed at least n times recently).
 */
extern bool admit_nhit_miss (struct admit_nhit *an, uint64_t page);
/* The current estimate of recent misses of page (no update). */
extern unsigned admit_nhit_count (const struct admit_nhit *an, uint64_t page);

#endif /* SSDCACHE_ADMIT_H */
