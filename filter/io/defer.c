/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the gate of slot-data I/O, which defers
 * writethrough's small updates.
 *
 * Owns the queue of deferred writes and the thread that writes them
 * out; every slot read and write of the engine passes here (straight
 * through when nothing is queued).  See defer.h for the rule and the
 * locking.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "defer.h"
#include "log.h"
#include "pool.h"

/* Write out the entries queued so far, in order (d->lock not held). */
static void
apply (struct defer *d)
{
  struct defer_entry *t;

  pthread_mutex_lock (&d->apply);
  pthread_mutex_lock (&d->lock);
  t = d->busy;                  /* empty: its last holder emptied it */
  d->busy = d->queued;
  d->queued = t;
  d->nbusy = d->nqueued;
  d->nqueued = 0;
  pthread_mutex_unlock (&d->lock);

  for (unsigned i = 0; i < d->nbusy; i++) {
    struct defer_entry *e = &d->busy[i];

    if (atomic_load (&d->failed))
      continue;                 /* reads of the slot fail from now on */
    if (pool_write_data (d->pool, e->slot, e->data, e->len,
                         e->off) == -1) {
      int err = errno;

      /* Before the entry leaves the queue: whoever finds the slot no
       * longer queued finds the queue failed.
       */
      atomic_store (&d->failed, true);
      if (d->on_error)
        d->on_error (d->opaque, e->slot, err);
    }
  }

  pthread_mutex_lock (&d->lock);
  atomic_fetch_sub (&d->count, d->nbusy);
  d->nbusy = 0;
  pthread_mutex_unlock (&d->lock);
  pthread_mutex_unlock (&d->apply);
}

static void *
defer_thread (void *arg)
{
  struct defer *d = arg;

  pthread_mutex_lock (&d->lock);
  while (!d->stop) {
    if (d->nqueued == 0) {
      d->idle = true;
      pthread_cond_wait (&d->cv, &d->lock);
      d->idle = false;
      continue;
    }
    if (!d->kicked) {
      /* Let writes gather, so that a stream of them costs the writers
       * no wake-ups: they only signal an idle thread, or a full one.
       */
      struct timespec ts;

      clock_gettime (CLOCK_MONOTONIC, &ts);
      ts.tv_nsec += DEFER_DELAY_US * 1000L;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait (&d->cv, &d->lock, &ts);
      if (d->stop)
        break;
    }
    d->kicked = false;
    pthread_mutex_unlock (&d->lock);
    apply (d);
    pthread_mutex_lock (&d->lock);
  }
  pthread_mutex_unlock (&d->lock);
  return NULL;
}

/* Destroy the locks and free the queue (the thread is not running). */
static void
release (struct defer *d)
{
  pthread_cond_destroy (&d->cv);
  pthread_mutex_destroy (&d->apply);
  pthread_mutex_destroy (&d->lock);
  free (d->queued);
  free (d->busy);
  d->queued = d->busy = NULL;
}

int
defer_start (struct defer *d, struct pool *p, struct stats *st,
             void (*on_error) (void *opaque, uint64_t slot, int err),
             void *opaque)
{
  pthread_condattr_t ca;
  int r;

  memset (d, 0, sizeof *d);
  d->pool = p;
  d->stats = st;
  d->on_error = on_error;
  d->opaque = opaque;
  d->queued = calloc (DEFER_ENTRIES, sizeof *d->queued);
  d->busy = calloc (DEFER_ENTRIES, sizeof *d->busy);
  if (d->queued == NULL || d->busy == NULL) {
    free (d->queued);
    free (d->busy);
    d->queued = d->busy = NULL;
    errno = ENOMEM;
    return -1;
  }
  pthread_mutex_init (&d->lock, NULL);
  pthread_mutex_init (&d->apply, NULL);
  pthread_condattr_init (&ca);
  pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);
  pthread_cond_init (&d->cv, &ca);
  pthread_condattr_destroy (&ca);
  r = pthread_create (&d->thread, NULL, defer_thread, d);
  if (r != 0) {
    release (d);
    errno = r;
    return -1;
  }
  d->running = true;
  atomic_store (&d->active, true);
  return 0;
}

