/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: replacement policies (evict.c, all
 * of them) and admission helpers (admit.c).
 *
 * Known answers are computed by hand from the rules at the top of
 * evict.c and admit.h; the reasoning is in the comments next to them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "admit.h"
#include "evict.h"
#include "victims.h"

/*----------------------------------------------------------------------
 * Names.
 */

static void
test_names (void **state)
{
  enum evict_policy p;

  for (unsigned i = 0; i < EVICT_NR_POLICIES; ++i) {
    const char *n = evict_policy_name (i);
    assert_non_null (n);
    assert_int_equal (evict_policy_parse (n, &p), 0);
    assert_int_equal (p, i);
  }
  assert_string_equal (evict_policy_name (EVICT_CLOCK), "clock");
  assert_string_equal (evict_policy_name (EVICT_S3FIFO), "s3fifo");
  assert_null (evict_policy_name ((enum evict_policy) 99));
  assert_int_equal (evict_policy_parse ("S3-FIFO", &p), 0);
  assert_int_equal (p, EVICT_S3FIFO);
  assert_int_equal (evict_policy_parse ("default", &p), 0);
  assert_int_equal (p, EVICT_DEFAULT);
  assert_int_equal (evict_policy_parse ("lru", &p), -1);
  assert_int_equal (evict_policy_parse ("", &p), -1);
  assert_int_equal (evict_policy_parse (NULL, &p), -1);
  assert_null (evict_new_policy ((enum evict_policy) 99, 10));

  struct evict *ev = evict_new (10);
  assert_non_null (ev);
  assert_int_equal (evict_get_policy (ev), EVICT_DEFAULT);
  evict_free (ev);
}

/*----------------------------------------------------------------------
 * A tiny cache driven like the engine: free slots first (0, 1, ...),
 * then victims; pages given to the policy for the ghost.
 */

struct tiny {
  struct evict *ev;
  uint32_t n, used;
  uint64_t page[64];
  unsigned hits;
  char hitmap[64];
};

static uint64_t
tiny_page (void *opaque, uint32_t slot)
{
  struct tiny *t = opaque;
  return t->page[slot];
}

static void
tiny_run (struct tiny *t, enum evict_policy pol, uint32_t n,
          const char *trace)
{
  size_t len = strlen (trace);

  memset (t, 0, sizeof *t);
  t->n = n;
  t->ev = evict_new_policy (pol, n);
  assert_non_null (t->ev);
  evict_set_page_fn (t->ev, tiny_page, t);
  for (size_t i = 0; i < len; ++i) {
    uint64_t p = trace[i];
    uint32_t s;
    for (s = 0; s < t->used; ++s)
      if (t->page[s] == p)
        break;
    if (s < t->used) {
      t->hits++;
      t->hitmap[i] = 'h';
      evict_touch (t->ev, s);
      continue;
    }
    t->hitmap[i] = '.';
    if (t->used < n)
      s = t->used++;
    else {
      s = evict_victim (t->ev, victims_take_all, NULL);
      assert_true (s < n);
    }
    t->page[s] = p;
    evict_insert_page (t->ev, s, p);
    assert_int_equal (evict_resident (t->ev), t->used);
  }
  evict_free (t->ev);
}

/* 3 slots, trace A B C A D A B E A B (the same trace as
 * tests/test-ssdcache-sim.sh).
 *
 * CLOCK, hand at slot 0, insert sets the reference bit:
 *   A B C fill slots 0 1 2; A hits (4).  D: the hand clears 0 1 2 and
 *   takes slot 0 (A).  A: takes slot 1 (B, unreferenced).  B: takes
 *   slot 2 (C).  E: clears 0 1 2, takes slot 0 (D).  A (slot 1) and
 *   B (slot 2) hit.  Hits: 4, 9, 10.
 * S3-FIFO, 3 slots: S target 1, ghost of 4 entries:
 *   A B C into S; A hits (4, freq 1).  D: S holds 3 >= 1, S's tail A
 *   was re-used: promoted to M; B is taken, ghost {B}; D into S.
 *   A hits (6).  B: victim from S: C, ghost {C B}; B is in the ghost:
 *   straight into M.  E: victim from S (D); E into S.  A, B hit (M).
 *   Hits: 4, 6, 9, 10.
 */
static void
test_tiny_trace (void **state)
{
  struct tiny t;

  tiny_run (&t, EVICT_CLOCK, 3, "ABCADABEAB");
  assert_int_equal (t.hits, 3);
  assert_memory_equal (t.hitmap, "...h....hh", 10);

  tiny_run (&t, EVICT_S3FIFO, 3, "ABCADABEAB");
  assert_int_equal (t.hits, 4);
  assert_memory_equal (t.hitmap, "...h.h..hh", 10);
}

/* S3-FIFO: pages re-used on probation are promoted to M instead of
 * being evicted; M is only evicted from when S is below its target.
 * 10 slots: S target 1.
 */
static void
test_s3fifo_probation (void **state)
{
  struct evict *ev = victims_new_full (EVICT_S3FIFO, 10);

  evict_touch (ev, 3);
  evict_touch (ev, 7);
  assert_int_equal (evict_slot_hint (ev, 3), 1);
  assert_int_equal (evict_slot_hint (ev, 4), 0);
  VICTIMS (ev, 0, 1, 2, 4, 5, 6, 8, 9, 3, 7, EVICT_NONE);
  assert_int_equal (evict_resident (ev), 0);
  evict_free (ev);
}

/* An S3-FIFO policy of n slots, all inserted, whose slots 0 .. hot - 1
 * were used twice: its first victim, checked, promotes them to M and
 * takes slot hot.
 */
static struct evict *
s3fifo_hot (uint32_t n, uint32_t hot)
{
  struct evict *ev = victims_new_full (EVICT_S3FIFO, n);

  for (uint32_t s = 0; s < hot; ++s) {
    evict_touch (ev, s);
    evict_touch (ev, s);
  }
  VICTIMS (ev, hot);
  return ev;
}

/* S3-FIFO: a hot set in M survives a stream of new pages of any length
 * (each new page is evicted from S on the next miss).
 */
static void
test_s3fifo_scan (void **state)
{
  struct evict *ev = s3fifo_hot (10, 5);    /* 0..4 in M, 5 taken */
  uint32_t v;

  for (uint32_t s = 0; s < 5; ++s)
    assert_int_equal (evict_slot_hint (ev, s), 2);
  evict_insert (ev, 5);
  /* A long scan: every victim is one of the scan slots 5..9. */
  for (int i = 0; i < 10000; ++i) {
    v = evict_victim (ev, victims_take_all, NULL);
    assert_true (v >= 5 && v < 10);
    evict_insert (ev, v);
    if (i % 7 == 0)               /* the hot set keeps being used */
      evict_touch (ev, i % 5);
  }
  assert_int_equal (evict_resident (ev), 10);
  evict_free (ev);
}

