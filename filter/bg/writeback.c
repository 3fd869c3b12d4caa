/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the writeback thread.
 *
 * Owns struct writeback and its thread: when to clean and how much
 * (the watermarks, idle cleaning, a writer that found no slot, a full
 * pass a flush asks for) and the adaptive hot window.  The cleaning
 * itself is the engine's (engine/clean.c: clean_pass).  The engine
 * wakes the thread through the hooks writeback_start sets (c->hooks).
 * Locks: the lock table in docs/design.md (wb->lock, wb_ptr_lock).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache.h"
#include "log.h"
#include "writeback.h"

#define WB_POLL_MS 100
#define WB_RETRY_MS 100         /* after a failed pass (failed runs wait
                                   longer: engine/clean.c's backoff) */
#define WB_HOT_MS 1000          /* a page changed this recently is hot */
#define WB_HOT_MAX_MS 32000     /* ... at most this (adaptive window) */
#define WB_SAMPLE 256           /* cleaned pages checked per window */
#define WB_SAMPLE_MIN 16        /* fewer tell nothing */
#define WB_AGE_MARKS 64         /* (time, change stamp) marks for the age limit */
#define WB_AGE_CHECK_MS 1000    /* how often old pages are looked for */

struct writeback {
  struct cache *c;
  struct cache_backend be;
  pthread_t thread;
  bool started;
  unsigned users;               /* callers inside (wb_ptr_lock) */

  pthread_mutex_t lock;
  pthread_cond_t wake, done;
  bool stop;
  uint64_t req_gen, done_gen;
  int done_err;

  atomic_bool kicked;
  /* c->seq one to two hot windows ago, and the mark being aged; the
   * window's length (see writeback_hot_next).  Thread only.
   */
  uint64_t seen_seq, mark_seq, mark_ms, hot_ms;
  /* Pages cleaned above the high watermark (not on demand) in the
   * current window [cur] and the one before, up to WB_SAMPLE each.
   * Written by note_cleaned, from the thread only.
   */
  uint64_t sample[2][WB_SAMPLE];
  size_t nsample[2];
  int cur;
  /* The age limit: c->seq at times past, a ring (oldest at age_head),
   * one mark per max_age / (WB_AGE_MARKS / 2).  Thread only.
   */
  struct { uint64_t ms, seq; } age[WB_AGE_MARKS];
  unsigned age_head, nage;
  uint64_t age_checked_ms;
};

/* The cache's writeback state is set by writeback_start and cleared
 * by writeback_stop, which may run while the control thread asks for
 * a drain: such callers take it under wb_ptr_lock and count themselves
 * in wb->users, and writeback_stop frees it only once they are all
 * out.
 */
static pthread_mutex_t wb_ptr_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wb_users_gone = PTHREAD_COND_INITIALIZER;

static struct writeback *
wb_get (struct cache *c)
{
  struct writeback *wb;

  pthread_mutex_lock (&wb_ptr_lock);
  wb = cache_bg_get (c, CACHE_BG_WRITEBACK);
  if (wb)
    wb->users++;
  pthread_mutex_unlock (&wb_ptr_lock);
  return wb;
}

static void
wb_put (struct writeback *wb)
{
  pthread_mutex_lock (&wb_ptr_lock);
  if (--wb->users == 0)
    pthread_cond_broadcast (&wb_users_gone);
  pthread_mutex_unlock (&wb_ptr_lock);
}

/* The hot window: above the high watermark, background cleaning skips
 * pages changed in the last one to two windows.  One second suits a
 * workload with a hot set and cold pages; but where writes spread over
 * every dirty page (random rewrites of a disk that fits in the cache),
 * no page stays cold that long, the pages cleaned are dirty again a
 * moment later, and every clean costs a backend write, a cache read
 * and an entry write that take CPU and bandwidth from the clients for
 * nothing.  So the window follows what cleaning achieves: sampled of
 * the pages cleaned in the window before the last, redirtied were
 * dirty again by the end of the last one.  At least half: cleaning was
 * wasted, the window grows fourfold (at most WB_HOT_MAX_MS); under a
 * quarter: it halves (at least WB_HOT_MS).  A writer that found no slot
 * sets it back to WB_HOT_MS (writeback_thread).  Pure.
 */
