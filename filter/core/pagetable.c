/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the in-RAM page table (pure: no I/O, no nbdkit).
 *
 * Owns the slot array, the chained hash index (page -> slot), the free
 * list and the side table of partial maps.  The caller holds the cache
 * metadata lock for every call.
 *
 * Memory: 20 bytes per slot (struct pt_rec) plus a 4-byte bucket for
 * every two slots, so 22 bytes per slot in every state, plus the side
 * table (32 bytes per entry, at most side_limit entries, allocated as
 * they are needed), the pin counts (8 bytes for each slot that has
 * users, twice over) and a fixed part.
 *
 * Stored form of a slot:
 *  - page: 40 bits (the cache refuses backends of more than PT_MAX_PAGES
 *    pages: 4 PiB of 4 KiB pages).
 *  - seq: 32 bits and epoch: 16 bits, each relative to a base (see
 *    pagetable.h).  While the table is loaded the two hold the entry's
 *    own number (48 bits: pt_loaded_seq).
 *  - gen (only if kept): the low 32 bits, in pt->gens (pt->gen_ref
 *    gives the rest).
 *  - data CRC: not kept.  The entry on disk has it (PT_CRC_KNOWN says
 *    when a struct pt_slot carries one).
 *  - pins: not in the record.  At any time only the slots of requests
 *    and writeback passes in flight have users, a few thousand at most:
 *    they are counted in a small hash of their own (pt->pinv), which
 *    grows as it needs.
 *  - map (28 bits): the valid and dirty maps as one run of sectors each
 *    (14 bits a run), which is what nearly every page has (whole pages,
 *    one write or read in a page, one dirty range).  Run code: s << 7 |
 *    e7, with e = e7 ? e7 : 128; s < e is the run [s, e), s == e (e7 >
 *    0) is empty, and s > e7 >= 1 is not a run: the valid code then
 *    names, with the dirty code as low bits, an entry of the side table
 *    that holds both maps exactly.  The side table has a bound
 *    (side_limit): when it is full, maps that need an entry do not fit
 *    and pt_maps_set fails; the cache then stores less (a read fill is
 *    not kept) or makes the page simple first (see engine/write.c).
 */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pagetable.h"

_Static_assert (LAYOUT_MAX_SECTORS == 128, "map_run and code_fill work on two 64-bit words");

_Static_assert (sizeof (struct pt_rec) == 20, "struct pt_rec is 20 bytes");

uint32_t pagetable_test_seq_span, pagetable_test_epoch_span;
unsigned pagetable_test_base_shift;

#define BASE_SHIFT_DEFAULT 12           /* 4,096 slots a group */

#define SEQ_SPAN_DEFAULT (UINT32_MAX - 2)       /* the field's range */
#define EPOCH_SPAN_DEFAULT (UINT16_MAX - 3)     /* below PT_REL_MID */
#define PIN_CAP_MIN 64                          /* pin hash cells at first */

/* Run codes. */
#define CODE_EMPTY ((1u << 7) | 1u)
#define CODE_MASK  0x3fffu

static inline uint32_t
hash_page (const struct pagetable *pt, uint64_t page)
{
  /* Fibonacci hashing, then a multiply-shift onto nbuckets. */
  uint64_t h = page * UINT64_C (0x9E3779B97F4A7C15);
  return (uint32_t) (((h >> 32) * (uint64_t) pt->nbuckets) >> 32);
}

/* The slot records and the buckets are read at random places, on
 * every lookup and all through a start: arrays this big come from
 * their own mapping, in huge pages where the kernel allows (madvise
 * mode of transparent huge pages), which takes most TLB misses and
 * page faults out of a start.  Zeroed, like calloc.
 */
#define PT_BIG_ARRAY (4u << 20)

static void *
pt_array_alloc (size_t size)
{
  void *p;

  if (size < PT_BIG_ARRAY)
    return calloc (1, size);
  p = mmap (NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
            -1, 0);
  if (p == MAP_FAILED)
    return NULL;
#ifdef MADV_HUGEPAGE
  madvise (p, size, MADV_HUGEPAGE); /* (only a hint) */
#endif
  return p;
}

static void
pt_array_free (void *p, size_t size)
{
  if (p == NULL)
    return;
  if (size < PT_BIG_ARRAY)
    free (p);
  else
    munmap (p, size);
}

static struct pt_pin *pin_cells (uint32_t n);

static size_t
pt_recs_size (uint32_t nslots)
{
  return (size_t) nslots * sizeof (struct pt_rec);
}

static size_t
pt_buckets_size (uint32_t nbuckets)
{
  return (size_t) nbuckets * sizeof (uint32_t);
}

