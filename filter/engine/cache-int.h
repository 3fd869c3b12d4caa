/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: engine internals shared by the files of
 * engine/ and by the background threads (bg/).  Not a public header.
 *
 * THE LOCK TABLE of every lock of the filter, what it protects,
 * whether it is held across I/O and the order in which they nest,
 * is in docs/design.md ("Locks"); the headers of the other files
 * only point there.  Change it with the code that takes the locks.
 *
 * Durability of cache-file writes is tracked in sync epochs: a write
 * that completed while c->epoch was E is durable once a sync that
 * started later has finished (c->durable_epoch >= E), and flushed once
 * that sync was a client's FLUSH/FUA (c->flushed_epoch >= E).  A slot
 * whose dirty data was flushed is never rewritten in place: the new
 * version goes to another slot (copy on write) and the old one is
 * freed by a FREE entry once the new one is flushed too (c->sup).
 * Unflushed dirty data may be rewritten in place: a crash may lose it.
 * From its second such rewrite on, a slot is "unsealed" (seal.c): its
 * data checksum is no longer kept, so the rewrites cost one data write
 * each; the next client flush, writeback or close seals it again.
 *
 * The page table keeps slot epochs as 16 bits above a base (pagetable.h),
 * which moves up to at most c->flushed_epoch and the oldest client sync
 * in flight (the floor) while those keep up: every epoch the cache
 * compares a slot's with is at or above it, so the comparisons stay
 * exact.  When no client flushes, the base moves past the floor and
 * the comparisons with c->flushing_epoch (the ceiling) stay exact.
 *
 * Sector maps that are not one run each need a side-table entry
 * (ssdcache-partial-pages of them): a change that needs one reserves it
 * (pt_maps_reserve_for) under the page's range lock before any I/O, so
 * the entry write cannot fail for want of one; with none left the
 * change is made another way (write-page.c: write_page_simple; read.c:
 * fill_sectors rounds out to the whole page, cache_fill_slot stores
 * nothing).
 *
 * The files of engine/, each calling only the ones before it:
 *   geom.c    page geometry, data checksums, the clock
 *   slot.c    pins, state counts, entry commits, degraded mode
 *   alloc.c   allocation and eviction of slots
 *   access.c  accessors for bg/ and the filter, the mode switch
 *   seal.c    unsealed slots and sealing
 *   stale.c   entries the cache file could not be told
 *   order.c   flush generations: which backend writes may start
 *   epoch.c   sync epochs, superseded slots, dropping a slot
 *   fill.c    storing whole pages, reading slots back verified
 *   clean.c   writing dirty data back (passes, one page)
 *   patch.c   changing a cached page in place
 *   read.c    the read path, prefetch fills, preload, extents
 *   around.c  requests that go around the cache, invalidation
 *   flush.c   a client flush
 *   write-page.c     one page of a write into the cache
 *   write-through.c  writes whose backend write comes first
 *   write-back.c     may the cache take a writeback write?
 *   write.c   the write path, by mode
 *   zero.c    zero and trim
 *   ptread.c  reading and decoding the page table ahead of recover.c
 *   recover.c loading the page table after a start (crash recovery)
 *   resize.c  giving a closed cache another size, keeping its pages
 *   open.c    open, attach, close
 * The background threads (bg/) call the engine; the engine reaches
 * them only through c->hooks, which they set when they start.
 */
#ifndef SSDCACHE_CACHE_INT_H
#define SSDCACHE_CACHE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "backoff.h"
#include "cache.h"
#include "defer.h"
#include "evict.h"
#include "genclock.h"
#include "pagetable.h"
#include "pool.h"
#include "rangelock.h"
#include "stats.h"

struct admit_seq;
struct admit_nhit;

#define CACHE_LOAD_CHUNK 4096    /* entries read at a time */
#define CACHE_EVICT_STEPS 32768  /* the policy's steps per call under
                                    c->lock (evict_set_step_limit) */

struct cache_sup {               /* a superseded slot waiting to be freed */
  uint32_t slot;
  uint32_t succ;                 /* the slot that replaced it */
};

