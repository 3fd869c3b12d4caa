/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: the in-RAM page table (pagetable.c).
 *
 * init/free, index insert/lookup/remove, the free list, churn against
 * a reference model with backend pages spread over 2^32 - 1, entry
 * conversion and the valid-range helper.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>
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
  /* About a bucket for every two slots: sized by the cache. */
  assert_true (pt->nbuckets >= 1);
  assert_true (pt->nbuckets <= nslots / 2 + 1);
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
    0, 1, 2, PT_MAX_PAGES, 1ULL << 31, PT_MAX_PAGES - 1, 1234567890ULL, 64
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
  uint64_t nb = pt.nbuckets;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t page = (i < 32) ? (uint64_t) i * nb + 5 : (uint64_t) (i - 32) << 27;
    slots[i] = pagetable_take_free (&pt);
    pagetable_insert (&pt, slots[i], page);
  }
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t page = (i < 32) ? (uint64_t) i * nb + 5 : (uint64_t) (i - 32) << 27;
    assert_int_equal (pagetable_lookup (&pt, page), slots[i]);
  }
  /* remove head, tail and middle of the long chains */
  for (uint32_t i = 0; i < n; i += 3) {
    pagetable_remove (&pt, slots[i]);
    pagetable_put_free (&pt, slots[i]);
  }
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t page = (i < 32) ? (uint64_t) i * nb + 5 : (uint64_t) (i - 32) << 27;
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
  case 1: return rnd () % PT_MAX_PAGES;              /* huge backend */
  case 2: return (rnd () % 64) << 26;                /* same low bits */
  default: return PT_MAX_PAGES - rnd () % 100;       /* the far end */
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
  s->page = PT_MAX_PAGES - 77;
  s->seq = 0xabcdef0123ULL;
  pt_slot_set_crc (s, 0x87654321);
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
    s.flags |= PT_INDEXED | PT_VERIFIED;
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
    /* The loader orders versions by the entry's exact number. */
    assert_true (s.seq >> 32);
    assert_int_equal (pt_loaded_seq (&pt, 1), s.seq);
    pt_set_seq (&pt, 1, 0);
    pagetable_get (&pt, 1, &s2);
    /* (These maps are not runs: slot 1 took a side-table entry.) */
    assert_true (pt_maps_side (&pt, 1));
    assert_int_equal (pt.side_used, 1);
    /* A page the table cannot hold is refused. */
    e2.page = (uint64_t) PT_MAX_PAGES + 1;
    assert_false (pagetable_from_entry (&pt, 2, &e2));
    assert_int_equal (pt_state (&pt, 2), LAYOUT_FREE);
    pagetable_free (&pt);
    assert_int_equal (s2.page, s.page);
    /* Then RAM keeps a change stamp, not the entry's number. */
    assert_int_equal (s2.seq, 0);
    /* ...and no checksum (the entry on disk has it). */
    assert_int_equal (s2.flags & PT_CRC_KNOWN, 0);
    assert_int_equal (s2.state, s.state);
    assert_memory_equal (s2.valid, s.valid, sizeof s.valid);
    assert_memory_equal (s2.dirty, s.dirty, sizeof s.dirty);
    assert_int_equal (s2.pins, 0);
  }
}

/* RAM keeps no checksums: an entry is built with one the caller gives
 * (PT_CRC_KNOWN), or is unsealed (its checksum is never read), or free.
 * A sealed one without it would carry a wrong checksum: the process
 * stops instead.
 */
static void
test_entry_needs_crc (void **state)
{
  struct pt_slot s;
  struct layout_entry e;
  pid_t pid;
  int status;

  fill_slot (&s, LAYOUT_DIRTY);
  pagetable_to_entry (&s, &e);
  assert_int_equal (e.data_crc, 0x87654321);
  s.flags = PT_UNSEALED;                        /* no PT_CRC_KNOWN */
  pagetable_to_entry (&s, &e);
  assert_int_equal (e.flags, LAYOUT_ENT_UNSEALED);
  s.flags = 0;
  s.state = LAYOUT_FREE;
  pagetable_to_entry (&s, &e);
  assert_int_equal (e.state, LAYOUT_FREE);

  s.state = LAYOUT_CLEAN;
  pid = fork ();
  assert_true (pid >= 0);
  if (pid == 0) {
    signal (SIGABRT, SIG_DFL);
    pagetable_to_entry (&s, &e);
    _exit (0);
  }
  assert_int_equal (waitpid (pid, &status, 0), pid);
  assert_true (WIFSIGNALED (status));
  assert_int_equal (WTERMSIG (status), SIGABRT);
}

/* The loader's two halves (pagetable_rec_encode on the reader thread,
 * pagetable_load_rec on the loader) leave a slot as
 * pagetable_from_entry does, and refuse what needs more than a record.
 */
