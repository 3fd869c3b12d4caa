/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the cache engine.
 *
 * Owns the running cache: the pool (cache file), the page table, the
 * eviction policy, the range locks and the counters, and implements
 * read, write, invalidate and preload on top of them.  It calls the
 * backend only through struct cache_backend, so it has no nbdkit
 * dependency and is unit tested against a RAM backend.
 *
 * Locking: every lock, what it protects and the order they nest in
 * are in one table, in docs/design.md ("Locks").  Callers of this API
 * hold none of them.
 */
#ifndef SSDCACHE_CACHE_H
#define SSDCACHE_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "admit.h"
#include "layout.h"
#include "stats.h"

struct cache;

/* How the engine reaches the backend for one request. */
struct cache_backend {
  void *h;
  int (*pread) (void *h, void *buf, uint32_t count, uint64_t offset,
                int *err);
  int (*pwrite) (void *h, const void *buf, uint32_t count, uint64_t offset,
                 bool fua, int *err);
  /* Optional (NULL: the backend needs no flush). */
  int (*flush) (void *h, int *err);
};

/* What a client FLUSH (or FUA) guarantees in writeback mode. */
enum cache_flush_mode {
  CACHE_FLUSH_CACHE = 0,       /* durable on the cache device */
  CACHE_FLUSH_BACKEND = 1,     /* written back and durable on the backend */
};

/* The order in which writeback reaches the backend. */
enum cache_wb_order {
  CACHE_ORDER_OFFSET = 0,      /* backend offset order: fastest, but the
                                  backend alone matches no flush point */
  CACHE_ORDER_FLUSH = 1,       /* one flush generation after another: the
                                  backend alone always equals the export
                                  at some client flush (order.c) */
};

struct cache_writeback_config {
  unsigned high_pct;           /* start cleaning above this % dirty */
  unsigned low_pct;            /* ... down to this % */
  uint64_t rate;               /* bytes/s written back, 0: unlimited */
  unsigned idle_ms;            /* clean everything after this much client
                                  silence, 0: never */
  unsigned depth;              /* backend writes in flight (0 or 1: one) */
  uint64_t max_dirty_bytes;    /* dirty data cap, 0: none (or ...) */
  unsigned max_dirty_pct;      /* ... a percentage of the cache, 0: none */
  unsigned max_age_s;          /* dirty data older than this is written
                                  back, 0: no limit */
  enum cache_wb_order order;
  uint64_t seq_cutoff;         /* a sequential write stream past this
                                  many bytes goes around a cache that
                                  is behind (write-back.c), 0: never */
};

struct cache_config {
  const char *path;            /* cache file */
  bool private_file;           /* path is the default cache file, which
                                  must be the user's own (pool.h:
                                  pool_open_private) */
  uint64_t size;               /* data capacity in bytes (0: default) */
  uint32_t page_size;          /* 0: default, or the existing cache's */
  enum layout_mode mode;
  uint64_t id_digest[2];       /* backend identity */
  const char *id_text;         /* printable, for messages */
  bool reset;                  /* re-initialise a mismatched cache */
  enum cache_flush_mode flush_mode;
  struct cache_writeback_config wb;
  unsigned policy;             /* enum evict_policy (0 = CLOCK) */
  uint64_t seq_cutoff;         /* sequential cutoff in bytes, 0: off */
  unsigned seq_streams;        /* streams tracked for it */
  bool verify;                 /* check each cached page's clean data
                                  against the backend on its first use
                                  after start (ssdcache-verify=lazy) */
  unsigned promote;            /* read misses before a page is cached
                                  (0 or 1: every miss) */
  unsigned readahead_mode;     /* enum readahead_mode (0: off) */
  uint64_t readahead_window;   /* fixed mode: the window */
  uint64_t readahead_max;      /* adaptive mode: the largest window */
  bool direct;                 /* open the cache file with O_DIRECT */
  bool defer_writes;           /* writethrough: rewrites of cached data
                                  reach the cache file from a background
                                  thread (defer.h) */
  uint64_t resize_move;        /* a resize copies at most this many bytes
                                  of hot pages into the slots it keeps
                                  (resize.c; 0: none) */
  uint32_t partial_pages;      /* side-table bound (pagetable.h): pages
                                  whose maps are not one run each (0: the
                                  default, CACHE_PARTIAL_NONE: none) */
  struct budget *budget;       /* space shared with other caches (one per
                                  export), or NULL: size is this cache's */
  const char *export_name;     /* shown with the counters, or NULL */
  bool sparse;                 /* a new cache file reserves no data space
                                  (pool.h: sparse) */
  /* With a budget: called, holding no lock, when the budget is used up
   * and this cache needs a slot; it may make another cache give one
   * back (cache_give_slot).  Returns true if it did.  NULL: none.
   */
  bool (*reclaim) (struct cache *c, void *opaque);
  void *reclaim_opaque;
};
#define CACHE_PARTIAL_NONE UINT32_MAX

