/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: counters.
 *
 * Owns printing of the counters; see stats.h (atomics, no lock).
 */
#include <inttypes.h>

#include "log.h"
#include "stats.h"

#define STATS_FIELDS(X) \
  X (read_ops) X (read_hits) X (read_misses) X (read_partial) \
  X (bytes_from_cache) X (bytes_from_backend) X (write_ops) \
  X (bytes_written) X (pages_updated) X (pages_invalidated) X (fills) \
  X (evictions) X (bypassed) X (seq_bypassed) X (promote_skipped) \
  X (prefetch_requests) X (prefetch_pages) X (prefetch_hits) \
  X (prefetch_wasted) \
  X (verify_failures) X (verify_mismatches) X (cache_errors) \
  X (loaded_slots) X (dropped_entries) X (damaged_entries) X (dirty_dropped) \
  X (unsealed_dropped) X (dirty_lost) \
  X (cow_copies) X (cache_syncs) X (pages_written_back) \
  X (bytes_written_back) X (writeback_errors) X (write_through_full) \
  X (wait_ms) X (dirty_pages) X (degraded) \
  X (partial_maps) X (partial_maps_full) X (pt_rebases) \
  X (writes_not_cached) X (writes_deferred) X (deferred_waits) \
  X (writeback_hot_ms)

void
stats_print (const struct stats *st, FILE *fp)
{
#define PRINT(f) fprintf (fp, "%s: %" PRIu64 "\n", #f, STATS_GET (st, f));
  STATS_FIELDS (PRINT)
#undef PRINT
}

void
stats_debug (const struct stats *st)
{
#define DEBUG(f) log_debug ("stats: %s: %" PRIu64, #f, STATS_GET (st, f));
  STATS_FIELDS (DEBUG)
#undef DEBUG
}