uint64_t
writeback_hot_next (uint64_t hot_ms, size_t sampled, size_t redirtied)
{
  if (sampled < WB_SAMPLE_MIN)
    return hot_ms;
  if (redirtied * 2 >= sampled)
    return hot_ms * 4 < WB_HOT_MAX_MS ? hot_ms * 4 : WB_HOT_MAX_MS;
  if (redirtied * 4 < sampled)
    return hot_ms / 2 > WB_HOT_MS ? hot_ms / 2 : WB_HOT_MS;
  return hot_ms;
}

/* Set the hot window's length, and the counter that shows it. */
static void
hot_set (struct writeback *wb, uint64_t ms)
{
  wb->hot_ms = ms;
  atomic_store_explicit (&cache_stats (wb->c)->writeback_hot_ms, ms,
                         memory_order_relaxed);
}

/* End of a hot window: judge the sample of the window before, start a
 * new one.
 */
static void
hot_window_end (struct writeback *wb)
{
  const int prev = !wb->cur;
  size_t redirtied = 0;
  uint64_t next;

  for (size_t k = 0; k < wb->nsample[prev]; k++)
    redirtied += cache_page_dirty (wb->c, wb->sample[prev][k]);
  next = writeback_hot_next (wb->hot_ms, wb->nsample[prev], redirtied);
  if (next != wb->hot_ms && ssdcache_debug_verbose)
    log_debug ("writeback: %zu of %zu pages cleaned were rewritten: "
               "pages changed in the last %llu ms are hot",
               redirtied, wb->nsample[prev], (unsigned long long) next);
  hot_set (wb, next);
  wb->nsample[prev] = 0;
  wb->cur = prev;
}

/* A page background cleaning wrote back, for the hot window's sample. */
static void
note_cleaned (void *opaque, uint64_t page)
{
  struct writeback *wb = opaque;

  if (wb->nsample[wb->cur] < WB_SAMPLE)
    wb->sample[wb->cur][wb->nsample[wb->cur]++] = page;
}

/* "Hot" pages, skipped by cleaning above the high watermark: those
 * changed in the last one to two hot windows.  Writing them back is
 * wasted (they change again before they can be marked clean) and
 * steals the clients' bandwidth; nobody needs their slots yet (a
 * writer that finds no slot kicks us, and then every page goes).
 */
static void
hot_window_age (struct writeback *wb)
{
  struct cache *c = wb->c;
  uint64_t seq;

  seq = cache_change_seq (c);
  if (cache_now_ms () - wb->mark_ms >= wb->hot_ms) {
    hot_window_end (wb);
    wb->seen_seq = wb->mark_seq;
    wb->mark_seq = seq;
    wb->mark_ms = cache_now_ms ();
  }
}

/* ssdcache-writeback-max-age: note c->seq now and then; return the
 * sequence number at or below which a dirty page was last written more
 * than max_age ago (0: none known yet, or not time to look).
 */
static uint64_t
age_limit_seq (struct writeback *wb)
{
  struct cache *c = wb->c;
  const uint64_t max_ms =
    (uint64_t) cache_writeback_config (c)->max_age_s * 1000;
  const uint64_t step = max_ms / (WB_AGE_MARKS / 2);
  uint64_t now = cache_now_ms (), seq, found = 0;
  unsigned last = (wb->age_head + wb->nage - 1) % WB_AGE_MARKS;

  if (max_ms == 0)
    return 0;
  if (wb->nage == 0 || now - wb->age[last].ms >= step) {
    seq = cache_change_seq (c);
    if (wb->nage == WB_AGE_MARKS) {
      wb->age_head = (wb->age_head + 1) % WB_AGE_MARKS;
      wb->nage--;
    }
    wb->age[(wb->age_head + wb->nage++) % WB_AGE_MARKS].ms = now;
    wb->age[(wb->age_head + wb->nage - 1) % WB_AGE_MARKS].seq = seq;
  }
  if (now - wb->age_checked_ms < WB_AGE_CHECK_MS)
    return 0;
  wb->age_checked_ms = now;
  for (unsigned k = 0; k < wb->nage; k++) {
    unsigned i = (wb->age_head + k) % WB_AGE_MARKS;
    if (now - wb->age[i].ms < max_ms)
      break;
    found = wb->age[i].seq;
  }
  return found;
}

/* What to clean now (full: a flush waits for everything).  Returns
 * false if nothing, else fills o.
 */
