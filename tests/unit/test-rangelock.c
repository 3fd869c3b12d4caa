/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: page range locks (rangelock.c).
 *
 * Non-overlapping ranges are held at once, an overlapping acquire
 * blocks until the release, and a multi-threaded stress test checks
 * with a shared ownership array that holders never overlap.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "rangelock.h"

static void
sleep_ms (unsigned ms)
{
  struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
  while (nanosleep (&ts, &ts) == -1 && errno == EINTR)
    ;
}

/* An acquire (and optionally a later release) run in its own thread. */
struct async {
  struct rangelock *rl;
  uint64_t lo, hi;
  pthread_t thread;
  atomic_bool acquired;
  atomic_bool release_now;
  atomic_bool released;
  int r;
};

static void *
async_run (void *arg)
{
  struct async *a = arg;

  a->r = rangelock_acquire (a->rl, a->lo, a->hi);
  atomic_store (&a->acquired, true);
  while (!atomic_load (&a->release_now))
    sleep_ms (1);
  rangelock_release (a->rl, a->lo, a->hi);
  atomic_store (&a->released, true);
  return NULL;
}

static struct async *
async_start (struct rangelock *rl, uint64_t lo, uint64_t hi)
{
  struct async *a = calloc (1, sizeof *a);

  assert_non_null (a);
  a->rl = rl;
  a->lo = lo;
  a->hi = hi;
  assert_int_equal (pthread_create (&a->thread, NULL, async_run, a), 0);
  return a;
}

/* Wait up to ms for the acquire to happen. */
static bool
async_wait_acquired (struct async *a, unsigned ms)
{
  for (unsigned i = 0; i < ms; ++i) {
    if (atomic_load (&a->acquired))
      return true;
    sleep_ms (1);
  }
  return atomic_load (&a->acquired);
}

static void
async_finish (struct async *a)
{
  atomic_store (&a->release_now, true);
  assert_int_equal (pthread_join (a->thread, NULL), 0);
  assert_true (atomic_load (&a->released));
  assert_int_equal (a->r, 0);
  free (a);
}

static void
test_init_destroy (void **state)
{
  struct rangelock rl;

  assert_int_equal (rangelock_init (&rl), 0);
  assert_int_equal (rangelock_acquire (&rl, 0, 0), 0);
  rangelock_release (&rl, 0, 0);
  rangelock_destroy (&rl);

  /* Destroy right after init, nothing ever held. */
  assert_int_equal (rangelock_init (&rl), 0);
  rangelock_destroy (&rl);
}

static void
test_disjoint_concurrent (void **state)
{
  struct rangelock rl;
  struct async *a[6];
  uint64_t r[6][2] = {
    { 0, 9 }, { 10, 19 }, { 20, 20 }, { 100, 1000 },
    { UINT64_MAX - 1, UINT64_MAX }, { 1ULL << 50, (1ULL << 50) + 7 },
  };

  assert_int_equal (rangelock_init (&rl), 0);
  for (int i = 0; i < 6; ++i) {
    a[i] = async_start (&rl, r[i][0], r[i][1]);
    if (!async_wait_acquired (a[i], 2000))
      fail_msg ("disjoint range [%llu, %llu] blocked",
                (unsigned long long) r[i][0], (unsigned long long) r[i][1]);
  }
  /* All six are held at once now; more disjoint ones also go through
   * from this thread.
   */
  assert_int_equal (rangelock_acquire (&rl, 21, 99), 0);
  assert_int_equal (rangelock_acquire (&rl, 1001, 1001), 0);
  rangelock_release (&rl, 21, 99);
  rangelock_release (&rl, 1001, 1001);
  for (int i = 0; i < 6; ++i)
    async_finish (a[i]);
  rangelock_destroy (&rl);
}

/* Main holds [lo, hi]; a thread acquiring [tlo, thi] must block until
 * main releases.
 */
