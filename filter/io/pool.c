/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the cache file (page pool and its metadata).
 *
 * Owns the cache file descriptor, its one-owner lock, all positioned
 * I/O on it and, with direct I/O, the alignment of that I/O (bounce
 * buffers, read-modify-write of partial blocks, the block stripe
 * locks).  See pool.h for the locking rules.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "log.h"
#include "pool.h"

static int
full_pread (int fd, void *buf, size_t count, off_t off)
{
  while (count > 0) {
    ssize_t r = pread (fd, buf, count, off);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    if (r == 0) {               /* file shrank under us */
      errno = EIO;
      return -1;
    }
    buf = (char *) buf + r;
    count -= r;
    off += r;
  }
  return 0;
}

static int
full_pwrite (int fd, const void *buf, size_t count, off_t off)
{
  while (count > 0) {
    ssize_t r = pwrite (fd, buf, count, off);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    buf = (const char *) buf + r;
    count -= r;
    off += r;
  }
  return 0;
}

#define ALIGN_DOWN(x, a) ((x) & ~(uint64_t) ((a) - 1))
#define ALIGN_UP(x, a) ALIGN_DOWN ((x) + (a) - 1, (a))
#define IS_ALIGNED(x, a) (((uint64_t) (x) & ((a) - 1)) == 0)

/* Largest aligned span read or written through one bounce buffer. */
#define BOUNCE_MAX (1024 * 1024)
/* Spans up to this size bounce through the stack (no allocation on the
 * hot path: a 4 KiB read at any offset spans at most two blocks).
 */
#define BOUNCE_STACK (2 * POOL_DIRECT_ALIGN)

void
pool_split_span (uint64_t off, uint64_t len, uint32_t align,
                 struct pool_span *sp)
{
  uint64_t end = off + len, pos = off;

  memset (sp, 0, sizeof *sp);
  if (!IS_ALIGNED (off, align)) {
    uint64_t h_end = ALIGN_UP (off, align);
    if (h_end > end)
      h_end = end;
    sp->head_off = off;
    sp->head_len = h_end - off;
    pos = h_end;
  }
  if (pos >= end)
    return;
  if (ALIGN_DOWN (end, align) > pos) {
    sp->mid_off = pos;
    sp->mid_len = ALIGN_DOWN (end, align) - pos;
    pos += sp->mid_len;
  }
  if (pos < end) {
    sp->tail_off = pos;
    sp->tail_len = end - pos;
  }
}

static void *
bounce_alloc (size_t n)
{
  void *b;
  int r = posix_memalign (&b, POOL_DIRECT_ALIGN, n);

  if (r != 0) {
    errno = r;
    return NULL;
  }
  return b;
}

/* Aligned read of n bytes at a into b.  The end of the file may cut
 * the aligned span short (a truncated cache file): bytes after it read
 * as zeroes, provided everything before need was there.
 */
static int
read_span (struct pool *p, uint8_t *b, size_t n, uint64_t a, uint64_t need)
{
  size_t done = 0;

  while (done < n) {
    ssize_t r = pread (p->fd, b + done, n - done, a + done);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    done += r;
    /* The end of the file: nothing read, or a short read that leaves
     * the position unaligned (asking again there would be an unaligned
     * direct read).
     */
    if (r == 0 || !IS_ALIGNED (done, POOL_DIRECT_ALIGN)) {
      if (a + done < need) {
        errno = EIO;
        return -1;
      }
      memset (b + done, 0, n - done);
      break;
    }
  }
  return 0;
}

/* Direct I/O read of [off, off+count) into buf, any alignment: the
 * enclosing aligned span is read, a piece at a time, into a bounce
 * buffer.
 */
static int
direct_pread_bounce (struct pool *p, void *buf, size_t count, uint64_t off)
{
  uint8_t stackbuf[BOUNCE_STACK] __attribute__ ((aligned (POOL_DIRECT_ALIGN)));
  uint64_t a = ALIGN_DOWN (off, POOL_DIRECT_ALIGN);
  uint64_t aend = ALIGN_UP (off + count, POOL_DIRECT_ALIGN);
  uint64_t piece = aend - a < BOUNCE_MAX ? aend - a : BOUNCE_MAX;
  uint8_t *b = piece <= BOUNCE_STACK ? stackbuf : bounce_alloc (piece);
  int ret = 0;

  if (b == NULL)
    return -1;
  for (; a < aend; a += piece) {
    uint64_t n = aend - a < piece ? aend - a : piece;
    uint64_t from = off > a ? off : a;
    uint64_t to = off + count < a + n ? off + count : a + n;

    if (read_span (p, b, n, a, to) == -1) {
      ret = -1;
      break;
    }
    memcpy ((uint8_t *) buf + (from - off), b + (from - a), to - from);
  }
  if (b != stackbuf) {
    int e = errno;
    free (b);
    errno = e;
  }
  return ret;
}

