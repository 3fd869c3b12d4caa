/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: log.h implemented on stderr.
 *
 * log_error always prints; log_debug prints only when the environment
 * variable SSDCACHE_TEST_DEBUG is set.  Tests that need to check that an
 * error was reported, and what it said, include log-stderr.h: the count
 * and the last error, and a look for a message among all errors logged
 * since a point.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "log-stderr.h"

int ssdcache_debug_verbose;
int ssdcache_debug_recovery;
int ssdcache_debug_verify;
int ssdcache_debug_readahead;
int ssdcache_debug_warm;
int ssdcache_debug_order;
int ssdcache_debug_resize_kill;
int ssdcache_debug_evict_steps;
int ssdcache_debug_epoch_span;

int log_error_count;
char log_error_last[512];

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char seen[65536];          /* errors since log_errors_forget */
static size_t nseen;

void
log_errors_forget (void)
{
  pthread_mutex_lock (&log_lock);
  nseen = 0;
  seen[0] = '\0';
  pthread_mutex_unlock (&log_lock);
}

int
log_errors_contain (const char *text)
{
  int r;

  pthread_mutex_lock (&log_lock);
  r = strstr (seen, text) != NULL;
  pthread_mutex_unlock (&log_lock);
  return r;
}

void
log_error (const char *fs, ...)
{
  va_list args;

  pthread_mutex_lock (&log_lock);
  log_error_count++;
  va_start (args, fs);
  vsnprintf (log_error_last, sizeof log_error_last, fs, args);
  va_end (args);
  fprintf (stderr, "ssdcache: error: %s\n", log_error_last);
  nseen += snprintf (seen + nseen, sizeof seen - nseen, "%s\n",
                     log_error_last);
  if (nseen >= sizeof seen)
    nseen = sizeof seen - 1;
  pthread_mutex_unlock (&log_lock);
}

void
log_debug (const char *fs, ...)
{
  va_list args;

  if (getenv ("SSDCACHE_TEST_DEBUG") == NULL)
    return;

  pthread_mutex_lock (&log_lock);
  fprintf (stderr, "ssdcache: debug: ");
  va_start (args, fs);
  vfprintf (stderr, fs, args);
  va_end (args);
  fprintf (stderr, "\n");
  pthread_mutex_unlock (&log_lock);
}