static void
check_blocks (uint64_t lo, uint64_t hi, uint64_t tlo, uint64_t thi)
{
  struct rangelock rl;
  struct async *a;

  assert_int_equal (rangelock_init (&rl), 0);
  assert_int_equal (rangelock_acquire (&rl, lo, hi), 0);
  a = async_start (&rl, tlo, thi);
  if (async_wait_acquired (a, 60))
    fail_msg ("[%llu, %llu] acquired while [%llu, %llu] was held",
              (unsigned long long) tlo, (unsigned long long) thi,
              (unsigned long long) lo, (unsigned long long) hi);
  rangelock_release (&rl, lo, hi);
  if (!async_wait_acquired (a, 5000))
    fail_msg ("[%llu, %llu] still blocked after release",
              (unsigned long long) tlo, (unsigned long long) thi);
  async_finish (a);
  /* Everything is free again. */
  assert_int_equal (rangelock_acquire (&rl, 0, UINT64_MAX), 0);
  rangelock_release (&rl, 0, UINT64_MAX);
  rangelock_destroy (&rl);
}

static void
test_overlap_blocks (void **state)
{
  check_blocks (10, 20, 20, 30);        /* touching at the high end */
  check_blocks (10, 20, 0, 10);         /* touching at the low end */
  check_blocks (10, 20, 15, 15);        /* inside */
  check_blocks (10, 20, 5, 25);         /* containing */
  check_blocks (10, 20, 10, 20);        /* identical */
  check_blocks (7, 7, 7, 7);            /* single page */
  check_blocks (0, UINT64_MAX, 1ULL << 60, 1ULL << 60);
  check_blocks (UINT64_MAX, UINT64_MAX, 5, UINT64_MAX);
}

/* Several waiters on one held range, overlapping each other too: each
 * gets it once the holders before it are gone, never two at once.
 */
static void
test_waiters_chain (void **state)
{
  struct rangelock rl;
  struct async *w1, *w2, *w3;

  assert_int_equal (rangelock_init (&rl), 0);
  assert_int_equal (rangelock_acquire (&rl, 0, 100), 0);
  w1 = async_start (&rl, 0, 5);
  w2 = async_start (&rl, 3, 8);
  w3 = async_start (&rl, 50, 60);
  sleep_ms (30);
  assert_false (atomic_load (&w1->acquired));
  assert_false (atomic_load (&w2->acquired));
  assert_false (atomic_load (&w3->acquired));
  rangelock_release (&rl, 0, 100);

  /* w3 is disjoint from w1/w2: it gets it. */
  assert_true (async_wait_acquired (w3, 5000));
  /* Exactly one of w1/w2 (they overlap). */
  for (int i = 0; i < 5000; ++i) {
    if (atomic_load (&w1->acquired) || atomic_load (&w2->acquired))
      break;
    sleep_ms (1);
  }
  sleep_ms (20);
  bool a1 = atomic_load (&w1->acquired), a2 = atomic_load (&w2->acquired);
  assert_true (a1 != a2);
  if (a1) {
    async_finish (w1);
    assert_true (async_wait_acquired (w2, 5000));
    async_finish (w2);
  }
  else {
    async_finish (w2);
    assert_true (async_wait_acquired (w1, 5000));
    async_finish (w1);
  }
  async_finish (w3);
  rangelock_destroy (&rl);
}

/* Releasing one range leaves the others held: release [0,4] while
 * [5,9] is held, then [9,12] must still block.
 */
static void
test_release_only_own (void **state)
{
  struct rangelock rl;
  struct async *a;

  assert_int_equal (rangelock_init (&rl), 0);
  assert_int_equal (rangelock_acquire (&rl, 0, 4), 0);
  assert_int_equal (rangelock_acquire (&rl, 5, 9), 0);
  rangelock_release (&rl, 0, 4);
  a = async_start (&rl, 9, 12);
  assert_false (async_wait_acquired (a, 50));
  rangelock_release (&rl, 5, 9);
  assert_true (async_wait_acquired (a, 5000));
  async_finish (a);
  rangelock_destroy (&rl);
}

