/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: a RAM backend (see rambackend.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "rambackend.h"

void
rambackend_fill (uint8_t *buf, uint64_t size, unsigned seed)
{
  uint64_t x = 0x9E3779B97F4A7C15ULL * (seed + 1);

  for (uint64_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    buf[i] = x >> 24;
  }
}

static void
maybe_delay (struct rambackend *rb)
{
  unsigned max = atomic_load (&rb->delay_max_us);
  uint64_t x;
  struct timespec ts;

  if (max == 0)
    return;
  x = atomic_fetch_add (&rb->delay_counter, 1) + 1;
  x *= 0x9E3779B97F4A7C15ULL;
  x ^= x >> 29;
  ts.tv_sec = 0;
  ts.tv_nsec = (long) (x % (max + 1)) * 1000;
  nanosleep (&ts, NULL);
}

/* Under rb->lock: whether the call fails, an injected failure (*fail,
 * then cleared) or one past the end.  If it does, rb->lock is released
 * and *err set.
 */
static int
rb_refuse (struct rambackend *rb, int *fail, uint32_t count, uint64_t offset,
           int *err)
{
  if (*fail) {
    *err = *fail;
    *fail = 0;
    rb->failed++;
    pthread_mutex_unlock (&rb->lock);
    return -1;
  }
  if (offset > rb->size || count > rb->size - offset) {
    atomic_fetch_add (&rb->out_of_range, 1);
    pthread_mutex_unlock (&rb->lock);
    *err = EIO;
    return -1;
  }
  return 0;
}

static int
rb_pread (void *h, void *buf, uint32_t count, uint64_t offset, int *err)
{
  struct rambackend *rb = h;

  pthread_mutex_lock (&rb->lock);
  atomic_fetch_add (&rb->reads, 1);
  if (rb_refuse (rb, &rb->fail_read_errno, count, offset, err) == -1)
    return -1;
  memcpy (buf, rb->data + offset, count);
  atomic_fetch_add (&rb->bytes_read, count);
  pthread_mutex_unlock (&rb->lock);
  maybe_delay (rb);
  return 0;
}

static int
rb_pwrite (void *h, const void *buf, uint32_t count, uint64_t offset,
           bool fua, int *err)
{
  struct rambackend *rb = h;

  if (rb->exit_before_write)
    _exit (0);
  pthread_mutex_lock (&rb->lock);
  atomic_fetch_add (&rb->writes, 1);
  if (rb_refuse (rb, &rb->fail_write_errno, count, offset, err) == -1)
    return -1;
  memcpy (rb->data + offset, buf, count);
  atomic_fetch_add (&rb->bytes_written, count);
  if (fua)
    atomic_fetch_add (&rb->fua_writes, 1);
  if (rb->exit_after_write)
    _exit (0);
  pthread_mutex_unlock (&rb->lock);
  maybe_delay (rb);
  return 0;
}

void
rambackend_init (struct rambackend *rb, uint64_t size, unsigned seed)
{
  memset (rb, 0, sizeof *rb);
  pthread_mutex_init (&rb->lock, NULL);
  rb->size = size;
  rb->data = malloc (size ? size : 1);
  if (rb->data == NULL)
    abort ();
  rambackend_fill (rb->data, size, seed);
  rb->be.h = rb;
  rb->be.pread = rb_pread;
  rb->be.pwrite = rb_pwrite;
}

void
rambackend_free (struct rambackend *rb)
{
  free (rb->data);
  rb->data = NULL;
  pthread_mutex_destroy (&rb->lock);
}

void
rambackend_reset_counters (struct rambackend *rb)
{
  atomic_store (&rb->reads, 0);
  atomic_store (&rb->writes, 0);
  atomic_store (&rb->bytes_read, 0);
  atomic_store (&rb->bytes_written, 0);
  atomic_store (&rb->fua_writes, 0);
}

void
rambackend_fail_next_read (struct rambackend *rb, int err)
{
  pthread_mutex_lock (&rb->lock);
  rb->fail_read_errno = err;
  pthread_mutex_unlock (&rb->lock);
}

void
rambackend_fail_next_write (struct rambackend *rb, int err)
{
  pthread_mutex_lock (&rb->lock);
  rb->fail_write_errno = err;
  pthread_mutex_unlock (&rb->lock);
}

void
rambackend_peek (struct rambackend *rb, void *buf, uint32_t count,
                 uint64_t offset)
{
  pthread_mutex_lock (&rb->lock);
  memcpy (buf, rb->data + offset, count);
  pthread_mutex_unlock (&rb->lock);
}

void
rambackend_poke (struct rambackend *rb, const void *buf, uint32_t count,
                 uint64_t offset)
{
  pthread_mutex_lock (&rb->lock);
  memcpy (rb->data + offset, buf, count);
  pthread_mutex_unlock (&rb->lock);
}
