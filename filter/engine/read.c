/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the read path.
 *
 * Owns cache_read and its helpers: a hit is served from the slot under
 * a pin only (try_hit); a miss reads the backend and fills the pages
 * the admission policy lets in (read_slow), under the range lock of the
 * pages it changes; with a fill-behind thread running, a client's whole
 * missed pages are stored after its answer instead (struct
 * cache_fill_job, run by fill.c).  Also NBD_CMD_CACHE, the readahead
 * workers' fills and the extents query.  See the lock table in
 * docs/design.md.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache-int.h"
#include "log.h"
#include "admit.h"
#include "readahead.h"

/*----------------------------------------------------------------------
 * Reads.
 */

/* Serve [off, off+n) of page from the cache without any range lock if
 * the page is cached, verified and has all those sectors.
 */
/* Under c->lock: a client read uses slot s.  The first read of a page
 * that readahead brought in is a prefetch hit (its bytes are added to
 * *used, which may be NULL) and counts for the policy as the page's
 * first access, which its insertion stood for: not as a re-use, or a
 * prefetched scan would look hot to S3-FIFO and flush the hot set.
 * Any other hit is a re-use.
 */
static void
note_use_locked (struct cache *c, uint32_t s, uint32_t n, uint64_t *used)
{
  if (pt_flags (&c->pt, s) & PT_PREFETCHED) {
    pt_flags_off (&c->pt, s, PT_PREFETCHED);
    STATS_ADD (&c->stats, prefetch_hits, 1);
    if (used)
      *used += n;
  }
  else
    evict_touch (c->ev, s);
}

static bool
try_hit (struct cache *c, uint64_t page, uint8_t *dst, uint32_t off,
         uint32_t n, uint64_t *used)
{
  unsigned first, last;
  uint32_t s;
  int r;

  cache_sector_span (c, off, n, &first, &last);
  pthread_mutex_lock (&c->lock);
  s = pagetable_lookup (&c->pt, page);
  if (s == PT_NONE) {
    pthread_mutex_unlock (&c->lock);
    return false;
  }
  if ((pt_flags (&c->pt, s) & (PT_VERIFIED | PT_BAD)) != PT_VERIFIED ||
      !pagetable_range_valid (&c->pt, s, first, last)) {
    pthread_mutex_unlock (&c->lock);
    return false;
  }
  pt_pin (&c->pt, s);
  note_use_locked (c, s, n, used);
  pthread_mutex_unlock (&c->lock);

  r = defer_read_data (&c->defer, &c->pool, s, dst, n, off);
  cache_unpin (c, s);
  if (r == -1) {
    cache_io_error (c, "reading data", s);
    return false;               /* the slow path deals with it */
  }
  return true;
}

/* Would try_hit serve this page?  (A hint only: no pin.) */
static bool
peek_hit (struct cache *c, uint64_t page, uint32_t off, uint32_t n)
{
  unsigned first, last;
  uint32_t s;
  bool r = false;

  cache_sector_span (c, off, n, &first, &last);
  pthread_mutex_lock (&c->lock);
  s = pagetable_lookup (&c->pt, page);
  if (s != PT_NONE)
    r = (pt_flags (&c->pt, s) & (PT_VERIFIED | PT_BAD)) == PT_VERIFIED &&
      pagetable_range_valid (&c->pt, s, first, last);
  pthread_mutex_unlock (&c->lock);
  return r;
}

/* Complete a partly valid page: buf holds the slot's data (read and
 * verified); only the span of sectors that are not valid is read from
 * the backend, and the slot's valid sectors (maybe dirty) win.  The
 * whole page is then stored, all valid.  Consumes the pin on s.
 */