static void
test_try_acquire (void **state)
{
  struct rangelock rl;
  struct async *a;

  assert_int_equal (rangelock_init (&rl), 0);
  assert_int_equal (rangelock_try_acquire (&rl, 10, 20), 0);
  errno = 0;
  assert_int_equal (rangelock_try_acquire (&rl, 20, 30), -1);
  assert_int_equal (errno, EBUSY);
  assert_int_equal (rangelock_try_acquire (&rl, 0, 10), -1);
  assert_int_equal (rangelock_try_acquire (&rl, 12, 12), -1);
  assert_int_equal (rangelock_try_acquire (&rl, 21, 30), 0);
  assert_int_equal (rangelock_try_acquire (&rl, 0, 9), 0);
  /* A range held by try_acquire blocks acquire like any other. */
  a = async_start (&rl, 25, 25);
  assert_false (async_wait_acquired (a, 50));
  rangelock_release (&rl, 21, 30);
  assert_true (async_wait_acquired (a, 5000));
  assert_int_equal (rangelock_try_acquire (&rl, 25, 26), -1);
  async_finish (a);
  assert_int_equal (rangelock_try_acquire (&rl, 25, 26), 0);
  rangelock_release (&rl, 25, 26);
  rangelock_release (&rl, 10, 20);
  rangelock_release (&rl, 0, 9);
  assert_int_equal (rangelock_try_acquire (&rl, 0, UINT64_MAX), 0);
  rangelock_release (&rl, 0, UINT64_MAX);
  rangelock_destroy (&rl);
}

/* Many held at once (growth of the held array). */
static void
test_many_held (void **state)
{
  struct rangelock rl;

  assert_int_equal (rangelock_init (&rl), 0);
  for (uint64_t i = 0; i < 1000; ++i)
    assert_int_equal (rangelock_acquire (&rl, i * 10, i * 10 + 9), 0);
  for (uint64_t i = 0; i < 1000; i += 2)
    rangelock_release (&rl, i * 10, i * 10 + 9);
  for (uint64_t i = 0; i < 1000; i += 2)
    assert_int_equal (rangelock_acquire (&rl, i * 10 + 1, i * 10 + 8), 0);
  for (uint64_t i = 0; i < 1000; i += 2)
    rangelock_release (&rl, i * 10 + 1, i * 10 + 8);
  for (uint64_t i = 1; i < 1000; i += 2)
    rangelock_release (&rl, i * 10, i * 10 + 9);
  assert_int_equal (rangelock_acquire (&rl, 0, UINT64_MAX), 0);
  rangelock_release (&rl, 0, UINT64_MAX);
  rangelock_destroy (&rl);
}

/*----------------------------------------------------------------------
 * Stress.
 */

#define STRESS_PAGES   64
#define STRESS_THREADS 4
#define STRESS_ITERS   3000

static struct rangelock stress_rl;
static atomic_int owner[STRESS_PAGES];
static atomic_int violations;
static atomic_long total_held;

struct stress_arg {
  int id;
  unsigned seed;
};

static void *
stress_thread (void *argv)
{
  struct stress_arg *arg = argv;
  unsigned seed = arg->seed;

  for (int it = 0; it < STRESS_ITERS; ++it) {
    uint64_t lo = rand_r (&seed) % STRESS_PAGES;
    uint64_t len = 1 + rand_r (&seed) % 8;
    uint64_t hi = lo + len - 1;
    if (hi >= STRESS_PAGES)
      hi = STRESS_PAGES - 1;

    if (rangelock_acquire (&stress_rl, lo, hi) != 0) {
      atomic_fetch_add (&violations, 1000000);
      return NULL;
    }
    for (uint64_t p = lo; p <= hi; ++p) {
      int prev = atomic_exchange (&owner[p], arg->id);
      if (prev != 0)
        atomic_fetch_add (&violations, 1);
    }
    atomic_fetch_add (&total_held, 1);
    if (it % 4 == 0)
      sched_yield ();
    for (uint64_t p = lo; p <= hi; ++p) {
      int prev = atomic_exchange (&owner[p], 0);
      if (prev != arg->id)
        atomic_fetch_add (&violations, 1);
    }
    rangelock_release (&stress_rl, lo, hi);
  }
  return NULL;
}