/* M is a FIFO with reinsertion: frequency buys turns. */
static void
test_s3fifo_main_reinsertion (void **state)
{
  struct evict *ev = evict_new_policy (EVICT_S3FIFO, 10);

  /* Hint 2: M, freq 0; hint 3: M, freq 2. */
  evict_insert_hint (ev, 0, 3);
  evict_insert_hint (ev, 1, 2);
  evict_insert_hint (ev, 2, 2);
  evict_touch (ev, 2);                  /* freq 1 */
  /* S empty: M.  0 (2 -> 1, back), 1 taken. */
  VICTIMS (ev, 1);
  /* 2 (1 -> 0), 0 (1 -> 0), 2 taken. */
  VICTIMS (ev, 2, 0, EVICT_NONE);
  evict_free (ev);
}

/*----------------------------------------------------------------------
 * Marks of changed hints (what a clean stop saves).
 */

static bool
take_any (void *opaque, uint32_t slot)
{
  return true;
}

/* Save the hints of [first, first + n) if marked, as save_hints does. */
static void
save_range (struct evict *ev, uint8_t *saved, uint32_t first, uint32_t n)
{
  if (!evict_hints_changed (ev, first, n))
    return;
  for (uint32_t s = first; s < first + n; s++)
    saved[s] = evict_slot_hint (ev, s);
  evict_hints_saved (ev, first, n);
}

/* Random operations, a few between saves, and saves over ranges that
 * do not follow the grains: a resident slot in an unmarked grain always
 * has its saved hint.
 */
static void
test_hint_marks (void **state)
{
  const uint32_t n = 16 * EVICT_HINT_GRAIN + 100;
  uint8_t *saved = calloc (n, 1);
  bool *res = calloc (n, sizeof *res);
  unsigned seed = 7;

  assert_non_null (saved);
  assert_non_null (res);
  for (int p = 0; p < EVICT_NR_POLICIES; p++) {
    struct evict *ev = evict_new_policy (p, n);
    unsigned unmarked = 0;

    assert_non_null (ev);
    memset (saved, 0, n);
    for (uint32_t s = 0; s < n; s++) {
      evict_insert_hint (ev, s, rand_r (&seed) % 4);
      res[s] = true;
    }
    save_range (ev, saved, 0, n);
    for (int round = 0; round < 300; round++) {
      for (int k = 1 + rand_r (&seed) % 8; k > 0; k--) {
        uint32_t s = rand_r (&seed) % n, v;

        switch (rand_r (&seed) % 7) {
        case 0: evict_insert (ev, s); res[s] = true; break;
        case 1:
          evict_insert_hint (ev, s, rand_r (&seed) % 4);
          res[s] = true;
          break;
        case 2: case 3: case 4: evict_touch (ev, s); break;
        case 5: evict_remove (ev, s); res[s] = false; break;
        default:
          v = evict_victim (ev, take_any, NULL);
          if (v != EVICT_NONE)
            res[v] = false;
          break;
        }
      }
      /* Save some ranges (a chunk size unlike the grain's). */
      for (uint32_t first = 0; first < n; first += 5000)
        if (rand_r (&seed) % 3)
          save_range (ev, saved, first, first + 5000 > n ? n - first : 5000);
      for (uint32_t s = 0; s < n; s++) {
        if (!res[s] || evict_hints_changed (ev, s, 1))
          continue;
        unmarked++;
        if (evict_slot_hint (ev, s) != saved[s])
          fail_msg ("policy %d, round %d: slot %u hint %u, saved %u, "
                    "not marked", p, round, s, evict_slot_hint (ev, s),
                    saved[s]);
      }
    }
    /* Saved everywhere: nothing marked. */
    save_range (ev, saved, 0, n);
    assert_false (evict_hints_changed (ev, 0, n));
    evict_free (ev);
    if (unmarked < 10000)               /* (the check did check) */
      fail_msg ("policy %d: only %u resident slots in unmarked grains",
                p, unmarked);
  }
  free (saved);
  free (res);
}

/*----------------------------------------------------------------------
 * Ghost.
 */

struct pages {
  uint64_t page[16];
};

static uint64_t
pages_of (void *opaque, uint32_t slot)
{
  return ((struct pages *) opaque)->page[slot];
}

static void
test_ghost (void **state)
{
  struct evict *ev = evict_new_policy (EVICT_S3FIFO, 4);
  struct pages pg;

  evict_set_page_fn (ev, pages_of, &pg);
  for (uint32_t s = 0; s < 4; ++s) {
    pg.page[s] = 100 + s;
    assert_false (evict_insert_page (ev, s, pg.page[s]));
  }
  assert_false (evict_ghost_contains (ev, 100));
  /* Evicted from S unused: remembered. */
  VICTIMS (ev, 0);
  assert_true (evict_ghost_contains (ev, 100));
  assert_false (evict_ghost_contains (ev, 101));
  /* Back: a ghost hit, straight into M; the ghost entry is consumed. */
  assert_true (evict_insert_page (ev, 0, 100));
  assert_false (evict_ghost_contains (ev, 100));
  assert_int_equal (evict_slot_hint (ev, 0), 2);
  /* S is still over its target (3 >= 1): 1, 2, 3 go before 0. */
  VICTIMS (ev, 1, 2, 3);
  assert_true (evict_ghost_contains (ev, 101));
  assert_true (evict_ghost_contains (ev, 102));
  assert_true (evict_ghost_contains (ev, 103));
  /* Evictions from M do not enter the ghost. */
  VICTIMS (ev, 0);
  assert_false (evict_ghost_contains (ev, 100));

  /* The ghost is bounded: 4 slots -> ceil (0.9 * 4) = 4 entries (one
   * bucket of 4, a FIFO).  Push 4 more pages through S: 101..103 are
   * forgotten (oldest first), the four newest are remembered.
   */
  for (uint64_t p = 200; p < 204; ++p) {
    pg.page[0] = p;
    evict_insert_page (ev, 0, p);
    VICTIMS (ev, 0);
  }
  for (uint64_t p = 200; p < 204; ++p)
    assert_true (evict_ghost_contains (ev, p));
  for (uint64_t p = 101; p < 104; ++p)
    assert_false (evict_ghost_contains (ev, p));

  /* A slot whose page the function will not name (EVICT_NO_PAGE: a
   * prefetched page no client read) is not remembered, and its page
   * comes back into S, not M.
   */
  pg.page[0] = 300;
  evict_insert_page (ev, 0, 300);
  pg.page[0] = EVICT_NO_PAGE;
  VICTIMS (ev, 0);
  assert_false (evict_ghost_contains (ev, 300));
  assert_false (evict_ghost_contains (ev, EVICT_NO_PAGE));
  for (uint64_t p = 201; p < 204; ++p)   /* nothing pushed out either */
    assert_true (evict_ghost_contains (ev, p));
  pg.page[0] = 300;
  assert_false (evict_insert_page (ev, 0, 300));
  assert_int_equal (evict_slot_hint (ev, 0), 0);
  assert_int_equal (evict_check (ev), 0);

  /* Without a page function there is no ghost, and CLOCK has none. */
  evict_free (ev);
  ev = evict_new_policy (EVICT_S3FIFO, 4);
  evict_insert_page (ev, 0, 7);
  VICTIMS (ev, 0);
  assert_false (evict_ghost_contains (ev, 7));
  assert_false (evict_insert_page (ev, 0, 7));
  evict_free (ev);
  ev = evict_new_policy (EVICT_CLOCK, 4);
  evict_set_page_fn (ev, pages_of, &pg);
  pg.page[0] = 7;
  evict_insert_page (ev, 0, 7);
  VICTIMS (ev, 0);
  assert_false (evict_ghost_contains (ev, 7));
  evict_free (ev);
}