/* -- page-table lines (direct I/O, see pool.h) ---------------------- */

static unsigned
blk_stripe (uint64_t a)
{
  return (a / POOL_DIRECT_ALIGN) % POOL_BLOCK_LOCKS;
}

/* Is the block at a in the page table of the current geometry? */
static bool
pt_block (const struct pool *p, uint64_t a)
{
  return p->pt_lines && a >= ALIGN_DOWN (p->sb.pt_offset, POOL_DIRECT_ALIGN) &&
    a < p->sb.pool_offset;
}

/* Line i, holding the block at a (read if it does not: under
 * blk_locks[i]).  Returns the line, or NULL (errno) if the read failed.
 */
static uint8_t *
pt_line_locked (struct pool *p, unsigned i, uint64_t a)
{
  uint8_t *line = p->pt_lines + (size_t) i * POOL_DIRECT_ALIGN;

  if (p->pt_tags[i] == a / POOL_DIRECT_ALIGN + 1)
    return line;
  p->pt_tags[i] = 0;
  if (read_span (p, line, POOL_DIRECT_ALIGN, a, a) == -1)
    return NULL;                /* (past the end: zeroes) */
  p->pt_tags[i] = a / POOL_DIRECT_ALIGN + 1;
  return line;
}

/* Forget the lines of blocks [off, off+count): whole blocks were
 * written there.
 */
static void
pt_lines_forget (struct pool *p, uint64_t off, uint64_t count)
{
  uint64_t b0 = off / POOL_DIRECT_ALIGN;
  uint64_t nb = count / POOL_DIRECT_ALIGN;

  /* Lines hold page-table blocks only. */
  if (p->pt_lines == NULL || off >= p->sb.pool_offset ||
      off + count <= ALIGN_DOWN (p->sb.pt_offset, POOL_DIRECT_ALIGN))
    return;
  for (uint64_t k = 0; k < nb && k < POOL_BLOCK_LOCKS; k++) {
    unsigned i = (b0 + k) % POOL_BLOCK_LOCKS;

    pthread_mutex_lock (&p->blk_locks[i]);
    if (p->pt_tags[i] > b0 && p->pt_tags[i] <= b0 + nb)
      p->pt_tags[i] = 0;
    pthread_mutex_unlock (&p->blk_locks[i]);
  }
}

/* Every line: a new geometry. */
static void
pt_lines_clear (struct pool *p)
{
  for (unsigned i = 0; p->pt_lines && i < POOL_BLOCK_LOCKS; i++) {
    pthread_mutex_lock (&p->blk_locks[i]);
    p->pt_tags[i] = 0;
    pthread_mutex_unlock (&p->blk_locks[i]);
  }
}

/* One entry of the page table, from its block's line. */
static int
pt_read_entry (struct pool *p, void *buf, uint64_t off)
{
  uint64_t a = ALIGN_DOWN (off, POOL_DIRECT_ALIGN);
  unsigned i = blk_stripe (a);
  uint8_t *line;

  pthread_mutex_lock (&p->blk_locks[i]);
  line = pt_line_locked (p, i, a);
  if (line)
    memcpy (buf, line + (off - a), LAYOUT_ENTRY_SIZE);
  pthread_mutex_unlock (&p->blk_locks[i]);
  return line ? 0 : -1;
}

/* Patch bytes [off, off+count) of the aligned block that holds them:
 * read the block (or take its line), copy, write it back, under the
 * block's stripe lock.
 */
static int
direct_rmw_block (struct pool *p, const void *buf, size_t count,
                  uint64_t off)
{
  uint8_t blk[POOL_DIRECT_ALIGN] __attribute__ ((aligned (POOL_DIRECT_ALIGN)));
  uint64_t a = ALIGN_DOWN (off, POOL_DIRECT_ALIGN);
  unsigned i = blk_stripe (a);
  uint8_t *b = blk;
  int r = 0;

  pthread_mutex_lock (&p->blk_locks[i]);
  if (pt_block (p, a)) {
    b = pt_line_locked (p, i, a);
    r = b ? 0 : -1;
  }
  else
    r = read_span (p, blk, sizeof blk, a, a);   /* past the end: zeroes */
  if (r == 0) {
    memcpy (b + (off - a), buf, count);
    r = full_pwrite (p->fd, b, POOL_DIRECT_ALIGN, a);
    if (r == -1 && b != blk)
      p->pt_tags[i] = 0;        /* the block on the file is unknown */
  }
  pthread_mutex_unlock (&p->blk_locks[i]);
  return r;
}