int
pagetable_init (struct pagetable *pt, uint32_t nslots)
{
  uint32_t nbuckets;

  memset (pt, 0, sizeof *pt);
  if (nslots == 0 || nslots == PT_NONE) {
    errno = EINVAL;
    return -1;
  }
  nbuckets = nslots / 2 > 0 ? nslots / 2 : 1;

  pt->base_shift = pagetable_test_base_shift ? pagetable_test_base_shift
    : BASE_SHIFT_DEFAULT;
  pt->recs = pt_array_alloc (pt_recs_size (nslots));
  pt->buckets = pt_array_alloc (pt_buckets_size (nbuckets));
  pt->bases = calloc (((uint64_t) nslots >> pt->base_shift) + 1,
                      sizeof *pt->bases);
  pt->pinv = pin_cells (PIN_CAP_MIN);
  if (pt->recs == NULL || pt->buckets == NULL || pt->bases == NULL ||
      pt->pinv == NULL) {
    pt_array_free (pt->recs, pt_recs_size (nslots));
    pt_array_free (pt->buckets, pt_buckets_size (nbuckets));
    free (pt->bases);
    free (pt->pinv);
    memset (pt, 0, sizeof *pt);
    errno = ENOMEM;
    return -1;
  }
  pt->nslots = nslots;
  pt->nbuckets = nbuckets;
  pt->pin_mask = PIN_CAP_MIN - 1;
  for (uint32_t i = 0; i < nbuckets; i++)
    pt->buckets[i] = PT_NONE;
  pt->seq_span = pagetable_test_seq_span >= 4 &&
    pagetable_test_seq_span < SEQ_SPAN_DEFAULT ? pagetable_test_seq_span
    : SEQ_SPAN_DEFAULT;
  pt->epoch_span = pagetable_test_epoch_span >= 4 &&
    pagetable_test_epoch_span < EPOCH_SPAN_DEFAULT ? pagetable_test_epoch_span
    : EPOCH_SPAN_DEFAULT;
  pt->side_limit = nslots < PT_SIDE_DEFAULT ? nslots : PT_SIDE_DEFAULT;
  pt->side_free = PT_NONE;

  /* Free list in slot order, so a new cache fills the file front to back. */
  pt->free_head = PT_NONE;
  for (uint32_t i = nslots; i-- > 0;) {
    pt->recs[i].map = (CODE_EMPTY << 14) | CODE_EMPTY;
    pt->recs[i].next = pt->free_head;
    pt->free_head = i;
  }
  pt->nfree = nslots;
  return 0;
}

void
pagetable_free (struct pagetable *pt)
{
  pagetable_set_budget (pt, NULL, 0);
  pt_array_free (pt->recs, pt_recs_size (pt->nslots));
  pt_array_free (pt->buckets, pt_buckets_size (pt->nbuckets));
  free (pt->bases);
  free (pt->pinv);
  free (pt->side);
  free (pt->gens);
  free (pt->pend);
  memset (pt, 0, sizeof *pt);
}

int
pagetable_keep_gens (struct pagetable *pt)
{
  if (pt->gens == NULL)
    pt->gens = calloc (pt->nslots ? pt->nslots : 1, sizeof *pt->gens);
  return pt->gens ? 0 : -1;
}

int
pagetable_set_side_limit (struct pagetable *pt, uint32_t limit)
{
  if (limit > PT_SIDE_MAX) {
    errno = ERANGE;
    return -1;
  }
  pt->side_limit = limit;
  return 0;
}

uint64_t
pagetable_heap_bytes (const struct pagetable *pt)
{
  return (uint64_t) pt->nslots * sizeof *pt->recs +
    (uint64_t) pt->nbuckets * sizeof *pt->buckets +
    (uint64_t) pt->side_cap * sizeof *pt->side +
    ((uint64_t) pt->pin_mask + 1) * sizeof *pt->pinv +
    (pt->gens ? (uint64_t) pt->nslots * sizeof *pt->gens : 0);
}

uint32_t
pagetable_lookup (const struct pagetable *pt, uint64_t page)
{
  uint32_t i;

  if (page > PT_MAX_PAGES)
    return PT_NONE;
  i = pt->buckets[hash_page (pt, page)];
  while (i != PT_NONE) {
    if (pt_page (pt, i) == page)
      return i;
    i = pt->recs[i].next;
  }
  return PT_NONE;
}

void
pagetable_insert (struct pagetable *pt, uint32_t slot, uint64_t page)
{
  struct pt_rec *s = &pt->recs[slot];
  uint32_t b = hash_page (pt, page);

  pt_set_page (pt, slot, page);
  s->next = pt->buckets[b];
  pt_set_flags (pt, slot, (s->flags | PT_INDEXED) & ~PT_ORPHAN);
  pt->buckets[b] = slot;
  pt->nindexed++;
}