static void
test_entry_rec_encode (void **state)
{
  struct pagetable pt;
  struct layout_entry e = {
    .page = ((uint64_t) 0x7a << 32) | 0x12345678, .seq = (5ull << 32) | 9,
    .data_crc = 0xdeadbeef, .state = LAYOUT_DIRTY, .gen = 77,
  };
  struct pt_rec img;
  struct pt_slot a, b;

  for (unsigned i = 8; i < 40; i++)
    layout_bit_set (e.valid, i);
  for (unsigned i = 10; i < 20; i++)
    layout_bit_set (e.dirty, i);
  assert_int_equal (pagetable_init (&pt, 4), 0);
  assert_int_equal (pagetable_keep_gens (&pt), 0);
  pt.gen_ref = 100;
  assert_true (pagetable_from_entry (&pt, 1, &e));
  assert_true (pagetable_rec_encode (&e, &img));
  pagetable_load_rec (&pt, 2, &img, e.gen);
  assert_int_equal (pt_loaded_seq (&pt, 2), e.seq);
  pagetable_get (&pt, 1, &a);
  pagetable_get (&pt, 2, &b);
  assert_int_equal (b.page, e.page);
  assert_int_equal (b.page, a.page);
  assert_int_equal (b.seq, a.seq);
  assert_int_equal (b.epoch, a.epoch);
  assert_int_equal (b.flags & PT_CRC_KNOWN, 0);
  assert_int_equal (a.flags & PT_CRC_KNOWN, 0);
  assert_int_equal (b.state, LAYOUT_DIRTY);
  assert_int_equal (b.state, a.state);
  assert_memory_equal (b.valid, e.valid, sizeof e.valid);
  assert_memory_equal (b.dirty, e.dirty, sizeof e.dirty);
  assert_int_equal (b.gen, 77);
  assert_int_equal (b.gen, a.gen);
  assert_memory_equal (b.valid, a.valid, sizeof a.valid);
  assert_memory_equal (b.dirty, a.dirty, sizeof a.dirty);
  assert_int_equal (pt.side_used, 0);

  /* Maps that are not runs, and pages past the limit, need more. */
  layout_bit_set (e.valid, 60);
  assert_false (pagetable_rec_encode (&e, &img));
  layout_bit_clear (e.valid, 60);
  e.page = (uint64_t) PT_MAX_PAGES + 1;
  assert_false (pagetable_rec_encode (&e, &img));
  pagetable_free (&pt);
}

/* The loader's restart of sequence numbers: every group's base moves
 * to the new one without a walk, and each slot set again reads as it.
 */
static void
test_seq_restart (void **state)
{
  struct pagetable pt;
  const uint32_t n = 3 * 4096 + 17;     /* several groups, one partial */

  assert_int_equal (pagetable_init (&pt, n), 0);
  for (uint32_t s = 0; s < n; s++)
    pt.recs[s].seq = 12345 + s;         /* as pt_loaded_seq leaves it */
  pagetable_seq_restart (&pt, (UINT64_C (7) << 40) + 3);
  for (uint32_t s = 0; s < n; s++) {
    pt_set_seq (&pt, s, 0);
    assert_int_equal (pt_seq (&pt, s), (UINT64_C (7) << 40) + 3);
  }
  pt_set_seq (&pt, n - 1, (UINT64_C (7) << 40) + 9);
  assert_int_equal (pt_seq (&pt, n - 1), (UINT64_C (7) << 40) + 9);
  assert_int_equal (pt_seq (&pt, 0), (UINT64_C (7) << 40) + 3);
  pagetable_free (&pt);
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

/*----------------------------------------------------------------------
 * The compact form (pagetable.c).
 */

/* 29 bytes per slot for the slots and the index, whatever the slots
 * hold; the side table and a fixed part come on top.
 */
static void
test_heap_bytes (void **state)
{
  uint32_t sizes[] = { 1, 2, 16, 1000, 65536, 1000003, 4u << 20 };
  uint8_t valid[16], dirty[16];

  assert_int_equal (sizeof (struct pt_rec), 20);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    struct pagetable pt;
    uint32_t n = sizes[i];

    assert_int_equal (pagetable_init (&pt, n), 0);
    /* 22 bytes a slot, and the pin hash (64 cells at first). */
    assert_true (pagetable_heap_bytes (&pt) <= 22 * (uint64_t) n + 64 + 512);
    /* Full pages, one dirty run, empty maps: no side table. */
    memset (valid, 0xff, sizeof valid);
    memset (dirty, 0, sizeof dirty);
    for (uint32_t s = 0; s < n; s += 1 + n / 1000) {
      uint32_t t = pagetable_take_free (&pt);
      pagetable_insert (&pt, t, (uint64_t) s * 7919);
      pt_set_state (&pt, t, LAYOUT_DIRTY);
      dirty[s % 16] = 0x3c;
      assert_true (pt_maps_set (&pt, t, valid, dirty));
      dirty[s % 16] = 0;
      pt_set_seq (&pt, t, s);
      pt_set_epoch (&pt, t, s);
      pt_pin (&pt, t);
    }
    assert_int_equal (pt.side_used, 0);
    /* Pinned slots: at most 16 bytes each in the pin hash. */
    assert_true (pagetable_heap_bytes (&pt) <=
                 22 * (uint64_t) n + 64 + 512 + 16 * (uint64_t) pt.pin_used);
    /* Partial maps: at most 32 bytes for each side-table entry more. */
    for (uint32_t s = 0; s < n && s < 100; s++) {
      memset (valid, 0x55, sizeof valid);
      pt_maps_set (&pt, s, valid, dirty);
    }
    assert_true (pt.side_used == (n < 100 ? n : 100));
    assert_true (pagetable_heap_bytes (&pt) <=
                 22 * (uint64_t) n + 64 + 512 + 16 * (uint64_t) pt.pin_used
                 + 2 * 32 * (uint64_t) pt.side_used + 64 * 32);
    pagetable_free (&pt);
  }
}

