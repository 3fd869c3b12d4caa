/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: a RAM backend for the cache engine.
 *
 * Implements struct cache_backend over a malloc'ed buffer, counts calls
 * and bytes, checks that the engine never goes past the end, and can
 * fail the next read or write with a given errno.  A mutex makes each
 * call atomic with respect to the others (like a well-behaved plugin).
 */
#ifndef SSDCACHE_TEST_RAMBACKEND_H
#define SSDCACHE_TEST_RAMBACKEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache.h"

struct rambackend {
  pthread_mutex_t lock;
  uint8_t *data;
  uint64_t size;

  _Atomic uint64_t reads, writes;             /* calls */
  _Atomic uint64_t bytes_read, bytes_written;
  _Atomic uint64_t out_of_range;              /* calls past the end */
  _Atomic uint64_t fua_writes;

  int fail_read_errno;     /* fail the next pread with this (0: no) */
  int fail_write_errno;    /* fail the next pwrite with this (0: no) */
  uint64_t failed;         /* injected failures delivered */

  /* If non-zero, every call sleeps a pseudo-random 0..delay_max_us
   * microseconds after doing its work (outside the mutex), like a slow
   * backend: this widens the windows in which concurrent requests can
   * interleave badly.
   */
  /* If set, the process exits (_exit (0)) right after the next write
   * has reached the backend: a crash at that moment, for fork tests.
   */
  bool exit_after_write;
  /* If set, the process exits (_exit (0)) when the next write is
   * called, before the backend gets it: a crash between the cache's
   * update and the backend's.
   */
  bool exit_before_write;

  _Atomic unsigned delay_max_us;
  _Atomic uint64_t delay_counter;

  struct cache_backend be; /* ready to pass to cache_read etc. */
};

/* Allocate size bytes filled deterministically from seed. */
extern void rambackend_init (struct rambackend *rb, uint64_t size,
                             unsigned seed);
extern void rambackend_free (struct rambackend *rb);

/* Expected contents for (size, seed), for a process that needs the same
 * data (fork tests).
 */
extern void rambackend_fill (uint8_t *buf, uint64_t size, unsigned seed);

extern void rambackend_reset_counters (struct rambackend *rb);
extern void rambackend_fail_next_read (struct rambackend *rb, int err);
extern void rambackend_fail_next_write (struct rambackend *rb, int err);

/* Copy out / poke contents directly, bypassing the counters. */
extern void rambackend_peek (struct rambackend *rb, void *buf,
                             uint32_t count, uint64_t offset);
extern void rambackend_poke (struct rambackend *rb, const void *buf,
                             uint32_t count, uint64_t offset);

#endif /* SSDCACHE_TEST_RAMBACKEND_H */