static int
complete_partial (struct cache *c, const struct cache_backend *be,
                  uint64_t page, uint32_t s, uint8_t *buf, int *err)
{
  const uint32_t ss = c->sector_size;
  const uint32_t pbytes = cache_page_bytes (c, page);
  struct pt_slot snap;
  unsigned lo = c->nsectors, hi = 0;
  uint8_t *tmp;
  uint32_t n;

  pthread_mutex_lock (&c->lock);
  pagetable_get (&c->pt, s, &snap);
  pthread_mutex_unlock (&c->lock);
  for (unsigned i = 0; i < c->nsectors; i++)
    if (!layout_bit_test (snap.valid, i)) {
      if (i < lo)
        lo = i;
      hi = i;
    }
  if (lo > hi) {                /* all valid after all */
    cache_unpin (c, s);
    return 0;
  }
  tmp = calloc (hi - lo + 1, ss);
  if (tmp == NULL) {
    cache_unpin (c, s);
    *err = ENOMEM;
    return -1;
  }
  n = lo * ss >= pbytes ? 0
    : ((hi + 1) * ss > pbytes ? pbytes : (hi + 1) * ss) - lo * ss;
  if (n > 0 &&
      be->pread (be->h, tmp, n, page * c->page_size + lo * ss, err) == -1) {
    free (tmp);
    cache_unpin (c, s);
    return -1;
  }
  STATS_ADD (&c->stats, bytes_from_backend, n);
  for (unsigned i = lo; i <= hi; i++)
    if (!layout_bit_test (snap.valid, i))
      memcpy (buf + (size_t) i * ss, tmp + (size_t) (i - lo) * ss, ss);
  free (tmp);
  cache_fill_slot (c, page, s, buf,
                   snap.state == LAYOUT_DIRTY ? snap.dirty : NULL,
                   FILL_COMPLETE);
  return 0;
}

/* How read_slow treats the pages it reads from the backend. */
struct read_opts {
  uint64_t nofill_from;   /* pages from here on are not stored (a long
                             sequential stream past its cutoff) */
  bool promote;           /* a client read miss: n-miss promotion applies */
  bool readahead;         /* a readahead prefetch: pages are marked, and
                             the client counters are left alone */
  bool warm;              /* warm-up (with readahead set: no client
                             counters), but pages are not marked and
                             take free slots only */
  uint64_t *used;         /* client reads: bytes of prefetched pages
                             read for the first time are added here */
  uint64_t max_run;       /* fill_uncached: bytes per backend request */
  bool stop_when_full;    /* fill_uncached: stop when slots run out */
};

/* One read_slow request: [pos, pos+len) into dst (NULL: only
 * store it), as o says; *err gets the errno of a failure.
 */
struct read_req {
  struct cache *c;
  const struct cache_backend *be;
  uint8_t *dst;
  uint64_t pos;
  uint32_t len;
  const struct read_opts *o;
  int *err;
  struct cache_fill_job **behind; /* client misses: jobs to store after
                                     the answer (NULL: store now) */
};

/* A read of bytes [a, b) of a partly valid page (slot s, pinned, whose
 * data is in buf): read from the backend just the sectors [a, b) needs,
 * keep the cached ones (maybe dirty), and store the result in place;
 * buf then holds the answer.  A slot with flushed dirty data may not be
 * rewritten in place: it is completed whole into a copy instead.
 * Consumes the pin.
 */