#define CACHE_DEFAULT_SIZE (1024ULL * 1024 * 1024)   /* 1 GiB */
#define CACHE_DEFAULT_PAGE 65536

/* The filter's defaults for the rest: config.c starts from them, and
 * so does cache_config_defaults (the unit tests' fixture), so that the
 * tests exercise the configuration that ships.
 */
#define CACHE_DEFAULT_MODE LAYOUT_MODE_WRITETHROUGH
#define CACHE_DEFAULT_FLUSH CACHE_FLUSH_CACHE
#define CACHE_DEFAULT_WB_HIGH 50
#define CACHE_DEFAULT_WB_LOW 10
#define CACHE_DEFAULT_WB_IDLE_MS 1000
#define CACHE_DEFAULT_WB_DEPTH 8
#define CACHE_MAX_WB_DEPTH 64
#define CACHE_DEFAULT_WB_SEQ_CUTOFF ADMIT_SEQ_DEFAULT_CUTOFF
#define CACHE_SEQ_HOLD_MS 1000   /* write-back.c */
#define CACHE_DEFAULT_SEQ_STREAMS 16
#define CACHE_DEFAULT_DEFER_WRITES true
#define CACHE_DEFAULT_RESIZE_MOVE (UINT64_C (2) << 30)

/* Fill cfg with the filter's defaults (path, size, identity: none). */
extern void cache_config_defaults (struct cache_config *cfg);

/* Open and lock the cache file, read its superblock and check the
 * identity digest (before nbdkit forks, so errors reach the user).
 * Returns NULL on error (logged).
 */
extern struct cache *cache_open (const struct cache_config *cfg);
/* The same for a file already open and locked (fd, which c owns from
 * now on, even on error): see cache_close_resize.
 */
extern struct cache *cache_open_fd (const struct cache_config *cfg, int fd);

/* Second step, once the backend size is known: check it against the
 * superblock (or format a new cache) and load the page table.
 * Returns 0 or -1 (logged).
 */
extern int cache_attach (struct cache *c, uint64_t backend_size);

/* Is c's cache file an empty regular file that cache_open found or
 * made and nothing has written (c never attached)?
 */
extern bool cache_file_untouched (const struct cache *c);

/* Clean shutdown: sync, mark the superblock clean, unlock, free. */
extern void cache_close (struct cache *c);

/* A cache file of another ssdcache-size (same page size and backend)
 * is opened and attached at its own size; then, with no request or
 * thread running, the caller writes back its dirty data and calls
 * cache_close_resize, which closes it and gives the file the wanted
 * size, keeping the clean pages that fit; it keeps the file open and
 * locked in *fd, for cache_open_fd and cache_attach to use it next.
 * Returns 0 if the file was resized, -1 (logged) if not (dirty data
 * left, a failing device, an I/O error: the file keeps its size, or
 * starts empty if the resize was cut short).
 * cache_resize_keep ends the pending resize, keeping the size
 * (logged with why).
 */
extern bool cache_resize_pending (const struct cache *c);
extern int cache_close_resize (struct cache *c, int *fd);
extern void cache_resize_keep (struct cache *c, const char *why);

extern int cache_read (struct cache *c, const struct cache_backend *be,
                       void *buf, uint32_t count, uint64_t offset,
                       int *err);
/* The same for a client connection whose readahead state is pc (NULL:
 * no readahead): prefetches may be queued after the read.
 */
struct prefetch_conn;
extern int cache_read_conn (struct cache *c, const struct cache_backend *be,
                            struct prefetch_conn *pc, void *buf,
                            uint32_t count, uint64_t offset, int *err);
extern int cache_write (struct cache *c, const struct cache_backend *be,
                        const void *buf, uint32_t count, uint64_t offset,
                        bool fua, int *err);
/* Drop every cached page overlapping [offset, offset+count) (after a
 * zero or trim went to the backend, or a backend write failed).
 */
extern void cache_invalidate (struct cache *c, uint32_t count,
                              uint64_t offset);
/* Bring [offset, offset+count) into the cache (NBD_CMD_CACHE). */
extern int cache_preload (struct cache *c, const struct cache_backend *be,
                          uint32_t count, uint64_t offset, int *err);
/* Make cache contents durable on the cache device. */
extern int cache_sync (struct cache *c, int *err);