void
defer_stop (struct defer *d)
{
  if (!d->running)
    return;
  pthread_mutex_lock (&d->lock);
  d->stop = true;
  pthread_cond_signal (&d->cv);
  pthread_mutex_unlock (&d->lock);
  pthread_join (d->thread, NULL);
  d->running = false;
  apply (d);
  atomic_store (&d->active, false);
  release (d);
}

/* 0, or -1 with errno EIO once a queued write has failed. */
static int
check_failed (struct defer *d)
{
  if (atomic_load (&d->failed)) {
    errno = EIO;
    return -1;
  }
  return 0;
}

/* Under d->lock: are writes for slot queued or being written? */
static bool
slot_pending (const struct defer *d, uint64_t slot)
{
  for (unsigned i = 0; i < d->nbusy; i++)
    if (d->busy[i].slot == slot)
      return true;
  for (unsigned i = 0; i < d->nqueued; i++)
    if (d->queued[i].slot == slot)
      return true;
  return false;
}

int
defer_wait_slot (struct defer *d, uint64_t slot)
{
  if (atomic_load (&d->count) > 0) {
    bool pending;

    pthread_mutex_lock (&d->lock);
    pending = slot_pending (d, slot);
    pthread_mutex_unlock (&d->lock);
    if (pending) {
      if (d->stats)
        STATS_ADD (d->stats, deferred_waits, 1);
      apply (d);
    }
  }
  return check_failed (d);
}

int
defer_drain (struct defer *d)
{
  if (atomic_load (&d->count) > 0)
    apply (d);
  return check_failed (d);
}

int
defer_write (struct defer *d, uint64_t slot, const void *buf,
             uint32_t count, uint32_t offset)
{
  struct defer_entry *e;

  if (count > DEFER_MAX_BYTES)   /* after the slot's queued writes */
    return defer_write_data (d, d->pool, slot, buf, count, offset);
  if (check_failed (d) == -1)
    return -1;

  pthread_mutex_lock (&d->lock);
  while (d->nqueued == DEFER_ENTRIES) {
    /* Full: write the queue out here (the thread may be at it). */
    pthread_mutex_unlock (&d->lock);
    if (d->stats)
      STATS_ADD (d->stats, deferred_waits, 1);
    apply (d);
    pthread_mutex_lock (&d->lock);
  }
  e = &d->queued[d->nqueued++];
  e->slot = slot;
  e->off = offset;
  e->len = count;
  memcpy (e->data, buf, count);
  atomic_fetch_add (&d->count, 1);
  if (d->idle || (!d->kicked && d->nqueued >= DEFER_ENTRIES / 2)) {
    d->kicked = !d->idle;
    pthread_cond_signal (&d->cv);
  }
  pthread_mutex_unlock (&d->lock);
  if (d->stats)
    STATS_ADD (d->stats, writes_deferred, 1);
  return 0;
}

/* Before any other use of slot's data: its queued writes first.  Once
 * a queued write has failed, even after defer_stop (at close), every use
 * fails: the slot's bytes on disk may be older than what was answered,
 * and a checksum taken from them (sealing) would make them verify.
 */
static int
gate (struct defer *d, uint64_t slot)
{
  if (atomic_load (&d->active))
    return defer_wait_slot (d, slot);
  return check_failed (d);
}

int
defer_read_data (struct defer *d, struct pool *p, uint64_t slot, void *buf,
                 uint32_t count, uint32_t offset)
{
  if (gate (d, slot) == -1)
    return -1;
  return pool_read_data (p, slot, buf, count, offset);
}

int
defer_write_data (struct defer *d, struct pool *p, uint64_t slot,
                  const void *buf, uint32_t count, uint32_t offset)
{
  if (gate (d, slot) == -1)
    return -1;
  return pool_write_data (p, slot, buf, count, offset);
}

int
defer_write_data_later (struct defer *d, struct pool *p, uint64_t slot,
                        const void *buf, uint32_t count, uint32_t offset)
{
  if (atomic_load (&d->active))
    return defer_write (d, slot, buf, count, offset);
  if (check_failed (d) == -1)
    return -1;
  return pool_write_data (p, slot, buf, count, offset);
}

int
defer_sync (struct defer *d, struct pool *p)
{
  if (atomic_load (&d->active) ? defer_drain (d) == -1
      : check_failed (d) == -1)
    return -1;
  return pool_sync (p);
}
