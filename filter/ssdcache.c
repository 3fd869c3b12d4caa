/* nbdkit-ssdcache-filter: nbdkit callbacks (thin).
 *
 * Owns the glue between nbdkit and the cache engine: parameters go to
 * config.c, the cache is opened before nbdkit forks (so that lock and
 * identity errors reach the user) and attached after it, when a shared
 * backend context can tell the backend size.  Data callbacks translate
 * nbdkit_next into struct cache_backend and call cache.c.
 *
 * Locking: the global `cache' is set during start-up, before any
 * connection, and cleared in .cleanup after the last one; the engine
 * does its own locking.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "cache.h"
#include "config.h"
#include "log.h"

static struct cache *cache;

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
  "ssdcache-mode=MODE         writethrough (default) or writearound.\n" \
  "ssdcache-id=STRING         Backend identity (default: from parameters).\n" \
  "ssdcache-reset=BOOL        Re-initialise a mismatched cache.\n" \
  "ssdcache-stats=FILE        Write counters to FILE at exit."

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
    .size = config.size,
    .page_size = config.page_size,
    .mode = config.mode,
    .id_digest = { config.digest[0], config.digest[1] },
    .id_text = config.id_text,
    .reset = config.reset,
  };

  cache = cache_open (&cfg);
  return cache ? 0 : -1;
}

static int
ssdcache_after_fork (nbdkit_backend *backend)
{
  nbdkit_next *next;
  int64_t size;

  /* A shared context, only to learn the backend size. */
  next = nbdkit_next_context_open (backend, 1, "", 1);
  if (next == NULL) {
    nbdkit_error ("ssdcache: cannot open a backend context");
    return -1;
  }
  if (next->prepare (next) == -1) {
    nbdkit_next_context_close (next);
    return -1;
  }
  size = next->get_size (next);
  next->finalize (next);
  nbdkit_next_context_close (next);
  if (size == -1)
    return -1;
  return cache_attach (cache, size);
}

static void
ssdcache_cleanup (nbdkit_backend *backend)
{
  if (cache == NULL)
    return;
  stats_debug (cache_stats (cache));
  if (config.stats_file) {
    FILE *fp = fopen (config.stats_file, "w");
    if (fp == NULL)
      nbdkit_error ("ssdcache-stats: %s: %m", config.stats_file);
    else {
      stats_print (cache_stats (cache), fp);
      if (fclose (fp) == EOF)
        nbdkit_error ("ssdcache-stats: %s: %m", config.stats_file);
    }
  }
  cache_close (cache);
  cache = NULL;
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

/* Adapters from nbdkit_next to the engine's backend interface. */
static int
be_pread (void *h, void *buf, uint32_t count, uint64_t offset, int *err)
{
  nbdkit_next *next = h;
  return next->pread (next, buf, count, offset, 0, err);
}

static int
be_pwrite (void *h, const void *buf, uint32_t count, uint64_t offset,
           bool fua, int *err)
{
  nbdkit_next *next = h;
  return next->pwrite (next, buf, count, offset,
                       fua ? NBDKIT_FLAG_FUA : 0, err);
}

static struct cache_backend
backend_of (nbdkit_next *next)
{
  struct cache_backend be = { .h = next, .pread = be_pread,
                              .pwrite = be_pwrite };
  return be;
}

static int
ssdcache_pread (nbdkit_next *next, void *handle, void *buf,
                uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct cache_backend be = backend_of (next);
  return cache_read (cache, &be, buf, count, offset, err);
}

static int
ssdcache_pwrite (nbdkit_next *next, void *handle, const void *buf,
                 uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct cache_backend be = backend_of (next);
  return cache_write (cache, &be, buf, count, offset,
                      (flags & NBDKIT_FLAG_FUA) != 0, err);
}

static int
ssdcache_zero (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  int r = next->zero (next, count, offset, flags, err);
  /* Even a failed zero may have changed part of the range. */
  cache_invalidate (cache, count, offset);
  if (r == 0 && (flags & NBDKIT_FLAG_FUA))
    cache_sync (cache, err);
  return r;
}

static int
ssdcache_trim (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  int r = next->trim (next, count, offset, flags, err);
  cache_invalidate (cache, count, offset);
  if (r == 0 && (flags & NBDKIT_FLAG_FUA))
    cache_sync (cache, err);
  return r;
}

static int
ssdcache_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  if (next->flush (next, flags, err) == -1)
    return -1;
  return cache_sync (cache, err);
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
  .prepare           = ssdcache_prepare,
  .can_cache         = ssdcache_can_cache,
  .pread             = ssdcache_pread,
  .pwrite            = ssdcache_pwrite,
  .zero              = ssdcache_zero,
  .trim              = ssdcache_trim,
  .flush             = ssdcache_flush,
  .cache             = ssdcache_cache,
};

NBDKIT_REGISTER_FILTER (filter)