void
pagetable_remove (struct pagetable *pt, uint32_t slot)
{
  struct pt_rec *s = &pt->recs[slot];
  uint32_t b = hash_page (pt, pt_page (pt, slot));
  uint32_t prev = PT_NONE, i;

  if (!(s->flags & PT_INDEXED))
    return;
  for (i = pt->buckets[b]; i != PT_NONE && i != slot; i = pt->recs[i].next)
    prev = i;
  if (i == slot) {
    if (prev == PT_NONE)
      pt->buckets[b] = s->next;
    else
      pt->recs[prev].next = s->next;
  }
  s->next = PT_NONE;
  pt_flags_off (pt, slot, PT_INDEXED);
  pt->nindexed--;
}

void
pagetable_set_budget (struct pagetable *pt, struct budget *b, uint32_t unit)
{
  uint64_t held = pt->nslots - pt->nfree;

  if (pt->budget)
    budget_give (pt->budget, held * pt->budget_unit);
  pt->budget = b;
  pt->budget_unit = unit;
  if (b)
    budget_charge (b, held * unit);
}

uint32_t
pagetable_take_free (struct pagetable *pt)
{
  uint32_t slot = pt->free_head;

  if (slot == PT_NONE)
    return PT_NONE;
  if (pt->budget && !budget_take (pt->budget, pt->budget_unit))
    return PT_NONE;
  pt->free_head = pt->recs[slot].next;
  pt->recs[slot].next = PT_NONE;
  pt->nfree--;
  return slot;
}

void
pagetable_clear_free (struct pagetable *pt)
{
  if (pt->budget)
    budget_charge (pt->budget, (uint64_t) pt->nfree * pt->budget_unit);
  pt->free_head = PT_NONE;
  pt->nfree = 0;
}

/*----------------------------------------------------------------------
 * Pins: a hash of the slots that have users (slot -> count), open
 * addressing with linear probing, kept at most half full.
 */

/* n empty cells, or NULL. */
static struct pt_pin *
pin_cells (uint32_t n)
{
  struct pt_pin *v = malloc ((size_t) n * sizeof *v);

  if (v)
    for (uint32_t i = 0; i < n; i++)
      v[i].slot = PT_NONE;
  return v;
}

static inline uint32_t
pin_home (const struct pagetable *pt, uint32_t s)
{
  uint32_t h = s * UINT32_C (0x9E3779B1);

  return (h ^ h >> 15) & pt->pin_mask;
}

/* The cell of slot s, or the empty cell where it would go. */
static uint32_t
pin_cell (const struct pagetable *pt, uint32_t s)
{
  uint32_t i = pin_home (pt, s);

  while (pt->pinv[i].slot != s && pt->pinv[i].slot != PT_NONE)
    i = (i + 1) & pt->pin_mask;
  return i;
}

unsigned
pt_pins_find (const struct pagetable *pt, uint32_t s)
{
  const struct pt_pin *p = &pt->pinv[pin_cell (pt, s)];

  return p->slot == s ? p->n : 0;
}

/* Twice the cells.  The callers cannot fail (a pin is taken under the
 * cache's lock, on the way to I/O): without the memory for a table of
 * a few kilobytes, nbdkit stops.
 */
static void
pin_grow (struct pagetable *pt)
{
  struct pt_pin *old = pt->pinv;
  uint32_t cap = pt->pin_mask + 1;
  struct pt_pin *v = pin_cells (2 * cap);

  if (v == NULL) {
    fprintf (stderr, "nbdkit-ssdcache-filter: no memory to count the "
             "users of %u slots\n", pt->pin_used + 1);
    abort ();
  }
  pt->pinv = v;
  pt->pin_mask = 2 * cap - 1;
  for (uint32_t i = 0; i < cap; i++)
    if (old[i].slot != PT_NONE)
      pt->pinv[pin_cell (pt, old[i].slot)] = old[i];
  free (old);
}

void
pt_pin (struct pagetable *pt, uint32_t s)
{
  uint32_t i = pin_cell (pt, s);

  if (pt->pinv[i].slot == s) {
    pt->pinv[i].n++;
    return;
  }
  if (2 * (pt->pin_used + 1) > pt->pin_mask + 1) {
    pin_grow (pt);
    i = pin_cell (pt, s);
  }
  pt->pinv[i].slot = s;
  pt->pinv[i].n = 1;
  pt->pin_used++;
}

/* Empty cell i, moving back the cells after it that would no longer
 * be found (backward shift deletion).
 */