/* Whole blocks [off, off+count) from buf, any memory alignment.  No
 * stripe lock: whoever writes whole blocks owns them (a slot's data
 * under its range lock; the page table only while single-threaded).
 */
static int
direct_pwrite_blocks (struct pool *p, const void *buf, size_t count,
                      uint64_t off)
{
  const uint8_t *src = buf;
  uint8_t *b = NULL;
  int ret = 0;

  if (!IS_ALIGNED (buf, POOL_DIRECT_ALIGN)) {
    b = bounce_alloc (count < BOUNCE_MAX ? count : BOUNCE_MAX);
    if (b == NULL)
      return -1;
  }
  while (count > 0 && ret == 0) {
    size_t n = count < BOUNCE_MAX ? count : BOUNCE_MAX;
    const uint8_t *w = src;

    if (b) {
      memcpy (b, src, n);
      w = b;
    }
    ret = full_pwrite (p->fd, w, n, off);
    src += n;
    off += n;
    count -= n;
  }
  if (b) {
    int e = errno;
    free (b);
    errno = e;
  }
  return ret;
}

int
pool_pread (struct pool *p, void *buf, size_t count, uint64_t off)
{
  if (!p->direct)
    return full_pread (p->fd, buf, count, off);
  if (count == 0)
    return 0;
  if (IS_ALIGNED (buf, POOL_DIRECT_ALIGN) &&
      IS_ALIGNED (off, POOL_DIRECT_ALIGN) &&
      IS_ALIGNED (count, POOL_DIRECT_ALIGN))
    return full_pread (p->fd, buf, count, off);
  return direct_pread_bounce (p, buf, count, off);
}

int
pool_pwrite (struct pool *p, const void *buf, size_t count, uint64_t off)
{
  struct pool_span sp;
  const uint8_t *src = buf;

  if (!p->direct)
    return full_pwrite (p->fd, buf, count, off);
  if (count == 0)
    return 0;
  pool_split_span (off, count, POOL_DIRECT_ALIGN, &sp);
  if (sp.head_len &&
      direct_rmw_block (p, src, sp.head_len, sp.head_off) == -1)
    return -1;
  if (sp.mid_len) {
    int r = direct_pwrite_blocks (p, src + (sp.mid_off - off), sp.mid_len,
                                  sp.mid_off);
    pt_lines_forget (p, sp.mid_off, sp.mid_len);
    if (r == -1)
      return -1;
  }
  if (sp.tail_len &&
      direct_rmw_block (p, src + (sp.tail_off - off), sp.tail_len,
                        sp.tail_off) == -1)
    return -1;
  return 0;
}

/* Direct I/O: make sure POOL_DIRECT_ALIGN is enough for this file or
 * device, and that direct I/O works on it (the file system may accept
 * O_DIRECT at open and refuse the I/O).
 */
