/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: one cache per export; see exports.h for what
 * this file owns and its locks.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nbdkit-filter.h>

#include "budget.h"
#include "config.h"
#include "exports.h"
#include "metrics.h"
#include "behind.h"
#include "prefetch.h"
#include "readahead.h"
#include "warm.h"
#include "writeback.h"

NBDKIT_DLL_PUBLIC int ssdcache_debug_exports = 0;

#define edebug(fmt, ...) \
  do { \
    if (ssdcache_debug_exports) \
      nbdkit_debug ("ssdcache: " fmt, ##__VA_ARGS__); \
  } while (0)

enum lend_role { LEND_CONN, LEND_FIXED_WRITE, LEND_FIXED_READ };

struct lender {
  nbdkit_next *next;
  enum lend_role role;
  bool writable;
  unsigned inflight;             /* requests of e's threads on it */
  /* Taken around every call on next, by the connection's own requests
   * and by e's threads alike, when the plugin serialises requests: one
   * call at a time on the context (own_turn), or on the whole plugin
   * (global_turn).  NULL: the plugin takes parallel requests.
   */
  pthread_mutex_t *turn;
  pthread_mutex_t own_turn;
  struct lender *link;
};

struct lent {                    /* the h of a lent backend */
  struct export *e;
  bool write;
};

/* An export in the table is opened (its cache file locked, its
 * superblock read) by the first exports_get of its name, and closed
 * when the last reference goes and it has no dirty data (it gives back
 * its threads and its fd), unless pinned.  A closed export whose file
 * still holds cached pages is parked: it stays in the table, its pages
 * still counted in the shared budget (they are on disk), until it is
 * opened again (warm) or another export needs the room: its file is
 * then removed (exports_reclaim).  While an export is opening, closing
 * or being removed, others asking for its name wait (exports_cond):
 * two first connections never open one file twice.
 */
enum export_state {
  EXPORT_OPENING, EXPORT_OPEN, EXPORT_CLOSING,  /* counted in nexports */
  EXPORT_PARKED, EXPORT_REMOVING,
};

struct export {
  char *name;
  struct config_export x;
  struct cache *cache;
  enum export_state state;       /* under exports_lock */
  unsigned refs;                 /* under exports_lock: handles, the
                                    control socket, a reclaim */
  bool pinned;                   /* never closed before exit */
  bool fixed;                    /* attached at start, contexts of its own */
  bool no_readahead;             /* fixed, without a readahead context */
  bool readahead_started;               /* under bg_lock */
  bool failed;                   /* could not be attached: refused until
                                    closed (and opened again) */
  uint64_t parked_bytes;         /* parked: what its file holds, counted
                                    in the budget (exports_lock) */
  pthread_mutex_t bg_lock;
  bool attached;                 /* under bg_lock (read unlocked once set) */
  unsigned nconns;               /* under bg_lock */
  struct lender *lenders;        /* under exports_lock */
  struct lent lent_read, lent_write;
  struct metrics *metrics;
  struct export *link;           /* under exports_lock */
};

static pthread_mutex_t exports_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t lender_back = PTHREAD_COND_INITIALIZER;
static pthread_cond_t exports_cond = PTHREAD_COND_INITIALIZER;
static struct export *exports, **exports_tail = &exports;
static unsigned nexports;        /* under exports_lock: caches open */
static unsigned exports_max = UINT_MAX;
static struct budget budget;
static bool have_budget;
static enum { TURNS_NONE, TURNS_CONTEXT, TURNS_GLOBAL } turns;
static pthread_mutex_t global_turn = PTHREAD_MUTEX_INITIALIZER;

void
exports_init (uint64_t budget_bytes, int thread_model, unsigned max)
{
  have_budget = budget_bytes > 0;
  budget_init (&budget, budget_bytes);
  exports_max = max;
  /* A plugin that serialises requests on a handle (ssh, curl) must not
   * see two calls on one context at once; one that serialises all
   * requests, two calls at once at all.  nbdkit does that for client
   * requests, not for the calls of the filter's own threads.
   */
  turns = thread_model >= NBDKIT_THREAD_MODEL_PARALLEL ? TURNS_NONE
    : thread_model == NBDKIT_THREAD_MODEL_SERIALIZE_REQUESTS ? TURNS_CONTEXT
    : TURNS_GLOBAL;
}

void
export_turn_take (struct lender *l)
{
  if (l && l->turn)
    pthread_mutex_lock (l->turn);
}

void
export_turn_give (struct lender *l)
{
  if (l && l->turn)
    pthread_mutex_unlock (l->turn);
}

struct cache *
export_cache (const struct export *e)
{
  return e->cache;
}

static struct lender *pick_lender (struct export *e, bool write);

bool
export_fixed (const struct export *e)
{
  return e->fixed;
}

bool
export_has_writer (struct export *e)
{
  bool r;

  struct lender *l;

  pthread_mutex_lock (&exports_lock);
  l = pick_lender (e, true);
  r = l != NULL && l->role == LEND_FIXED_WRITE;
  pthread_mutex_unlock (&exports_lock);
  return r;
}

/*----------------------------------------------------------------------
 * Backends: a client request's, and the lent ones of the threads.
 */

static int
backend_failed (struct cache *c)
{
  if (c)
    STATS_ADD (cache_stats (c), backend_errors, 1);
  return -1;
}

static int
next_pread (nbdkit_next *next, struct cache *c, void *buf, uint32_t count,
            uint64_t offset, int *err)
{
  if (next->pread (next, buf, count, offset, 0, err) == -1)
    return backend_failed (c);
  return 0;
}

static int
next_flush (nbdkit_next *next, struct cache *c, int *err)
{
  int r = next->can_flush (next);

  if (r == -1) {
    *err = EIO;
    return -1;
  }
  if (r && next->flush (next, 0, err) == -1)
    return backend_failed (c);
  return 0;
}

static int
next_pwrite (nbdkit_next *next, struct cache *c, const void *buf,
             uint32_t count, uint64_t offset, bool fua, int *err)
{
  int f = fua ? next->can_fua (next) : NBDKIT_FUA_NONE;

  if (f == -1) {
    *err = EIO;
    return -1;
  }
  if (next->pwrite (next, buf, count, offset,
                    f != NBDKIT_FUA_NONE ? NBDKIT_FLAG_FUA : 0, err) == -1)
    return backend_failed (c);
  /* A backend without FUA: a flush gives the same guarantee. */
  if (fua && f == NBDKIT_FUA_NONE)
    return next_flush (next, c, err);
  return 0;
}

static int
req_pread (void *h, void *buf, uint32_t count, uint64_t offset, int *err)
{
  struct export_req *r = h;
  int ret;

  export_turn_take (r->lender);
  ret = next_pread (r->next, r->cache, buf, count, offset, err);
  export_turn_give (r->lender);
  return ret;
}

static int
req_pwrite (void *h, const void *buf, uint32_t count, uint64_t offset,
            bool fua, int *err)
{
  struct export_req *r = h;
  int ret;

  export_turn_take (r->lender);
  ret = next_pwrite (r->next, r->cache, buf, count, offset, fua, err);
  export_turn_give (r->lender);
  return ret;
}

static int
req_flush (void *h, int *err)
{
  struct export_req *r = h;
  int ret;

  export_turn_take (r->lender);
  ret = next_flush (r->next, r->cache, err);
  export_turn_give (r->lender);
  return ret;
}

struct cache_backend
export_backend (struct export_req *ctx)
{
  struct cache_backend be = { .h = ctx, .pread = req_pread,
                              .pwrite = req_pwrite, .flush = req_flush };
  return be;
}

/* Under exports_lock: the lender a thread's request goes to: for a
 * read the fixed read context, else any; for a write a writable one,
 * the fixed one first.
 */
static struct lender *
pick_lender (struct export *e, bool write)
{
  struct lender *best = NULL;

  for (struct lender *l = e->lenders; l; l = l->link) {
    if (write && !l->writable)
      continue;
    if (l->role == (write ? LEND_FIXED_WRITE : LEND_FIXED_READ))
      return l;
    if (best == NULL || (best->role == LEND_CONN && l->role != LEND_CONN))
      best = l;
  }
  return best;
}

static struct lender *
borrow (struct export *e, bool write, int *err)
{
  struct lender *l;

  pthread_mutex_lock (&exports_lock);
  l = pick_lender (e, write);
  if (l)
    l->inflight++;
  pthread_mutex_unlock (&exports_lock);
  if (l == NULL)
    *err = write ? EROFS : ENOTCONN;
  return l;
}

static void
give_back (struct lender *l)
{
  pthread_mutex_lock (&exports_lock);
  if (--l->inflight == 0)
    pthread_cond_broadcast (&lender_back);
  pthread_mutex_unlock (&exports_lock);
}

static int
lent_pread (void *h, void *buf, uint32_t count, uint64_t offset, int *err)
{
  struct lent *t = h;
  struct lender *l = borrow (t->e, t->write, err);
  int r;

  if (l == NULL)
    return -1;
  export_turn_take (l);
  r = next_pread (l->next, t->e->cache, buf, count, offset, err);
  export_turn_give (l);
  give_back (l);
  return r;
}

static int
lent_pwrite (void *h, const void *buf, uint32_t count, uint64_t offset,
             bool fua, int *err)
{
  struct lent *t = h;
  struct lender *l = borrow (t->e, true, err);
  int r;

  if (l == NULL)
    return -1;
  export_turn_take (l);
  r = next_pwrite (l->next, t->e->cache, buf, count, offset, fua, err);
  export_turn_give (l);
  give_back (l);
  return r;
}

static int
lent_flush (void *h, int *err)
{
  struct lent *t = h;
  struct lender *l = borrow (t->e, true, err);
  int r;

  if (l == NULL)
    return -1;
  export_turn_take (l);
  r = next_flush (l->next, t->e->cache, err);
  export_turn_give (l);
  give_back (l);
  return r;
}

struct cache_backend
export_lent_backend (struct export *e, bool write)
{
  struct cache_backend be = { .h = write ? &e->lent_write : &e->lent_read,
                              .pread = lent_pread, .pwrite = lent_pwrite,
                              .flush = lent_flush };
  return be;
}

static struct lender *
lend (struct export *e, nbdkit_next *next, enum lend_role role, bool writable)
{
  struct lender *l = calloc (1, sizeof *l);

  if (l == NULL) {
    nbdkit_error ("calloc: %m");
    return NULL;
  }
  l->next = next;
  l->role = role;
  l->writable = writable;
  pthread_mutex_init (&l->own_turn, NULL);
  l->turn = turns == TURNS_CONTEXT ? &l->own_turn
    : turns == TURNS_GLOBAL ? &global_turn : NULL;
  pthread_mutex_lock (&exports_lock);
  l->link = e->lenders;
  e->lenders = l;
  pthread_mutex_unlock (&exports_lock);
  return l;
}

static void
lender_free (struct lender *l)
{
  pthread_mutex_destroy (&l->own_turn);
  free (l);
}

/* Take l back once no thread's request is on it. */
static void
unlend (struct export *e, struct lender *l)
{
  pthread_mutex_lock (&exports_lock);
  for (struct lender **p = &e->lenders; *p; p = &(*p)->link)
    if (*p == l) {
      *p = l->link;
      break;
    }
  while (l->inflight > 0)
    pthread_cond_wait (&lender_back, &exports_lock);
  pthread_mutex_unlock (&exports_lock);
  lender_free (l);
}

/*----------------------------------------------------------------------
 * The shared budget: taking space from idle exports.
 */

#define RECLAIM_TRIES 8

static void export_put_many (struct export **e, unsigned n);
static void unlink_locked (struct export *e);
static void export_free (struct export *e);

/* The space of a parked export, its cache file removed (the oldest
 * parked first).  True if some was given back.
 */
static bool
remove_parked (void)
{
  struct export *e;

  pthread_mutex_lock (&exports_lock);
  for (e = exports; e && e->state != EXPORT_PARKED; e = e->link)
    ;
  if (e)
    e->state = EXPORT_REMOVING;
  pthread_mutex_unlock (&exports_lock);
  if (e == NULL)
    return false;
  if (cache_remove_file (e->x.file) == -1)
    nbdkit_debug ("ssdcache: export '%s': cannot remove %s: %m", e->name,
                  e->x.file);
  else
    edebug ("export '%s': parked cache file %s removed for room", e->name,
            e->x.file);
  pthread_mutex_lock (&exports_lock);
  budget_give (&budget, e->parked_bytes);
  unlink_locked (e);
  pthread_mutex_unlock (&exports_lock);
  export_free (e);
  return true;
}

static bool
exports_reclaim (struct cache *c, void *opaque)
{
  struct export *self = opaque, *cand[RECLAIM_TRIES];
  unsigned n = 0;
  uint64_t now = cache_now_ms ();
  bool given = false;

  pthread_mutex_lock (&exports_lock);
  for (struct export *e = exports; e && n < RECLAIM_TRIES; e = e->link) {
    uint64_t last;
    if (e == self || e->state != EXPORT_OPEN || !e->attached || e->failed)
      continue;
    last = cache_last_io_ms (e->cache);
    if (now > last && now - last >= EXPORTS_IDLE_MS) {
      e->refs++;                 /* not closed under us */
      cand[n++] = e;
    }
  }
  pthread_mutex_unlock (&exports_lock);
  for (unsigned i = 0; i < n && !given; i++)
    given = cache_give_slot (cand[i]->cache);
  export_put_many (cand, n);
  return given || remove_parked ();
}

/*----------------------------------------------------------------------
 * Opening and attaching.
 */

static void
export_cache_config (const struct export *e, struct cache_config *cfg)
{
  *cfg = (struct cache_config) {
    .path = e->x.file,
    .private_file = e->x.file_default,
    .size = config.size,
    .page_size = config.page_size,
    .mode = config.mode,
    .id_digest = { e->x.digest[0], e->x.digest[1] },
    .id_text = e->x.id_text,
    .reset = config.reset,
    .flush_mode = config.flush_mode,
    .wb = config.wb,
    .policy = config.policy,
    .seq_cutoff = config.seq_cutoff,
    .seq_streams = config.seq_streams,
    .verify = config.verify,
    .promote = config.promote,
    .resize_move = config.resize_move,
    .partial_pages = !config.partial_pages_set ? 0
                     : config.partial_pages ? config.partial_pages
                     : CACHE_PARTIAL_NONE,
    .readahead_mode = config.readahead_mode,
    .readahead_window = config.readahead_window,
    .readahead_max = config.readahead_max,
    .direct = config.direct,
    .defer_writes = config.defer_writes,
    .budget = have_budget ? &budget : NULL,
    .sparse = e->name[0] != '\0',
    .export_name = e->name[0] ? e->name : NULL,
    .reclaim = have_budget ? exports_reclaim : NULL,
    .reclaim_opaque = (void *) e,
  };
}

/* The parts of e that export_new made (its cache closed, if open). */
static void
export_free (struct export *e)
{
  cache_close (e->cache);
  config_export_free (&e->x);
  pthread_mutex_destroy (&e->bg_lock);
  free (e->name);
  free (e);
}

/* A new export called name, not opened yet. */
static struct export *
export_new (const char *name)
{
  struct export *e = calloc (1, sizeof *e);

  if (e == NULL || (e->name = strdup (name)) == NULL) {
    nbdkit_error ("calloc: %m");
    free (e);
    return NULL;
  }
  pthread_mutex_init (&e->bg_lock, NULL);
  e->lent_read = (struct lent) { .e = e, .write = false };
  e->lent_write = (struct lent) { .e = e, .write = true };
  return e;
}

/* Open e's cache file (locked, its superblock read; fd: the file
 * already open and locked, or -1).  Returns 0 or -1 (logged).
 */
static int
export_open (struct export *e, int fd)
{
  struct cache_config cfg;

  if (e->x.file == NULL && config_export (e->name, &e->x) == -1) {
    if (fd >= 0)
      close (fd);
    return -1;
  }
  export_cache_config (e, &cfg);
  e->cache = cache_open_fd (&cfg, fd);
  if (e->cache == NULL)
    return -1;
  edebug ("export '%s': cache file %s (%s)", e->name, e->x.file,
          e->x.id_text);
  return 0;
}

/* Under exports_lock. */
static struct export *
find_locked (const char *name)
{
  struct export *e;

  for (e = exports; e; e = e->link)
    if (strcmp (e->name, name) == 0)
      break;
  return e;
}

/* Under exports_lock: does e have a cache open (or about to)? */
static bool
counted (const struct export *e)
{
  return e->state == EXPORT_OPENING || e->state == EXPORT_OPEN ||
    e->state == EXPORT_CLOSING;
}

/* Under exports_lock: take e out of the table. */
static void
unlink_locked (struct export *e)
{
  for (struct export **p = &exports; *p; p = &(*p)->link)
    if (*p == e) {
      *p = e->link;
      if (exports_tail == &e->link)
        exports_tail = p;
      break;
    }
  if (counted (e))
    nexports--;
  pthread_cond_broadcast (&exports_cond);
}

/* Under exports_lock, at ssdcache-exports-max: wait for a change while
 * an export is closing (its count goes when it is closed), or until
 * *deadline (set at the first call, EXPORTS_LIMIT_GRACE_MS on) for one
 * to begin closing.  Returns false once there is nothing to wait for
 * any more.
 */
static bool
wait_for_room_locked (struct timespec *deadline)
{
  struct timespec now;

  for (struct export *e = exports; e; e = e->link)
    if (e->state == EXPORT_CLOSING) {
      pthread_cond_wait (&exports_cond, &exports_lock);
      return true;
    }
  clock_gettime (CLOCK_REALTIME, &now);
  if (deadline->tv_sec == 0) {  /* the first wait sets it */
    *deadline = now;
    deadline->tv_sec += EXPORTS_LIMIT_GRACE_MS / 1000;
  }
  if (now.tv_sec > deadline->tv_sec ||
      (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec))
    return false;
  pthread_cond_timedwait (&exports_cond, &exports_lock, deadline);
  return true;
}

struct export *
exports_get (const char *name)
{
  struct export *e, *o;
  struct timespec deadline = { 0 };

  pthread_mutex_lock (&exports_lock);
 again:
  /* Another connection may be opening or closing this name's cache:
   * its file is locked until then.
   */
  while ((o = find_locked (name)) != NULL && o->state != EXPORT_OPEN &&
         o->state != EXPORT_PARKED)
    pthread_cond_wait (&exports_cond, &exports_lock);
  if (o && o->state == EXPORT_OPEN) {
    o->refs++;
    pthread_mutex_unlock (&exports_lock);
    return o;
  }
  if (nexports >= exports_max && wait_for_room_locked (&deadline))
    goto again;
  if (nexports >= exports_max) {
    pthread_mutex_unlock (&exports_lock);
    nbdkit_error ("ssdcache: export '%s' refused: %u exports have a cache "
                  "open already (ssdcache-exports-max=%u)", name,
                  nexports, exports_max);
    return NULL;
  }
  if (o) {
    /* Parked: its pages count again when its page table loads. */
    e = o;
    budget_give (&budget, e->parked_bytes);
    e->parked_bytes = 0;
  }
  else if ((e = export_new (name)) != NULL) {
    *exports_tail = e;
    exports_tail = &e->link;
  }
  if (e == NULL) {
    pthread_mutex_unlock (&exports_lock);
    return NULL;
  }
  e->state = EXPORT_OPENING;
  e->refs = 1;
  nexports++;
  pthread_mutex_unlock (&exports_lock);

  /* Opening reads the cache file: not under exports_lock. */
  if (export_open (e, -1) == -1) {
    pthread_mutex_lock (&exports_lock);
    unlink_locked (e);
    pthread_mutex_unlock (&exports_lock);
    export_free (e);
    return NULL;
  }
  pthread_mutex_lock (&exports_lock);
  e->state = EXPORT_OPEN;
  pthread_cond_broadcast (&exports_cond);
  pthread_mutex_unlock (&exports_lock);
  return e;
}

void
export_hold (struct export *e, bool pin)
{
  pthread_mutex_lock (&exports_lock);
  e->refs++;
  e->pinned |= pin;
  pthread_mutex_unlock (&exports_lock);
}

static void export_close (struct export *e);

/* Under exports_lock, the last reference of e gone: may it close now?
 * Not while it holds dirty data (it would have to be written back on a
 * context nobody lends any more): it stays, counted against
 * ssdcache-exports-max, until a connection comes back.
 */
static bool
closable_locked (const struct export *e)
{
  return e->refs == 0 && !e->pinned && e->state == EXPORT_OPEN &&
    (!e->attached || e->failed || cache_dirty_pages (e->cache) == 0);
}

static void
export_put_many (struct export **es, unsigned n)
{
  for (unsigned i = 0; i < n; i++) {
    struct export *e = es[i];
    bool close;

    uint64_t held = 0;

    pthread_mutex_lock (&exports_lock);
    e->refs--;
    close = closable_locked (e);
    if (close)
      e->state = EXPORT_CLOSING;
    pthread_mutex_unlock (&exports_lock);
    if (!close)
      continue;
    edebug ("export '%s': no client left: its cache is closed", e->name);
    if (have_budget && e->attached && !e->failed)
      held = cache_held_bytes (e->cache);
    export_close (e);
    pthread_mutex_lock (&exports_lock);
    if (held > 0) {
      /* Its pages stay on disk: still counted, until it opens again or
       * another export needs the room (remove_parked).
       */
      budget_charge (&budget, held);
      e->parked_bytes = held;
      e->state = EXPORT_PARKED;
      e->attached = e->failed = false;
      nexports--;
      pthread_cond_broadcast (&exports_cond);
      pthread_mutex_unlock (&exports_lock);
      continue;
    }
    unlink_locked (e);
    pthread_mutex_unlock (&exports_lock);
    export_free (e);
  }
}

void
export_put (struct export *e)
{
  if (e)
    export_put_many (&e, 1);
}

/* Under e->bg_lock: e's live metrics, if asked for and not running. */
static void
start_metrics (struct export *e)
{
  if (config.stats_file && e->metrics == NULL)
    e->metrics = metrics_start (e->cache, e->x.stats_file,
                                config.stats_format, config.stats_interval);
}

/* Under e->bg_lock, e's cache attached at the size of its file while
 * another was asked for, and no request or thread of e running: write
 * back its dirty data through next (a writable context; NULL: none, the
 * resize waits), then close it, resize its file (cache_close_resize)
 * and open and attach it again.  Returns -1 (logged) if e is left with
 * no cache.
 */
static int
resize (struct export *e, int64_t size, nbdkit_next *next)
{
  struct cache *c = e->cache;
  struct export_req req = { .next = next, .cache = c };
  struct cache_backend be = export_backend (&req);
  int err = 0, fd = -1;

  if (!cache_resize_pending (c) ||
      (cache_dirty_pages (c) > 0 && next == NULL))
    return 0;
  if (cache_dirty_pages (c) > 0 &&
      cache_writeback_all (c, &be, &err) == -1) {
    cache_resize_keep (c, err == EBUSY ? "its dirty data is busy"
                       : "its dirty data could not be written back");
    return 0;
  }
  edebug ("export '%s': resizing its cache", e->name);
  if (e->metrics) {
    metrics_stop (e->metrics);
    e->metrics = NULL;
  }
  cache_close_resize (c, &fd);
  e->cache = NULL;
  if (export_open (e, fd) == -1 || cache_attach (e->cache, size) == -1)
    return -1;
  cache_resize_keep (e->cache, "the resize failed (see above)");
  start_metrics (e);
  return 0;
}

/* Under e->bg_lock: the first attach of e with the backend size (next:
 * a writable context for a resize, or NULL).
 */
static int
attach (struct export *e, int64_t size, nbdkit_next *next)
{
  if (e->attached)
    return 0;
  if (e->failed) {
    nbdkit_error ("ssdcache: export '%s': its cache could not be started "
                  "(see the error logged before)", e->name);
    return -1;
  }
  if (size == -1) {
    /* The plugin could not tell (a transient error of a remote
     * backend): this connection fails, the next one asks again.
     */
    nbdkit_error ("ssdcache: export '%s': the plugin did not give its "
                  "size: the connection is refused", e->name);
    return -1;
  }
  if (cache_attach (e->cache, size) == -1 || resize (e, size, next) == -1) {
    /* Half attached: refused until closed and opened again (when no
     * connection is left), unless it is the fixed one.
     */
    e->failed = true;
    return -1;
  }
  start_metrics (e);
  edebug ("export '%s': attached, %lld bytes, %llu dirty pages", e->name,
          (long long) size,
          (unsigned long long) cache_dirty_pages (e->cache));
  e->attached = true;
  return 0;
}

/* Under e->bg_lock: readahead and writeback for e, as its mode and
 * contents need; sync: the backend for writing back synchronously the
 * dirty data left by a writeback run when the mode is no longer
 * writeback (NULL: no writable backend now, the data waits).
 */
static int
start_threads (struct export *e, const struct cache_backend *sync)
{
  struct cache *c = e->cache;
  struct cache_backend be;
  int err = 0;

  cache_resize_keep (c, "it holds dirty data, and no writable connection "
                     "came first to write it back");
  if (config.readahead_mode != READAHEAD_OFF && !e->no_readahead &&
      !e->readahead_started) {
    be = export_lent_backend (e, false);
    if (prefetch_start (c, &be) == -1)
      nbdkit_debug ("ssdcache: export '%s': readahead is off", e->name);
    else
      e->readahead_started = true;
  }
  if (config.fill_behind && !cache_bg_get (c, CACHE_BG_BEHIND) &&
      behind_start (c) == -1)
    nbdkit_debug ("ssdcache: export '%s': no fill behind", e->name);
  if (config.warm && !warm_running (c)) {
    be = export_lent_backend (e, false);
    if (warm_start (c, &be, config.warm_rate) == -1)
      nbdkit_debug ("ssdcache: export '%s': no warm-up", e->name);
  }
  if (cache_mode (c) != LAYOUT_MODE_WRITEBACK) {
    if (cache_dirty_pages (c) == 0 || sync == NULL)
      return 0;
    nbdkit_debug ("ssdcache: writing back %llu dirty pages before "
                  "switching mode",
                  (unsigned long long) cache_dirty_pages (c));
    if (cache_writeback_all (c, sync, &err) == -1) {
      errno = err;
      nbdkit_error ("ssdcache: cannot write back the dirty data left in "
                    "the cache: %m");
      return -1;
    }
    return 0;
  }
  if (sync == NULL || writeback_running (c))
    return 0;
  be = export_lent_backend (e, true);
  return writeback_start (c, &be);
}

int
export_attach_fixed (struct export *e, int64_t size)
{
  int r;

  pthread_mutex_lock (&e->bg_lock);
  e->fixed = true;
  r = attach (e, size, NULL);
  pthread_mutex_unlock (&e->bg_lock);
  return r;
}

int
export_start_fixed (struct export *e, nbdkit_next *wb, nbdkit_next *ra)
{
  struct cache_backend be = export_lent_backend (e, true);
  int r = -1;

  pthread_mutex_lock (&e->bg_lock);
  if (!e->readahead_started)
    e->no_readahead = ra == NULL;
  if ((wb && lend (e, wb, LEND_FIXED_WRITE, true) == NULL) ||
      (ra && lend (e, ra, LEND_FIXED_READ, false) == NULL))
    goto out;
  if (wb && resize (e, cache_backend_size (e->cache), wb) == -1) {
    e->failed = true;
    goto out;
  }
  r = start_threads (e, wb ? &be : NULL);
 out:
  pthread_mutex_unlock (&e->bg_lock);
  return r;
}

/* Ask next everything nbdkit asks a context once and keeps (the
 * handshake's questions), before it is lent: the connection's thread
 * asks them itself after .prepare, without taking the context's turn,
 * and must then find the answers kept rather than call the plugin
 * beside a thread's request.
 */
static void
prime_context (nbdkit_next *next)
{
  uint32_t minimum, preferred, maximum;

  next->can_flush (next);
  next->is_rotational (next);
  next->can_trim (next);
  next->can_zero (next);
  next->can_fast_zero (next);
  next->can_extents (next);
  next->can_fua (next);
  next->can_multi_conn (next);
  next->can_cache (next);
  next->block_size (next, &minimum, &preferred, &maximum);
}

struct lender *
export_connect (struct export *e, nbdkit_next *next, bool readonly)
{
  struct lender *l = NULL;
  bool writable;
  int64_t size = next->get_size (next);

  writable = !readonly && next->can_write (next) == 1;
  pthread_mutex_lock (&e->bg_lock);
  if (attach (e, size, writable ? next : NULL) == -1)
    goto out;
  if ((uint64_t) size != cache_backend_size (e->cache)) {
    nbdkit_error ("ssdcache: export '%s' has %lld bytes but its cache is "
                  "for %llu bytes", e->name, (long long) size,
                  (unsigned long long) cache_backend_size (e->cache));
    goto out;
  }
  if (turns != TURNS_NONE)
    prime_context (next);
  l = lend (e, next, LEND_CONN, writable);
  if (l == NULL)
    goto out;
  e->nconns++;
  edebug ("export '%s': connection %u%s", e->name, e->nconns,
          writable ? "" : " (read-only)");
  if (!e->fixed) {
    struct export_req req = { .next = next, .cache = e->cache };
    struct cache_backend be = export_backend (&req);
    if (start_threads (e, writable ? &be : NULL) == -1) {
      e->nconns--;
      pthread_mutex_unlock (&e->bg_lock);
      unlend (e, l);
      return NULL;
    }
  }
 out:
  pthread_mutex_unlock (&e->bg_lock);
  return l;
}

/* Under e->bg_lock, the last connection of a lazy export going (next:
 * its context): write back if asked, then stop e's threads.
 */
static void
last_close (struct export *e, nbdkit_next *next, bool writable)
{
  struct cache *c = e->cache;

  warm_stop (c);
  prefetch_stop (c);
  e->readahead_started = false;
  behind_drain (c);             /* the cache stays warm (the thread runs
                                   until the cache is closed) */
  writeback_stop (c);
  if (config.writeback_on_exit && cache_dirty_pages (c) > 0) {
    struct export_req req = { .next = next, .cache = c };
    struct cache_backend be = export_backend (&req);
    int err = 0;

    if (!writable) {
      nbdkit_debug ("ssdcache: export '%s': %llu dirty pages wait for a "
                    "writable connection", e->name,
                    (unsigned long long) cache_dirty_pages (c));
      return;
    }
    edebug ("export '%s': writing back %llu dirty pages at its last close",
            e->name, (unsigned long long) cache_dirty_pages (c));
    if (cache_writeback_all (c, &be, &err) == -1) {
      errno = err;
      nbdkit_error ("ssdcache: export '%s': writeback at its last close "
                    "failed: %m; the dirty data stays in the cache file",
                    e->name);
    }
  }
}

void
export_disconnect (struct export *e, struct lender *l)
{
  pthread_mutex_lock (&e->bg_lock);
  if (e->nconns == 1 && !e->fixed)
    last_close (e, l->next, l->writable);
  e->nconns--;
  edebug ("export '%s': %u connections left", e->name, e->nconns);
  unlend (e, l);
  pthread_mutex_unlock (&e->bg_lock);
}

int
export_start_writeback (struct export *e, char *err, size_t len)
{
  struct cache_backend be = export_lent_backend (e, true);
  bool have;

  if (writeback_running (e->cache))
    return 0;
  pthread_mutex_lock (&exports_lock);
  have = pick_lender (e, true) != NULL;
  pthread_mutex_unlock (&exports_lock);
  if (!have) {
    snprintf (err, len, "writeback needs a writable backend (a writable "
              "client connection of export '%s')", e->name);
    return -1;
  }
  if (writeback_start (e->cache, &be) == -1) {
    snprintf (err, len, "the writeback thread could not be started");
    return -1;
  }
  return 0;
}

/* At exit, a fixed export: write back (ssdcache-writeback-on-exit) on
 * its own writable context, then close its contexts.
 */
static void
fixed_exit (struct export *e)
{
  struct cache *c = e->cache;
  struct cache_backend be = export_lent_backend (e, true);
  int err = 0;

  if (config.writeback_on_exit && cache_dirty_pages (c) > 0 &&
      pick_lender (e, true) != NULL) {
    nbdkit_debug ("ssdcache: writing back %llu dirty pages at exit",
                  (unsigned long long) cache_dirty_pages (c));
    if (cache_writeback_all (c, &be, &err) == -1) {
      errno = err;
      nbdkit_error ("ssdcache: writeback at exit failed: %m; the dirty "
                    "data stays in the cache file and will be written "
                    "back at the next start");
    }
  }
  while (e->lenders) {
    struct lender *l = e->lenders;
    e->lenders = l->link;
    l->next->finalize (l->next);
    nbdkit_next_context_close (l->next);
    lender_free (l);
  }
}

/* Close e's cache (at exit, once every export's threads are stopped,
 * or when its last reference went): the last counters, the file.
 */
static void
export_close (struct export *e)
{
  struct cache *c = e->cache;

  if (c == NULL)
    return;                     /* parked: closed already */
  if (e->attached) {
    if (e->fixed)
      fixed_exit (e);
    nbdkit_debug ("ssdcache: export '%s': %llu dirty pages left in the "
                  "cache", e->name,
                  (unsigned long long) cache_dirty_pages (c));
    stats_debug (cache_stats (c));
    if (e->metrics)
      metrics_stop (e->metrics);         /* the last version of the file */
    else if (e->x.stats_file)
      metrics_write_file (c, e->x.stats_file, config.stats_format, 0);
  }
  else if (cache_file_untouched (c) && unlink (e->x.file) == 0)
    /* Opened for an export nobody used (the default export of a
     * plugin with no such export, as file dir=, or a connection that
     * failed): leave nothing behind.  Unlinked while still locked.
     */
    edebug ("export '%s': unused, cache file %s removed", e->name,
            e->x.file);
  cache_close (c);
  e->cache = NULL;
  e->metrics = NULL;
}

void
exports_cleanup (void)
{
  struct export *e = exports;

  exports = NULL;
  exports_tail = &exports;
  /* Every cache's threads first: a reclaim may reach any cache. */
  for (struct export *p = e; p; p = p->link)
    if (p->attached) {
      warm_stop (p->cache);
      prefetch_stop (p->cache);
      behind_drain (p->cache);
      behind_stop (p->cache);
      writeback_stop (p->cache);
    }
  while (e) {
    struct export *next = e->link;
    export_close (e);
    export_free (e);
    e = next;
  }
  nexports = 0;
}
