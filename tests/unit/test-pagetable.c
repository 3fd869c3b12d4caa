/* nbdkit-ssdcache-filter unit tests: the in-RAM page table (pagetable.c).
 *
 * init/free, index insert/lookup/remove, the free list, churn against
 * a reference model with backend pages spread over 2^50, entry
 * conversion and the valid-range helper.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "pagetable.h"

static uint64_t rng_state;

static uint64_t
rnd (void)
{
  /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1DULL;
}

static void
check_empty (struct pagetable *pt, uint32_t nslots)
{
  assert_int_equal (pt->nslots, nslots);
  assert_non_null (pt->recs);
  assert_non_null (pt->buckets);
  assert_int_equal (pt->nfree, nslots);
  assert_int_equal (pt->nindexed, 0);
  /* Power-of-two bucket count, sized by the cache. */
  assert_int_equal ((pt->bucket_mask + 1) & pt->bucket_mask, 0);
  assert_true ((uint64_t) pt->bucket_mask + 1 <= 8 * (uint64_t) nslots + 64);
  for (uint32_t i = 0; i < nslots; ++i) {
    assert_int_equal (pt_state (pt, i), LAYOUT_FREE);
    assert_int_equal (pt_pins (pt, i), 0);
    assert_int_equal (pt_flags (pt, i) & PT_INDEXED, 0);
  }
  assert_int_equal (pagetable_lookup (pt, 0), PT_NONE);
  assert_int_equal (pagetable_lookup (pt, 1), PT_NONE);
  assert_int_equal (pagetable_lookup (pt, UINT64_MAX), PT_NONE);
}

static void
test_init_free (void **state)
{
  struct pagetable pt;
  uint32_t sizes[] = { 1, 2, 3, 16, 1000, 65536, 100003 };

  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    memset (&pt, 0xcc, sizeof pt);
    assert_int_equal (pagetable_init (&pt, sizes[i]), 0);
    check_empty (&pt, sizes[i]);
    pagetable_free (&pt);
  }
}

static void
test_free_list (void **state)
{
  struct pagetable pt;
  const uint32_t n = 37;
  uint8_t seen[37] = { 0 };
  uint32_t taken[37];

  assert_int_equal (pagetable_init (&pt, n), 0);
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t s = pagetable_take_free (&pt);
    assert_int_not_equal (s, PT_NONE);
    assert_true (s < n);
    assert_int_equal (seen[s], 0);
    seen[s] = 1;
    taken[i] = s;
    assert_int_equal (pt.nfree, n - 1 - i);
  }
  assert_int_equal (pagetable_take_free (&pt), PT_NONE);
  assert_int_equal (pagetable_take_free (&pt), PT_NONE);
  assert_int_equal (pt.nfree, 0);

  /* Give back every other one, take them again. */
  for (uint32_t i = 0; i < n; i += 2) {
    pagetable_put_free (&pt, taken[i]);
    seen[taken[i]] = 0;
  }
  assert_int_equal (pt.nfree, (n + 1) / 2);
  for (uint32_t i = 0; i < (n + 1) / 2; ++i) {
    uint32_t s = pagetable_take_free (&pt);
    assert_int_not_equal (s, PT_NONE);
    assert_int_equal (seen[s], 0);
    seen[s] = 1;
  }
  assert_int_equal (pagetable_take_free (&pt), PT_NONE);
  assert_int_equal (pt.nindexed, 0);
  pagetable_free (&pt);
}

static void
test_put_free_resets (void **state)
{
  struct pagetable pt;
  struct pt_slot v;
  uint32_t s;

  assert_int_equal (pagetable_init (&pt, 4), 0);
  s = pagetable_take_free (&pt);
  pagetable_insert (&pt, s, 777);
  pt_set_state (&pt, s, LAYOUT_CLEAN);
  pt_set_seq (&pt, s, 9);
  pt_set_crc (&pt, s, 1234);
  memset (v.valid, 0xff, sizeof v.valid);
  memset (v.dirty, 0, sizeof v.dirty);
  assert_true (pt_maps_set (&pt, s, v.valid, v.dirty));
  pt_flags_on (&pt, s, PT_VERIFIED);
  pagetable_remove (&pt, s);
  assert_int_equal (pagetable_lookup (&pt, 777), PT_NONE);
  /* remove keeps the metadata */
  assert_int_equal (pt_page (&pt, s), 777);
  assert_int_equal (pt_state (&pt, s), LAYOUT_CLEAN);
  assert_int_equal (pt_flags (&pt, s) & PT_INDEXED, 0);
  pagetable_put_free (&pt, s);
  assert_int_equal (pt_state (&pt, s), LAYOUT_FREE);
  pagetable_get (&pt, s, &v);
  for (size_t i = 0; i < sizeof v.valid; ++i) {
    assert_int_equal (v.valid[i], 0);
    assert_int_equal (v.dirty[i], 0);
  }
  assert_int_equal (pt_flags (&pt, s) & (PT_INDEXED | PT_VERIFIED), 0);
  assert_int_equal (pt.nfree, 4);
  pagetable_free (&pt);
}

