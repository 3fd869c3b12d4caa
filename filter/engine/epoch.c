/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: sync epochs and superseded slots.
 *
 * Owns the durability bookkeeping: every sync of the cache file opens a
 * new epoch (c->epoch); a write is durable once a later sync finished
 * (c->durable_epoch) and flushed once that sync was a client's
 * (c->flushed_epoch).  A slot replaced by a copy on write stays on disk
 * until its successor is flushed (c->sup), then gets a FREE entry; in
 * the flush order, one whose dirty data belongs to an older generation
 * stays until that is written back (cache_retained_locked, order.c).
 * Dropping a slot settles its older versions first.  The epochs, the
 * list of client syncs in flight and c->sup are under c->lock; a client
 * sync takes c->inplace exclusively for a moment (lock table:
 * docs/design.md).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache-int.h"
#include "log.h"

static int sync_epoch (struct cache *c, bool client, bool seal_wait,
                       bool closes_gen, int *err);

/* How many times the calling thread holds c->inplace shared (of any
 * cache).  A client sync takes it exclusively: from a thread that
 * holds it, that would wait for itself forever.
 */
static __thread unsigned inplace_held;

void
cache_inplace_enter (struct cache *c)
{
  pthread_rwlock_rdlock (&c->inplace);
  inplace_held++;
}

void
cache_inplace_leave (struct cache *c)
{
  inplace_held--;
  pthread_rwlock_unlock (&c->inplace);
}

/* Does slot s still need settling?  Another client sync may have taken
 * s's predecessors off c->sup and be freeing them now: its end is
 * waited for first.
 */
static bool
still_pending (struct cache *c, uint32_t s)
{
  bool pending;

  pthread_mutex_lock (&c->lock);
  while (cache_needs_settling_locked (c, s) && c->nfreeing > 0)
    pthread_cond_wait (&c->space, &c->lock);
  pending = cache_needs_settling_locked (c, s);
  pthread_mutex_unlock (&c->lock);
  return pending;
}

/* Settle slot s (pinned, its page range locked by the caller) before
 * it is dropped or changed in place: free its older versions still on
 * disk.  An unsealed successor is sealed first: its predecessor is
 * freed only once a sealed successor is flushed.  Returns true once
 * none is left (false: a cache-file error).
 */
bool
cache_settle (struct cache *c, uint32_t s)
{
  for (int i = 0; i < 4; i++) {
    int err;

    if (!still_pending (c, s))
      return true;
    if (cache_seal_slot (c, s, CACHE_EPOCH_NOW) == -1 ||
        sync_epoch (c, true, false, false, &err) == -1)
      return false;
  }
  return !still_pending (c, s);
}

/* Drop pinned slot s (its page is range locked by the caller): it
 * leaves the index at once and is freed when its last pin goes.
 * Consumes the caller's pin.  If an older version of the page is still
 * on the cache file and cannot be freed (a failing device), s's entry
 * must keep hiding it: no FREE entry is written, and s keeps the pin,
 * so it is never reused in this run (cache_stale_keep).  Returns -1
 * then, and when the FREE entry cannot be written.
 */
int
cache_drop_slot (struct cache *c, uint32_t s)
{
  static const uint8_t none[LAYOUT_MAX_SECTORS / 8];
  struct layout_entry e;
  struct pt_slot v;
  uint64_t page;
  bool was_dirty, settled;
  int r;

  settled = cache_settle (c, s);
  pthread_mutex_lock (&c->lock);
  page = pt_page (&c->pt, s);
  was_dirty = pt_state (&c->pt, s) == LAYOUT_DIRTY;
  if (pt_flags (&c->pt, s) & PT_INDEXED) {
    cache_set_state_counts_locked (c, pt_state (&c->pt, s), LAYOUT_FREE);
    pagetable_remove (&c->pt, s);
    evict_remove (c->ev, s);
  }
  if (pt_flags (&c->pt, s) & PT_PREFETCHED)
    STATS_ADD (&c->stats, prefetch_wasted, 1);   /* never read */
  pt_flags_on (&c->pt, s, PT_ORPHAN);
  pt_flags_off (&c->pt, s, PT_VERIFIED | PT_BAD | PT_HASPRED | PT_UNSEALED |
                PT_PREFETCHED);
  pt_set_state (&c->pt, s, LAYOUT_FREE);
  pt_maps_set (&c->pt, s, none, none);
  pt_set_seq (&c->pt, s, ++c->seq);
  pagetable_get (&c->pt, s, &v);
  pagetable_to_entry (&v, &e);
  pthread_mutex_unlock (&c->lock);

  STATS_ADD (&c->stats, pages_invalidated, 1);
  if (!settled) {
    cache_stale_keep (c, s, page, was_dirty);
    return -1;
  }
  r = pool_write_entry (&c->pool, s, &e);
  if (r == -1) {
    cache_io_error (c, "writing free entry", s);
    cache_stale_add (c, s, page, was_dirty, NULL);
  }
  cache_unpin (c, s);
  return r;
}

