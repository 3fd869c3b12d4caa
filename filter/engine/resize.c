/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: changing the size of a cache, keeping it.
 *
 * Owns resize_file: given a cache that has just been closed cleanly
 * with no dirty data (open.c: cache_close_resize), still open and with
 * its page table in RAM, give the file the geometry of c->resize_slots
 * slots.  The data stays where it is: the pool moves by the change of
 * the page table's length, so new slot j is old slot j + k (k whole
 * pages; when the move is not a whole number of pages nothing is kept),
 * and only the entries are rewritten.  An old slot that the new
 * geometry cannot hold (covered by the longer page table, or past the
 * shorter pool) is dropped: its page is clean, the backend has it.
 * Before that (step 0, resize_move_hot), the pages in those slots that
 * are hotter (their policy hint) than the free or colder slots the new
 * geometry keeps are copied there, hottest first, so that a shrink
 * keeps the hottest pages, not those that sit in the right place.
 *
 * Crash safety, with the superblock's two copies:
 *   0. a moved page's destination gets a FREE entry, then its data
 *      (each synced), then its new entry, with a newer sequence number
 *      than the old one's: a crash leaves the old cache with the page
 *      in either slot (recovery takes the newest entry);
 *   1. both copies get the new geometry and LAYOUT_SB_RESIZING (the
 *      first write is the only one that can leave the old cache
 *      standing; an older filter refuses a RESIZING copy);
 *   2. the entries are moved, chunk by chunk, in the direction that
 *      never overwrites one not yet read (like memmove), and synced;
 *   3. one copy is written with the new geometry, clean.
 * A start that finds RESIZING newest (open.c) starts an empty cache:
 * nothing dirty was in it.  Single-threaded (no request, no thread
 * runs): takes no lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache-int.h"
#include "log.h"

#define RESIZE_CHUNK 16384       /* entries per read and write (1 MiB) */
#define RESIZE_MOVE_BYTES (64u << 20) /* data moved between two syncs */
#define RESIZE_MOVES_MAX 16384   /* and at most so many pages */

unsigned resize_test_moves;     /* unit tests: pages between two syncs */

struct resize {
  struct cache *c;
  uint64_t old_n, new_n;         /* slots */
  int64_t k;                     /* new slot j holds old slot j + k */
  bool keep;                     /* false: the move is not whole pages */
  uint8_t free_entry[LAYOUT_ENTRY_SIZE];
  uint8_t *in, *out;             /* RESIZE_CHUNK entries each */
  uint64_t kept, moved;
};

/* The crash tests' kill points (-D ssdcache.resize_kill=STEP): 1 after
 * the first superblock, 2 after both, 3 after the first chunk of
 * entries, 4 after all the entries, 5 after the last superblock; in
 * step 0, 6 after the data of the first moved pages, 7 after their
 * entries.
 */
static void
resize_kill_point (int step)
{
  if (ssdcache_debug_resize_kill == step) {
    log_error ("resize: killed at step %d (-D ssdcache.resize_kill)", step);
    raise (SIGKILL);
  }
}

/* fdatasync of the cache file.  Returns -1 (logged) on error. */
static int
resize_sync (struct cache *c)
{
  if (pool_sync (&c->pool) == -1) {
    log_error ("cache file %s: resize: fdatasync: %m", c->path);
    return -1;
  }
  return 0;
}

/* Does old slot s hold a current clean page (in RAM)? */
static bool
resize_current (const struct cache *c, uint64_t s)
{
  const uint16_t bad = PT_SUPERSEDED | PT_BAD | PT_UNSEALED | PT_EVICTED |
    PT_ORPHAN;

  return (pt_flags (&c->pt, s) & PT_INDEXED) &&
    !(pt_flags (&c->pt, s) & bad) && pt_state (&c->pt, s) == LAYOUT_CLEAN;
}

/* Is old slot s a current clean page whose entry can move as it is? */
static bool
resize_keeps (const struct resize *r, uint64_t s, const uint8_t *raw)
{
  const struct cache *c = r->c;
  struct layout_entry e;

  if (!resize_current (c, s))
    return false;
  return layout_entry_decode (raw, c->nsectors, &e) == 0 &&
    e.state == LAYOUT_CLEAN && e.flags == 0 && e.page == pt_page (&c->pt, s);
}

/* Does the new geometry hold old slot s (as new slot s - k)? */
static bool
resize_holds (const struct resize *r, uint64_t s)
{
  int64_t j = (int64_t) s - r->k;

  return r->keep && j >= 0 && j < (int64_t) r->new_n;
}

