/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: counters.
 *
 * Owns printing of the counters; see stats.h (atomics, no lock).
 */
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>

#include "log.h"
#include "stats.h"

#define STATS_FIELDS(X) \
  X (read_ops) X (read_hits) X (read_misses) X (read_partial) \
  X (bytes_from_cache) X (bytes_from_backend) X (write_ops) \
  X (bytes_written) X (pages_updated) X (pages_invalidated) X (fills) \
  X (evictions) X (eviction_pauses) X (bypassed) X (seq_bypassed) X (promote_skipped) \
  X (fills_behind) X (fills_behind_dropped) \
  X (prefetch_requests) X (prefetch_pages) X (prefetch_hits) \
  X (prefetch_wasted) \
  X (verify_failures) X (verify_mismatches) X (cache_errors) \
  X (loaded_slots) X (dropped_entries) X (damaged_entries) X (dirty_dropped) \
  X (unsealed_dropped) X (dirty_lost) \
  X (cow_copies) X (cache_syncs) X (pages_written_back) \
  X (bytes_written_back) X (writeback_errors) X (write_through_full) \
  X (dirty_pages) X (degraded) \
  X (partial_maps) X (partial_maps_full) X (pt_rebases) \
  X (writes_not_cached) X (writes_deferred) X (deferred_waits) \
  X (writeback_hot_ms) X (backend_errors) X (slots_given) \
  X (dirty_cap_writes) X (seq_write_bypassed) X (warm_bytes) X (warm_progress_pct) \
  X (warm_bytes_per_second) X (warm_full) \
  X (order_flush_point) X (order_lag_flushes) X (order_lag_seconds) \
  X (order_behind_bytes) X (order_retained) X (order_writer_waits) \
  X (order_broken)

/* The counters that are gauges (a level, not a count of events). */
#define STATS_GAUGES(X) \
  X (dirty_pages) X (degraded) X (partial_maps) X (writeback_hot_ms) \
  X (loaded_slots) X (warm_progress_pct) X (warm_bytes_per_second) \
  X (warm_full) X (order_flush_point) X (order_lag_flushes) \
  X (order_lag_seconds) X (order_behind_bytes) X (order_retained)

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

/* Pages served from the cache among those read (0 before any read). */
static double
hit_ratio (const struct stats *st)
{
  uint64_t hits = STATS_GET (st, read_hits);
  uint64_t all = hits + STATS_GET (st, read_misses) +
    STATS_GET (st, read_partial);

  return all ? (double) hits / all : 0;
}

/* Whole seconds (rounded up) to write back the dirty data at the last
 * interval's writeback throughput: false if unknown (dirty data, but
 * none written back lately).
 */
static bool
drain_seconds (const struct stats *st, const struct stats_extra *x,
               uint64_t *secs)
{
  uint64_t dirty = STATS_GET (st, dirty_pages) * x->page_size;
  double s;

  *secs = 0;
  if (dirty == 0)
    return true;
  if (x->writeback_bytes_per_s <= 0)
    return false;
  s = dirty / x->writeback_bytes_per_s;
  *secs = (uint64_t) s + ((double) (uint64_t) s < s);
  return true;
}

/* A client's export name on one line of its own: control characters,
 * DEL and backslashes as C escapes (\n, \xHH, \\), so that no name
 * can start a line that reads as a counter.
 */
static void
put_escaped (const char *name, FILE *fp)
{
  for (const unsigned char *p = (const unsigned char *) name; *p; p++)
    if (*p == '\\')
      fputs ("\\\\", fp);
    else if (*p == '\n')
      fputs ("\\n", fp);
    else if (*p < 0x20 || *p == 0x7f)
      fprintf (fp, "\\x%02x", *p);
    else
      fputc (*p, fp);
}

