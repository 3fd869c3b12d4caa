/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: prefetch, the threads that run readahead's reads.
 *
 * Owns struct prefetch and its worker threads, and struct prefetch_conn;
 * see prefetch.h for what each lock protects.  The workers take ranges
 * from a small FIFO queue in pieces of at most PREFETCH_PIECE bytes, so
 * that up to PREFETCH_WORKERS backend reads of one stream are in flight
 * at once (cache_prefetch_fill: one backend read per run of pages not
 * cached).  A range that overlaps one queued or being read is trimmed;
 * when the queue is full the new range is dropped and its stream asks
 * again.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "log.h"
#include "prefetch.h"
#include "readahead.h"

#define PREFETCH_QUEUE 32                     /* ranges waiting */
#define PREFETCH_PIECE (1u << 20)             /* bytes a worker reads */
#define PREFETCH_WORKERS 4                    /* pieces read at once */
#define PREFETCH_CLIENT_DEEP (1u << 20)       /* a connection with more
                                                 reads in flight than this
                                                 hides the latency itself */

struct prefetch_range {
  uint64_t lo, hi;
};

struct prefetch {
  struct cache *c;
  struct cache_backend be;
  pthread_t thread[PREFETCH_WORKERS];
  unsigned nthreads;

  pthread_mutex_t lock;
  pthread_cond_t wake, idle;
  bool stop;
  struct prefetch_range q[PREFETCH_QUEUE];
  unsigned head, n;                     /* FIFO: q[head], ... */
  struct prefetch_range busy[PREFETCH_WORKERS]; /* being read (lo == hi:
                                                   none) */
  unsigned nbusy;
};

struct prefetch_conn {
  pthread_mutex_t lock;
  struct readahead *ra;
  uint64_t wasted_seen;                 /* prefetch_wasted when last looked */
  _Atomic uint64_t inflight;            /* bytes of client reads under way
                                           (no lock) */
};

struct prefetch_worker {
  struct prefetch *pf;
  unsigned id;
};

/* Under pf->lock: cut the next piece off the range at the head of the
 * queue, whole pages (the range leaves the queue with its last piece).
 */
static struct prefetch_range
next_piece_locked (struct prefetch *pf)
{
  const uint64_t ps = cache_page_size (pf->c);
  struct prefetch_range *r = &pf->q[pf->head];
  struct prefetch_range piece = *r;

  if (piece.hi - piece.lo > PREFETCH_PIECE)
    piece.hi = (piece.lo + PREFETCH_PIECE + ps - 1) / ps * ps;
  if (piece.hi > r->hi)
    piece.hi = r->hi;
  r->lo = piece.hi;
  if (r->lo >= r->hi) {
    pf->head = (pf->head + 1) % PREFETCH_QUEUE;
    pf->n--;
  }
  return piece;
}

/* Read one piece into the cache (pf->lock not held). */
static void
read_piece (struct prefetch *pf, struct prefetch_range r)
{
  int err = 0;

  if (cache_prefetch_fill (pf->c, &pf->be, r.lo, r.hi - r.lo, &err) == -1 &&
      ssdcache_debug_readahead)
    /* The client's own read will meet the error if it persists. */
    log_debug ("readahead: prefetch at %llu failed: %s",
               (unsigned long long) r.lo, strerror (err));
}

static void *
prefetch_thread (void *arg)
{
  struct prefetch_worker *w = arg;
  struct prefetch *pf = w->pf;
  const unsigned id = w->id;

  free (w);
  pthread_mutex_lock (&pf->lock);
  for (;;) {
    while (!pf->stop && pf->n == 0)
      pthread_cond_wait (&pf->wake, &pf->lock);
    if (pf->stop)
      break;
    struct prefetch_range piece = next_piece_locked (pf);
    pf->busy[id] = piece;
    pf->nbusy++;
    if (pf->n > 0)
      pthread_cond_signal (&pf->wake);  /* the next piece, to another */
    pthread_mutex_unlock (&pf->lock);

    read_piece (pf, piece);

    pthread_mutex_lock (&pf->lock);
    pf->busy[id].lo = pf->busy[id].hi = 0;
    pf->nbusy--;
    if (pf->n == 0 && pf->nbusy == 0)
      pthread_cond_broadcast (&pf->idle);
  }
  pthread_mutex_unlock (&pf->lock);
  return NULL;
}