static void
pin_remove (struct pagetable *pt, uint32_t i)
{
  uint32_t j = i;

  for (;;) {
    uint32_t home;

    j = (j + 1) & pt->pin_mask;
    if (pt->pinv[j].slot == PT_NONE)
      break;
    home = pin_home (pt, pt->pinv[j].slot);
    /* Cell j may move to i if its home is not in (i, j]. */
    if (((j - home) & pt->pin_mask) >= ((j - i) & pt->pin_mask)) {
      pt->pinv[i] = pt->pinv[j];
      i = j;
    }
  }
  pt->pinv[i].slot = PT_NONE;
  pt->pin_used--;
}

unsigned
pt_unpin (struct pagetable *pt, uint32_t s)
{
  uint32_t i = pin_cell (pt, s);
  unsigned n;

  if (pt->pinv[i].slot != s) {
    fprintf (stderr, "nbdkit-ssdcache-filter: slot %u unpinned more "
             "often than pinned\n", s);
    abort ();
  }
  n = --pt->pinv[i].n;
  if (n == 0)
    pin_remove (pt, i);
  return n;
}

/*----------------------------------------------------------------------
 * Sequence numbers and epochs.
 */

/* The slots [*first, *end) of group g. */
static void
group_range (const struct pagetable *pt, uint32_t g, uint32_t *first,
             uint32_t *end)
{
  uint64_t a = (uint64_t) g << pt->base_shift;
  uint64_t b = a + (UINT64_C (1) << pt->base_shift);

  *first = (uint32_t) a;
  *end = b < pt->nslots ? (uint32_t) b : pt->nslots;
}

static void
count_rebase (struct pagetable *pt)
{
  if (pt->rebases)
    atomic_fetch_add (pt->rebases, 1);
}

void
pagetable_group_seq_rebase (struct pagetable *pt, uint32_t g, uint64_t base)
{
  struct pt_base *b = &pt->bases[g];
  uint32_t first, end;
  uint64_t delta;

  if (base <= b->seq)
    return;
  delta = base - b->seq;
  group_range (pt, g, &first, &end);
  for (uint32_t i = first; i < end; i++) {
    struct pt_rec *r = &pt->recs[i];
    r->seq = r->seq <= delta ? 0 : (uint32_t) (r->seq - delta);
  }
  b->seq = base;
  count_rebase (pt);
}

void
pagetable_seq_restart (struct pagetable *pt, uint64_t base)
{
  for (uint32_t g = 0; ((uint64_t) g << pt->base_shift) < pt->nslots; g++)
    pt->bases[g].seq = base;
}

/* A stored epoch of group g as it reads once the base is base and the
 * split split (see pagetable.h: at most split, 0; above split and at
 * most base, PT_REL_MID).
 */
static uint16_t
epoch_rel (const struct pt_base *b, uint64_t base, uint64_t split,
           uint16_t rel)
{
  uint64_t e;

  switch (rel) {
  case PT_REL_PENDING: case PT_REL_UNKNOWN:
    return rel;
  case 0:
    return 0;                   /* <= b->split <= split */
  case PT_REL_MID:              /* (b->split, b->epoch] */
    if (b->epoch <= split)
      return 0;
    /* Only a split that did not move keeps the class (a client sync
     * begun since has an epoch above b->epoch, so split >= b->epoch).
     */
    return split == b->split ? PT_REL_MID : PT_REL_UNKNOWN;
  }
  e = b->epoch + rel;
  return e <= split ? 0 : e <= base ? PT_REL_MID : (uint16_t) (e - base);
}

/* Move group g's epoch base up to base, its split to the lower of base
 * and the ceiling.
 */
static void
group_epoch_rebase (struct pagetable *pt, uint32_t g, uint64_t base)
{
  struct pt_base *b = &pt->bases[g];
  uint64_t split = pt->epoch_ceiling < base ? pt->epoch_ceiling : base;
  uint32_t first, end;

  if (base <= b->epoch)
    return;
  group_range (pt, g, &first, &end);
  for (uint32_t i = first; i < end; i++)
    pt->recs[i].epoch = epoch_rel (b, base, split, pt->recs[i].epoch);
  b->epoch = base;
  b->split = split;
  count_rebase (pt);
}

void
pagetable_epoch_floor (struct pagetable *pt, uint64_t floor)
{
  if (floor > pt->epoch_floor)
    pt->epoch_floor = floor;
}

void
pagetable_epoch_ceiling (struct pagetable *pt, uint64_t ceiling)
{
  if (ceiling > pt->epoch_ceiling)
    pt->epoch_ceiling = ceiling;
}

/* Where a group's base goes for a slot about to store epoch: up to
 * the floor, which keeps every comparison exact, if epoch then fits;
 * else (the floor has stayed behind for pt->epoch_span / 2 epochs, as
 * when no client flushes while writeback syncs the cache) to half a
 * span below epoch, so that this slot stays exact; the group's split
 * then keeps the comparisons with the flushing epoch exact too (see
 * pagetable.h).
 */
