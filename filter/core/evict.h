/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: replacement policy (pure: no I/O, no nbdkit).
 *
 * Owns the choice of which resident slot to reuse when the cache is
 * full.  The policy knows only slot numbers; whether a slot may be
 * taken (not pinned, not dirty) is asked through a callback, so the
 * policy can never pick dirty data.
 *
 * Policies:
 *  - EVICT_S3FIFO (the default): S3-FIFO (Yang et al., SOSP 2023).  A
 *    small FIFO (~10% of the slots) on probation for new pages, a main
 *    queue with reinsertion and a 2-bit frequency (a CLOCK over the
 *    slots), and a ghost set of the
 *    backend page numbers recently evicted from the small FIFO (16-bit
 *    fingerprints, memory bounded by nslots).  Scan resistant.
 *  - EVICT_CLOCK: CLOCK (second chance), the baseline.
 *
 * The ghost needs backend page numbers, which the policy does not keep:
 * the engine supplies them through evict_set_page_fn (to record the page
 * of a victim) and evict_insert_page (to look a new page up).  Without
 * them S3-FIFO still works, it only loses the ghost (every new page
 * then starts on probation).
 *
 * Locking: none inside; every function must be called with the cache
 * metadata lock held (c->lock: the lock table in docs/design.md).
 * No function allocates or frees except evict_new, evict_new_policy and
 * evict_free.
 */
#ifndef SSDCACHE_EVICT_H
#define SSDCACHE_EVICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EVICT_NONE UINT32_MAX
#define EVICT_AGAIN (UINT32_MAX - 1)   /* (never a slot: nslots <= this) */

enum evict_policy {
  EVICT_CLOCK = 0,
  EVICT_S3FIFO = 1,
};
#define EVICT_NR_POLICIES 2
#define EVICT_DEFAULT EVICT_S3FIFO

/* Largest value evict_slot_hint returns. */
#define EVICT_HINT_MAX 3

struct evict;

typedef bool (*evict_can_take_fn) (void *opaque, uint32_t slot);
/* The backend page number held by a resident slot, or EVICT_NO_PAGE:
 * the slot's page is not to be remembered by the ghost when evicted
 * (it was never used: a page readahead brought in that no client read;
 * remembered, its first real read would find it in the ghost and
 * count as a re-use, which under load made a read-ahead scan look hot
 * and flush the hot set).
 */
typedef uint64_t (*evict_page_fn) (void *opaque, uint32_t slot);
#define EVICT_NO_PAGE UINT64_MAX

/* evict_new is the default policy (EVICT_DEFAULT).  NULL on ENOMEM. */
extern struct evict *evict_new (uint32_t nslots);
extern struct evict *evict_new_policy (enum evict_policy policy,
                                       uint32_t nslots);
extern void evict_free (struct evict *ev);
/* Heap bytes the policy allocated (its struct and arrays, as asked of
 * calloc), for the memory budget: about 3.3 per slot for S3-FIFO, 0.25
 * for CLOCK (see evict.c).
 */
extern size_t evict_ram_bytes (const struct evict *ev);

extern enum evict_policy evict_get_policy (const struct evict *ev);
/* "clock", "s3fifo" (also "s3-fifo", "default").  0, or -1 if unknown. */
extern int evict_policy_parse (const char *name, enum evict_policy *policy);
/* "clock", "s3fifo"; NULL for a value out of range. */
extern const char *evict_policy_name (enum evict_policy policy);

/* Tell the policy how to find the backend page of a resident slot
 * (called from evict_victim only, with the same lock held).  Needed by
 * S3-FIFO's ghost; ignored by CLOCK.  fn may be NULL (no ghost).
 */
extern void evict_set_page_fn (struct evict *ev, evict_page_fn fn,
                               void *opaque);

/* slot now holds a page (newly filled or loaded at start-up).  Inserting
 * a resident slot counts as a touch.
 */
extern void evict_insert (struct evict *ev, uint32_t slot);
/* The same, for a newly filled slot whose backend page is known: if the
 * page was evicted recently (it is in the ghost) it goes straight to the
 * main queue.  Returns true on such a ghost hit (the ghost entry is
 * consumed).
 */
