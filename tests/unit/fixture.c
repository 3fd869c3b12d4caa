/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: see fixture.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "cache.h"
#include "fixture.h"
#include "layout.h"
#include "rambackend.h"
#include "testfile.h"

#define PS 4096u                  /* the page size of unseal_q */

struct cache_config
fixture_config (uint64_t size, uint32_t page_size)
{
  struct cache_config cfg;

  cache_config_defaults (&cfg);
  cfg.path = testfile_path;
  cfg.size = size;
  cfg.page_size = page_size;
  cfg.id_digest[0] = 0x1111222233334444ULL;
  cfg.id_digest[1] = 0x5555666677778888ULL;
  cfg.id_text = FIXTURE_ID_TEXT;
  cfg.direct = testfile_direct ();
  return cfg;
}

struct cache_config
fixture_writeback_config (uint64_t size, uint32_t page_size)
{
  struct cache_config cfg = fixture_config (size, page_size);

  cfg.mode = LAYOUT_MODE_WRITEBACK;
  cfg.wb.high_pct = 100;
  cfg.wb.low_pct = 0;
  cfg.wb.idle_ms = 0;
  return cfg;
}

/*----------------------------------------------------------------------
 * Data, and reads and writes checked against the RAM backend.
 */

void
read_check (struct cache *c, struct rambackend *rb, uint64_t off,
            uint32_t len)
{
  uint8_t *buf = malloc (len ? len : 1), *exp = malloc (len ? len : 1);
  int err = 0;

  assert_non_null (buf);
  assert_non_null (exp);
  memset (buf, 0xd7, len);
  if (cache_read (c, &rb->be, buf, len, off, &err) != 0)
    fail_msg ("cache_read off=%llu len=%u failed, err=%d",
              (unsigned long long) off, len, err);
  rambackend_peek (rb, exp, len, off);
  compare (buf, exp, off, len, cache_page_size (c),
           "cache_read (expected: the backend's data)");
  free (buf);
  free (exp);
}

void
read_all_check (struct cache *c, struct rambackend *rb, uint32_t chunk)
{
  for (uint64_t off = 0; off < rb->size; off += chunk) {
    uint32_t n = rb->size - off < chunk ? rb->size - off : chunk;
    read_check (c, rb, off, n);
  }
}

void
fill_pattern (uint8_t *buf, uint32_t len, unsigned seed)
{
  uint32_t x = seed * 2654435761u + 1;
  for (uint32_t i = 0; i < len; ++i) {
    x = x * 1103515245u + 12345u;
    buf[i] = x >> 16;
  }
}

/* Write a pattern through the cache; check it reached the backend. */
void
write_check (struct cache *c, struct rambackend *rb, uint64_t off,
             uint32_t len, unsigned seed)
{
  uint8_t *buf = malloc (len), *got = malloc (len);
  int err = 0;

  assert_non_null (buf);
  assert_non_null (got);
  fill_pattern (buf, len, seed);
  if (cache_write (c, &rb->be, buf, len, off, false, &err) != 0)
    fail_msg ("cache_write off=%llu len=%u failed, err=%d",
              (unsigned long long) off, len, err);
  rambackend_peek (rb, got, len, off);
  assert_memory_equal (buf, got, len);
  free (buf);
  free (got);
}

struct cache *
fixture_open (struct rambackend *rb, const struct cache_config *cfg,
              uint64_t size, unsigned seed)
{
  rambackend_init (rb, size, seed);
  return testfile_open_attach (cfg, size);
}

void
fixture_close (struct cache *c, struct rambackend *rb)
{
  cache_close (c);
  rambackend_free (rb);
}

void
open_read_all_check (const struct cache_config *cfg, struct rambackend *rb,
                     uint32_t chunk)
{
  struct cache *c = testfile_open_attach (cfg, rb->size);

  read_all_check (c, rb, chunk);
  cache_close (c);
}