/* Start the workers; false (none left running) if the first fails. */
static bool
start_workers (struct prefetch *pf)
{
  for (unsigned i = 0; i < PREFETCH_WORKERS; i++) {
    struct prefetch_worker *w = malloc (sizeof *w);
    int r = w ? 0 : ENOMEM;

    if (w) {
      *w = (struct prefetch_worker) { .pf = pf, .id = i };
      r = pthread_create (&pf->thread[i], NULL, prefetch_thread, w);
      if (r != 0)
        free (w);
    }
    if (r != 0) {
      errno = r;
      log_error ("cannot start readahead thread %u: %m", i + 1);
      break;
    }
    pf->nthreads++;
  }
  return pf->nthreads > 0;
}

int
prefetch_start (struct cache *c, const struct cache_backend *be)
{
  struct prefetch *pf;
  struct readahead_config cfg;

  cache_readahead_config (c, &cfg);
  if (cfg.mode == READAHEAD_OFF)
    return 0;
  pf = calloc (1, sizeof *pf);
  if (pf == NULL) {
    log_error ("calloc: %m");
    return -1;
  }
  pf->c = c;
  pf->be = *be;
  pthread_mutex_init (&pf->lock, NULL);
  pthread_cond_init (&pf->wake, NULL);
  pthread_cond_init (&pf->idle, NULL);
  if (!start_workers (pf)) {
    pthread_mutex_destroy (&pf->lock);
    pthread_cond_destroy (&pf->wake);
    pthread_cond_destroy (&pf->idle);
    free (pf);
    return -1;
  }
  cache_bg_set (c, CACHE_BG_READAHEAD, pf);
  cache_hooks (c)->readahead_note_read = prefetch_note_read;
  cache_hooks (c)->readahead_stop = prefetch_stop;
  return 0;
}

void
prefetch_stop (struct cache *c)
{
  struct prefetch *pf = cache_bg_get (c, CACHE_BG_READAHEAD);

  if (pf == NULL)
    return;
  pthread_mutex_lock (&pf->lock);
  pf->stop = true;
  pf->n = 0;
  pthread_cond_broadcast (&pf->wake);
  pthread_cond_broadcast (&pf->idle);
  pthread_mutex_unlock (&pf->lock);
  for (unsigned i = 0; i < pf->nthreads; i++)
    pthread_join (pf->thread[i], NULL);
  cache_hooks (c)->readahead_note_read = NULL;
  cache_hooks (c)->readahead_stop = NULL;
  cache_bg_set (c, CACHE_BG_READAHEAD, NULL);
  pthread_mutex_destroy (&pf->lock);
  pthread_cond_destroy (&pf->wake);
  pthread_cond_destroy (&pf->idle);
  free (pf);
}

void
prefetch_drain (struct cache *c)
{
  struct prefetch *pf = cache_bg_get (c, CACHE_BG_READAHEAD);

  if (pf == NULL)
    return;
  pthread_mutex_lock (&pf->lock);
  while (!pf->stop && (pf->n > 0 || pf->nbusy > 0))
    pthread_cond_wait (&pf->idle, &pf->lock);
  pthread_mutex_unlock (&pf->lock);
}

void
prefetch_read_begin (struct prefetch_conn *pc, uint32_t count)
{
  if (pc)
    atomic_fetch_add (&pc->inflight, count);
}

void
prefetch_read_end (struct prefetch_conn *pc, uint32_t count)
{
  if (pc)
    atomic_fetch_sub (&pc->inflight, count);
}

struct prefetch_conn *
prefetch_conn_new (struct cache *c)
{
  struct prefetch_conn *pc;
  struct readahead_config cfg;

  if (cache_bg_get (c, CACHE_BG_READAHEAD) == NULL)
    return NULL;
  cache_readahead_config (c, &cfg);
  pc = calloc (1, sizeof *pc);
  if (pc == NULL)
    return NULL;
  pc->ra = readahead_new (&cfg);
  if (pc->ra == NULL) {
    free (pc);
    return NULL;
  }
  pthread_mutex_init (&pc->lock, NULL);
  pc->wasted_seen = STATS_GET (cache_stats (c), prefetch_wasted);
  return pc;
}

