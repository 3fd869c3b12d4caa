/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: checking cached data against the backend
 * (pure: no I/O, no nbdkit).
 *
 * Owns the comparison behind ssdcache-verify=lazy: which sectors of a
 * cached page hold clean data that is not what the backend has now (the
 * backing store was changed while the cache was offline).  Dirty
 * sectors are never compared: the cache is authoritative for them.  No
 * state, no locks.
 */
#ifndef SSDCACHE_VERIFY_H
#define SSDCACHE_VERIFY_H

#include <stdint.h>

#include "layout.h"

/* A page's shape: nsectors sectors of ss bytes, of which the backend
 * has the first pbytes (pbytes <= nsectors * ss: less for the short
 * last page).
 */
struct verify_geom {
  unsigned nsectors;
  uint32_t ss, pbytes;
};

/* cached and backend hold one page (backend: its first g->pbytes bytes
 * from the backend).  Sets in stale the sectors that are valid and not
 * dirty in the cache but differ from the backend (bytes past pbytes are
 * not compared), and returns how many.
 */
extern unsigned verify_stale_sectors (const uint8_t *cached,
                                      const uint8_t *backend,
                                      const uint8_t *valid,
                                      const uint8_t *dirty,
                                      const struct verify_geom *g,
                                      uint8_t *stale);

/* The sectors that are valid and not dirty (the ones a verification
 * compares) into clean_valid; returns how many.
 */
extern unsigned verify_clean_sectors (const uint8_t *valid,
                                      const uint8_t *dirty,
                                      unsigned nsectors,
                                      uint8_t *clean_valid);

#endif /* SSDCACHE_VERIFY_H */