static uint64_t
epoch_rebase_to (const struct pagetable *pt, uint64_t epoch)
{
  if (epoch <= pt->epoch_floor || epoch - pt->epoch_floor < pt->epoch_span)
    return pt->epoch_floor;
  return epoch - pt->epoch_span / 2;
}

void
pt_set_epoch (struct pagetable *pt, uint32_t s, uint64_t epoch)
{
  const struct pt_base *b = pt_base_of (pt, s);
  uint16_t rel;

  if (epoch < PT_EPOCH_UNKNOWN && epoch > b->epoch &&
      epoch - b->epoch >= pt->epoch_span / 2)
    group_epoch_rebase (pt, s >> pt->base_shift, epoch_rebase_to (pt, epoch));
  if (epoch == PT_EPOCH_PENDING)
    rel = PT_REL_PENDING;
  else if (epoch <= b->epoch)
    rel = epoch <= b->split ? 0 : PT_REL_MID;
  else if (epoch == PT_EPOCH_UNKNOWN || epoch - b->epoch >= pt->epoch_span)
    rel = PT_REL_UNKNOWN;
  else
    rel = (uint16_t) (epoch - b->epoch);
  pt->recs[s].epoch = rel;
}

uint64_t
pt_epoch (const struct pagetable *pt, uint32_t s)
{
  uint16_t rel = pt->recs[s].epoch;
  const struct pt_base *b = pt_base_of (pt, s);

  if (rel == PT_REL_PENDING)
    return PT_EPOCH_PENDING;
  if (rel == PT_REL_UNKNOWN)
    return PT_EPOCH_UNKNOWN;
  if (rel == 0)
    return b->split;
  if (rel == PT_REL_MID)
    return b->epoch;
  return b->epoch + rel;
}

bool
pt_epoch_may_be_at_most (const struct pagetable *pt, uint32_t s, uint64_t t)
{
  uint16_t rel = pt->recs[s].epoch;
  const struct pt_base *b = pt_base_of (pt, s);

  if (rel == PT_REL_PENDING)
    return false;
  if (rel == PT_REL_UNKNOWN || rel == 0)
    return true;                /* 0: at most the split */
  if (rel == PT_REL_MID)
    return t > b->split;        /* above the split: at most t? maybe */
  return b->epoch + rel <= t;
}

bool
pt_epoch_surely_at_most (const struct pagetable *pt, uint32_t s, uint64_t t)
{
  uint16_t rel = pt->recs[s].epoch;
  const struct pt_base *b = pt_base_of (pt, s);

  if (rel == PT_REL_PENDING || rel == PT_REL_UNKNOWN)
    return false;
  if (rel == 0)
    return b->split <= t;
  if (rel == PT_REL_MID)
    return b->epoch <= t;
  return b->epoch + rel <= t;
}

/*----------------------------------------------------------------------
 * Maps.
 */

/* A LAYOUT_MAX_SECTORS-bit map as two 64-bit words (bit i of the map
 * is bit i % 64 of word i / 64), so that runs are found and made a
 * word at a time: this is on every write's path.
 */
static inline void
map_load (const uint8_t *map, uint64_t w[2])
{
  memcpy (w, map, 16);
  w[0] = le64toh (w[0]);
  w[1] = le64toh (w[1]);
}

static inline void
map_store (uint8_t *map, uint64_t lo, uint64_t hi)
{
  lo = htole64 (lo);
  hi = htole64 (hi);
  memcpy (map, &lo, 8);
  memcpy (map + 8, &hi, 8);
}

/* The map as one run [*a, *b): 0 empty, 1 a run, 2 anything else. */
static int
map_run (const uint8_t *map, unsigned *a, unsigned *b)
{
  uint64_t w[2], lo, hi, n0, n1;
  unsigned first;

  map_load (map, w);
  if (w[0] == 0 && w[1] == 0)
    return 0;
  first = w[0] ? (unsigned) __builtin_ctzll (w[0])
    : 64 + (unsigned) __builtin_ctzll (w[1]);
  /* Shift the map down by first: bit 0 is then set, and the map is a
   * run iff it is 2^k - 1, i.e. adding 1 clears every bit.
   */
  if (first == 0)
    lo = w[0], hi = w[1];
  else if (first < 64)
    lo = (w[0] >> first) | (w[1] << (64 - first)), hi = w[1] >> first;
  else
    lo = w[1] >> (first - 64), hi = 0;
  n0 = lo + 1;
  n1 = hi + (n0 == 0);
  if ((lo & n0) != 0 || (hi & n1) != 0)
    return 2;
  *a = first;
  *b = w[1] ? 128 - (unsigned) __builtin_clzll (w[1])     /* last bit + 1 */
    : 64 - (unsigned) __builtin_clzll (w[0]);
  return 1;
}