static bool
choose_pass (struct writeback *wb, bool full, struct clean_opts *o)
{
  struct cache *c = wb->c;
  const struct cache_writeback_config *cfg = cache_writeback_config (c);
  const uint64_t high = cache_nslots (c) * cfg->high_pct / 100;
  const uint64_t low = cache_nslots (c) * cfg->low_pct / 100;
  uint64_t ndirty = cache_dirty_pages (c), idle_for;
  uint64_t old_seq = ndirty > 0 ? age_limit_seq (wb) : 0;
  bool kicked = atomic_exchange (&wb->kicked, false);

  if (kicked && wb->hot_ms != WB_HOT_MS) {
    /* Slots are wanted: cleaning is worth it again. */
    hot_set (wb, WB_HOT_MS);
    wb->nsample[0] = wb->nsample[1] = 0;
  }
  idle_for = cache_now_ms () - cache_last_io_ms (c);
  *o = (struct clean_opts) { .limited = !full };
  if (full)
    o->target = 0;
  else if (ndirty > high && !kicked) {
    o->target = low;
    o->skip_hot = true;
    o->hot_after = wb->seen_seq;
    o->cleaned = note_cleaned;
    o->opaque = wb;
  }
  else if (ndirty > high)
    o->target = low;
  else if (kicked && ndirty > 0)
    o->target = ndirty / 2 < low ? ndirty / 2 : low;
  else if (cfg->idle_ms && idle_for >= cfg->idle_ms && ndirty > 0)
    o->target = 0;
  else if (old_seq > 0) {
    /* Pages last written before the age limit: all of them go. */
    o->target = 0;
    o->skip_hot = true;
    o->hot_after = old_seq;
  }
  else
    return false;
  if (ssdcache_debug_verbose)
    log_debug ("writeback: %llu dirty, target %llu%s",
               (unsigned long long) ndirty, (unsigned long long) o->target,
               full ? " (flush)" : "");
  return true;
}

/* The flush order: client flushes the backend does not have yet are
 * written back at once, whatever the watermarks say (the versions they
 * need take room until then, and each must be written anyway: later
 * writes cannot stand in for them).  The open generation is left to
 * the usual rules.
 */
static bool
closed_gens (struct cache *c, struct clean_opts *o)
{
  uint64_t upto;

  if (!cache_order_behind (c, &upto))
    return false;
  *o = (struct clean_opts) { .target = 0, .gen_upto = upto };
  return true;
}

/* Nothing to do: sleep until woken or the next poll. */
static void
wait_for_work (struct writeback *wb)
{
  pthread_mutex_lock (&wb->lock);
  if (!wb->stop && wb->req_gen == wb->done_gen) {
    struct timespec ts;
    clock_gettime (CLOCK_REALTIME, &ts);
    ts.tv_nsec += WB_POLL_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait (&wb->wake, &wb->lock, &ts);
  }
  pthread_mutex_unlock (&wb->lock);
}

static void *
writeback_thread (void *arg)
{
  struct writeback *wb = arg;
  struct cache *c = wb->c;

  for (;;) {
    struct clean_opts o;
    uint64_t gen;
    bool full;
    int r, err = 0;

    hot_window_age (wb);
    pthread_mutex_lock (&wb->lock);
    if (wb->stop) {
      pthread_mutex_unlock (&wb->lock);
      break;
    }
    gen = wb->req_gen;
    full = gen > wb->done_gen;
    pthread_mutex_unlock (&wb->lock);

    if (!choose_pass (wb, full, &o) && !closed_gens (c, &o)) {
      wait_for_work (wb);
      continue;
    }
    r = clean_pass (c, &wb->be, &o, &err);
    if (r == 2) {
      if (ssdcache_debug_verbose)
        log_debug ("writeback: every dirty page is being rewritten: "
                   "waiting");
      wait_for_work (wb);
      continue;
    }
    pthread_mutex_lock (&wb->lock);
    if (full && r != 1) {
      wb->done_gen = gen;
      wb->done_err = r == -1 ? (err ? err : EIO) : 0;
      pthread_cond_broadcast (&wb->done);
    }
    pthread_mutex_unlock (&wb->lock);
    if (r == 1)
      cache_sleep_ms (1);       /* busy pages: let the clients go on */
    else if (r == -1)
      cache_sleep_ms (WB_RETRY_MS); /* backend trouble: a breath */
  }
  return NULL;
}