static int
check_direct (struct pool *p)
{
  unsigned need = 0;
  struct stat st;

  if (fstat (p->fd, &st) == -1) {
    log_error ("ssdcache-file: fstat: %s: %m", p->path);
    return -1;
  }
  if (S_ISBLK (st.st_mode)) {
    int ssz;
    if (ioctl (p->fd, BLKSSZGET, &ssz) == 0 && ssz > 0)
      need = ssz;
  }
#ifdef STATX_DIOALIGN
  else {
    struct statx stx;
    if (statx (p->fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
        (stx.stx_mask & STATX_DIOALIGN)) {
      if (stx.stx_dio_offset_align == 0) {
        log_error ("ssdcache-direct: the file system of %s does not "
                   "support direct I/O on it; use ssdcache-direct=false "
                   "or put ssdcache-file on another file system", p->path);
        return -1;
      }
      need = stx.stx_dio_offset_align;
      if (stx.stx_dio_mem_align > need)
        need = stx.stx_dio_mem_align;
    }
  }
#endif
  if (need > POOL_DIRECT_ALIGN) {
    log_error ("ssdcache-direct: %s needs direct I/O aligned to %u bytes, "
               "more than the %u this filter uses; use "
               "ssdcache-direct=false", p->path, need, POOL_DIRECT_ALIGN);
    return -1;
  }
  /* A read of the first block, if there is one. */
  if ((S_ISBLK (st.st_mode) || st.st_size >= POOL_DIRECT_ALIGN)) {
    uint8_t blk[POOL_DIRECT_ALIGN]
      __attribute__ ((aligned (POOL_DIRECT_ALIGN)));
    if (pread (p->fd, blk, sizeof blk, 0) == -1 && errno == EINVAL) {
      log_error ("ssdcache-direct: direct I/O on %s fails (%m); use "
                 "ssdcache-direct=false or put ssdcache-file on another "
                 "file system", p->path);
      return -1;
    }
  }
  return 0;
}

/* The default cache file must be this user's own (pool_open_private).
 * Returns 0, or -1 with the reason logged.
 */
static int
check_private (const char *path, const struct stat *st)
{
  char why[128];

  if (S_ISLNK (st->st_mode))
    snprintf (why, sizeof why, "is a symbolic link");
  else if (!S_ISREG (st->st_mode))
    snprintf (why, sizeof why, "is not a regular file");
  else if (st->st_uid != geteuid ())
    snprintf (why, sizeof why, "is owned by uid %u, not by this process "
              "(uid %u)", (unsigned) st->st_uid, (unsigned) geteuid ());
  else if (st->st_mode & (S_IWGRP | S_IWOTH))
    snprintf (why, sizeof why, "is writable by group or others (mode %04o)",
              (unsigned) (st->st_mode & 07777));
  else
    return 0;
  log_error ("ssdcache-file: default cache file %s %s: it is not a cache "
             "file this filter made, refusing to use it; delete it, or "
             "name a cache file with ssdcache-file", path, why);
  return -1;
}

/* p->dev_size, for the file of st.  Returns -1 (logged) if it is not
 * a regular file or a block device.
 */
static int
file_size (struct pool *p, const struct stat *st)
{
  if (S_ISBLK (st->st_mode)) {
    p->is_blockdev = true;
    if (ioctl (p->fd, BLKGETSIZE64, &p->dev_size) == -1) {
      log_error ("ssdcache-file: %s: cannot get device size: %m", p->path);
      return -1;
    }
  }
  else if (S_ISREG (st->st_mode))
    p->dev_size = st->st_size;
  else {
    log_error ("ssdcache-file: %s is not a regular file or block device",
               p->path);
    return -1;
  }
  return 0;
}

/* The rest of open_pool for a file already open and locked. */
static int
adopt_fd (struct pool *p, bool direct)
{
  struct stat st;

  if (fstat (p->fd, &st) == -1) {
    log_error ("ssdcache-file: fstat: %s: %m", p->path);
    goto err;
  }
  if ((direct && check_direct (p) == -1) || file_size (p, &st) == -1)
    goto err;
  return 0;

 err:
  pool_close (p);
  return -1;
}

/* Open path (fd: the file, already open and locked, or -1). */
static int
open_pool (struct pool *p, const char *path, bool direct, bool private,
           int fd)
{
  struct stat st;

  memset (p, 0, sizeof *p);
  p->fd = -1;
  p->path = strdup (path);
  if (p->path == NULL) {
    log_error ("strdup: %m");
    return -1;
  }
  if (direct) {
    p->blk_locks = malloc (POOL_BLOCK_LOCKS * sizeof *p->blk_locks);
    if (p->blk_locks == NULL) {
      log_error ("malloc: %m");
      goto err;
    }
    for (int i = 0; i < POOL_BLOCK_LOCKS; i++)
      pthread_mutex_init (&p->blk_locks[i], NULL);
    p->pt_lines = bounce_alloc ((size_t) POOL_BLOCK_LOCKS * POOL_DIRECT_ALIGN);
    p->pt_tags = calloc (POOL_BLOCK_LOCKS, sizeof *p->pt_tags);
    if (p->pt_lines == NULL || p->pt_tags == NULL) {
      log_error ("malloc: %m");
      goto err;
    }
    p->direct = true;
  }

  /* The default file: look before opening (open has side effects on a
   * FIFO or a device), and open without following a symbolic link
   * planted after the look.
   */
  if (fd >= 0) {
    p->fd = fd;
    return adopt_fd (p, direct);
  }
  if (private && lstat (path, &st) == 0 && check_private (path, &st) == -1)
    goto err;
  p->fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC | (direct ? O_DIRECT : 0) |
                (private ? O_NOFOLLOW : 0), 0600);
  if (p->fd == -1 && direct && errno == EINVAL) {
    /* Linux refuses O_DIRECT at open on file systems without it (tmpfs
     * before Linux 6.6, some FUSE file systems).
     */
    log_error ("ssdcache-direct: the file system of %s does not support "
               "direct I/O (O_DIRECT: %m); use ssdcache-direct=false or "
               "put ssdcache-file on another file system", path);
    goto err;
  }
  if (p->fd == -1 && private && errno == ELOOP) {
    st.st_mode = S_IFLNK;
    check_private (path, &st);
    goto err;
  }
  if (p->fd == -1) {
    log_error ("ssdcache-file: cannot open %s: %m", path);
    goto err;
  }
  if (fstat (p->fd, &st) == -1) {
    log_error ("ssdcache-file: fstat: %s: %m", path);
    goto err;
  }
  if (private && check_private (path, &st) == -1)
    goto err;
  if (direct && check_direct (p) == -1)
    goto err;
  if (file_size (p, &st) == -1)
    goto err;

  /* One owner: the flock lives on this open file description, so it
   * survives nbdkit's fork into the background and is released by the
   * kernel whenever the process dies, however it dies.
   */
  if (flock (p->fd, LOCK_EX | LOCK_NB) == -1) {
    if (errno == EWOULDBLOCK)
      log_error ("ssdcache-file: cache file %s is in use by another process "
                 "(another nbdkit holds its lock)", path);
    else
      log_error ("ssdcache-file: cannot lock %s: %m", path);
    goto err;
  }
  return 0;

 err:
  pool_close (p);
  return -1;
}

