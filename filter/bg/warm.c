/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: warm-up (ssdcache-warm=all).
 *
 * Owns struct warm and its thread: it reads the backend from start to
 * end, in requests of up to WARM_CHUNK, into free slots of the cache
 * (engine/read.c: cache_warm_fill skips pages already cached and never
 * evicts).  Clients come first: it yields while a client request has
 * arrived in the last WARM_YIELD_MS, so a client never waits behind
 * more than one warm-up request.  It keeps to ssdcache-warm-rate.  Its
 * progress is the page table itself: after a restart (or a crash) the
 * pages warmed are cached, and the next run passes over them without
 * reading the backend.  It stops when the cache has no free slot left
 * (once, with a message) or at the end of the backend.
 *
 * Locks: w->lock (the stop flag, cond wake; never held across I/O, no
 * engine lock under it).  The engine reaches it through c->hooks.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache.h"
#include "log.h"
#include "warm.h"

#define WARM_CHUNK (4u << 20)
#define WARM_YIELD_MS 50         /* a client this recent: wait */
#define WARM_RATE_WINDOW_MS 1000 /* warm_bytes_per_second's window */

struct warm {
  struct cache *c;
  struct cache_backend be;
  uint64_t rate;                 /* bytes per second, 0: no limit */
  pthread_t thread;
  bool started;

  pthread_mutex_t lock;
  pthread_cond_t wake;
  bool stop;
};

/* Sleep up to ms, or until stopped; true if stopped. */
static bool
warm_nap (struct warm *w, uint64_t ms)
{
  struct timespec ts;
  bool stop;

  clock_gettime (CLOCK_REALTIME, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (ms % 1000) * 1000000;
  if (ts.tv_nsec >= 1000000000) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000;
  }
  pthread_mutex_lock (&w->lock);
  if (!w->stop)
    pthread_cond_timedwait (&w->wake, &w->lock, &ts);
  stop = w->stop;
  pthread_mutex_unlock (&w->lock);
  return stop;
}

/* Wait while clients are busy; true if stopped meanwhile. */
static bool
warm_yield (struct warm *w)
{
  for (;;) {
    uint64_t since = cache_now_ms () - cache_last_io_ms (w->c);
    if (since >= WARM_YIELD_MS)
      return false;
    if (warm_nap (w, WARM_YIELD_MS - since))
      return true;
  }
}

/* The counters of progress: pos of the backend passed, bytes read
 * since mark_ms (the rate window).
 */
static void
warm_note (struct warm *w, uint64_t pos, uint64_t *mark_ms,
           uint64_t *mark_bytes)
{
  struct stats *st = cache_stats (w->c);
  uint64_t now = cache_now_ms (), bytes = STATS_GET (st, warm_bytes);

  atomic_store (&st->warm_progress_pct,
                cache_backend_size (w->c) ? pos * 100 / cache_backend_size (w->c) : 100);
  if (now - *mark_ms >= WARM_RATE_WINDOW_MS) {
    atomic_store (&st->warm_bytes_per_second,
                  (bytes - *mark_bytes) * 1000 / (now - *mark_ms));
    *mark_ms = now;
    *mark_bytes = bytes;
  }
}

static void *
warm_thread (void *arg)
{
  struct warm *w = arg;
  struct cache *c = w->c;
  uint64_t pos = 0, start_ms = cache_now_ms (), read_total = 0;
  uint64_t mark_ms = start_ms, mark_bytes = STATS_GET (cache_stats (c), warm_bytes);

  while (pos < cache_backend_size (c)) {
    uint64_t len = cache_backend_size (c) - pos < WARM_CHUNK
      ? cache_backend_size (c) - pos : WARM_CHUNK, got = 0;
    int err = 0, r;

    if (warm_yield (w))
      return NULL;
    r = cache_warm_fill (c, &w->be, pos, len, &got, &err);
    STATS_ADD (cache_stats (c), warm_bytes, got);
    read_total += got;
    if (r == 1) {
      atomic_store (&cache_stats (c)->warm_full, 1);
      log_debug ("warm: the cache is full: %llu of %llu bytes passed, "
                 "warm-up stops", (unsigned long long) pos,
                 (unsigned long long) cache_backend_size (c));
      warm_note (w, pos, &mark_ms, &mark_bytes);
      return NULL;
    }
    if (r == -1) {
      errno = err;
      if (ssdcache_debug_warm)
        log_debug ("warm: reading %llu bytes at %llu failed: %m; "
                   "retrying later", (unsigned long long) len,
                   (unsigned long long) pos);
      if (warm_nap (w, 1000))
        return NULL;
      continue;
    }
    if (ssdcache_debug_warm && got)
      log_debug ("warm: %llu bytes read at %llu", (unsigned long long) got,
                 (unsigned long long) pos);
    pos += len;
    warm_note (w, pos, &mark_ms, &mark_bytes);
    if (w->rate) {
      uint64_t want = read_total * 1000 / w->rate;
      uint64_t took = cache_now_ms () - start_ms;
      if (want > took && warm_nap (w, want - took))
        return NULL;
    }
  }
  atomic_store (&cache_stats (c)->warm_bytes_per_second, 0);
  log_debug ("warm: done, %llu bytes read from the backend",
             (unsigned long long) read_total);
  return NULL;
}

int
warm_start (struct cache *c, const struct cache_backend *be, uint64_t rate)
{
  struct warm *w = calloc (1, sizeof *w);
  int r;

  if (w == NULL) {
    log_error ("calloc: %m");
    return -1;
  }
  w->c = c;
  w->be = *be;
  w->rate = rate;
  pthread_mutex_init (&w->lock, NULL);
  pthread_cond_init (&w->wake, NULL);
  cache_bg_set (c, CACHE_BG_WARM, w);
  cache_hooks (c)->warm_stop = warm_stop;
  r = pthread_create (&w->thread, NULL, warm_thread, w);
  if (r != 0) {
    errno = r;
    log_error ("cannot start the warm-up thread: %m");
    cache_hooks (c)->warm_stop = NULL;
    cache_bg_set (c, CACHE_BG_WARM, NULL);
    free (w);
    return -1;
  }
  w->started = true;
  return 0;
}

void
warm_stop (struct cache *c)
{
  struct warm *w = cache_bg_get (c, CACHE_BG_WARM);

  if (w == NULL)
    return;
  pthread_mutex_lock (&w->lock);
  w->stop = true;
  pthread_cond_broadcast (&w->wake);
  pthread_mutex_unlock (&w->lock);
  if (w->started)
    pthread_join (w->thread, NULL);
  cache_hooks (c)->warm_stop = NULL;
  cache_bg_set (c, CACHE_BG_WARM, NULL);
  pthread_mutex_destroy (&w->lock);
  pthread_cond_destroy (&w->wake);
  free (w);
}

bool
warm_running (struct cache *c)
{
  return cache_bg_get (c, CACHE_BG_WARM) != NULL;
}
