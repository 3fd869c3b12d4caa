/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: replacement policies (pure).
 *
 * Owns the per-slot policy state of one cache.  Two policies behind the
 * one interface of evict.h:
 *
 * CLOCK: two bitmaps (resident, referenced) and a hand.  A slot is
 *   referenced when inserted or touched; the hand clears reference bits
 *   as it passes and takes the first unreferenced resident slot the
 *   caller allows.
 *
 * S3-FIFO: a state byte per slot, a small FIFO S kept as a ring of slot
 *   numbers, a main queue M kept as a CLOCK over the slot array, and a
 *   ghost set.
 *   - New pages enter S (probation, target 10% of the slots) with
 *     frequency 0; a hit adds 1 (saturating at 3).
 *   - Evicting from S: the oldest page moves to M (with frequency 0) if
 *     it was hit while in S, else it is evicted and its backend page
 *     number goes to the ghost.
 *   - Evicting from M: a hand goes round the slot array over the slots
 *     in M; a slot with a frequency above 0 has it decreased and is
 *     passed, one with frequency 0 is evicted.  This is FIFO
 *     reinsertion with the order of the slot array instead of the order
 *     of arrival (the S3-FIFO paper notes that CLOCK is the same
 *     algorithm), so M needs no links: moving a slot into M is setting
 *     a bit.
 *   - S is evicted from while it holds at least its target (or M is
 *     empty), M otherwise.
 *   - A new page whose number is in the ghost goes straight into M.
 *   - A slot the caller refuses (dirty, pinned) stays as it is: back to
 *     the head of S, or passed by the hand.
 *   The ring holds ring_cap = min (nslots, nslots / 8 + 16) entries
 *   (S's target plus room for zombies).  evict_remove does not take a
 *   slot out of the ring: it stays there as a "zombie" and is dropped
 *   when it reaches the tail.  A zombie re-inserted for S before that
 *   keeps its place; re-inserted for M it is in M at once and its ring
 *   entry is dropped at the tail.  A bit of the state byte says whether
 *   a slot has a ring entry, so no slot is ever in the ring twice.
 *   When a page enters S and the ring is full (S over its target: the
 *   cache filled without evictions, at start or after removals) the
 *   tail makes room: a zombie is dropped; a page hit while in S is
 *   promoted; any other page goes to M still on probation (a bit of the
 *   state byte): the hand evicts it like S would (to the ghost) unless
 *   it was hit, then it becomes an ordinary page of M (its hint is
 *   that of a page in S until then).
 *   The ghost is a hash of 16-bit fingerprints: buckets of 4, each a
 *   little FIFO (newest first); about 0.9 * nslots entries (the size of
 *   M), so a page is remembered for about one turn of M.  A false ghost
 *   hit (probability ~ 4/65535 per lookup) only puts a page in M early.
 *
 * RAM per slot (exact; evict_ram_bytes returns the total):
 *   CLOCK:   2 bits (0.25 byte): resident and reference bitmaps, 8-byte
 *            words, plus at most 128 bytes (the struct and rounding).
 *   S3-FIFO: 1 byte of state + ring 4 * min (nslots, nslots / 8 + 16)
 *            bytes (<= 0.5 byte per slot + 64 bytes) + ghost 2 bytes *
 *            4 * ceil (0.9 * nslots / 4) (<= 1.8 bytes per slot + 8
 *            bytes): 3.3 bytes per slot, plus a constant < 256 bytes
 *            (with the struct, 112 bytes on x86-64): 3,460,480 bytes
 *            for 2^20 slots, 3,476 for 1000.
 *   Only the chosen policy's arrays are allocated.
 *
 * A search for a victim may be spread over calls (evict_set_step_limit):
 * ev->srch keeps the sweep it is in and that sweep's counters, and the
 * next call, from any thread, goes on with it; others' changes in
 * between only make it end sooner or later, never unbounded.
 *
 * Locking: none inside; the cache metadata lock is held by callers.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "evict.h"
#include "mix.h"

/* S3-FIFO per-slot state byte. */
#define ST_RES     0x01          /* resident (holds a page) */
#define ST_M       0x02          /* in M (else S) */
#define ST_RING    0x04          /* has an entry in S's ring */
#define ST_PROB    0x08          /* in M, but still on probation */
#define ST_FSHIFT  4
#define ST_FMASK   0x30          /* frequency 0..3 */
#define ST_MARK    0x80          /* evict_check only, never left set */
#define FREQ_MAX   3

#define GHOST_WAYS 4
/* Ring entries beyond nslots / 8 (for small caches and zombies). */
#define RING_EXTRA 16

struct evict {
  enum evict_policy policy;
  uint32_t nslots;
  uint32_t resident_count;
  uint32_t hand;                 /* CLOCK, and S3-FIFO's M */
  size_t ram;                    /* heap bytes allocated (evict_ram_bytes) */

  /* CLOCK */
  uint64_t *resident;
  uint64_t *ref;

  /* S3-FIFO */
  uint8_t *st;
  uint32_t *ring;                /* S: ring_cap slot numbers */
  uint32_t ring_cap;
  uint32_t ring_tail;            /* oldest entry */
  uint32_t ring_len;             /* entries (with zombies) */
  uint32_t s_count;              /* resident slots in S */
  uint32_t m_count;              /* resident slots in M */
  uint32_t s_target;
  uint16_t *ghost;               /* gbuckets * GHOST_WAYS fingerprints */
  uint32_t gbuckets;
  evict_page_fn page_fn;
  void *page_opaque;

  /* One bit per EVICT_HINT_GRAIN slots: a hint there may have changed
   * since evict_hints_saved (mark).
   */
  uint64_t *hint_marks;

  /* Steps a call may take (evict_set_step_limit; 0: no limit), and
   * what is left of them in this call.
   */
  uint32_t step_limit;
  uint32_t steps_left;
  /* The search a call that ran out of steps left for the next one
   * (whichever thread makes it): the sweep it was in and its counters.
   * Between calls the policy may change under it (inserts, touches,
   * removals); the counters only bound the search, so it still ends.
   */
  struct {
    bool on;                     /* a search is under way */
    uint8_t phase;               /* enum s3_phase (CLOCK: unused) */
    bool promoted;               /* sweep_small moved a slot to M */
    uint64_t left;               /* steps the sweep may still take */
    uint32_t idle;               /* sweep_main: steps since the last
                                    change; sweep_small: refusals in a
                                    row */
  } srch;
};

/* The sweeps of an S3-FIFO search, in the orders evict_victim and
 * evict_victim_fill take them.
 */
enum s3_phase {
  PH_FILL_SMALL,                 /* fill, S at its target: S alone */
  PH_A_SMALL, PH_A_MAIN,         /* S at its target (or M empty) */
  PH_B_MAIN, PH_B_SMALL, PH_B_MAIN2,  /* else M first; M again if S
                                          promoted */
};

/*----------------------------------------------------------------------
 * Common.
 */

static const char *const names[EVICT_NR_POLICIES] = {
  [EVICT_CLOCK] = "clock",
  [EVICT_S3FIFO] = "s3fifo",
};

const char *
evict_policy_name (enum evict_policy policy)
{
  if ((unsigned) policy >= EVICT_NR_POLICIES)
    return NULL;
  return names[policy];
}

int
evict_policy_parse (const char *name, enum evict_policy *policy)
{
  if (name == NULL)
    return -1;
  for (unsigned i = 0; i < EVICT_NR_POLICIES; ++i)
    if (strcasecmp (name, names[i]) == 0) {
      *policy = (enum evict_policy) i;
      return 0;
    }
  if (strcasecmp (name, "s3-fifo") == 0) {
    *policy = EVICT_S3FIFO;
    return 0;
  }
  if (strcasecmp (name, "default") == 0) {
    *policy = EVICT_DEFAULT;
    return 0;
  }
  return -1;
}

struct evict *
evict_new (uint32_t nslots)
{
  return evict_new_policy (EVICT_DEFAULT, nslots);
}

/* calloc that adds what it allocated to ev->ram. */
static void *
ev_calloc (struct evict *ev, size_t n, size_t size)
{
  void *p;

  if (n == 0)
    n = 1;
  p = calloc (n, size);
  if (p)
    ev->ram += n * size;
  return p;
}

struct evict *
evict_new_policy (enum evict_policy policy, uint32_t nslots)
{
  struct evict *ev;

  if ((unsigned) policy >= EVICT_NR_POLICIES)
    return NULL;
  ev = calloc (1, sizeof *ev);
  if (ev == NULL)
    return NULL;
  ev->ram = sizeof *ev;
  ev->policy = policy;
  ev->nslots = nslots;

  ev->hint_marks = ev_calloc (ev, ((uint64_t) nslots / EVICT_HINT_GRAIN + 64)
                             / 64, sizeof (uint64_t));
  if (ev->hint_marks == NULL)
    goto fail;
  if (policy == EVICT_CLOCK) {
    size_t words = (nslots + 63) / 64;

    ev->resident = ev_calloc (ev, words, sizeof (uint64_t));
    ev->ref = ev_calloc (ev, words, sizeof (uint64_t));
    if (ev->resident == NULL || ev->ref == NULL)
      goto fail;
  }
  else {
    uint64_t gent = ((uint64_t) nslots * 9 + 9) / 10;   /* ceil (0.9 n) */

    ev->gbuckets = (gent + GHOST_WAYS - 1) / GHOST_WAYS;
    if (ev->gbuckets == 0)
      ev->gbuckets = 1;
    ev->ring_cap = nslots / 8 + RING_EXTRA;
    if (ev->ring_cap > nslots)
      ev->ring_cap = nslots;
    ev->st = ev_calloc (ev, nslots, 1);
    ev->ring = ev_calloc (ev, ev->ring_cap, sizeof (uint32_t));
    ev->ghost = ev_calloc (ev, (size_t) ev->gbuckets * GHOST_WAYS,
                           sizeof (uint16_t));
    if (ev->st == NULL || ev->ring == NULL || ev->ghost == NULL)
      goto fail;
    ev->s_target = (nslots + 5) / 10;
    if (ev->s_target == 0)
      ev->s_target = 1;
  }
  return ev;

 fail:
  evict_free (ev);
  return NULL;
}

void
evict_free (struct evict *ev)
{
  if (ev) {
    free (ev->resident);
    free (ev->ref);
    free (ev->st);
    free (ev->ring);
    free (ev->ghost);
    free (ev->hint_marks);
    free (ev);
  }
}

size_t
evict_ram_bytes (const struct evict *ev)
{
  return ev->ram;
}

enum evict_policy
evict_get_policy (const struct evict *ev)
{
  return ev->policy;
}

void
evict_set_page_fn (struct evict *ev, evict_page_fn fn, void *opaque)
{
  ev->page_fn = fn;
  ev->page_opaque = opaque;
}

uint32_t
evict_resident (const struct evict *ev)
{
  return ev->resident_count;
}

/*----------------------------------------------------------------------
 * Bitmaps, and the marks of changed hints.
 */

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

/* Slot s's hint may have changed (every change of its state calls this). */
static void
mark (struct evict *ev, uint32_t s)
{
  set (ev->hint_marks, s / EVICT_HINT_GRAIN, true);
}

bool
evict_hints_changed (const struct evict *ev, uint32_t first, uint32_t n)
{
  for (uint64_t g = first / EVICT_HINT_GRAIN;
       g * EVICT_HINT_GRAIN < (uint64_t) first + n; g++)
    if (bit (ev->hint_marks, g))
      return true;
  return false;
}

void
evict_hints_saved (struct evict *ev, uint32_t first, uint32_t n)
{
  /* Only whole grains are unmarked: one partly outside the range may
   * hold a changed hint that was not saved.
   */
  uint64_t end = (uint64_t) first + n;
  uint64_t g = ((uint64_t) first + EVICT_HINT_GRAIN - 1) / EVICT_HINT_GRAIN;
  uint64_t gend = end >= ev->nslots
    ? (end + EVICT_HINT_GRAIN - 1) / EVICT_HINT_GRAIN : end / EVICT_HINT_GRAIN;

  for (; g < gend; g++)
    set (ev->hint_marks, g, false);
}

/*----------------------------------------------------------------------
 * CLOCK.
 */

static void
clock_insert (struct evict *ev, uint32_t slot, bool ref)
{
  mark (ev, slot);
  if (!bit (ev->resident, slot)) {
    set (ev->resident, slot, true);
    ev->resident_count++;
    set (ev->ref, slot, ref);
  }
  else
    set (ev->ref, slot, true);          /* re-insert: a touch */
}

static void
clock_remove (struct evict *ev, uint32_t slot)
{
  if (bit (ev->resident, slot)) {
    set (ev->resident, slot, false);
    ev->resident_count--;
  }
  set (ev->ref, slot, false);
}

/* May the search take one more step in this call? */
static inline bool
step_ok (struct evict *ev)
{
  if (ev->step_limit == 0)
    return true;
  if (ev->steps_left == 0)
    return false;
  ev->steps_left--;
  return true;
}

/* The search is over, with victim v (or EVICT_NONE). */
static uint32_t
search_done (struct evict *ev, uint32_t v)
{
  ev->srch.on = false;
  return v;
}

static uint32_t
clock_victim (struct evict *ev, evict_can_take_fn can_take, void *opaque)
{
  if (!ev->srch.on) {
    /* Two full turns: the first may only clear reference bits. */
    ev->srch.on = true;
    ev->srch.left = 2 * (uint64_t) ev->nslots + 1;
  }
  while (ev->srch.left > 0) {
    uint32_t s = ev->hand;

    if (!step_ok (ev))
      return EVICT_AGAIN;
    ev->srch.left--;
    ev->hand = (ev->hand + 1) % ev->nslots;
    if (!bit (ev->resident, s))
      continue;
    if (bit (ev->ref, s)) {
      set (ev->ref, s, false);
      mark (ev, s);
      continue;
    }
    if (can_take (opaque, s)) {
      clock_remove (ev, s);
      return search_done (ev, s);
    }
  }
  return search_done (ev, EVICT_NONE);
}

/*----------------------------------------------------------------------
 * S3-FIFO: ghost.
 */

static uint16_t *
ghost_bucket (const struct evict *ev, uint64_t page, uint16_t *fp)
{
  uint64_t h = mix64 (page);
  uint32_t b = (uint32_t) (((h >> 32) * ev->gbuckets) >> 32);

  *fp = (uint16_t) h;
  if (*fp == 0)
    *fp = 1;                    /* 0 marks an empty entry */
  return &ev->ghost[(size_t) b * GHOST_WAYS];
}

static void
ghost_add (struct evict *ev, uint64_t page)
{
  uint16_t fp;
  uint16_t *e = ghost_bucket (ev, page, &fp);
  unsigned k;

  /* Newest first: shift down to the first hole (or drop the oldest). */
  for (k = 0; k < GHOST_WAYS - 1; ++k)
    if (e[k] == 0)
      break;
  for (; k > 0; --k)
    e[k] = e[k - 1];
  e[0] = fp;
}

static bool
ghost_find (const struct evict *ev, uint64_t page, bool take)
{
  uint16_t fp;
  uint16_t *e = ghost_bucket (ev, page, &fp);

  for (unsigned k = 0; k < GHOST_WAYS; ++k)
    if (e[k] == fp) {
      if (take)
        e[k] = 0;
      return true;
    }
  return false;
}

bool
evict_ghost_contains (const struct evict *ev, uint64_t page)
{
  if (ev->policy != EVICT_S3FIFO)
    return false;
  return ghost_find (ev, page, false);
}

/*----------------------------------------------------------------------
 * S3-FIFO: the state byte, S's ring, M's hand.
 */

static unsigned
freq (const struct evict *ev, uint32_t s)
{
  return (ev->st[s] & ST_FMASK) >> ST_FSHIFT;
}

static void
set_freq (struct evict *ev, uint32_t s, unsigned f)
{
  mark (ev, s);
  ev->st[s] = (ev->st[s] & ~ST_FMASK) | (f << ST_FSHIFT);
}

/* Add s at the head of the ring (there must be room). */
static void
ring_push (struct evict *ev, uint32_t s)
{
  uint64_t i = (uint64_t) ev->ring_tail + ev->ring_len;

  if (i >= ev->ring_cap)
    i -= ev->ring_cap;
  ev->ring[i] = s;
  ev->ring_len++;
  ev->st[s] |= ST_RING;
}

/* Take the oldest entry of the ring (which must not be empty). */
static uint32_t
ring_pop (struct evict *ev)
{
  uint32_t s = ev->ring[ev->ring_tail];

  if (++ev->ring_tail == ev->ring_cap)
    ev->ring_tail = 0;
  ev->ring_len--;
  ev->st[s] &= ~ST_RING;
  return s;
}

/* Resident slot s leaves S for M: promoted (hit while in S) or, with
 * prob, still on probation.
 */
static void
to_main (struct evict *ev, uint32_t s, bool prob)
{
  mark (ev, s);
  ev->st[s] = (ev->st[s] & ~(ST_FMASK | ST_PROB)) | ST_M |
    (prob ? ST_PROB : 0);
  ev->s_count--;
  ev->m_count++;
}

/* The ring is full: make room for one entry (see the top of the file). */
static void
ring_make_room (struct evict *ev)
{
  uint32_t s = ring_pop (ev);

  if ((ev->st[s] & (ST_RES | ST_M)) == ST_RES)
    to_main (ev, s, freq (ev, s) == 0);
}

static void
s3_insert (struct evict *ev, uint32_t slot, bool main, unsigned f)
{
  uint8_t st = ev->st[slot];

  if (st & ST_RES) {
    /* Already resident: a touch. */
    if (freq (ev, slot) < FREQ_MAX)
      set_freq (ev, slot, freq (ev, slot) + 1);
    return;
  }
  /* Keep the ring bit, set the rest. */
  mark (ev, slot);
  ev->st[slot] = (st & ST_RING) | ST_RES | (main ? ST_M : 0) |
    (f << ST_FSHIFT);
  ev->resident_count++;
  if (main) {
    ev->m_count++;
    return;                     /* a ring entry left is dropped later */
  }
  ev->s_count++;
  if (st & ST_RING)
    return;                     /* a zombie coming back keeps its place */
  if (ev->ring_len == ev->ring_cap)
    ring_make_room (ev);
  ring_push (ev, slot);
}

static void
s3_remove (struct evict *ev, uint32_t slot)
{
  uint8_t st = ev->st[slot];

  if (!(st & ST_RES))
    return;
  if (st & ST_M)
    ev->m_count--;
  else
    ev->s_count--;
  ev->resident_count--;
  ev->st[slot] = st & ST_RING;  /* a zombie if in the ring */
}

/* Resident slot s leaves the policy as a victim. */
static uint32_t
take (struct evict *ev, uint32_t s, bool ghost)
{
  if (ghost && ev->page_fn) {
    uint64_t page = ev->page_fn (ev->page_opaque, s);
    if (page != EVICT_NO_PAGE)
      ghost_add (ev, page);
  }
  if (ev->st[s] & ST_M)
    ev->m_count--;
  else
    ev->s_count--;
  ev->resident_count--;
  ev->st[s] &= ST_RING;         /* 0: the victim left the ring */
  return s;
}

/* Start a sweep of S: at most one turn of the ring. */
static void
small_begin (struct evict *ev)
{
  ev->srch.left = ev->ring_len;
  ev->srch.idle = 0;
}

/* Pop the ring's entries and process them (see the top of the file),
 * for the sweep small_begin started.  Returns the victim, EVICT_NONE,
 * or EVICT_AGAIN (out of steps).  ev->srch.promoted is set when a slot
 * moved to M.
 */
static uint32_t
sweep_small (struct evict *ev, evict_can_take_fn can_take, void *opaque)
{
  /* Refusals in a row (srch.idle): once a whole turn of the ring has
   * been refused, another turn would only ask again.
   */
  while (ev->srch.left > 0 && ev->ring_len > 0 &&
         ev->srch.idle < ev->ring_len) {
    uint32_t s;

    if (!step_ok (ev))
      return EVICT_AGAIN;
    ev->srch.left--;
    s = ring_pop (ev);
    if ((ev->st[s] & (ST_RES | ST_M)) != ST_RES) {
      ev->srch.idle = 0;
      continue;                 /* zombie, or back for M: dropped */
    }
    if (freq (ev, s) > 0) {     /* re-used on probation: promote */
      to_main (ev, s, false);
      ev->srch.promoted = true;
      ev->srch.idle = 0;
      continue;
    }
    if (!can_take (opaque, s)) {
      ring_push (ev, s);        /* refused: back to the head, as it is */
      ev->srch.idle++;
      continue;
    }
    return take (ev, s, true);
  }
  return EVICT_NONE;
}

/* Start a sweep of M.  A slot's frequency is 0 after FREQ_MAX passes
 * (a probation slot's after one), so FREQ_MAX + 1 turns ask about
 * every slot of M that was there at the start; a turn without any
 * change since the last one ends it sooner.
 */
static void
main_begin (struct evict *ev)
{
  ev->srch.left = (uint64_t) ev->nslots * (FREQ_MAX + 2);
  ev->srch.idle = 0;
}

/* Move M's hand until it takes a slot, at most until every slot of M
 * has frequency 0 and has been refused.  Returns the victim,
 * EVICT_NONE, or EVICT_AGAIN (out of steps).
 */
static uint32_t
sweep_main (struct evict *ev, evict_can_take_fn can_take, void *opaque)
{
  while (ev->srch.left > 0 && ev->srch.idle < ev->nslots &&
         ev->m_count > 0) {
    uint32_t s = ev->hand;
    uint8_t st = ev->st[s];
    unsigned f;

    if (!step_ok (ev))
      return EVICT_AGAIN;
    ev->srch.left--;
    if (++ev->hand == ev->nslots)
      ev->hand = 0;
    if ((st & (ST_RES | ST_M)) != (ST_RES | ST_M)) {
      ev->srch.idle++;
      continue;
    }
    f = freq (ev, s);
    if (f > 0) {
      if (st & ST_PROB) {       /* hit on probation: an M page now */
        ev->st[s] = (st & ~(ST_FMASK | ST_PROB));
        mark (ev, s);
      }
      else
        set_freq (ev, s, f - 1);
      ev->srch.idle = 0;
      continue;
    }
    if (!can_take (opaque, s)) {
      ev->srch.idle++;
      continue;
    }
    return take (ev, s, st & ST_PROB);
  }
  return EVICT_NONE;
}

/* Go to sweep phase ph. */
static void
s3_enter (struct evict *ev, enum s3_phase ph)
{
  ev->srch.phase = ph;
  if (ph == PH_A_MAIN || ph == PH_B_MAIN || ph == PH_B_MAIN2)
    main_begin (ev);
  else
    small_begin (ev);
}

/* The first sweep of evict_victim.  Sweeps only move slots from S to M,
 * so S then M visits every resident slot; M first needs M again only
 * if S promoted a slot.
 */
static enum s3_phase
s3_first (const struct evict *ev)
{
  return ev->s_count >= ev->s_target || ev->m_count == 0
    ? PH_A_SMALL : PH_B_MAIN;
}

/* After the sweep of the current phase found no victim: the next
 * phase, or false if the search is over.
 */
static bool
s3_next (struct evict *ev)
{
  switch ((enum s3_phase) ev->srch.phase) {
  case PH_FILL_SMALL:
    /* A fill does not take M's pages while S is full but busy. */
    if (ev->s_count >= ev->s_target)
      return false;
    ev->srch.promoted = false;
    s3_enter (ev, s3_first (ev));
    return true;
  case PH_A_SMALL: s3_enter (ev, PH_A_MAIN); return true;
  case PH_B_MAIN: s3_enter (ev, PH_B_SMALL); return true;
  case PH_B_SMALL:
    if (!ev->srch.promoted)
      return false;
    s3_enter (ev, PH_B_MAIN2);
    return true;
  default:
    return false;
  }
}

/* Go on with the search (or start one: fill says which), sweep after
 * sweep, until a victim, the end, or the end of this call's steps.
 */
static uint32_t
s3_search (struct evict *ev, evict_can_take_fn can_take, void *opaque,
           bool fill)
{
  if (!ev->srch.on) {
    ev->srch.on = true;
    ev->srch.promoted = false;
    s3_enter (ev, fill && ev->s_count >= ev->s_target && ev->m_count > 0
              ? PH_FILL_SMALL : s3_first (ev));
  }
  for (;;) {
    enum s3_phase ph = ev->srch.phase;
    uint32_t v = ph == PH_A_MAIN || ph == PH_B_MAIN || ph == PH_B_MAIN2
      ? sweep_main (ev, can_take, opaque)
      : sweep_small (ev, can_take, opaque);

    if (v == EVICT_AGAIN)
      return v;
    if (v != EVICT_NONE || !s3_next (ev))
      return search_done (ev, v);
  }
}

/*----------------------------------------------------------------------
 * Dispatch.
 */

void
evict_insert (struct evict *ev, uint32_t slot)
{
  if (ev->policy == EVICT_CLOCK)
    clock_insert (ev, slot, true);
  else
    s3_insert (ev, slot, false, 0);
}

bool
evict_insert_page (struct evict *ev, uint32_t slot, uint64_t page)
{
  if (ev->policy == EVICT_CLOCK) {
    clock_insert (ev, slot, true);
    return false;
  }
  if (ev->st[slot] & ST_RES) {
    s3_insert (ev, slot, false, 0);        /* a touch */
    return false;
  }
  if (ghost_find (ev, page, true)) {
    s3_insert (ev, slot, true, 0);
    return true;
  }
  s3_insert (ev, slot, false, 0);
  return false;
}

void
evict_touch (struct evict *ev, uint32_t slot)
{
  if (ev->policy == EVICT_CLOCK) {
    if (bit (ev->resident, slot) && !bit (ev->ref, slot)) {
      set (ev->ref, slot, true);
      mark (ev, slot);
    }
  }
  else if (ev->st[slot] & ST_RES) {
    unsigned f = freq (ev, slot);
    if (f < FREQ_MAX)
      set_freq (ev, slot, f + 1);
  }
}

void
evict_remove (struct evict *ev, uint32_t slot)
{
  if (ev->policy == EVICT_CLOCK)
    clock_remove (ev, slot);
  else
    s3_remove (ev, slot);
}

void
evict_set_step_limit (struct evict *ev, uint32_t steps)
{
  ev->step_limit = steps;
}

/* A victim, EVICT_NONE or EVICT_AGAIN; fill: evict_victim_fill's. */
static uint32_t
victim (struct evict *ev, evict_can_take_fn can_take, void *opaque,
        bool fill)
{
  if (ev->resident_count == 0)
    return search_done (ev, EVICT_NONE);
  ev->steps_left = ev->step_limit;
  if (ev->policy == EVICT_CLOCK)
    return clock_victim (ev, can_take, opaque);
  return s3_search (ev, can_take, opaque, fill);
}

uint32_t
evict_victim (struct evict *ev, evict_can_take_fn can_take, void *opaque)
{
  return victim (ev, can_take, opaque, false);
}

uint32_t
evict_victim_fill (struct evict *ev, evict_can_take_fn can_take, void *opaque)
{
  return victim (ev, can_take, opaque, true);
}

uint8_t
evict_slot_hint (const struct evict *ev, uint32_t slot)
{
  if (ev->policy == EVICT_CLOCK)
    return bit (ev->resident, slot) && bit (ev->ref, slot);
  if (!(ev->st[slot] & ST_RES))
    return 0;
  if ((ev->st[slot] & (ST_M | ST_PROB)) != ST_M)    /* on probation */
    return freq (ev, slot) > 0 ? 1 : 0;
  return freq (ev, slot) >= 2 ? 3 : 2;
}

void
evict_insert_hint (struct evict *ev, uint32_t slot, uint8_t hint)
{
  if (ev->policy == EVICT_CLOCK) {
    clock_insert (ev, slot, hint > 0);
    return;
  }
  switch (hint) {
  case 0: s3_insert (ev, slot, false, 0); break;
  case 1: s3_insert (ev, slot, false, 1); break;
  case 2: s3_insert (ev, slot, true, 0); break;
  default: s3_insert (ev, slot, true, 2); break;
  }
}

/*----------------------------------------------------------------------
 * Self-check (for tests).
 */

static int
clock_check (const struct evict *ev)
{
  uint32_t n = 0;

  for (uint32_t s = 0; s < ev->nslots; ++s) {
    n += bit (ev->resident, s);
    if (bit (ev->ref, s) && !bit (ev->resident, s))
      return 1;
  }
  if (n != ev->resident_count)
    return 2;
  if (ev->nslots > 0 && ev->hand >= ev->nslots)
    return 3;
  return 0;
}

static int
s3_check (struct evict *ev)
{
  uint32_t live = 0, s_res = 0, m_res = 0, i = ev->ring_tail;
  int err = 0;

  if (ev->ring_len > ev->ring_cap ||
      (ev->ring_cap > 0 && ev->ring_tail >= ev->ring_cap) ||
      ev->ring_cap > ev->nslots ||
      (ev->nslots > 0 && ev->hand >= ev->nslots))
    return 10;
  /* Every ring entry: a slot with the ring bit, seen once (marked). */
  for (uint32_t k = 0; k < ev->ring_len && err == 0; ++k) {
    uint32_t s = ev->ring[i];

    if (++i == ev->ring_cap)
      i = 0;
    if (s >= ev->nslots || !(ev->st[s] & ST_RING))
      err = 11;
    else if (ev->st[s] & ST_MARK)
      err = 12;                 /* twice in the ring */
    else {
      ev->st[s] |= ST_MARK;
      live += (ev->st[s] & (ST_RES | ST_M)) == ST_RES;
    }
  }
  /* Every slot: the ring bit iff in the ring; counts; no stray bits. */
  for (uint32_t s = 0; s < ev->nslots; ++s) {
    uint8_t st = ev->st[s];

    if (err == 0 && !(st & ST_RING) != !(st & ST_MARK))
      err = 13;
    ev->st[s] = st & ~ST_MARK;
    if (st & ST_RES) {
      if (st & ST_M)
        m_res++;
      else
        s_res++;
      if ((st & ST_PROB) && !(st & ST_M) && err == 0)
        err = 14;
    }
    else if ((st & ~(ST_RING | ST_MARK)) != 0 && err == 0)
      err = 15;                 /* a free slot keeps only its ring bit */
  }
  if (err)
    return err;
  if (live != s_res || s_res != ev->s_count)
    return 16;                  /* every slot of S is in the ring */
  if (m_res != ev->m_count || s_res + m_res != ev->resident_count)
    return 17;
  return 0;
}

int
evict_check (struct evict *ev)
{
  if (ev->policy == EVICT_CLOCK)
    return clock_check (ev);
  return s3_check (ev);
}