/* Run code of a map, or false if it is not a run. */
static bool
map_code (const uint8_t *map, uint32_t *code)
{
  unsigned a, b;

  switch (map_run (map, &a, &b)) {
  case 0:
    *code = CODE_EMPTY;
    return true;
  case 1:
    *code = (a << 7) | (b & 127);
    return true;
  default:
    return false;
  }
}

static inline bool
code_is_side (uint32_t vcode)
{
  uint32_t s = vcode >> 7, e7 = vcode & 127;
  return e7 != 0 && s > e7;
}

/* The sectors [*s, *e) of run code (none if *s >= *e). */
static inline void
code_run (uint32_t code, uint32_t *s, uint32_t *e)
{
  *s = code >> 7;
  *e = code & 127;
  if (*e == 0)
    *e = 128;
}

/* Does run code hold sector i? */
static inline bool
code_test (uint32_t code, unsigned i)
{
  uint32_t s, e;

  code_run (code, &s, &e);
  return i >= s && i < e;
}

/* The lowest n bits (n <= 128) as two words. */
static inline void
low_bits (unsigned n, uint64_t *lo, uint64_t *hi)
{
  *lo = n >= 64 ? UINT64_MAX : (UINT64_C (1) << n) - 1;
  *hi = n >= 128 ? UINT64_MAX : n > 64 ? (UINT64_C (1) << (n - 64)) - 1 : 0;
}

static void
code_fill (uint32_t code, uint8_t *map)
{
  uint32_t s, e;
  uint64_t slo, shi, elo, ehi;

  code_run (code, &s, &e);
  if (e <= s) {
    memset (map, 0, LAYOUT_MAX_SECTORS / 8);
    return;
  }
  low_bits (s, &slo, &shi);
  low_bits (e, &elo, &ehi);
  map_store (map, elo & ~slo, ehi & ~shi);
}

static inline uint32_t
side_index (uint32_t map)
{
  uint32_t v = map >> 14, s = v >> 7, e7 = v & 127;
  /* s in [2, 127], e7 in [1, s - 1]: 8001 pairs, numbered in order. */
  return ((s - 1) * (s - 2) / 2 + (e7 - 1)) * 16384u + (map & CODE_MASK);
}

static uint32_t
side_map (uint32_t idx)
{
  uint32_t hi = idx / 16384u, s = 2;

  while (s * (s - 1) / 2 <= hi)
    s++;
  return (((s << 7) | (hi - (s - 1) * (s - 2) / 2 + 1)) << 14) |
    (idx % 16384u);
}

bool
pt_maps_side (const struct pagetable *pt, uint32_t s)
{
  return code_is_side (pt->recs[s].map >> 14);
}

bool
pt_valid_test (const struct pagetable *pt, uint32_t s, unsigned i)
{
  uint32_t m = pt->recs[s].map;

  if (code_is_side (m >> 14))
    return layout_bit_test (pt->side[side_index (m)].valid, i);
  return code_test (m >> 14, i);
}

void
pt_maps_get (const struct pagetable *pt, uint32_t s, uint8_t *valid,
             uint8_t *dirty)
{
  uint32_t m = pt->recs[s].map;

  if (code_is_side (m >> 14)) {
    const struct pt_side *e = &pt->side[side_index (m)];
    if (valid)
      memcpy (valid, e->valid, sizeof e->valid);
    if (dirty)
      memcpy (dirty, e->dirty, sizeof e->dirty);
    return;
  }
  if (valid)
    code_fill (m >> 14, valid);
  if (dirty)
    code_fill (m & CODE_MASK, dirty);
}

static void
side_release (struct pagetable *pt, uint32_t idx)
{
  memcpy (pt->side[idx].valid, &pt->side_free, sizeof pt->side_free);
  pt->side_free = idx;
  pt->side_used--;
}

/* A free side entry, or PT_NONE.  force: past the limit. */
static uint32_t
side_take (struct pagetable *pt, bool force)
{
  uint32_t idx;

  if (pt->side_free == PT_NONE) {
    uint32_t cap = pt->side_cap ? pt->side_cap * 2 : 64;
    struct pt_side *n;

    if (!force && pt->side_used >= pt->side_limit)
      return PT_NONE;
    if (!force && cap > pt->side_limit)
      cap = pt->side_limit;
    if (cap > PT_SIDE_MAX)
      cap = PT_SIDE_MAX;
    if (cap <= pt->side_cap)
      return PT_NONE;
    n = realloc (pt->side, (size_t) cap * sizeof *n);
    if (n == NULL)
      return PT_NONE;
    pt->side = n;
    for (uint32_t i = cap; i-- > pt->side_cap;) {
      memcpy (n[i].valid, &pt->side_free, sizeof pt->side_free);
      pt->side_free = i;
    }
    pt->side_cap = cap;
  }
  if (!force && pt->side_used >= pt->side_limit)
    return PT_NONE;
  idx = pt->side_free;
  memcpy (&pt->side_free, pt->side[idx].valid, sizeof pt->side_free);
  pt->side_used++;
  return idx;
}