struct cache_stale {             /* a slot whose entry on disk is stale */
  uint32_t slot;
  bool disk_dirty;               /* ... and says "dirty" */
  bool keep;                     /* ... and hides an older version of its
                                    page: never rewritten (cache_drop_slot) */
  bool has_crc;                  /* crc: its data's checksum (RAM keeps
                                    none), for a slot that holds data */
  uint32_t crc;
  uint64_t page;
};

struct cache_sync_node {         /* a client sync in flight */
  uint64_t e;
  struct cache_sync_node *prev, *next;
};



struct cache {
  pthread_mutex_t lock;
  pthread_cond_t space;
  pthread_cond_t order_cond;     /* order.c, with c->lock */
  pthread_mutex_t clean_lock;    /* clean.c: one pass at a time */
  struct backoff backoff;        /* runs whose writeback failed (clean.c:
                                    c->clean_lock, and a pass's lock) */
  /* Held shared by every rewrite of a slot in place, from the
   * copy-on-write decision to the end of its writes; a client flush
   * takes it exclusively for a moment (after moving flushing_epoch) to
   * wait for rewrites that decided before the flush began.
   */
  pthread_rwlock_t inplace;
  struct pool pool;
  struct pagetable pt;
  struct evict *ev;
  struct rangelock ranges;
  struct stats stats;

  /* Configuration (read-only after open). */
  char *path;
  char *id_text;
  uint64_t cfg_size;
  uint32_t cfg_page_size;
  uint64_t id_digest[2];
  _Atomic (enum layout_mode) mode;  /* changed only by cache_set_mode */
  bool reset;
  enum cache_flush_mode flush_mode;
  struct cache_writeback_config wbcfg;
  unsigned policy;               /* enum evict_policy */
  bool verify;                   /* ssdcache-verify=lazy */
  bool defer_writes;             /* ssdcache-defer-writes */
  struct defer defer;            /* writethrough's deferred rewrites
                                    (started by cache_attach) */
  struct admit_seq *seqcut;      /* sequential cutoff, or NULL (c->lock) */
  struct admit_seq *wseq;        /* writeback: sequential write streams,
                                    or NULL (c->lock; write.c) */
  uint64_t seq_around_ms;        /* when a write of one last went
                                    around the cache, 0: never
                                    (c->lock; write.c) */
  unsigned promote;              /* n-miss promotion: misses needed */
  uint32_t partial_pages;        /* side-table bound */
  struct admit_nhit *nhit;       /* its counters, or NULL (c->lock) */
  unsigned readahead_mode;              /* enum readahead_mode */
  uint64_t readahead_window, readahead_max;

  /* Geometry (read-only after attach). */
  uint32_t page_size, sector_size, nsectors;
  uint32_t nslots;
  uint64_t max_dirty;            /* dirty pages allowed (0: no cap) */
  uint64_t backend_size;
  bool have_sb;                  /* an accepted superblock was read */
  bool was_clean;                /* ... and it was closed cleanly */
  uint64_t resize_slots;         /* the size wanted when it differs from
                                    the file's (cache_resize_pending),
                                    else 0 */
  uint64_t resize_move;          /* bytes of hot pages a resize may copy */
  /* Slots loaded dirty after an unclean shutdown whose data has not
   * been checked yet (a bit each; NULL if none): a checksum failure
   * there is a write torn by the crash, never flushed (fill.c).  Under
   * c->lock.
   */
  uint64_t *suspect;