void
warm_check (const struct cache_config *cfg, struct rambackend *rb,
            uint32_t chunk)
{
  const uint64_t reads = rb->reads;
  struct cache *c = testfile_open_attach (cfg, rb->size);

  read_all_check (c, rb, chunk);
  assert_int_equal (rb->reads, reads);
  assert_int_equal (ST (c, verify_failures), 0);
  cache_close (c);
}

uint64_t
rnd64 (uint64_t *s)
{
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

struct extent
rnd_extent (uint64_t *s, uint64_t size, uint32_t max)
{
  struct extent x;

  x.off = rnd64 (s) % size;
  x.len = 1 + rnd64 (s) % max;
  if (x.len > size - x.off)
    x.len = size - x.off;
  return x;
}

/*----------------------------------------------------------------------
 * The backend with a flush and failures (struct tbe), and reads and
 * writes checked against a model of the export.
 */

static int
tbe_pread (void *h, void *buf, uint32_t count, uint64_t offset, int *err)
{
  struct tbe *t = h;

  return t->rb->be.pread (t->rb, buf, count, offset, err);
}

static int
tbe_pwrite (void *h, const void *buf, uint32_t count, uint64_t offset,
            bool fua, int *err)
{
  struct tbe *t = h;
  int e = atomic_load (&t->fail_write);

  if (e) {
    atomic_fetch_add (&t->failed_writes, 1);
    *err = e;
    return -1;
  }
  uint64_t now = atomic_fetch_add (&t->inflight, 1) + 1;
  uint64_t max = atomic_load (&t->max_inflight);
  int r;

  while (now > max &&
         !atomic_compare_exchange_weak (&t->max_inflight, &max, now))
    ;
  r = t->rb->be.pwrite (t->rb, buf, count, offset, fua, err);
  atomic_fetch_sub (&t->inflight, 1);
  if (r == -1)
    return -1;
  atomic_store (&t->last_write_ev, atomic_fetch_add (&t->clock, 1) + 1);
  return 0;
}

static int
tbe_flush (void *h, int *err)
{
  struct tbe *t = h;
  int e = atomic_load (&t->fail_flush);

  if (e) {
    atomic_fetch_add (&t->failed_flushes, 1);
    *err = e;
    return -1;
  }
  atomic_fetch_add (&t->flushes, 1);
  atomic_store (&t->last_flush_ev, atomic_fetch_add (&t->clock, 1) + 1);
  return 0;
}

void
tbe_init (struct tbe *t, struct rambackend *rb)
{
  memset (t, 0, sizeof *t);
  t->rb = rb;
  t->be.h = t;
  t->be.pread = tbe_pread;
  t->be.pwrite = tbe_pwrite;
  t->be.flush = tbe_flush;
}

/* Write a pattern through the cache and into the model. */
void
mwrite (struct cache *c, const struct cache_backend *be, uint8_t *model,
        uint64_t off, uint32_t len, unsigned seed)
{
  uint8_t *buf = malloc (len);
  int err = 0;

  assert_non_null (buf);
  fill_pattern (buf, len, seed);
  if (cache_write (c, be, buf, len, off, false, &err) != 0)
    fail_msg ("cache_write off=%llu len=%u failed, err=%d (%s)",
              (unsigned long long) off, len, err, strerror (err));
  if (model)
    memcpy (model + off, buf, len);
  free (buf);
}

void
compare (const uint8_t *got, const uint8_t *exp, uint64_t off, uint64_t len,
         uint32_t ps, const char *what)
{
  if (memcmp (got, exp, len) != 0) {
    uint64_t i = 0;
    while (got[i] == exp[i])
      i++;
    fail_msg ("%s off=%llu len=%llu: wrong data at offset %llu (page %llu, "
              "byte %llu of the page): got 0x%02x, expected 0x%02x",
              what, (unsigned long long) off, (unsigned long long) len,
              (unsigned long long) (off + i),
              (unsigned long long) ((off + i) / ps),
              (unsigned long long) ((off + i) % ps), got[i], exp[i]);
  }
}

/* Read through the cache and compare with the model. */
void
mread_check (struct cache *c, const struct cache_backend *be,
             const uint8_t *model, uint64_t off, uint32_t len)
{
  uint8_t *buf = malloc (len ? len : 1);
  int err = 0;

  assert_non_null (buf);
  memset (buf, 0xd7, len);
  if (cache_read (c, be, buf, len, off, &err) != 0)
    fail_msg ("cache_read off=%llu len=%u failed, err=%d (%s)",
              (unsigned long long) off, len, err, strerror (err));
  compare (buf, model + off, off, len, cache_page_size (c), "cache_read");
  free (buf);
}

void
mread_all_check (struct cache *c, const struct cache_backend *be,
                 const uint8_t *model, uint64_t size, uint32_t chunk)
{
  for (uint64_t off = 0; off < size; off += chunk)
    mread_check (c, be, model, off, size - off < chunk ? size - off : chunk);
}

/* The backend itself (not through the cache) equals the model. */
void
backend_check (struct rambackend *rb, const uint8_t *model, uint32_t ps)
{
  uint8_t *got = malloc (rb->size);

  assert_non_null (got);
  rambackend_peek (rb, got, rb->size, 0);
  compare (got, model, 0, rb->size, ps, "backend contents");
  free (got);
}

uint8_t *
model_new (struct rambackend *rb)
{
  uint8_t *m = malloc (rb->size);

  assert_non_null (m);
  rambackend_peek (rb, m, rb->size, 0);
  return m;
}

/* The rest of env, over its RAM backend (made). */
static void
tenv_over_rb (struct tenv *env)
{
  tbe_init (&env->t, &env->rb);
  env->be = &env->t.be;
  env->model = model_new (&env->rb);
}

void
tenv_init (struct tenv *env, uint64_t size, unsigned seed)
{
  rambackend_init (&env->rb, size, seed);
  tenv_over_rb (env);
}

void
tenv_free (struct tenv *env)
{
  rambackend_free (&env->rb);
  free (env->model);
}

struct cache *
tenv_open (struct tenv *env, const struct cache_config *cfg, uint64_t size,
           unsigned seed)
{
  struct cache *c = fixture_open (&env->rb, cfg, size, seed);

  tenv_over_rb (env);
  return c;
}

void
tenv_init_cached (struct tenv *env, const struct cache_config *cfg,
                  uint64_t size, unsigned seed)
{
  struct cache *c;

  tenv_init (env, size, seed);
  c = testfile_open_attach (cfg, size);
  tenv_read_all_check (env, c, cache_page_size (c));
  cache_close (c);
}

void
tenv_close (struct tenv *env, struct cache *c)
{
  fixture_close (c, &env->rb);
  free (env->model);
}

void
tenv_write (struct tenv *env, struct cache *c, uint64_t off, uint32_t len,
            unsigned seed)
{
  mwrite (c, env->be, env->model, off, len, seed);
}

void
tenv_read_check (struct tenv *env, struct cache *c, uint64_t off,
                 uint32_t len)
{
  mread_check (c, env->be, env->model, off, len);
}

void
tenv_read_all_check (struct tenv *env, struct cache *c, uint32_t chunk)
{
  mread_all_check (c, env->be, env->model, env->rb.size, chunk);
}

void
tenv_writeback_check (struct tenv *env, struct cache *c)
{
  int err = 0;

  if (cache_writeback_all (c, env->be, &err) != 0)
    fail_msg ("cache_writeback_all failed, err=%d (%s)", err,
              strerror (err));
  backend_check (&env->rb, env->model, cache_page_size (c));
}

/*----------------------------------------------------------------------
 * A child process.
 */

pid_t
fixture_fork (void)
{
  pid_t pid;

  fflush (stdout);
  fflush (stderr);
  pid = fork ();
  assert_true (pid >= 0);
  return pid;
}

void
fixture_wait (pid_t pid)
{
  int status;

  assert_int_equal (waitpid (pid, &status, 0), pid);
  assert_true (WIFEXITED (status));
  assert_int_equal (WEXITSTATUS (status), 0);
}

/*----------------------------------------------------------------------
 * The cache file itself.
 */

/* Entry of slot as stored in the file (raw: its 64 bytes, may be
 * NULL).  Returns layout_entry_decode's result.
 */
static uint64_t
file_entry_offset (uint32_t slot, struct layout_sb *sb)
{
  uint64_t pt, pool, total;

  testfile_read_sb (sb);
  assert_true (slot < sb->nslots);
  assert_true (layout_geometry (sb->page_size, sb->nslots, &pt, &pool,
                                &total));
  assert_int_equal (pt, sb->pt_offset);
  return pt + (uint64_t) slot * LAYOUT_ENTRY_SIZE;
}

int
file_entry (uint32_t slot, struct layout_entry *e, uint8_t *raw)
{
  struct layout_sb sb;
  uint8_t buf[LAYOUT_ENTRY_SIZE];
  uint64_t off = file_entry_offset (slot, &sb);
  int fd, r;

  fd = open (testfile_path, O_RDONLY);
  assert_true (fd >= 0);
  assert_int_equal (pread (fd, buf, sizeof buf, off), sizeof buf);
  close (fd);
  if (raw)
    memcpy (raw, buf, sizeof buf);
  r = layout_entry_decode (buf, sb.page_size / sb.sector_size, e);
  return r;
}

/* Store entry e as slot's, CRC and all. */
void
file_set_entry (uint32_t slot, const struct layout_entry *e)
{
  struct layout_sb sb;
  uint8_t buf[LAYOUT_ENTRY_SIZE];
  uint64_t off = file_entry_offset (slot, &sb);
  int fd;

  layout_entry_encode (e, buf);
  fd = open (testfile_path, O_WRONLY);
  assert_true (fd >= 0);
  assert_int_equal (pwrite (fd, buf, sizeof buf, off), sizeof buf);
  close (fd);
}

/* Slots whose valid, non-free entry names page, oldest first.  Returns
 * how many (at most max).
 */
int
file_slots_for (uint64_t page, uint32_t *slots, uint64_t *seqs,
                uint8_t *states, int max)
{
  struct layout_sb sb;
  int n = 0;

  testfile_read_sb (&sb);
  for (uint32_t s = 0; s < sb.nslots; ++s) {
    struct layout_entry e;
    if (file_entry (s, &e, NULL) == 0 && e.state != LAYOUT_FREE &&
        e.page == page) {
      int k = n;
      assert_true (n < max);
      while (k > 0 && seqs[k - 1] > e.seq) {
        slots[k] = slots[k - 1];
        seqs[k] = seqs[k - 1];
        if (states)
          states[k] = states[k - 1];
        k--;
      }
      slots[k] = s;
      seqs[k] = e.seq;
      if (states)
        states[k] = e.state;
      n++;
    }
  }
  return n;
}

void
file_slot_data (uint32_t slot, uint8_t *buf)
{
  struct layout_sb sb;
  int fd;

  testfile_read_sb (&sb);
  fd = open (testfile_path, O_RDONLY);
  assert_true (fd >= 0);
  assert_int_equal (pread (fd, buf, sb.page_size,
                           sb.pool_offset + (uint64_t) slot * sb.page_size),
                    (ssize_t) sb.page_size);
  close (fd);
}

/* The newest on-disk entry of page (its slot in *slot). */
void
newest_entry (uint64_t page, struct layout_entry *e, uint32_t *slot)
{
  uint32_t slots[4];
  uint64_t seqs[4];
  int n = file_slots_for (page, slots, seqs, NULL, 4);

  assert_true (n >= 1);
  assert_int_equal (file_entry (slots[n - 1], e, NULL), 0);
  if (slot)
    *slot = slots[n - 1];
}

/* Page 5 (never flushed) written three times: whole sectors, so no
 * rewrite reads the cache file; the last one writes no entry.
 */
void
unseal_q (struct cache *c, const struct cache_backend *be, uint8_t *model)
{
  mwrite (c, be, model, 5 * PS, 1024, 51);             /* fresh slot */
  mwrite (c, be, model, 5 * PS + 1024, 1024, 52);      /* unseals it */
  mwrite (c, be, model, 5 * PS + 3072, 512, 53);       /* data only */
}