/* Ghost memory is bounded by nslots: a large cache forgets after about
 * 0.9 * nslots evictions, and remembers most of the most recent ones.
 */
static void
test_ghost_bounded (void **state)
{
  const uint32_t n = 1000;
  struct evict *ev = evict_new_policy (EVICT_S3FIFO, n);
  struct pages pg;
  unsigned recent = 0, old = 0;

  evict_set_page_fn (ev, pages_of, &pg);
  /* One slot holds 1000 pages in turn. */
  for (uint64_t p = 0; p < 5000; ++p) {
    pg.page[0] = p;
    evict_insert_page (ev, 0, p);
    VICTIMS (ev, 0);
  }
  /* 900 entries in 225 buckets of 4: a page is forgotten once its
   * bucket has taken 4 newer ones, so after 3000 newer evictions (13 per
   * bucket on average) only a few very lucky ones remain.
   */
  for (uint64_t p = 0; p < 2000; ++p)
    old += evict_ghost_contains (ev, p);
  for (uint64_t p = 4700; p < 5000; ++p)
    recent += evict_ghost_contains (ev, p);
  print_message ("ghost: %u/2000 old pages, %u/300 recent ones\n",
                 old, recent);
  assert_true (old <= 10);
  assert_true (recent >= 250);
  evict_free (ev);
}

/*----------------------------------------------------------------------
 * can_take and bounded work.
 */

struct ask {
  uint32_t allow;                /* the only slot allowed, or EVICT_NONE */
  unsigned asked;
  unsigned char *seen;
};

static bool
take_one (void *opaque, uint32_t slot)
{
  struct ask *a = opaque;
  a->asked++;
  if (a->seen)
    a->seen[slot] = 1;
  return slot == a->allow;
}

static void
test_bounded_victim (void **state)
{
  const uint32_t n = 20000;

  for (unsigned pol = 0; pol < EVICT_NR_POLICIES; ++pol) {
    struct evict *ev = evict_new_policy (pol, n);
    struct ask a = { EVICT_NONE, 0, calloc (n, 1) };
    uint32_t v;
    /* The bounds of evict.h: 2 turns of CLOCK's hand; for S3-FIFO
     * 6 * n steps of M's hand and two turns of S's ring (n / 8 + 16).
     */
    const unsigned bound = pol == EVICT_CLOCK ? 2 * n + 1
      : 6 * n + n / 4 + 32;

    assert_non_null (a.seen);
    srandom (11);
    for (uint32_t s = 0; s < n; ++s) {
      if (s % 10 == 0)
        evict_insert_hint (ev, s, 3);
      else
        evict_insert (ev, s);
      for (int k = random () % 4; k > 0; --k)
        evict_touch (ev, s);
    }
    /* Everything refused: EVICT_NONE, each slot asked, bounded work. */
    clock_t t0 = clock ();
    v = evict_victim (ev, take_one, &a);
    double ms = (clock () - t0) * 1000.0 / CLOCKS_PER_SEC;
    print_message ("%s: refusing %u slots: %u questions, %.1f ms\n",
                   evict_policy_name (pol), n, a.asked, ms);
    assert_int_equal (v, EVICT_NONE);
    assert_int_equal (evict_resident (ev), n);
    for (uint32_t s = 0; s < n; ++s)
      assert_true (a.seen[s]);
    assert_true (a.asked <= bound);
    /* Exactly one allowed: found, whatever its place and frequency. */
    for (int k = 0; k < 20; ++k) {
      a.allow = random () % n;
      a.asked = 0;
      evict_touch (ev, a.allow);
      v = evict_victim (ev, take_one, &a);
      assert_int_equal (v, a.allow);
      assert_true (a.asked <= bound);
      evict_insert (ev, v);
    }
    free (a.seen);
    evict_free (ev);
  }
}

/* Slot s inserted one of the three ways, chosen at random: plainly,
 * with a page below npages, or with a hint.
 */
static void
insert_any (struct evict *ev, uint32_t s, uint32_t npages)
{
  switch (random () % 3) {
  case 0: evict_insert (ev, s); break;
  case 1: evict_insert_page (ev, s, random () % npages); break;
  default: evict_insert_hint (ev, s, random () % 4);
  }
}

/* Randomised against a model, every policy, with zombies (remove then
 * re-insert), hints, pages, refusals: victims always resident and
 * allowed, EVICT_NONE only when nothing may be taken, counts right.
 */
struct model {
  bool resident[64];
  bool dirty[64];
  unsigned asked_nonres;
};

static bool
take_model (void *opaque, uint32_t slot)
{
  struct model *m = opaque;
  if (!m->resident[slot])
    m->asked_nonres++;
  return !m->dirty[slot];
}

static uint64_t
model_page (void *opaque, uint32_t slot)
{
  return slot * 3 + 1;
}

