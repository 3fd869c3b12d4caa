/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: nbdkit callbacks (thin).
 *
 * Owns the glue between nbdkit and the caches: parameters go to
 * config.c, each export's cache is exports.c's.  The default export's
 * cache is opened before nbdkit forks (so that lock and identity errors
 * reach the user) and, when the plugin can be opened outside a client
 * connection (probe_shared, a forked probe), attached after it with
 * contexts of its own, as a single-export filter would.  Otherwise,
 * and for every named export, the cache is attached by the first
 * connection to it.  Data callbacks turn nbdkit_next into a struct
 * cache_backend for the engine (engine/cache.h).
 *
 * Locking: default_export and the probe result are set during start-up,
 * before any connection; control_lock guards starting the control
 * socket from a connection; exports.h has the rest.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <nbdkit-filter.h>

#include "cache.h"
#include "config.h"
#include "exports.h"
#include "log.h"
#include "pagetable.h"
#include "prefetch.h"
#include "writeback.h"
#include "control.h"
#include "metrics.h"
#include "readahead.h"

static struct export *default_export;

/* The live metrics writer is per export (exports.c).  The control
 * socket (ssdcache-control), or NULL, steers one export: the default
 * export when it is attached at start, else the first one attached.
 */
static struct control *control;
static nbdkit_backend *the_backend;    /* from .after_fork */
static struct export *control_export;
static pthread_mutex_t control_lock = PTHREAD_MUTEX_INITIALIZER;