/* A random run (or empty) map; *a, *b its bounds. */
static void
run_map (uint8_t *map, unsigned a, unsigned b)
{
  memset (map, 0, 16);
  for (unsigned i = a; i < b; i++)
    layout_bit_set (map, i);
}

static void
check_slot_maps (struct pagetable *pt, uint32_t s, const uint8_t *valid,
                 const uint8_t *dirty)
{
  uint8_t v[16], d[16];

  pt_maps_get (pt, s, v, d);
  assert_memory_equal (v, valid, 16);
  assert_memory_equal (d, dirty, 16);
  for (unsigned i = 0; i < LAYOUT_MAX_SECTORS; i++)
    assert_int_equal (pt_valid_test (pt, s, i), layout_bit_test (valid, i));
  for (unsigned k = 0; k < 20; k++) {
    unsigned a = rnd () % 128, b = a + rnd () % (128 - a);
    bool want = true;
    for (unsigned i = a; i <= b; i++)
      want &= layout_bit_test (valid, i);
    assert_int_equal (pagetable_range_valid (pt, s, a, b), want);
  }
}

/* Every pair of runs is stored inline (no side entry) and read back. */
static void
test_maps_runs (void **state)
{
  struct pagetable pt;
  uint8_t valid[16], dirty[16];

  rng_state = 5;
  assert_int_equal (pagetable_init (&pt, 4), 0);
  assert_int_equal (pagetable_set_side_limit (&pt, 0), 0);
  for (unsigned a = 0; a <= 128; a++)
    for (unsigned b = a; b <= 128; b++) {
      unsigned da = a + (b > a ? rnd () % (b - a + 1) : 0);
      unsigned db = da + (b > da ? rnd () % (b - da + 1) : 0);
      run_map (valid, a, b);
      run_map (dirty, da, db);
      assert_true (pt_maps_set (&pt, 1, valid, dirty));
      assert_false (pt_maps_side (&pt, 1));
      check_slot_maps (&pt, 1, valid, dirty);
    }
  assert_int_equal (pt.side_used, 0);
  pagetable_free (&pt);
}

/* Two runs with a gap between them are never taken for one run (the
 * run test works a 64-bit word at a time: runs that meet, end or start
 * at the word boundary are the cases to get right), and go to the side
 * table intact; in the dirty map too.
 */
static void
test_maps_two_runs (void **state)
{
  static const unsigned pts[] = { 0, 1, 2, 7, 8, 31, 62, 63, 64, 65, 66,
                                  100, 126, 127, 128 };
  const unsigned np = sizeof pts / sizeof pts[0];
  struct pagetable pt;
  uint8_t valid[16], dirty[16], one[16];

  assert_int_equal (pagetable_init (&pt, 4), 0);
  assert_int_equal (pagetable_set_side_limit (&pt, 4), 0);
  run_map (one, 0, 128);
  for (unsigned i = 0; i < np; i++)
    for (unsigned j = i + 1; j < np; j++)
      for (unsigned k = j + 1; k < np; k++)
        for (unsigned l = k + 1; l < np; l++) {
          unsigned a = pts[i], b = pts[j], c = pts[k], d = pts[l];

          run_map (valid, a, b);
          for (unsigned x = c; x < d; x++)
            valid[x >> 3] |= 1u << (x & 7);
          memset (dirty, 0, sizeof dirty);
          assert_true (pt_maps_set (&pt, 1, valid, dirty));
          assert_true (pt_maps_side (&pt, 1));
          check_slot_maps (&pt, 1, valid, dirty);
          assert_true (pt_maps_set (&pt, 2, one, valid));
          assert_true (pt_maps_side (&pt, 2));
          check_slot_maps (&pt, 2, one, valid);
          /* and back to runs: inline again */
          run_map (valid, a, d);
          run_map (dirty, b, c);
          assert_true (pt_maps_set (&pt, 1, valid, dirty));
          assert_false (pt_maps_side (&pt, 1));
          check_slot_maps (&pt, 1, valid, dirty);
          assert_true (pt_maps_set (&pt, 2, valid, valid));
          assert_false (pt_maps_side (&pt, 2));
        }
  assert_int_equal (pt.side_used, 0);
  pagetable_free (&pt);
}