  /* Under c->lock. */
  uint64_t seq;                  /* last sequence number used */
  uint64_t epoch;                /* current sync epoch */
  uint64_t durable_epoch;        /* writes of epochs <= this are durable */
  uint64_t flushing_epoch;       /* a client flush covers epochs <= this */
  uint64_t flushed_epoch;        /* ... and covered by a client flush */
  struct cache_sync_node *syncs_head, *syncs_tail; /* client syncs in
                                    flight, oldest first (on their stacks) */
  struct cache_sup *sup;
  size_t nsup, capsup;
  unsigned nfreeing;             /* free_superseded calls between taking
                                    entries off c->sup and clearing the
                                    successors' PT_HASPRED (c->space is
                                    signalled when one ends) */
  uint64_t ndirty;               /* slots in state DIRTY (indexed) */
  uint64_t dirty_promised;       /* pages writes in flight may still make
                                    dirty (write-back.c: the cap) */
  uint32_t *unsealed;            /* slots that may be PT_UNSEALED (PT_LISTED) */
  size_t nunsealed, capunsealed;
  size_t unseal_reserved;        /* list room promised to writers */
  struct cache_stale *stale;     /* see stale.c */
  size_t nstale, capstale;
  bool stale_clean_logged;       /* a clean drop went unrecorded (logged) */
  /* Checksums of slots whose last entry write failed (slot.c): RAM has
   * moved on from what their entry on disk says, and keeps no checksum
   * of its own.  A few at most: the first failure degrades the cache.
   */
  struct cache_crc_memo { uint32_t slot, crc; } *crc_memo;
  size_t ncrc_memo, capcrc_memo;
  /* Flush generations (order.c).  Generation g holds the writes made
   * between the (g-1)th and the gth client flush; with
   * ssdcache-writeback-order=flush, no backend write of generation
   * g + 1 starts before every write of generations <= g is on the
   * backend and flushed there (c->gen_done >= g).
   */
  uint64_t gen;                  /* the open generation (>= 1) */
  uint64_t gen_done;             /* generations <= this are on the backend */
  unsigned order_inflight;       /* backend writes of c->gen_done + 1 (or
                                    older) in flight */
  bool order_advancing;          /* c->gen_done is moving: they wait */
  uint64_t order_checked_ms;     /* since when the oldest pending
                                    generation and its count stand
                                    still (order.c: order_counts_ok) */
  uint64_t order_seen_gen, order_seen_n;  /* ... what they were */
  uint64_t nretained;            /* superseded slots whose dirty data
                                    is still to be written back */
  struct genclock gclock;        /* when the flush that closed each
                                    generation not yet on the backend
                                    began */

  /* Lock free. */
  atomic_bool degraded;          /* the cache device failed: all around */
  atomic_bool degraded_passed;   /* ... and a pass from before is over
                                    (clean_order_enter) */
  atomic_uint read_errors;       /* cache-file read errors so far */
  atomic_bool backend_unflushed; /* a change went straight to the backend */
  _Atomic uint64_t last_io_ms;   /* monotonic time of the last client op */
  _Atomic uint64_t last_around_ms; /* ... of the last write that went to
                                    the backend around a full cache */
  uint32_t zero_page_crc;        /* CRC of an all-invalid page */

  char *export_name;             /* or NULL (cache.h) */
  struct budget *budget;         /* shared space, or NULL (cache.h) */
  bool (*reclaim) (struct cache *c, void *opaque);
  void *reclaim_opaque;

  struct cache_hooks hooks;
  void *bg[CACHE_BG_COUNT];      /* the threads' states (cache.h) */
};

/* Under c->lock: must the cache file be synced before slot s may stop
 * holding its page?  True while an older version of the page is still
 * on disk (not yet freed): losing s could bring it back after a crash.
 */
static inline bool
cache_needs_settling_locked (const struct cache *c, uint32_t s)
{
  return pt_flags (&c->pt, s) & PT_HASPRED;
}

/* order.c */
/* Does this cache keep the flush order now (writeback mode,
 * ssdcache-writeback-order=flush)?
 */
static inline bool
cache_ordered (const struct cache *c)
{
  /* (Dirty data outside writeback mode: recovered, or left by a mode
   * switch, and being written back.  The counts are read unlocked: they
   * only leave 0 in writeback mode or under recovery.)
   */
  return c->wbcfg.order == CACHE_ORDER_FLUSH &&
    (c->mode == LAYOUT_MODE_WRITEBACK || c->ndirty > 0 || c->nretained > 0);
}
/* Under c->lock: was slot s loaded dirty and unchecked after an
 * unclean shutdown?  Its mark goes (a slot is checked once, or is
 * reused).
 */
