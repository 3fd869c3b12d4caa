/* nbdkit-ssdcache-filter: replacement policy, CLOCK (pure).
 *
 * Owns two bitmaps (resident, referenced) and the clock hand.  A slot
 * is referenced when inserted or touched; the hand clears reference
 * bits as it passes and takes the first unreferenced resident slot the
 * caller allows.  Two bits of RAM per slot.
 *
 * Locking: none inside; the cache metadata lock is held by callers.
 */
#include <stdlib.h>

#include "evict.h"

struct evict {
  uint32_t nslots;
  uint32_t hand;
  uint32_t resident_count;
  uint64_t *resident;
  uint64_t *ref;
};

static bool
bit (const uint64_t *m, uint32_t i)
{
  return (m[i / 64] >> (i % 64)) & 1;
}

static void
set (uint64_t *m, uint32_t i, bool v)
{
  if (v)
    m[i / 64] |= UINT64_C (1) << (i % 64);
  else
    m[i / 64] &= ~(UINT64_C (1) << (i % 64));
}

struct evict *
evict_new (uint32_t nslots)
{
  struct evict *ev = calloc (1, sizeof *ev);
  size_t words = (nslots + 63) / 64;

  if (ev == NULL)
    return NULL;
  ev->nslots = nslots;
  ev->resident = calloc (words ? words : 1, sizeof (uint64_t));
  ev->ref = calloc (words ? words : 1, sizeof (uint64_t));
  if (ev->resident == NULL || ev->ref == NULL) {
    evict_free (ev);
    return NULL;
  }
  return ev;
}

void
evict_free (struct evict *ev)
{
  if (ev) {
    free (ev->resident);
    free (ev->ref);
    free (ev);
  }
}

void
evict_insert (struct evict *ev, uint32_t slot)
{
  if (!bit (ev->resident, slot)) {
    set (ev->resident, slot, true);
    ev->resident_count++;
  }
  set (ev->ref, slot, true);
}

void
evict_touch (struct evict *ev, uint32_t slot)
{
  if (bit (ev->resident, slot))
    set (ev->ref, slot, true);
}

void
evict_remove (struct evict *ev, uint32_t slot)
{
  if (bit (ev->resident, slot)) {
    set (ev->resident, slot, false);
    ev->resident_count--;
  }
  set (ev->ref, slot, false);
}

uint32_t
evict_victim (struct evict *ev, evict_can_take_fn can_take, void *opaque)
{
  /* Two full turns: the first may only clear reference bits. */
  uint64_t steps = 2 * (uint64_t) ev->nslots + 1;

  if (ev->resident_count == 0)
    return EVICT_NONE;
  while (steps-- > 0) {
    uint32_t s = ev->hand;

    ev->hand = (ev->hand + 1) % ev->nslots;
    if (!bit (ev->resident, s))
      continue;
    if (bit (ev->ref, s)) {
      set (ev->ref, s, false);
      continue;
    }
    if (can_take (opaque, s)) {
      evict_remove (ev, s);
      return s;
    }
  }
  return EVICT_NONE;
}

uint32_t
evict_resident (const struct evict *ev)
{
  return ev->resident_count;
}
