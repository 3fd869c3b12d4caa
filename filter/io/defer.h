/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the gate of slot-data I/O, which defers
 * writethrough's small updates.
 *
 * Every read and write of a slot's data in the engine, in every mode,
 * goes through defer_read_data / defer_write_data.  Only writethrough
 * queues anything (defer_write_data_later, from patch.c: W_CLEAN
 * rewrites of an unsealed slot in place); in writeback and writearound
 * the queue stays empty, and each call is one atomic load and then the
 * pool's own pread or pwrite.
 *
 * A writethrough write to a cached page changes the cached copy and
 * the backend.  The cached copy's slot is unsealed first (its entry on
 * disk says "do not trust this slot after a crash"), so the new bytes
 * need not reach the cache file before the request is answered: they
 * can be queued here and written a moment later by a background
 * thread, off the request's path.
 *
 * The rule that keeps this invisible: every other read or write of a
 * slot's data (defer_read_data, defer_write_data) first waits until the
 * writes queued for that slot are in the file, and defer_sync first
 * writes out the whole queue.  So the file sees each slot's writes in
 * the order they were issued, and nobody ever reads a slot's data
 * without its queued writes.  When a queued write fails, the queue is
 * marked failed: every later slot read, write or sync through here
 * fails with EIO for the rest of the run, after defer_stop too (the
 * cache is then degraded by on_error, and the backend has the data;
 * at close nothing may seal a slot from its older bytes on disk).
 *
 * Locking: d->lock protects the two entry arrays, their counts, idle,
 * kicked and stop; d->apply is held by whoever writes entries out (the
 * thread, or a caller that needs a slot's writes now), across the
 * writes; order: d->apply, then d->lock.  count and failed are atomics
 * read without a lock on the fast path (no writes queued).
 */
#ifndef SSDCACHE_DEFER_H
#define SSDCACHE_DEFER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "stats.h"

struct pool;

/* Writes up to this size are queued; bigger ones are written at once. */
#define DEFER_MAX_BYTES 4096
/* Entries in the queue (each holds DEFER_MAX_BYTES). */
#define DEFER_ENTRIES 64
/* How long the thread lets writes gather before writing them. */
#define DEFER_DELAY_US 1000

struct defer_entry {
  uint64_t slot;
  uint32_t off, len;
  uint8_t data[DEFER_MAX_BYTES];
};

struct defer {
  struct pool *pool;
  struct stats *stats;          /* may be NULL */
  void (*on_error) (void *opaque, uint64_t slot, int err);
  void *opaque;

  pthread_mutex_t lock;
  pthread_mutex_t apply;
  pthread_cond_t cv;            /* wakes the thread (CLOCK_MONOTONIC) */
  struct defer_entry *queued;   /* waiting, in issue order */
  struct defer_entry *busy;     /* being written by the d->apply holder */
  unsigned nqueued, nbusy;
  bool idle;                    /* the thread sleeps until signalled */
  bool kicked;                  /* the thread was asked to write now */
  bool stop;
  pthread_t thread;
  bool running;

  _Atomic bool active;          /* between defer_start and defer_stop */
  _Atomic unsigned count;       /* nqueued + nbusy */
  _Atomic bool failed;
};

/* Start deferring p's slot writes (defer_write_data_later): allocate
 * the queue and start the thread.  on_error is
 * called (from whichever thread wrote the entry) when a queued write
 * fails.  Returns 0 or -1 (errno).
 */
extern int defer_start (struct defer *d, struct pool *p, struct stats *st,
                        void (*on_error) (void *opaque, uint64_t slot,
                                          int err),
                        void *opaque);

/* Write out everything, stop the thread.  Safe on a defer never
 * started (zeroed).
 */
extern void defer_stop (struct defer *d);

/* Queue a write of count bytes at offset within slot's data.  Bigger
 * than DEFER_MAX_BYTES: written at once (after the slot's queued
 * writes).  Returns 0, or -1 (errno) if it could not be queued or
 * written.
 */
extern int defer_write (struct defer *d, uint64_t slot, const void *buf,
                        uint32_t count, uint32_t offset);

/* Make sure the writes queued for slot are in the file.  Returns 0, or
 * -1 (errno EIO) if the queue has failed.
 */
extern int defer_wait_slot (struct defer *d, uint64_t slot);

/* Write out the whole queue.  Returns 0, or -1 (EIO) if it has failed. */
extern int defer_drain (struct defer *d);

/* The engine's slot-data I/O: the pool's, in order with the deferred
 * writes while d is started (otherwise simply the pool's).  Reads and
 * writes first write out the slot's queued writes, and fail with EIO
 * once the queue has failed; _later queues the write (see defer_write);
 * sync writes out the whole queue, then syncs the file.  Return 0 or
 * -1 (errno).
 */
extern int defer_read_data (struct defer *d, struct pool *p, uint64_t slot,
                            void *buf, uint32_t count, uint32_t offset);
extern int defer_write_data (struct defer *d, struct pool *p, uint64_t slot,
                             const void *buf, uint32_t count,
                             uint32_t offset);
extern int defer_write_data_later (struct defer *d, struct pool *p,
                                   uint64_t slot, const void *buf,
                                   uint32_t count, uint32_t offset);
extern int defer_sync (struct defer *d, struct pool *p);

#endif /* SSDCACHE_DEFER_H */