static void
test_random_model (void **state)
{
  const uint32_t n = 64;

  for (unsigned pol = 0; pol < EVICT_NR_POLICIES; ++pol) {
    struct evict *ev = evict_new_policy (pol, n);
    struct model m = { { false }, { false }, 0 };
    unsigned nres = 0;

    evict_set_page_fn (ev, model_page, NULL);
    srandom (5 + pol);
    for (int op = 0; op < 100000; ++op) {
      uint32_t s = random () % n;
      switch (random () % 8) {
      case 0: case 1:
        if (!m.resident[s]) {
          insert_any (ev, s, 200);
          m.resident[s] = true;
          nres++;
        }
        else
          evict_insert (ev, s);         /* a touch */
        break;
      case 2:
        evict_touch (ev, s);
        break;
      case 3:
        if (m.resident[s]) {
          evict_remove (ev, s);
          m.resident[s] = false;
          nres--;
        }
        else
          evict_remove (ev, s);         /* no-op */
        break;
      case 4:
        m.dirty[s] = random () % 4 == 0;
        break;
      case 5:
        assert_true (evict_slot_hint (ev, s) <= EVICT_HINT_MAX);
        if (!m.resident[s])
          assert_int_equal (evict_slot_hint (ev, s), 0);
        break;
      default: {
        bool any = false;
        for (uint32_t i = 0; i < n; ++i)
          any |= m.resident[i] && !m.dirty[i];
        uint32_t v = evict_victim (ev, take_model, &m);
        if (!any)
          assert_int_equal (v, EVICT_NONE);
        else {
          assert_true (v < n);
          assert_true (m.resident[v]);
          assert_false (m.dirty[v]);
          m.resident[v] = false;
          nres--;
        }
      }
      }
      assert_int_equal (evict_resident (ev), nres);
      assert_int_equal (evict_check (ev), 0);
    }
    assert_int_equal (m.asked_nonres, 0);
    evict_free (ev);
  }
}

/*----------------------------------------------------------------------
 * S3-FIFO's structure: S a ring of slot numbers (capacity min (n,
 * n / 8 + 16)), M a CLOCK over the slots.
 */

/* Memory: at most 4 bytes per slot, with the ghost, plus a constant. */
static void
test_ram_bytes (void **state)
{
  const uint32_t sizes[] = { 1, 7, 1000, 1 << 20 };

  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    uint32_t n = sizes[i];
    struct evict *ev = evict_new_policy (EVICT_S3FIFO, n);
    struct evict *ck = evict_new_policy (EVICT_CLOCK, n);
    size_t b, c;

    assert_non_null (ev);
    assert_non_null (ck);
    b = evict_ram_bytes (ev);
    c = evict_ram_bytes (ck);
    print_message ("%u slots: s3fifo %zu bytes (%.3f per slot), "
                   "clock %zu bytes (%.3f per slot)\n",
                   n, b, (double) b / n, c, (double) c / n);
    assert_true (b >= n);                   /* at least the state bytes */
    assert_true (b <= 4 * (size_t) n + 256);
    assert_true (c <= (size_t) n / 4 + 256);
    /* Using it allocates nothing more. */
    for (uint32_t s = 0; s < n && s < 5000; ++s)
      evict_insert (ev, s);
    evict_touch (ev, 0);
    evict_victim (ev, victims_take_all, NULL);
    assert_int_equal (evict_ram_bytes (ev), b);
    assert_int_equal (evict_check (ev), 0);
    evict_free (ev);
    evict_free (ck);
  }
  /* 2^20 slots: 1 MiB of state, a ring of 2^17 + 16 entries, a ghost of
   * 4 * ceil (943719 / 4) fingerprints: 3.3 bytes per slot.
   */
  struct evict *ev = evict_new_policy (EVICT_S3FIFO, 1 << 20);
  size_t arrays = (1 << 20) + 4 * ((1 << 17) + 16) + 2 * 4 * 235930;
  assert_true (evict_ram_bytes (ev) >= arrays);
  assert_true (evict_ram_bytes (ev) < arrays + 256);
  evict_free (ev);
}

/* The ring wraps: 100 slots (ring of 28, S target 10) filled in order;
 * the ring keeps the newest 28 (72..99), the older ones went to M still
 * on probation.  A scan that re-uses each victim slot goes round the
 * ring again and again, in FIFO order, and never touches M.
 */
static void
test_s3fifo_ring_wrap (void **state)
{
  struct evict *ev = victims_new_full (EVICT_S3FIFO, 100);

  assert_int_equal (evict_check (ev), 0);
  assert_int_equal (evict_slot_hint (ev, 0), 0);     /* still probation */
  for (uint32_t i = 0; i < 35 * 28; ++i) {
    uint32_t v = evict_victim (ev, victims_take_all, NULL);
    assert_int_equal (v, 72 + i % 28);
    evict_insert (ev, v);
    assert_int_equal (evict_check (ev), 0);
  }
  /* 35 turns: the ring is 72..99 again.  Without re-insertion, S is
   * evicted from while it holds at least 10: 19 victims, 72..90.
   */
  evict_touch (ev, 5);
  assert_int_equal (evict_slot_hint (ev, 5), 1);
  victims_expect_run (ev, 72, 19);
  /* Then M, on probation: a hit slot becomes an M page (hint 2) when
   * the hand passes, the others are evicted (to the ghost) in slot
   * order: the hand from slot 0 takes 0..4, promotes 5, takes 6.
   */
  victims_expect_run (ev, 0, 5);
  VICTIMS (ev, 6);
  assert_int_equal (evict_slot_hint (ev, 5), 2);
  assert_int_equal (evict_check (ev), 0);
  evict_free (ev);
}

/* Zombies in the ring: a ring full of removed slots makes room for new
 * ones without pushing anything to M; a slot re-inserted for M leaves
 * its old ring entry behind, which is dropped at the tail.
 */
static void
test_s3fifo_ring_zombies (void **state)
{
  struct evict *ev = evict_new_policy (EVICT_S3FIFO, 100);

  for (uint32_t s = 0; s < 28; ++s)     /* fills the ring */
    evict_insert (ev, s);
  for (uint32_t s = 0; s < 28; ++s)
    evict_remove (ev, s);
  assert_int_equal (evict_resident (ev), 0);
  assert_int_equal (evict_check (ev), 0);
  for (uint32_t s = 28; s < 56; ++s)    /* each drops one zombie */
    evict_insert (ev, s);
  assert_int_equal (evict_check (ev), 0);
  /* All 28 in S (none on probation in M): victims in FIFO order. */
  victims_expect_run (ev, 28, 10);
  /* Ring now 38..55.  Remove 40 and re-insert it for M (a hint): it is
   * in M at once and its ring entry is dropped, so S is 38 39 41..55
   * (17 slots).  Remove 45 and re-insert it for S: it keeps its place.
   * S is evicted from while it holds at least 10: 8 victims, 38 39
   * 41..46; then M (40, frequency 0), then S again (M is empty).
   */
  evict_remove (ev, 40);
  evict_insert_hint (ev, 40, 2);
  evict_remove (ev, 45);
  evict_insert (ev, 45);
  assert_int_equal (evict_check (ev), 0);
  assert_int_equal (evict_resident (ev), 18);
  const uint32_t expect[18] = { 38, 39, 41, 42, 43, 44, 45, 46, 40,
                                47, 48, 49, 50, 51, 52, 53, 54, 55 };
  for (uint32_t i = 0; i < 18; ++i) {
    VICTIMS (ev, expect[i]);
    assert_int_equal (evict_check (ev), 0);
  }
  VICTIMS (ev, EVICT_NONE);
  assert_int_equal (evict_check (ev), 0);

  /* A slot removed and re-inserted many times is in the ring once. */
  for (int k = 0; k < 100; ++k) {
    evict_insert (ev, 7);
    evict_remove (ev, 7);
    evict_insert_hint (ev, 7, k % 4);
    evict_remove (ev, 7);
  }
  evict_insert (ev, 7);
  assert_int_equal (evict_check (ev), 0);
  VICTIMS (ev, 7, EVICT_NONE);
  evict_free (ev);
}