/* Per connection. */
struct handle {
  struct export *e;
  struct lender *lender;         /* from .prepare to .finalize */
  struct prefetch_conn *pc;      /* its readahead state, or NULL */
  bool mc_fua;                   /* see ssdcache_can_multi_conn */
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
  "ssdcache-writeback-depth=N   Backend writes in flight (8).\n" \
  "ssdcache-writeback-max-dirty=SIZE|PCT%  Dirty data cap (none).\n" \
  "ssdcache-writeback-max-age=S  Write back data older than S s (0 off).\n" \
  "ssdcache-writeback-on-exit=BOOL  Write back all at exit (true).\n" \
  "ssdcache-id=STRING         Backend identity (default: from parameters).\n" \
  "ssdcache-reset=BOOL        Re-initialise a mismatched cache.\n" \
  "ssdcache-resize-move=SIZE  Hot pages a resize may copy into slots it\n" \
  "                           keeps (2G).\n" \
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
  "ssdcache-readahead-max=SIZE  Largest adaptive window (8M).\n" \
  "ssdcache-fill-behind=BOOL  Answer read misses before storing them\n" \
  "                           (true).\n" \
  "ssdcache-warm=off|all      Read the whole backend into the cache in\n" \
  "                           the background (off).\n" \
  "ssdcache-warm-rate=SIZE    Warm-up bytes per second (no limit).\n" \
  "ssdcache-exports=each|one  A cache per export name (each, the\n" \
  "                           default) or one for all names."

/* nbdkit 1.44 passes the next layer's thread model. */
#if NBDKIT_VERSION_MAJOR > 1 || NBDKIT_VERSION_MINOR >= 44
static int
ssdcache_thread_model (int next_thread_model)
#else
static int
ssdcache_thread_model (void)
#endif
{
  return NBDKIT_THREAD_MODEL_PARALLEL;
}

/* nbdkit --filter=ssdcache null --dump-plugin (nbdkit 1.36 and later
 * call it for filters).
 */
#if NBDKIT_VERSION_MAJOR > 1 || NBDKIT_VERSION_MINOR >= 36
#define HAVE_DUMP_PLUGIN 1
static void
ssdcache_dump_plugin (void)
{
  char *dir = config_default_dir ();

  printf ("ssdcache_version=%s\n", PACKAGE_VERSION);
  printf ("ssdcache_page_size_min=%u\n", (unsigned) LAYOUT_MIN_PAGE);
  printf ("ssdcache_page_size_max=%u\n", (unsigned) LAYOUT_MAX_PAGE);
  printf ("ssdcache_page_size_default=%u\n", (unsigned) CACHE_DEFAULT_PAGE);
  printf ("ssdcache_default_dir=%s\n", dir ? dir : "");
  free (dir);
}
#endif

static int
ssdcache_get_ready (int thread_model)
{
  /* Writeback's requests in flight run side by side on one backend
   * context: only a plugin that takes parallel requests may get them.
   */
  if (thread_model < NBDKIT_THREAD_MODEL_PARALLEL && config.wb.depth > 1) {
    nbdkit_debug ("ssdcache: the plugin serialises requests: "
                  "ssdcache-writeback-depth=1");
    config.wb.depth = 1;
  }
  exports_init (config.exports != CONFIG_EXPORTS_ONE
                ? (config.size ? config.size : CACHE_DEFAULT_SIZE) : 0,
                thread_model, config.exports_max);
  default_export = exports_get ("");
  return default_export ? 0 : -1;
}

/* Does every export name get the default export's cache?  With
 * ssdcache-exports=auto, when the plugin opens without a client
 * connection (plugin_shared): it cannot tell names apart, so two
 * names are one disk, and two caches of it would each serve their own
 * stale data.
 */
static bool plugin_shared;

static bool
one_cache (void)
{
  return config.exports == CONFIG_EXPORTS_ONE ||
    (config.exports == CONFIG_EXPORTS_AUTO && plugin_shared);
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

/* Can the plugin be opened outside a client connection?  A plugin
 * that serves several exports asks nbdkit for the export name in its
 * open, and nbdkit 1.32 has none to give there: "no connection in this
 * thread", and some plugins (file dir=) then crash.  So a child process
 * tries first; its error output is read, not shown.  False if the child
 * died, or the plugin asked for an export name; true otherwise (a
 * plugin that fails for another reason fails again in the parent, with
 * its error shown, as it always did).
 *
 * The child may also hang: a plugin that serves its requests from
 * threads started in its .after_fork (nbdkit 1.42's curl plugin) waits
 * forever for threads the child does not have.  A plugin that asks for
 * an export name does so at once: after PROBE_MS the child is killed,
 * and the plugin is taken as one that asks nothing.
 */
#define PROBE_MS 2000

/* In the probe's child: a crash kills it at once, with no core dump
 * and no sanitizer report.  Either can take longer than PROBE_MS (a
 * report is symbolized, a core goes to a dump handler), and a daemon
 * logs the plugin's "no connection" error to syslog, not to the pipe:
 * the crash was then taken for a hang, and the parent crashed in the
 * same open.
 */
static void
probe_die_at_once (void)
{
  static const int sigs[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT };
  struct rlimit none = { 0, 0 };

  setrlimit (RLIMIT_CORE, &none);
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
    signal (sigs[i], SIG_DFL);
}

static bool
probe_shared (nbdkit_backend *backend)
{
  int fds[2], status;
  char out[4096], drain[512];
  size_t n = 0;
  ssize_t r;
  pid_t pid;
  struct pollfd pfd;
  struct timespec t0, t;
  bool hung = false;

  if (pipe (fds) == -1)
    return true;
  pid = fork ();
  if (pid == -1) {
    close (fds[0]);
    close (fds[1]);
    return true;
  }
  if (pid == 0) {
    nbdkit_next *next;
    prctl (PR_SET_PDEATHSIG, SIGKILL);
    probe_die_at_once ();
    dup2 (fds[1], 2);
    close (fds[0]);
    next = open_context (backend, 1);
    _exit (next ? 0 : 1);
  }
  close (fds[1]);
  pfd.fd = fds[0];
  pfd.events = POLLIN;
  clock_gettime (CLOCK_MONOTONIC, &t0);
  for (;;) {
    long ms;

    clock_gettime (CLOCK_MONOTONIC, &t);
    ms = PROBE_MS - ((t.tv_sec - t0.tv_sec) * 1000 +
                     (t.tv_nsec - t0.tv_nsec) / 1000000);
    if (ms <= 0 || (r = poll (&pfd, 1, ms)) == 0) {
      hung = true;
      break;
    }
    if (r == -1) {
      if (errno == EINTR)
        continue;
      break;
    }
    if (n < sizeof out - 1)
      r = read (fds[0], out + n, sizeof out - 1 - n);
    else
      r = read (fds[0], drain, sizeof drain);
    if (r > 0 && n < sizeof out - 1)
      n += r;
    else if (r == 0 || (r == -1 && errno != EINTR))
      break;                    /* the child is done */
  }
  out[n] = '\0';
  close (fds[0]);
  if (hung)
    kill (pid, SIGKILL);
  while (waitpid (pid, &status, 0) == -1 && errno == EINTR)
    ;
  if (hung && !strstr (out, "no connection in this thread")) {
    if (ssdcache_debug_exports)
      nbdkit_debug ("ssdcache: the plugin's open did not end in %d ms in "
                    "the probe: taken as asking for no export", PROBE_MS);
    return true;
  }
  if (WIFSIGNALED (status) || strstr (out, "no connection in this thread")) {
    if (ssdcache_debug_exports)
      nbdkit_debug ("ssdcache: the plugin needs a client connection "
                    "(probe: %s): exports are attached by their first "
                    "connection", WIFSIGNALED (status)
                    ? strsignal (WTERMSIG (status)) : "asks for the export");
    return false;
  }
  return true;
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
static void start_control (struct export *e);

static int
ssdcache_after_fork (nbdkit_backend *backend)
{
  the_backend = backend;
  plugin_shared = probe_shared (backend);
  /* (Either way the default export stays open until exit: its file was
   * opened and locked before nbdkit forked, and the parent process may
   * keep its lock.)
   */
  if (!plugin_shared)
    return 0;                   /* attached by connections */
  if (attach_backend (backend) == 0) {
    start_control (default_export);
    return 0;
  }
  if (!is_captive ())
    return -1;
  snprintf (attach_error, sizeof attach_error,
            "ssdcache: the cache could not be started (see the error "
            "above): refusing connections");
  return 0;
}

/* The default export with contexts of its own: the size from a
 * read-only one, readahead on another, and a writable one for
 * writeback or dirty data left by an earlier writeback run.
 */
static int
attach_backend (nbdkit_backend *backend)
{
  struct cache *cache;
  nbdkit_next *next, *ra = NULL, *wb = NULL;
  int64_t size;

  next = open_context (backend, 1);
  if (next == NULL) {
    nbdkit_error ("ssdcache: cannot open a backend context");
    return -1;
  }
  size = next->get_size (next);
  close_context (next);
  if (export_attach_fixed (default_export, size) == -1)
    return -1;
  cache = export_cache (default_export);   /* a resize makes another */

  /* Without a readahead context the filter works, without readahead. */
  if (config.readahead_mode != READAHEAD_OFF &&
      (ra = open_context (backend, 1)) == NULL)
    nbdkit_debug ("ssdcache: no backend context for readahead: "
                  "readahead is off");

  if (cache_mode (cache) == LAYOUT_MODE_WRITEBACK ||
      cache_dirty_pages (cache) > 0) {
    wb = open_context (backend, 0);
    if (wb == NULL || wb->can_write (wb) != 1) {
      nbdkit_error ("ssdcache: %s needs a writable backend%s",
                    cache_mode (cache) == LAYOUT_MODE_WRITEBACK
                    ? "ssdcache-mode=writeback"
                    : "writing back the dirty data left in the cache",
                    cache_mode (cache) == LAYOUT_MODE_WRITEBACK ? "" :
                    " (start once in ssdcache-mode=writeback over a "
                    "writable backend)");
      if (wb)
        close_context (wb);
      wb = NULL;
      export_start_fixed (default_export, NULL, ra);
      return -1;
    }
  }
  return export_start_fixed (default_export, wb, ra);
}

/* control_ops.start_writeback: the writeback thread, for a switch to
 * writeback mode at run time.
 */
static int
control_start_writeback (char *err, size_t len)
{
  nbdkit_next *wb;

  if (control_export == default_export && export_fixed (default_export) &&
      !export_has_writer (default_export)) {
    /* The fixed export gets a writable context of its own. */
    wb = open_context (the_backend, 0);
    if (wb == NULL || wb->can_write (wb) != 1) {
      snprintf (err, len, "writeback needs a writable backend");
      if (wb)
        close_context (wb);
      return -1;
    }
    if (export_start_fixed (default_export, wb, NULL) == -1) {
      snprintf (err, len, "the writeback thread could not be started");
      return -1;
    }
  }
  return export_start_writeback (control_export, err, len);
}

static const struct control_ops control_ops = {
  .start_writeback = control_start_writeback,
};

static void
start_control (struct export *e)
{
  pthread_mutex_lock (&control_lock);
  if (config.control && control == NULL && control_export == NULL) {
    control_export = e;
    export_hold (e, true);      /* steered until exit */
    control = control_start (export_cache (e), config.control, &control_ops);
  }
  pthread_mutex_unlock (&control_lock);
}

static void
ssdcache_cleanup (nbdkit_backend *backend)
{
  control_stop (control);       /* lets a command in progress end */
  control = NULL;
  exports_cleanup ();
  default_export = NULL;
}

static void *
ssdcache_open (nbdkit_next_open *next, nbdkit_context *nxdata,
               int readonly, const char *exportname, int is_tls)
{
  struct handle *h;
  struct export *e;

  if (attach_error[0]) {
    nbdkit_error ("%s", attach_error);
    return NULL;
  }
  if (next (nxdata, readonly, exportname) == -1)
    return NULL;
  if (one_cache ()) {
    e = default_export;
    export_hold (e, false);
  }
  else if ((e = exports_get (exportname)) == NULL)
    return NULL;
  h = calloc (1, sizeof *h);
  if (h == NULL) {
    nbdkit_error ("calloc: %m");
    export_put (e);
    return NULL;
  }
  h->e = e;
  return h;
}

static void
ssdcache_close (void *handle)
{
  struct handle *h = handle;

  prefetch_conn_free (h->pc);
  export_put (h->e);
  free (h);
}

/* The export's cache is attached by its first connection (or at
 * start), and describes a backend of one size.
 */
static int
ssdcache_prepare (nbdkit_next *next, void *handle, int readonly)
{
  struct handle *h = handle;

  h->lender = export_connect (h->e, next, readonly);
  if (h->lender == NULL)
    return -1;
  h->pc = prefetch_conn_new (export_cache (h->e));
  start_control (h->e);
  return 0;
}

static int
ssdcache_finalize (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;

  if (h->lender)
    export_disconnect (h->e, h->lender);
  h->lender = NULL;
  return 0;
}

/* A connection that was promised multi-conn over a plugin that does
 * not offer it (ssdcache_can_multi_conn) sends whatever goes from it
 * to the plugin with FUA: a FLUSH on another connection reaches the
 * plugin through that other connection only.
 */
struct fua_backend {
  struct cache_backend inner;
};

static int
fua_pread (void *h, void *buf, uint32_t count, uint64_t offset, int *err)
{
  const struct cache_backend *b = &((struct fua_backend *) h)->inner;
  return b->pread (b->h, buf, count, offset, err);
}

static int
fua_pwrite (void *h, const void *buf, uint32_t count, uint64_t offset,
            bool fua, int *err)
{
  const struct cache_backend *b = &((struct fua_backend *) h)->inner;
  return b->pwrite (b->h, buf, count, offset, true, err);
}

static int
fua_flush (void *h, int *err)
{
  const struct cache_backend *b = &((struct fua_backend *) h)->inner;
  return b->flush (b->h, err);
}

static struct cache_backend
conn_backend (void *handle, struct fua_backend *fb)
{
  struct cache_backend be = { .h = fb, .pread = fua_pread,
                              .pwrite = fua_pwrite,
                              .flush = fb->inner.flush ? fua_flush : NULL };

  return ((struct handle *) handle)->mc_fua ? be : fb->inner;
}

#define CACHE_OF(handle) export_cache (((struct handle *) (handle))->e)
#define LENDER_OF(handle) (((struct handle *) (handle))->lender)
#define REQ(next, handle) \
  struct export_req req = { .next = next, .cache = CACHE_OF (handle), \
                            .lender = LENDER_OF (handle) }; \
  struct fua_backend fb_ = { .inner = export_backend (&req) }; \
  struct cache_backend be = conn_backend (handle, &fb_)

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
  int r;
  REQ (next, handle);
  prefetch_read_begin (h->pc, count);
  r = cache_read_conn (req.cache, &be, h->pc, buf, count, offset, err);
  prefetch_read_end (h->pc, count);
  return r;
}

static int
ssdcache_pwrite (nbdkit_next *next, void *handle, const void *buf,
                 uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  REQ (next, handle);
  return cache_write (req.cache, &be, buf, count, offset,
                      (flags & NBDKIT_FLAG_FUA) != 0, err);
}

struct zt_ctx {
  nbdkit_next *next;
  struct cache *cache;
  struct lender *lender;
  uint32_t flags;
  bool is_zero;
  bool mc_fua;                  /* the connection's mc_fua */
};

static int
do_zero_trim (void *opaque, uint32_t count, uint64_t offset, int *err)
{
  struct zt_ctx *z = opaque;
  uint32_t flags = z->flags & ~NBDKIT_FLAG_FUA;   /* FUA: done by cache */
  int fua = z->mc_fua ? z->next->can_fua (z->next) : NBDKIT_FUA_NONE;
  int r;

  if (fua == -1) {
    *err = EIO;
    return -1;
  }
  if (fua != NBDKIT_FUA_NONE)
    flags |= NBDKIT_FLAG_FUA;
  export_turn_take (z->lender);
  r = z->is_zero ? z->next->zero (z->next, count, offset, flags, err)
    : z->next->trim (z->next, count, offset, flags, err);
  if (r == 0 && z->mc_fua && fua == NBDKIT_FUA_NONE &&
      z->next->can_flush (z->next) == 1)
    r = z->next->flush (z->next, 0, err);
  export_turn_give (z->lender);
  if (r == -1) {
    STATS_ADD (cache_stats (z->cache), backend_errors, 1);
    return -1;
  }
  return 0;
}

static int
zero_trim (nbdkit_next *next, void *handle, bool is_zero, uint32_t count,
           uint64_t offset, uint32_t flags, int *err)
{
  REQ (next, handle);
  struct zt_ctx z = { .next = next, .cache = req.cache,
                      .lender = req.lender, .flags = flags,
                      .is_zero = is_zero,
                      .mc_fua = ((struct handle *) handle)->mc_fua };
  const struct cache_zero_op op = { .is_zero = is_zero,
                                   .do_op = do_zero_trim, .opaque = &z };

  return cache_zero_trim (req.cache, &be, &op, count, offset,
                          (flags & NBDKIT_FLAG_FUA) != 0, err);
}

static int
ssdcache_zero (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  return zero_trim (next, handle, true, count, offset, flags, err);
}

static int
ssdcache_trim (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  return zero_trim (next, handle, false, count, offset, flags, err);
}

static int
ssdcache_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  REQ (next, handle);
  return cache_flush (req.cache, &be, err);
}

static int extents_of (nbdkit_next *next, struct cache *cache,
                       uint32_t count, uint64_t offset, uint32_t flags,
                       struct nbdkit_extents *extents, int *err);

/* Writeback: pages holding dirty data are data, whatever the backend
 * says about its (stale) copy of them.
 */
static int
ssdcache_extents (nbdkit_next *next, void *handle, uint32_t count,
                  uint64_t offset, uint32_t flags,
                  struct nbdkit_extents *extents, int *err)
{
  struct cache *cache = CACHE_OF (handle);
  struct lender *l = LENDER_OF (handle);
  int r;

