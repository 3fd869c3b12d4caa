/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: pages written back whose cache-file entry
 * could not be told so (a failing cache device).
 *
 * Owns c->stale: the slots whose entry on the cache file does not say
 * what RAM says, because writing it failed: a page written back whose
 * entry still says "dirty", or a dropped page whose entry still says
 * "clean".  If the backend got newer data for a page whose entry still
 * says dirty and nbdkit stopped, the next start would recover the old
 * dirty data and write it back over the newer data.  So before any
 * request sends data for such a page to the backend, the slot's current
 * entry is written and synced; if the device still refuses, the request
 * fails with EIO instead.  Entries that still say "clean" are retried
 * the same way and at close, but do not fail requests (see the man
 * page, CACHE DEVICE FAILURES).  A dropped slot whose older version
 * could not be freed keeps its entry for good (cache_stale_keep): a
 * FREE entry would let a crash bring that version back.
 *
 * Locking: c->stale, c->nstale, c->capstale and c->stale_clean_logged
 * are under c->lock; the entry writes and the sync are done without it.
 * Callers hold the range lock of the pages whose entries they record.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "log.h"

/* Under c->lock: the first time a dropped clean page keeps its entry
 * saying "clean", tell the user now: a crash before the entry is
 * rewritten (at the latest at a clean shutdown) leaves a copy that
 * verifies but may be older than the backend.
 */
static void
stale_log_clean_locked (struct cache *c, uint64_t page)
{
  if (c->stale_clean_logged)
    return;
  c->stale_clean_logged = true;
  log_error ("cache file %s: the failing device refused to record that "
             "cached page %llu was dropped; if nbdkit stops without a "
             "clean shutdown, start the next time with "
             "ssdcache-verify=lazy, or use a new cache file",
             c->path, (unsigned long long) page);
}

static void
stale_add (struct cache *c, uint32_t s, uint64_t page, bool disk_dirty,
           bool keep, const uint32_t *crc)
{
  pthread_mutex_lock (&c->lock);
  if (!disk_dirty)
    stale_log_clean_locked (c, page);
  for (size_t i = 0; i < c->nstale; i++)
    if (c->stale[i].slot == s) {
      c->stale[i].disk_dirty |= disk_dirty;
      c->stale[i].keep |= keep;
      if (crc) {
        c->stale[i].crc = *crc;
        c->stale[i].has_crc = true;
      }
      pthread_mutex_unlock (&c->lock);
      return;
    }
  if (c->nstale == c->capstale) {
    size_t cap = c->capstale ? c->capstale * 2 : 16;
    struct cache_stale *p = realloc (c->stale, cap * sizeof *p);
    if (p == NULL) {
      pthread_mutex_unlock (&c->lock);
      log_error ("realloc: %m");
      return;
    }
    c->stale = p;
    c->capstale = cap;
  }
  c->stale[c->nstale].slot = s;
  c->stale[c->nstale].page = page;
  c->stale[c->nstale].disk_dirty = disk_dirty;
  c->stale[c->nstale].keep = keep;
  c->stale[c->nstale].crc = crc ? *crc : 0;
  c->stale[c->nstale].has_crc = crc != NULL;
  c->nstale++;
  pthread_mutex_unlock (&c->lock);
  if (ssdcache_debug_verbose)
    log_debug ("page %llu (slot %u): its entry on the cache file is stale "
               "(%s)", (unsigned long long) page, s,
               disk_dirty ? "still says dirty" : "still says clean");
}

void
cache_stale_add (struct cache *c, uint32_t s, uint64_t page, bool disk_dirty,
                 const uint32_t *crc)
{
  stale_add (c, s, page, disk_dirty, false, crc);
}

void
cache_stale_keep (struct cache *c, uint32_t s, uint64_t page,
                  bool disk_dirty)
{
  stale_add (c, s, page, disk_dirty, true, NULL);
}

/* Write the current entry of every stale slot of pages [first, last]
 * and sync.  Returns 0 if none is left there (with dirty_only: none
 * that says dirty), -1 otherwise.
 */
static int
stale_record (struct cache *c, uint64_t first, uint64_t last, bool dirty_only)
{
  struct layout_entry *e = NULL;
  uint32_t *slots = NULL;
  bool *current = NULL;
  size_t n = 0;
  bool ok = true;

  pthread_mutex_lock (&c->lock);
  if (c->nstale == 0) {
    pthread_mutex_unlock (&c->lock);
    return 0;
  }
  e = malloc (c->nstale * sizeof *e);
  slots = malloc (c->nstale * sizeof *slots);
  current = malloc (c->nstale * sizeof *current);
  if (e == NULL || slots == NULL || current == NULL) {
    pthread_mutex_unlock (&c->lock);
    free (e);
    free (slots);
    free (current);
    return -1;
  }
  for (size_t i = 0; i < c->nstale; i++) {
    const struct cache_stale *st = &c->stale[i];
    if (st->page < first || st->page > last || st->keep)
      continue;
    /* What RAM says now is the truth for this slot, with the checksum
     * of its data: the one of the last entry write that failed
     * (crc_memo), or the one recorded here.  A slot dropped and then
     * taken again that has neither had its entry written since: it
     * is current.
     */
    struct pt_slot v;
    uint32_t crc;
    pagetable_get (&c->pt, st->slot, &v);
    current[n] = false;
    if (cache_crc_memo_find_locked (c, st->slot, &crc))
      pt_slot_set_crc (&v, crc);
    else if (st->has_crc)
      pt_slot_set_crc (&v, st->crc);
    else if (v.state != LAYOUT_FREE && !(v.flags & PT_UNSEALED)) {
      current[n] = true;
      slots[n++] = st->slot;
      continue;
    }
    pagetable_to_entry (&v, &e[n]);
    e[n].seq = ++c->seq;
    e[n].hint = evict_slot_hint (c->ev, st->slot);
    slots[n++] = st->slot;
  }
  pthread_mutex_unlock (&c->lock);

  for (size_t i = 0; ok && i < n; i++)
    if (!current[i] && pool_write_entry (&c->pool, slots[i], &e[i]) == -1)
      ok = false;
  if (ok && n > 0 && defer_sync (&c->defer, &c->pool) == -1)
    ok = false;

  pthread_mutex_lock (&c->lock);
  if (ok)
    for (size_t i = 0; i < c->nstale;) {
      bool done = false;
      for (size_t k = 0; k < n && !done; k++)
        done = c->stale[i].slot == slots[k];
      if (done)
        c->stale[i] = c->stale[--c->nstale];
      else
        i++;
    }
  ok = true;
  for (size_t i = 0; i < c->nstale; i++)
    if (c->stale[i].page >= first && c->stale[i].page <= last &&
        (c->stale[i].disk_dirty || !dirty_only))
      ok = false;
  pthread_mutex_unlock (&c->lock);
  free (e);
  free (slots);
  free (current);
  return ok ? 0 : -1;
}

int
cache_stale_record (struct cache *c, uint64_t first, uint64_t last, int *err)
{
  if (stale_record (c, first, last, true) == 0)
    return 0;
  log_error ("cache file %s: pages %llu-%llu were written back, but the "
             "failing cache device cannot record it; changing them on the "
             "backend now would let the next start bring the old data "
             "back, so this request fails", c->path,
             (unsigned long long) first, (unsigned long long) last);
  *err = EIO;
  return -1;
}

bool
cache_stale_record_all (struct cache *c)
{
  return stale_record (c, 0, UINT64_MAX, false) == 0;
}