static void
test_stress (void **state)
{
  pthread_t t[STRESS_THREADS];
  struct stress_arg args[STRESS_THREADS];

  assert_int_equal (rangelock_init (&stress_rl), 0);
  for (int i = 0; i < STRESS_PAGES; ++i)
    atomic_store (&owner[i], 0);
  atomic_store (&violations, 0);
  atomic_store (&total_held, 0);
  for (int i = 0; i < STRESS_THREADS; ++i) {
    args[i].id = i + 1;
    args[i].seed = 1000 + i;
    assert_int_equal (pthread_create (&t[i], NULL, stress_thread, &args[i]),
                      0);
  }
  for (int i = 0; i < STRESS_THREADS; ++i)
    assert_int_equal (pthread_join (t[i], NULL), 0);
  assert_int_equal (atomic_load (&violations), 0);
  assert_int_equal (atomic_load (&total_held),
                    STRESS_THREADS * STRESS_ITERS);
  for (int i = 0; i < STRESS_PAGES; ++i)
    assert_int_equal (atomic_load (&owner[i]), 0);
  /* Nothing left held. */
  assert_int_equal (rangelock_acquire (&stress_rl, 0, UINT64_MAX), 0);
  rangelock_release (&stress_rl, 0, UINT64_MAX);
  rangelock_destroy (&stress_rl);
}

/* A barrier run in its own thread. */
struct barrier_run {
  struct rangelock *rl;
  pthread_t thread;
  atomic_bool done;
};

static void *
barrier_thread (void *arg)
{
  struct barrier_run *b = arg;

  rangelock_barrier (b->rl);
  atomic_store (&b->done, true);
  return NULL;
}

/* Wait (a bounded number of polls) until n acquires are waiting. */
static bool
wait_waiters (struct rangelock *rl, size_t n)
{
  for (unsigned i = 0; i < 5000; i++) {
    size_t w;
    pthread_mutex_lock (&rl->lock);
    w = rl->nwait;
    pthread_mutex_unlock (&rl->lock);
    if (w == n)
      return true;
    sleep_ms (1);
  }
  return false;
}

/* rangelock_barrier waits for the ranges held before it, and only for
 * them: ranges taken while it waits (a try_acquire, an acquire) go
 * ahead, and it returns while they are still held.  (Holding new ones
 * back livelocked a mode switch: a writer holding its range waited for
 * a writeback pass whose try-locks the barrier refused, issue 27.)
 */
static void
test_barrier (void **state)
{
  struct rangelock rl;
  struct barrier_run b = { .rl = &rl };
  struct async *held, *late;

  assert_int_equal (rangelock_init (&rl), 0);
  rangelock_barrier (&rl);              /* nothing held: at once */
  held = async_start (&rl, 10, 20);
  assert_true (async_wait_acquired (held, 2000));
  assert_int_equal (pthread_create (&b.thread, NULL, barrier_thread, &b),
                    0);
  sleep_ms (50);
  assert_false (atomic_load (&b.done));   /* waits for [10, 20] */
  /* A background pass of the holder's: not held back. */
  assert_int_equal (rangelock_try_acquire (&rl, 30, 40), 0);
  late = async_start (&rl, 50, 60);       /* nor a new request */
  assert_true (async_wait_acquired (late, 2000));
  assert_false (atomic_load (&b.done));
  rangelock_release (&rl, 30, 40);
  async_finish (held);
  /* Returns with [50, 60] still held: taken after it began. */
  assert_int_equal (pthread_join (b.thread, NULL), 0);
  assert_true (atomic_load (&b.done));
  async_finish (late);
  assert_int_equal (rangelock_try_acquire (&rl, 0, UINT64_MAX), 0);
  rangelock_release (&rl, 0, UINT64_MAX);
  rangelock_destroy (&rl);
}