  export_turn_take (l);
  r = extents_of (next, cache, count, offset, flags, extents, err);
  export_turn_give (l);
  return r;
}

static int
extents_of (nbdkit_next *next, struct cache *cache, uint32_t count,
            uint64_t offset, uint32_t flags, struct nbdkit_extents *extents,
            int *err)
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
  if (cache_mode (CACHE_OF (handle)) == LAYOUT_MODE_WRITEBACK)
    return NBDKIT_FUA_NATIVE;
  return next->can_fua (next);
}

static int
ssdcache_can_flush (nbdkit_next *next, void *handle)
{
  if (cache_mode (CACHE_OF (handle)) == LAYOUT_MODE_WRITEBACK)
    return 1;
  return next->can_flush (next);
}

/* Like nbdkit's cache and cow filters: requests of at least a cache
 * page are preferred (smaller writes make partial pages), within the
 * plugin's maximum.
 */
static int
ssdcache_block_size (nbdkit_next *next, void *handle, uint32_t *minimum,
                     uint32_t *preferred, uint32_t *maximum)
{
  uint32_t page = cache_page_size (CACHE_OF (handle));

  if (next->block_size (next, minimum, preferred, maximum) == -1)
    return -1;
  if (*minimum == 0) {          /* the plugin sets no constraint */
    *minimum = 1;
    *preferred = page;
    *maximum = 0xffffffff;
  }
  else if (*maximum >= page && *preferred < page)
    *preferred = page;
  return 0;
}

