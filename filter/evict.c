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
 * S3-FIFO: two FIFO queues of slots, threaded through one array of
 *   "next" links (singly linked, oldest -> newest), and a ghost set.
 *   - New pages enter the small queue S (probation, target 10% of the
 *     slots) with frequency 0; a hit adds 1 (saturating at 3).
 *   - Evicting from S: the oldest page moves to the main queue M (with
 *     frequency 0) if it was hit while in S, else it is evicted and its
 *     backend page number goes to the ghost.
 *   - Evicting from M: the oldest page is reinserted at the head with
 *     its frequency decreased if it is not 0, else evicted.
 *   - S is evicted from while it holds at least its target (or M is
 *     empty), M otherwise.
 *   - A new page whose number is in the ghost goes straight into M.
 *   - A slot the caller refuses (dirty, pinned) goes back to the head of
 *     its queue, unchanged.
 *   evict_remove does not unlink (a singly linked list cannot in O(1)):
 *   the slot stays in its list as a "zombie" and is dropped when it
 *   reaches the tail.  A zombie re-inserted before that keeps its place
 *   in the list; if it now belongs to the other queue it is moved there
 *   when it reaches the tail (counted in the queue it belongs to at
 *   once).  So each slot is in at most one list, at most once, and the
 *   lists never hold more than nslots nodes.
 *   The ghost is a hash of 16-bit fingerprints: buckets of 4, each a
 *   little FIFO (newest first); about 0.9 * nslots entries (the size of
 *   M), so a page is remembered for about one turn of M.  A false ghost
 *   hit (probability ~ 4/65535 per lookup) only puts a page in M early.
 *
 * RAM per slot (exact):
 *   CLOCK:   2 bits (0.25 byte): resident and reference bitmaps.
 *   S3-FIFO: 1 byte of state + 4 bytes of link + ghost 2 bytes * 4 *
 *            ceil(0.9 * nslots / 4) / nslots (<= 1.8 + 8/nslots bytes):
 *            6.8 bytes per slot, plus a constant < 128 bytes.
 *   Only the chosen policy's arrays are allocated.
 *
 * Locking: none inside; the cache metadata lock is held by callers.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "evict.h"
#include "mix.h"

#define NIL UINT32_MAX

/* S3-FIFO per-slot state byte. */
#define ST_RES     0x01          /* resident (holds a page) */
#define ST_LQ_M    0x02          /* logically in M (else S) */
#define ST_LINKED  0x04          /* physically in a list */
#define ST_PQ_M    0x08          /* physically in M's list (else S's) */
#define ST_FSHIFT  4
#define ST_FMASK   0x30          /* frequency 0..3 */
#define FREQ_MAX   3

#define QS 0
#define QM 1

#define GHOST_WAYS 4

struct fifo {
  uint32_t head;                 /* newest, NIL if empty */
  uint32_t tail;                 /* oldest, NIL if empty */
  uint32_t len;                  /* nodes in the list (with zombies) */
  uint32_t count;                /* resident slots belonging to it */
};

struct evict {
  enum evict_policy policy;
  uint32_t nslots;
  uint32_t resident_count;

  /* CLOCK */
  uint32_t hand;
  uint64_t *resident;
  uint64_t *ref;

