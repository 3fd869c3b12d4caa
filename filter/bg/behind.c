/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: fill behind (see behind.h): the queue of
 * stores after a client's answer and the thread that runs them.
 * b->lock protects the queue, its byte count, the sequence numbers and
 * the stop flag.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/resource.h>

#include "behind.h"
#include "cache.h"
#include "log.h"

struct behind {
  struct cache *c;
  pthread_t thread;

  pthread_mutex_t lock;
  pthread_cond_t wake, idle;
  bool stop;
  struct cache_fill_job *head, *tail;   /* FIFO */
  _Atomic uint64_t bytes;               /* of the jobs queued and running
                                           (written under b->lock) */
  uint64_t queued, done;                /* jobs taken / finished so far */
};

/* Take the oldest job and run it, with b->lock held on entry and exit. */
static void
run_one_locked (struct behind *b)
{
  struct cache_fill_job *job = b->head;

  b->head = job->next;
  if (b->head == NULL)
    b->tail = NULL;
  pthread_mutex_unlock (&b->lock);

  cache_fill_job_run (b->c, job);

  pthread_mutex_lock (&b->lock);
  b->bytes -= cache_fill_job_bytes (b->c, job);
  b->done++;
  cache_fill_job_free (job);
  pthread_cond_broadcast (&b->idle);
}

static void *
behind_thread (void *arg)
{
  struct behind *b = arg;

  /* Nice 19, the lowest priority: stores yield the CPU to the clients'
   * threads (they still take some; when they fall behind, the queue
   * fills and misses go around the cache).  The thread never waits for a range
   * lock, and holds one page's at a time.
   */
  if (setpriority (PRIO_PROCESS, gettid (), BEHIND_NICE) == -1)
    log_debug ("fill behind: setpriority: %m");
  pthread_mutex_lock (&b->lock);
  for (;;) {
    while (!b->stop && b->head == NULL)
      pthread_cond_wait (&b->wake, &b->lock);
    if (b->stop)
      break;
    run_one_locked (b);
  }
  pthread_mutex_unlock (&b->lock);
  return NULL;
}

/* The hook: queue job unless the queue is full or stopping. */
static bool
behind_take (struct cache *c, struct cache_fill_job *job)
{
  struct behind *b = cache_bg_get (c, CACHE_BG_BEHIND);
  const uint64_t n = cache_fill_job_bytes (c, job);
  bool ok = false;

  if (b == NULL)
    return false;
  pthread_mutex_lock (&b->lock);
  if (!b->stop && b->bytes + n <= BEHIND_MAX_BYTES) {
    job->next = NULL;
    if (b->tail)
      b->tail->next = job;
    else
      b->head = job;
    b->tail = job;
    b->bytes += n;
    b->queued++;
    pthread_cond_signal (&b->wake);
    ok = true;
  }
  pthread_mutex_unlock (&b->lock);
  return ok;
}

/* The hook: is there room for a job of n bytes now?  (No lock: a
 * hint.)
 */
static bool
behind_room (struct cache *c, uint64_t n)
{
  struct behind *b = cache_bg_get (c, CACHE_BG_BEHIND);

  return b && atomic_load_explicit (&b->bytes, memory_order_relaxed) + n
    <= BEHIND_MAX_BYTES;
}

int
behind_start (struct cache *c)
{
  struct behind *b = calloc (1, sizeof *b);
  int r;

  if (b == NULL) {
    log_error ("calloc: %m");
    return -1;
  }
  b->c = c;
  pthread_mutex_init (&b->lock, NULL);
  pthread_cond_init (&b->wake, NULL);
  pthread_cond_init (&b->idle, NULL);
  r = pthread_create (&b->thread, NULL, behind_thread, b);
  if (r != 0) {
    errno = r;
    log_error ("cannot start the fill-behind thread: %m");
    pthread_mutex_destroy (&b->lock);
    pthread_cond_destroy (&b->wake);
    pthread_cond_destroy (&b->idle);
    free (b);
    return -1;
  }
  cache_bg_set (c, CACHE_BG_BEHIND, b);
  cache_hooks (c)->fill_behind_room = behind_room;
  cache_hooks (c)->fill_behind = behind_take;
  cache_hooks (c)->fill_behind_stop = behind_stop;
  return 0;
}

void
behind_stop (struct cache *c)
{
  struct behind *b = cache_bg_get (c, CACHE_BG_BEHIND);

  if (b == NULL)
    return;
  cache_hooks (c)->fill_behind = NULL;
  cache_hooks (c)->fill_behind_room = NULL;
  cache_hooks (c)->fill_behind_stop = NULL;
  pthread_mutex_lock (&b->lock);
  b->stop = true;
  pthread_cond_broadcast (&b->wake);
  pthread_cond_broadcast (&b->idle);
  pthread_mutex_unlock (&b->lock);
  pthread_join (b->thread, NULL);
  while (b->head) {
    struct cache_fill_job *job = b->head;
    b->head = job->next;
    cache_fill_job_drop (c, job);
  }
  cache_bg_set (c, CACHE_BG_BEHIND, NULL);
  pthread_mutex_destroy (&b->lock);
  pthread_cond_destroy (&b->wake);
  pthread_cond_destroy (&b->idle);
  free (b);
}

void
behind_drain (struct cache *c)
{
  struct behind *b = cache_bg_get (c, CACHE_BG_BEHIND);
  uint64_t upto;

  if (b == NULL)
    return;
  pthread_mutex_lock (&b->lock);
  upto = b->queued;
  while (!b->stop && b->done < upto)
    pthread_cond_wait (&b->idle, &b->lock);
  pthread_mutex_unlock (&b->lock);
}