/* A client FLUSH: everything written before it becomes durable as the
 * flush mode says (be is the client's backend, flushed if needed).
 */
extern int cache_flush (struct cache *c, const struct cache_backend *be,
                        int *err);

/* zero / trim: the backend gets the operation for whole pages (do_op),
 * cached copies of those pages are dropped; in writeback mode partial
 * pages at the edges of a zero become dirty zeroes in the cache (a trim
 * leaves them alone).  do_op is called with the pages range locked.
 */
typedef int (*cache_backend_op) (void *opaque, uint32_t count,
                                 uint64_t offset, int *err);
struct cache_zero_op {          /* what cache_zero_trim sends on */
  bool is_zero;                 /* a zero (else a trim) */
  cache_backend_op do_op;       /* the backend's operation ... */
  void *opaque;                 /* ... and its argument */
};
extern int cache_zero_trim (struct cache *c, const struct cache_backend *be,
                            const struct cache_zero_op *op, uint32_t count,
                            uint64_t offset, bool fua, int *err);

/* Extents: true if any page in [offset, offset+count) holds dirty data;
 * *next_change is set to the end of the first run of pages that all
 * have the same answer.
 */
extern bool cache_range_dirty (struct cache *c, uint64_t offset,
                               uint64_t count, uint64_t *run_end);

/* Write back everything now, synchronously, from the caller, using be
 * (at exit, or before a mode switch: no request runs).  The background
 * thread is bg/writeback.h's.
 */
extern int cache_writeback_all (struct cache *c,
                                const struct cache_backend *be, int *err);
extern uint64_t cache_dirty_pages (struct cache *c);
extern enum layout_mode cache_mode (const struct cache *c);
/* Change the mode while requests run (ssdcache-control); when it
 * returns, every write that saw the old mode has ended.  Leaving
 * writeback, the caller then writes the dirty data back.
 */
extern void cache_set_mode (struct cache *c, enum layout_mode mode);
/* Drop the clean cached pages overlapping [offset, offset+count)
 * (count 0: all of them); dirty pages stay.  Returns how many went.
 */
extern uint64_t cache_drop_clean (struct cache *c, uint64_t offset,
                                  uint64_t count);

/* Evict one clean slot and give its space back to the shared budget
 * (for another cache; see cache_config.reclaim).  Takes c's locks
 * only.  Returns true if a slot went.
 */
extern bool cache_give_slot (struct cache *c);
/* Bytes of slots the cache holds off its free list (what it counts in
 * a shared budget).
 */
extern uint64_t cache_held_bytes (struct cache *c);
/* Remove a closed cache's file, unless a process holds it.  Returns 0
 * or -1 (errno).
 */
extern int cache_remove_file (const char *path);
/* Slots that may be taken without evicting anything. */
extern uint64_t cache_free_slots (struct cache *c);
/* Warm-up: read the pages of [offset, offset+len) that are not cached
 * from the backend (runs of at most 4 MiB) into free slots only; *read
 * gets the bytes read.  Stops early, returning 1, when no free slot is
 * left.  Returns 0, 1, or -1 (*err).
 */
extern int cache_warm_fill (struct cache *c, const struct cache_backend *be,
                            uint64_t offset, uint64_t len, uint64_t *read,
                            int *err);
/* Monotonic ms of the last client request. */
/* -- for the background threads (bg/), which use this API only ------- */

/* Each thread of a cache keeps its state in the cache's slot for it
 * (cache_bg_get/set) and gives the engine its hooks, to be woken or
 * stopped: set when it starts, cleared when it stops.  A NULL hook or
 * state: that thread does not run.
 */
enum cache_bg {
  CACHE_BG_WRITEBACK, CACHE_BG_READAHEAD, CACHE_BG_WARM, CACHE_BG_BEHIND,
  CACHE_BG_COUNT,
};
extern void *cache_bg_get (const struct cache *c, enum cache_bg which);
extern void cache_bg_set (struct cache *c, enum cache_bg which, void *state);

struct prefetch_conn;
/* How the engine wakes the threads (each sets its own hooks). */
/* Pages read from the backend for a client's read miss and answered
 * from memory, to be stored in the cache after the answer.
 */
struct cache_fill_job {
  struct cache_fill_job *next;   /* for the queue that holds it */
  uint64_t first;                /* its first page */
  uint32_t n;                    /* pages */
  uint64_t stamp;                /* the range lock's clock when read */
  uint8_t *data;                 /* n pages */
  bool store[];                  /* which pages to store */
};
/* Store the pages of job that did not change since it read them and
 * are not cached meanwhile nor range locked now (never waits); the
 * caller frees job.
 */
