/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: the replacement policy (evict.c).
 *
 * CLOCK on small traces with known victim orders, the can_take
 * callback (dirty/pinned slots are never chosen), bookkeeping, and a
 * hit-ratio simulation comparing CLOCK with LRU and Belady's optimum
 * on a hot-set + cold-stream trace.
 *
 * The known answers follow the policy documented in evict.c: a slot is
 * referenced when inserted or touched, the hand starts at slot 0 and
 * clears reference bits as it passes, taking the first unreferenced
 * resident slot the caller allows.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "evict.h"
#include "victims.h"

/* opaque: bool array, true = "dirty" (may not be taken).  Also checks
 * that the policy only asks about resident slots.
 */
struct refuse {
  const bool *dirty;
  const bool *resident;
  unsigned asked;
};

static bool
take_clean (void *opaque, uint32_t slot)
{
  struct refuse *r = opaque;

  r->asked++;
  if (r->resident && !r->resident[slot])
    fail_msg ("can_take asked about non-resident slot %u", slot);
  return !r->dirty[slot];
}

static void
test_new_free (void **state)
{
  uint32_t sizes[] = { 1, 2, 63, 64, 65, 1000, 1 << 20 };

  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    struct evict *ev = evict_new (sizes[i]);
    assert_non_null (ev);
    assert_int_equal (evict_resident (ev), 0);
    VICTIMS (ev, EVICT_NONE);
    evict_free (ev);
  }
  evict_free (NULL);
}

/* 4 slots: insert 0..3, evict, insert 0, touch 2, then evict all. */
static void
test_known_trace_1 (void **state)
{
  struct evict *ev = victims_new_full (EVICT_CLOCK, 4);

  assert_int_equal (evict_resident (ev), 4);

  /* All referenced: one turn clears them, then slot 0 goes. */
  VICTIMS (ev, 0);
  assert_int_equal (evict_resident (ev), 3);
  evict_insert (ev, 0);
  evict_touch (ev, 2);
  assert_int_equal (evict_resident (ev), 4);

  /* 1, 3 (2 is referenced), 2 (0 is), 0. */
  VICTIMS (ev, 1, 3, 2, 0);
  assert_int_equal (evict_resident (ev), 0);
  VICTIMS (ev, EVICT_NONE);
  evict_free (ev);
}

/* Second chance: a slot touched between two victim calls survives
 * while untouched ones go.
 */
static void
test_known_trace_2 (void **state)
{
  struct evict *ev = victims_new_full (EVICT_CLOCK, 8);

  /* First victim clears all reference bits, takes 0. */
  VICTIMS (ev, 0);
  /* Touch 1, 3, 5: they must survive until 2, 4, 6, 7 are gone. */
  evict_touch (ev, 1);
  evict_touch (ev, 3);
  evict_touch (ev, 5);
  VICTIMS (ev, 2, 4, 6, 7);
  /* Then the touched ones, in hand order. */
  VICTIMS (ev, 1, 3, 5, EVICT_NONE);
  evict_free (ev);
}

/* Touching a non-resident slot must not make it resident. */
static void
test_touch_nonresident (void **state)
{
  struct evict *ev = evict_new (4);

  evict_touch (ev, 2);
  assert_int_equal (evict_resident (ev), 0);
  VICTIMS (ev, EVICT_NONE);
  evict_insert (ev, 1);
  evict_touch (ev, 3);
  assert_int_equal (evict_resident (ev), 1);
  VICTIMS (ev, 1, EVICT_NONE);
  evict_free (ev);
}

static void
test_remove_insert_bookkeeping (void **state)
{
  struct evict *ev = evict_new (100);
  bool resident[100] = { false };

  for (uint32_t s = 0; s < 100; s += 2) {
    evict_insert (ev, s);
    resident[s] = true;
  }
  assert_int_equal (evict_resident (ev), 50);
  /* Double insert does not double count. */
  evict_insert (ev, 10);
  assert_int_equal (evict_resident (ev), 50);
  /* Remove some, double remove, remove of non-resident. */
  for (uint32_t s = 0; s < 100; s += 6) {
    evict_remove (ev, s);
    resident[s] = false;
  }
  evict_remove (ev, 0);
  evict_remove (ev, 1);
  uint32_t expect = 0;
  for (uint32_t s = 0; s < 100; ++s)
    expect += resident[s];
  assert_int_equal (evict_resident (ev), expect);

  /* Victims are exactly the resident slots, each once. */
  bool seen[100] = { false };
  for (uint32_t i = 0; i < expect; ++i) {
    uint32_t v = evict_victim (ev, victims_take_all, NULL);
    assert_int_not_equal (v, EVICT_NONE);
    assert_true (v < 100);
    assert_true (resident[v]);
    assert_false (seen[v]);
    seen[v] = true;
    assert_int_equal (evict_resident (ev), expect - 1 - i);
  }
  VICTIMS (ev, EVICT_NONE);
  evict_free (ev);
}