int
pool_open (struct pool *p, const char *path, bool direct)
{
  return open_pool (p, path, direct, false, -1);
}

int
pool_open_private (struct pool *p, const char *path, bool direct)
{
  return open_pool (p, path, direct, true, -1);
}

int
pool_open_fd (struct pool *p, const char *path, int fd, bool direct)
{
  return open_pool (p, path, direct, false, fd);
}

int
pool_take_fd (struct pool *p)
{
  int fd = p->fd;

  p->fd = -1;
  return fd;
}

void
pool_close (struct pool *p)
{
  if (p->fd >= 0)
    close (p->fd);          /* also drops the flock */
  p->fd = -1;
  free (p->path);
  p->path = NULL;
  if (p->blk_locks) {
    for (int i = 0; i < POOL_BLOCK_LOCKS; i++)
      pthread_mutex_destroy (&p->blk_locks[i]);
    free (p->blk_locks);
    p->blk_locks = NULL;
  }
  free (p->pt_lines);
  free (p->pt_tags);
  p->pt_lines = NULL;
  p->pt_tags = NULL;
  p->direct = false;
}

/* What a cache file holds before its superblocks are decoded. */
enum content {
  CONTENT_ERROR = -1,         /* could not read it (logged) */
  CONTENT_BLANK,              /* nothing: empty, or zeroes (see below) */
  CONTENT_CACHE,              /* an ssdcache cache, maybe a damaged one */
  CONTENT_FOREIGN,            /* something else: never overwritten */
};

/* Does the start of the page-table region (right after the
 * superblocks, whatever the geometry) hold a valid page-table entry?
 * Returns 1, 0 or -1.
 */
static int
pt_start_entries (struct pool *p)
{
  uint8_t *buf;
  uint64_t n = LAYOUT_POOL_ALIGN - LAYOUT_PT_OFFSET;
  struct layout_entry e;
  int r = 0;

  if (p->dev_size <= LAYOUT_PT_OFFSET)
    return 0;
  if (n > p->dev_size - LAYOUT_PT_OFFSET)
    n = p->dev_size - LAYOUT_PT_OFFSET;
  buf = bounce_alloc (n);
  if (buf == NULL) {
    log_error ("malloc: %m");
    return -1;
  }
  if (pool_pread (p, buf, n, LAYOUT_PT_OFFSET) == -1) {
    log_error ("cache file %s: reading page table: %m", p->path);
    free (buf);
    return -1;
  }
  for (uint64_t i = 0; r == 0 && i + LAYOUT_ENTRY_SIZE <= n;
       i += LAYOUT_ENTRY_SIZE)
    r = layout_entry_decode (buf + i, LAYOUT_MAX_SECTORS, &e) == 0;
  free (buf);
  return r;
}

/* Are bytes [from, end of file) all zeroes?  Holes are skipped
 * (SEEK_DATA); on a block device only what lies before
 * LAYOUT_POOL_ALIGN is read (a whole device would take too long).
 * Returns 1, 0 with *at the first non-zero byte, or -1.
 */
static int
zero_from (struct pool *p, uint64_t from, uint64_t *at)
{
  uint64_t end = p->dev_size;
  uint8_t *buf = bounce_alloc (BOUNCE_MAX);

  if (buf == NULL) {
    log_error ("malloc: %m");
    return -1;
  }
  if (p->is_blockdev && end > LAYOUT_POOL_ALIGN)
    end = LAYOUT_POOL_ALIGN;
  while (from < end) {
    off_t d = p->is_blockdev ? (off_t) from : lseek (p->fd, from, SEEK_DATA);
    size_t n, z;

    if (d == -1 && errno == ENXIO)      /* only holes after from */
      break;
    if (d == -1)                        /* no SEEK_DATA: read it all */
      d = from;
    if ((uint64_t) d >= end)
      break;
    n = end - d < BOUNCE_MAX ? end - d : BOUNCE_MAX;
    if (pool_pread (p, buf, n, d) == -1) {
      log_error ("cache file %s: reading: %m", p->path);
      free (buf);
      return -1;
    }
    if ((z = layout_first_nonzero (buf, n)) < n) {
      *at = d + z;
      free (buf);
      return 0;
    }
    from = d + n;
  }
  free (buf);
  return 1;
}