/* Maps that are not runs use the side table up to its limit; past it
 * pt_maps_set fails and changes nothing; runs give the entry back, and
 * so does freeing the slot; _force goes past the limit.
 */
static void
test_side_table (void **state)
{
  struct pagetable pt;
  uint8_t valid[16], dirty[16], v2[16], d2[16];
  uint8_t multi[8][16];

  rng_state = 11;
  assert_int_equal (pagetable_init (&pt, 8), 0);
  assert_int_equal (pagetable_set_side_limit (&pt, 3), 0);
  for (int k = 0; k < 8; k++) {
    for (int i = 0; i < 16; i++)
      multi[k][i] = rnd ();
    multi[k][0] = 0x05;                 /* two runs at least */
  }
  memset (dirty, 0, sizeof dirty);
  for (uint32_t s = 0; s < 3; s++) {
    assert_true (pt_maps_set (&pt, s, multi[s], dirty));
    assert_true (pt_maps_side (&pt, s));
    check_slot_maps (&pt, s, multi[s], dirty);
  }
  assert_int_equal (pt.side_used, 3);
  /* Full: a fourth slot cannot have such maps, and keeps its own. */
  run_map (valid, 2, 9);
  assert_true (pt_maps_set (&pt, 3, valid, dirty));
  assert_false (pt_maps_set (&pt, 3, multi[3], dirty));
  assert_false (pt_maps_reserve (&pt, 3));
  assert_false (pt_maps_reserve_for (&pt, 3, multi[3], dirty));
  assert_true (pt_maps_reserve_for (&pt, 3, valid, valid));
  check_slot_maps (&pt, 3, valid, dirty);
  assert_int_equal (pt.side_full, 3);
  /* A slot that has an entry may change its partial maps freely. */
  run_map (d2, 0, 1);
  assert_true (pt_maps_set (&pt, 0, multi[4], d2));
  check_slot_maps (&pt, 0, multi[4], d2);
  assert_true (pt_maps_reserve (&pt, 0));
  assert_int_equal (pt.side_used, 3);
  /* Back to runs: the entry is free again. */
  assert_true (pt_maps_set (&pt, 1, valid, dirty));
  assert_false (pt_maps_side (&pt, 1));
  assert_int_equal (pt.side_used, 2);
  assert_true (pt_maps_set (&pt, 3, multi[3], dirty));
  check_slot_maps (&pt, 3, multi[3], dirty);
  /* Freeing a slot gives its entry back. */
  pagetable_put_free (&pt, 2);
  assert_int_equal (pt.side_used, 2);
  pt_maps_get (&pt, 2, v2, d2);
  memset (valid, 0, sizeof valid);
  assert_memory_equal (v2, valid, 16);
  /* Reserve keeps the current maps and makes any later maps fit. */
  run_map (valid, 10, 20);
  assert_true (pt_maps_set (&pt, 4, valid, dirty));
  assert_true (pt_maps_reserve (&pt, 4));
  assert_true (pt_maps_side (&pt, 4));
  check_slot_maps (&pt, 4, valid, dirty);
  assert_int_equal (pt.side_used, 3);
  assert_true (pt_maps_set (&pt, 4, multi[5], dirty));
  check_slot_maps (&pt, 4, multi[5], dirty);
  /* Past the limit only by force. */
  assert_false (pt_maps_set (&pt, 5, multi[6], dirty));
  assert_true (pt_maps_set_force (&pt, 5, multi[6], dirty));
  assert_int_equal (pt.side_used, 4);
  for (uint32_t s = 0; s < 8; s++)
    if (s != 2)
      pagetable_put_free (&pt, s);
  assert_int_equal (pt.side_used, 0);
  pagetable_free (&pt);
}

/* Many side entries (indexes past 16384 use the valid code's high
 * part): each slot gets its own maps back.
 */