extern void cache_fill_job_run (struct cache *c, struct cache_fill_job *job);
extern void cache_fill_job_free (struct cache_fill_job *job);
/* Free job without storing it, counting its pages as dropped. */
extern void cache_fill_job_drop (struct cache *c, struct cache_fill_job *job);
/* Bytes of data a job holds. */
extern uint64_t cache_fill_job_bytes (const struct cache *c,
                                      const struct cache_fill_job *job);

struct cache_hooks {
  void (*wb_kick) (struct cache *c);       /* a writer found no slot */
  void (*wb_stop) (struct cache *c);       /* at close, if still running */
  void (*readahead_note_read) (struct cache *c, struct prefetch_conn *pc,
                        uint64_t offset, uint32_t count, uint64_t used,
                        uint64_t fill_limit);
  void (*readahead_stop) (struct cache *c);
  void (*warm_stop) (struct cache *c);
  /* Fill behind (bg/behind.c): take job, to be run by
   * cache_fill_job_run; false if it cannot (the pages are not stored).
   */
  bool (*fill_behind) (struct cache *c, struct cache_fill_job *job);
  /* Would a job of bytes find room now?  (A hint: fill_behind decides.) */
  bool (*fill_behind_room) (struct cache *c, uint64_t bytes);
  void (*fill_behind_stop) (struct cache *c);
};
extern struct cache_hooks *cache_hooks (struct cache *c);

/* The writeback configuration (read-only after open). */
extern const struct cache_writeback_config *
cache_writeback_config (const struct cache *c);
/* The stamp of the latest change of a slot (it only grows): a page
 * whose slot changed after stamp s has a higher one.
 */
extern uint64_t cache_change_seq (struct cache *c);
/* Does page hold dirty data now? */
extern bool cache_page_dirty (struct cache *c, uint64_t page);
extern void cache_sleep_ms (uint64_t ms);
/* Has the cache failed (degraded mode: every request around it)? */
extern bool cache_degraded (const struct cache *c);

/* Writing dirty data back (engine/clean.c). */
struct clean_opts {
  uint64_t target;               /* dirty pages that may remain (0: all) */
  bool limited;                  /* keep to ssdcache-writeback-rate */
  bool skip_hot;                 /* skip pages changed after hot_after */
  uint64_t hot_after;            /* a sequence number */
  /* Told of each page marked clean (or NULL). */
  void (*cleaned) (void *opaque, uint64_t page);
  void *opaque;
  /* The flush order: stop once flush generations up to this one are
   * on the backend (0: go on to the open one).
   */
  uint64_t gen_upto;
};
/* Write back dirty pages until at most o->target remain, in backend
 * offset order, adjacent pages coalesced.  Returns 0, 1 if some pages
 * were busy and skipped, 2 if every dirty page was hot (nothing done),
 * -1 (*err) if some page could not be written back (it stays dirty).
 */
extern int clean_pass (struct cache *c, const struct cache_backend *be,
                       const struct clean_opts *o, int *err);
/* The flush order: are closed flush generations still to be written
 * back (then *upto: the newest closed one)?  Updates the order gauges.
 * False outside the flush order.
 */
extern bool cache_order_behind (struct cache *c, uint64_t *upto);

/* Readahead (engine/read.c). */
struct readahead_config;
/* Its parameters for a connection's readahead state (core/readahead). */
extern void cache_readahead_config (const struct cache *c,
                                    struct readahead_config *cfg);
/* Readahead: read the pages of [offset, offset+len) that are not cached
 * from the backend (one request per run of such pages; len at most
 * 4 GiB - 1 page) and store them marked as prefetched.  Never evicts
 * dirty data, never waits for a slot.
 */
extern int cache_prefetch_fill (struct cache *c,
                                 const struct cache_backend *be,
                                 uint64_t offset, uint64_t len, int *err);

extern uint64_t cache_last_io_ms (const struct cache *c);
/* The monotonic clock those are read on, in ms. */
extern uint64_t cache_now_ms (void);

extern struct stats *cache_stats (struct cache *c);
/* cache_config.export_name, or NULL. */
extern const char *cache_export_name (const struct cache *c);
extern uint32_t cache_page_size (const struct cache *c);
/* Does the cache serve from a rotational device?  1 or 0 (sysfs), -1
 * when unknown: no block device to ask, or a failed cache device
 * (everything comes from the backend).
 */
extern int cache_rotational (const struct cache *c);
extern uint64_t cache_nslots (const struct cache *c);
extern uint64_t cache_backend_size (const struct cache *c);

#endif /* SSDCACHE_CACHE_H */