static bool
maps_reserve (struct pagetable *pt, uint32_t s, bool force)
{
  struct pt_rec *r = &pt->recs[s];
  uint8_t valid[LAYOUT_MAX_SECTORS / 8], dirty[LAYOUT_MAX_SECTORS / 8];
  uint32_t idx;

  if (code_is_side (r->map >> 14))
    return true;
  idx = side_take (pt, force);
  if (idx == PT_NONE) {
    pt->side_full++;
    return false;
  }
  pt_maps_get (pt, s, valid, dirty);
  memcpy (pt->side[idx].valid, valid, sizeof valid);
  memcpy (pt->side[idx].dirty, dirty, sizeof dirty);
  r->map = side_map (idx);
  return true;
}

bool
pt_maps_reserve (struct pagetable *pt, uint32_t s)
{
  return maps_reserve (pt, s, false);
}

bool
pt_maps_reserve_force (struct pagetable *pt, uint32_t s)
{
  return maps_reserve (pt, s, true);
}

bool
pt_maps_reserve_for (struct pagetable *pt, uint32_t s, const uint8_t *valid,
                     const uint8_t *dirty)
{
  uint32_t vc, dc;

  if (map_code (valid, &vc) && map_code (dirty, &dc))
    return true;
  return pt_maps_reserve (pt, s);
}

static bool
maps_set (struct pagetable *pt, uint32_t s, const uint8_t *valid,
          const uint8_t *dirty, bool force)
{
  struct pt_rec *r = &pt->recs[s];
  uint32_t vc, dc, idx;

  if (map_code (valid, &vc) && map_code (dirty, &dc)) {
    if (code_is_side (r->map >> 14))
      side_release (pt, side_index (r->map));
    r->map = (vc << 14) | dc;
    return true;
  }
  if (code_is_side (r->map >> 14))
    idx = side_index (r->map);
  else {
    idx = side_take (pt, force);
    if (idx == PT_NONE) {
      pt->side_full++;
      return false;
    }
    r->map = side_map (idx);
  }
  memcpy (pt->side[idx].valid, valid, sizeof pt->side[idx].valid);
  memcpy (pt->side[idx].dirty, dirty, sizeof pt->side[idx].dirty);
  return true;
}

bool
pt_maps_set (struct pagetable *pt, uint32_t s, const uint8_t *valid,
             const uint8_t *dirty)
{
  return maps_set (pt, s, valid, dirty, false);
}

bool
pt_maps_set_force (struct pagetable *pt, uint32_t s, const uint8_t *valid,
                   const uint8_t *dirty)
{
  return maps_set (pt, s, valid, dirty, true);
}

void
pagetable_put_free (struct pagetable *pt, uint32_t slot)
{
  struct pt_rec *s = &pt->recs[slot];
  uint32_t seq = s->seq;

  pt_set_state (pt, slot, LAYOUT_FREE);       /* (not pending now) */
  if (code_is_side (s->map >> 14))
    side_release (pt, side_index (s->map));
  memset (s, 0, sizeof *s);
  s->map = (CODE_EMPTY << 14) | CODE_EMPTY;
  s->seq = seq;
  s->state = LAYOUT_FREE;
  s->next = pt->free_head;
  pt->free_head = slot;
  pt->nfree++;
  if (pt->budget)
    budget_give (pt->budget, pt->budget_unit);
}

void
pagetable_get (const struct pagetable *pt, uint32_t s, struct pt_slot *v)
{
  const struct pt_rec *r = &pt->recs[s];

  v->page = pt_page (pt, s);
  v->seq = pt_seq (pt, s);
  v->epoch = pt_epoch (pt, s);
  v->gen = pt_gen (pt, s);
  v->data_crc = 0;              /* not kept: PT_CRC_KNOWN is clear */
  v->pins = pt_pins (pt, s);
  v->flags = r->flags;
  v->state = r->state;
  pt_maps_get (pt, s, v->valid, v->dirty);
}

