/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: the engine tests' shared set-up.
 *
 * fixture_config is the one cache configuration the engine tests start
 * from: the filter's own defaults (cache_config_defaults, the ones
 * config.c ships: S3-FIFO, deferred writethrough writes, adaptive
 * readahead, ...), with only what a test must choose set on top: the
 * cache file (testfile_path), its size and page size, the backend
 * identity and direct I/O (`make check-direct`, testfile_direct).  A
 * test that needs anything else (writeback mode, another policy,
 * readahead off, no deferral, ...) sets it itself and says why.
 */
#ifndef SSDCACHE_FIXTURE_H
#define SSDCACHE_FIXTURE_H

#include <stdint.h>

#include "cache.h"
#include "testfile.h"

/* The backend identity of fixture_config. */
#define FIXTURE_ID_TEXT "unit test backend"

extern struct cache_config fixture_config (uint64_t size,
                                           uint32_t page_size);

/* The same in writeback mode, with background cleaning off (high
 * watermark 100%, no idle writeback): the writeback tests decide when
 * dirty data is written back (cache_writeback_all, writeback_pass), so
 * that what they count does not depend on the writeback thread's
 * timing.  A test that wants the thread turns it on itself.
 */
extern struct cache_config fixture_writeback_config (uint64_t size,
                                                     uint32_t page_size);

#endif /* SSDCACHE_FIXTURE_H */
