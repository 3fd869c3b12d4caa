/* SPDX-License-Identifier: BSD-3-Clause */
/* ssdcache tool: reading a cache file, read only.
 *
 * Owns what info and check know about a cache file: opening it
 * O_RDONLY (it is never locked and never written, so this works on a
 * cache in use), telling a cache from anything else as the filter does
 * (filter/io/pool.c: pool_load_sb), picking the superblock copy,
 * scanning the page table and, for check, the data of every slot, and
 * predicting, page by page, what recovery at the next start keeps and
 * drops (the rules of filter/engine/recover.c).  The bytes themselves
 * are decoded by the filter's own filter/core/layout.c.
 *
 * Use: cf_open, then cf_scan, then cf_pages (info: the newest version
 * of each page) or cf_recover (check: the damage and the prediction),
 * then cf_close.
 */
#ifndef SSDCACHE_TOOL_CACHEFILE_H
#define SSDCACHE_TOOL_CACHEFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "layout.h"

/* What cf_open found. */
enum cf_status {
  CF_OK = 0,                    /* a cache with a valid superblock */
  CF_NO_SB = 1,                 /* a cache, but no valid superblock (the
                                   problem is in cf->prob) */
  CF_ERROR = 2,                 /* not a cache file, or unreadable
                                   (reported on stderr) */
};

/* One damaged thing, as check reports it. */
enum cf_kind {
  CF_P_SUPERBLOCK,              /* one copy; the other is used */
  CF_P_NO_SUPERBLOCK,           /* no valid copy: a start refuses it */
  CF_P_TRUNCATED,               /* the file ends inside the pool */
  CF_P_ENTRY,                   /* entries that fail their checks */
  CF_P_PAST_BACKEND,            /* an entry names a page past the end */
  CF_P_CUT,                     /* an entry whose data was cut off */
  CF_P_DATA,                    /* data that fails its checksum */
  CF_P_UNSEALED,                /* unsealed, in a cache closed cleanly */
};

#define CF_PROBLEMS_MAX 1000

struct cf_problem {
  enum cf_kind kind;
  size_t order;                 /* when it was found (sorting is stable) */
  int64_t slot, last_slot;      /* -1: not about a slot */
  int state;                    /* LAYOUT_CLEAN/DIRTY, -1 unknown */
  bool page_known;              /* page is from an entry that verifies */
  bool has_page;                /* page means anything */
  uint64_t page;
  const char *reason;           /* CF_P_ENTRY: why it fails (static) */
  char *msg;                    /* what is damaged and what a start does */
  char *risk;                   /* dirty data at risk, or NULL */
};

/* A non-free entry that decodes: a candidate for its page. */
struct cf_cand {
  uint64_t page, seq;
  uint32_t slot;
  uint8_t state;                /* LAYOUT_CLEAN or LAYOUT_DIRTY */
  uint8_t ndirty;               /* dirty sectors */
  bool unsealed;
  bool data_ok;                 /* its data verifies (check only) */
  int data_errno;               /* !data_ok: 0 mismatch, else read error */
};

/* The filter's counters (ssdcache-stats) after a start on this file,
 * as far as the file decides them; verify_failures assumes every
 * cached page is read.
 */
struct cf_recovery {
  bool clean_start;
  uint64_t loaded_slots, dirty_pages, dropped_entries, damaged_entries,
    dirty_dropped, unsealed_dropped, verify_failures;
};

struct cachefile {
  const char *path;
  int fd;
  uint64_t size;                /* bytes in the file or device */
  bool is_blockdev;
  pid_t locked_by;              /* holder of its lock, 0 none, -1 unknown */

  /* Superblocks. */
  bool sb_ok[LAYOUT_SB_COUNT];
  const char *sb_why[LAYOUT_SB_COUNT];
  struct layout_sb sbs[LAYOUT_SB_COUNT];
  int used;                     /* the copy a start uses, -1 none */
  struct layout_sb sb;          /* that copy */
  bool was_clean;               /* clean flag, and both copies valid */
  uint32_t nsectors;
  uint64_t npages;              /* the backend's */
  uint64_t total;               /* bytes the geometry needs */
  uint64_t data_end;            /* slots from here on have no data */

  /* cf_scan: every slot. */
  uint64_t n_free, n_clean, n_dirty, n_unsealed, n_unsealed_dirty,
    n_damaged;
  uint64_t data_checked, data_bad, data_unsealed;
  struct cf_cand *cand;
  size_t ncand, cand_cap;

  /* cf_pages: the newest version of each page. */
  uint64_t pages, dirty_pages, dirty_bytes, older_versions;

  /* Problems (cf_open, cf_scan, cf_recover), and the prediction.  At
   * most CF_PROBLEMS_MAX are kept, in the order found (a hostile page
   * table of millions of damaged entries must not take gigabytes);
   * the others are only counted (nprob_more, and at_risk).
   */
  struct cf_problem *prob;
  size_t nprob, prob_cap;
  uint64_t nprob_more;
  struct cf_problem spare;      /* where problems past the limit go */
  uint64_t at_risk;             /* problems with dirty data at risk */
  uint64_t damaged_entries_may_dirty;  /* damaged entries in a cache that
                                          may hold dirty data */
  struct cf_recovery rec;
};

/* Open and classify path, read the superblocks.  On CF_ERROR the
 * reason is on stderr.  cf_close is needed in every case.
 */
extern enum cf_status cf_open (struct cachefile *cf, const char *path);

/* Read every entry (and with check_data the data of every sealed
 * clean or dirty slot).  Returns 0, or -1 (reported) if the page
 * table cannot be read.
 */
extern int cf_scan (struct cachefile *cf, bool check_data);

/* Per page, its newest version: cached and dirty pages, dirty bytes. */
extern void cf_pages (struct cachefile *cf);

/* Recovery, as the next start would do it: the problems of the data,
 * the dirty data at risk, cf->rec.  Needs cf_scan (cf, true).
 */
extern void cf_recover (struct cachefile *cf);

extern void cf_close (struct cachefile *cf);

/* Helpers for the output. */
extern const char *cf_mode_name (uint32_t mode);
extern const char *cf_state_name (int state);

#endif /* SSDCACHE_TOOL_CACHEFILE_H */
