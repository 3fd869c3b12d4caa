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
 *
 * Crash safety, with the superblock's two copies:
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

struct resize {
  struct cache *c;
  uint64_t old_n, new_n;         /* slots */
  int64_t k;                     /* new slot j holds old slot j + k */
  bool keep;                     /* false: the move is not whole pages */
  uint8_t free_entry[LAYOUT_ENTRY_SIZE];
  uint8_t *in, *out;             /* RESIZE_CHUNK entries each */
  uint64_t kept;
};

/* The crash tests' kill points (-D ssdcache.resize_kill=STEP): 1 after
 * the first superblock, 2 after both, 3 after the first chunk of
 * entries, 4 after all the entries, 5 after the last superblock.
 */
static void
resize_kill_point (int step)
{
  if (ssdcache_debug_resize_kill == step) {
    log_error ("resize: killed at step %d (-D ssdcache.resize_kill)", step);
    raise (SIGKILL);
  }
}

/* Is old slot s a current clean page whose entry can move as it is? */
static bool
resize_keeps (const struct resize *r, uint64_t s, const uint8_t *raw)
{
  const struct cache *c = r->c;
  const uint16_t bad = PT_SUPERSEDED | PT_BAD | PT_UNSEALED | PT_EVICTED |
    PT_ORPHAN;
  struct layout_entry e;

  if (!(pt_flags (&c->pt, s) & PT_INDEXED) || (pt_flags (&c->pt, s) & bad) ||
      pt_state (&c->pt, s) != LAYOUT_CLEAN)
    return false;
  return layout_entry_decode (raw, c->nsectors, &e) == 0 &&
    e.state == LAYOUT_CLEAN && e.flags == 0 && e.page == pt_page (&c->pt, s);
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
  if (fdatasync (r->c->pool.fd) == -1) {
    log_error ("cache file %s: resize: fdatasync: %m", r->c->path);
    return -1;
  }
  return 0;
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
               "pages kept", c->path, (unsigned long long) r.old_n,
               (unsigned long long) r.new_n, (unsigned long long) r.kept);
    ret = 0;
  }
  free (r.in);
  free (r.out);
  return ret;
}