static void
write_text (const struct stats *st, const struct stats_extra *x, FILE *fp)
{
  uint64_t drain;

  if (x->export_name) {
    fputs ("export: ", fp);
    put_escaped (x->export_name, fp);
    fputc ('\n', fp);
  }
  stats_print (st, fp);
  fprintf (fp, "hit_ratio: %.4f\n", hit_ratio (st));
  fprintf (fp, "dirty_bytes: %" PRIu64 "\n",
           STATS_GET (st, dirty_pages) * x->page_size);
  fprintf (fp, "writeback_bytes_per_second: %.0f\n",
           x->writeback_bytes_per_s);
  if (drain_seconds (st, x, &drain))
    fprintf (fp, "writeback_drain_seconds: %" PRIu64 "\n", drain);
}

static void
write_json (const struct stats *st, const struct stats_extra *x, FILE *fp)
{
  uint64_t drain;

  fputs ("{", fp);
  if (x->export_name) {
    fputs ("\"export\": \"", fp);
    for (const unsigned char *p = (const unsigned char *) x->export_name;
         *p; p++)
      if (*p == '"' || *p == '\\' || *p < 0x20)
        fprintf (fp, "\\u%04x", *p);
      else
        fputc (*p, fp);
    fputs ("\", ", fp);
  }
#define JSON(f) fprintf (fp, "\"%s\": %" PRIu64 ", ", #f, STATS_GET (st, f));
  STATS_FIELDS (JSON)
#undef JSON
  fprintf (fp, "\"hit_ratio\": %.4f, ", hit_ratio (st));
  fprintf (fp, "\"dirty_bytes\": %" PRIu64 ", ",
           STATS_GET (st, dirty_pages) * x->page_size);
  fprintf (fp, "\"writeback_bytes_per_second\": %.0f",
           x->writeback_bytes_per_s);
  if (drain_seconds (st, x, &drain))
    fprintf (fp, ", \"writeback_drain_seconds\": %" PRIu64, drain);
  fputs ("}\n", fp);
}

static bool
is_gauge (const char *name)
{
#define GAUGE(f) if (strcmp (name, #f) == 0) return true;
  STATS_GAUGES (GAUGE)
#undef GAUGE
  return false;
}

static void
prom_one (FILE *fp, const char *name, bool gauge, const char *value)
{
  fprintf (fp, "# TYPE ssdcache_%s%s %s\n", name, gauge ? "" : "_total",
           gauge ? "gauge" : "counter");
  fprintf (fp, "ssdcache_%s%s %s\n", name, gauge ? "" : "_total", value);
}

/* Prometheus text exposition format (version 0.0.4): counters get the
 * suffix _total, derived values are gauges.
 */
static void
write_prometheus (const struct stats *st, const struct stats_extra *x,
                  FILE *fp)
{
  char v[64];
  uint64_t drain;

  if (x->export_name) {
    fputs ("# export: ", fp);
    put_escaped (x->export_name, fp);
    fputc ('\n', fp);
  }
#define PROM(f) \
  snprintf (v, sizeof v, "%" PRIu64, STATS_GET (st, f)); \
  prom_one (fp, #f, is_gauge (#f), v);
  STATS_FIELDS (PROM)
#undef PROM
  snprintf (v, sizeof v, "%.4f", hit_ratio (st));
  prom_one (fp, "hit_ratio", true, v);
  snprintf (v, sizeof v, "%" PRIu64,
            STATS_GET (st, dirty_pages) * x->page_size);
  prom_one (fp, "dirty_bytes", true, v);
  snprintf (v, sizeof v, "%.0f", x->writeback_bytes_per_s);
  prom_one (fp, "writeback_bytes_per_second", true, v);
  if (drain_seconds (st, x, &drain)) {
    snprintf (v, sizeof v, "%" PRIu64, drain);
    prom_one (fp, "writeback_drain_seconds", true, v);
  }
}

void
stats_write (const struct stats *st, const struct stats_extra *x,
             enum stats_format f, FILE *fp)
{
  switch (f) {
  case STATS_JSON:
    write_json (st, x, fp);
    break;
  case STATS_PROMETHEUS:
    write_prometheus (st, x, fp);
    break;
  default:
    write_text (st, x, fp);
  }
}