static int
fill_sectors (const struct read_req *rq, uint64_t page, uint32_t s,
              uint8_t *buf, uint32_t a, uint32_t b)
{
  struct cache *c = rq->c;
  const struct cache_backend *be = rq->be;
  int *err = rq->err;
  const uint32_t ss = c->sector_size;
  const uint32_t pbytes = cache_page_bytes (c, page);
  uint32_t lo = a / ss * ss, hi = (b + ss - 1) / ss * ss, n;
  struct pt_slot snap;
  bool cow;
  int r;

  cache_inplace_enter (c);
  pthread_mutex_lock (&c->lock);
  pagetable_get (&c->pt, s, &snap);
  cow = cache_must_cow (c, s);
  pthread_mutex_unlock (&c->lock);
  if (cow) {
    cache_inplace_leave (c);
    /* The copy needs the whole page (the caller read only [a, b)). */
    if (cache_read_verified (c, be, s, buf) == -1) {
      *err = EIO;
      return -1;
    }
    return complete_partial (c, be, page, s, buf, err);
  }

  n = hi > pbytes ? (lo < pbytes ? pbytes - lo : 0) : hi - lo;
  {
    uint8_t *tmp = calloc (1, hi - lo);
    if (tmp == NULL) {
      *err = ENOMEM;
      r = -1;
      goto out;
    }
    if (n > 0 &&
        be->pread (be->h, tmp, n, page * c->page_size + lo, err) == -1) {
      free (tmp);
      r = -1;
      goto out;
    }
    STATS_ADD (&c->stats, bytes_from_backend, n);
    /* The cache's own sectors win. */
    for (uint32_t i = lo / ss; i < hi / ss; i++)
      if (layout_bit_test (snap.valid, i))
        memcpy (tmp + (i * ss - lo), buf + (size_t) i * ss, ss);
    memcpy (buf + lo, tmp, hi - lo);
    free (tmp);
  }
  r = cache_patch_slot (&(struct page_write) {
                          .c = c, .be = be, .page = page, .src = buf + lo,
                          .off = lo, .n = hi - lo, .kind = W_FILL,
                          .err = err }, s, false);
  cache_inplace_leave (c);
  if (r == PATCH_NO_MAPS) {
    /* The valid sectors would not be one run and the side table is
     * full: round out to the whole page instead (one more backend read
     * of the sectors still missing), which needs no entry.  The answer
     * in buf stays as it is.
     */
    uint8_t *whole = malloc (c->page_size);
    uint32_t s2 = whole ? cache_lookup_pin (c, page) : PT_NONE;
    int e2;

    if (s2 != PT_NONE && cache_read_verified (c, be, s2, whole) == 0)
      complete_partial (c, be, page, s2, whole, &e2);
    free (whole);
    return 0;
  }
  return r == -1 && *err == EIO ? 0 : r;   /* the answer is in buf */
 out:
  cache_unpin (c, s);
  cache_inplace_leave (c);
  return r;
}

/* Under nothing: should a read miss of page be stored (n-miss
 * promotion)?  Counts the miss.
 */
static bool
admit_miss (struct cache *c, uint64_t page)
{
  bool r;

  if (c->nhit == NULL)
    return true;
  pthread_mutex_lock (&c->lock);
  r = admit_nhit_miss (c->nhit, page);
  pthread_mutex_unlock (&c->lock);
  if (!r && ssdcache_debug_verbose)
    log_debug ("read miss page %llu: not cached (promotion after %u misses)",
               (unsigned long long) page, c->promote);
  return r;
}

/* Pass 1 of read_slow for one page: serve it from the cache if it is
 * there (verifying on first use), completing missing sectors from the
 * backend.  Returns 0 if served, 1 if the backend must be read, -1
 * (*err) on error.
 */
static int
slow_cached (const struct read_req *r, uint64_t page, uint8_t *page_buf)
{
  struct cache *c = r->c;
  const struct cache_backend *be = r->be;
  uint8_t *dst = r->dst;
  const uint64_t pos = r->pos;
  const uint32_t len = r->len;
  const struct read_opts *o = r->o;
  int *err = r->err;
  const uint64_t pstart = page * c->page_size;
  uint32_t a, b;
  unsigned sf, sl;
  uint32_t s = cache_lookup_pin (c, page);
  bool ok;

  if (s == PT_NONE) {
    if (!o->readahead)
      STATS_ADD (&c->stats, read_misses, 1);
    return 1;
  }
  cache_page_part (c, page, pos, len, &a, &b);
  cache_sector_span (c, a, b - a, &sf, &sl);
  if (cache_read_verified_span (c, be, s, page_buf, sf, sl) == -1) {
    if (!cache_slot_dropped (c, page, s)) {
      *err = EIO;                /* bad */
      return -1;
    }
    if (!o->readahead)
      STATS_ADD (&c->stats, read_misses, 1);
    return 1;                   /* dropped */
  }
  pthread_mutex_lock (&c->lock);
  ok = pagetable_range_valid (&c->pt, s, sf, sl);
  if (ok && !o->readahead)
    note_use_locked (c, s, b - a, o->used);
  pthread_mutex_unlock (&c->lock);
  if (ok) {
    if (!o->readahead) {
      STATS_ADD (&c->stats, read_hits, 1);
      STATS_ADD (&c->stats, bytes_from_cache, b - a);
    }
    cache_unpin (c, s);
  }
  else {
    STATS_ADD (&c->stats, read_partial, 1);
    if (fill_sectors (r, page, s, page_buf, a, b) == -1)
      return -1;
  }
  if (dst)
    memcpy (dst + (pstart + a - pos), page_buf + a, b - a);
  return 0;
}