/* Step 0 (see the top of the file).  A slot's class: -1 free (nothing
 * current in it), else the hint of its current clean page; 4 for a
 * slot that is neither (it stays as it is).
 */
static int
resize_class (const struct cache *c, uint64_t s)
{
  if (resize_current (c, s))
    return evict_slot_hint (c->ev, s);
  return pt_flags (&c->pt, s) & PT_INDEXED ? 4 : -1;
}

/* The next old slot from *cur on, held by the new geometry or not
 * (held), of class cls; r->old_n if none.
 */
static uint64_t
resize_next (const struct resize *r, uint64_t *cur, bool held, int cls)
{
  for (; *cur < r->old_n; ++*cur)
    if (resize_holds (r, *cur) == held && resize_class (r->c, *cur) == cls)
      return (*cur)++;
  return r->old_n;
}

struct resize_pair {
  uint32_t from, to;
  bool ok;
  uint32_t crc;                  /* of the page's data (resize_copy) */
};

/* Copy the page of slot m->from into slot m->to (buf: a page).
 * Returns 1, 0 if it is not moved (it fails its checksum, or cannot be
 * read), or -1 (logged) if the copy could not be written.
 */
static int
resize_copy (struct cache *c, struct resize_pair *m, uint8_t *buf)
{
  struct pt_slot v;

  pagetable_get (&c->pt, m->from, &v);
  if (pool_read_data (&c->pool, m->from, buf, c->page_size, 0) == -1 ||
      cache_entry_crc (c, m->from, &v, &m->crc) == -1 ||
      cache_page_crc (c, buf, v.valid) != m->crc)
    return 0;
  if (pool_write_data (&c->pool, m->to, buf, c->page_size, 0) == -1) {
    log_error ("cache file %s: resize: moving a page: %m", c->path);
    return -1;
  }
  return 1;
}

/* The page of slot m->from, whose data is now in m->to, gets an entry
 * there (newer than the old one), and the page table and the policy
 * in RAM follow (for resize_keeps, and so that m->to is never taken
 * again).  Returns -1 (logged) on an I/O error.
 */
static int
resize_commit_move (struct resize *r, const struct resize_pair *m)
{
  struct cache *c = r->c;
  struct pt_slot v;
  struct layout_entry e;

  pagetable_get (&c->pt, m->from, &v);
  pt_slot_set_crc (&v, m->crc);
  v.seq = ++c->seq;
  pagetable_to_entry (&v, &e);
  e.hint = evict_slot_hint (c->ev, m->from);
  if (pool_write_entry (&c->pool, m->to, &e) == -1) {
    log_error ("cache file %s: resize: writing an entry: %m", c->path);
    return -1;
  }
  if (pt_flags (&c->pt, m->to) & PT_INDEXED) {
    pagetable_remove (&c->pt, m->to);
    evict_remove (c->ev, m->to);
  }
  pagetable_remove (&c->pt, m->from);
  evict_remove (c->ev, m->from);
  if (!pagetable_from_entry (&c->pt, m->to, &e))
    return 0;                   /* (no room for its maps: dropped) */
  pagetable_insert (&c->pt, m->to, e.page);
  evict_insert_hint (c->ev, m->to, e.hint);
  r->moved++;
  return 0;
}

/* Moves mv[0, n): FREE entries in their destinations (synced: no entry
 * ever describes data that has gone), the data copied (synced), then
 * their entries.  Returns -1 (logged) on an I/O error.
 */
static int
resize_do_moves (struct resize *r, struct resize_pair *mv, unsigned n,
                 uint8_t *buf)
{
  struct cache *c = r->c;
  const struct layout_entry fe = { .state = LAYOUT_FREE };

  for (unsigned i = 0; i < n; i++)
    if (pool_write_entry (&c->pool, mv[i].to, &fe) == -1) {
      log_error ("cache file %s: resize: writing an entry: %m", c->path);
      return -1;
    }
  if (resize_sync (c) == -1)
    return -1;
  for (unsigned i = 0; i < n; i++) {
    int x = resize_copy (c, &mv[i], buf);

    if (x == -1)
      return -1;
    mv[i].ok = x;
  }
  if (resize_sync (c) == -1)
    return -1;
  resize_kill_point (6);
  for (unsigned i = 0; i < n; i++)
    if (mv[i].ok && resize_commit_move (r, &mv[i]) == -1)
      return -1;
  resize_kill_point (7);
  return 0;
}

/* The next move: the next page of hint h (from the cursor *src on) in
 * a slot the new geometry drops, to the next free or colder slot it
 * holds (dst: a cursor for each class up to 2).  Returns false when
 * there is none.
 */
