/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: run fuzz inputs without libFuzzer.
 *
 *   replay-layout [FILE|DIR]...
 *
 * Feeds every FILE, and every regular file in every DIR (sorted by
 * name, not recursive), to LLVMFuzzerTestOneInput, one at a time, in a
 * buffer of exactly the file's size (so ASan sees reads past it).  With
 * no argument, replays $srcdir/fuzz/corpus ($srcdir is set by automake's
 * test driver; "." otherwise).  A violated invariant aborts, which fails
 * the test; otherwise prints how many inputs ran and how many decodes
 * were accepted, and exits 0.  No input at all is a failure (a missing
 * corpus must not pass silently), and so is a default corpus in which
 * no superblock or no entry decodes (the round trips would go unchecked).
 *
 * This is how the seed corpus and any crash reproducer found by the
 * fuzzer run under gcc, valgrind and the sanitizer build.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz-layout.h"

static unsigned long ran;

static int
replay_file (const char *path)
{
  FILE *fp = fopen (path, "rb");
  struct stat st;
  unsigned char *buf;
  size_t len;

  if (fp == NULL || fstat (fileno (fp), &st) == -1) {
    fprintf (stderr, "replay: %s: %s\n", path, strerror (errno));
    if (fp)
      fclose (fp);
    return -1;
  }
  len = st.st_size;
  buf = malloc (len ? len : 1);
  if (buf == NULL || fread (buf, 1, len, fp) != len) {
    fprintf (stderr, "replay: %s: read failed\n", path);
    free (buf);
    fclose (fp);
    return -1;
  }
  fclose (fp);
  if (getenv ("REPLAY_VERBOSE"))
    fprintf (stderr, "replay: %s (%zu bytes)\n", path, len);
  LLVMFuzzerTestOneInput (buf, len);
  free (buf);
  ran++;
  return 0;
}

static int
by_name (const struct dirent **a, const struct dirent **b)
{
  return strcmp ((*a)->d_name, (*b)->d_name);
}

static int
replay_path (const char *path)
{
  struct stat st;
  struct dirent **names;
  int n, r = 0;

  if (stat (path, &st) == -1) {
    fprintf (stderr, "replay: %s: %s\n", path, strerror (errno));
    return -1;
  }
  if (!S_ISDIR (st.st_mode))
    return replay_file (path);

  n = scandir (path, &names, NULL, by_name);
  if (n == -1) {
    fprintf (stderr, "replay: %s: %s\n", path, strerror (errno));
    return -1;
  }
  for (int i = 0; i < n; i++) {
    char *sub;
    struct stat sst;

    if (names[i]->d_name[0] != '.' &&
        asprintf (&sub, "%s/%s", path, names[i]->d_name) != -1) {
      if (stat (sub, &sst) == 0 && S_ISREG (sst.st_mode) &&
          replay_file (sub) == -1)
        r = -1;
      free (sub);
    }
    free (names[i]);
  }
  free (names);
  return r;
}

int
main (int argc, char *argv[])
{
  int r = 0;

  if (argc > 1) {
    for (int i = 1; i < argc; i++)
      if (replay_path (argv[i]) == -1)
        r = -1;
  }
  else {
    const char *srcdir = getenv ("srcdir");
    char *dir;

    if (asprintf (&dir, "%s/fuzz/corpus", srcdir ? srcdir : ".") == -1) {
      perror ("asprintf");
      return 1;
    }
    r = replay_path (dir);
    free (dir);
  }
  printf ("replay: %lu inputs, no invariant violated; superblocks %lu accepted,"
          " %lu rejected; entry decodes %lu accepted, %lu rejected\n",
          ran, fuzz_layout_counts.sb_accepted, fuzz_layout_counts.sb_rejected,
          fuzz_layout_counts.entry_accepted, fuzz_layout_counts.entry_rejected);
  if (r == -1)
    return 1;
  if (ran == 0) {
    fprintf (stderr, "replay: no input found\n");
    return 1;
  }
  /* The default corpus must reach the round-trip checks of both decoders. */
  if (argc == 1 &&
      (fuzz_layout_counts.sb_accepted == 0 ||
       fuzz_layout_counts.entry_accepted == 0)) {
    fprintf (stderr, "replay: the corpus has no accepted superblock or entry\n");
    return 1;
  }
  return 0;
}
