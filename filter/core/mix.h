/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: a 64-bit integer mixer (pure).
 *
 * The splitmix64 finaliser: spreads backend page numbers (which are
 * often sequential) over hash tables and fingerprints.  No state.
 */
#ifndef SSDCACHE_MIX_H
#define SSDCACHE_MIX_H

#include <stdint.h>

static inline uint64_t
mix64 (uint64_t x)
{
  x += UINT64_C (0x9e3779b97f4a7c15);
  x = (x ^ (x >> 30)) * UINT64_C (0xbf58476d1ce4e5b9);
  x = (x ^ (x >> 27)) * UINT64_C (0x94d049bb133111eb);
  return x ^ (x >> 31);
}

#endif /* SSDCACHE_MIX_H */