/* Should page, read from the backend, be stored as o says?  (Not past
 * the sequential cutoff, nor a miss not promoted yet.)
 */
static bool
slow_admit (struct cache *c, const struct read_opts *o, uint64_t page)
{
  if (page * c->page_size >= o->nofill_from) {
    STATS_ADD (&c->stats, seq_bypassed, 1);   /* a long stream */
    return false;
  }
  if (o->promote && !admit_miss (c, page)) {
    STATS_ADD (&c->stats, promote_skipped, 1);
    return false;
  }
  return true;
}

/* Store page, read from the backend: data holds the page, of which
 * [plo, phi) (backend offsets) was read.  As o says: not at all (past
 * the sequential cutoff, not promoted yet), whole, or only the sectors
 * read (a fresh slot with some sectors valid).
 */
static void
slow_store (struct cache *c, const struct cache_backend *be,
            const struct read_opts *o, uint64_t page, const uint8_t *data,
            uint64_t plo, uint64_t phi)
{
  const uint64_t pstart = page * c->page_size;

  if (!slow_admit (c, o, page))
    return;
  if (plo == pstart && phi >= pstart + cache_page_bytes (c, page))
    cache_fill_slot (c, page, PT_NONE, data, NULL,
                     o->warm ? FILL_WARM
                     : o->readahead ? FILL_PREFETCH : FILL_CLIENT);
  else if (o->warm)
    return;                     /* warm-up stores whole pages only */
  else if (!cache_degraded (c)) {
    uint32_t ns = cache_alloc_slot (c, ALLOC_FILL);
    int e;
    if (ns == PT_NONE)
      STATS_ADD (&c->stats, bypassed, 1);
    else
      cache_patch_slot (&(struct page_write) {
                          .c = c, .be = be, .page = page,
                          .src = data + (plo - pstart), .off = plo - pstart,
                          .n = phi - plo, .kind = W_CLEAN, .err = &e },
                        ns, true);
  }
}

/* A job for the whole pages of the run [pf, pf+n) held in bounce (NULL
 * if the run is not a client's or memory is short: it is stored now).
 */
static struct cache_fill_job *
behind_job_new (const struct read_req *r, uint64_t pf, uint64_t n,
                uint8_t *bounce)
{
  struct cache_fill_job *job;

  if (r->behind == NULL || r->dst == NULL || n > UINT32_MAX)
    return NULL;
  job = calloc (1, sizeof *job + n * sizeof job->store[0]);
  if (job == NULL)
    return NULL;
  job->first = pf;
  job->n = n;
  job->data = bounce;
  return job;
}

/* Keep job for after the answer if it stores anything (it then owns its
 * data: true); else free it, but not its data (false).
 */
static bool
behind_job_keep (const struct read_req *r, struct cache_fill_job *job)
{
  for (uint32_t i = 0; i < job->n; i++)
    if (job->store[i]) {
      job->next = *r->behind;
      *r->behind = job;
      return true;
    }
  free (job);
  return false;
}

/* Count the pages of [pf, pl] that would be stored as dropped: no room
 * behind (the fill cannot keep up) or no memory.
 */
