/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: parameters and backend identity.
 *
 * Owns the global struct config; see config.h.  Configuration runs
 * single-threaded, so nothing here is locked.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include <nbdkit-filter.h>

#include "cache.h"
#include "config.h"
#include "pagetable.h"
#include "admit.h"
#include "evict.h"
#include "readahead.h"

struct config config = {
  .mode = CACHE_DEFAULT_MODE,
  .flush_mode = CACHE_DEFAULT_FLUSH,
  .wb = { .high_pct = CACHE_DEFAULT_WB_HIGH, .low_pct = CACHE_DEFAULT_WB_LOW,
          .rate = 0, .idle_ms = CACHE_DEFAULT_WB_IDLE_MS },
  .writeback_on_exit = true,
  .defer_writes = CACHE_DEFAULT_DEFER_WRITES,
  .policy = EVICT_DEFAULT,
  .seq_cutoff = 0,
  .seq_streams = CACHE_DEFAULT_SEQ_STREAMS,
  .promote = ADMIT_NHIT_DEFAULT_N,
  .ra_mode = READAHEAD_AUTO,
  .ra_max = READAHEAD_DEFAULT_MAX,
};

/* The identity is a list of "key=value\n" lines, hashed twice. */
static char *ident;
static size_t ident_len;

/* Filters that never change the data they pass on: their parameters
 * are not part of the backend identity.
 */
static const char *const ignored_prefixes[] = {
  "stats", "delay-", "rate", "connection-rate", "error", "log", "retry",
  NULL
};

/* Parameters whose values must not be written into the cache file. */
static bool
is_secret (const char *key)
{
  return strstr (key, "password") || strstr (key, "secret") ||
    strstr (key, "token") || strstr (key, "cookie") ||
    strstr (key, "header") || strstr (key, "key");
}

/* nbdkit's parsers say what is wrong but not where: add the where. */
static int
bad_value (const char *key, const char *value)
{
  nbdkit_error ("%s: invalid value '%s'", key, value);
  return -1;
}

static int
parse_pow2_page (const char *key, const char *value, uint32_t *out)
{
  int64_t v = nbdkit_parse_size (value);

  if (v == -1)
    return bad_value (key, value);
  if (v < LAYOUT_MIN_PAGE || v > LAYOUT_MAX_PAGE || (v & (v - 1)) != 0) {
    nbdkit_error ("%s: must be a power of two from 4K to 2M, not %s",
                  key, value);
    return -1;
  }
  *out = v;
  return 0;
}

