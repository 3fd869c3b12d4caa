/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: checking cached data against the backend
 * (pure).  See verify.h.  No state, no locks.
 */
#include <string.h>

#include "verify.h"

unsigned
verify_clean_sectors (const uint8_t *valid, const uint8_t *dirty,
                      unsigned nsectors, uint8_t *clean_valid)
{
  unsigned n = 0;

  memset (clean_valid, 0, LAYOUT_MAX_SECTORS / 8);
  for (unsigned i = 0; i < nsectors; i++)
    if (layout_bit_test (valid, i) && !layout_bit_test (dirty, i)) {
      layout_bit_set (clean_valid, i);
      n++;
    }
  return n;
}

unsigned
verify_stale_sectors (const uint8_t *cached, const uint8_t *backend,
                      const uint8_t *valid, const uint8_t *dirty,
                      const struct verify_geom *g, uint8_t *stale)
{
  const unsigned nsectors = g->nsectors;
  const uint32_t ss = g->ss, pbytes = g->pbytes;
  uint8_t clean[LAYOUT_MAX_SECTORS / 8];
  unsigned n = 0;

  verify_clean_sectors (valid, dirty, nsectors, clean);
  memset (stale, 0, LAYOUT_MAX_SECTORS / 8);
  for (unsigned i = 0; i < nsectors; i++) {
    uint32_t lo = i * ss, len;

    if (!layout_bit_test (clean, i) || lo >= pbytes)
      continue;
    len = pbytes - lo < ss ? pbytes - lo : ss;
    if (memcmp (cached + lo, backend + lo, len) != 0) {
      layout_bit_set (stale, i);
      n++;
    }
  }
  return n;
}