static void
test_can_take_respected (void **state)
{
  const uint32_t n = 16;
  struct evict *ev = evict_new (n);
  bool dirty[16] = { false }, resident[16];
  struct refuse r = { dirty, resident, 0 };

  for (uint32_t s = 0; s < n; ++s) {
    evict_insert (ev, s);
    resident[s] = true;
    dirty[s] = (s % 3 == 0);           /* 0 3 6 9 12 15 dirty */
  }

  /* Refusing everything: EVICT_NONE, nothing removed. */
  assert_int_equal (evict_victim (ev, victims_take_none, NULL), EVICT_NONE);
  assert_int_equal (evict_resident (ev), n);

  /* Only clean ones come out, each once, then EVICT_NONE. */
  unsigned clean = 0;
  for (uint32_t s = 0; s < n; ++s)
    clean += !dirty[s];
  for (unsigned i = 0; i < clean; ++i) {
    uint32_t v = evict_victim (ev, take_clean, &r);
    assert_int_not_equal (v, EVICT_NONE);
    if (dirty[v])
      fail_msg ("dirty slot %u chosen as victim", v);
    assert_true (resident[v]);
    resident[v] = false;
    /* Touch the dirty ones between calls, it must not matter. */
    evict_touch (ev, 3);
    evict_touch (ev, 12);
  }
  r.asked = 0;
  assert_int_equal (evict_victim (ev, take_clean, &r), EVICT_NONE);
  assert_true (r.asked > 0);
  assert_int_equal (evict_resident (ev), n - clean);

  /* A dirty slot becomes clean: it can now be taken. */
  dirty[9] = false;
  assert_int_equal (evict_victim (ev, take_clean, &r), 9);
  resident[9] = false;
  assert_int_equal (evict_victim (ev, take_clean, &r), EVICT_NONE);
  evict_free (ev);
}

/* Randomised: victims are always resident and allowed; EVICT_NONE only
 * when no resident slot is allowed.
 */
static void
test_can_take_random (void **state)
{
  const uint32_t n = 50;
  struct evict *ev = evict_new (n);
  bool dirty[50], resident[50] = { false };
  struct refuse r = { dirty, resident, 0 };
  unsigned nres = 0;

  srandom (7);
  for (uint32_t s = 0; s < n; ++s)
    dirty[s] = false;
  for (int op = 0; op < 20000; ++op) {
    uint32_t s = random () % n;
    switch (random () % 5) {
    case 0:
      if (!resident[s]) {
        evict_insert (ev, s);
        resident[s] = true;
        nres++;
      }
      break;
    case 1:
      evict_touch (ev, s);
      break;
    case 2:
      if (resident[s]) {
        evict_remove (ev, s);
        resident[s] = false;
        nres--;
      }
      break;
    case 3:
      dirty[s] = random () % 3 == 0;
      break;
    default: {
      bool any = false;
      for (uint32_t i = 0; i < n; ++i)
        if (resident[i] && !dirty[i])
          any = true;
      uint32_t v = evict_victim (ev, take_clean, &r);
      if (!any)
        assert_int_equal (v, EVICT_NONE);
      else {
        assert_int_not_equal (v, EVICT_NONE);
        assert_true (resident[v]);
        assert_false (dirty[v]);
        resident[v] = false;
        nres--;
      }
    }
    }
    assert_int_equal (evict_resident (ev), nres);
  }
  evict_free (ev);
}

/*----------------------------------------------------------------------
 * Hit-ratio simulation.
 */

#define NOPAGE UINT64_MAX

struct sim {
  uint32_t nslots;
  uint64_t *slot_page;          /* page held by slot or NOPAGE */
  unsigned hits, misses, hot_hits, hot_accesses;
};