static void
test_insert_lookup_remove (void **state)
{
  struct pagetable pt;
  const uint32_t n = 8;
  uint64_t pages[8] = {
    0, 1, 2, (1ULL << 50) - 1, 1ULL << 40, UINT64_MAX - 1, 12345678901ULL, 64
  };
  uint32_t slots[8];

  assert_int_equal (pagetable_init (&pt, n), 0);
  for (uint32_t i = 0; i < n; ++i) {
    slots[i] = pagetable_take_free (&pt);
    pagetable_insert (&pt, slots[i], pages[i]);
    assert_int_equal (pt.nindexed, i + 1);
    assert_true (pt_flags (&pt, slots[i]) & PT_INDEXED);
    assert_int_equal (pt_page (&pt, slots[i]), pages[i]);
  }
  for (uint32_t i = 0; i < n; ++i)
    assert_int_equal (pagetable_lookup (&pt, pages[i]), slots[i]);
  assert_int_equal (pagetable_lookup (&pt, 3), PT_NONE);
  assert_int_equal (pagetable_lookup (&pt, 1ULL << 50), PT_NONE);

  /* Remove from the middle of whatever chains exist, in odd order. */
  uint32_t order[8] = { 3, 0, 7, 5, 1, 6, 2, 4 };
  for (uint32_t k = 0; k < n; ++k) {
    uint32_t i = order[k];
    pagetable_remove (&pt, slots[i]);
    assert_int_equal (pt.nindexed, n - 1 - k);
    assert_int_equal (pagetable_lookup (&pt, pages[i]), PT_NONE);
    for (uint32_t j = k + 1; j < n; ++j)
      assert_int_equal (pagetable_lookup (&pt, pages[order[j]]),
                        slots[order[j]]);
  }

  /* A removed slot may be reused directly (reclaim path) for another
   * page without going through the free list.
   */
  pagetable_insert (&pt, slots[0], 99);
  assert_int_equal (pagetable_lookup (&pt, 99), slots[0]);
  assert_int_equal (pagetable_lookup (&pt, pages[0]), PT_NONE);
  pagetable_remove (&pt, slots[0]);
  pagetable_free (&pt);
}

/* Pages that all land in the same bucket whatever the (page & mask)
 * style hash: multiples of a large power of two; plus pages equal
 * modulo nbuckets.
 */
static void
test_collisions (void **state)
{
  struct pagetable pt;
  const uint32_t n = 64;
  uint32_t slots[64];

  assert_int_equal (pagetable_init (&pt, n), 0);
  uint64_t nb = (uint64_t) pt.bucket_mask + 1;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t page = (i < 32) ? (uint64_t) i * nb + 5 : (uint64_t) (i - 32) << 32;
    slots[i] = pagetable_take_free (&pt);
    pagetable_insert (&pt, slots[i], page);
  }
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t page = (i < 32) ? (uint64_t) i * nb + 5 : (uint64_t) (i - 32) << 32;
    assert_int_equal (pagetable_lookup (&pt, page), slots[i]);
  }
  /* remove head, tail and middle of the long chains */
  for (uint32_t i = 0; i < n; i += 3) {
    pagetable_remove (&pt, slots[i]);
    pagetable_put_free (&pt, slots[i]);
  }
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t page = (i < 32) ? (uint64_t) i * nb + 5 : (uint64_t) (i - 32) << 32;
    assert_int_equal (pagetable_lookup (&pt, page),
                      i % 3 == 0 ? PT_NONE : slots[i]);
  }
  assert_int_equal (pt.nfree + pt.nindexed, n);
  pagetable_free (&pt);
}

/* Reference model: arrays of (page, slot) for the indexed slots. */
struct model {
  uint64_t *page;
  uint32_t *slot;
  uint32_t n;
};

static long
model_find (const struct model *m, uint64_t page)
{
  for (uint32_t i = 0; i < m->n; ++i)
    if (m->page[i] == page)
      return i;
  return -1;
}

static uint64_t
random_page (void)
{
  switch (rnd () % 4) {
  case 0: return rnd () % 1000;                      /* dense, small */
  case 1: return rnd () & ((1ULL << 50) - 1);        /* huge backend */
  case 2: return (rnd () % 64) << 44;                /* same low bits */
  default: return (1ULL << 50) - 1 - rnd () % 100;   /* the far end */
  }
}

