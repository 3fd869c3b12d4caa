/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: readahead decisions (pure: no I/O, no nbdkit).
 *
 * Owns the sequential-stream table of one client connection and the
 * readahead window of each stream: which reads form a stream, when to
 * prefetch, what range, and how big the window is.  It does no I/O;
 * the prefetch engine (prefetch.c) issues the ranges it returns and
 * feeds back how they fared.
 *
 *  - A stream is up to READAHEAD_STREAMS per connection, identified by
 *    its frontier (the end of its furthest read).  A read that starts
 *    near a frontier (within 4 times its own length, at most 4 MiB)
 *    continues that stream; any other read starts a new stream in
 *    place of the least recently used one.
 *  - After READAHEAD_TRIGGER reads in a row that advanced a stream, the
 *    stream is sequential and prefetching starts: the range from what
 *    was already prefetched up to frontier + window, issued whenever
 *    less than half a window is left ahead of the client (so each
 *    prefetch is at least half a window long).  Ranges are whole pages
 *    and never go past the backend size.
 *  - READAHEAD_FIXED: the window is the configured size, always.
 *  - READAHEAD_AUTO (adaptive): a new stream starts with the
 *    connection's start window (at first the minimum).  Each time the
 *    client has read half a window's worth of prefetched pages (for
 *    the first time: "used", told by the engine), the window grows:
 *    times 4 while at most an eighth of the maximum, else times 2, up
 *    to the maximum.  When prefetched pages are wasted - evicted or
 *    dropped before anybody read them (told by the engine through
 *    readahead_wasted), or left unread ahead of a stream that ended -
 *    the windows of the streams with prefetched data ahead and the
 *    start window halve, down to the minimum.
 *
 * Locking: none inside.  One object per connection, used under the
 * caller's per-connection lock.  Nothing here blocks or allocates
 * except readahead_new.
 */
#ifndef SSDCACHE_READAHEAD_H
#define SSDCACHE_READAHEAD_H

#include <stdbool.h>
#include <stdint.h>

enum readahead_mode {
  READAHEAD_OFF = 0,
  READAHEAD_AUTO = 1,            /* adaptive window */
  READAHEAD_FIXED = 2,           /* fixed window */
};

#define READAHEAD_STREAMS 8
#define READAHEAD_TRIGGER 2               /* sequential reads before the
                                             first prefetch */
#define READAHEAD_MIN_WINDOW (128u << 10) /* adaptive: smallest window
                                             (at least 2 pages) */
#define READAHEAD_DEFAULT_MAX (8u << 20)  /* adaptive: largest window */

struct readahead_config {
  enum readahead_mode mode;
  uint64_t window;               /* FIXED: the window */
  uint64_t min;                  /* AUTO: smallest and first window */
  uint64_t max;                  /* AUTO: largest window (>= min) */
  uint32_t page_size;            /* prefetches are whole pages */
  uint64_t size;                 /* backend size */
};

/* A range to prefetch. */
struct readahead_io {
  uint64_t offset, len;
  uint64_t window;               /* the stream's window when issued */
};

struct readahead_stats {
  uint64_t reads;                /* reads seen */
  uint64_t sequential;           /* reads that advanced a sequential stream */
  uint64_t issued;               /* prefetch ranges returned */
  uint64_t issued_bytes;
  uint64_t grows, shrinks;       /* window changes (adaptive) */
  uint64_t unread_bytes;         /* prefetched, left behind by a stream
                                    that ended */
};

/* NULL on ENOMEM.  The config is copied (and sanitised: min at least
 * 2 pages and not above max; a fixed window of at least one page).
 */
extern struct readahead *readahead_new (const struct readahead_config *cfg);
extern void readahead_free (struct readahead *ra);

/* A client read of [offset, offset+len), of which used bytes came from
 * prefetched pages read for the first time.  Returns true and fills io
 * if a prefetch should be issued now.
 */
extern bool readahead_access (struct readahead *ra, uint64_t offset,
                              uint64_t len, uint64_t used,
                              struct readahead_io *io);

/* io (returned by readahead_access) could not be issued: forget it, so
 * that the range is asked for again later.
 */
extern void readahead_cancel (struct readahead *ra,
                              const struct readahead_io *io);

/* pages prefetched pages were wasted (evicted or dropped unread). */
extern void readahead_wasted (struct readahead *ra, uint64_t pages);

/* The window of the stream whose frontier is next (0 if there is no such
 * stream), and the window a new stream would start with.
 */
extern uint64_t readahead_stream_window (const struct readahead *ra,
                                         uint64_t next);
extern uint64_t readahead_start_window (const struct readahead *ra);

extern void readahead_get_stats (const struct readahead *ra,
                                 struct readahead_stats *st);

#endif /* SSDCACHE_READAHEAD_H */