/* sm with nslots slots, all empty (free with sim_free). */
static void
sim_init (struct sim *sm, uint32_t nslots)
{
  memset (sm, 0, sizeof *sm);
  sm->nslots = nslots;
  sm->slot_page = malloc (nslots * sizeof *sm->slot_page);
  assert_non_null (sm->slot_page);
  for (uint32_t i = 0; i < nslots; ++i)
    sm->slot_page[i] = NOPAGE;
}

static void
sim_free (struct sim *sm)
{
  free (sm->slot_page);
}

static long
sim_find (const struct sim *sm, uint64_t page)
{
  for (uint32_t i = 0; i < sm->nslots; ++i)
    if (sm->slot_page[i] == page)
      return i;
  return -1;
}

static bool
is_hot (uint64_t page)
{
  return page < 8;
}

/* Trace: each step touches 3 hot pages (round robin over 8) and one
 * new cold page.
 */
static size_t
make_trace (uint64_t *trace, size_t steps)
{
  size_t n = 0;
  uint64_t hot = 0, cold = 1000;

  for (size_t i = 0; i < steps; ++i) {
    for (int k = 0; k < 3; ++k)
      trace[n++] = hot++ % 8;
    trace[n++] = cold++;
  }
  return n;
}

static void
run_clock (struct sim *sm, const uint64_t *trace, size_t n)
{
  struct evict *ev = evict_new_policy (EVICT_CLOCK, sm->nslots);
  uint32_t used = 0;

  for (size_t i = 0; i < n; ++i) {
    uint64_t page = trace[i];
    long s = sim_find (sm, page);
    if (is_hot (page))
      sm->hot_accesses++;
    if (s >= 0) {
      sm->hits++;
      if (is_hot (page))
        sm->hot_hits++;
      evict_touch (ev, s);
      continue;
    }
    sm->misses++;
    if (used < sm->nslots)
      s = used++;
    else {
      s = evict_victim (ev, victims_take_all, NULL);
      assert_int_not_equal (s, EVICT_NONE);
      assert_int_not_equal (sm->slot_page[s], NOPAGE);
    }
    sm->slot_page[s] = page;
    evict_insert (ev, s);
    assert_int_equal (evict_resident (ev), used);
  }
  evict_free (ev);
}

/* The place of p among page[0 .. used - 1], or used if it is not there. */
static uint32_t
ref_lookup (const uint64_t *page, uint32_t used, uint64_t p)
{
  uint32_t j;

  for (j = 0; j < used; ++j)
    if (page[j] == p)
      break;
  return j;
}

/* Where a miss goes in a reference policy: a free place while there is
 * one (*used grows), else the place with the lowest key or, if highest,
 * the highest.
 */
static uint32_t
ref_place (const size_t *key, uint32_t *used, uint32_t nslots, bool highest)
{
  uint32_t j = 0;

  if (*used < nslots)
    return (*used)++;
  for (uint32_t k = 1; k < *used; ++k)
    if (highest ? key[k] > key[j] : key[k] < key[j])
      j = k;
  return j;
}

/* The hits of a reference policy of nslots (<= 64) over trace: access
 * i gives its page the key key[i] (NULL: i itself), and a miss with no
 * free place takes the place of the page with the lowest key or, if
 * highest, the highest.
 */
static unsigned
ref_run (uint32_t nslots, const uint64_t *trace, size_t n,
         const size_t *key, bool highest)
{
  uint64_t page[64];
  size_t keys[64];
  uint32_t used = 0;
  unsigned hits = 0;

  assert_true (nslots <= 64);
  for (size_t i = 0; i < n; ++i) {
    uint32_t j = ref_lookup (page, used, trace[i]);

    if (j < used)
      hits++;
    else {
      j = ref_place (keys, &used, nslots, highest);
      page[j] = trace[i];
    }
    keys[j] = key ? key[i] : i;
  }
  return hits;
}

/* LRU by timestamps. */
static unsigned
run_lru (uint32_t nslots, const uint64_t *trace, size_t n)
{
  return ref_run (nslots, trace, n, NULL, false);
}

/* Belady: evict the page whose next use is furthest away. */
struct pos {
  uint64_t page;
  size_t i;
};

