/* nbdkit-ssdcache-filter: replacement policy (pure: no I/O, no nbdkit).
 *
 * Owns the choice of which resident slot to reuse when the cache is
 * full.  The policy knows only slot numbers; whether a slot may be
 * taken (not pinned, not dirty) is asked through a callback, so the
 * policy can never pick dirty data.  Policy: CLOCK (second chance).
 *
 * Locking: none inside; called with the cache metadata lock held.
 */
#ifndef SSDCACHE_EVICT_H
#define SSDCACHE_EVICT_H

#include <stdbool.h>
#include <stdint.h>

#define EVICT_NONE UINT32_MAX

struct evict;

typedef bool (*evict_can_take_fn) (void *opaque, uint32_t slot);

extern struct evict *evict_new (uint32_t nslots);
extern void evict_free (struct evict *ev);

/* slot now holds a page (newly filled or loaded at start-up). */
extern void evict_insert (struct evict *ev, uint32_t slot);
/* slot was used by a request (a hit). */
extern void evict_touch (struct evict *ev, uint32_t slot);
/* slot no longer holds a page. */
extern void evict_remove (struct evict *ev, uint32_t slot);

/* Choose a resident slot for which can_take returns true and remove it
 * from the policy.  EVICT_NONE if no resident slot may be taken.
 */
extern uint32_t evict_victim (struct evict *ev, evict_can_take_fn can_take,
                              void *opaque);

/* Number of resident slots the policy tracks. */
extern uint32_t evict_resident (const struct evict *ev);

#endif /* SSDCACHE_EVICT_H */