/* Refused slots go back to the head of S, unchanged. */
static bool
take_not_01 (void *opaque, uint32_t slot)
{
  return slot > 1;
}

static void
test_s3fifo_refused (void **state)
{
  struct evict *ev = victims_new_full (EVICT_S3FIFO, 10);

  /* 0 and 1 (dirty) are passed over; S is now 3..9 0 1. */
  assert_int_equal (evict_victim (ev, take_not_01, NULL), 2);
  assert_int_equal (evict_slot_hint (ev, 0), 0);
  assert_int_equal (evict_check (ev), 0);
  victims_expect_run (ev, 3, 7);
  /* Only 0 and 1 left, both refused: none, and nothing changed. */
  assert_int_equal (evict_victim (ev, take_not_01, NULL), EVICT_NONE);
  assert_int_equal (evict_resident (ev), 2);
  VICTIMS (ev, 0, 1);
  assert_int_equal (evict_check (ev), 0);

  /* In M, the hand passes a refused slot and takes the next one. */
  evict_insert_hint (ev, 0, 2);
  evict_insert_hint (ev, 1, 2);
  evict_insert_hint (ev, 2, 2);
  assert_int_equal (evict_victim (ev, take_not_01, NULL), 2);
  assert_int_equal (evict_victim (ev, take_not_01, NULL), EVICT_NONE);
  assert_int_equal (evict_resident (ev), 2);
  assert_int_equal (evict_check (ev), 0);
  evict_free (ev);
}

/* A fill (evict_victim_fill) does not take a page of M while S is at
 * its target and every slot in it is busy: with many requests of a scan
 * in flight, the scan would otherwise evict the hot set.  evict_victim
 * (a write, which needs a slot) still takes from M then.
 */
static bool
take_below_10 (void *opaque, uint32_t slot)
{
  return slot < 10;
}

static void
test_s3fifo_fill_spares_main (void **state)
{
  /* Promotes 0..9 to M and takes 10: S is 11..19, over its target. */
  struct evict *ev = s3fifo_hot (20, 10);
  uint32_t v;

  /* S all busy: a fill gets nothing, and nothing changed. */
  assert_int_equal (evict_victim_fill (ev, take_below_10, NULL), EVICT_NONE);
  assert_int_equal (evict_resident (ev), 19);
  assert_int_equal (evict_check (ev), 0);
  for (uint32_t s = 0; s < 10; ++s)    /* still there, and hot */
    assert_true (evict_slot_hint (ev, s) >= 1);
  /* A fill that may take from S does. */
  v = evict_victim_fill (ev, victims_take_all, NULL);
  assert_true (v >= 11 && v < 20);
  evict_insert (ev, v);
  /* A write's victim comes from M when S is all busy. */
  v = evict_victim (ev, take_below_10, NULL);
  assert_true (v < 10);
  assert_int_equal (evict_check (ev), 0);
  evict_free (ev);

  /* CLOCK: a fill is an ordinary victim. */
  ev = victims_new_full (EVICT_CLOCK, 4);
  assert_int_equal (evict_victim_fill (ev, take_below_10, NULL), 0);
  evict_free (ev);
}

/* Long random sequences against a model of which slots are resident
 * and which may be taken, several sizes (the ring smaller than the
 * slots, or all of them): invariants after every operation (each slot
 * of S in the ring once, counts), a victim whenever one is allowed.
 */
struct rmodel {
  uint32_t n;
  bool *resident, *dirty;
  unsigned asked_nonres;
};

static bool
take_rmodel (void *opaque, uint32_t slot)
{
  struct rmodel *m = opaque;
  if (slot >= m->n || !m->resident[slot])
    m->asked_nonres++;
  return !m->dirty[slot];
}

static void
test_s3fifo_random_invariants (void **state)
{
  const uint32_t sizes[] = { 1, 2, 7, 10, 64, 300, 2000 };

  for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; ++z) {
    const uint32_t n = sizes[z];
    struct evict *ev = evict_new_policy (EVICT_S3FIFO, n);
    struct rmodel m = { n, calloc (n, 1), calloc (n, 1), 0 };
    uint32_t nres = 0, nclean = 0, victims = 0;
    /* dirty slots are rare, or most, depending on the phase */
    unsigned dirty_pct = 10;

    assert_non_null (m.resident);
    assert_non_null (m.dirty);
    evict_set_page_fn (ev, model_page, NULL);
    srandom (1000 + n);
    for (int op = 0; op < 200000; ++op) {
      uint32_t s = random () % n;
      if (op % 20000 == 0)
        dirty_pct = (dirty_pct == 10) ? 90 : 10;
      switch (random () % 10) {
      case 0: case 1: case 2:
        if (!m.resident[s]) {
          insert_any (ev, s, 2 * n + 1);
          m.resident[s] = true;
          nres++;
          nclean += !m.dirty[s];
        }
        else
          evict_touch (ev, s);
        break;
      case 3: case 4:
        evict_touch (ev, s);
        break;
      case 5:
        if (m.resident[s]) {
          evict_remove (ev, s);
          m.resident[s] = false;
          nres--;
          nclean -= !m.dirty[s];
        }
        break;
      case 6: {
        bool d = (unsigned) (random () % 100) < dirty_pct;
        if (m.resident[s] && d != m.dirty[s])
          nclean += d ? -1 : 1;
        m.dirty[s] = d;
        break;
      }
      default: {
        uint32_t v = evict_victim (ev, take_rmodel, &m);
        if (nclean == 0)
          assert_int_equal (v, EVICT_NONE);
        else {
          assert_true (v < n);
          assert_true (m.resident[v]);
          assert_false (m.dirty[v]);
          assert_int_equal (evict_slot_hint (ev, v), 0);
          m.resident[v] = false;
          nres--;
          nclean--;
          victims++;
        }
      }
      }
      assert_int_equal (evict_resident (ev), nres);
      if (n <= 64 || op % 97 == 0)
        assert_int_equal (evict_check (ev), 0);
    }
    assert_int_equal (evict_check (ev), 0);
    assert_int_equal (m.asked_nonres, 0);
    print_message ("%u slots: %u victims\n", n, victims);
    free (m.resident);
    free (m.dirty);
    evict_free (ev);
  }
}

