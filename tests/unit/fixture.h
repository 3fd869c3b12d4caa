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
 *
 * The helpers below are shared by the engine tests (test-cache,
 * test-open, test-crash, test-writeback, ...): data patterns, a cache
 * opened over a RAM backend, reads and writes checked against the RAM
 * backend or against a model of the export, a backend with a flush and
 * failures (struct tbe), the three together (struct tenv), a child
 * process for the crash tests, and a look at the cache file itself.
 * Each fails the running cmocka test with a message saying where the
 * data differs.
 */
#ifndef SSDCACHE_FIXTURE_H
#define SSDCACHE_FIXTURE_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "cache.h"
#include "layout.h"
#include "rambackend.h"
#include "stats.h"
#include "testfile.h"

/* The statistic f of the cache c (stats.h). */
#define ST(c, f) STATS_GET (cache_stats (c), f)

/* The backend identity of fixture_config. */
#define FIXTURE_ID_TEXT "unit test backend"

extern struct cache_config fixture_config (uint64_t size,
                                           uint32_t page_size);

/* The same in writeback mode, with background cleaning off (high
 * watermark 100%, no idle writeback): the writeback tests decide when
 * dirty data is written back (cache_writeback_all, clean_pass), so
 * that what they count does not depend on the writeback thread's
 * timing.  A test that wants the thread turns it on itself.
 */
extern struct cache_config fixture_writeback_config (uint64_t size,
                                                     uint32_t page_size);

/* -- data ------------------------------------------------------------- */

/* len bytes that depend only on seed. */
extern void fill_pattern (uint8_t *buf, uint32_t len, unsigned seed);
/* xorshift64: the next number of the sequence in *s. */
extern uint64_t rnd64 (uint64_t *s);
/* A random extent of [0, size) from *s: it starts anywhere and is 1 to
 * max bytes long, cut at size.
 */
struct extent {
  uint64_t off;
  uint32_t len;
};
extern struct extent rnd_extent (uint64_t *s, uint64_t size, uint32_t max);

/* -- checked against the RAM backend (it holds the truth) -------------- */

/* cache_read of [off, off+len) returns what the backend holds. */
extern void read_check (struct cache *c, struct rambackend *rb, uint64_t off,
                        uint32_t len);
/* The same for the whole backend, chunk bytes at a time. */
extern void read_all_check (struct cache *c, struct rambackend *rb,
                            uint32_t chunk);
/* cache_write of fill_pattern (seed) reached the backend. */
extern void write_check (struct cache *c, struct rambackend *rb, uint64_t off,
                         uint32_t len, unsigned seed);
/* rb made (rambackend_init: size bytes from seed) and the cache (cfg)
 * opened over it; fixture_close closes both.
 */
extern struct cache *fixture_open (struct rambackend *rb,
                                   const struct cache_config *cfg,
                                   uint64_t size, unsigned seed);
extern void fixture_close (struct cache *c, struct rambackend *rb);
/* The cache (cfg) opened over rb: read_all_check, and closed. */
extern void open_read_all_check (const struct cache_config *cfg,
                                 struct rambackend *rb, uint32_t chunk);
/* The same, all from the cache: no backend read, no page that fails to
 * verify (a warm restart).
 */
extern void warm_check (const struct cache_config *cfg, struct rambackend *rb,
                        uint32_t chunk);

/* -- a backend with a flush, checked against a model ------------------- */

/* The backend the engine sees: the RAM backend plus a flush, both with
 * failures that last until cleared, and an event clock that tells
 * whether the last flush came after the last write.
 */
struct tbe {
  struct rambackend *rb;
  _Atomic int fail_write;         /* errno for every pwrite (0: none) */
  _Atomic int fail_flush;         /* errno for every flush (0: none) */
  _Atomic uint64_t flushes, failed_writes, failed_flushes;
  _Atomic uint64_t clock, last_write_ev, last_flush_ev;
  _Atomic uint64_t inflight, max_inflight;  /* pwrites at once */
  struct cache_backend be;
};

/* t over rb: no failures, counters at zero. */
extern void tbe_init (struct tbe *t, struct rambackend *rb);

/* cache_write of fill_pattern (seed), copied into model (if not NULL). */
extern void mwrite (struct cache *c, const struct cache_backend *be,
                    uint8_t *model, uint64_t off, uint32_t len,
                    unsigned seed);