static void
test_side_table_large (void **state)
{
  const uint32_t n = 70000;
  struct pagetable pt;
  uint8_t dirty[16] = { 0 };

  assert_int_equal (pagetable_init (&pt, n), 0);
  assert_int_equal (pagetable_set_side_limit (&pt, n), 0);
  for (uint32_t s = 0; s < n; s++) {
    uint8_t valid[16] = { 0 };
    memcpy (valid, &s, sizeof s);
    valid[14] = 0x01;
    valid[15] = 0x80;                   /* never one run */
    assert_true (pt_maps_set (&pt, s, valid, dirty));
  }
  assert_int_equal (pt.side_used, n);
  for (uint32_t s = 0; s < n; s++) {
    uint8_t v[16], want[16] = { 0 };
    memcpy (want, &s, sizeof s);
    want[14] = 0x01;
    want[15] = 0x80;
    pt_maps_get (&pt, s, v, NULL);
    assert_memory_equal (v, want, 16);
  }
  assert_int_equal (pagetable_set_side_limit (&pt, PT_SIDE_MAX + 1), -1);
  pagetable_free (&pt);
}

/* Epochs across many rebases against exact 64-bit ones: what the
 * cache decides from them (copy on write: may the epoch be <= the
 * flushing epoch; free a predecessor: is its successor's surely <= the
 * flushed epoch; seal: may it be <= a sync's epoch) is exact while the
 * base keeps up, and only ever errs the safe way (may: true, surely:
 * false) when it does not.
 */
static void
epoch_model (uint32_t span, unsigned stall, uint64_t seed, int want_inexact)
{
  const uint32_t n = 48;
  struct pagetable pt;
  uint64_t truth[48];
  uint64_t epoch = 1, flushing = 0, flushed = 0, inflight[4];
  unsigned ninflight = 0, unknown = 0, exact = 0, inexact = 0;

  _Atomic uint64_t nrebases = 0;

  rng_state = seed;
  pagetable_test_epoch_span = span;
  pagetable_test_base_shift = 3;        /* six groups of 8 slots */
  assert_int_equal (pagetable_init (&pt, n), 0);
  pagetable_test_epoch_span = 0;
  pagetable_test_base_shift = 0;
  pt.rebases = &nrebases;
  for (uint32_t s = 0; s < n; s++) {
    truth[s] = 0;
    pt_set_epoch (&pt, s, 0);
  }
  for (unsigned op = 0; op < 20000; op++) {
    unsigned r = rnd () % 100;
    uint32_t s = rnd () % n;

    if (r < 30) {                       /* a write completes */
      truth[s] = rnd () % 8 ? epoch : PT_EPOCH_PENDING;
      pt_set_epoch (&pt, s, truth[s]);
    }
    else if (r < 45 && ninflight < 4) { /* a client sync starts */
      inflight[ninflight++] = epoch;
      if (epoch > flushing)
        flushing = epoch;
      pagetable_epoch_ceiling (&pt, flushing);
      epoch++;
    }
    else if (r < 60 && ninflight > 0) { /* ... and ends (any of them) */
      unsigned k = rnd () % ninflight;
      uint64_t low;
      /* stall: sometimes the flushed epoch stays behind */
      if (inflight[k] > flushed && (stall == 0 || rnd () % stall == 0))
        flushed = inflight[k];
      inflight[k] = inflight[--ninflight];
      low = flushed;
      for (unsigned i = 0; i < ninflight; i++)
        if (inflight[i] < low)
          low = inflight[i];
      pagetable_epoch_floor (&pt, low);
    }
    else
      epoch++;                          /* a non-client sync */

    /* Check every slot against every threshold the cache uses: never
     * wrong in the unsafe direction (a "surely" that is false, a
     * "maybe not" that is true), and exact unless the floor fell
     * behind.
     */
    for (uint32_t k = 0; k < n; k++) {
      uint64_t ts[6] = { flushing, flushed, epoch, epoch - 1, 0, 0 };
      unsigned nt = 4;
      if (pt_epoch (&pt, k) == PT_EPOCH_UNKNOWN)
        unknown++;
      for (unsigned i = 0; i < ninflight && nt < 6; i++)
        ts[nt++] = inflight[i];
      for (unsigned i = 0; i < nt; i++) {
        bool le = truth[k] != PT_EPOCH_PENDING && truth[k] <= ts[i];
        bool may = pt_epoch_may_be_at_most (&pt, k, ts[i]);
        bool surely = pt_epoch_surely_at_most (&pt, k, ts[i]);
        if (le)
          assert_true (may);
        else
          assert_false (surely);
        /* The copy on write asks "may it be <= flushing": exact. */
        if (i == 0)
          assert_int_equal (may, le);
        if (may == le && surely == le)
          exact++;
        else
          inexact++;
      }
    }
  }
  assert_true (nrebases > 20);
  assert_true (exact > 0);
  assert_int_equal (unknown, 0);
  if (want_inexact == 0)
    assert_int_equal (inexact, 0);
  else if (want_inexact == 1)
    assert_true (inexact > 0);
  pagetable_free (&pt);
}