/*----------------------------------------------------------------------
 * The step limit: a search spread over calls (EVICT_AGAIN).
 */

/* A model whose can_take counts the questions of one call. */
struct smodel {
  bool resident[300], dirty[300];
  unsigned asked;
};

static bool
take_smodel (void *opaque, uint32_t slot)
{
  struct smodel *m = opaque;

  m->asked++;
  return m->resident[slot] && !m->dirty[slot];
}

/* A search to its end, call after call; each call asks at most limit
 * questions.  *calls counts the calls.
 */
static uint32_t
victim_limited (struct evict *ev, struct smodel *m, bool fill,
                unsigned limit, unsigned *calls)
{
  uint32_t v;

  do {
    m->asked = 0;
    v = fill ? evict_victim_fill (ev, take_smodel, m)
      : evict_victim (ev, take_smodel, m);
    assert_true (m->asked <= limit);
    ++*calls;
  } while (v == EVICT_AGAIN);
  return v;
}

/* With nothing else happening between its calls, a limited search
 * picks the victims an unlimited one picks, for either policy, a fill
 * or not, whatever the limit.
 */
static void
test_step_limit_same_victims (void **state)
{
  const uint32_t n = 300;
  const unsigned limits[] = { 1, 3, 17, 200 };

  for (unsigned pol = 0; pol < EVICT_NR_POLICIES; ++pol)
    for (size_t l = 0; l < sizeof limits / sizeof limits[0]; ++l) {
      struct evict *a = evict_new_policy (pol, n);
      struct evict *b = evict_new_policy (pol, n);
      struct smodel m = { { false }, { false }, 0 };
      unsigned calls = 0, searches = 0;

      evict_set_page_fn (a, model_page, NULL);
      evict_set_page_fn (b, model_page, NULL);
      evict_set_step_limit (b, limits[l]);
      srandom (77 + pol * 10 + l);
      for (int op = 0; op < 40000; ++op) {
        uint32_t s = random () % n, va, vb;
        bool fill;

        switch (random () % 8) {
        case 0: case 1: case 2:
          if (!m.resident[s]) {
            unsigned h = random () % 4;
            evict_insert_hint (a, s, h);
            evict_insert_hint (b, s, h);
            m.resident[s] = true;
            break;
          }
          /* fall through: a touch */
        case 3:
          evict_touch (a, s);
          evict_touch (b, s);
          break;
        case 4:
          m.dirty[s] = random () % 3 == 0;
          break;
        default:
          fill = random () % 2;
          va = fill ? evict_victim_fill (a, take_smodel, &m)
            : evict_victim (a, take_smodel, &m);
          vb = victim_limited (b, &m, fill, limits[l], &calls);
          searches++;
          assert_int_equal (va, vb);
          if (va != EVICT_NONE)
            m.resident[va] = false;
        }
        assert_int_equal (evict_resident (a), evict_resident (b));
      }
      assert_int_equal (evict_check (b), 0);
      print_message ("%s, limit %u: %u searches in %u calls\n",
                     evict_policy_name (pol), limits[l], searches, calls);
      if (limits[l] < 10)
        assert_true (calls > searches);     /* some were spread */
      evict_free (a);
      evict_free (b);
    }
}

/* Others' changes between the calls of a search (other threads, while
 * the caller lets go of its lock): every search still ends, within
 * a bounded number of steps, with a resident slot the caller
 * allows, or EVICT_NONE; the policy stays consistent.
 */
static void
test_step_limit_interleaved (void **state)
{
  const uint32_t n = 300;
  const unsigned limit = 5;

  for (unsigned pol = 0; pol < EVICT_NR_POLICIES; ++pol) {
    struct evict *ev = evict_new_policy (pol, n);
    struct smodel m = { { false }, { false }, 0 };
    unsigned nres = 0;
    /* Calls a search may take: its steps over the limit.  Each sweep
     * of M takes at most 5 * n steps and there are two at most; each
     * of S at most a turn of the ring (n / 8 + 16), two at most.
     */
    const unsigned bound = (10 * n + n / 4 + 32) / limit + 2;

    evict_set_page_fn (ev, model_page, NULL);
    evict_set_step_limit (ev, limit);
    srandom (99 + pol);
    for (int search = 0; search < 3000; ++search) {
      unsigned calls = 0;
      uint32_t v;
      bool fill = random () % 2;

      do {
        uint32_t s = random () % n;

        /* Someone else's change. */
        switch (random () % 4) {
        case 0:
          if (!m.resident[s]) {
            evict_insert_hint (ev, s, random () % 4);
            m.resident[s] = true;
            nres++;
          }
          break;
        case 1:
          evict_touch (ev, s);
          break;
        case 2:
          if (m.resident[s]) {
            evict_remove (ev, s);
            m.resident[s] = false;
            nres--;
          }
          break;
        default:
          m.dirty[s] = random () % 4 == 0;
        }
        m.asked = 0;
        v = fill ? evict_victim_fill (ev, take_smodel, &m)
          : evict_victim (ev, take_smodel, &m);
        assert_true (m.asked <= limit);
        assert_true (++calls <= bound);
      } while (v == EVICT_AGAIN);
      if (v != EVICT_NONE) {
        assert_true (v < n);
        assert_true (m.resident[v]);
        assert_false (m.dirty[v]);
        m.resident[v] = false;
        nres--;
      }
      assert_int_equal (evict_resident (ev), nres);
      assert_int_equal (evict_check (ev), 0);
    }
    evict_free (ev);
  }
}

/*----------------------------------------------------------------------
 * Hints.
 */