/* Multi-conn: a FLUSH on one connection covers the writes completed on
 * every connection.
 *
 * Where the plugin says so, that holds in every mode: the cache file
 * is one per export, synced by any connection's FLUSH, and whatever
 * went to the plugin is covered by the plugin's own promise.
 *
 * Otherwise only in writeback mode (either ssdcache-flush): writes stay
 * in the cache, and the writeback thread flushes the plugin before a
 * page it wrote back counts as clean.  What a connection sends to the
 * plugin itself (zeroes and trims, writes that find the cache full,
 * everything once the cache device failed, and every write after a
 * run-time switch to writethrough or writearound) is covered by no
 * other connection's flush: a connection told yes sends all of it with
 * FUA, for as long as it lives (mc_fua).  Told in writethrough or
 * writearound mode, it gets the plugin's no.
 */
static int
ssdcache_can_multi_conn (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  int r = next->can_multi_conn (next);

  if (r != 0)
    return r;
  if (cache_mode (CACHE_OF (handle)) != LAYOUT_MODE_WRITEBACK)
    return 0;
  h->mc_fua = true;
  return 1;
}

/* Reads are served from the cache device: rotational or not as it is
 * (sysfs).  Without a device to ask (tmpfs...), or once the cache
 * device failed, the plugin's answer.
 */