/* got equals exp (len bytes at export offset off; ps for the message). */
extern void compare (const uint8_t *got, const uint8_t *exp, uint64_t off,
                     uint64_t len, uint32_t ps, const char *what);
/* cache_read of [off, off+len) returns the model's bytes. */
extern void mread_check (struct cache *c, const struct cache_backend *be,
                         const uint8_t *model, uint64_t off, uint32_t len);
/* The same for [0, size), chunk bytes at a time. */
extern void mread_all_check (struct cache *c, const struct cache_backend *be,
                             const uint8_t *model, uint64_t size,
                             uint32_t chunk);
/* The backend itself (not through the cache) equals the model. */
extern void backend_check (struct rambackend *rb, const uint8_t *model,
                           uint32_t ps);
/* A model of rb: a copy of its contents (free it). */
extern uint8_t *model_new (struct rambackend *rb);

/* -- a test's backend, tbe and model together ------------------------- */

/* What most writeback tests run on: a RAM backend, the backend with a
 * flush over it (be is &t.be, what the engine is given) and a model of
 * the export, which starts as a copy of the backend.
 */
struct tenv {
  struct rambackend rb;
  struct tbe t;
  const struct cache_backend *be;
  uint8_t *model;
};

/* env over a RAM backend of size bytes from seed (rambackend_init). */
extern void tenv_init (struct tenv *env, uint64_t size, unsigned seed);
extern void tenv_free (struct tenv *env);
/* tenv_init, and the cache (cfg) opened over env's backend; tenv_close
 * closes the cache and frees env.
 */
extern struct cache *tenv_open (struct tenv *env,
                                const struct cache_config *cfg,
                                uint64_t size, unsigned seed);
extern void tenv_close (struct tenv *env, struct cache *c);
/* tenv_init, with every page cached clean in the test file (cfg) and
 * the cache closed: the next open has none of its pages checked yet.
 */
extern void tenv_init_cached (struct tenv *env,
                              const struct cache_config *cfg,
                              uint64_t size, unsigned seed);
/* mwrite, mread_check and mread_all_check (of the whole export) with
 * env's backend and model.
 */
extern void tenv_write (struct tenv *env, struct cache *c, uint64_t off,
                        uint32_t len, unsigned seed);
extern void tenv_read_check (struct tenv *env, struct cache *c, uint64_t off,
                             uint32_t len);
extern void tenv_read_all_check (struct tenv *env, struct cache *c,
                                 uint32_t chunk);
/* cache_writeback_all succeeds, and then the backend equals the model. */
extern void tenv_writeback_check (struct tenv *env, struct cache *c);

/* Page 5 of a 4 KiB-page writeback cache, never flushed, written three
 * times in whole sectors: a fresh slot, then a rewrite that unseals it
 * (cache-seal.c), then one that writes data only.
 */
extern void unseal_q (struct cache *c, const struct cache_backend *be,
                      uint8_t *model);

/* -- a child process ---------------------------------------------------- */

/* fork, stdio flushed first (so that the child does not print what the
 * parent had buffered); 0 in the child.
 */
extern pid_t fixture_fork (void);
/* Wait for the child pid, which must have exited with status 0. */
extern void fixture_wait (pid_t pid);

/* -- the cache file (testfile_path) itself ----------------------------- */

/* The entry of slot as stored (raw: its LAYOUT_ENTRY_SIZE bytes, may be
 * NULL); returns layout_entry_decode's result.
 */
extern int file_entry (uint32_t slot, struct layout_entry *e, uint8_t *raw);
/* Store e as the entry of slot (a valid one: CRC and all). */
extern void file_set_entry (uint32_t slot, const struct layout_entry *e);
/* Slots whose valid, non-free entry names page, oldest first (their
 * seqs and, if states is not NULL, states); returns how many (<= max).
 */
extern int file_slots_for (uint64_t page, uint32_t *slots, uint64_t *seqs,
                           uint8_t *states, int max);
/* The data of slot (one page). */
extern void file_slot_data (uint32_t slot, uint8_t *buf);
/* The newest entry of page (its slot in *slot if not NULL). */
extern void newest_entry (uint64_t page, struct layout_entry *e,
                          uint32_t *slot);

#endif /* SSDCACHE_FIXTURE_H */