static void
full_check (struct pagetable *pt, const struct model *m)
{
  uint32_t indexed = 0;

  assert_int_equal (pt->nindexed, m->n);
  for (uint32_t i = 0; i < m->n; ++i) {
    assert_int_equal (pagetable_lookup (pt, m->page[i]), m->slot[i]);
    assert_int_equal (pt_page (pt, m->slot[i]), m->page[i]);
  }
  for (uint32_t s = 0; s < pt->nslots; ++s)
    if (pt_flags (pt, s) & PT_INDEXED)
      indexed++;
  assert_int_equal (indexed, m->n);
}

static void
churn (uint32_t nslots, unsigned ops, uint64_t seed)
{
  struct pagetable pt;
  struct model m;
  uint32_t *reclaimed;          /* removed but not freed */
  uint32_t nreclaimed = 0;

  rng_state = seed;
  m.page = malloc (nslots * sizeof *m.page);
  m.slot = malloc (nslots * sizeof *m.slot);
  reclaimed = malloc (nslots * sizeof *reclaimed);
  assert_non_null (m.page);
  assert_non_null (m.slot);
  assert_non_null (reclaimed);
  m.n = 0;
  assert_int_equal (pagetable_init (&pt, nslots), 0);

  for (unsigned op = 0; op < ops; ++op) {
    unsigned r = rnd () % 100;

    if (r < 40) {                       /* insert */
      uint64_t page = random_page ();
      uint32_t s;
      if (model_find (&m, page) >= 0)
        continue;
      if (nreclaimed > 0 && rnd () % 2) {
        s = reclaimed[--nreclaimed];
      }
      else {
        s = pagetable_take_free (&pt);
        if (m.n + nreclaimed == nslots) {
          assert_int_equal (s, PT_NONE);
          continue;
        }
        assert_int_not_equal (s, PT_NONE);
        assert_int_equal (pt_flags (&pt, s) & PT_INDEXED, 0);
      }
      pagetable_insert (&pt, s, page);
      pt_set_state (&pt, s, LAYOUT_CLEAN);
      m.page[m.n] = page;
      m.slot[m.n] = s;
      m.n++;
    }
    else if (r < 70) {                  /* remove */
      if (m.n == 0)
        continue;
      uint32_t i = rnd () % m.n;
      pagetable_remove (&pt, m.slot[i]);
      assert_int_equal (pagetable_lookup (&pt, m.page[i]), PT_NONE);
      if (rnd () % 4 == 0)
        reclaimed[nreclaimed++] = m.slot[i];
      else
        pagetable_put_free (&pt, m.slot[i]);
      m.page[i] = m.page[m.n - 1];
      m.slot[i] = m.slot[m.n - 1];
      m.n--;
    }
    else {                              /* lookups */
      if (m.n > 0) {
        uint32_t i = rnd () % m.n;
        assert_int_equal (pagetable_lookup (&pt, m.page[i]), m.slot[i]);
      }
      uint64_t page = random_page ();
      long i = model_find (&m, page);
      assert_int_equal (pagetable_lookup (&pt, page),
                        i >= 0 ? m.slot[i] : PT_NONE);
    }

    assert_int_equal (pt.nindexed, m.n);
    assert_int_equal (pt.nfree + m.n + nreclaimed, nslots);
    if (op % 1000 == 0)
      full_check (&pt, &m);
  }
  full_check (&pt, &m);

  /* Drain. */
  while (m.n > 0) {
    m.n--;
    pagetable_remove (&pt, m.slot[m.n]);
    pagetable_put_free (&pt, m.slot[m.n]);
  }
  while (nreclaimed > 0)
    pagetable_put_free (&pt, reclaimed[--nreclaimed]);
  check_empty (&pt, nslots);

  pagetable_free (&pt);
  free (m.page);
  free (m.slot);
  free (reclaimed);
}

static void
test_churn_small (void **state)
{
  churn (8, 20000, 1);
  churn (1, 2000, 2);
}

static void
test_churn_large (void **state)
{
  churn (500, 60000, 3);
  churn (4096, 30000, 4);
}

static void
fill_slot (struct pt_slot *s, uint8_t st)
{
  memset (s, 0, sizeof *s);
  s->page = (1ULL << 49) + 77;
  s->seq = 0xabcdef0123ULL;
  s->data_crc = 0x87654321;
  s->state = st;
  for (unsigned i = 0; i < LAYOUT_MAX_SECTORS; i += 5)
    layout_bit_set (s->valid, i);
  if (st == LAYOUT_DIRTY)
    for (unsigned i = 0; i < LAYOUT_MAX_SECTORS; i += 10)
      layout_bit_set (s->dirty, i);
}