void
pagetable_to_entry (const struct pt_slot *s, struct layout_entry *e)
{
  memset (e, 0, sizeof *e);
  e->state = s->state;
  e->seq = s->seq;
  if (s->state == LAYOUT_DIRTY)
    e->gen = s->gen & LAYOUT_GEN_MASK;
  if (s->state != LAYOUT_FREE) {
    /* A sealed entry must carry the page's checksum; an unsealed one's
     * is never read (layout.h).  Building one without it is a bug that
     * would make good data fail its check later: stop here instead.
     */
    if (!(s->flags & (PT_CRC_KNOWN | PT_UNSEALED)))
      abort ();
    e->page = s->page;
    e->data_crc = s->flags & PT_CRC_KNOWN ? s->data_crc : 0;
    memcpy (e->valid, s->valid, sizeof e->valid);
    memcpy (e->dirty, s->dirty, sizeof e->dirty);
    if (s->flags & PT_UNSEALED)
      e->flags |= LAYOUT_ENT_UNSEALED;
  }
}

/* Entry e's stored form with map (pagetable_rec_encode). */
static void
rec_image (const struct layout_entry *e, uint32_t map, struct pt_rec *img)
{
  memset (img, 0, sizeof *img);
  img->page = (uint32_t) e->page;
  img->page_hi = (uint8_t) (e->page >> 32);
  img->seq = (uint32_t) e->seq; /* pt_loaded_seq (at most 48 bits); */
  img->epoch = (uint16_t) (e->seq >> 32); /* the loader then sets both */
  img->state = e->state;
  img->map = map;
}

bool
pagetable_rec_encode (const struct layout_entry *e, struct pt_rec *img)
{
  uint32_t vc, dc;

  if (e->page > PT_MAX_PAGES || !map_code (e->valid, &vc) ||
      !map_code (e->dirty, &dc))
    return false;
  rec_image (e, (vc << 14) | dc, img);
  return true;
}

void
pagetable_load_rec (struct pagetable *pt, uint32_t s,
                    const struct pt_rec *img, uint64_t gen)
{
  struct pt_rec *r = &pt->recs[s];

  if (code_is_side (r->map >> 14) && r->map != img->map)
    side_release (pt, side_index (r->map));
  r->page = img->page;
  r->page_hi = img->page_hi;
  r->seq = img->seq;
  r->epoch = img->epoch;
  r->map = img->map;
  pt_set_state (pt, s, img->state);
  pt_set_gen (pt, s, gen);      /* the loader sets gen_ref above them all */
}

bool
pagetable_from_entry (struct pagetable *pt, uint32_t s,
                      const struct layout_entry *e)
{
  struct pt_rec img;

  if (pagetable_rec_encode (e, &img)) {
    pagetable_load_rec (pt, s, &img, e->gen);
    return true;
  }
  if (e->page > PT_MAX_PAGES ||
      !pt_maps_set_force (pt, s, e->valid, e->dirty)) {
    pt_set_state (pt, s, LAYOUT_FREE);
    return false;
  }
  rec_image (e, pt->recs[s].map, &img);
  pagetable_load_rec (pt, s, &img, e->gen);
  return true;
}

bool
pt_view_range_valid (const struct pt_slot *v, unsigned first, unsigned last)
{
  for (unsigned i = first; i <= last; i++)
    if (!layout_bit_test (v->valid, i))
      return false;
  return true;
}

bool
pagetable_range_valid (const struct pagetable *pt, uint32_t s,
                       unsigned first, unsigned last)
{
  uint32_t m = pt->recs[s].map;

  if (!code_is_side (m >> 14))
    return code_test (m >> 14, first) && code_test (m >> 14, last);
  for (unsigned i = first; i <= last; i++)
    if (!layout_bit_test (pt->side[side_index (m)].valid, i))
      return false;
  return true;
}

bool
pagetable_range_any_valid (const struct pagetable *pt, uint32_t s,
                           unsigned first, unsigned last)
{
  uint32_t m = pt->recs[s].map;

  if (!code_is_side (m >> 14)) {
    uint32_t a, b;

    code_run (m >> 14, &a, &b);
    return a < b && first < b && last >= a;     /* [a, b) meets it */
  }
  for (unsigned i = first; i <= last; i++)
    if (layout_bit_test (pt->side[side_index (m)].valid, i))
      return true;
  return false;
}

/*----------------------------------------------------------------------
 * Prefetching for the loader (recover.c), which looks up page after
 * page at random in a table far larger than the CPU's caches: asking
 * for the memory some entries ahead lets the misses overlap.  Hints
 * only: nothing is changed, and a stale head is harmless.
 */

void
pagetable_prefetch_bucket (const struct pagetable *pt, uint64_t page)
{
  if (page <= PT_MAX_PAGES)
    __builtin_prefetch (&pt->buckets[hash_page (pt, page)], 1, 1);
}

void
pagetable_prefetch_chain (const struct pagetable *pt, uint64_t page)
{
  uint32_t i;

  if (page > PT_MAX_PAGES)
    return;
  i = pt->buckets[hash_page (pt, page)];
  if (i != PT_NONE)
    __builtin_prefetch (&pt->recs[i], 0, 1);
}