static int
ssdcache_is_rotational (nbdkit_next *next, void *handle)
{
  int r = cache_rotational (CACHE_OF (handle));

  return r >= 0 ? r : next->is_rotational (next);
}

static int
ssdcache_cache (nbdkit_next *next, void *handle, uint32_t count,
                uint64_t offset, uint32_t flags, int *err)
{
  REQ (next, handle);
  return cache_preload (req.cache, &be, count, offset, err);
}

static struct nbdkit_filter filter = {
  .name              = "ssdcache",
  .longname          = "nbdkit persistent SSD cache filter",
  .unload            = ssdcache_unload,
  .config            = ssdcache_config,
  .config_complete   = ssdcache_config_complete,
  .config_help       = ssdcache_config_help,
  .thread_model      = ssdcache_thread_model,
#ifdef HAVE_DUMP_PLUGIN
  .dump_plugin       = ssdcache_dump_plugin,
#endif
  .get_ready         = ssdcache_get_ready,
  .after_fork        = ssdcache_after_fork,
  .cleanup           = ssdcache_cleanup,
  .open              = ssdcache_open,
  .close             = ssdcache_close,
  .prepare           = ssdcache_prepare,
  .finalize          = ssdcache_finalize,
  .can_cache         = ssdcache_can_cache,
  .can_fua           = ssdcache_can_fua,
  .can_flush         = ssdcache_can_flush,
  .can_multi_conn    = ssdcache_can_multi_conn,
  .block_size        = ssdcache_block_size,
  .is_rotational     = ssdcache_is_rotational,
  .extents           = ssdcache_extents,
  .pread             = ssdcache_pread,
  .pwrite            = ssdcache_pwrite,
  .zero              = ssdcache_zero,
  .trim              = ssdcache_trim,
  .flush             = ssdcache_flush,
  .cache             = ssdcache_cache,
};

NBDKIT_REGISTER_FILTER (filter)