static inline bool
cache_suspect_take_locked (struct cache *c, uint32_t s)
{
  uint64_t bit = UINT64_C (1) << (s % 64);
  bool was;

  if (c->suspect == NULL)
    return false;
  was = c->suspect[s / 64] & bit;
  c->suspect[s / 64] &= ~bit;
  return was;
}

/* Under c->lock: is slot s an older version kept for the flush order,
 * its dirty data still to be written back in its generation?
 */
static inline bool
cache_retained_locked (const struct cache *c, uint32_t s)
{
  return c->wbcfg.order == CACHE_ORDER_FLUSH &&
    (pt_flags (&c->pt, s) & PT_SUPERSEDED) &&
    pt_state (&c->pt, s) == LAYOUT_DIRTY;
}
#define ORDER_OPEN UINT64_MAX    /* order_enter: the open generation */
extern int order_enter (struct cache *c, uint64_t gen);
extern void order_leave (struct cache *c);
extern void order_close_gen_locked (struct cache *c);
extern int order_try_advance (struct cache *c,
                              const struct cache_backend *be, int *err);
extern void order_loaded (struct cache *c);
extern void order_update_stats (struct cache *c);
extern void order_owned (struct cache *c, uint64_t first, uint64_t last);
extern bool order_owned_range (const struct cache *c, uint64_t *first,
                               uint64_t *last);

/* geom.c */
extern uint32_t cache_page_bytes (const struct cache *c, uint64_t page);
extern void cache_map_fill (const struct cache *c, uint8_t *map);
extern uint32_t cache_page_crc (const struct cache *c, const uint8_t *buf,
                                const uint8_t *valid);
/* The part [*a, *b) of page that the request [offset, offset+count)
 * covers, as offsets within the page.
 */
extern void cache_page_part (const struct cache *c, uint64_t page,
                             uint64_t offset, uint32_t count, uint32_t *a,
                             uint32_t *b);
extern void cache_sector_span (const struct cache *c, uint32_t off,
                               uint32_t n, unsigned *first, unsigned *last);
extern void cache_touch_io (struct cache *c);
extern uint64_t cache_now_ms (void);

/* slot.c */
extern uint32_t cache_lookup_pin (struct cache *c, uint64_t page);
extern void cache_unpin (struct cache *c, uint32_t s);
/* Under c->lock: the last pin of s went: a slot that left its page is
 * free again.
 */
extern void cache_release_slot_locked (struct cache *c, uint32_t s);
extern void cache_io_error (struct cache *c, const char *what, uint32_t s);
extern int cache_commit_entry (struct cache *c, uint32_t s,
                               const struct pt_slot *upd);
/* The same, for a write that belongs to sync epoch epoch (an earlier
 * one than the current: a flush sealing what it covers).
 */
#define CACHE_EPOCH_NOW UINT64_MAX
extern int cache_commit_entry_at (struct cache *c, uint32_t s,
                                  const struct pt_slot *upd, uint64_t epoch);
extern void cache_entry_renumber_locked (struct cache *c, uint32_t s,
                                         struct pt_slot *v,
                                         struct layout_entry *e);
extern int cache_write_entry (struct cache *c, uint32_t s,
                              const struct layout_entry *e);
extern bool cache_crc_memo_find_locked (const struct cache *c, uint32_t s,
                                        uint32_t *crc);
extern int cache_entry_crc (struct cache *c, uint32_t s,
                            const struct pt_slot *expect, uint32_t *crc);
extern void cache_set_state_counts_locked (struct cache *c, uint8_t old_state,
                                    uint8_t new_state);
/* cache_page_dirty (cache.h), under c->lock. */
extern bool cache_page_dirty_locked (const struct cache *c, uint64_t page);
extern bool cache_must_cow (const struct cache *c, uint32_t s);
/* Under c->lock: a new resident slot s for page, told to the policy. */
extern void cache_policy_insert (struct cache *c, uint32_t s, uint64_t page);

/* Under c->lock: put s on the list of slots that may be unsealed
 * (seal.c), in room cache_unseal_reserve_locked reserved.
 */