static bool
resize_pick_move (const struct resize *r, int h, uint64_t *src,
                  uint64_t dst[4], struct resize_pair *m)
{
  m->from = resize_next (r, src, false, h);
  if (m->from == r->old_n)
    return false;
  m->to = r->old_n;
  for (int cls = -1; cls < h && m->to == r->old_n; cls++)
    m->to = resize_next (r, &dst[cls + 1], true, cls);
  return m->to < r->old_n;
}

/* Step 0: move the pages of the slots the new geometry drops into the
 * free or colder slots it holds, hint 3 first (hint 0 into free slots
 * only), ssdcache-resize-move bytes at most.  Returns -1 (logged) on
 * an I/O error.  (A destination whose source then fails its checksum
 * stays FREE.  A later step that fails leaves the cache its old size,
 * less the pages moved over.)
 */
static int
resize_move_hot (struct resize *r)
{
  const unsigned cap = resize_test_moves ? resize_test_moves
    : RESIZE_MOVE_BYTES / r->c->page_size < 16 ? 16
    : RESIZE_MOVE_BYTES / r->c->page_size > RESIZE_MOVES_MAX
    ? RESIZE_MOVES_MAX : RESIZE_MOVE_BYTES / r->c->page_size;
  uint64_t left = r->c->resize_move / r->c->page_size;   /* moves */
  uint64_t dst[4] = { 0, 0, 0, 0 };
  struct resize_pair *mv;
  uint8_t *buf;
  unsigned n = 0;
  int ret = 0;

  if (!r->keep || r->c->ev == NULL || left == 0)
    return 0;
  /* Free slots become destinations and are indexed: no free list from
   * here on (nothing takes a slot any more before free_cache), and no
   * share of a budget with other caches (clearing the list would
   * charge it for every free slot).
   */
  pagetable_set_budget (&r->c->pt, NULL, 0);
  pagetable_clear_free (&r->c->pt);
  buf = malloc (r->c->page_size);
  mv = malloc (cap * sizeof *mv);
  if (buf == NULL || mv == NULL) {
    log_error ("malloc: %m");
    ret = -1;
  }
  for (int h = LAYOUT_HINT_MAX; h >= 0 && ret == 0; h--) {
    uint64_t src = 0;

    while (ret == 0 && left > 0 &&
           resize_pick_move (r, h, &src, dst, &mv[n])) {
      left--;
      if (++n == cap) {
        ret = resize_do_moves (r, mv, n, buf);
        n = 0;
      }
    }
  }
  if (ret == 0 && n > 0)
    ret = resize_do_moves (r, mv, n, buf);
  free (mv);
  free (buf);
  return ret;
}

/* New entries [j0, j0 + n): each the old entry of slot j + k if kept,
 * else a FREE one.
 */
static int
resize_chunk (struct resize *r, uint64_t j0, uint64_t n)
{
  struct cache *c = r->c;
  int64_t lo = (int64_t) j0 + r->k, hi = lo + (int64_t) n;   /* old slots */
  int64_t rlo = lo < 0 ? 0 : lo;
  int64_t rhi = hi > (int64_t) r->old_n ? (int64_t) r->old_n : hi;

  if (r->keep && rlo < rhi &&
      pool_read_entries (&c->pool, rlo, rhi - rlo,
                         r->in + (rlo - lo) * LAYOUT_ENTRY_SIZE) == -1) {
    log_error ("cache file %s: resize: reading entries: %m", c->path);
    return -1;
  }
  for (uint64_t x = 0; x < n; x++) {
    int64_t i = lo + (int64_t) x;
    const uint8_t *raw = r->in + x * LAYOUT_ENTRY_SIZE;
    bool keep = r->keep && i >= rlo && i < rhi && resize_keeps (r, i, raw);

    memcpy (r->out + x * LAYOUT_ENTRY_SIZE, keep ? raw : r->free_entry,
            LAYOUT_ENTRY_SIZE);
    r->kept += keep;
  }
  if (pool_write_entries (&c->pool, j0, n, r->out) == -1) {
    log_error ("cache file %s: resize: writing entries: %m", c->path);
    return -1;
  }
  resize_kill_point (3);
  return 0;
}

/* Step 2: every new entry, then a sync.  Growing, the new entries sit
 * before the old ones they come from: go up; shrinking, go down.
 */
