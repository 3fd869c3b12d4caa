/* nbdkit-ssdcache-filter: the cache file (page pool and its metadata).
 *
 * Owns the cache file descriptor, its one-owner lock and all positioned
 * I/O on it.  See pool.h for the locking rules.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

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

int
pool_open (struct pool *p, const char *path)
{
  struct stat st;

  memset (p, 0, sizeof *p);
  p->fd = -1;
  p->path = strdup (path);
  if (p->path == NULL) {
    log_error ("strdup: %m");
    return -1;
  }

  p->fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (p->fd == -1) {
    log_error ("ssdcache-file: cannot open %s: %m", path);
    goto err;
  }
  if (fstat (p->fd, &st) == -1) {
    log_error ("ssdcache-file: fstat: %s: %m", path);
    goto err;
  }
  if (S_ISBLK (st.st_mode)) {
    p->is_blockdev = true;
    if (ioctl (p->fd, BLKGETSIZE64, &p->dev_size) == -1) {
      log_error ("ssdcache-file: %s: cannot get device size: %m", path);
      goto err;
    }
  }
  else if (S_ISREG (st.st_mode))
    p->dev_size = st.st_size;
  else {
    log_error ("ssdcache-file: %s is not a regular file or block device",
               path);
    goto err;
  }

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

void
pool_close (struct pool *p)
{
  if (p->fd >= 0)
    close (p->fd);          /* also drops the flock */
  p->fd = -1;
  free (p->path);
  p->path = NULL;
}

static bool
all_zero (const uint8_t *b, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (b[i])
      return false;
  return true;
}

/* Does the start of the page-table region (right after the
 * superblocks, whatever the geometry) hold anything?  Used when both
 * superblocks read as zeroes: a new cache, or one whose superblocks
 * were wiped.  Returns 1 (something there), 0 (all zeroes) or -1.
 */
static int
pt_start_used (struct pool *p)
{
  uint8_t *buf;
  uint64_t n = LAYOUT_POOL_ALIGN - LAYOUT_PT_OFFSET;
  int r;

  if (p->dev_size <= LAYOUT_PT_OFFSET)
    return 0;
  if (n > p->dev_size - LAYOUT_PT_OFFSET)
    n = p->dev_size - LAYOUT_PT_OFFSET;
  buf = malloc (n);
  if (buf == NULL) {
    log_error ("malloc: %m");
    return -1;
  }
  if (full_pread (p->fd, buf, n, LAYOUT_PT_OFFSET) == -1) {
    log_error ("cache file %s: reading page table: %m", p->path);
    free (buf);
    return -1;
  }
  r = !all_zero (buf, n);
  free (buf);
  return r;
}

int
pool_load_sb (struct pool *p)
{
  uint8_t *buf;
  struct layout_sb sb[2];
  const char *why[2] = { NULL, NULL };
  int ok[2], best = -1;

  p->sb_damaged = false;
  if (p->dev_size < LAYOUT_PT_OFFSET) {
    if (p->dev_size == 0)
      return 0;
    log_error ("cache file %s: too small to hold a cache (%llu bytes)",
               p->path, (unsigned long long) p->dev_size);
    return -1;
  }
  buf = malloc (LAYOUT_PT_OFFSET);
  if (buf == NULL) {
    log_error ("malloc: %m");
    return -1;
  }
  if (full_pread (p->fd, buf, LAYOUT_PT_OFFSET, 0) == -1) {
    log_error ("cache file %s: reading superblocks: %m", p->path);
    free (buf);
    return -1;
  }
  if (all_zero (buf, LAYOUT_PT_OFFSET)) {
    int used;

    free (buf);
    /* Zeroes everywhere: a new (or pre-zeroed) file.  Zeroed
     * superblocks in front of a page table: a damaged cache, which may
     * hold dirty data; never format over it unasked.
     */
    used = pt_start_used (p);
    if (used == 0)
      return 0;
    if (used == 1)
      log_error ("cache file %s: both superblocks are zeroed, but the page "
                 "table behind them is not: a damaged cache, not a new "
                 "one", p->path);
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

  buf = malloc (per * LAYOUT_ENTRY_SIZE);
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
    if (full_pwrite (p->fd, buf, n * LAYOUT_ENTRY_SIZE,
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
    r = posix_fallocate (p->fd, 0, total);
    if (r == ENOSPC) {
      log_error ("ssdcache-size: not enough space for %s (%llu bytes)",
                 p->path, (unsigned long long) total);
      ftruncate (p->fd, 0);
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
  uint8_t *buf = malloc (LAYOUT_SB_SIZE);

  if (buf == NULL) {
    log_error ("malloc: %m");
    return -1;
  }
  sb->generation++;
  layout_sb_encode (sb, buf);
  if (full_pwrite (p->fd, buf, LAYOUT_SB_SIZE,
                   (off_t) p->next_sb * LAYOUT_SB_SIZE) == -1 ||
      fdatasync (p->fd) == -1) {
    log_error ("cache file %s: writing superblock: %m", p->path);
    free (buf);
    return -1;
  }
  free (buf);
  p->sb = *sb;
  p->next_sb ^= 1;
  return 0;
}

int
pool_read_entries (struct pool *p, uint64_t first, uint64_t n, void *buf)
{
  return full_pread (p->fd, buf, n * LAYOUT_ENTRY_SIZE,
                     p->sb.pt_offset + first * LAYOUT_ENTRY_SIZE);
}

int
pool_write_entries (struct pool *p, uint64_t first, uint64_t n,
                    const void *buf)
{
  return full_pwrite (p->fd, buf, n * LAYOUT_ENTRY_SIZE,
                      p->sb.pt_offset + first * LAYOUT_ENTRY_SIZE);
}

int
pool_write_entry (struct pool *p, uint64_t slot, const struct layout_entry *e)
{
  uint8_t buf[LAYOUT_ENTRY_SIZE];

  layout_entry_encode (e, buf);
  return full_pwrite (p->fd, buf, sizeof buf,
                      p->sb.pt_offset + slot * LAYOUT_ENTRY_SIZE);
}

int
pool_read_data (struct pool *p, uint64_t slot, void *buf,
                uint32_t count, uint32_t offset)
{
  return full_pread (p->fd, buf, count,
                     p->sb.pool_offset + slot * p->sb.page_size + offset);
}

int
pool_write_data (struct pool *p, uint64_t slot, const void *buf,
                 uint32_t count, uint32_t offset)
{
  return full_pwrite (p->fd, buf, count,
                      p->sb.pool_offset + slot * p->sb.page_size + offset);
}

int
pool_sync (struct pool *p)
{
  return fdatasync (p->fd);
}