  /* S3-FIFO */
  uint8_t *st;
  uint32_t *next;
  struct fifo q[2];
  uint32_t s_target;
  uint16_t *ghost;               /* gbuckets * GHOST_WAYS fingerprints */
  uint32_t gbuckets;
  evict_page_fn page_fn;
  void *page_opaque;
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

struct evict *
evict_new_policy (enum evict_policy policy, uint32_t nslots)
{
  struct evict *ev;

  if ((unsigned) policy >= EVICT_NR_POLICIES)
    return NULL;
  ev = calloc (1, sizeof *ev);
  if (ev == NULL)
    return NULL;
  ev->policy = policy;
  ev->nslots = nslots;

  if (policy == EVICT_CLOCK) {
    size_t words = (nslots + 63) / 64;

    ev->resident = calloc (words ? words : 1, sizeof (uint64_t));
    ev->ref = calloc (words ? words : 1, sizeof (uint64_t));
    if (ev->resident == NULL || ev->ref == NULL)
      goto fail;
  }
  else {
    uint64_t gent = ((uint64_t) nslots * 9 + 9) / 10;   /* ceil (0.9 n) */

    ev->gbuckets = (gent + GHOST_WAYS - 1) / GHOST_WAYS;
    if (ev->gbuckets == 0)
      ev->gbuckets = 1;
    ev->st = calloc (nslots ? nslots : 1, 1);
    ev->next = malloc ((nslots ? nslots : 1) * sizeof (uint32_t));
    ev->ghost = calloc ((size_t) ev->gbuckets * GHOST_WAYS, sizeof (uint16_t));
    if (ev->st == NULL || ev->next == NULL || ev->ghost == NULL)
      goto fail;
    ev->q[QS].head = ev->q[QS].tail = NIL;
    ev->q[QM].head = ev->q[QM].tail = NIL;
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
    free (ev->next);
    free (ev->ghost);
    free (ev);
  }
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
 * CLOCK.
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

static void
clock_insert (struct evict *ev, uint32_t slot, bool ref)
{
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

static uint32_t
clock_victim (struct evict *ev, evict_can_take_fn can_take, void *opaque)
{
  /* Two full turns: the first may only clear reference bits. */
  uint64_t steps = 2 * (uint64_t) ev->nslots + 1;

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
      clock_remove (ev, s);
      return s;
    }
  }
  return EVICT_NONE;
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
 * S3-FIFO: queues.
 */

static unsigned
freq (const struct evict *ev, uint32_t s)
{
  return (ev->st[s] & ST_FMASK) >> ST_FSHIFT;
}

static void
set_freq (struct evict *ev, uint32_t s, unsigned f)
{
  ev->st[s] = (ev->st[s] & ~ST_FMASK) | (f << ST_FSHIFT);
}

static unsigned
lq (const struct evict *ev, uint32_t s)
{
  return (ev->st[s] & ST_LQ_M) ? QM : QS;
}

static void
push (struct evict *ev, unsigned q, uint32_t s)
{
  struct fifo *f = &ev->q[q];

  ev->next[s] = NIL;
  if (f->head != NIL)
    ev->next[f->head] = s;
  else
    f->tail = s;
  f->head = s;
  f->len++;
  ev->st[s] |= ST_LINKED;
  if (q == QM)
    ev->st[s] |= ST_PQ_M;
  else
    ev->st[s] &= ~ST_PQ_M;
}

static uint32_t
pop (struct evict *ev, unsigned q)
{
  struct fifo *f = &ev->q[q];
  uint32_t s = f->tail;

  f->tail = ev->next[s];
  if (f->tail == NIL)
    f->head = NIL;
  f->len--;
  ev->st[s] &= ~(ST_LINKED | ST_PQ_M);
  return s;
}

static void
s3_insert (struct evict *ev, uint32_t slot, unsigned q, unsigned f)
{
  uint8_t st = ev->st[slot];

  if (st & ST_RES) {
    /* Already resident: a touch. */
    if (freq (ev, slot) < FREQ_MAX)
      set_freq (ev, slot, freq (ev, slot) + 1);
    return;
  }
  /* Keep the link bits, set the rest. */
  st &= ST_LINKED | ST_PQ_M;
  st |= ST_RES | (q == QM ? ST_LQ_M : 0) | (f << ST_FSHIFT);
  ev->st[slot] = st;
  ev->q[q].count++;
  ev->resident_count++;
  if (!(st & ST_LINKED))
    push (ev, q, slot);
  /* else a zombie coming back: it keeps its place (see the top). */
}

static void
s3_remove (struct evict *ev, uint32_t slot)
{
  uint8_t st = ev->st[slot];

  if (!(st & ST_RES))
    return;
  ev->q[lq (ev, slot)].count--;
  ev->resident_count--;
  ev->st[slot] = st & (ST_LINKED | ST_PQ_M);   /* a zombie if linked */
}

/* Pop at most max nodes from list q and process them (see the top of
 * the file).  Returns the victim, or EVICT_NONE.  *moved is set when a
 * node moved to the other list.
 */
static uint32_t
sweep (struct evict *ev, unsigned q, uint64_t max,
       evict_can_take_fn can_take, void *opaque, bool *moved)
{
  /* Consecutive refusals of frequency-0 nodes: once a whole turn of the
   * list has been refused, another turn would only ask again.
   */
  uint32_t refused = 0;

  while (max-- > 0 && ev->q[q].len > 0 && refused < ev->q[q].len) {
    uint32_t s = pop (ev, q);
    unsigned f;

    if (!(ev->st[s] & ST_RES)) {
      refused = 0;
      continue;                 /* zombie: dropped */
    }
    if (lq (ev, s) != q) {      /* came back for the other queue */
      push (ev, !q, s);
      *moved = true;
      refused = 0;
      continue;
    }
    f = freq (ev, s);
    if (q == QS && f > 0) {     /* re-used on probation: promote */
      ev->st[s] |= ST_LQ_M;
      set_freq (ev, s, 0);
      ev->q[QS].count--;
      ev->q[QM].count++;
      push (ev, QM, s);
      *moved = true;
      refused = 0;
      continue;
    }
    if (q == QM && f > 0) {     /* second chance */
      set_freq (ev, s, f - 1);
      push (ev, QM, s);
      refused = 0;
      continue;
    }
    if (!can_take (opaque, s)) {
      push (ev, q, s);          /* refused: back to the head, as it is */
      refused++;
      continue;
    }
    if (q == QS && ev->page_fn)
      ghost_add (ev, ev->page_fn (ev->page_opaque, s));
    ev->q[q].count--;
    ev->resident_count--;
    ev->st[s] = 0;
    return s;
  }
  return EVICT_NONE;
}

static uint32_t
s3_victim (struct evict *ev, evict_can_take_fn can_take, void *opaque)
{
  unsigned first;
  bool moved = false;

  first = (ev->q[QS].count >= ev->s_target || ev->q[QM].count == 0)
    ? QS : QM;

  /* Alternate between the queues.  A sweep of S visits each node once;
   * a sweep of M may need FREQ_MAX + 1 turns for a node's frequency to
   * reach 0.  Nodes only move S -> M (promotion) or once to the queue
   * they came back for, so at most 5 sweeps visit every resident slot
   * with frequency 0: if none is taken, none may be.  After the first
   * two, a sweep is only needed if the previous one moved nodes into
   * its queue.
   */
  for (unsigned i = 0; i < 5; ++i) {
    unsigned q = (i & 1) ? !first : first;
    uint64_t max = (uint64_t) ev->q[q].len * (q == QM ? FREQ_MAX + 1 : 1);
    uint32_t v;

    if (i >= 2 && !moved)
      break;
    moved = false;
    v = sweep (ev, q, max, can_take, opaque, &moved);
    if (v != EVICT_NONE)
      return v;
  }
  return EVICT_NONE;
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
    s3_insert (ev, slot, QS, 0);
}

bool
evict_insert_page (struct evict *ev, uint32_t slot, uint64_t page)
{
  if (ev->policy == EVICT_CLOCK) {
    clock_insert (ev, slot, true);
    return false;
  }
  if (ev->st[slot] & ST_RES) {
    s3_insert (ev, slot, QS, 0);        /* a touch */
    return false;
  }
  if (ghost_find (ev, page, true)) {
    s3_insert (ev, slot, QM, 0);
    return true;
  }
  s3_insert (ev, slot, QS, 0);
  return false;
}

void
evict_touch (struct evict *ev, uint32_t slot)
{
  if (ev->policy == EVICT_CLOCK) {
    if (bit (ev->resident, slot))
      set (ev->ref, slot, true);
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

uint32_t
evict_victim (struct evict *ev, evict_can_take_fn can_take, void *opaque)
{
  if (ev->resident_count == 0)
    return EVICT_NONE;
  if (ev->policy == EVICT_CLOCK)
    return clock_victim (ev, can_take, opaque);
  return s3_victim (ev, can_take, opaque);
}

uint8_t
evict_slot_hint (const struct evict *ev, uint32_t slot)
{
  if (ev->policy == EVICT_CLOCK)
    return bit (ev->resident, slot) && bit (ev->ref, slot);
  if (!(ev->st[slot] & ST_RES))
    return 0;
  if (lq (ev, slot) == QS)
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
  case 0: s3_insert (ev, slot, QS, 0); break;
  case 1: s3_insert (ev, slot, QS, 1); break;
  case 2: s3_insert (ev, slot, QM, 0); break;
  default: s3_insert (ev, slot, QM, 2); break;
  }
}
