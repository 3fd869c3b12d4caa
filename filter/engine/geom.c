/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: page geometry, data checksums and the clock.
 *
 * Owns the arithmetic every path shares: how many bytes a page has
 * (the backend's last one may be short), which sectors a byte range
 * covers, a page's data CRC over its valid sectors, and the monotonic
 * clock in milliseconds.  No locks: each function reads only fields
 * fixed at open, or stores one atomic (cache_touch_io).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache-int.h"

/* Zeroes standing in for invalid sectors in data CRCs. */
static const uint8_t zero_sector[LAYOUT_MAX_PAGE / LAYOUT_MAX_SECTORS];

uint64_t
cache_now_ms (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
cache_sleep_ms (uint64_t ms)
{
  struct timespec ts = { .tv_sec = ms / 1000,
                         .tv_nsec = (ms % 1000) * 1000000 };

  while (nanosleep (&ts, &ts) == -1 && errno == EINTR)
    ;
}

void
cache_touch_io (struct cache *c)
{
  atomic_store_explicit (&c->last_io_ms, cache_now_ms (),
                         memory_order_relaxed);
}

uint32_t
cache_page_bytes (const struct cache *c, uint64_t page)
{
  uint64_t start = page * c->page_size;

  if (start >= c->backend_size)
    return 0;
  if (c->backend_size - start < c->page_size)
    return c->backend_size - start;
  return c->page_size;
}

void
cache_map_fill (const struct cache *c, uint8_t *map)
{
  memset (map, 0, LAYOUT_MAX_SECTORS / 8);
  for (unsigned i = 0; i < c->nsectors; i++)
    layout_bit_set (map, i);
}

uint32_t
cache_page_crc (const struct cache *c, const uint8_t *buf,
                const uint8_t *valid)
{
  uint32_t crc = 0;

  for (unsigned i = 0; i < c->nsectors; i++) {
    const uint8_t *p = layout_bit_test (valid, i)
      ? buf + (size_t) i * c->sector_size : zero_sector;
    crc = layout_crc32c_update (crc, p, c->sector_size);
  }
  return crc;
}

void
cache_page_part (const struct cache *c, uint64_t page, uint64_t offset,
                 uint32_t count, uint32_t *a, uint32_t *b)
{
  const uint64_t pstart = page * c->page_size;

  *a = offset > pstart ? offset - pstart : 0;
  *b = offset + count < pstart + c->page_size ? offset + count - pstart
    : c->page_size;
}

void
cache_sector_span (const struct cache *c, uint32_t off, uint32_t n,
                   unsigned *first, unsigned *last)
{
  *first = off / c->sector_size;
  *last = (off + n - 1) / c->sector_size;
}