static int
resize_entries (struct resize *r)
{
  const uint64_t nchunks = (r->new_n + RESIZE_CHUNK - 1) / RESIZE_CHUNK;

  for (uint64_t x = 0; x < nchunks; x++) {
    uint64_t ci = r->k >= 0 ? x : nchunks - 1 - x;
    uint64_t j0 = ci * RESIZE_CHUNK;
    uint64_t n = r->new_n - j0 < RESIZE_CHUNK ? r->new_n - j0 : RESIZE_CHUNK;

    if (resize_chunk (r, j0, n) == -1)
      return -1;
  }
  return resize_sync (r->c);
}

/* The file's length for total bytes: grown before the entries move
 * (reserving the space unless the pool is sparse), cut after.
 */
static int
resize_length (struct cache *c, uint64_t total, bool grow)
{
  struct pool *p = &c->pool;
  int r;

  if (p->is_blockdev || (grow ? total <= p->dev_size : total >= p->dev_size))
    return 0;
  if (ftruncate (p->fd, total) == -1) {
    log_error ("cache file %s: resize to %llu bytes: %m", c->path,
               (unsigned long long) total);
    return -1;
  }
  if (grow && !p->sparse &&
      (r = posix_fallocate (p->fd, p->dev_size, total - p->dev_size)) != 0 &&
      r != EOPNOTSUPP && r != EINVAL) {
    errno = r;
    log_error ("cache file %s: resize: reserving %llu bytes: %m", c->path,
               (unsigned long long) (total - p->dev_size));
    return -1;
  }
  p->dev_size = total;
  return 0;
}

/* The superblock of the new geometry with flags. */
static void
resize_sb (const struct cache *c, const struct resize *r, uint32_t flags,
           struct layout_sb *sb)
{
  uint64_t total;

  *sb = c->pool.sb;
  sb->nslots = r->new_n;
  layout_geometry (sb->page_size, r->new_n, &sb->pt_offset, &sb->pool_offset,
                   &total);
  sb->flags = flags;
}

/* Steps 1 to 3 (see the top of the file), with r set up. */
static int
resize_steps (struct resize *r, uint64_t total)
{
  struct cache *c = r->c;
  struct layout_sb sb;

  if (resize_move_hot (r) == -1)
    return -1;
  resize_sb (c, r, LAYOUT_SB_RESIZING | LAYOUT_SB_PTINIT, &sb);
  if (pool_write_sb (&c->pool, &sb) == -1)
    return -1;
  resize_kill_point (1);
  if (pool_write_sb (&c->pool, &sb) == -1)
    return -1;
  resize_kill_point (2);
  if (resize_length (c, total, true) == -1 || resize_entries (r) == -1)
    return -1;
  resize_kill_point (4);
  resize_sb (c, r, LAYOUT_SB_CLEAN | LAYOUT_SB_PTINIT, &sb);
  if (pool_write_sb (&c->pool, &sb) == -1)
    return -1;
  resize_kill_point (5);
  return resize_length (c, total, false);
}

int
resize_file (struct cache *c)
{
  struct resize r = { .c = c, .old_n = c->nslots, .new_n = c->resize_slots };
  uint64_t pt, old_pool = c->pool.sb.pool_offset, new_pool, total;
  struct layout_entry fe = { .state = LAYOUT_FREE };
  int ret = -1;

  if (!layout_geometry (c->page_size, r.new_n, &pt, &new_pool, &total))
    return -1;
  if (c->pool.is_blockdev && c->pool.dev_size < total) {
    log_error ("cache file %s: the device has %llu bytes, %llu slots need "
               "%llu: the cache keeps its size", c->path,
               (unsigned long long) c->pool.dev_size,
               (unsigned long long) r.new_n, (unsigned long long) total);
    return -1;
  }
  r.keep = (new_pool > old_pool ? new_pool - old_pool : old_pool - new_pool)
    % c->page_size == 0;
  r.k = ((int64_t) new_pool - (int64_t) old_pool) / (int64_t) c->page_size;
  layout_entry_encode (&fe, r.free_entry);
  r.in = malloc ((size_t) RESIZE_CHUNK * LAYOUT_ENTRY_SIZE);
  r.out = malloc ((size_t) RESIZE_CHUNK * LAYOUT_ENTRY_SIZE);
  if (r.in == NULL || r.out == NULL)
    log_error ("malloc: %m");
  else if (resize_steps (&r, total) == 0) {
    log_debug ("cache file %s: resized from %llu to %llu slots; %llu cached "
               "pages kept, %llu of them moved to another slot", c->path,
               (unsigned long long) r.old_n, (unsigned long long) r.new_n,
               (unsigned long long) r.kept, (unsigned long long) r.moved);
    ret = 0;
  }
  free (r.in);
  free (r.out);
  return ret;
}