static void
behind_drop_run (const struct read_req *r, uint64_t pf, uint64_t pl)
{
  for (uint64_t page = pf; page <= pl; page++)
    if (slow_admit (r->c, r->o, page))
      STATS_ADD (&r->c->stats, fills_behind_dropped, 1);
}

/* slow_run for a client's miss of pages wholly inside its request,
 * with fill behind: the backend reads straight into the client's
 * buffer, and the pages to store are copied from there into a job if
 * the fill-behind queue has room for them (else they go around the
 * cache, with no copy at all).
 */
static int
slow_run_direct (const struct read_req *r, uint64_t pf, uint64_t pl,
                 uint64_t run_start, uint64_t run_end)
{
  struct cache *c = r->c;
  const uint32_t ps = c->page_size;
  const uint64_t n = pl - pf + 1;
  uint8_t *src = r->dst + (run_start - r->pos);
  struct cache_fill_job *job = NULL;
  uint8_t *data = NULL;

  if (r->be->pread (r->be->h, src, run_end - run_start, run_start,
                    r->err) == -1)
    return -1;
  STATS_ADD (&c->stats, bytes_from_backend, run_end - run_start);
  if (c->hooks.fill_behind_room && c->hooks.fill_behind_room (c, n * ps) &&
      (data = malloc (n * ps)) != NULL)
    job = behind_job_new (r, pf, n, data);
  if (job == NULL) {
    free (data);
    behind_drop_run (r, pf, pl);
    return 0;
  }
  for (uint64_t i = 0; i < n; i++) {
    const uint32_t pb = cache_page_bytes (c, pf + i);
    if ((job->store[i] = slow_admit (c, r->o, pf + i))) {
      memcpy (data + i * ps, src + i * ps, pb);
      memset (data + i * ps + pb, 0, ps - pb);
    }
  }
  if (!behind_job_keep (r, job))
    free (data);
  return 0;
}

/* Pass 2 of read_slow for the run of pages [pf, pl] not served: one
 * backend read, then each page stored and copied out.
 */
static int
slow_run (const struct read_req *r, uint64_t pf, uint64_t pl)
{
  struct cache *c = r->c;
  const uint64_t pos = r->pos;
  const uint32_t len = r->len;
  const uint32_t ps = c->page_size, ss = c->sector_size;
  uint64_t run_start = pf * ps, run_end = (pl + 1) * ps;
  uint64_t read_lo, read_hi;
  uint8_t *bounce;
  struct cache_fill_job *job;

  if (run_end > c->backend_size)
    run_end = c->backend_size;
  if (r->behind && r->dst && run_start >= pos && run_end <= pos + len)
    return slow_run_direct (r, pf, pl, run_start, run_end);
  /* A miss reads only the sectors asked for, not the whole page: never
   * more backend traffic than the client's own request needs.  (Pages
   * in the middle of a long request are read whole.)
   */
  read_lo = run_start;
  read_hi = run_end;
  if (pos > run_start)
    read_lo = pos / ss * ss;
  if (pos + len < run_end) {
    read_hi = (pos + len + ss - 1) / ss * ss;
    if (read_hi > run_end)
      read_hi = run_end;
  }

  bounce = malloc ((pl - pf + 1) * ps);
  if (bounce == NULL) {
    *r->err = ENOMEM;
    return -1;
  }
  /* Zeroes where nothing is read (past the backend's end, a page is
   * stored with zeroes): cheaper than calloc's zeroing of it all.
   */
  memset (bounce, 0, read_lo - run_start);
  memset (bounce + (read_hi - run_start), 0,
          (pl - pf + 1) * ps - (read_hi - run_start));
  if (r->be->pread (r->be->h, bounce + (read_lo - run_start),
                    read_hi - read_lo, read_lo, r->err) == -1) {
    free (bounce);
    return -1;
  }
  STATS_ADD (&c->stats, bytes_from_backend, read_hi - read_lo);

  job = behind_job_new (r, pf, pl - pf + 1, bounce);
  for (uint64_t page = pf; page <= pl; page++) {
    uint64_t pstart = page * ps;
    uint8_t *data = bounce + (page - pf) * ps;
    uint64_t plo = read_lo > pstart ? read_lo : pstart;
    uint64_t phi = read_hi < pstart + ps ? read_hi : pstart + ps;
    uint32_t a, b;

    if (job && plo == pstart && phi >= pstart + cache_page_bytes (c, page))
      job->store[page - pf] = slow_admit (c, r->o, page);
    else
      slow_store (c, r->be, r->o, page, data, plo, phi);
    cache_page_part (c, page, pos, len, &a, &b);
    if (r->dst)
      memcpy (r->dst + (pstart + a - pos), data + a, b - a);
  }
  if (job == NULL || !behind_job_keep (r, job))
    free (bounce);
  return 0;
}

