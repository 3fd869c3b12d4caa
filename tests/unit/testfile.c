/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: see testfile.h. */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cache.h"
#include "layout.h"
#include "log-stderr.h"
#include "testfile.h"

char testfile_path[4096];
const char *testfile_name = "unit";
unsigned testfile_watchdog_seconds = 300;

static void
watchdog (int sig)
{
  char msg[256];
  int n = snprintf (msg, sizeof msg, "%s: watchdog: the test above (last "
                    "RUN line) did not finish: deadlock, livelock or a "
                    "flush that never ends?\n", testfile_name);

  /* Not async-signal-safe, but we are about to die anyway and the RUN
   * line naming the test may still be in the stdio buffer.
   */
  fflush (stdout);
  if (n > 0)
    (void) !write (2, msg, (size_t) n < sizeof msg ? (size_t) n : sizeof msg);
  unlink (testfile_path);
  _exit (1);
}

bool
testfile_direct (void)
{
  const char *e = getenv ("SSDCACHE_TEST_DIRECT");

  return e != NULL && *e != '\0' && strcmp (e, "0") != 0;
}

int
testfile_setup (void **state)
{
  const char *dir = getenv ("TMPDIR");
  int fd;

  if (dir == NULL || *dir == '\0')
    dir = "/tmp";
  snprintf (testfile_path, sizeof testfile_path, "%s/ssdcache-%s-XXXXXX",
            dir, testfile_name);
  fd = mkstemp (testfile_path);
  if (fd == -1) {
    perror ("mkstemp");
    return -1;
  }
  close (fd);
  signal (SIGALRM, watchdog);
  alarm (testfile_watchdog_seconds);
  return 0;
}

int
testfile_teardown (void **state)
{
  alarm (0);
  unlink (testfile_path);
  return 0;
}

void
testfile_read_sb (struct layout_sb *out)
{
  uint8_t buf[LAYOUT_SB_SIZE];
  struct layout_sb sb;
  bool found = false;
  int fd = open (testfile_path, O_RDONLY);

  assert_true (fd >= 0);
  for (int i = 0; i < LAYOUT_SB_COUNT; ++i) {
    const char *why;
    assert_int_equal (pread (fd, buf, sizeof buf, i * LAYOUT_SB_SIZE),
                      sizeof buf);
    if (layout_sb_decode (buf, &sb, &why) == 0 &&
        (!found || sb.generation > out->generation)) {
      *out = sb;
      found = true;
    }
  }
  close (fd);
  assert_true (found);
}

int
testfile_newest_sb (void)
{
  uint8_t buf[LAYOUT_SB_SIZE];
  struct layout_sb sb;
  uint64_t gen = 0;
  int best = -1;

  for (int i = 0; i < LAYOUT_SB_COUNT; i++) {
    assert_int_equal (testfile_read (i * LAYOUT_SB_SIZE, buf, sizeof buf),
                      sizeof buf);
    if (layout_sb_decode (buf, &sb, NULL) == 0 &&
        (best == -1 || sb.generation > gen)) {
      best = i;
      gen = sb.generation;
    }
  }
  assert_true (best >= 0);
  return best;
}

ssize_t
testfile_read (uint64_t off, void *buf, size_t len)
{
  int fd = open (testfile_path, O_RDONLY);
  ssize_t r;

  assert_true (fd >= 0);
  r = pread (fd, buf, len, off);
  close (fd);
  return r;
}

void
testfile_write (uint64_t off, const void *buf, size_t len)
{
  int fd = open (testfile_path, O_WRONLY);

  assert_true (fd >= 0);
  assert_int_equal (pwrite (fd, buf, len, off), (ssize_t) len);
  close (fd);
}

void
testfile_xor (uint64_t off, size_t len, uint8_t x)
{
  uint8_t buf[4096];
  int fd = open (testfile_path, O_RDWR);

  assert_true (len <= sizeof buf);
  assert_true (fd >= 0);
  assert_int_equal (pread (fd, buf, len, off), (ssize_t) len);
  for (size_t i = 0; i < len; ++i)
    buf[i] ^= x;
  assert_int_equal (pwrite (fd, buf, len, off), (ssize_t) len);
  close (fd);
}

struct cache *
testfile_open_attach (const struct cache_config *cfg, uint64_t backend_size)
{
  struct cache *c = cache_open (cfg);

  if (c == NULL)
    fail_msg ("cache_open %s failed: %s", cfg->path, log_error_last);
  if (cache_attach (c, backend_size) != 0)
    fail_msg ("cache_attach failed: %s", log_error_last);
  return c;
}