/* head: the first LAYOUT_PT_OFFSET bytes of the file (zeroes past its
 * end).  Ours: a superblock magic in either copy, or a valid entry at
 * the start of the page table (superblocks damaged or wiped).  Blank:
 * no byte that is not zero.  Anything else is foreign; *at is its
 * first non-zero byte.
 */
static enum content
classify (struct pool *p, const uint8_t *head, uint64_t *at)
{
  int r;

  for (int i = 0; i < LAYOUT_SB_COUNT; i++)
    if (memcmp (head + i * LAYOUT_SB_SIZE, LAYOUT_MAGIC, 8) == 0)
      return CONTENT_CACHE;
  r = pt_start_entries (p);
  if (r != 0)
    return r == 1 ? CONTENT_CACHE : CONTENT_ERROR;
  if ((*at = layout_first_nonzero (head, LAYOUT_PT_OFFSET)) < LAYOUT_PT_OFFSET)
    return CONTENT_FOREIGN;
  r = zero_from (p, LAYOUT_PT_OFFSET, at);
  if (r == -1)
    return CONTENT_ERROR;
  return r ? CONTENT_BLANK : CONTENT_FOREIGN;
}

static void
refuse_foreign (struct pool *p, uint64_t at)
{
  p->foreign = true;
  log_error ("cache file %s is not an ssdcache cache (no superblock, no "
             "page table) and is not empty (byte %llu is not zero): "
             "refusing to use or overwrite it, even with "
             "ssdcache-reset=true; delete it if its contents are not "
             "needed, or choose another ssdcache-file",
             p->path, (unsigned long long) at);
}

int
pool_load_sb (struct pool *p)
{
  uint8_t *buf;
  struct layout_sb sb[2];
  const char *why[2] = { NULL, NULL };
  int ok[2], best = -1;
  uint64_t at = 0;
  enum content what;

  p->sb_damaged = false;
  p->foreign = false;
  if (p->dev_size == 0)
    return 0;
  buf = bounce_alloc (LAYOUT_PT_OFFSET);
  if (buf == NULL) {
    log_error ("malloc: %m");
    return -1;
  }
  memset (buf, 0, LAYOUT_PT_OFFSET);
  if (pool_pread (p, buf, p->dev_size < LAYOUT_PT_OFFSET ? p->dev_size
                  : LAYOUT_PT_OFFSET, 0) == -1) {
    log_error ("cache file %s: reading superblocks: %m", p->path);
    free (buf);
    return -1;
  }
  what = classify (p, buf, &at);
  if (what != CONTENT_CACHE) {
    free (buf);
    if (what == CONTENT_FOREIGN)
      refuse_foreign (p, at);
    return what == CONTENT_BLANK ? 0 : -1;
  }
  if (p->dev_size < LAYOUT_PT_OFFSET) {
    log_error ("cache file %s: too small to hold a cache (%llu bytes)",
               p->path, (unsigned long long) p->dev_size);
    free (buf);
    return -1;
  }
  if (layout_first_nonzero (buf, LAYOUT_PT_OFFSET) == LAYOUT_PT_OFFSET) {
    /* Zeroed superblocks in front of a page table: a damaged cache,
     * which may hold dirty data; never format over it unasked.
     */
    log_error ("cache file %s: both superblocks are zeroed, but the page "
               "table behind them is not: a damaged cache, not a new "
               "one", p->path);
    free (buf);
    return -1;
  }
  for (int i = 0; i < 2; i++) {
    const uint8_t *raw = buf + i * LAYOUT_SB_SIZE;

    ok[i] = layout_sb_decode (raw, &sb[i], &why[i]) == 0;
    if (!ok[i] && memcmp (raw, LAYOUT_MAGIC, 8) == 0 &&
        sb[i].version > LAYOUT_VERSION && layout_sb_crc_ok (raw)) {
      /* A newer filter's cache (its checksum holds, so this is not a
       * flipped bit): using the other, older copy would misread it, and
       * writing ours would destroy it.
       */
      log_error ("cache file %s: superblock copy %c is in format version "
                 "%u, newer than this filter supports (%u): use the newer "
                 "nbdkit-ssdcache-filter with it", p->path, 'A' + i,
                 sb[i].version, LAYOUT_VERSION);
      free (buf);
      return -1;
    }
    if (ok[i] && (best == -1 || sb[i].generation > sb[best].generation))
      best = i;
  }
  free (buf);
  if (best == -1) {
    log_error ("cache file %s: no valid superblock (copy A: %s; copy B: %s)",
               p->path, why[0], why[1]);
    return -1;
  }
  if (!ok[!best]) {
    /* The lost copy may have been the newer one: what the survivor says
     * about the last shutdown cannot be trusted.
     */
    p->sb_damaged = true;
    log_error ("cache file %s: superblock copy %c is damaged (%s); using "
               "copy %c (generation %llu) and recovering as after a crash",
               p->path, 'A' + !best, why[!best], 'A' + best,
               (unsigned long long) sb[best].generation);
  }
  p->sb = sb[best];
  pt_lines_clear (p);
  p->next_sb = !best;
  return 1;
}