/* After the answer: hand each job to the fill-behind thread, stamped
 * with t (the range lock's clock when its pages were released).
 */
static void
behind_hand_over (struct cache *c, struct cache_fill_job *jobs, uint64_t t)
{
  while (jobs) {
    struct cache_fill_job *job = jobs;
    jobs = job->next;
    job->stamp = t;
    if (c->hooks.fill_behind == NULL || !c->hooks.fill_behind (c, job))
      cache_fill_job_drop (c, job);
  }
}

/* Misses of at least this many bytes are stored behind their answer
 * (with a fill-behind thread running).  A smaller one is bound by the
 * backend's latency, not by the store, and stays visible to the next
 * reader as soon as it returns.
 */
#define READ_BEHIND_MIN (256u << 10)

/* Read [pos, pos+len) (dst may be NULL: only store) with the pages
 * range locked: serve what is cached, read the rest from the backend in
 * as few requests as possible and store it (as o says).
 */
static int
read_slow (struct cache *c, const struct cache_backend *be, uint8_t *dst,
           uint64_t pos, uint32_t len, const struct read_opts *o, int *err)
{
  const uint32_t ps = c->page_size;
  const uint64_t first = pos / ps, last = (pos + len - 1) / ps;
  const uint64_t np = last - first + 1;
  struct cache_fill_job *jobs = NULL;
  const struct read_req req = { .c = c, .be = be, .dst = dst, .pos = pos,
                                .len = len, .o = o, .err = err,
                                .behind = o->promote && c->hooks.fill_behind
                                && len >= READ_BEHIND_MIN ? &jobs : NULL };
  bool *need = calloc (np, sizeof *need);
  uint8_t *page_buf = malloc (ps);
  int ret = -1;

  if (need == NULL || page_buf == NULL) {
    *err = ENOMEM;
    goto out_free;
  }
  if (rangelock_acquire (&c->ranges, first, last) == -1) {
    *err = errno;
    goto out_free;
  }

  /* Pass 1: serve what the cache has. */
  for (uint64_t i = 0; i < np; i++) {
    int r = slow_cached (&req, first + i, page_buf);
    if (r == -1)
      goto out;
    need[i] = r == 1;
  }

  /* Pass 2: runs of needed pages, one backend read per run. */
  for (uint64_t i = 0; i < np;) {
    uint64_t j;

    if (!need[i]) {
      i++;
      continue;
    }
    for (j = i; j + 1 < np && need[j + 1]; j++)
      ;
    if (slow_run (&req, first + i, first + j) == -1)
      goto out;
    i = j + 1;
  }
  ret = 0;

 out:
  {
    /* A read changes no page's data: a later change is stamped after t. */
    uint64_t t = rangelock_release_unchanged (&c->ranges, first, last);
    if (jobs)
      behind_hand_over (c, jobs, t);
  }
 out_free:
  free (need);
  free (page_buf);
  return ret;
}

int
cache_read (struct cache *c, const struct cache_backend *be,
            void *buf, uint32_t count, uint64_t offset, int *err)
{
  return cache_read_conn (c, be, NULL, buf, count, offset, err);
}