/* No client flush for many spans (writeback syncs the cache alone): the
 * floor and the ceiling stay at 0, yet no epoch becomes unknown, the
 * slot just written stays exact, and "may it be <= 0" (the copy on
 * write's question, with no flush) is answered exactly: no copies;
 * once a client flush ends (floor and flushed epoch at the newest),
 * every comparison with it is exact again, so the predecessors it
 * allows to free are freed.
 */
static void
test_epoch_floor_behind (void **state)
{
  const uint32_t n = 16;
  uint64_t truth[16] = { 0 };
  struct pagetable pt;

  rng_state = 11;
  pagetable_test_epoch_span = 16;
  pagetable_test_base_shift = 2;        /* four groups of 4 slots */
  assert_int_equal (pagetable_init (&pt, n), 0);
  pagetable_test_epoch_span = 0;
  pagetable_test_base_shift = 0;
  for (uint64_t epoch = 1; epoch <= 1000; epoch++) {
    uint32_t s = (uint32_t) (rnd () % n);

    truth[s] = epoch;
    pt_set_epoch (&pt, s, epoch);
    assert_int_equal (pt_epoch (&pt, s), epoch);
    for (uint32_t k = 0; k < n; k++) {
      assert_true (pt_epoch (&pt, k) != PT_EPOCH_UNKNOWN);
      /* Against the flushing epoch 0: exact. */
      assert_int_equal (pt_epoch_may_be_at_most (&pt, k, 0), truth[k] == 0);
      assert_int_equal (pt_epoch_surely_at_most (&pt, k, 0), truth[k] == 0);
      assert_true (pt_epoch_may_be_at_most (&pt, k, epoch));
    }
  }
  pagetable_epoch_ceiling (&pt, 1001);
  pagetable_epoch_floor (&pt, 1001);
  for (uint32_t k = 0; k < n; k++) {
    assert_true (pt_epoch_surely_at_most (&pt, k, 1001));
    if (truth[k] > 0)
      assert_false (pt_epoch_may_be_at_most (&pt, k, 0) &&
                    pt_epoch_surely_at_most (&pt, k, 0));
  }
  pagetable_free (&pt);
}

static void
test_epoch_rebase (void **state)
{
  epoch_model (8, 0, 1, -1);
  epoch_model (16, 0, 2, -1);
  epoch_model (6, 0, 3, -1);
  epoch_model (256, 0, 5, 0);   /* room enough: always exact */
  epoch_model (8, 50, 4, 1);    /* the floor falls behind: "maybe" */
}

/* Sequence numbers as change stamps across many rebases: a slot's stamp
 * never goes down, one that changes always reads differently from
 * before, and a recent one reads exactly.  A rebase moves the base of
 * the changed slot's group of 8 only.
 */
static void
test_seq_rebase (void **state)
{
  const uint32_t n = 32;
  struct pagetable pt;
  uint64_t seq = 0, last[32], snap[32], bases[4];

  rng_state = 21;
  pagetable_test_seq_span = 16;
  pagetable_test_base_shift = 3;
  assert_int_equal (pagetable_init (&pt, n), 0);
  pagetable_test_seq_span = 0;
  pagetable_test_base_shift = 0;
  for (uint32_t s = 0; s < n; s++) {
    last[s] = snap[s] = pt_seq (&pt, s);
  }
  for (unsigned op = 0; op < 50000; op++) {
    uint32_t s = rnd () % n;

    if (rnd () % 3 == 0)
      snap[s] = pt_seq (&pt, s);        /* writeback looks at it */
    else {
      uint64_t before = pt_seq (&pt, s);
      for (uint32_t g = 0; g < 4; g++)
        bases[g] = pt.bases[g].seq;
      pt_set_seq (&pt, s, ++seq);
      for (uint32_t g = 0; g < 4; g++)
        if (g != s / 8)
          assert_int_equal (pt.bases[g].seq, bases[g]);
      assert_int_equal (pt_seq (&pt, s), seq);
      assert_true (pt_seq (&pt, s) != before);
      assert_true (pt_seq (&pt, s) != snap[s]);
    }
    for (uint32_t k = 0; k < n; k++) {
      uint64_t now = pt_seq (&pt, k);
      assert_true (now >= last[k]);
      assert_true (now <= seq || seq == 0);
      last[k] = now;
    }
  }
  for (uint32_t g = 0; g < 4; g++)
    assert_true (pt.bases[g].seq > 1000);
  pagetable_free (&pt);
}