/* FREE entries (sequence number 0) for slots [0, nslots). */
static int
write_free_entries (struct pool *p, uint64_t pt, uint64_t nslots)
{
  const uint64_t per = 16384;   /* entries per write (1 MiB) */
  struct layout_entry e;
  uint8_t *buf;

  buf = bounce_alloc (per * LAYOUT_ENTRY_SIZE);
  if (buf == NULL) {
    log_error ("malloc: %m");
    return -1;
  }
  memset (&e, 0, sizeof e);
  e.state = LAYOUT_FREE;
  layout_entry_encode (&e, buf);
  for (uint64_t i = 1; i < per; i++)
    memcpy (buf + i * LAYOUT_ENTRY_SIZE, buf, LAYOUT_ENTRY_SIZE);
  for (uint64_t s = 0; s < nslots; s += per) {
    uint64_t n = nslots - s < per ? nslots - s : per;
    if (pool_pwrite (p, buf, n * LAYOUT_ENTRY_SIZE,
                     pt + s * LAYOUT_ENTRY_SIZE) == -1) {
      log_error ("cache file %s: writing the page table: %m", p->path);
      free (buf);
      return -1;
    }
  }
  free (buf);
  return 0;
}

int
pool_format (struct pool *p, const struct layout_sb *sb_in)
{
  struct layout_sb sb = *sb_in;
  uint64_t pt, pool, total;
  int r;

  if (!layout_geometry (sb.page_size, sb.nslots, &pt, &pool, &total)) {
    log_error ("ssdcache-size: cache geometry overflows");
    return -1;
  }
  sb.pt_offset = pt;
  sb.pool_offset = pool;

  if (p->is_blockdev) {
    if (p->dev_size < total) {
      log_error ("ssdcache-size: device %s has %llu bytes, %llu needed",
                 p->path, (unsigned long long) p->dev_size,
                 (unsigned long long) total);
      return -1;
    }
  }
  else {
    /* Drop any old contents, then reserve the space so that the cache
     * cannot run out of room later.
     */
    if (ftruncate (p->fd, 0) == -1 || ftruncate (p->fd, total) == -1) {
      log_error ("cache file %s: cannot size to %llu bytes: %m",
                 p->path, (unsigned long long) total);
      return -1;
    }
    r = posix_fallocate (p->fd, 0, p->sparse ? pool : total);
    if (r == ENOSPC) {
      log_error ("ssdcache-size: not enough space for %s (%llu bytes)",
                 p->path, (unsigned long long) total);
      if (ftruncate (p->fd, 0) == -1)
        log_debug ("cache file %s: ftruncate: %m", p->path);
      return -1;
    }
    if (r != 0 && r != EOPNOTSUPP && r != EINVAL)
      log_debug ("cache file %s: fallocate: %s", p->path, strerror (r));
    p->dev_size = total;
  }
  /* A FREE entry in every slot (the superblock says so), so that an
   * entry that reads as zeroes later is known to be damage.
   */
  if (write_free_entries (p, pt, sb.nslots) == -1)
    return -1;
  sb.flags |= LAYOUT_SB_PTINIT;

  /* Both copies, same generation: either one is a valid start. */
  p->next_sb = 0;
  sb.generation = 0;
  if (pool_write_sb (p, &sb) == -1)
    return -1;
  sb.generation--;
  return pool_write_sb (p, &sb);
}