/* Under c->lock: put old, replaced by succ, on c->sup.  False if there
 * is no memory for it.
 */
bool
cache_sup_add_locked (struct cache *c, uint32_t old, uint32_t succ)
{
  if (c->nsup == c->capsup) {
    size_t cap = c->capsup ? c->capsup * 2 : 64;
    struct cache_sup *p = realloc (c->sup, cap * sizeof *p);
    if (p == NULL)
      return false;
    c->sup = p;
    c->capsup = cap;
  }
  c->sup[c->nsup].slot = old;
  c->sup[c->nsup].succ = succ;
  c->nsup++;
  return true;
}

/* Under nothing: record that old (pinned by the caller) was replaced by
 * succ for page; old stays on disk until succ is durable.  Consumes the
 * caller's pin on old.
 */
void
cache_supersede (struct cache *c, uint32_t old, uint32_t succ, uint64_t page)
{
  uint8_t hint = 0;

  pthread_mutex_lock (&c->lock);
  if (!cache_sup_add_locked (c, old, succ)) {
    /* Cannot remember it: keep it out of use for good, which is safe. */
    log_error ("realloc: %m");
    goto out;
  }
  /* Older versions waiting for old now wait for succ: old may be
   * unsealed, and it goes when succ is flushed anyway.
   */
  for (size_t i = 0; i + 1 < c->nsup; i++)
    if (c->sup[i].succ == old)
      c->sup[i].succ = succ;
 out:
  {
    if (pt_flags (&c->pt, old) & PT_INDEXED) {
      /* The new version inherits the old one's hotness. */
      hint = evict_slot_hint (c->ev, old);
      cache_set_state_counts_locked (c, pt_state (&c->pt, old), LAYOUT_FREE);
      pagetable_remove (&c->pt, old);
      evict_remove (c->ev, old);
    }
    pt_flags_on (&c->pt, old, PT_SUPERSEDED);
    /* The flush order needs its data until its generation is on the
     * backend, unless the new version is of the same generation.
     */
    if (c->wbcfg.order == CACHE_ORDER_FLUSH &&
        pt_state (&c->pt, old) == LAYOUT_DIRTY) {
      if (pt_gen (&c->pt, old) < pt_gen (&c->pt, succ))
        c->nretained++;          /* cache_retained_locked from now on */
      else                       /* succ has all of it: not needed */
        pt_set_state (&c->pt, old, LAYOUT_CLEAN);
    }
    pt_unpin (&c->pt, old);
  }
  pt_flags_on (&c->pt, succ, PT_HASPRED);
  pagetable_insert (&c->pt, succ, page);
  evict_insert_hint (c->ev, succ, hint);
  cache_set_state_counts_locked (c, LAYOUT_FREE, pt_state (&c->pt, succ));
  STATS_ADD (&c->stats, cow_copies, 1);
  pthread_mutex_unlock (&c->lock);
}

/* Under c->lock: does an older version of succ's page still wait on
 * c->sup (a retained one)?
 */
static bool
succ_waited_for_locked (const struct cache *c, uint32_t succ)
{
  for (size_t i = 0; i < c->nsup; i++)
    if (c->sup[i].succ == succ)
      return true;
  return false;
}

/* Free superseded slots whose successors are flushed (called after a
 * client flush, and by writeback in the flush order): FREE entries for
 * all of them but the retained, made durable at once, so that an older
 * version can never come back once its successor may be dropped,
 * evicted or rewritten.
 */
void
cache_free_superseded (struct cache *c)
{
  struct cache_sup *done = NULL;
  size_t n = 0;
  bool ok = true;

  pthread_mutex_lock (&c->lock);
  if (c->nsup > 0)
    done = malloc (c->nsup * sizeof *done);
  for (size_t i = 0; done && i < c->nsup;) {
    uint32_t succ = c->sup[i].succ;
    if (!pt_epoch_surely_at_most (&c->pt, succ, c->flushed_epoch) ||
        (pt_flags (&c->pt, succ) & PT_UNSEALED) ||
        cache_retained_locked (c, c->sup[i].slot)) {
      i++;
      continue;
    }
    done[n++] = c->sup[i];
    memmove (c->sup + i, c->sup + i + 1, (c->nsup - i - 1) * sizeof *c->sup);
    c->nsup--;
  }
  if (n > 0)
    c->nfreeing++;
  pthread_mutex_unlock (&c->lock);
  if (n == 0) {
    free (done);
    return;
  }

  for (size_t i = 0; i < n; i++)
    if (cache_write_free_entry (c, done[i].slot) == -1)
      ok = false;
  if (ok && defer_sync (&c->defer, &c->pool) == -1) {
    cache_io_error (c, "fdatasync", 0);
    ok = false;
  }

  pthread_mutex_lock (&c->lock);
  for (size_t i = 0; i < n; i++) {
    uint32_t old = done[i].slot;
    if (!ok) {
      /* Keep both out of harm's way for good: a failing device. */
      continue;
    }
    if (!succ_waited_for_locked (c, done[i].succ))
      pt_flags_off (&c->pt, done[i].succ, PT_HASPRED);
    pt_flags_off (&c->pt, old, PT_SUPERSEDED);
    pt_flags_on (&c->pt, old, PT_ORPHAN);
    pt_set_state (&c->pt, old, LAYOUT_FREE);
    if (pt_pins (&c->pt, old) == 0)
      cache_release_slot_locked (c, old);
  }
  c->nfreeing--;
  pthread_cond_broadcast (&c->space);
  pthread_mutex_unlock (&c->lock);
  free (done);
}