static void
test_entry_roundtrip (void **state)
{
  uint8_t states[] = { LAYOUT_CLEAN, LAYOUT_DIRTY };

  for (size_t k = 0; k < 2; ++k) {
    struct pt_slot s, s2;
    struct pagetable pt;
    struct layout_entry e, e2;
    uint8_t buf[LAYOUT_ENTRY_SIZE];

    fill_slot (&s, states[k]);
    s.pins = 3;                         /* RAM-only fields */
    s.flags = PT_INDEXED | PT_VERIFIED;
    memset (&e, 0xee, sizeof e);
    pagetable_to_entry (&s, &e);
    assert_int_equal (e.page, s.page);
    assert_int_equal (e.seq, s.seq);
    assert_int_equal (e.data_crc, s.data_crc);
    assert_int_equal (e.state, s.state);
    assert_memory_equal (e.valid, s.valid, sizeof e.valid);
    assert_memory_equal (e.dirty, s.dirty, sizeof e.dirty);

    /* Through the on-disk encoding and back. */
    layout_entry_encode (&e, buf);
    assert_int_equal (layout_entry_decode (buf, LAYOUT_MAX_SECTORS, &e2), 0);

    assert_int_equal (pagetable_init (&pt, 3), 0);
    assert_true (pagetable_from_entry (&pt, 1, &e2));
    pagetable_get (&pt, 1, &s2);
    pagetable_free (&pt);
    assert_int_equal (s2.page, s.page);
    assert_int_equal (s2.seq, s.seq);
    assert_int_equal (s2.data_crc, s.data_crc);
    assert_int_equal (s2.state, s.state);
    assert_memory_equal (s2.valid, s.valid, sizeof s.valid);
    assert_memory_equal (s2.dirty, s.dirty, sizeof s.dirty);
    assert_int_equal (s2.pins, 0);
  }
}

/* Both range checks, on a value and on the stored slot 1. */
static struct pagetable rv_pt;

static bool
range_valid (const struct pt_slot *s, unsigned first, unsigned last)
{
  bool a = pt_view_range_valid (s, first, last);

  assert_true (pt_maps_set (&rv_pt, 1, s->valid, s->dirty));
  assert_int_equal (pagetable_range_valid (&rv_pt, 1, first, last), a);
  return a;
}

static void
test_range_valid (void **state)
{
  struct pt_slot s;

  assert_int_equal (pagetable_init (&rv_pt, 2), 0);
  memset (&s, 0, sizeof s);
  for (unsigned i = 3; i <= 10; ++i)
    layout_bit_set (s.valid, i);
  layout_bit_set (s.valid, 127);

  assert_true (range_valid (&s, 3, 10));
  assert_true (range_valid (&s, 3, 3));
  assert_true (range_valid (&s, 10, 10));
  assert_true (range_valid (&s, 5, 8));
  assert_true (range_valid (&s, 127, 127));
  assert_false (range_valid (&s, 2, 10));
  assert_false (range_valid (&s, 3, 11));
  assert_false (range_valid (&s, 0, 0));
  assert_false (range_valid (&s, 0, 127));
  assert_false (range_valid (&s, 11, 126));
  assert_false (range_valid (&s, 126, 127));

  memset (s.valid, 0xff, sizeof s.valid);
  assert_true (range_valid (&s, 0, 127));
  assert_true (range_valid (&s, 0, 7));
  layout_bit_clear (s.valid, 64);
  assert_false (range_valid (&s, 0, 127));
  assert_true (range_valid (&s, 0, 63));
  assert_true (range_valid (&s, 65, 127));
  assert_false (range_valid (&s, 60, 70));

  /* every single-sector range against a random map */
  rng_state = 99;
  for (size_t i = 0; i < sizeof s.valid; ++i)
    s.valid[i] = rnd ();
  for (unsigned a = 0; a < LAYOUT_MAX_SECTORS; ++a)
    for (unsigned b = a; b < LAYOUT_MAX_SECTORS; b += 7) {
      bool want = true;
      for (unsigned i = a; i <= b; ++i)
        if (!layout_bit_test (s.valid, i))
          want = false;
      assert_int_equal (range_valid (&s, a, b), want);
    }
  pagetable_free (&rv_pt);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_init_free),
    cmocka_unit_test (test_free_list),
    cmocka_unit_test (test_put_free_resets),
    cmocka_unit_test (test_insert_lookup_remove),
    cmocka_unit_test (test_collisions),
    cmocka_unit_test (test_churn_small),
    cmocka_unit_test (test_churn_large),
    cmocka_unit_test (test_entry_roundtrip),
    cmocka_unit_test (test_range_valid),
  };

  return cmocka_run_group_tests (tests, NULL, NULL);
}