/* Pins past 255 per slot. */
static void
test_pins_overflow (void **state)
{
  struct pagetable pt;

  assert_int_equal (pagetable_init (&pt, 4), 0);
  for (unsigned i = 0; i < 1000; i++) {
    pt_pin (&pt, 1);
    if (i % 2)
      pt_pin (&pt, 2);
  }
  assert_int_equal (pt_pins (&pt, 1), 1000);
  assert_int_equal (pt_pins (&pt, 2), 500);
  assert_int_equal (pt_pins (&pt, 0), 0);
  for (unsigned i = 1000; i-- > 0;)
    assert_int_equal (pt_unpin (&pt, 1), i);
  for (unsigned i = 500; i-- > 0;)
    assert_int_equal (pt_unpin (&pt, 2), i);
  assert_int_equal (pt.pin_used, 0);
  pagetable_free (&pt);
}

/* Pins of many slots at once, against a model: the hash grows, its
 * probe runs collide, and cells go in any order (every count checked
 * after each change, a sample of the others too).
 */
static void
test_pins_many (void **state)
{
  enum { N = 6000 };
  static unsigned model[N];
  struct pagetable pt;
  uint32_t pinned = 0, cap0;

  rng_state = 7;
  memset (model, 0, sizeof model);
  assert_int_equal (pagetable_init (&pt, N), 0);
  cap0 = pt.pin_mask + 1;
  for (unsigned step = 0; step < 400000; step++) {
    /* Mostly pins in the first half, unpins in the second. */
    uint32_t s = (uint32_t) (rnd () % (step < 200000 ? N : N / 8));
    bool pin = rnd () % 8 < (step < 200000 ? 5u : 2u);

    if (pin || model[s] == 0) {
      pinned += model[s] == 0;
      pt_pin (&pt, s);
      model[s]++;
    }
    else {
      assert_int_equal (pt_unpin (&pt, s), --model[s]);
      pinned -= model[s] == 0;
    }
    assert_int_equal (pt_pins (&pt, s), model[s]);
    assert_int_equal (pt.pin_used, pinned);
    for (unsigned k = 0; k < 4; k++) {
      uint32_t t = (uint32_t) (rnd () % N);
      assert_int_equal (pt_pins (&pt, t), model[t]);
    }
  }
  assert_true (pt.pin_mask + 1 > cap0);
  for (uint32_t s = 0; s < N; s++) {
    assert_int_equal (pt_pins (&pt, s), model[s]);
    while (model[s] > 0)
      assert_int_equal (pt_unpin (&pt, s), --model[s]);
  }
  assert_int_equal (pt.pin_used, 0);
  for (uint32_t s = 0; s < N; s++)
    assert_int_equal (pt_pins (&pt, s), 0);
  pagetable_free (&pt);
}

/* Two tables sharing a budget of 3 slots (unit 10 bytes): taking
 * fails once 3 are out, whichever table holds them, although both
 * still have free slots; freeing gives room back; clearing the free
 * list (loading) charges every slot; unlinking gives back what the
 * table holds.
 */
static void
test_shared_budget (void **state)
{
  struct pagetable a, b;
  struct budget bg;
  uint32_t s1, s2, s3;

  budget_init (&bg, 30);
  assert_int_equal (pagetable_init (&a, 4), 0);
  assert_int_equal (pagetable_init (&b, 4), 0);
  pagetable_set_budget (&a, &bg, 10);
  pagetable_set_budget (&b, &bg, 10);
  assert_int_equal (budget_used (&bg), 0);

  s1 = pagetable_take_free (&a);
  s2 = pagetable_take_free (&a);
  s3 = pagetable_take_free (&b);
  assert_int_not_equal (s1, PT_NONE);
  assert_int_not_equal (s2, PT_NONE);
  assert_int_not_equal (s3, PT_NONE);
  assert_int_equal (budget_used (&bg), 30);
  assert_int_equal (pagetable_take_free (&b), PT_NONE);
  assert_true (b.nfree > 0);               /* over budget, not empty */
  assert_int_equal (pagetable_take_free (&a), PT_NONE);

  pagetable_put_free (&a, s1);
  assert_int_equal (budget_used (&bg), 20);
  assert_int_not_equal (pagetable_take_free (&b), PT_NONE);
  assert_int_equal (budget_used (&bg), 30);

  /* b holds 2; unlinking it gives them back. */
  pagetable_set_budget (&b, NULL, 0);
  assert_int_equal (budget_used (&bg), 10);
  /* Loading charges the whole table, whatever the limit. */
  pagetable_clear_free (&b);
  pagetable_set_budget (&b, &bg, 10);
  assert_int_equal (budget_used (&bg), 50);
  pagetable_put_free (&b, 0);
  assert_int_equal (budget_used (&bg), 40);

  pagetable_free (&a);
  pagetable_free (&b);
  assert_int_equal (budget_used (&bg), 0);
}