static void
test_hints (void **state)
{
  struct evict *ev;

  /* S3-FIFO: every hint round trips. */
  ev = evict_new_policy (EVICT_S3FIFO, 8);
  for (uint8_t h = 0; h <= EVICT_HINT_MAX; ++h) {
    evict_insert_hint (ev, h, h);
    assert_int_equal (evict_slot_hint (ev, h), h);
  }
  assert_int_equal (evict_slot_hint (ev, 7), 0);      /* not resident */
  /* Hotness follows use. */
  evict_insert (ev, 5);
  assert_int_equal (evict_slot_hint (ev, 5), 0);
  evict_touch (ev, 5);
  assert_int_equal (evict_slot_hint (ev, 5), 1);
  evict_touch (ev, 2);
  assert_int_equal (evict_slot_hint (ev, 2), 2);      /* M, freq 1 */
  evict_touch (ev, 2);
  assert_int_equal (evict_slot_hint (ev, 2), 3);      /* M, freq 2 */
  evict_remove (ev, 3);
  assert_int_equal (evict_slot_hint (ev, 3), 0);
  evict_free (ev);

  /* CLOCK: 0 and 1 round trip, 2 and 3 are "referenced". */
  ev = evict_new_policy (EVICT_CLOCK, 8);
  for (uint8_t h = 0; h <= EVICT_HINT_MAX; ++h) {
    evict_insert_hint (ev, h, h);
    assert_int_equal (evict_slot_hint (ev, h), h ? 1 : 0);
  }
  evict_free (ev);

  /* A restart: save the hints, load them into a new policy in slot
   * order, and the hot pages are still the last to go.
   */
  const uint32_t n = 10;
  uint8_t saved[10];
  ev = victims_new_full (EVICT_S3FIFO, n);
  for (uint32_t s = 0; s < n; s += 2) {   /* even slots hot */
    evict_touch (ev, s);
    evict_touch (ev, s);
  }
  VICTIMS (ev, 1);                      /* promotes 0 */
  evict_insert (ev, 1);
  VICTIMS (ev, 3);                      /* promotes 2 */
  evict_insert (ev, 3);
  for (uint32_t s = 0; s < n; ++s)
    saved[s] = evict_slot_hint (ev, s);
  assert_int_equal (saved[0], 2);
  assert_int_equal (saved[2], 2);
  assert_int_equal (saved[4], 1);
  assert_int_equal (saved[5], 0);
  evict_free (ev);

  ev = evict_new_policy (EVICT_S3FIFO, n);
  for (uint32_t s = 0; s < n; ++s)
    evict_insert_hint (ev, s, saved[s]);
  /* S (slot order): 1 3 4 5 6 7 8 9; 4 6 8 re-used -> promoted.  Then
   * M: 0 2 4 6 8.
   */
  VICTIMS (ev, 1, 3, 5, 7, 9, 0, 2, 4, 6, 8);
  evict_free (ev);

  /* Hints given to a resident slot count as a touch. */
  ev = evict_new_policy (EVICT_S3FIFO, 4);
  evict_insert_hint (ev, 0, 0);
  evict_insert_hint (ev, 0, 0);
  assert_int_equal (evict_resident (ev), 1);
  assert_int_equal (evict_slot_hint (ev, 0), 1);
  evict_free (ev);
}

/* Zombies: a slot removed from the middle of a queue and re-inserted
 * before it reaches the tail is tracked once; removed slots are never
 * victims.
 */
static void
test_zombies (void **state)
{
  struct evict *ev = victims_new_full (EVICT_S3FIFO, 6);

  evict_remove (ev, 2);
  evict_remove (ev, 4);
  assert_int_equal (evict_resident (ev), 4);
  evict_insert (ev, 4);                 /* back, keeps its place */
  assert_int_equal (evict_resident (ev), 5);
  VICTIMS (ev, 0, 1, 3, 4, 5, EVICT_NONE);      /* 2 dropped */
  assert_int_equal (evict_victim (ev, victims_take_none, NULL), EVICT_NONE);

  /* A zombie in S coming back for M (a hint) moves to M. */
  for (uint32_t s = 0; s < 6; ++s)
    evict_insert (ev, s);
  evict_remove (ev, 0);
  evict_insert_hint (ev, 0, 3);
  assert_int_equal (evict_slot_hint (ev, 0), 3);
  victims_expect_run (ev, 1, 5);
  VICTIMS (ev, 0);
  assert_int_equal (evict_resident (ev), 0);
  evict_free (ev);
}

/*----------------------------------------------------------------------
 * Admission: sequential cutoff.
 */

static void
test_seq_two_streams (void **state)
{
  const uint64_t K = 1024, G = 1024 * 1024 * 1024;
  struct admit_seq *as = admit_seq_new (64 * K, 4);
  struct admit_seq_stats st;
  /* Two readers, 24 KiB requests, interleaved, with random requests in
   * between.  Each stream: 24 + 24 admitted, then 16 of the third (the
   * cutoff is at 64 KiB), then nothing.
   */
  const uint64_t expect[6] = { 24 * K, 24 * K, 16 * K, 0, 0, 0 };

  assert_non_null (as);
  /* What a stream may still run before its cutoff. */
  const uint64_t left[6] = { 40 * K, 16 * K, 0, 0, 0, 0 };

  assert_int_equal (admit_seq_left (as, 12345), UINT64_MAX);  /* no stream */
  for (int i = 0; i < 6; ++i) {
    assert_int_equal (admit_seq_access (as, i * 24 * K, 24 * K), expect[i]);
    assert_int_equal (admit_seq_left (as, (i + 1) * 24 * K), left[i]);
    assert_int_equal (admit_seq_access (as, G + i * 24 * K, 24 * K),
                      expect[i]);
    /* Random, non-contiguous requests: admitted whole. */
    assert_int_equal (admit_seq_access (as, 7 * G + i * 1000 * K, 4 * K),
                      4 * K);
  }
  admit_seq_get_stats (as, &st);
  assert_int_equal (st.requests, 18);
  assert_int_equal (st.sequential, 10);
  assert_int_equal (st.bypassed_bytes, 2 * (8 + 24 + 24 + 24) * K);

  /* A jump starts a new stream: admitted again. */
  assert_int_equal (admit_seq_access (as, 3 * G, 64 * K), 64 * K);
  assert_int_equal (admit_seq_access (as, 3 * G + 64 * K, 4 * K), 0);
  /* One request larger than the cutoff: the tail bypasses. */
  assert_int_equal (admit_seq_access (as, 5 * G, 100 * K), 64 * K);
  admit_seq_free (as);

  /* Streams are replaced least recently used first: with 2 tracked,
   * a third reader evicts the oldest one, which starts over.
   */
  as = admit_seq_new (8 * K, 2);
  assert_int_equal (admit_seq_access (as, 0, 8 * K), 8 * K);       /* A */
  assert_int_equal (admit_seq_access (as, G, 8 * K), 8 * K);       /* B */
  assert_int_equal (admit_seq_access (as, 8 * K, 4 * K), 0);       /* A */
  assert_int_equal (admit_seq_access (as, 2 * G, 8 * K), 8 * K);   /* C: B out */
  assert_int_equal (admit_seq_access (as, 12 * K, 4 * K), 0);      /* A */
  assert_int_equal (admit_seq_access (as, G + 8 * K, 4 * K), 4 * K); /* B anew */
  admit_seq_free (as);

  /* Cutoff 0: disabled. */
  as = admit_seq_new (0, 0);
  for (int i = 0; i < 100; ++i)
    assert_int_equal (admit_seq_access (as, i * 64 * K, 64 * K), 64 * K);
  admit_seq_free (as);
}

/* Requests in flight together reach the filter in any order: a stream
 * whose requests overtake each other stays one stream and runs past
 * its cutoff.  Rewriting the same block again and again is no stream.
 */