extern void cache_unseal_listed_locked (struct cache *c, uint32_t s);

/* alloc.c */
extern bool cache_dirty_pressure_locked (const struct cache *c);
/* What a slot is wanted for (cache_alloc_slot). */
enum alloc_for {
  ALLOC_FILL,        /* data read from the backend (evict_victim_fill) */
  ALLOC_DIRTY,       /* new dirty data: a free slot or an evicted one */
  ALLOC_DIRTY_PART,  /* part of a page not cached: as ALLOC_DIRTY, but
                        no eviction while dirty pages are above the high
                        watermark (admission under pressure, write-page.c) */
  ALLOC_FREE,        /* a free slot only (warm-up: nothing a client read
                        is evicted for it) */
};
/* A slot off the free list, or a clean one evicted, or PT_NONE at once
 * (never waits; for dirty data writeback is then woken).
 */
extern uint32_t cache_alloc_slot (struct cache *c, enum alloc_for why);
extern int cache_write_free_entry (struct cache *c, uint32_t s);

/* epoch.c: sync epochs, settling and superseded slots */
extern int cache_drop_slot (struct cache *c, uint32_t s);
extern bool cache_settle (struct cache *c, uint32_t s);
extern void cache_supersede (struct cache *c, uint32_t old, uint32_t succ,
                             uint64_t page);
extern bool cache_sup_add_locked (struct cache *c, uint32_t old,
                                  uint32_t succ);
/* c->inplace held shared by the calling thread (epoch.c), from a
 * decision to rewrite a slot in place to the end of its writes.  While
 * it is held, nothing may sync the cache file as a client (settle or
 * drop a slot): that takes c->inplace exclusively.
 */
extern void cache_inplace_enter (struct cache *c);
extern void cache_inplace_leave (struct cache *c);
/* Free the superseded slots that may go now (epoch.c). */
extern void cache_free_superseded (struct cache *c);
/* fdatasync for the filter's own needs: unlike cache_sync (a client
 * flush), it does not make dirty data "flushed".
 */
extern int cache_sync_device (struct cache *c, int *err);

/* fill.c: pages read from the backend or the cache file */
/* be: the backend to check clean data against on first use when
 * c->verify (NULL: no such check).
 */
extern int cache_read_verified (struct cache *c,
                                const struct cache_backend *be,
                                uint32_t s, uint8_t *buf);
extern int cache_read_verified_span (struct cache *c,
                                     const struct cache_backend *be,
                                     uint32_t s, uint8_t *buf, unsigned sf,
                                     unsigned sl);
/* After cache_read_verified failed for slot s of page: was s dropped
 * (the page is no longer cached, and the backend has it), rather than
 * marked bad?
 */
extern bool cache_slot_dropped (struct cache *c, uint64_t page, uint32_t s);
/* Log a dirty page whose data is gone (loudly: a client's write). */
extern void cache_log_dirty_lost (struct cache *c, uint32_t s, uint64_t page,
                                  const char *why);
/* Why a dirty page that fails its checksum after a crash is dropped. */
#define CACHE_TORN_WHY "fails its data checksum after an unclean " \
  "shutdown: a write torn by the crash (never flushed), or damaged data"
/* Who stores a page read from the backend (cache_fill_slot). */
enum fill_kind {
  FILL_CLIENT,       /* a client's read (or write) */
  FILL_PREFETCH,     /* readahead: marked, in the policy's small queue */
  FILL_WARM,         /* warm-up: a free slot only, never an eviction */
  FILL_COMPLETE,     /* a client's read completing a cached page: its
                        dirty data is not new (its flush generation
                        stays) */
};
extern int cache_fill_slot (struct cache *c, uint64_t page, uint32_t s,
                            const uint8_t *buf, const uint8_t *dirty,
                            enum fill_kind kind);

/* seal.c (see there) */
extern bool cache_unseal_reserve_locked (struct cache *c, uint32_t s);
extern void cache_unseal_unreserve_locked (struct cache *c, uint32_t s);
extern int cache_seal_slot (struct cache *c, uint32_t s, uint64_t epoch);
extern void cache_seal_epoch (struct cache *c, uint64_t epoch, bool wait,
                              bool clean_too);