int
cache_read_conn (struct cache *c, const struct cache_backend *be,
                 struct prefetch_conn *pc, void *buf, uint32_t count,
                 uint64_t offset, int *err)
{
  const uint32_t ps = c->page_size;
  const uint64_t end = offset + count;
  uint8_t *dst = buf;
  uint64_t pos = offset, nofill_from = UINT64_MAX, used = 0;
  uint64_t fill_limit = UINT64_MAX;   /* readahead stops there */
  struct read_opts o = { .promote = true, .used = &used };

  STATS_ADD (&c->stats, read_ops, 1);
  cache_touch_io (c);
  if (c->seqcut) {
    /* Sequential cutoff: past it, a long stream's misses are read from
     * the backend without filling the cache (hits are still served).
     */
    pthread_mutex_lock (&c->lock);
    nofill_from = offset + admit_seq_access (c->seqcut, offset, count);
    fill_limit = admit_seq_left (c->seqcut, end);
    fill_limit = fill_limit > UINT64_MAX - end ? UINT64_MAX : end + fill_limit;
    if (nofill_from < end)
      fill_limit = nofill_from;
    pthread_mutex_unlock (&c->lock);
    /* The page holding the boundary is still admitted. */
    nofill_from = (nofill_from + ps - 1) / ps * ps;
  }
  o.nofill_from = nofill_from;
  while (pos < end) {
    uint64_t page = pos / ps, run_end;
    uint32_t off = pos % ps;
    uint32_t n = end - pos < ps - off ? end - pos : ps - off;

    if (cache_degraded (c) && !cache_page_dirty (c, page)) {
      /* Pass-through, but for pages whose newest data is in the cache. */
      run_end = (page + 1) * ps;
      while (run_end < end && !cache_page_dirty (c, run_end / ps))
        run_end += ps;
      if (run_end > end)
        run_end = end;
      if (be->pread (be->h, dst + (pos - offset), run_end - pos, pos,
                     err) == -1)
        return -1;
      STATS_ADD (&c->stats, bytes_from_backend, run_end - pos);
      pos = run_end;
      continue;
    }

    if (try_hit (c, page, dst + (pos - offset), off, n, &used)) {
      STATS_ADD (&c->stats, read_hits, 1);
      STATS_ADD (&c->stats, bytes_from_cache, n);
      pos += n;
      continue;
    }
    /* Gather the following pages that are not hits either. */
    run_end = (page + 1) * ps;
    while (run_end < end) {
      uint32_t m = end - run_end < ps ? end - run_end : ps;
      if (peek_hit (c, run_end / ps, 0, m))
        break;
      run_end += ps;
    }
    if (run_end > end)
      run_end = end;
    if (read_slow (c, be, dst + (pos - offset), pos, run_end - pos,
                   &o, err) == -1)
      return -1;
    pos = run_end;
  }
  /* Readahead learns from every read (never waits for its prefetch). */
  if (pc && c->hooks.readahead_note_read)
    c->hooks.readahead_note_read (c, pc, offset, count, used, fill_limit);
  return 0;
}

int
cache_preload (struct cache *c, const struct cache_backend *be,
               uint32_t count, uint64_t offset, int *err)
{
  struct read_opts o = { .nofill_from = UINT64_MAX };

  if (count == 0 || cache_degraded (c))
    return 0;
  cache_touch_io (c);
  return read_slow (c, be, NULL, offset, count, &o, err);
}

/* Read the pages of [offset, offset+len) that are not cached into the
 * cache as o says (readahead or warm-up), one backend request per run
 * of such pages of at most o->max_run bytes.  *read (if not NULL) gets
 * the bytes read.  With o->stop_when_full, stops before a run when
 * fewer slots than its pages are free, returning 1.  Returns 0, 1 or
 * -1 (*err).
 */