void
prefetch_conn_free (struct prefetch_conn *pc)
{
  if (pc == NULL)
    return;
  if (ssdcache_debug_readahead) {
    struct readahead_stats st;
    readahead_get_stats (pc->ra, &st);
    log_debug ("readahead: connection done: %llu reads, %llu sequential, "
               "%llu prefetches (%llu bytes), window grown %llu times, "
               "shrunk %llu times, %llu bytes left unread",
               (unsigned long long) st.reads,
               (unsigned long long) st.sequential,
               (unsigned long long) st.issued,
               (unsigned long long) st.issued_bytes,
               (unsigned long long) st.grows,
               (unsigned long long) st.shrinks,
               (unsigned long long) st.unread_bytes);
  }
  readahead_free (pc->ra);
  pthread_mutex_destroy (&pc->lock);
  free (pc);
}

/* Under pf->lock: does o cut r?  Trims r's ends that o covers; true
 * if o covers all of r.
 */
static bool
trim_by (const struct prefetch_range *o, struct prefetch_range *r)
{
  if (o->lo >= o->hi || o->hi <= r->lo || o->lo >= r->hi)
    return false;
  if (o->lo <= r->lo && o->hi >= r->hi)
    return true;                /* wholly covered */
  if (o->lo <= r->lo)
    r->lo = o->hi;              /* covered at the start */
  else if (o->hi >= r->hi)
    r->hi = o->lo;              /* covered at the end */
  /* (a hole in the middle: both are read; cached pages are skipped) */
  return false;
}

/* Under pf->lock: cut from r what is queued or being read already.
 * Returns false if nothing is left.
 */
static bool
trim_locked (const struct prefetch *pf, struct prefetch_range *r)
{
  for (unsigned i = 0; i < pf->n; i++)
    if (trim_by (&pf->q[(pf->head + i) % PREFETCH_QUEUE], r))
      return false;
  for (unsigned i = 0; i < pf->nthreads; i++)
    if (trim_by (&pf->busy[i], r))
      return false;
  return r->lo < r->hi;
}

/* Queue r; false if the queue is full or the thread stopped. */
static bool
enqueue (struct prefetch *pf, struct prefetch_range r)
{
  bool ok = true;

  pthread_mutex_lock (&pf->lock);
  if (pf->stop || pf->n == PREFETCH_QUEUE)
    ok = false;
  else if (trim_locked (pf, &r)) {
    pf->q[(pf->head + pf->n) % PREFETCH_QUEUE] = r;
    pf->n++;
    pthread_cond_signal (&pf->wake);
  }
  pthread_mutex_unlock (&pf->lock);
  return ok;
}

void
prefetch_note_read (struct cache *c, struct prefetch_conn *pc,
                    uint64_t offset, uint32_t count, uint64_t used,
                    uint64_t fill_limit)
{
  struct readahead_io io;
  uint64_t wasted;
  bool go;

  if (cache_bg_get (c, CACHE_BG_READAHEAD) == NULL || cache_degraded (c))
    return;
  pthread_mutex_lock (&pc->lock);
  wasted = STATS_GET (cache_stats (c), prefetch_wasted);
  if (wasted != pc->wasted_seen) {
    if (ssdcache_debug_readahead)
      log_debug ("readahead: %llu prefetched pages wasted: smaller windows",
                 (unsigned long long) (wasted - pc->wasted_seen));
    readahead_wasted (pc->ra, wasted - pc->wasted_seen);
    pc->wasted_seen = wasted;
  }
  go = readahead_access (pc->ra, offset, count, used, &io);
  if (go && (io.offset + io.len > fill_limit ||
             atomic_load (&pc->inflight) > PREFETCH_CLIENT_DEEP)) {
    /* Past the sequential cutoff nothing of this stream is cached:
     * prefetching there would defeat it.  A client with more than
     * PREFETCH_CLIENT_DEEP bytes of reads in flight keeps the backend
     * busy by itself: a prefetch would only add a copy of each byte
     * (into the cache file, then out of it).
     */
    readahead_cancel (pc->ra, &io);
    go = false;
  }
  if (go) {
    struct prefetch_range r = { io.offset, io.offset + io.len };
    if (ssdcache_debug_readahead)
      log_debug ("readahead: read %u at %llu: queue %llu bytes at %llu "
                 "(window %llu)", count, (unsigned long long) offset,
                 (unsigned long long) io.len,
                 (unsigned long long) io.offset,
                 (unsigned long long) io.window);
    if (!enqueue (cache_bg_get (c, CACHE_BG_READAHEAD), r))
      readahead_cancel (pc->ra, &io);
  }
  pthread_mutex_unlock (&pc->lock);
}
