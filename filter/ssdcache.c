/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: nbdkit callbacks (thin).
 *
 * Owns the glue between nbdkit and the cache engine: parameters go to
 * config.c, the cache is opened before nbdkit forks (so that lock and
 * identity errors reach the user) and attached after it, when a shared
 * backend context can tell the backend size.  Data callbacks translate
 * nbdkit_next into struct cache_backend and call the engine (engine/cache.h).
 *
 * Locking: the global `cache' is set during start-up, before any
 * connection, and cleared in .cleanup after the last one; the engine
 * does its own locking.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "cache.h"
#include "config.h"
#include "log.h"
#include "pagetable.h"
#include "prefetch.h"
#include "writeback.h"
#include "control.h"
#include "metrics.h"
#include "readahead.h"

static struct cache *cache;

/* The backend context of the writeback thread (opened in .after_fork,
 * closed in .cleanup), or NULL.
 */
static nbdkit_next *wb_next;

/* The backend context of the readahead thread (the same lifetime), or
 * NULL when readahead is off.
 */
static nbdkit_next *ra_next;

/* The live metrics writer (ssdcache-stats), or NULL. */
static struct metrics *metrics;

/* The control socket (ssdcache-control), or NULL, and the backend it
 * may need a context of (set in .after_fork).
 */
static struct control *control;
static nbdkit_backend *the_backend;

/* Per connection: its readahead state (NULL: no readahead). */
struct handle {
  struct prefetch_conn *pc;
};

/* Set when the cache could not be attached in a captive nbdkit (see
 * ssdcache_after_fork): every connection then fails with this message.
 */
static char attach_error[512];

static void
ssdcache_unload (void)
{
  config_free ();
}

static int
ssdcache_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                 const char *key, const char *value)
{
  if (strncmp (key, "ssdcache-", 9) == 0)
    return config_set (key, value);
  if (config_note_backend (key, value) == -1)
    return -1;
  return next (nxdata, key, value);
}

static int
ssdcache_config_complete (nbdkit_next_config_complete *next,
                          nbdkit_backend *nxdata)
{
  if (config_finish () == -1)
    return -1;
  return next (nxdata);
}

#define ssdcache_config_help \
  "ssdcache-file=PATH         The cache file (default: per backend, in\n" \
  "                           $NBDKIT_SSDCACHE_DIR).\n" \
  "ssdcache-size=SIZE         Cache data capacity (default 1G).\n" \
  "ssdcache-page-size=SIZE    Cache page size, 4K..2M (default 64K).\n" \
  "ssdcache-mode=MODE         writethrough (default), writeback or\n" \
  "                           writearound.\n" \
  "ssdcache-flush=cache|backend  Where FLUSH makes writeback data durable\n" \
  "                           (default cache).\n" \
  "ssdcache-writeback-high=PCT  Start writeback above PCT% dirty (50).\n" \
  "ssdcache-writeback-low=PCT   ... down to PCT% (10).\n" \
  "ssdcache-writeback-rate=SIZE Writeback bytes per second (0: no limit).\n" \
  "ssdcache-writeback-idle=MS   Clean all after MS ms idle (1000; 0 off).\n" \
  "ssdcache-writeback-on-exit=BOOL  Write back all at exit (true).\n" \
  "ssdcache-id=STRING         Backend identity (default: from parameters).\n" \
  "ssdcache-reset=BOOL        Re-initialise a mismatched cache.\n" \
  "ssdcache-direct=BOOL       Open the cache file with O_DIRECT (false).\n" \
  "ssdcache-defer-writes=BOOL Writethrough: update cached copies in the\n" \
  "                           background (true).\n" \
  "ssdcache-stats=FILE        Write counters to FILE (at exit, and\n" \
  "                           every ssdcache-stats-interval seconds).\n" \
  "ssdcache-stats-interval=S  Rewrite the counters file every S s (10).\n" \
  "ssdcache-stats-format=text|json|prometheus  Its format (text).\n" \
  "ssdcache-control=SOCKET    A Unix socket for 'ssdcache ctl' (none).\n" \
  "ssdcache-policy=s3fifo|clock  Replacement policy (s3fifo).\n" \
  "ssdcache-seq-cutoff=SIZE   Sequential streams past SIZE bypass the\n" \
  "                           cache (0: off, the default).\n" \
  "ssdcache-seq-streams=N     Streams tracked for the cutoff (16).\n" \
  "ssdcache-verify=off|lazy   Check each cached page against the backend\n" \
  "                           on its first use after start (off).\n" \
  "ssdcache-promote=N         Cache a page on its N-th read miss (1).\n" \
  "ssdcache-partial-pages=N   Pages whose valid or dirty sectors are not\n" \
  "                           one run that RAM keeps exactly (65536).\n" \
  "ssdcache-readahead=auto|off|SIZE  Readahead: adaptive (auto, the\n" \
  "                           default), off, or a fixed window.\n" \
  "ssdcache-readahead-max=SIZE  Largest adaptive window (8M)."

static int
ssdcache_thread_model (void)
{
  return NBDKIT_THREAD_MODEL_PARALLEL;
}

static int
ssdcache_get_ready (int thread_model)
{
  struct cache_config cfg = {
    .path = config.file,
    .private_file = config.file_default,
    .size = config.size,
    .page_size = config.page_size,
    .mode = config.mode,
    .id_digest = { config.digest[0], config.digest[1] },
    .id_text = config.id_text,
    .reset = config.reset,
    .flush_mode = config.flush_mode,
    .wb = config.wb,
    .policy = config.policy,
    .seq_cutoff = config.seq_cutoff,
    .seq_streams = config.seq_streams,
    .verify = config.verify,
    .promote = config.promote,
    .partial_pages = !config.partial_pages_set ? 0
                     : config.partial_pages ? config.partial_pages
                     : CACHE_PARTIAL_NONE,
    .readahead_mode = config.ra_mode,
    .readahead_window = config.ra_window,
    .readahead_max = config.ra_max,
    .direct = config.direct,
    .defer_writes = config.defer_writes,
  };

  cache = cache_open (&cfg);
  return cache ? 0 : -1;
}

/* Adapters from nbdkit_next to the engine's backend interface. */
/* Counts a failed backend request (the backend_errors counter). */
static int
backend_failed (void)
{
  if (cache)
    STATS_ADD (cache_stats (cache), backend_errors, 1);
  return -1;
}

static int
be_pread (void *h, void *buf, uint32_t count, uint64_t offset, int *err)
{
  nbdkit_next *next = h;

  if (next->pread (next, buf, count, offset, 0, err) == -1)
    return backend_failed ();
  return 0;
}

static int
be_flush (void *h, int *err);

static int
be_pwrite (void *h, const void *buf, uint32_t count, uint64_t offset,
           bool fua, int *err)
{
  nbdkit_next *next = h;
  int f = fua ? next->can_fua (next) : NBDKIT_FUA_NONE;

  if (f == -1) {
    *err = EIO;
    return -1;
  }
  if (next->pwrite (next, buf, count, offset,
                    f != NBDKIT_FUA_NONE ? NBDKIT_FLAG_FUA : 0, err) == -1)
    return backend_failed ();
  /* A backend without FUA: a flush gives the same guarantee. */
  if (fua && f == NBDKIT_FUA_NONE)
    return be_flush (h, err);
  return 0;
}

static int
be_flush (void *h, int *err)
{
  nbdkit_next *next = h;
  int r = next->can_flush (next);

  if (r == -1) {
    *err = EIO;
    return -1;
  }
  if (r && next->flush (next, 0, err) == -1)
    return backend_failed ();
  return 0;
}

static struct cache_backend
backend_of (nbdkit_next *next)
{
  struct cache_backend be = { .h = next, .pread = be_pread,
                              .pwrite = be_pwrite, .flush = be_flush };
  return be;
}

static void
close_context (nbdkit_next *next)
{
  next->finalize (next);
  nbdkit_next_context_close (next);
}

static nbdkit_next *
open_context (nbdkit_backend *backend, int readonly)
{
  nbdkit_next *next = nbdkit_next_context_open (backend, readonly, "", 1);

  if (next == NULL)
    return NULL;
  /* nbdkit checks request ranges against the size it learns from the
   * first get_size: ask for it at once.
   */
  if (next->prepare (next) == -1 || next->get_size (next) == -1) {
    nbdkit_next_context_close (next);
    return NULL;
  }
  return next;
}

/* Is this nbdkit running a captive command (--run)?  There, a failing
 * .after_fork leaves the command waiting forever on a socket that
 * nobody serves, so we fail its connections instead.
 */
static bool
is_captive (void)
{
  char buf[8192];
  FILE *fp = fopen ("/proc/self/cmdline", "r");
  size_t n;
  bool r = false;

  if (fp == NULL)
    return false;
  n = fread (buf, 1, sizeof buf - 1, fp);
  fclose (fp);
  buf[n] = '\0';
  for (size_t i = 0; i < n; i += strlen (buf + i) + 1)
    if (strcmp (buf + i, "--run") == 0 || strncmp (buf + i, "--run=", 6) == 0)
      r = true;
  return r;
}

static int attach_backend (nbdkit_backend *backend);
static void start_reporting (nbdkit_backend *backend);

static int
ssdcache_after_fork (nbdkit_backend *backend)
{
  if (attach_backend (backend) == 0) {
    start_reporting (backend);
    return 0;
  }
  if (!is_captive ())
    return -1;
  snprintf (attach_error, sizeof attach_error,
            "ssdcache: the cache could not be started (see the error "
            "above): refusing connections");
  return 0;
}

static int
attach_backend (nbdkit_backend *backend)
{
  nbdkit_next *next;
  int64_t size;
  int err = 0;

  /* A read-only shared context, to learn the backend size. */
  next = open_context (backend, 1);
  if (next == NULL) {
    nbdkit_error ("ssdcache: cannot open a backend context");
    return -1;
  }
  size = next->get_size (next);
  close_context (next);
  if (size == -1 || cache_attach (cache, size) == -1)
    return -1;

  /* Readahead: a read-only context of its own for the prefetch thread.
   * Without it the filter works, only without readahead.
   */
  if (config.ra_mode != READAHEAD_OFF) {
    ra_next = open_context (backend, 1);
    if (ra_next == NULL)
      nbdkit_debug ("ssdcache: no backend context for readahead: "
                    "readahead is off");
    else {
      struct cache_backend be = backend_of (ra_next);
      if (prefetch_start (cache, &be) == -1) {
        close_context (ra_next);
        ra_next = NULL;
      }
    }
  }

  if (cache_mode (cache) != LAYOUT_MODE_WRITEBACK &&
      cache_dirty_pages (cache) == 0)
    return 0;

  /* Writeback, or dirty data left by an earlier writeback run: the
   * writeback thread gets a writable context of its own.
   */
  wb_next = open_context (backend, 0);
  if (wb_next == NULL || wb_next->can_write (wb_next) != 1) {
    nbdkit_error ("ssdcache: %s needs a writable backend%s",
                  cache_mode (cache) == LAYOUT_MODE_WRITEBACK
                  ? "ssdcache-mode=writeback"
                  : "writing back the dirty data left in the cache",
                  cache_mode (cache) == LAYOUT_MODE_WRITEBACK ? "" :
                  " (start once in ssdcache-mode=writeback over a "
                  "writable backend)");
    if (wb_next)
      close_context (wb_next);
    wb_next = NULL;
    return -1;
  }
  if (cache_mode (cache) != LAYOUT_MODE_WRITEBACK) {
    /* Switching away from writeback: write everything back first. */
    struct cache_backend be = backend_of (wb_next);
    nbdkit_debug ("ssdcache: writing back %llu dirty pages before "
                  "switching mode",
                  (unsigned long long) cache_dirty_pages (cache));
    if (cache_writeback_all (cache, &be, &err) == -1) {
      errno = err;
      nbdkit_error ("ssdcache: cannot write back the dirty data left in "
                    "the cache: %m");
      return -1;
    }
    close_context (wb_next);
    wb_next = NULL;
    return 0;
  }
  {
    struct cache_backend be = backend_of (wb_next);
    return writeback_start (cache, &be);
  }
}

/* control_ops.start_writeback: a writable context and the writeback
 * thread, for a switch to writeback mode at run time.
 */
static int
control_start_writeback (char *err, size_t len)
{
  struct cache_backend be;

  if (writeback_running (cache))
    return 0;
  if (wb_next == NULL) {
    wb_next = open_context (the_backend, 0);
    if (wb_next == NULL || wb_next->can_write (wb_next) != 1) {
      snprintf (err, len, "writeback needs a writable backend");
      if (wb_next)
        close_context (wb_next);
      wb_next = NULL;
      return -1;
    }
  }
  be = backend_of (wb_next);
  if (writeback_start (cache, &be) == -1) {
    snprintf (err, len, "the writeback thread could not be started");
    return -1;
  }
  return 0;
}

static const struct control_ops control_ops = {
  .start_writeback = control_start_writeback,
};

/* The threads that only report on or steer the running cache. */
static void
start_reporting (nbdkit_backend *backend)
{
  the_backend = backend;
  if (config.stats_file)
    metrics = metrics_start (cache, config.stats_file, config.stats_format,
                             config.stats_interval);
  if (config.control)
    control = control_start (cache, config.control, &control_ops);
}

static void
ssdcache_cleanup (nbdkit_backend *backend)
{
  if (cache == NULL)
    return;
  control_stop (control);       /* lets a command in progress end */
  control = NULL;
  prefetch_stop (cache);
  if (ra_next) {
    close_context (ra_next);
    ra_next = NULL;
  }
  writeback_stop (cache);
  if (wb_next) {
    if (config.writeback_on_exit && cache_dirty_pages (cache) > 0) {
      struct cache_backend be = backend_of (wb_next);
      int err = 0;
      nbdkit_debug ("ssdcache: writing back %llu dirty pages at exit",
                    (unsigned long long) cache_dirty_pages (cache));
      if (cache_writeback_all (cache, &be, &err) == -1) {
        errno = err;
        nbdkit_error ("ssdcache: writeback at exit failed: %m; the dirty "
                      "data stays in the cache file and will be written "
                      "back at the next start");
      }
    }
    close_context (wb_next);
    wb_next = NULL;
  }
  nbdkit_debug ("ssdcache: %llu dirty pages left in the cache",
                (unsigned long long) cache_dirty_pages (cache));
  stats_debug (cache_stats (cache));
  if (metrics) {
    metrics_stop (metrics);     /* the last version of the file */
    metrics = NULL;
  }
  else if (config.stats_file)
    metrics_write_file (cache, config.stats_file, config.stats_format, 0);
  cache_close (cache);
  cache = NULL;
}

static void *
ssdcache_open (nbdkit_next_open *next, nbdkit_context *nxdata,
               int readonly, const char *exportname, int is_tls)
{
  if (attach_error[0]) {
    nbdkit_error ("%s", attach_error);
    return NULL;
  }
  struct handle *h;

  if (next (nxdata, readonly, exportname) == -1)
    return NULL;
  h = calloc (1, sizeof *h);
  if (h == NULL) {
    nbdkit_error ("calloc: %m");
    return NULL;
  }
  h->pc = prefetch_conn_new (cache);
  return h;
}

static void
ssdcache_close (void *handle)
{
  struct handle *h = handle;

  prefetch_conn_free (h->pc);
  free (h);
}

static int
ssdcache_prepare (nbdkit_next *next, void *handle, int readonly)
{
  /* The cache describes one backend of one size. */
  int64_t size = next->get_size (next);
  uint64_t want;

  if (size == -1)
    return -1;
  want = cache_backend_size (cache);
  if ((uint64_t) size != want) {
    nbdkit_error ("ssdcache: this export has %lld bytes but the cache is "
                  "for a backend of %llu bytes (another export?)",
                  (long long) size, (unsigned long long) want);
    return -1;
  }
  return 0;
}

static int
ssdcache_can_cache (nbdkit_next *next, void *handle)
{
  return NBDKIT_CACHE_NATIVE;
}

static int
ssdcache_pread (nbdkit_next *next, void *handle, void *buf,
                uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct cache_backend be = backend_of (next);
  return cache_read_conn (cache, &be, h->pc, buf, count, offset, err);
}

static int
ssdcache_pwrite (nbdkit_next *next, void *handle, const void *buf,
                 uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct cache_backend be = backend_of (next);
  return cache_write (cache, &be, buf, count, offset,
                      (flags & NBDKIT_FLAG_FUA) != 0, err);
}

struct zt_ctx {
  nbdkit_next *next;
  uint32_t flags;
  bool is_zero;
};

static int
do_zero_trim (void *opaque, uint32_t count, uint64_t offset, int *err)
{
  struct zt_ctx *z = opaque;
  uint32_t flags = z->flags & ~NBDKIT_FLAG_FUA;   /* FUA: done by cache */

  if ((z->is_zero ? z->next->zero (z->next, count, offset, flags, err)
       : z->next->trim (z->next, count, offset, flags, err)) == -1)
    return backend_failed ();
  return 0;
}

static int
ssdcache_zero (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  struct cache_backend be = backend_of (next);
  struct zt_ctx z = { .next = next, .flags = flags, .is_zero = true };
  return cache_zero_trim (cache, &be, true, do_zero_trim, &z, count, offset,
                          (flags & NBDKIT_FLAG_FUA) != 0, err);
}

static int
ssdcache_trim (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  struct cache_backend be = backend_of (next);
  struct zt_ctx z = { .next = next, .flags = flags, .is_zero = false };
  return cache_zero_trim (cache, &be, false, do_zero_trim, &z, count, offset,
                          (flags & NBDKIT_FLAG_FUA) != 0, err);
}

static int
ssdcache_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  struct cache_backend be = backend_of (next);
  return cache_flush (cache, &be, err);
}

/* Writeback: pages holding dirty data are data, whatever the backend
 * says about its (stale) copy of them.
 */
static int
ssdcache_extents (nbdkit_next *next, void *handle, uint32_t count,
                  uint64_t offset, uint32_t flags,
                  struct nbdkit_extents *extents, int *err)
{
  const uint64_t end = offset + count;
  uint64_t pos = offset;

  if (cache_dirty_pages (cache) == 0)
    return next->extents (next, count, offset, flags, extents, err);

  while (pos < end) {
    uint64_t run_end;
    bool dirty = cache_range_dirty (cache, pos, end - pos, &run_end);

    if (dirty) {
      if (nbdkit_add_extent (extents, pos, run_end - pos, 0) == -1) {
        *err = errno;
        return -1;
      }
    }
    else {
      struct nbdkit_extents *be_ext =
        nbdkit_extents_full (next, run_end - pos, pos, 0, err);
      if (be_ext == NULL)
        return -1;
      for (size_t i = 0; i < nbdkit_extents_count (be_ext); i++) {
        struct nbdkit_extent e = nbdkit_get_extent (be_ext, i);
        if (nbdkit_add_extent (extents, e.offset, e.length, e.type) == -1) {
          *err = errno;
          nbdkit_extents_free (be_ext);
          return -1;
        }
      }
      nbdkit_extents_free (be_ext);
    }
    if (flags & NBDKIT_FLAG_REQ_ONE)
      break;
    pos = run_end;
  }
  return 0;
}

static int
ssdcache_can_fua (nbdkit_next *next, void *handle)
{
  /* Writeback handles FUA itself (cache sync, or full writeback). */
  if (cache_mode (cache) == LAYOUT_MODE_WRITEBACK)
    return NBDKIT_FUA_NATIVE;
  return next->can_fua (next);
}

static int
ssdcache_can_flush (nbdkit_next *next, void *handle)
{
  if (cache_mode (cache) == LAYOUT_MODE_WRITEBACK)
    return 1;
  return next->can_flush (next);
}

static int
ssdcache_cache (nbdkit_next *next, void *handle, uint32_t count,
                uint64_t offset, uint32_t flags, int *err)
{
  struct cache_backend be = backend_of (next);
  return cache_prefetch (cache, &be, count, offset, err);
}

static struct nbdkit_filter filter = {
  .name              = "ssdcache",
  .longname          = "nbdkit persistent SSD cache filter",
  .unload            = ssdcache_unload,
  .config            = ssdcache_config,
  .config_complete   = ssdcache_config_complete,
  .config_help       = ssdcache_config_help,
  .thread_model      = ssdcache_thread_model,
  .get_ready         = ssdcache_get_ready,
  .after_fork        = ssdcache_after_fork,
  .cleanup           = ssdcache_cleanup,
  .open              = ssdcache_open,
  .close             = ssdcache_close,
  .prepare           = ssdcache_prepare,
  .can_cache         = ssdcache_can_cache,
  .can_fua           = ssdcache_can_fua,
  .can_flush         = ssdcache_can_flush,
  .extents           = ssdcache_extents,
  .pread             = ssdcache_pread,
  .pwrite            = ssdcache_pwrite,
  .zero              = ssdcache_zero,
  .trim              = ssdcache_trim,
  .flush             = ssdcache_flush,
  .cache             = ssdcache_cache,
};

NBDKIT_REGISTER_FILTER (filter)
