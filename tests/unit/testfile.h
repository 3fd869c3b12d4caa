/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: a temporary cache file per test
 * and a watchdog.
 *
 * testfile_setup (a cmocka setup function) creates an empty file in
 * $TMPDIR (default /tmp) named in testfile_path and arms a watchdog: a
 * test that deadlocks or livelocks in the engine fails after
 * testfile_watchdog_seconds instead of hanging "make check" (valgrind
 * included).  testfile_teardown disarms it and removes the file.
 * Each test program sets testfile_name and testfile_watchdog_seconds
 * before running its tests.
 *
 * testfile_direct () is true when $SSDCACHE_TEST_DIRECT is set (and not
 * "0"): the engine tests then open their caches with direct I/O
 * (`make check-direct`).
 */
#ifndef SSDCACHE_TESTFILE_H
#define SSDCACHE_TESTFILE_H

extern char testfile_path[4096];
extern const char *testfile_name;            /* for messages and the file */
extern unsigned testfile_watchdog_seconds;

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

extern int testfile_setup (void **state);
extern bool testfile_direct (void);
extern int testfile_teardown (void **state);

/* A cmocka test f that runs with a cache file and the watchdog. */
#define TESTFILE_TEST(f) \
  cmocka_unit_test_setup_teardown (f, testfile_setup, testfile_teardown)

struct layout_sb;
/* The valid superblock copy of testfile_path with the highest
 * generation (a cmocka failure if there is none).
 */
extern void testfile_read_sb (struct layout_sb *out);

/* Which superblock copy (0 or 1) of testfile_path is valid with the
 * highest generation (a cmocka failure if neither is).
 */
extern int testfile_newest_sb (void);

/* XOR len (<= 4096) bytes of testfile_path at off with x. */
extern void testfile_xor (uint64_t off, size_t len, uint8_t x);
/* pread of len bytes of testfile_path at off: what it returned. */
extern ssize_t testfile_read (uint64_t off, void *buf, size_t len);
/* Write all len bytes of buf at off of testfile_path. */
extern void testfile_write (uint64_t off, const void *buf, size_t len);

struct cache;
struct cache_config;
/* cache_open and cache_attach, or fail the test with the logged error. */
extern struct cache *testfile_open_attach (const struct cache_config *cfg,
                                           uint64_t backend_size);

#endif /* SSDCACHE_TESTFILE_H */
