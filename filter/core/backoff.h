/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: per-run backoff of failed writeback.
 *
 * Owns struct backoff: runs of pages whose writeback failed, each with
 * the time before which it is not tried again.  A run that fails again
 * waits twice as long (BACKOFF_MIN_MS to BACKOFF_MAX_MS); one written
 * back is forgotten.  Only the failing runs wait: the rest of a pass
 * goes on.  No locking of its own (engine/clean.c holds the pass's);
 * no nbdkit, no I/O.
 */
#ifndef SSDCACHE_BACKOFF_H
#define SSDCACHE_BACKOFF_H

#include <stdbool.h>
#include <stdint.h>

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define BACKOFF_RUNS 64          /* runs remembered (the oldest goes) */

struct backoff_run {
  uint64_t first, last;          /* pages */
  uint64_t until_ms;             /* not tried before this */
  uint32_t delay_ms;             /* the last wait */
};

struct backoff {
  struct backoff_run run[BACKOFF_RUNS];
  unsigned n;
};

/* Writeback of pages [first, last] failed at now_ms. */
extern void backoff_failed (struct backoff *b, uint64_t first, uint64_t last,
                            uint64_t now_ms);
/* ... or succeeded: runs within [first, last] are forgotten. */
extern void backoff_done (struct backoff *b, uint64_t first, uint64_t last);
/* Must page wait at now_ms? */
extern bool backoff_waits (const struct backoff *b, uint64_t page,
                           uint64_t now_ms);

#endif /* SSDCACHE_BACKOFF_H */