int
config_set (const char *key, const char *value)
{
  if (strcmp (key, "ssdcache-file") == 0) {
    if (*value == '\0') {
      nbdkit_error ("%s: the path must not be empty", key);
      return -1;
    }
    free (config.file);
    config.file = nbdkit_absolute_path (value);
    return config.file ? 0 : -1;
  }
  if (strcmp (key, "ssdcache-size") == 0) {
    int64_t v = nbdkit_parse_size (value);
    if (v == -1)
      return bad_value (key, value);
    if (v == 0) {
      nbdkit_error ("%s: the cache size must be greater than zero", key);
      return -1;
    }
    config.size = v;
    return 0;
  }
  if (strcmp (key, "ssdcache-page-size") == 0)
    return parse_pow2_page (key, value, &config.page_size);
  if (strcmp (key, "ssdcache-mode") == 0) {
    if (strcmp (value, "writethrough") == 0)
      config.mode = LAYOUT_MODE_WRITETHROUGH;
    else if (strcmp (value, "writearound") == 0)
      config.mode = LAYOUT_MODE_WRITEAROUND;
    else if (strcmp (value, "writeback") == 0)
      config.mode = LAYOUT_MODE_WRITEBACK;
    else {
      nbdkit_error ("%s: unknown mode '%s' (expected writethrough, "
                    "writeback or writearound)", key, value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "ssdcache-id") == 0) {
    if (*value == '\0') {
      nbdkit_error ("%s: the identity must not be empty", key);
      return -1;
    }
    free (config.id);
    config.id = strdup (value);
    return config.id ? 0 : -1;
  }
  if (strcmp (key, "ssdcache-reset") == 0) {
    int r = nbdkit_parse_bool (value);
    if (r == -1)
      return bad_value (key, value);
    config.reset = r;
    return 0;
  }
  if (strcmp (key, "ssdcache-direct") == 0) {
    int r = nbdkit_parse_bool (value);
    if (r == -1)
      return bad_value (key, value);
    config.direct = r;
    return 0;
  }
  if (strcmp (key, "ssdcache-defer-writes") == 0) {
    int r = nbdkit_parse_bool (value);
    if (r == -1)
      return bad_value (key, value);
    config.defer_writes = r;
    return 0;
  }
  if (strcmp (key, "ssdcache-stats") == 0) {
    if (*value == '\0') {
      nbdkit_error ("%s: the path must not be empty", key);
      return -1;
    }
    free (config.stats_file);
    config.stats_file = nbdkit_absolute_path (value);
    return config.stats_file ? 0 : -1;
  }
  if (strcmp (key, "ssdcache-policy") == 0) {
    enum evict_policy p;
    if (evict_policy_parse (value, &p) == -1) {
      nbdkit_error ("%s: unknown policy '%s' (expected %s or %s)", key, value,
                    evict_policy_name (EVICT_S3FIFO),
                    evict_policy_name (EVICT_CLOCK));
      return -1;
    }
    config.policy = p;
    return 0;
  }
  if (strcmp (key, "ssdcache-seq-cutoff") == 0) {
    int64_t v = nbdkit_parse_size (value);
    if (v == -1)
      return bad_value (key, value);
    config.seq_cutoff = v;
    return 0;
  }
  if (strcmp (key, "ssdcache-verify") == 0) {
    if (strcmp (value, "off") == 0)
      config.verify = false;
    else if (strcmp (value, "lazy") == 0)
      config.verify = true;
    else {
      nbdkit_error ("%s: expected off or lazy, not '%s'", key, value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "ssdcache-seq-streams") == 0) {
    if (nbdkit_parse_unsigned (key, value, &config.seq_streams) == -1)
      return bad_value (key, value);
    if (config.seq_streams == 0 || config.seq_streams > 1024) {
      nbdkit_error ("%s: from 1 to 1024, not %s", key, value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "ssdcache-partial-pages") == 0) {
    if (nbdkit_parse_uint32_t (key, value, &config.partial_pages) == -1)
      return bad_value (key, value);
    if (config.partial_pages > PT_SIDE_MAX) {
      nbdkit_error ("%s: at most %u, not %s", key, PT_SIDE_MAX, value);
      return -1;
    }
    config.partial_pages_set = true;
    return 0;
  }
  if (strcmp (key, "ssdcache-promote") == 0) {
    if (nbdkit_parse_unsigned (key, value, &config.promote) == -1)
      return bad_value (key, value);
    if (config.promote == 0 || config.promote > 255) {
      nbdkit_error ("%s: from 1 to 255, not %s", key, value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "ssdcache-readahead") == 0) {
    int64_t v;
    if (strcmp (value, "auto") == 0) {
      config.ra_mode = READAHEAD_AUTO;
      return 0;
    }
    if (strcmp (value, "off") == 0 || strcmp (value, "0") == 0) {
      config.ra_mode = READAHEAD_OFF;
      return 0;
    }
    v = nbdkit_parse_size (value);
    if (v == -1)
      return bad_value (key, value);
    if (v < 4096 || v > (INT64_C (1) << 30)) {
      nbdkit_error ("%s: auto, off, or a window from 4K to 1G, not %s",
                    key, value);
      return -1;
    }
    config.ra_mode = READAHEAD_FIXED;
    config.ra_window = v;
    return 0;
  }
  if (strcmp (key, "ssdcache-readahead-max") == 0) {
    int64_t v = nbdkit_parse_size (value);
    if (v == -1)
      return bad_value (key, value);
    if (v < READAHEAD_MIN_WINDOW || v > (INT64_C (1) << 30)) {
      nbdkit_error ("%s: from 128K to 1G, not %s", key, value);
      return -1;
    }
    config.ra_max = v;
    return 0;
  }
  if (strcmp (key, "ssdcache-flush") == 0) {
    if (strcmp (value, "cache") == 0)
      config.flush_mode = CACHE_FLUSH_CACHE;
    else if (strcmp (value, "backend") == 0)
      config.flush_mode = CACHE_FLUSH_BACKEND;
    else {
      nbdkit_error ("%s: expected cache or backend, not '%s'", key, value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "ssdcache-writeback-high") == 0 ||
      strcmp (key, "ssdcache-writeback-low") == 0) {
    unsigned v;
    if (nbdkit_parse_unsigned (key, value, &v) == -1)
      return bad_value (key, value);
    if (v > 100) {
      nbdkit_error ("%s: a percentage from 0 to 100, not %s", key, value);
      return -1;
    }
    if (key[19] == 'h')
      config.wb.high_pct = v;
    else
      config.wb.low_pct = v;
    return 0;
  }
  if (strcmp (key, "ssdcache-writeback-rate") == 0) {
    int64_t v = nbdkit_parse_size (value);
    if (v == -1)
      return bad_value (key, value);
    config.wb.rate = v;
    return 0;
  }
  if (strcmp (key, "ssdcache-writeback-idle") == 0) {
    if (nbdkit_parse_unsigned (key, value, &config.wb.idle_ms) == -1)
      return bad_value (key, value);
    return 0;
  }
  if (strcmp (key, "ssdcache-writeback-on-exit") == 0) {
    int r = nbdkit_parse_bool (value);
    if (r == -1)
      return bad_value (key, value);
    config.writeback_on_exit = r;
    return 0;
  }
  nbdkit_error ("unknown parameter '%s' (see nbdkit-ssdcache-filter(1))",
                key);
  return -1;
}

static int
ident_append (const char *s)
{
  size_t n = strlen (s);
  char *p = realloc (ident, ident_len + n + 1);

  if (p == NULL) {
    nbdkit_error ("realloc: %m");
    return -1;
  }
  memcpy (p + ident_len, s, n + 1);
  ident = p;
  ident_len += n;
  return 0;
}

int
config_note_backend (const char *key, const char *value)
{
  char resolved[PATH_MAX];
  const char *v = value;
  struct stat st;

  for (size_t i = 0; ignored_prefixes[i]; i++)
    if (strncmp (key, ignored_prefixes[i], strlen (ignored_prefixes[i])) == 0)
      return 0;
  /* Two spellings of one file are one backend. */
  if (stat (value, &st) == 0 && realpath (value, resolved) != NULL)
    v = resolved;
  if (ident_append (key) == -1 || ident_append ("=") == -1 ||
      ident_append (v) == -1 || ident_append ("\n") == -1)
    return -1;

  /* The printable form, with secrets masked. */
  {
    size_t old = config.id_text ? strlen (config.id_text) : 0;
    const char *shown = is_secret (key) ? "***" : v;
    size_t add = strlen (key) + strlen (shown) + 2;
    char *p = realloc (config.id_text, old + add + 1);
    if (p == NULL) {
      nbdkit_error ("realloc: %m");
      return -1;
    }
    sprintf (p + old, "%s%s=%s", old ? " " : "", key, shown);
    config.id_text = p;
  }
  return 0;
}

/* FNV-1a, 64 bit, from a given basis. */
static uint64_t
fnv1a (const char *s, size_t n, uint64_t h)
{
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char) s[i];
    h *= UINT64_C (0x100000001b3);
  }
  return h;
}

static int
mkdir_p (char *path)
{
  for (char *p = path + 1; *p; p++) {
    if (*p == '/') {
      *p = '\0';
      if (mkdir (path, 0700) == -1 && errno != EEXIST)
        return -1;
      *p = '/';
    }
  }
  if (mkdir (path, 0700) == -1 && errno != EEXIST)
    return -1;
  return 0;
}

static char *
default_dir (void)
{
  const char *e;
  char *dir = NULL;

  if ((e = getenv ("NBDKIT_SSDCACHE_DIR")) != NULL && *e)
    dir = strdup (e);
  else if ((e = getenv ("XDG_CACHE_HOME")) != NULL && *e == '/')
    asprintf (&dir, "%s/nbdkit-ssdcache", e);
  else if ((e = getenv ("HOME")) != NULL && *e == '/')
    asprintf (&dir, "%s/.cache/nbdkit-ssdcache", e);
  else
    asprintf (&dir, "/var/tmp/nbdkit-ssdcache-%ld", (long) getuid ());
  return dir;
}

int
config_finish (void)
{
  const char *what = ident ? ident : "";

  if (config.id) {
    what = config.id;
    free (config.id_text);
    config.id_text = NULL;
    if (asprintf (&config.id_text, "ssdcache-id=%s", config.id) == -1) {
      nbdkit_error ("asprintf: %m");
      return -1;
    }
  }
  else if (config.id_text == NULL && (config.id_text = strdup ("")) == NULL) {
    nbdkit_error ("strdup: %m");
    return -1;
  }
  config.digest[0] = fnv1a (what, strlen (what), UINT64_C (0xcbf29ce484222325));
  config.digest[1] = fnv1a (what, strlen (what), UINT64_C (0x6c62272e07bb0142));

  if (config.size && config.page_size && config.size < config.page_size) {
    nbdkit_error ("ssdcache-size: %llu bytes is smaller than one page "
                  "(ssdcache-page-size=%u)",
                  (unsigned long long) config.size, config.page_size);
    return -1;
  }
  if (config.size && !config.page_size && config.size < CACHE_DEFAULT_PAGE) {
    nbdkit_error ("ssdcache-size: %llu bytes is smaller than one page "
                  "(%u bytes by default)",
                  (unsigned long long) config.size, CACHE_DEFAULT_PAGE);
    return -1;
  }

  if (config.wb.low_pct > config.wb.high_pct) {
    nbdkit_error ("ssdcache-writeback-low: %u%% is above "
                  "ssdcache-writeback-high (%u%%)",
                  config.wb.low_pct, config.wb.high_pct);
    return -1;
  }

  if (config.file == NULL) {
    char *dir = default_dir ();
    if (dir == NULL) {
      nbdkit_error ("cannot build the default cache directory name: %m");
      return -1;
    }
    if (mkdir_p (dir) == -1) {
      nbdkit_error ("ssdcache-file: cannot create cache directory %s: %m "
                    "(set NBDKIT_SSDCACHE_DIR or ssdcache-file)", dir);
      free (dir);
      return -1;
    }
    if (asprintf (&config.file, "%s/%016llx.ssdcache", dir,
                  (unsigned long long) config.digest[0]) == -1) {
      nbdkit_error ("asprintf: %m");
      free (dir);
      return -1;
    }
    free (dir);
  }
  nbdkit_debug ("ssdcache: cache file %s, identity: %s",
                config.file, config.id_text);
  return 0;
}

void
config_free (void)
{
  free (config.file);
  free (config.id);
  free (config.stats_file);
  free (config.id_text);
  free (ident);
  config.file = config.id = config.stats_file = config.id_text = NULL;
  ident = NULL;
  ident_len = 0;
}