/* A sync of the cache file.  client: a client's FLUSH (or close), or
 * one that must count as such: what it covers counts as flushed, and
 * unsealed slots it covers are sealed first (seal_wait: waiting for
 * pages other requests hold; the caller holds no range lock).
 * closes_gen: a client's own, which ends a flush generation.
 */
/* Under c->lock: a client sync (epoch node->e) ends.  Slot epochs are
 * kept relative to bases (pagetable.h), which stay at or below
 * c->flushed_epoch and the epoch of every client sync still in flight
 * (they compare slot epochs with these) as long as they can: tell the
 * page table how far up they may move now.
 */
static void
client_sync_done_locked (struct cache *c, struct cache_sync_node *node)
{
  uint64_t low;

  if (node->prev)
    node->prev->next = node->next;
  else
    c->syncs_head = node->next;
  if (node->next)
    node->next->prev = node->prev;
  else
    c->syncs_tail = node->prev;

  low = c->flushed_epoch;
  if (c->syncs_head && c->syncs_head->e < low)
    low = c->syncs_head->e;    /* in start order: the oldest first */
  pagetable_epoch_floor (&c->pt, low);
}

static int
sync_epoch (struct cache *c, bool client, bool seal_wait, bool closes_gen,
            int *err)
{
  struct cache_sync_node node = { 0 };
  uint64_t e;
  int r = 0;

  /* A client sync: rewrites in place that decided (cache_must_cow)
   * before flushing_epoch moves end first.  They would tear what the
   * fdatasync covers; and, finishing after the epoch moved, their
   * entries would be of the next epoch: one that unsealed a slot whose
   * older data this sync covers would escape its sealing, and a crash
   * would drop that data with the unsealed slot.
   */
  if (client && inplace_held > 0) {
    /* A bug: refuse rather than hang (the caller's request fails). */
    log_error ("cache file %s: internal error: a client sync from a "
               "thread that holds c->inplace", c->path);
    *err = EDEADLK;
    return -1;
  }
  if (client)
    pthread_rwlock_wrlock (&c->inplace);
  pthread_mutex_lock (&c->lock);
  e = c->epoch++;
  if (client && e > c->flushing_epoch) {
    c->flushing_epoch = e;
    pagetable_epoch_ceiling (&c->pt, e);
  }
  if (client) {
    node.e = e;
    node.prev = c->syncs_tail;
    if (c->syncs_tail)
      c->syncs_tail->next = &node;
    else
      c->syncs_head = &node;
    c->syncs_tail = &node;
    /* A client's FLUSH: what it covers is one flush generation. */
    if (closes_gen)
      order_close_gen_locked (c);
  }
  pthread_mutex_unlock (&c->lock);
  if (client) {
    pthread_rwlock_unlock (&c->inplace);
    /* In writethrough, clean pages rewritten since the last flush are
     * unsealed too (write-through.c: write_through_first): sealing them
     * keeps them across a crash.
     */
    cache_seal_epoch (c, e, seal_wait, c->mode != LAYOUT_MODE_WRITEBACK);
  }

  if (defer_sync (&c->defer, &c->pool) == -1) {
    *err = errno;
    cache_io_error (c, "fdatasync", 0);
    r = -1;
  }

  pthread_mutex_lock (&c->lock);
  if (r == 0 && e > c->durable_epoch)
    c->durable_epoch = e;
  if (r == 0 && client && e > c->flushed_epoch)
    c->flushed_epoch = e;
  if (client)
    client_sync_done_locked (c, &node);
  pthread_mutex_unlock (&c->lock);
  if (r == -1)
    return -1;
  if (client)
    cache_free_superseded (c);
  STATS_ADD (&c->stats, cache_syncs, 1);
  return 0;
}

int
cache_sync (struct cache *c, int *err)
{
  return sync_epoch (c, true, true, true, err);
}

int
cache_sync_device (struct cache *c, int *err)
{
  return sync_epoch (c, false, false, false, err);
}