int
pool_write_sb (struct pool *p, struct layout_sb *sb)
{
  uint8_t *buf = bounce_alloc (LAYOUT_SB_SIZE);

  if (buf == NULL) {
    log_error ("malloc: %m");
    return -1;
  }
  sb->generation++;
  layout_sb_encode (sb, buf);
  if (pool_pwrite (p, buf, LAYOUT_SB_SIZE,
                   (off_t) p->next_sb * LAYOUT_SB_SIZE) == -1 ||
      fdatasync (p->fd) == -1) {
    log_error ("cache file %s: writing superblock: %m", p->path);
    free (buf);
    return -1;
  }
  free (buf);
  p->sb = *sb;
  p->next_sb ^= 1;
  pt_lines_clear (p);
  return 0;
}

int
pool_read_entries (struct pool *p, uint64_t first, uint64_t n, void *buf)
{
  uint64_t off = p->sb.pt_offset + first * LAYOUT_ENTRY_SIZE;

  if (n == 1 && pt_block (p, ALIGN_DOWN (off, POOL_DIRECT_ALIGN)))
    return pt_read_entry (p, buf, off);
  return pool_pread (p, buf, n * LAYOUT_ENTRY_SIZE, off);
}

int
pool_write_entries (struct pool *p, uint64_t first, uint64_t n,
                    const void *buf)
{
  return pool_pwrite (p, buf, n * LAYOUT_ENTRY_SIZE,
                      p->sb.pt_offset + first * LAYOUT_ENTRY_SIZE);
}

_Atomic unsigned pool_test_fail_entry_writes;

int
pool_write_entry (struct pool *p, uint64_t slot, const struct layout_entry *e)
{
  uint8_t buf[LAYOUT_ENTRY_SIZE];
  unsigned n = atomic_load (&pool_test_fail_entry_writes);

  while (n > 0)
    if (atomic_compare_exchange_weak (&pool_test_fail_entry_writes, &n,
                                      n - 1)) {
      errno = EIO;
      return -1;
    }
  layout_entry_encode (e, buf);
  return pool_pwrite (p, buf, sizeof buf,
                      p->sb.pt_offset + slot * LAYOUT_ENTRY_SIZE);
}

int
pool_read_data (struct pool *p, uint64_t slot, void *buf,
                uint32_t count, uint32_t offset)
{
  return pool_pread (p, buf, count,
                     p->sb.pool_offset + slot * p->sb.page_size + offset);
}

int
pool_write_data (struct pool *p, uint64_t slot, const void *buf,
                 uint32_t count, uint32_t offset)
{
  return pool_pwrite (p, buf, count,
                      p->sb.pool_offset + slot * p->sb.page_size + offset);
}

int
pool_sync (struct pool *p)
{
  return fdatasync (p->fd);
}

int
pool_remove_file (const char *path)
{
  int fd = open (path, O_RDWR | O_NOFOLLOW | O_CLOEXEC), r = -1;
  struct stat st;

  if (fd == -1)
    return -1;
  if (flock (fd, LOCK_EX | LOCK_NB) == 0 && fstat (fd, &st) == 0) {
    if (S_ISREG (st.st_mode))
      r = unlink (path);
    else
      errno = EINVAL;
  }
  close (fd);                   /* (drops the lock) */
  return r;
}

void
pool_punch_slot (struct pool *p, uint32_t slot)
{
  if (!p->sparse || p->is_blockdev)
    return;
  if (fallocate (p->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                 p->sb.pool_offset + (uint64_t) slot * p->sb.page_size,
                 p->sb.page_size) == -1)
    log_debug ("cache file %s: punching slot %u: %m", p->path, slot);
}

/* A 0 or 1 read from a sysfs file, else -1. */
static int
read_flag (const char *path)
{
  char buf[8] = "";
  FILE *fp = fopen (path, "r");
  int r = -1;

  if (fp == NULL)
    return -1;
  if (fgets (buf, sizeof buf, fp) != NULL && (buf[0] == '0' || buf[0] == '1'))
    r = buf[0] - '0';
  fclose (fp);
  return r;
}

int
pool_rotational (const struct pool *p)
{
  struct stat st;
  char path[96];
  unsigned maj, min;
  int r;

  if (fstat (p->fd, &st) == -1)
    return -1;
  maj = major (S_ISBLK (st.st_mode) ? st.st_rdev : st.st_dev);
  min = minor (S_ISBLK (st.st_mode) ? st.st_rdev : st.st_dev);
  if (maj == 0)                 /* an anonymous device: no queue */
    return -1;
  snprintf (path, sizeof path, "/sys/dev/block/%u:%u/queue/rotational",
            maj, min);
  r = read_flag (path);
  if (r == -1) {                /* a partition: its disk's queue */
    snprintf (path, sizeof path,
              "/sys/dev/block/%u:%u/../queue/rotational", maj, min);
    r = read_flag (path);
  }
  return r;
}