extern bool evict_insert_page (struct evict *ev, uint32_t slot,
                               uint64_t page);
/* Whether page is in the ghost (recently evicted from probation).
 * Read only: an admission filter may use it to let such a page in.
 */
extern bool evict_ghost_contains (const struct evict *ev, uint64_t page);

/* slot was used by a request (a hit). */
extern void evict_touch (struct evict *ev, uint32_t slot);
/* slot no longer holds a page. */
extern void evict_remove (struct evict *ev, uint32_t slot);

/* Choose a resident slot for which can_take returns true and remove it
 * from the policy.  EVICT_NONE if no resident slot may be taken (and
 * only then).  can_take is only asked about resident slots.  Work is
 * amortised O(1) and at most a small constant times nslots per search
 * (for S3-FIFO at most 6 * nslots steps of the main queue's hand and
 * two turns of the small queue's ring, about nslots / 4; 2 * nslots
 * for CLOCK)
 * even when can_take refuses every slot.  With a step limit
 * (evict_set_step_limit) a call that reaches it returns EVICT_AGAIN:
 * the caller may let go of its lock and call again, and the next call
 * (from any thread) goes on with the same search where it stopped.
 */
extern uint32_t evict_victim (struct evict *ev, evict_can_take_fn can_take,
                              void *opaque);

/* The same, for a slot to hold data read from the backend, which may
 * as well not be cached (the read is served all the same): with
 * S3-FIFO, when the small queue is at its target and can_take refuses
 * every slot in it (pages still being read or filled, as with many
 * requests of a scan in flight), EVICT_NONE instead of a slot of the
 * main queue, which the policy keeps for pages used more than once.
 * CLOCK: as evict_victim.
 */
extern uint32_t evict_victim_fill (struct evict *ev,
                                   evict_can_take_fn can_take, void *opaque);

/* At most steps steps of the hands and the ring per call of
 * evict_victim and evict_victim_fill (0, the default: no limit), so
 * that no call holds the caller's lock for long, even at the first
 * eviction after a start, which may age every slot of a hot cache.
 */
extern void evict_set_step_limit (struct evict *ev, uint32_t steps);

/* Number of resident slots the policy tracks. */
extern uint32_t evict_resident (const struct evict *ev);

/* Checks the policy's internal invariants (for tests: O(nslots)):
 * 0 if they hold, else a number > 0 naming the first that does not.
 * Changes nothing (it marks and unmarks slots as it goes).
 */
extern int evict_check (struct evict *ev);

/* Persistence of policy state.  A hint is a policy-neutral hotness
 * level 0..EVICT_HINT_MAX of a resident slot:
 *   0  new, not re-used since it came in (probation, cold)
 *   1  re-used while on probation (will be promoted)
 *   2  in the main/protected set, not recently re-used
 *   3  in the main/protected set and re-used (hot)
 * (CLOCK only produces 0 and 1: its reference bit.)  0 for a slot that
 * is not resident.  The engine stores it (2 bits) and, when it loads a
 * warm cache, calls evict_insert_hint instead of evict_insert so that
 * hot pages are known hot after a restart.  A hint written by another
 * policy is accepted (mapped to the nearest state).
 */
extern uint8_t evict_slot_hint (const struct evict *ev, uint32_t slot);
extern void evict_insert_hint (struct evict *ev, uint32_t slot,
                               uint8_t hint);

/* Which hints changed, by grains of EVICT_HINT_GRAIN slots (so that a
 * clean stop rewrites only the entries whose hint changed): a grain is
 * marked whenever a hint in it may have changed, and stays marked
 * until evict_hints_saved.  _changed: is a grain that meets slots
 * [first, first + n) marked?  _saved: the hints of [first, first + n)
 * are on disk: unmark the grains it covers whole (the last grain also
 * when the range runs to the end).
 */
#define EVICT_HINT_GRAIN 4096
extern bool evict_hints_changed (const struct evict *ev, uint32_t first,
                                 uint32_t n);
extern void evict_hints_saved (struct evict *ev, uint32_t first, uint32_t n);

#endif /* SSDCACHE_EVICT_H */