static int
fill_uncached (struct cache *c, const struct cache_backend *be,
               uint64_t offset, uint64_t len, const struct read_opts *o,
               uint64_t *read, int *err)
{
  const uint32_t ps = c->page_size;
  const uint64_t max_run = o->max_run;
  const bool stop_when_full = o->stop_when_full;
  uint64_t page, last;

  if (read)
    *read = 0;
  if (len == 0 || offset >= c->backend_size)
    return 0;
  if (len > c->backend_size - offset)
    len = c->backend_size - offset;
  page = offset / ps;
  last = (offset + len - 1) / ps;
  /* Runs of pages not cached (cached pages are never read again). */
  while (page <= last) {
    uint64_t run_end, lo, hi, room = UINT64_MAX;

    if (cache_degraded (c))
      return 0;
    if (stop_when_full && (room = cache_free_slots (c)) == 0)
      return 1;
    pthread_mutex_lock (&c->lock);
    while (page <= last && pagetable_lookup (&c->pt, page) != PT_NONE)
      page++;
    run_end = page;
    while (run_end <= last && run_end - page < max_run / ps &&
           run_end - page < room &&
           pagetable_lookup (&c->pt, run_end) == PT_NONE)
      run_end++;
    pthread_mutex_unlock (&c->lock);
    if (page > last)
      break;
    lo = page * ps;
    hi = run_end * ps;
    if (hi > c->backend_size)
      hi = c->backend_size;
    if (o->readahead && !o->warm) {
      STATS_ADD (&c->stats, prefetch_requests, 1);
      if (ssdcache_debug_readahead)
        log_debug ("readahead: prefetch %llu bytes at %llu (pages "
                   "%llu-%llu)", (unsigned long long) (hi - lo),
                   (unsigned long long) lo, (unsigned long long) page,
                   (unsigned long long) run_end - 1);
    }
    if (read_slow (c, be, NULL, lo, hi - lo, o, err) == -1)
      return -1;
    if (read)
      *read += hi - lo;
    page = run_end;
  }
  return 0;
}

int
cache_prefetch_fill (struct cache *c, const struct cache_backend *be,
                      uint64_t offset, uint64_t len, int *err)
{
  struct read_opts o = { .nofill_from = UINT64_MAX, .readahead = true,
                         .max_run = 32u << 20 };

  return fill_uncached (c, be, offset, len, &o, NULL, err);
}

int
cache_warm_fill (struct cache *c, const struct cache_backend *be,
                 uint64_t offset, uint64_t len, uint64_t *read, int *err)
{
  struct read_opts o = { .nofill_from = UINT64_MAX, .readahead = true,
                         .warm = true, .max_run = 4u << 20,
                         .stop_when_full = true };

  return fill_uncached (c, be, offset, len, &o, read, err);
}

bool
cache_range_dirty (struct cache *c, uint64_t offset, uint64_t count,
                   uint64_t *run_end)
{
  const uint32_t ps = c->page_size;
  uint64_t page = offset / ps, end = offset + count;
  bool first_dirty = false;

  pthread_mutex_lock (&c->lock);
  for (uint64_t pos = offset; pos < end; page++) {
    uint32_t s = c->ndirty ? pagetable_lookup (&c->pt, page) : PT_NONE;
    bool d = s != PT_NONE && pt_state (&c->pt, s) == LAYOUT_DIRTY;

    if (pos == offset)
      first_dirty = d;
    else if (d != first_dirty)
      break;
    pos = (page + 1) * ps;
    *run_end = pos < end ? pos : end;
  }
  pthread_mutex_unlock (&c->lock);
  return first_dirty;
}

void
cache_readahead_config (const struct cache *c, struct readahead_config *cfg)
{
  /* Never more ahead than a quarter of the cache: it would evict
   * itself before being read.
   */
  const uint64_t quarter = (uint64_t) c->nslots * c->page_size / 4;

  *cfg = (struct readahead_config) {
    .mode = c->readahead_mode,
    .window = c->readahead_window,
    .min = READAHEAD_MIN_WINDOW,
    .max = c->readahead_max,
    .page_size = c->page_size,
    .size = c->backend_size,
  };
  if (cfg->max > quarter)
    cfg->max = quarter;
  if (cfg->window > quarter)
    cfg->window = quarter;
  if (cfg->min > cfg->max)
    cfg->min = cfg->max;
}
