/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: warm-up thread (ssdcache-warm=all); see
 * warm.c.
 */
#ifndef SSDCACHE_WARM_H
#define SSDCACHE_WARM_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"

/* Start warming c from be (rate: bytes per second, 0: no limit). */
extern int warm_start (struct cache *c, const struct cache_backend *be,
                       uint64_t rate);
extern void warm_stop (struct cache *c);
extern bool warm_running (struct cache *c);

#endif /* SSDCACHE_WARM_H */