/* Pending slots counted per generation (core/ptgens.c): random
 * changes of state, flags and generation through the accessors, with
 * generations that mostly grow (as the flush order makes them) and now
 * and then an older one (a copy that keeps its generation, recovery);
 * after each change the counts match a scan, and the oldest agrees.
 */
static void
test_pending_counts (void **state)
{
  const uint32_t n = 64;
  struct pagetable pt;
  uint64_t rng = 88172645463325252ULL, gen = 1;
  uint32_t slots[64], nheld = 0;

  assert_int_equal (pagetable_init (&pt, n), 0);
  assert_int_equal (pagetable_keep_gens (&pt), 0);
  pt.gen_ref = gen;
  pagetable_count_pending (&pt);
  assert_int_equal (pagetable_oldest_pending (&pt), UINT64_MAX);
  for (unsigned i = 0; i < 20000; i++) {
    uint32_t k, s;

    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    k = nheld ? (uint32_t) (rng >> 32) % nheld : 0;
    s = nheld ? slots[k] : PT_NONE;
    switch (rng % 10) {
    case 0:                                   /* a flush */
      pt.gen_ref = ++gen;
      break;
    case 1:                                   /* a slot taken */
      if ((s = pagetable_take_free (&pt)) != PT_NONE) {
        slots[nheld++] = s;
        pt_set_gen (&pt, s, gen);
        pt_set_state (&pt, s, LAYOUT_DIRTY);
        if (pagetable_lookup (&pt, s) == PT_NONE && rng % 3)
          pagetable_insert (&pt, s, s);
      }
      break;
    case 2:                                   /* a slot freed */
      if (s != PT_NONE) {
        pagetable_remove (&pt, s);
        pagetable_put_free (&pt, s);
        slots[k] = slots[--nheld];
      }
      break;
    case 3:                                   /* written back */
      if (s != PT_NONE)
        pt_set_state (&pt, s, (rng >> 8) % 2 ? LAYOUT_CLEAN : LAYOUT_DIRTY);
      break;
    case 4:                                   /* superseded, or not */
      if (s != PT_NONE) {
        if ((rng >> 8) % 2)
          pt_flags_on (&pt, s, PT_SUPERSEDED);
        else
          pt_flags_off (&pt, s, PT_SUPERSEDED);
      }
      break;
    case 5:                                   /* out of the index */
      if (s != PT_NONE)
        pagetable_remove (&pt, s);
      break;
    case 6:                                   /* bad, or not */
      if (s != PT_NONE)
        pt_set_flags (&pt, s, (pt_flags (&pt, s) ^ PT_BAD));
      break;
    case 7:                                   /* rewritten: open gen */
      if (s != PT_NONE)
        pt_set_gen (&pt, s, gen);
      break;
    case 8:                                   /* an older generation */
      if (s != PT_NONE && gen > 1)
        pt_set_gen (&pt, s, gen - 1 - (rng >> 9) % (gen - 1 < 5 ? gen - 1
                                                     : 5));
      break;
    default:                                  /* back in the index */
      if (s != PT_NONE && !(pt_flags (&pt, s) & PT_INDEXED) &&
          pagetable_lookup (&pt, s) == PT_NONE)
        pagetable_insert (&pt, s, s);
      break;
    }
    assert_true (pagetable_pending_consistent (&pt));
    assert_int_equal (pagetable_oldest_pending (&pt),
                      pagetable_scan_oldest_pending (&pt));
  }
  pagetable_free (&pt);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_init_free),
    cmocka_unit_test (test_shared_budget),
    cmocka_unit_test (test_heap_bytes),
    cmocka_unit_test (test_maps_runs),
    cmocka_unit_test (test_maps_two_runs),
    cmocka_unit_test (test_side_table),
    cmocka_unit_test (test_side_table_large),
    cmocka_unit_test (test_epoch_rebase),
    cmocka_unit_test (test_epoch_floor_behind),
    cmocka_unit_test (test_seq_rebase),
    cmocka_unit_test (test_pins_overflow),
    cmocka_unit_test (test_pins_many),
    cmocka_unit_test (test_free_list),
    cmocka_unit_test (test_put_free_resets),
    cmocka_unit_test (test_insert_lookup_remove),
    cmocka_unit_test (test_collisions),
    cmocka_unit_test (test_churn_small),
    cmocka_unit_test (test_churn_large),
    cmocka_unit_test (test_entry_roundtrip),
    cmocka_unit_test (test_entry_needs_crc),
    cmocka_unit_test (test_entry_rec_encode),
    cmocka_unit_test (test_seq_restart),
    cmocka_unit_test (test_range_valid),
    cmocka_unit_test (test_pending_counts),
  };

  return cmocka_run_group_tests (tests, NULL, NULL);
}