extern size_t cache_unsealed_count (struct cache *c);

/* patch.c */
enum wkind {
  W_CLEAN,          /* the backend has this data already */
  W_DIRTY,          /* only the cache has it */
  W_FILL,           /* backend data for sectors that were not valid,
                       merged with the cached ones: dirty bits stay */
};
/* Part of one page to write into the cache: bytes [off, off + n) of
 * page, from src, as kind; *err gets the errno of a failure.  The
 * page-level write functions (write.c, patch.c) take this instead of
 * eight arguments.
 */
struct page_write {
  struct cache *c;
  const struct cache_backend *be;
  uint64_t page;
  const uint8_t *src;
  uint32_t off, n;
  enum wkind kind;
  int *err;
};
/* What cache_patch_slot did. */
enum patch_result {
  PATCH_OK = 0,
  PATCH_ERROR = -1,              /* *err set */
  PATCH_NO_MAPS = 2,             /* the new maps need a side-table entry
                                    and none is free: nothing changed */
  PATCH_NOT_UNSEALED = 3,        /* a W_CLEAN rewrite of a cached slot
                                    could not be made unsealed: nothing
                                    changed */
  PATCH_TORN = 4,                /* W_CLEAN, failed after its data write
                                    began (*err set): the slot may be
                                    torn and the backend has the page.
                                    The pin stays: the caller drops the
                                    slot (cache_drop_slot) once it no
                                    longer holds c->inplace */
};
/* Apply the write w to slot s in place: s is pinned, or fresh: newly
 * allocated and empty, not indexed.  Only the
 * sectors touched are read and written; the data CRC is patched, not
 * recomputed; an unflushed dirty slot rewritten in place a second time
 * is unsealed instead (seal.c): no checksum, no read, no entry write.
 * Consumes the pin (or, for fresh, indexes the slot; when not
 * PATCH_OK a fresh slot is freed).
 */
extern enum patch_result cache_patch_slot (const struct page_write *w,
                                           uint32_t s, bool fresh);
/* Merge the write w into span, which holds sectors [sf, sl] of the
 * page as stored, and update the maps (see patch.c).
 */
extern int patch_merge_span (const struct page_write *w, uint8_t *span,
                             unsigned sf, unsigned sl, uint8_t *valid,
                             uint8_t *dirty);

/* write-page.c */
/* Put the write w into the cache (W_CLEAN: the backend already has the
 * bytes; a page not cached is only added when written whole).  The
 * page is range locked by the caller.
 */
extern int cache_write_page (const struct page_write *w);
/* Rewrite pinned slot s in place (see write-page.c); consumes the pin. */
extern int cache_patch_in_place (const struct page_write *w, uint32_t s);

/* write-through.c */
/* One client write, its pages [first, last] range locked: what
 * cache_write_backend_first and write.c's write_pages take.
 */
struct write_req {
  struct cache *c;
  const struct cache_backend *be;
  enum layout_mode mode;         /* this write's (see cache_write) */
  const uint8_t *buf;
  uint32_t count;
  uint64_t offset;
  bool fua;
  uint64_t first, last;
  int *err;
};
/* Writethrough / writearound (and writeback writes sent around), with
 * [first, last] range locked: dirty pages written back, the cached
 * copies changed or dropped, then the backend written.
 */
extern int cache_write_backend_first (const struct write_req *req);

/* write-back.c */
/* May the cache not take this writeback write (see write-back.c)?
 * *promised: the pages it may dirty, added to c->dirty_promised.
 */
extern bool cache_write_goes_around (struct cache *c, uint64_t first,
                                     uint64_t last, uint64_t *promised);

/* clean.c */
/* Slots a pass scans for dirty pages per hold of c->lock (16384; a
 * test hook).
 */
extern unsigned cache_collect_chunk;
/* Write back the dirty sectors of one page now, from the caller's
 * thread: slot s holds page, is pinned (the pin stays), and the page is
 * range locked by the caller.  The backend is flushed, then the slot is
 * marked clean.  For a writer that needs a slot when there is none.
 */
