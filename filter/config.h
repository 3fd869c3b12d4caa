/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: parameters and backend identity.
 *
 * Owns parsing of the ssdcache-* parameters, the backend identity
 * digest built from the parameters that reach the filter, and the
 * default cache file name.  Everything here runs in nbdkit's
 * single-threaded configuration phase, so there is no locking.
 */
#ifndef SSDCACHE_CONFIG_H
#define SSDCACHE_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "layout.h"

struct config {
  char *file;                  /* cache file (absolute), after config_finish */
  bool file_default;           /* file was not given: the default one */
  uint64_t size;               /* 0: default */
  uint32_t page_size;          /* 0: default */
  unsigned mode;               /* enum layout_mode */
  char *id;                    /* ssdcache-id, or NULL */
  bool reset;
  bool direct;                 /* ssdcache-direct */
  bool defer_writes;           /* ssdcache-defer-writes */
  char *stats_file;            /* ssdcache-stats, or NULL */
  unsigned stats_interval;     /* ssdcache-stats-interval, seconds */
  unsigned stats_format;       /* enum stats_format */
  char *control;               /* ssdcache-control socket, or NULL */
  unsigned flush_mode;         /* enum cache_flush_mode */
  struct cache_writeback_config wb;
  bool writeback_on_exit;
  unsigned policy;             /* enum evict_policy */
  uint64_t seq_cutoff;
  unsigned seq_streams;
  bool verify;                 /* ssdcache-verify=lazy */
  unsigned promote;            /* ssdcache-promote */
  uint64_t resize_move;        /* ssdcache-resize-move */
  uint32_t partial_pages;      /* ssdcache-partial-pages */
  bool partial_pages_set;
  unsigned readahead_mode;            /* enum readahead_mode */
  uint64_t readahead_window;          /* ssdcache-readahead=SIZE */
  uint64_t readahead_max;             /* ssdcache-readahead-max */
  unsigned exports;            /* ssdcache-exports: enum config_exports */
  unsigned exports_max;        /* ssdcache-exports-max: caches open */
  bool fill_behind;            /* ssdcache-fill-behind */
  bool warm;                   /* ssdcache-warm=all */
  uint64_t warm_rate;          /* ssdcache-warm-rate, bytes/s (0: none) */
  uint64_t digest[2];          /* backend identity, after config_finish */
  char *id_text;               /* printable identity (secrets masked) */
};

enum config_exports {
  CONFIG_EXPORTS_AUTO = 0,     /* one cache for every name if the plugin
                                  opens without a connection (it cannot
                                  tell names apart), else one per name
                                  (the default) */
  CONFIG_EXPORTS_EACH = 1,     /* one cache per export name */
  CONFIG_EXPORTS_ONE = 2,      /* every name shares the "" cache */
};
#define CONFIG_EXPORTS_MAX_DEFAULT 16

extern struct config config;

/* What export name's cache is: its identity (the backend's, and the
 * name; for "" exactly the backend's), its cache file and its counters
 * file (names that are not the default export's get the digest of the
 * name as a suffix, so any name can be used).
 */
struct config_export {
  uint64_t digest[2];
  char *id_text;
  char *file;
  bool file_default;
  char *stats_file;            /* or NULL */
};
extern int config_export (const char *name, struct config_export *x);
extern void config_export_free (struct config_export *x);

/* Handle an ssdcache-* key.  Returns 0, or -1 on a bad value (error
 * reported naming the parameter).
 */
extern int config_set (const char *key, const char *value);

/* Record a key=value that is passed on to the plugin (or later
 * filters) for the backend identity.
 */
extern int config_note_backend (const char *key, const char *value);

/* After all parameters: compute the identity and the cache file path. */
extern int config_finish (void);

extern void config_free (void);

/* The default cache directory (see the man page), malloc'd; NULL with
 * errno set when out of memory.
 */
extern char *config_default_dir (void);

#endif /* SSDCACHE_CONFIG_H */