int
writeback_start (struct cache *c, const struct cache_backend *be)
{
  struct writeback *wb = calloc (1, sizeof *wb);
  int r;

  if (wb == NULL) {
    log_error ("calloc: %m");
    return -1;
  }
  wb->c = c;
  wb->be = *be;
  hot_set (wb, WB_HOT_MS);
  pthread_mutex_init (&wb->lock, NULL);
  pthread_cond_init (&wb->wake, NULL);
  pthread_cond_init (&wb->done, NULL);
  atomic_init (&wb->kicked, false);
  pthread_mutex_lock (&wb_ptr_lock);
  cache_bg_set (c, CACHE_BG_WRITEBACK, wb);
  pthread_mutex_unlock (&wb_ptr_lock);
  cache_hooks (c)->wb_kick = writeback_kick;
  cache_hooks (c)->wb_stop = writeback_stop;
  r = pthread_create (&wb->thread, NULL, writeback_thread, wb);
  if (r != 0) {
    errno = r;
    log_error ("cannot start the writeback thread: %m");
    cache_hooks (c)->wb_kick = NULL;
    cache_hooks (c)->wb_stop = NULL;
    pthread_mutex_lock (&wb_ptr_lock);
    cache_bg_set (c, CACHE_BG_WRITEBACK, NULL);
    pthread_mutex_unlock (&wb_ptr_lock);
    hot_set (wb, 0);
    free (wb);
    return -1;
  }
  wb->started = true;
  return 0;
}

void
writeback_stop (struct cache *c)
{
  struct writeback *wb;

  pthread_mutex_lock (&wb_ptr_lock);
  wb = cache_bg_get (c, CACHE_BG_WRITEBACK);
  cache_bg_set (c, CACHE_BG_WRITEBACK, NULL);  /* no new caller gets it */
  pthread_mutex_unlock (&wb_ptr_lock);
  if (wb == NULL)
    return;
  pthread_mutex_lock (&wb->lock);
  wb->stop = true;
  pthread_cond_broadcast (&wb->wake);
  pthread_cond_broadcast (&wb->done);
  pthread_mutex_unlock (&wb->lock);
  if (wb->started)
    pthread_join (wb->thread, NULL);
  cache_hooks (c)->wb_kick = NULL;
  cache_hooks (c)->wb_stop = NULL;
  hot_set (wb, 0);
  /* A drain waiting for a pass wakes on the stop: let it leave. */
  pthread_mutex_lock (&wb_ptr_lock);
  while (wb->users > 0)
    pthread_cond_wait (&wb_users_gone, &wb_ptr_lock);
  pthread_mutex_unlock (&wb_ptr_lock);
  pthread_mutex_destroy (&wb->lock);
  pthread_cond_destroy (&wb->wake);
  pthread_cond_destroy (&wb->done);
  free (wb);
}

void
writeback_kick (struct cache *c)
{
  struct writeback *wb = cache_bg_get (c, CACHE_BG_WRITEBACK);

  /* (An engine hook: the engine calls it only while the hook is set,
   * and writeback_stop clears it with no request of the cache running.)
   */
  if (wb) {
    atomic_store (&wb->kicked, true);
    pthread_cond_signal (&wb->wake);
  }
}

bool
writeback_running (struct cache *c)
{
  bool r;

  pthread_mutex_lock (&wb_ptr_lock);
  r = cache_bg_get (c, CACHE_BG_WRITEBACK) != NULL;
  pthread_mutex_unlock (&wb_ptr_lock);
  return r;
}

void
writeback_request (struct cache *c)
{
  struct writeback *wb = wb_get (c);

  if (wb == NULL)
    return;
  pthread_mutex_lock (&wb->lock);
  ++wb->req_gen;
  pthread_cond_signal (&wb->wake);
  pthread_mutex_unlock (&wb->lock);
  wb_put (wb);
}

int
writeback_request_all (struct cache *c, int *err)
{
  struct writeback *wb = wb_get (c);
  uint64_t mine;
  int r;

  if (wb == NULL) {
    *err = ESHUTDOWN;
    return -1;
  }
  pthread_mutex_lock (&wb->lock);
  mine = ++wb->req_gen;
  pthread_cond_signal (&wb->wake);
  while (wb->done_gen < mine && !wb->stop)
    pthread_cond_wait (&wb->done, &wb->lock);
  r = wb->done_gen >= mine ? wb->done_err : ESHUTDOWN;
  pthread_mutex_unlock (&wb->lock);
  wb_put (wb);
  if (r) {
    *err = r;
    return -1;
  }
  return 0;
}