static void
test_seq_reordered (void **state)
{
  const uint64_t K = 1024;
  struct admit_seq *as = admit_seq_new (64 * K, 4);
  /* 8 KiB requests, in pairs swapped: 1 0 3 2 5 4 ... */
  uint64_t admitted = 0;

  assert_non_null (as);
  for (int i = 0; i < 64; ++i) {
    uint64_t r = i ^ 1;
    uint64_t got = admit_seq_access (as, r * 8 * K, 8 * K);
    if (i >= 24)             /* well past the cutoff */
      assert_int_equal (got, 0);
    admitted += got;
  }
  assert_true (admitted <= 80 * K);
  /* Four out of order within a window of four. */
  admit_seq_free (as);
  as = admit_seq_new (64 * K, 4);
  for (int i = 0; i < 64; ++i) {
    static const int perm[4] = { 2, 0, 3, 1 };
    uint64_t r = (i & ~3) + perm[i & 3];
    uint64_t got = admit_seq_access (as, r * 8 * K, 8 * K);
    if (i >= 24)
      assert_int_equal (got, 0);
  }
  admit_seq_free (as);

  /* 1 MiB requests, each swapped with one of the next 3 (so some are
   * carried far ahead): one stream, even when a straggler has started
   * a short one near it.
   */
  {
    enum { N = 512 };
    static int order[N];
    uint64_t bypassed = 0;

    srandom (3);
    for (int i = 0; i < N; ++i)
      order[i] = i;
    for (int i = 0; i < N; ++i) {
      int j = i + random () % 4, t;
      if (j >= N)
        j = N - 1;
      t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    as = admit_seq_new (4096 * K, 16);
    for (int i = 0; i < N; ++i)
      bypassed += 1024 * K -
        admit_seq_access (as, order[i] * 1024 * K, 1024 * K);
    assert_true (bypassed >= (uint64_t) N * 1024 * K / 100 * 90);
    admit_seq_free (as);
  }

  /* Two passes over a 256 MiB region in 1 MiB requests, pairs swapped
   * (fio writing a disk over and over): past its cutoff the second
   * pass bypasses to its very end, though its last requests land just
   * behind the end of the first pass's stream, which is still tracked
   * and longer (they would be rewrites of it).
   */
  as = admit_seq_new (4096 * K, 16);
  for (int pass = 0; pass < 2; ++pass)
    for (int i = 0; i < 256; ++i) {
      uint64_t got = admit_seq_access (as, (i ^ 1) * 1024 * K, 1024 * K);
      if (i >= 6)
        assert_int_equal (got, 0);
    }
  admit_seq_free (as);

  /* The same 4 KiB block, 100 times: always admitted. */
  as = admit_seq_new (8 * K, 4);
  for (int i = 0; i < 100; ++i)
    assert_int_equal (admit_seq_access (as, 1000 * K, 4 * K), 4 * K);
  admit_seq_free (as);

  /* Random 64-96 KiB requests in a 6 MiB region land near each other
   * all the time, but are no stream: (almost) everything admitted.
   */
  as = admit_seq_new (4096 * K, 16);
  uint64_t total = 0;
  admitted = 0;
  srandom (7);
  for (int i = 0; i < 20000; ++i) {
    uint64_t n = (64 + random () % 33) * K;
    uint64_t off = random () % (6144 * K - n) / (4 * K) * (4 * K);
    admitted += admit_seq_access (as, off, n);
    total += n;
  }
  assert_true (admitted >= total / 100 * 98);
  admit_seq_free (as);
}

/*----------------------------------------------------------------------
 * Admission: promotion after N misses.
 */

static void
test_nhit (void **state)
{
  struct admit_nhit *an = admit_nhit_new (3, 1000);

  assert_non_null (an);
  assert_int_equal (admit_nhit_count (an, 42), 0);
  assert_false (admit_nhit_miss (an, 42));
  assert_false (admit_nhit_miss (an, 42));
  assert_true (admit_nhit_miss (an, 42));
  assert_true (admit_nhit_miss (an, 42));
  assert_int_equal (admit_nhit_count (an, 42), 4);
  /* Another page is on its own (1024 counters, no collision here). */
  assert_false (admit_nhit_miss (an, 43));
  /* Aging: after 2 * 1024 misses elsewhere, every counter has been
   * halved twice: 42 is at most 1 and needs 2 more misses.
   */
  for (uint64_t p = 0; p < 2048; ++p)
    admit_nhit_miss (an, 1000000);
  assert_true (admit_nhit_count (an, 42) <= 1);
  assert_false (admit_nhit_miss (an, 42));
  admit_nhit_free (an);

  /* n = 1: admit everything. */
  an = admit_nhit_new (1, 1000);
  assert_non_null (an);
  assert_true (admit_nhit_miss (an, 1));
  admit_nhit_free (an);
  an = admit_nhit_new (0, 0);
  assert_true (admit_nhit_miss (an, 1));
  admit_nhit_free (an);

  /* Promotion on a one-hit-wonder stream: nothing admitted; a page
   * missing twice is.
   */
  an = admit_nhit_new (2, 65536);
  unsigned admitted = 0;
  for (uint64_t p = 0; p < 1000; ++p)
    admitted += admit_nhit_miss (an, 5000000 + p);
  assert_true (admitted <= 5);          /* collisions only */
  assert_false (admit_nhit_miss (an, 77));
  assert_true (admit_nhit_miss (an, 77));
  admit_nhit_free (an);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_names),
    cmocka_unit_test (test_tiny_trace),
    cmocka_unit_test (test_s3fifo_probation),
    cmocka_unit_test (test_s3fifo_scan),
    cmocka_unit_test (test_s3fifo_main_reinsertion),
    cmocka_unit_test (test_ghost),
    cmocka_unit_test (test_ghost_bounded),
    cmocka_unit_test (test_bounded_victim),
    cmocka_unit_test (test_step_limit_same_victims),
    cmocka_unit_test (test_step_limit_interleaved),
    cmocka_unit_test (test_random_model),
    cmocka_unit_test (test_hints),
    cmocka_unit_test (test_zombies),
    cmocka_unit_test (test_ram_bytes),
    cmocka_unit_test (test_s3fifo_ring_wrap),
    cmocka_unit_test (test_s3fifo_ring_zombies),
    cmocka_unit_test (test_s3fifo_refused),
    cmocka_unit_test (test_s3fifo_fill_spares_main),
    cmocka_unit_test (test_s3fifo_random_invariants),
    cmocka_unit_test (test_seq_two_streams),
    cmocka_unit_test (test_seq_reordered),
    cmocka_unit_test (test_nhit),
    cmocka_unit_test (test_hint_marks),
  };

  return cmocka_run_group_tests (tests, NULL, NULL);
}
