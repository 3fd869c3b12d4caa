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
#include "stats.h"

struct config config = {
  .mode = CACHE_DEFAULT_MODE,
  .flush_mode = CACHE_DEFAULT_FLUSH,
  .wb = { .high_pct = CACHE_DEFAULT_WB_HIGH, .low_pct = CACHE_DEFAULT_WB_LOW,
          .rate = 0, .idle_ms = CACHE_DEFAULT_WB_IDLE_MS,
          .depth = CACHE_DEFAULT_WB_DEPTH,
          .seq_cutoff = CACHE_DEFAULT_WB_SEQ_CUTOFF },
  .writeback_on_exit = true,
  .defer_writes = CACHE_DEFAULT_DEFER_WRITES,
  .resize_move = CACHE_DEFAULT_RESIZE_MOVE,
  .policy = EVICT_DEFAULT,
  .seq_cutoff = 0,
  .seq_streams = CACHE_DEFAULT_SEQ_STREAMS,
  .stats_interval = 10,
  .stats_format = STATS_TEXT,
  .promote = ADMIT_NHIT_DEFAULT_N,
  .readahead_mode = READAHEAD_AUTO,
  .fill_behind = true,
  .readahead_max = READAHEAD_DEFAULT_MAX,
  .exports = CONFIG_EXPORTS_AUTO,
  .exports_max = CONFIG_EXPORTS_MAX_DEFAULT,
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
  return strstr (key, "pass") || strstr (key, "secret") ||
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

/* The ssdcache-* parameters: one table entry each (params below).
 *
 * parse reads the value and stores it through the one target pointer
 * it uses: str (a string, replacing the last one), or one of u64,
 * u32, uint and flag (store picks the one that is set), plus *set =
 * true if set is given.  bad, when given, is the message for a value
 * that parses but is not allowed (empty, not in [lo, hi] or not a
 * power of two with pow2, not one of the choices): a printf format
 * given the key and then the value.  Numbers are checked against
 * [lo, hi] only when bad is given.
 */
struct choice {
  const char *name;
  unsigned value;
};

struct param {
  const char *key;
  int (*parse) (const struct param *p, const char *value);
  char **str;
  uint64_t *u64;
  uint32_t *u32;
  unsigned *uint;
  bool *flag;
  bool *set;
  uint64_t lo, hi;
  bool pow2;
  const struct choice *choices;   /* parse_choice: ends with a NULL name */
  const char *bad;
};

static void
store (const struct param *p, uint64_t v)
{
  if (p->u64)
    *p->u64 = v;
  else if (p->u32)
    *p->u32 = v;
  else if (p->uint)
    *p->uint = v;
  else if (p->flag)
    *p->flag = v;
  if (p->set)
    *p->set = true;
}

static int
not_allowed (const struct param *p, const char *value)
{
  nbdkit_error (p->bad, p->key, value);
  return -1;
}

static bool
in_bounds (const struct param *p, uint64_t v)
{
  return p->bad == NULL ||
    (v >= p->lo && v <= p->hi && (!p->pow2 || (v & (v - 1)) == 0));
}

/* A file name, made absolute (nbdkit may change directory later). */
static int
parse_path (const struct param *p, const char *value)
{
  if (*value == '\0')
    return not_allowed (p, value);
  free (*p->str);
  *p->str = nbdkit_absolute_path (value);
  return *p->str ? 0 : -1;
}

static int
parse_string (const struct param *p, const char *value)
{
  if (*value == '\0')
    return not_allowed (p, value);
  free (*p->str);
  *p->str = strdup (value);
  return *p->str ? 0 : -1;
}

static int
parse_size (const struct param *p, const char *value)
{
  int64_t v = nbdkit_parse_size (value);

  if (v == -1)
    return bad_value (p->key, value);
  if (!in_bounds (p, v))
    return not_allowed (p, value);
  store (p, v);
  return 0;
}

static int
parse_bool (const struct param *p, const char *value)
{
  int r = nbdkit_parse_bool (value);

  if (r == -1)
    return bad_value (p->key, value);
  store (p, r);
  return 0;
}

static int
parse_unsigned (const struct param *p, const char *value)
{
  unsigned v;

  if (nbdkit_parse_unsigned (p->key, value, &v) == -1)
    return bad_value (p->key, value);
  if (!in_bounds (p, v))
    return not_allowed (p, value);
  store (p, v);
  return 0;
}

static int
parse_uint32 (const struct param *p, const char *value)
{
  uint32_t v;

  if (nbdkit_parse_uint32_t (p->key, value, &v) == -1)
    return bad_value (p->key, value);
  if (!in_bounds (p, v))
    return not_allowed (p, value);
  store (p, v);
  return 0;
}

static int
parse_choice (const struct param *p, const char *value)
{
  for (const struct choice *c = p->choices; c->name; c++)
    if (strcmp (value, c->name) == 0) {
      store (p, c->value);
      return 0;
    }
  return not_allowed (p, value);
}

/* The policy module owns the policy names (and their aliases). */
static int
parse_policy (const struct param *p, const char *value)
{
  enum evict_policy policy;

  if (evict_policy_parse (value, &policy) == -1) {
    nbdkit_error ("%s: unknown policy '%s' (expected %s or %s)", p->key,
                  value, evict_policy_name (EVICT_S3FIFO),
                  evict_policy_name (EVICT_CLOCK));
    return -1;
  }
  store (p, policy);
  return 0;
}

/* auto, off (or 0), or a fixed window: a size, to the entry's target. */
static int
parse_readahead (const struct param *p, const char *value)
{
  if (strcmp (value, "auto") == 0) {
    config.readahead_mode = READAHEAD_AUTO;
    return 0;
  }
  if (strcmp (value, "off") == 0 || strcmp (value, "0") == 0) {
    config.readahead_mode = READAHEAD_OFF;
    return 0;
  }
  if (parse_size (p, value) == -1)
    return -1;
  config.readahead_mode = READAHEAD_FIXED;
  return 0;
}

static const struct choice modes[] = {
  { "writethrough", LAYOUT_MODE_WRITETHROUGH },
  { "writearound", LAYOUT_MODE_WRITEAROUND },
  { "writeback", LAYOUT_MODE_WRITEBACK },
  { NULL, 0 }
};
/* SIZE, or PCT% of the cache. */
static int
parse_max_dirty (const struct param *p, const char *value)
{
  size_t n = strlen (value);

  if (n > 1 && value[n - 1] == '%') {
    char *num = strndup (value, n - 1);
    unsigned v;
    int r;

    if (num == NULL) {
      nbdkit_error ("strndup: %m");
      return -1;
    }
    r = nbdkit_parse_unsigned (p->key, num, &v);
    free (num);
    if (r == -1 || v < 1 || v > 100)
      return not_allowed (p, value);
    config.wb.max_dirty_pct = v;
    config.wb.max_dirty_bytes = 0;
    return 0;
  }
  config.wb.max_dirty_pct = 0;
  return parse_size (p, value);
}

static const struct choice warm_modes[] = {
  { "off", false }, { "all", true }, { NULL, 0 }
};
static const struct choice export_modes[] = {
  { "auto", CONFIG_EXPORTS_AUTO }, { "each", CONFIG_EXPORTS_EACH },
  { "one", CONFIG_EXPORTS_ONE }, { NULL }
};

static const struct choice verify_modes[] = {
  { "off", false }, { "lazy", true }, { NULL, 0 }
};
static const struct choice stats_formats[] = {
  { "text", STATS_TEXT }, { "json", STATS_JSON },
  { "prometheus", STATS_PROMETHEUS }, { NULL, 0 }
};
static const struct choice wb_orders[] = {
  { "offset", CACHE_ORDER_OFFSET }, { "flush", CACHE_ORDER_FLUSH },
  { NULL, 0 }
};
static const struct choice flush_modes[] = {
  { "cache", CACHE_FLUSH_CACHE }, { "backend", CACHE_FLUSH_BACKEND },
  { NULL, 0 }
};

#define GIB (UINT64_C (1) << 30)
/* The ssdcache-partial-pages message below spells PT_SIDE_MAX out. */
_Static_assert (PT_SIDE_MAX == 131088384, "update ssdcache-partial-pages");

static const struct param params[] = {
  { "ssdcache-file", parse_path, .str = &config.file,
    .bad = "%s: the path must not be empty" },
  { "ssdcache-size", parse_size, .u64 = &config.size,
    .lo = 1, .hi = INT64_MAX,
    .bad = "%s: the cache size must be greater than zero" },
  { "ssdcache-page-size", parse_size, .u32 = &config.page_size,
    .lo = LAYOUT_MIN_PAGE, .hi = LAYOUT_MAX_PAGE, .pow2 = true,
    .bad = "%s: must be a power of two from 4K to 2M, not %s" },
  { "ssdcache-mode", parse_choice, .uint = &config.mode, .choices = modes,
    .bad = "%s: unknown mode '%s' (expected writethrough, writeback or "
           "writearound)" },
  { "ssdcache-id", parse_string, .str = &config.id,
    .bad = "%s: the identity must not be empty" },
  { "ssdcache-reset", parse_bool, .flag = &config.reset },
  { "ssdcache-direct", parse_bool, .flag = &config.direct },
  { "ssdcache-defer-writes", parse_bool, .flag = &config.defer_writes },
  { "ssdcache-stats", parse_path, .str = &config.stats_file,
    .bad = "%s: the path must not be empty" },
  { "ssdcache-control", parse_path, .str = &config.control,
    .bad = "%s: the path must not be empty" },
  { "ssdcache-stats-interval", parse_unsigned, .uint = &config.stats_interval,
    .lo = 0, .hi = 86400, .bad = "%s: from 0 to 86400 seconds, not %s" },
  { "ssdcache-stats-format", parse_choice, .uint = &config.stats_format,
    .choices = stats_formats,
    .bad = "%s: expected text, json or prometheus, not '%s'" },
  { "ssdcache-policy", parse_policy, .uint = &config.policy },
  { "ssdcache-seq-cutoff", parse_size, .u64 = &config.seq_cutoff },
  { "ssdcache-verify", parse_choice, .flag = &config.verify,
    .choices = verify_modes, .bad = "%s: expected off or lazy, not '%s'" },
  { "ssdcache-seq-streams", parse_unsigned, .uint = &config.seq_streams,
    .lo = 1, .hi = 1024, .bad = "%s: from 1 to 1024, not %s" },
  { "ssdcache-partial-pages", parse_uint32, .u32 = &config.partial_pages,
    .set = &config.partial_pages_set, .lo = 0, .hi = PT_SIDE_MAX,
    .bad = "%s: at most 131088384, not %s" },
  { "ssdcache-resize-move", parse_size, .u64 = &config.resize_move },
  { "ssdcache-promote", parse_unsigned, .uint = &config.promote,
    .lo = 1, .hi = 255, .bad = "%s: from 1 to 255, not %s" },
  { "ssdcache-readahead", parse_readahead, .u64 = &config.readahead_window,
    .lo = 4096, .hi = GIB,
    .bad = "%s: auto, off, or a window from 4K to 1G, not %s" },
  { "ssdcache-readahead-max", parse_size, .u64 = &config.readahead_max,
    .lo = READAHEAD_MIN_WINDOW, .hi = GIB,
    .bad = "%s: from 128K to 1G, not %s" },
  { "ssdcache-fill-behind", parse_bool, .flag = &config.fill_behind },
  { "ssdcache-flush", parse_choice, .uint = &config.flush_mode,
    .choices = flush_modes, .bad = "%s: expected cache or backend, not '%s'" },
  { "ssdcache-writeback-high", parse_unsigned, .uint = &config.wb.high_pct,
    .lo = 0, .hi = 100, .bad = "%s: a percentage from 0 to 100, not %s" },
  { "ssdcache-writeback-low", parse_unsigned, .uint = &config.wb.low_pct,
    .lo = 0, .hi = 100, .bad = "%s: a percentage from 0 to 100, not %s" },
  { "ssdcache-writeback-rate", parse_size, .u64 = &config.wb.rate },
  { "ssdcache-writeback-idle", parse_unsigned, .uint = &config.wb.idle_ms },
  { "ssdcache-writeback-depth", parse_unsigned, .uint = &config.wb.depth,
    .lo = 1, .hi = CACHE_MAX_WB_DEPTH, .bad = "%s: from 1 to 64, not %s" },
  { "ssdcache-writeback-max-dirty", parse_max_dirty,
    .u64 = &config.wb.max_dirty_bytes, .lo = 1, .hi = INT64_MAX,
    .bad = "%s: a size, or a percentage from 1%% to 100%%, not %s" },
  { "ssdcache-writeback-max-age", parse_unsigned, .uint = &config.wb.max_age_s,
    .lo = 0, .hi = 86400, .bad = "%s: from 0 to 86400 seconds, not %s" },
  { "ssdcache-writeback-seq-cutoff", parse_size,
    .u64 = &config.wb.seq_cutoff, .lo = 0, .hi = GIB,
    .bad = "%s: a size up to 1G (0: off), not %s" },
  { "ssdcache-writeback-order", parse_choice,
    .uint = (unsigned *) &config.wb.order,
    .choices = wb_orders, .bad = "%s: expected flush or offset, not '%s'" },
  { "ssdcache-writeback-on-exit", parse_bool,
    .flag = &config.writeback_on_exit },
  { "ssdcache-warm", parse_choice, .flag = &config.warm,
    .choices = warm_modes, .bad = "%s: expected off or all, not '%s'" },
  { "ssdcache-warm-rate", parse_size, .u64 = &config.warm_rate },
  { "ssdcache-exports", parse_choice, .uint = &config.exports,
    .choices = export_modes,
    .bad = "%s: expected auto, each or one, not '%s'" },
  { "ssdcache-exports-max", parse_unsigned, .uint = &config.exports_max,
    .lo = 1, .hi = 4096, .bad = "%s: from 1 to 4096, not %s" },
};

int
config_set (const char *key, const char *value)
{
  for (size_t i = 0; i < sizeof params / sizeof params[0]; i++)
    if (strcmp (key, params[i].key) == 0)
      return params[i].parse (&params[i], value);
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

/* A directory the default cache file may go in: the effective uid's
 * own, and nobody else's to change.  Otherwise why says what is wrong
 * (why has room for 128 bytes).
 */
static bool
dir_is_private (const char *dir, char *why)
{
  struct stat st;

  if (lstat (dir, &st) == -1)
    snprintf (why, 128, "cannot be examined: %s", strerror (errno));
  else if (S_ISLNK (st.st_mode))
    snprintf (why, 128, "is a symbolic link");
  else if (!S_ISDIR (st.st_mode))
    snprintf (why, 128, "is not a directory");
  else if (st.st_uid != geteuid ())
    snprintf (why, 128, "is owned by uid %u, not by this process (uid %u)",
              (unsigned) st.st_uid, (unsigned) geteuid ());
  else if (st.st_mode & (S_IWGRP | S_IWOTH))
    snprintf (why, 128, "is writable by group or others (mode %04o)",
              (unsigned) (st.st_mode & 07777));
  else
    return true;
  return false;
}

/* Create dir and its missing parents, mode 0700, and check dir and
 * every parent created here with dir_is_private.  Parents that existed
 * before are the user's choice and are not checked.
 */
static int
make_private_dir (char *dir)
{
  char why[128];
  char *p = dir;

  /* "dir/" would make lstat follow a symbolic link. */
  for (size_t n = strlen (dir); n > 1 && dir[n - 1] == '/'; n--)
    dir[n - 1] = '\0';
  do {
    bool made;

    p = strchr (p + 1, '/');
    if (p)
      *p = '\0';
    made = mkdir (dir, 0700) == 0;
    if (!made && errno != EEXIST) {
      nbdkit_error ("ssdcache-file: cannot create cache directory %s: %m "
                    "(set NBDKIT_SSDCACHE_DIR or ssdcache-file)", dir);
      return -1;
    }
    if ((made || p == NULL) && !dir_is_private (dir, why)) {
      nbdkit_error ("ssdcache-file: cache directory %s %s; refusing to "
                    "put the cache there (it must be a directory of this "
                    "user's that nobody else can write, not a symbolic "
                    "link): remove it, or set NBDKIT_SSDCACHE_DIR or "
                    "ssdcache-file", dir, why);
      return -1;
    }
    if (p)
      *p = '/';
  } while (p);
  return 0;
}

/* The default cache directory: $NBDKIT_SSDCACHE_DIR, or
 * $XDG_CACHE_HOME/nbdkit-ssdcache, or $HOME/.cache/nbdkit-ssdcache, or
 * /var/tmp/nbdkit-ssdcache-EUID.
 */
static char *
default_dir (void)
{
  const char *e;
  char *dir = NULL;
  int r;

  if ((e = getenv ("NBDKIT_SSDCACHE_DIR")) != NULL && *e)
    return strdup (e);
  if ((e = getenv ("XDG_CACHE_HOME")) != NULL && *e == '/')
    r = asprintf (&dir, "%s/nbdkit-ssdcache", e);
  else if ((e = getenv ("HOME")) != NULL && *e == '/')
    r = asprintf (&dir, "%s/.cache/nbdkit-ssdcache", e);
  else
    r = asprintf (&dir, "/var/tmp/nbdkit-ssdcache-%ld", (long) geteuid ());
  return r == -1 ? NULL : dir;
}

char *
config_default_dir (void)
{
  return default_dir ();
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
    if (make_private_dir (dir) == -1) {
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
    config.file_default = true;
  }
  nbdkit_debug ("ssdcache: cache file %s, identity: %s",
                config.file, config.id_text);
  return 0;
}

/* A digest of s mixed into the first 64 bits of base's. */
static uint64_t
export_digest (uint64_t base, const char *name)
{
  return fnv1a (name, strlen (name), base ^ UINT64_C (0x9e3779b97f4a7c15));
}

int
config_export (const char *name, struct config_export *x)
{
  uint64_t tag;

  memset (x, 0, sizeof *x);
  if (*name == '\0') {
    x->digest[0] = config.digest[0];
    x->digest[1] = config.digest[1];
    if ((x->file = strdup (config.file)) == NULL ||
        (x->id_text = strdup (config.id_text)) == NULL ||
        (config.stats_file &&
         (x->stats_file = strdup (config.stats_file)) == NULL))
      goto nomem;
    x->file_default = config.file_default;
    return 0;
  }
  tag = export_digest (0, name);
  x->digest[0] = export_digest (config.digest[0], name);
  x->digest[1] = export_digest (config.digest[1], name);
  x->file_default = config.file_default;
  if (config.file_default) {
    char *dir = default_dir ();
    if (dir == NULL ||
        asprintf (&x->file, "%s/%016llx.ssdcache", dir,
                  (unsigned long long) x->digest[0]) == -1) {
      free (dir);
      goto nomem;
    }
    free (dir);
  }
  else if (asprintf (&x->file, "%s.%016llx", config.file,
                     (unsigned long long) tag) == -1)
    goto nomem;
  if (asprintf (&x->id_text, "%s export=%s", config.id_text, name) == -1 ||
      (config.stats_file &&
       asprintf (&x->stats_file, "%s.%016llx", config.stats_file,
                 (unsigned long long) tag) == -1))
    goto nomem;
  return 0;

 nomem:
  nbdkit_error ("cannot build the cache file name of export '%s': %m", name);
  config_export_free (x);
  return -1;
}

void
config_export_free (struct config_export *x)
{
  free (x->file);
  free (x->id_text);
  free (x->stats_file);
  memset (x, 0, sizeof *x);
}

void
config_free (void)
{
  free (config.file);
  free (config.id);
  free (config.stats_file);
  free (config.control);
  config.control = NULL;
  free (config.id_text);
  free (ident);
  config.file = config.id = config.stats_file = config.id_text = NULL;
  ident = NULL;
  ident_len = 0;
}