static int
cmp_pos (const void *a, const void *b)
{
  const struct pos *x = a, *y = b;

  if (x->page != y->page)
    return x->page < y->page ? -1 : 1;
  return x->i < y->i ? -1 : x->i > y->i;
}

static unsigned
run_opt (uint32_t nslots, const uint64_t *trace, size_t n)
{
  unsigned hits;
  size_t *next = malloc (n * sizeof *next);
  struct pos *pos = malloc (n * sizeof *pos);

  assert_non_null (next);
  assert_non_null (pos);
  for (size_t i = 0; i < n; ++i) {
    pos[i].page = trace[i];
    pos[i].i = i;
  }
  qsort (pos, n, sizeof *pos, cmp_pos);
  for (size_t k = 0; k < n; ++k)
    next[pos[k].i] = (k + 1 < n && pos[k + 1].page == pos[k].page)
      ? pos[k + 1].i : SIZE_MAX;
  hits = ref_run (nslots, trace, n, next, true);   /* by next use */
  free (next);
  free (pos);
  return hits;
}

static void
test_hit_ratio_hot_set (void **state)
{
  const size_t steps = 5000;
  uint64_t *trace = malloc (steps * 4 * sizeof *trace);
  struct sim sm;
  size_t n;
  unsigned lru, opt;

  assert_non_null (trace);
  n = make_trace (trace, steps);
  sim_init (&sm, 16);

  run_clock (&sm, trace, n);
  lru = run_lru (sm.nslots, trace, n);
  opt = run_opt (sm.nslots, trace, n);

  print_message ("hot/cold trace, %zu accesses, 16 slots: "
                 "CLOCK %u hits (hot %u/%u), LRU %u, OPT %u\n",
                 n, sm.hits, sm.hot_hits, sm.hot_accesses, lru, opt);

  /* Only the first touch of each hot page may miss... give a little
   * slack for warm-up.
   */
  assert_true (sm.hot_hits >= sm.hot_accesses - 16);
  /* Cold pages are never reused: they can never hit. */
  assert_int_equal (sm.hits, sm.hot_hits);
  /* Sanity of the references and CLOCK against them. */
  assert_true (sm.hits <= opt);
  assert_true (lru <= opt);
  assert_true (sm.hits * 100 >= lru * 98);
  /* The hot set is resident at the end. */
  for (uint64_t p = 0; p < 8; ++p)
    assert_true (sim_find (&sm, p) >= 0);

  sim_free (&sm);
  free (trace);
}

/* A scan bigger than the cache followed by re-use of a small hot set:
 * the hot set, once re-established, stays.
 */
static void
test_hit_ratio_hot_random (void **state)
{
  const size_t n = 20000;
  uint64_t *trace = malloc (n * sizeof *trace);
  struct sim sm;
  uint64_t cold = 100000;

  assert_non_null (trace);
  srandom (3);
  /* 7 of every 8 accesses go to a hot set of 16 pages (random order),
   * the rest to a sequential scan.
   */
  for (size_t i = 0; i < n; ++i)
    trace[i] = (i % 8 == 7) ? cold++ : (uint64_t) (random () % 16);
  sim_init (&sm, 32);

  run_clock (&sm, trace, n);
  unsigned lru = run_lru (sm.nslots, trace, n);
  unsigned opt = run_opt (sm.nslots, trace, n);
  print_message ("hot16+stream trace, %zu accesses, 32 slots: "
                 "CLOCK %u hits, LRU %u, OPT %u\n", n, sm.hits, lru, opt);
  assert_true (sm.hits <= opt);
  assert_true (sm.hits * 100 >= lru * 95);
  /* 7/8 of the accesses are hot and the hot set fits: >= 85% hits. */
  assert_true (sm.hits * 100 >= n * 85);

  sim_free (&sm);
  free (trace);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_new_free),
    cmocka_unit_test (test_known_trace_1),
    cmocka_unit_test (test_known_trace_2),
    cmocka_unit_test (test_touch_nonresident),
    cmocka_unit_test (test_remove_insert_bookkeeping),
    cmocka_unit_test (test_can_take_respected),
    cmocka_unit_test (test_can_take_random),
    cmocka_unit_test (test_hit_ratio_hot_set),
    cmocka_unit_test (test_hit_ratio_hot_random),
  };

  return cmocka_run_group_tests (tests, NULL, NULL);
}
