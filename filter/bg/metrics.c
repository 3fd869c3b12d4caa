/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: live metrics (ssdcache-stats).
 *
 * Owns struct metrics and its thread; see metrics.h.  Readers of the
 * file (node_exporter's textfile collector, a script) never see it half
 * written: each version is written to a temporary file beside it and
 * renamed over it.  The writeback throughput is the bytes written back
 * between two samples over the time between them.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include "cache.h"
#include "log.h"
#include "metrics.h"

struct metrics {
  struct cache *c;
  char *path;
  enum stats_format format;
  unsigned interval_s;
  pthread_t thread;
  bool started;

  pthread_mutex_t lock;
  pthread_cond_t wake;           /* CLOCK_MONOTONIC */
  bool stop;
  uint64_t last_bytes, last_ms;  /* the previous sample */
};

int
metrics_write_file (struct cache *c, const char *path,
                    enum stats_format format, double writeback_bytes_per_s)
{
  struct stats_extra x = { .page_size = cache_page_size (c),
                           .writeback_bytes_per_s = writeback_bytes_per_s,
                           .export_name = cache_export_name (c) };
  size_t n = strlen (path) + 16;
  char *tmp = malloc (n);
  FILE *fp = NULL;
  int fd;

  if (tmp == NULL) {
    log_error ("malloc: %m");
    return -1;
  }
  snprintf (tmp, n, "%s.XXXXXX", path);
  fd = mkstemp (tmp);
  if (fd == -1 || fchmod (fd, 0644) == -1 ||
      (fp = fdopen (fd, "w")) == NULL)
    goto err;
  fd = -1;
  stats_write (cache_stats (c), &x, format, fp);
  if (fclose (fp) == EOF) {
    fp = NULL;
    goto err;
  }
  fp = NULL;
  if (rename (tmp, path) == -1)
    goto err;
  free (tmp);
  return 0;

 err:
  log_error ("ssdcache-stats: %s: %m", path);
  if (fp)
    fclose (fp);
  else if (fd >= 0)
    close (fd);
  unlink (tmp);
  free (tmp);
  return -1;
}

/* Take a sample and write the file.  Under m->lock. */
static void
sample_locked (struct metrics *m)
{
  uint64_t bytes = STATS_GET (cache_stats (m->c), bytes_written_back);
  uint64_t ms = cache_now_ms ();
  double rate = 0;

  if (ms > m->last_ms)
    rate = (double) (bytes - m->last_bytes) * 1000 / (ms - m->last_ms);
  m->last_bytes = bytes;
  m->last_ms = ms;
  metrics_write_file (m->c, m->path, m->format, rate);
}

static void *
metrics_thread (void *arg)
{
  struct metrics *m = arg;

  pthread_mutex_lock (&m->lock);
  while (!m->stop) {
    struct timespec ts;

    clock_gettime (CLOCK_MONOTONIC, &ts);
    ts.tv_sec += m->interval_s;
    while (!m->stop &&
           pthread_cond_timedwait (&m->wake, &m->lock, &ts) != ETIMEDOUT)
      ;
    if (!m->stop)
      sample_locked (m);
  }
  pthread_mutex_unlock (&m->lock);
  return NULL;
}

static void
metrics_free (struct metrics *m)
{
  pthread_cond_destroy (&m->wake);
  pthread_mutex_destroy (&m->lock);
  free (m->path);
  free (m);
}

struct metrics *
metrics_start (struct cache *c, const char *path, enum stats_format format,
               unsigned interval_s)
{
  struct metrics *m = calloc (1, sizeof *m);
  pthread_condattr_t ca;
  int r;

  if (m == NULL || (m->path = strdup (path)) == NULL) {
    log_error ("malloc: %m");
    free (m);
    return NULL;
  }
  m->c = c;
  m->format = format;
  m->interval_s = interval_s;
  pthread_mutex_init (&m->lock, NULL);
  pthread_condattr_init (&ca);
  pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);
  pthread_cond_init (&m->wake, &ca);
  pthread_condattr_destroy (&ca);
  m->last_bytes = STATS_GET (cache_stats (c), bytes_written_back);
  m->last_ms = cache_now_ms ();
  if (interval_s == 0)
    return m;
  metrics_write_file (c, path, format, 0);
  r = pthread_create (&m->thread, NULL, metrics_thread, m);
  if (r != 0) {
    errno = r;
    log_error ("ssdcache-stats: cannot start the metrics thread: %m");
    metrics_free (m);
    return NULL;
  }
  m->started = true;
  return m;
}

void
metrics_stop (struct metrics *m)
{
  if (m == NULL)
    return;
  pthread_mutex_lock (&m->lock);
  m->stop = true;
  pthread_cond_signal (&m->wake);
  pthread_mutex_unlock (&m->lock);
  if (m->started)
    pthread_join (m->thread, NULL);
  pthread_mutex_lock (&m->lock);
  sample_locked (m);
  pthread_mutex_unlock (&m->lock);
  metrics_free (m);
}