/* Overlapping acquires are served in arrival order: a younger one does
 * not overtake an older waiter, even where its own range is free (so a
 * request waiting for a page others rewrite all the time gets it);
 * try_acquire looks at held ranges only.
 */
static void
test_fifo (void **state)
{
  struct rangelock rl;
  struct async *h, *w1, *w2, *w3;

  assert_int_equal (rangelock_init (&rl), 0);
  h = async_start (&rl, 10, 10);
  assert_true (async_wait_acquired (h, 2000));
  w1 = async_start (&rl, 10, 20);
  assert_true (wait_waiters (&rl, 1));
  w2 = async_start (&rl, 15, 15);         /* free, but w1 came first */
  assert_true (wait_waiters (&rl, 2));
  w3 = async_start (&rl, 30, 30);         /* overlaps nobody */
  assert_true (async_wait_acquired (w3, 2000));
  sleep_ms (50);
  assert_false (atomic_load (&w2->acquired));
  assert_int_equal (rangelock_try_acquire (&rl, 15, 15), 0);
  rangelock_release (&rl, 15, 15);
  async_finish (h);
  assert_true (async_wait_acquired (w1, 2000));
  sleep_ms (20);
  assert_false (atomic_load (&w2->acquired));
  async_finish (w1);
  assert_true (async_wait_acquired (w2, 2000));
  async_finish (w2);
  async_finish (w3);
  rangelock_destroy (&rl);
}

/* Stamps: a release stamps its pages after every earlier clock, a
 * release of an unchanged range does not; a change is seen only for
 * the pages it covered (and their buckets).
 */
static void
test_stamps (void **state)
{
  struct rangelock rl;
  uint64_t t;

  assert_int_equal (rangelock_init (&rl), 0);
  assert_int_equal (rangelock_acquire (&rl, 10, 19), 0);
  t = rangelock_release_unchanged (&rl, 10, 19);
  assert_int_equal (rangelock_try_acquire (&rl, 0, 99), 0);
  assert_false (rangelock_changed_since (&rl, 0, 99, t));
  rangelock_release (&rl, 0, 99);           /* a change of 0..99 */
  assert_int_equal (rangelock_try_acquire (&rl, 10, 19), 0);
  assert_true (rangelock_changed_since (&rl, 10, 19, t));
  t = rangelock_release_unchanged (&rl, 10, 19);
  assert_int_equal (rangelock_acquire (&rl, 15, 15), 0);
  rangelock_release (&rl, 15, 15);          /* one page changes */
  assert_int_equal (rangelock_acquire (&rl, 10, 19), 0);
  assert_false (rangelock_changed_since (&rl, 10, 14, t));
  assert_true (rangelock_changed_since (&rl, 10, 19, t));
  assert_true (rangelock_changed_since (&rl, 15 + RANGELOCK_STAMPS,
                                        15 + RANGELOCK_STAMPS, t));
  rangelock_release (&rl, 10, 19);
  /* A range longer than the buckets: every bucket is stamped. */
  t = rangelock_release_unchanged (&rl, 0, 0);
  assert_int_equal (rangelock_acquire (&rl, 5, 5 + 3 * RANGELOCK_STAMPS), 0);
  rangelock_release (&rl, 5, 5 + 3 * RANGELOCK_STAMPS);
  for (uint64_t p = 0; p < RANGELOCK_STAMPS; p += 97)
    assert_true (rangelock_changed_since (&rl, p, p, t));
  rangelock_destroy (&rl);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_init_destroy),
    cmocka_unit_test (test_disjoint_concurrent),
    cmocka_unit_test (test_overlap_blocks),
    cmocka_unit_test (test_waiters_chain),
    cmocka_unit_test (test_release_only_own),
    cmocka_unit_test (test_try_acquire),
    cmocka_unit_test (test_many_held),
    cmocka_unit_test (test_stress),
    cmocka_unit_test (test_barrier),
    cmocka_unit_test (test_fifo),
    cmocka_unit_test (test_stamps),
  };

  return cmocka_run_group_tests (tests, NULL, NULL);
}
