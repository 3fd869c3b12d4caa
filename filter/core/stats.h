/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: counters.
 *
 * Owns the statistics counters.  They are C11 atomics updated with
 * relaxed ordering, so no lock is needed; a snapshot printed while
 * requests run may be slightly inconsistent between counters.
 */
#ifndef SSDCACHE_STATS_H
#define SSDCACHE_STATS_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

struct stats {
  _Atomic uint64_t read_ops;          /* client reads */
  _Atomic uint64_t read_hits;         /* pages served wholly from the cache */
  _Atomic uint64_t read_misses;       /* pages not in the cache */
  _Atomic uint64_t read_partial;      /* pages cached but missing sectors */
  _Atomic uint64_t bytes_from_cache;
  _Atomic uint64_t bytes_from_backend;
  _Atomic uint64_t write_ops;         /* client writes */
  _Atomic uint64_t bytes_written;
  _Atomic uint64_t pages_updated;     /* cached pages updated by writes */
  _Atomic uint64_t pages_invalidated; /* by writearound, zero, trim, errors */
  _Atomic uint64_t fills;             /* slots filled from the backend */
  _Atomic uint64_t evictions;
  _Atomic uint64_t eviction_pauses;   /* times an eviction let go of
                                         c->lock to go on later */
  _Atomic uint64_t bypassed;          /* pages not cached: no free slot */
  _Atomic uint64_t seq_bypassed;      /* pages not cached: beyond the
                                         sequential cutoff of a stream */
  _Atomic uint64_t promote_skipped;   /* read-miss pages not cached: not
                                         missed ssdcache-promote times yet */
  _Atomic uint64_t fills_behind;      /* pages of client read misses stored
                                         after the client's answer */
  _Atomic uint64_t fills_behind_dropped; /* ... not stored: the queue was
                                         full, the page was changed or
                                         busy meanwhile, or had no slot */
  _Atomic uint64_t prefetch_requests; /* backend reads made by readahead */
  _Atomic uint64_t prefetch_pages;    /* pages stored by readahead */
  _Atomic uint64_t prefetch_hits;     /* ... then read by a client */
  _Atomic uint64_t prefetch_wasted;   /* ... evicted or dropped unread */
  _Atomic uint64_t verify_failures;   /* slots dropped: data CRC mismatch */
  _Atomic uint64_t verify_mismatches; /* ssdcache-verify=lazy: cached pages
                                         whose clean data differed from
                                         the backend on first use */
  _Atomic uint64_t cache_errors;      /* cache device I/O errors */
  _Atomic uint64_t loaded_slots;      /* slots loaded warm at start-up */
  _Atomic uint64_t dropped_entries;   /* entries rejected at start-up */
  _Atomic uint64_t damaged_entries;   /* ... of them: entries that fail
                                         their checks (damage) */
  _Atomic uint64_t dirty_dropped;     /* torn (never flushed) dirty pages
                                         found after a crash */
  _Atomic uint64_t unsealed_dropped;  /* unflushed in-place rewrites (no
                                         checksum) dropped after a crash */
  _Atomic uint64_t dirty_lost;        /* dirty pages whose data failed its
                                         checksum: reads get EIO */
  _Atomic uint64_t cow_copies;        /* durable dirty pages copied on write */
  _Atomic uint64_t cache_syncs;       /* fdatasync of the cache file */
  _Atomic uint64_t pages_written_back;
  _Atomic uint64_t bytes_written_back;
  _Atomic uint64_t writeback_errors;
  _Atomic uint64_t write_through_full;/* writes sent to the backend because
                                         the cache was full of dirty data */
  _Atomic uint64_t dirty_pages;       /* gauge: pages holding dirty data */
  _Atomic uint64_t degraded;          /* gauge: 1 once the cache device failed
                                         and the filter is degraded */
  _Atomic uint64_t partial_maps;      /* gauge: pages whose valid or dirty
                                         sectors are not one run (kept in
                                         the page table's side table) */
  _Atomic uint64_t partial_maps_full; /* times such maps did not fit (the
                                         side table was full) */
  _Atomic uint64_t pt_rebases;        /* page-table group rebases */
  _Atomic uint64_t writes_not_cached; /* writethrough partial writes to
                                          sectors not cached: backend only */
  _Atomic uint64_t writes_deferred;   /* writethrough rewrites of cached
                                         data queued for the background
                                         (defer.c) */
  _Atomic uint64_t deferred_waits;    /* times a request waited for queued
                                         writes (to read the slot, or the
                                         queue was full) */
  _Atomic uint64_t writeback_hot_ms;  /* gauge: background cleaning's hot
                                         window (writeback.c); 0: no
                                         writeback thread */

#define STATS_ADD(st, field, n) \
  atomic_fetch_add_explicit (&(st)->field, (n), memory_order_relaxed)
#define STATS_GET(st, field) \
  atomic_load_explicit (&(st)->field, memory_order_relaxed)

  _Atomic uint64_t backend_errors;    /* backend requests that failed */
  _Atomic uint64_t seq_write_bypassed;/* writeback: writes of a long
                                         sequential stream sent around a
                                         cache that was behind */
  _Atomic uint64_t dirty_cap_writes;  /* writeback: writes sent through
                                         because ssdcache-writeback-max-
                                         dirty was reached */
  _Atomic uint64_t warm_bytes;        /* read from the backend by the
                                         warm-up (ssdcache-warm) */
  _Atomic uint64_t warm_progress_pct; /* gauge: how far it got */
  _Atomic uint64_t warm_bytes_per_second; /* gauge: its recent rate */
  _Atomic uint64_t warm_full;         /* gauge: 1 once it stopped because
                                         the cache was full */
  _Atomic uint64_t slots_given;       /* clean slots given up to another
                                         export (the shared budget) */
  /* ssdcache-writeback-order=flush (engine/order.c). */
  _Atomic uint64_t order_flush_point; /* gauge: client flushes whose data
                                         the backend alone holds */
  _Atomic uint64_t order_lag_flushes; /* gauge: flushes it is behind */
  _Atomic uint64_t order_lag_seconds; /* gauge: since the oldest of them */
  _Atomic uint64_t order_behind_bytes;/* gauge: dirty data it lacks */
  _Atomic uint64_t order_retained;    /* gauge: superseded versions kept
                                         until their flush point is on
                                         the backend */
  _Atomic uint64_t order_writer_waits;/* writes that wrote older flush
                                         generations back first */
  _Atomic uint64_t order_broken;      /* backend writes made out of order
                                         (degraded mode after a cache
                                         device failure; logged) */
};

/* Counter formats of ssdcache-stats-format. */
enum stats_format {
  STATS_TEXT = 0,                     /* "name: value" lines */
  STATS_JSON = 1,                     /* one JSON object */
  STATS_PROMETHEUS = 2,               /* Prometheus text exposition */
};

/* Values derived from the counters and the cache, for the reader. */
struct stats_extra {
  uint64_t page_size;
  double writeback_bytes_per_s;       /* over the last interval */
  const char *export_name;            /* the export, or NULL (not shown) */
};

/* Print every counter as "name: value" lines. */
extern void stats_print (const struct stats *st, FILE *fp);
/* Every counter and the derived values (hit ratio, dirty bytes,
 * writeback throughput) in format f.
 */
extern void stats_write (const struct stats *st, const struct stats_extra *x,
                         enum stats_format f, FILE *fp);
/* Same, through log_debug. */
extern void stats_debug (const struct stats *st);

#endif /* SSDCACHE_STATS_H */
