/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: reading and decoding the page table ahead of
 * the loader.
 *
 * Owns struct ptread: a thread that reads the entries a chunk of
 * CACHE_LOAD_CHUNK at a time, in slot order, and decodes them
 * (layout_entry_decode: pure), each with the form it takes in the page
 * table if that is a record alone (pagetable_rec_encode: pure), into a
 * ring of PTREAD_NBUF chunks, while recover.c indexes the chunk before;
 * so the copy from the kernel, the checksums, the decoding and the
 * encoding of the entries take the other CPU.  The
 * loader takes the chunks in slot order and does everything else
 * (every change to the cache and its file) itself, as before.  What the
 * loader writes while the thread reads (FREE entries) is always for a
 * slot of a chunk already read: the thread never reads an entry the
 * loader has changed.
 *
 * Locking (the table in docs/design.md, "Locks"): t->lock protects
 * produced, released, stop and err, with the condition t->cond; a
 * chunk's buffers belong to the thread from its release (released)
 * until it is produced (produced), then to the loader.  No other lock
 * is taken (pool_read_entries is a positioned read).  If the thread
 * cannot be started, ptread_next reads each chunk itself.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cache-int.h"
#include "log.h"
#include "ptread.h"

#define PTREAD_NBUF 4            /* chunks in the ring */
#define PTREAD_ALIGN 4096        /* (direct I/O reads into it as is) */

struct ptread {
  struct cache *c;
  uint64_t nchunks;
  struct ptread_chunk ring[PTREAD_NBUF];
  pthread_t thread;
  bool threaded;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  uint64_t produced;             /* chunks read and decoded */
  uint64_t released;             /* chunks the loader is done with */
  uint64_t taken;                /* chunks given to the loader (only the
                                    loader reads and changes it) */
  bool stop;                     /* the loader stopped early */
  int err;                       /* errno of a failed read, or 0 */
};

/* Read and decode chunk i into its buffers.  Returns 0, or an errno. */
static int
fill_chunk (struct ptread *t, uint64_t i)
{
  struct cache *c = t->c;
  struct ptread_chunk *k = &t->ring[i % PTREAD_NBUF];

  k->base = i * CACHE_LOAD_CHUNK;
  k->n = c->nslots - k->base < CACHE_LOAD_CHUNK
    ? c->nslots - k->base : CACHE_LOAD_CHUNK;
  if (pool_read_entries (&c->pool, k->base, k->n, k->raw) == -1)
    return errno ? errno : EIO;
  for (uint64_t j = 0; j < k->n; j++) {
    k->bad[j] = layout_entry_decode (k->raw + j * LAYOUT_ENTRY_SIZE,
                                     c->nsectors, &k->ents[j]) == -1;
    k->has_img[j] = !k->bad[j] &&
      pagetable_rec_encode (&k->ents[j], &k->imgs[j]);
  }
  return 0;
}

/* The thread: every chunk in turn, each once its buffer is free. */
static void *
reader (void *arg)
{
  struct ptread *t = arg;

  for (uint64_t i = 0; i < t->nchunks; i++) {
    bool stop;
    int e;

    pthread_mutex_lock (&t->lock);
    while (!t->stop && i >= t->released + PTREAD_NBUF)
      pthread_cond_wait (&t->cond, &t->lock);
    stop = t->stop;
    pthread_mutex_unlock (&t->lock);
    if (stop)
      break;
    e = fill_chunk (t, i);
    pthread_mutex_lock (&t->lock);
    if (e)
      t->err = e;
    else
      t->produced = i + 1;
    pthread_cond_broadcast (&t->cond);
    pthread_mutex_unlock (&t->lock);
    if (e)
      break;
  }
  return NULL;
}

static void
free_ring (struct ptread *t)
{
  for (int i = 0; i < PTREAD_NBUF; i++) {
    free (t->ring[i].raw);
    free (t->ring[i].ents);
    free (t->ring[i].bad);
    free (t->ring[i].imgs);
    free (t->ring[i].has_img);
  }
}

/* The ring's buffers.  Returns false on ENOMEM. */
static bool
alloc_ring (struct ptread *t)
{
  for (int i = 0; i < PTREAD_NBUF; i++) {
    struct ptread_chunk *k = &t->ring[i];
    void *raw;

    if (posix_memalign (&raw, PTREAD_ALIGN,
                        (size_t) CACHE_LOAD_CHUNK * LAYOUT_ENTRY_SIZE) != 0)
      return false;
    k->raw = raw;
    k->ents = malloc (CACHE_LOAD_CHUNK * sizeof *k->ents);
    k->bad = malloc (CACHE_LOAD_CHUNK * sizeof *k->bad);
    k->imgs = malloc (CACHE_LOAD_CHUNK * sizeof *k->imgs);
    k->has_img = malloc (CACHE_LOAD_CHUNK * sizeof *k->has_img);
    if (k->ents == NULL || k->bad == NULL || k->imgs == NULL ||
        k->has_img == NULL)
      return false;
  }
  return true;
}

struct ptread *
ptread_start (struct cache *c)
{
  struct ptread *t = calloc (1, sizeof *t);

  if (t == NULL || !alloc_ring (t)) {
    log_error ("cache file %s: loading the page table: %m", c->path);
    if (t)
      free_ring (t);
    free (t);
    return NULL;
  }
  t->c = c;
  t->nchunks = (c->nslots + CACHE_LOAD_CHUNK - 1) / CACHE_LOAD_CHUNK;
  pthread_mutex_init (&t->lock, NULL);
  pthread_cond_init (&t->cond, NULL);
  /* Without a thread, ptread_next reads each chunk itself. */
  t->threaded = pthread_create (&t->thread, NULL, reader, t) == 0;
  return t;
}

/* Without the thread: read chunk i now. */
static const struct ptread_chunk *
next_inline (struct ptread *t, uint64_t i, int *err)
{
  int e = fill_chunk (t, i);

  if (e) {
    errno = e;
    log_error ("cache file %s: reading page table: %m", t->c->path);
    *err = -1;
    return NULL;
  }
  return &t->ring[i % PTREAD_NBUF];
}

const struct ptread_chunk *
ptread_next (struct ptread *t, int *err)
{
  uint64_t i = t->taken;
  int e;

  *err = 0;
  if (i >= t->nchunks)
    return NULL;
  t->taken = i + 1;
  if (!t->threaded)
    return next_inline (t, i, err);
  pthread_mutex_lock (&t->lock);
  t->released = i;              /* the chunk before is done with */
  pthread_cond_broadcast (&t->cond);
  while (t->produced <= i && t->err == 0)
    pthread_cond_wait (&t->cond, &t->lock);
  e = t->produced > i ? 0 : t->err;
  pthread_mutex_unlock (&t->lock);
  if (e) {
    errno = e;
    log_error ("cache file %s: reading page table: %m", t->c->path);
    *err = -1;
    return NULL;
  }
  return &t->ring[i % PTREAD_NBUF];
}

void
ptread_stop (struct ptread *t)
{
  if (t == NULL)
    return;
  if (t->threaded) {
    pthread_mutex_lock (&t->lock);
    t->stop = true;
    pthread_cond_broadcast (&t->cond);
    pthread_mutex_unlock (&t->lock);
    pthread_join (t->thread, NULL);
  }
  pthread_mutex_destroy (&t->lock);
  pthread_cond_destroy (&t->cond);
  free_ring (t);
  free (t);
}