extern int clean_page_held (struct cache *c,
                            const struct cache_backend *be,
                            uint64_t page, uint32_t s, int *err);
/* Write back, from the caller's thread, the dirty pages in [first,
 * last] (range locked by the caller) whose data is of flush generation
 * gen_max or older (UINT64_MAX: all), so that the backend alone is
 * current for them: written, the backend flushed (once for up to
 * CLEAN_GROUP_BYTES of them; in the flush order once per page), then
 * marked clean.  Returns 0 or -1 (*err): a page that cannot be
 * written back (bad data, backend error) stays dirty.
 */
extern int clean_pages_held (struct cache *c,
                             const struct cache_backend *be,
                             uint64_t first, uint64_t last,
                             uint64_t gen_max, int *err);
/* Write back now, from the caller's thread, which holds no range lock,
 * every page dirty when it is called; pages a pass finds busy are
 * waited for, one at a time.  Returns 0 or -1 (*err).
 */
extern int clean_all_now (struct cache *c, const struct cache_backend *be,
                          int *err);
/* Before a backend write of data of flush generation gen (ORDER_OPEN:
 * a client's write now) in the flush order: write the older
 * generations back first, from the caller's thread (its own pages of
 * them too: see order_owned).  Returns 1 (registered: order_leave after
 * the write), 0 (no order to keep) or -1 (*err).
 */
extern int clean_order_enter (struct cache *c, const struct cache_backend *be,
                              uint64_t gen, int *err);

/* around.c */
extern void cache_invalidate_pages (struct cache *c, uint64_t first,
                                    uint64_t last);
/* Drop the clean cached pages of [first, last] (range locked). */
extern void cache_invalidate_clean_pages (struct cache *c, uint64_t first,
                                          uint64_t last);
/* Write back the dirty pages of [first, last] (range locked). */
extern int cache_clean_pages (struct cache *c, const struct cache_backend *be,
                              uint64_t first, uint64_t last, int *err);
/* A request that goes around the cache (see around.c). */
extern int cache_around (struct cache *c, const struct cache_backend *be,
                         cache_backend_op do_op, void *opaque, uint32_t count,
                         uint64_t offset, int *err);

/* recover.c */
/* Load the page table from the entries (cache_attach, after an
 * accepted superblock); slots at or past data_end have no data.
 * Returns 0 or -1 (logged).
 */
extern int recover_load_entries (struct cache *c, uint32_t data_end);

/* resize.c */
/* Give the file of c, just closed cleanly with no dirty data but with
 * its page table still in RAM, c->resize_slots slots, keeping the
 * clean pages the new geometry can hold, the hottest first.  Returns
 * 0, or -1 (logged): then the file holds the old cache, or one that
 * starts empty.  resize_test_moves (unit tests; 0: the default) sets
 * how many pages are moved between two syncs.
 */
extern int resize_file (struct cache *c);
extern unsigned resize_test_moves;

/* stale.c */
/* The entry of slot s (page) on the cache file could not be rewritten
 * after a write-back (disk_dirty: it still says dirty; crc: the
 * checksum of the data it holds) or a drop (crc NULL).
 */
extern void cache_stale_add (struct cache *c, uint32_t s, uint64_t page,
                             bool disk_dirty, const uint32_t *crc);
/* Slot s was dropped, but an older version of its page could not be
 * freed on the cache file: s's entry stays as it is, never rewritten.
 */
extern void cache_stale_keep (struct cache *c, uint32_t s, uint64_t page,
                              bool disk_dirty);
/* Before the backend gets data for pages [first, last]: record those
 * pages' entries on the cache file.  Returns 0, or -1 with *err = EIO
 * if an entry that says dirty cannot be rewritten (logged).
 */
extern int cache_stale_record (struct cache *c, uint64_t first,
                               uint64_t last, int *err);
/* Record all of them; true if none is left. */
extern bool cache_stale_record_all (struct cache *c);

#endif /* SSDCACHE_CACHE_INT_H */
