/* SPDX-License-Identifier: BSD-3-Clause */
/* ssdcache tool: reading a cache file, read only (see cachefile.h).
 *
 * Owns the tool's reader: the file is opened O_RDONLY and never
 * locked, so a running nbdkit is not disturbed.  The decisions follow
 * the filter's, step by step, so that what check says agrees with
 * what the next start does:
 *   - cf_open: what the file holds (pool.c: classify), which
 *     superblock copy is used (pool_load_sb), whether it is as long as
 *     its geometry (open.c: check_size);
 *   - cf_scan: each entry as recover.c's parse_entry sees it, and for
 *     check each sealed slot's data checksum (cache_page_crc);
 *   - cf_recover: each page's candidates as recover.c's pick_page
 *     picks among them (torn_by_crash, older_after_drop, free_loser).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "cachefile.h"
#include "ssdcache.h"

#define CHUNK_ENTRIES 16384     /* entries read at a time (1 MiB) */
#define ENT_CRC_OFF (LAYOUT_ENTRY_SIZE - 4)

/*----------------------------------------------------------------------
 * Small helpers.
 */

static void *
xrealloc (void *p, size_t n)
{
  p = realloc (p, n ? n : 1);
  if (p == NULL) {
    tool_error ("out of memory");
    exit (TOOL_EXIT_ERROR);
  }
  return p;
}

static char *
xvasprintf (const char *fs, va_list ap)
{
  char *s;

  if (vasprintf (&s, fs, ap) == -1) {
    tool_error ("out of memory");
    exit (TOOL_EXIT_ERROR);
  }
  return s;
}

static uint32_t
get32 (const uint8_t *p)
{
  return p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 |
    (uint32_t) p[3] << 24;
}

static uint64_t
get64 (const uint8_t *p)
{
  return get32 (p) | (uint64_t) get32 (p + 4) << 32;
}

/* count bytes at off.  With zero_tail, bytes past the end of the file
 * read as zeroes; without, a short read fails with EIO.
 */
static int
read_at (int fd, void *buf, size_t count, uint64_t off, bool zero_tail)
{
  uint8_t *b = buf;

  while (count > 0) {
    ssize_t r = pread (fd, b, count, off);

    if (r == -1 && errno == EINTR)
      continue;
    if (r == -1)
      return -1;
    if (r == 0) {
      if (!zero_tail) {
        errno = EIO;
        return -1;
      }
      memset (b, 0, count);
      return 0;
    }
    b += r;
    count -= r;
    off += r;
  }
  return 0;
}

const char *
cf_mode_name (uint32_t mode)
{
  switch (mode) {
  case LAYOUT_MODE_WRITETHROUGH: return "writethrough";
  case LAYOUT_MODE_WRITEAROUND: return "writearound";
  case LAYOUT_MODE_WRITEBACK: return "writeback";
  default: return "unknown";
  }
}

const char *
cf_state_name (int state)
{
  switch (state) {
  case LAYOUT_FREE: return "free";
  case LAYOUT_CLEAN: return "clean";
  case LAYOUT_DIRTY: return "dirty";
  default: return "unknown";
  }
}

/*----------------------------------------------------------------------
 * Problems.
 */

static struct cf_problem *
add_problem (struct cachefile *cf, enum cf_kind kind, int64_t slot,
             const char *fs, ...)
  __attribute__ ((format (printf, 4, 5)));

static struct cf_problem *
add_problem (struct cachefile *cf, enum cf_kind kind, int64_t slot,
             const char *fs, ...)
{
  struct cf_problem *p;
  va_list ap;

  if (cf->nprob == CF_PROBLEMS_MAX) {
    /* Counted, not kept. */
    p = &cf->spare;
    free (p->msg);
    free (p->risk);
    memset (p, 0, sizeof *p);
    p->kind = kind;
    p->slot = p->last_slot = slot;
    p->state = -1;
    cf->nprob_more++;
    va_start (ap, fs);
    p->msg = xvasprintf (fs, ap);
    va_end (ap);
    return p;
  }
  if (cf->nprob == cf->prob_cap) {
    cf->prob_cap = cf->prob_cap ? 2 * cf->prob_cap : 16;
    cf->prob = xrealloc (cf->prob, cf->prob_cap * sizeof *cf->prob);
  }
  p = &cf->prob[cf->nprob];
  memset (p, 0, sizeof *p);
  p->kind = kind;
  p->order = cf->nprob++;
  p->slot = p->last_slot = slot;
  p->state = -1;
  va_start (ap, fs);
  p->msg = xvasprintf (fs, ap);
  va_end (ap);
  return p;
}

/* Dirty data of page (in slot s) at risk: why. */
static void
set_risk (struct cachefile *cf, struct cf_problem *p, uint64_t page,
          bool page_known, const char *fs, ...)
  __attribute__ ((format (printf, 5, 6)));

static void
set_risk (struct cachefile *cf, struct cf_problem *p, uint64_t page,
          bool page_known, const char *fs, ...)
{
  va_list ap;

  p->has_page = true;
  p->page = page;
  p->page_known = page_known;
  p->state = LAYOUT_DIRTY;
  va_start (ap, fs);
  p->risk = xvasprintf (fs, ap);
  va_end (ap);
  cf->at_risk++;
}

/* "page P (bytes A-B)" of a page whose number is known. */
#define PAGE_FMT "page %" PRIu64 " (bytes %" PRIu64 "-%" PRIu64 ")"
#define PAGE_ARGS(cf, page) (page), (page) * (cf)->sb.page_size, \
    ((page) + 1) * (cf)->sb.page_size - 1

static int
cmp_problem (const void *a, const void *b)
{
  const struct cf_problem *x = a, *y = b;

  if (x->slot != y->slot)
    return x->slot < y->slot ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

/*----------------------------------------------------------------------
 * Opening: what the file is.
 */

/* The process holding a flock on the file (the filter's one-owner
 * lock), from /proc/locks: its pid, 0 if none, -1 if that cannot be
 * told.  Only looks: the lock is never taken.
 */
static pid_t
lock_holder (const struct stat *st)
{
  FILE *fp = fopen ("/proc/locks", "re");
  char line[256];
  pid_t pid = 0;

  if (fp == NULL)
    return -1;
  while (pid == 0 && fgets (line, sizeof line, fp)) {
    char type[16];
    int p;
    unsigned maj, min;
    unsigned long long ino;

    /* "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; a waiter
     * has "->" before FLOCK (and is skipped).
     */
    if (sscanf (line, "%*d: %15s %*s %*s %d %x:%x:%llu",
                type, &p, &maj, &min, &ino) == 5 &&
        strcmp (type, "FLOCK") == 0 &&
        maj == major (st->st_dev) && min == minor (st->st_dev) &&
        ino == st->st_ino)
      pid = p > 0 ? p : -1;
  }
  fclose (fp);
  return pid;
}

/* Open read only (O_NONBLOCK: a FIFO must not block us) and find the
 * size.  Returns 0, or -1 (reported).
 */
static int
open_file (struct cachefile *cf)
{
  struct stat st;

  cf->fd = open (cf->path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (cf->fd == -1) {
    tool_error ("%s: cannot open: %s", cf->path, strerror (errno));
    return -1;
  }
  if (fstat (cf->fd, &st) == -1) {
    tool_error ("%s: fstat: %s", cf->path, strerror (errno));
    return -1;
  }
  if (S_ISDIR (st.st_mode)) {
    tool_error ("%s: is a directory, not a cache file", cf->path);
    return -1;
  }
  if (S_ISBLK (st.st_mode)) {
    cf->is_blockdev = true;
    if (ioctl (cf->fd, BLKGETSIZE64, &cf->size) == -1) {
      tool_error ("%s: cannot get the device size: %s", cf->path,
                  strerror (errno));
      return -1;
    }
  }
  else if (S_ISREG (st.st_mode))
    cf->size = st.st_size;
  else {
    tool_error ("%s: not a regular file or block device, so not a cache "
                "file", cf->path);
    return -1;
  }
  cf->locked_by = lock_holder (&st);
  return 0;
}

/* Does the start of the page-table region hold a valid entry, as the
 * filter asks of a file with no superblock magic?  Sets *nonzero to
 * the first non-zero byte seen there (or UINT64_MAX).  Returns 1, 0,
 * or -1 (reported).
 */
static int
pt_start_entries (struct cachefile *cf, uint64_t *nonzero)
{
  uint64_t n = LAYOUT_POOL_ALIGN - LAYOUT_PT_OFFSET;
  struct layout_entry e;
  uint8_t *buf;
  int r = 0;

  *nonzero = UINT64_MAX;
  if (cf->size <= LAYOUT_PT_OFFSET)
    return 0;
  if (n > cf->size - LAYOUT_PT_OFFSET)
    n = cf->size - LAYOUT_PT_OFFSET;
  buf = xrealloc (NULL, n);
  if (read_at (cf->fd, buf, n, LAYOUT_PT_OFFSET, true) == -1) {
    tool_error ("%s: reading: %s", cf->path, strerror (errno));
    free (buf);
    return -1;
  }
  for (uint64_t i = 0; r == 0 && i + LAYOUT_ENTRY_SIZE <= n;
       i += LAYOUT_ENTRY_SIZE)
    r = layout_entry_decode (buf + i, LAYOUT_MAX_SECTORS, &e) == 0;
  for (uint64_t i = 0; i < n && *nonzero == UINT64_MAX; i++)
    if (buf[i])
      *nonzero = LAYOUT_PT_OFFSET + i;
  free (buf);
  return r;
}

/* Is it a cache (magic in either copy, or a page table behind wiped
 * superblocks)?  Returns 1, or 0 / -1 (reported).
 */
static int
is_cache (struct cachefile *cf, const uint8_t *head)
{
  uint64_t at = UINT64_MAX;
  int r;

  for (int i = 0; i < LAYOUT_SB_COUNT; i++)
    if (memcmp (head + i * LAYOUT_SB_SIZE, LAYOUT_MAGIC, 8) == 0)
      return 1;
  if (cf->size == 0) {
    tool_error ("%s: not an ssdcache cache file: it is empty", cf->path);
    return 0;
  }
  r = pt_start_entries (cf, &at);
  if (r != 0)
    return r;
  for (uint64_t i = 0; i < LAYOUT_PT_OFFSET; i++)
    if (head[i]) {
      at = i;
      break;
    }
  if (at == UINT64_MAX && cf->size <= LAYOUT_POOL_ALIGN)
    tool_error ("%s: not an ssdcache cache file: it holds only zeroes",
                cf->path);
  else if (at == UINT64_MAX)
    tool_error ("%s: not an ssdcache cache file: no superblock, no page "
                "table, and its first %d bytes are all zeroes", cf->path,
                LAYOUT_POOL_ALIGN);
  else
    tool_error ("%s: not an ssdcache cache file: no superblock (neither "
                "copy has the magic %s) and no page table (byte %" PRIu64
                " is not zero)", cf->path, LAYOUT_MAGIC, at);
  return 0;
}

/* A copy in a newer format (its checksum holds, so this is not a
 * flipped bit): the filter refuses the file, and so do we.
 */
static bool
newer_format (struct cachefile *cf, const uint8_t *head)
{
  for (int i = 0; i < LAYOUT_SB_COUNT; i++) {
    const uint8_t *raw = head + i * LAYOUT_SB_SIZE;

    if (memcmp (raw, LAYOUT_MAGIC, 8) == 0 &&
        get32 (raw + 8) > LAYOUT_VERSION && layout_sb_crc_ok (raw)) {
      tool_error ("%s: superblock copy %c is in format version %" PRIu32
                  ", newer than this tool supports (%d): use the ssdcache "
                  "tool of the newer nbdkit-ssdcache-filter", cf->path,
                  'A' + i, get32 (raw + 8), LAYOUT_VERSION);
      return true;
    }
  }
  return false;
}

/* Decode both copies and pick the one a start uses: the valid copy
 * with the highest generation (the first on a tie).
 */
static void
pick_superblock (struct cachefile *cf, const uint8_t *head)
{
  for (int i = 0; i < LAYOUT_SB_COUNT; i++) {
    const uint8_t *raw = head + i * LAYOUT_SB_SIZE;

    cf->sb_ok[i] = layout_sb_decode (raw, &cf->sbs[i], &cf->sb_why[i]) == 0;
    /* A newer version field with a bad checksum is damage, not news. */
    if (!cf->sb_ok[i] && memcmp (raw, LAYOUT_MAGIC, 8) == 0 &&
        !layout_sb_crc_ok (raw))
      cf->sb_why[i] = "superblock checksum mismatch";
    if (cf->sb_ok[i] && (cf->used == -1 || cf->sbs[i].generation >
                         cf->sbs[cf->used].generation))
      cf->used = i;
  }
}

/* The superblocks: CF_OK with cf->sb set, CF_NO_SB, or CF_ERROR. */
static enum cf_status
load_superblocks (struct cachefile *cf, const uint8_t *head)
{
  int other;

  if (layout_first_nonzero (head, LAYOUT_PT_OFFSET) == LAYOUT_PT_OFFSET) {
    cf->sb_why[0] = cf->sb_why[1] = "all zeroes";
    add_problem (cf, CF_P_NO_SUPERBLOCK, -1, "both superblocks are "
                 "zeroed, but the page table behind them is not: a damaged "
                 "cache, which a start refuses");
    return CF_NO_SB;
  }
  if (newer_format (cf, head))
    return CF_ERROR;
  pick_superblock (cf, head);
  if (cf->used == -1) {
    add_problem (cf, CF_P_NO_SUPERBLOCK, -1, "no valid superblock (copy "
                 "A: %s; copy B: %s): a start refuses this file",
                 cf->sb_why[0], cf->sb_why[1]);
    return CF_NO_SB;
  }
  cf->sb = cf->sbs[cf->used];
  other = !cf->used;
  if (!cf->sb_ok[other])
    add_problem (cf, CF_P_SUPERBLOCK, -1, "superblock copy %c is damaged "
                 "(%s): a start uses copy %c (generation %" PRIu64 ") and "
                 "recovers as after a crash", 'A' + other,
                 cf->sb_why[other], 'A' + cf->used, cf->sb.generation);
  cf->was_clean = (cf->sb.flags & LAYOUT_SB_CLEAN) && cf->sb_ok[other];
  return CF_OK;
}

/* Is the file as long as its geometry says (open.c: check_size)?
 * Cut short inside the pool: the slots from data_end on have lost
 * their data.  Shorter: CF_ERROR, as a start refuses it.
 */
static enum cf_status
check_size (struct cachefile *cf)
{
  uint64_t pt, pool, total;
  const uint32_t ps = cf->sb.page_size;

  if (!layout_geometry (ps, cf->sb.nslots, &pt, &pool, &total))
    return CF_ERROR;            /* cannot happen: checked at decode */
  cf->total = total;
  cf->nsectors = ps / cf->sb.sector_size;
  cf->npages = cf->sb.backend_size / ps + (cf->sb.backend_size % ps != 0);
  cf->data_end = cf->sb.nslots;
  if (cf->size >= total)
    return CF_OK;
  if (cf->is_blockdev) {
    tool_error ("%s: the device has %" PRIu64 " bytes, but the cache on "
                "it needs %" PRIu64, cf->path, cf->size, total);
    return CF_ERROR;
  }
  if (cf->size < pool) {
    tool_error ("%s: truncated: %" PRIu64 " bytes, but its page table "
                "alone ends at byte %" PRIu64 " (of %" PRIu64 "): its "
                "entries are lost, and a start refuses it", cf->path,
                cf->size, pt + cf->sb.nslots * LAYOUT_ENTRY_SIZE, total);
    return CF_ERROR;
  }
  cf->data_end = (cf->size - pool) / ps;
  add_problem (cf, CF_P_TRUNCATED, -1, "the file is truncated: %" PRIu64
               " of %" PRIu64 " bytes; the data of slots %" PRIu64 " and "
               "up is gone: a start drops their entries and extends the "
               "file back", cf->size, total, cf->data_end);
  return CF_OK;
}

enum cf_status
cf_open (struct cachefile *cf, const char *path)
{
  uint8_t head[LAYOUT_PT_OFFSET];
  enum cf_status st;

  memset (cf, 0, sizeof *cf);
  cf->path = path;
  cf->fd = -1;
  cf->used = -1;
  if (open_file (cf) == -1)
    return CF_ERROR;
  if (read_at (cf->fd, head, sizeof head, 0, true) == -1) {
    tool_error ("%s: reading the superblocks: %s", path, strerror (errno));
    return CF_ERROR;
  }
  if (is_cache (cf, head) != 1)
    return CF_ERROR;
  if (cf->size < LAYOUT_PT_OFFSET) {
    tool_error ("%s: truncated: %" PRIu64 " bytes, too small to hold a "
                "cache (the superblocks alone take %d)", path, cf->size,
                LAYOUT_PT_OFFSET);
    return CF_ERROR;
  }
  st = load_superblocks (cf, head);
  if (st != CF_OK)
    return st;
  return check_size (cf);
}

/*----------------------------------------------------------------------
 * Scanning: every entry, as recover.c's parse_entry sees it.
 */

struct scan {
  struct cachefile *cf;
  bool check_data;
  uint8_t *page;                /* one page of data */
  uint8_t *zero;                /* one sector of zeroes */
};

/* The data checksum as the filter computes it (slot.c:
 * cache_page_crc): sectors not valid count as zeroes.
 */
static uint32_t
page_crc (const struct scan *sc, const uint8_t *valid)
{
  const struct cachefile *cf = sc->cf;
  const uint32_t ss = cf->sb.sector_size;
  uint32_t crc = 0;

  for (unsigned i = 0; i < cf->nsectors; i++) {
    const uint8_t *p = layout_bit_test (valid, i)
      ? sc->page + (size_t) i * ss : sc->zero;
    crc = layout_crc32c_update (crc, p, ss);
  }
  return crc;
}

static struct cf_cand *
add_cand (struct cachefile *cf, const struct layout_entry *e, uint64_t s)
{
  struct cf_cand *c;
  unsigned nd = 0;

  if (cf->ncand == cf->cand_cap) {
    cf->cand_cap = cf->cand_cap ? 2 * cf->cand_cap : 1024;
    cf->cand = xrealloc (cf->cand, cf->cand_cap * sizeof *cf->cand);
  }
  for (size_t i = 0; i < sizeof e->dirty; i++)
    nd += __builtin_popcount (e->dirty[i]);
  c = &cf->cand[cf->ncand++];
  c->page = e->page;
  c->seq = e->seq;
  c->slot = s;
  c->state = e->state;
  c->ndirty = nd;
  c->unsealed = e->flags & LAYOUT_ENT_UNSEALED;
  c->data_ok = true;
  c->data_errno = 0;
  return c;
}

/* Extend the previous problem, damaged entries up to slot s - 1 for
 * the same reason whose bytes name no page, to slot s.
 */
static bool
extend_entry_run (struct cachefile *cf, uint64_t s, const char *why)
{
  struct cf_problem *p = cf->nprob ? &cf->prob[cf->nprob - 1] : NULL;

  if (p == NULL || p->kind != CF_P_ENTRY || p->has_page ||
      p->last_slot != (int64_t) s - 1 || p->reason != why)
    return false;
  p->last_slot = s;
  free (p->msg);
  if (asprintf (&p->msg, "slots %" PRId64 "-%" PRIu64 ": %" PRIu64
                " entries fail their checks (%s): a start drops them",
                p->slot, s, s - p->slot + 1, why) == -1) {
    tool_error ("out of memory");
    exit (TOOL_EXIT_ERROR);
  }
  return true;
}

/* The entry raw of slot s does not decode.  All zeroes is an unused
 * slot unless every entry was written when the cache was made;
 * anything else is damage.  What the bytes say is not to be trusted,
 * but a dirty state byte is worth naming.
 */
static void
damaged_entry (struct cachefile *cf, uint64_t s, const uint8_t *raw)
{
  const bool zero =
    layout_first_nonzero (raw, LAYOUT_ENTRY_SIZE) == LAYOUT_ENTRY_SIZE;
  const int state = raw[52];
  const uint64_t page = get64 (raw);
  const char *why;
  struct cf_problem *p;

  if (zero && !(cf->sb.flags & LAYOUT_SB_PTINIT)) {
    cf->n_free++;
    return;
  }
  cf->n_damaged++;
  cf->rec.damaged_entries++;
  cf->rec.dropped_entries++;
  if (cf->sb.flags & LAYOUT_SB_DIRTY)
    cf->damaged_entries_may_dirty++;
  why = zero ? "all zeroes"
    : get32 (raw + ENT_CRC_OFF) != layout_crc32c (raw, ENT_CRC_OFF)
    ? "checksum mismatch" : "invalid contents, though its checksum holds";
  if (zero || (state != LAYOUT_CLEAN && state != LAYOUT_DIRTY)) {
    if (extend_entry_run (cf, s, why))
      return;
    p = add_problem (cf, CF_P_ENTRY, s, "slot %" PRIu64 ": entry fails its "
                     "checks (%s): a start drops it", s, why);
    p->reason = why;
    return;
  }
  p = add_problem (cf, CF_P_ENTRY, s, "slot %" PRIu64 ": entry fails its "
                   "checks (%s; as read, unverified: %s page %" PRIu64
                   "): a start drops it", s, why, cf_state_name (state),
                   page);
  p->reason = why;
  p->has_page = true;
  p->page = page;
  p->state = state;
  if (state == LAYOUT_DIRTY)
    set_risk (cf, p, page, false, "slot %" PRIu64 ": page %" PRIu64
              " (as read, unverified: the entry is damaged): a start drops "
              "its dirty data; the page then reads as an older cached copy "
              "or the backend's data", s, page);
}

/* A sealed entry whose page lies past the backend's end: dropped. */
static void
past_backend (struct cachefile *cf, uint64_t s, const struct layout_entry *e)
{
  cf->rec.dropped_entries++;
  add_problem (cf, CF_P_PAST_BACKEND, s, "slot %" PRIu64 ": %s page %"
               PRIu64 " lies past the end of the backend (%" PRIu64
               " pages): a start drops the entry", s,
               cf_state_name (e->state), e->page, cf->npages);
}

/* A sealed entry whose data was cut off with the end of the file. */
static void
cut_off (struct cachefile *cf, uint64_t s, const struct layout_entry *e)
{
  struct cf_problem *p;

  cf->rec.dropped_entries++;
  p = add_problem (cf, CF_P_CUT, s, "slot %" PRIu64 ": %s page %" PRIu64
                   ": its data lay past the end of the truncated file: a "
                   "start drops it", s, cf_state_name (e->state), e->page);
  p->has_page = p->page_known = true;
  p->page = e->page;
  p->state = e->state;
  if (e->state == LAYOUT_DIRTY) {
    cf->rec.dirty_dropped++;
    set_risk (cf, p, e->page, true, "slot %" PRIu64 ": " PAGE_FMT ": its "
              "data was cut off with the end of the file: DIRTY DATA LOST "
              "at the next start", s, PAGE_ARGS (cf, e->page));
  }
}

/* Read and check the data of candidate c (entry e). */
static void
verify_data (struct scan *sc, struct cf_cand *c, const struct layout_entry *e)
{
  struct cachefile *cf = sc->cf;
  const uint64_t off = cf->sb.pool_offset +
    (uint64_t) c->slot * cf->sb.page_size;

  cf->data_checked++;
  if (read_at (cf->fd, sc->page, cf->sb.page_size, off, false) == -1) {
    c->data_ok = false;
    c->data_errno = errno ? errno : EIO;
  }
  else
    c->data_ok = page_crc (sc, e->valid) == e->data_crc;
  if (!c->data_ok)
    cf->data_bad++;
}

/* An unsealed entry: no data checksum to check.  Recovery never uses
 * it (it only tells that a newer version existed); in a cache closed
 * cleanly there should be none.
 */
static void
unsealed_entry (struct scan *sc, uint64_t s, const struct layout_entry *e)
{
  struct cachefile *cf = sc->cf;
  struct cf_problem *p;

  cf->n_unsealed++;
  cf->rec.unsealed_dropped++;
  if (e->state == LAYOUT_DIRTY)
    cf->n_unsealed_dirty++;
  if (sc->check_data)
    cf->data_unsealed++;
  if (e->page < cf->npages)
    add_cand (cf, e, s);
  if (!cf->was_clean)
    return;
  p = add_problem (cf, CF_P_UNSEALED, s, "slot %" PRIu64 ": %s page %"
                   PRIu64 " is unsealed in a cache closed cleanly: a start "
                   "drops it", s, cf_state_name (e->state), e->page);
  if (e->state == LAYOUT_DIRTY)
    set_risk (cf, p, e->page, true, "slot %" PRIu64 ": " PAGE_FMT ": "
              "unsealed dirty data in a cache closed cleanly: dropped at "
              "the next start", s, PAGE_ARGS (cf, e->page));
}

static void
scan_entry (struct scan *sc, uint64_t s, const uint8_t *raw)
{
  struct cachefile *cf = sc->cf;
  struct layout_entry e;
  struct cf_cand *c;

  if (layout_entry_decode (raw, cf->nsectors, &e) == -1) {
    damaged_entry (cf, s, raw);
    return;
  }
  if (e.state == LAYOUT_FREE) {
    cf->n_free++;
    return;
  }
  if (e.flags & LAYOUT_ENT_UNSEALED) {
    unsealed_entry (sc, s, &e);
    return;
  }
  if (e.state == LAYOUT_DIRTY)
    cf->n_dirty++;
  else
    cf->n_clean++;
  if (e.page >= cf->npages)
    past_backend (cf, s, &e);
  else if (s >= cf->data_end)
    cut_off (cf, s, &e);
  else {
    c = add_cand (cf, &e, s);
    if (sc->check_data)
      verify_data (sc, c, &e);
  }
}

int
cf_scan (struct cachefile *cf, bool check_data)
{
  struct scan sc = { .cf = cf, .check_data = check_data };
  uint8_t *raw = xrealloc (NULL, CHUNK_ENTRIES * LAYOUT_ENTRY_SIZE);
  int ret = 0;

  cf->rec.clean_start = cf->was_clean;
  if (check_data) {
    sc.page = xrealloc (NULL, cf->sb.page_size);
    sc.zero = calloc (1, cf->sb.sector_size);
    if (sc.zero == NULL) {
      tool_error ("out of memory");
      exit (TOOL_EXIT_ERROR);
    }
  }
  for (uint64_t base = 0; base < cf->sb.nslots && ret == 0;
       base += CHUNK_ENTRIES) {
    uint64_t n = cf->sb.nslots - base < CHUNK_ENTRIES
      ? cf->sb.nslots - base : CHUNK_ENTRIES;

    if (read_at (cf->fd, raw, n * LAYOUT_ENTRY_SIZE,
                 cf->sb.pt_offset + base * LAYOUT_ENTRY_SIZE, false) == -1) {
      tool_error ("%s: reading the page table: %s", cf->path,
                  strerror (errno));
      ret = -1;
    }
    for (uint64_t k = 0; k < n && ret == 0; k++)
      scan_entry (&sc, base + k, raw + k * LAYOUT_ENTRY_SIZE);
  }
  free (raw);
  free (sc.page);
  free (sc.zero);
  return ret;
}

/*----------------------------------------------------------------------
 * Pages: candidates by page, newest first (recover.c: cmp_cand).
 */

static int
cmp_cand (const void *a, const void *b)
{
  const struct cf_cand *x = a, *y = b;

  if (x->page != y->page)
    return x->page < y->page ? -1 : 1;
  return x->seq > y->seq ? -1 : x->seq < y->seq;
}

static void
sort_cands (struct cachefile *cf)
{
  if (cf->ncand > 0)            /* (qsort must not get a null array) */
    qsort (cf->cand, cf->ncand, sizeof *cf->cand, cmp_cand);
}

/* The end of the run of candidates of cand[i]'s page. */
static size_t
page_end (const struct cachefile *cf, size_t i)
{
  size_t j = i;

  while (j < cf->ncand && cf->cand[j].page == cf->cand[i].page)
    j++;
  return j;
}

void
cf_pages (struct cachefile *cf)
{
  sort_cands (cf);
  for (size_t i = 0; i < cf->ncand;) {
    const size_t j = page_end (cf, i);
    const struct cf_cand *c = &cf->cand[i];

    cf->pages++;
    if (c->state == LAYOUT_DIRTY) {
      cf->dirty_pages++;
      cf->dirty_bytes += (uint64_t) c->ndirty * cf->sb.sector_size;
    }
    cf->older_versions += j - i - 1;
    i = j;
  }
}

/*----------------------------------------------------------------------
 * Recovery: per page, as recover.c's pick_page.
 */

/* Why candidate c's data failed. */
static const char *
data_why (const struct cf_cand *c)
{
  return c->data_errno ? strerror (c->data_errno)
    : "data checksum mismatch";
}

static struct cf_problem *
data_problem (struct cachefile *cf, const struct cf_cand *c,
              const char *what)
{
  struct cf_problem *p;

  p = add_problem (cf, CF_P_DATA, c->slot, "slot %" PRIu32 ": %s page %"
                   PRIu64 ": %s%s: %s", c->slot, cf_state_name (c->state),
                   c->page, c->data_errno ? "its data cannot be read: " : "",
                   data_why (c), what);
  p->has_page = p->page_known = true;
  p->page = c->page;
  p->state = c->state;
  return p;
}

/* torn_by_crash: after an unclean shutdown, a dirty candidate about to
 * win must have data that verifies; one that does not is dropped and
 * the next older candidate tried.  The only candidate of its page is
 * checked on first use instead (lazily): a start loads it, and the
 * first use finds it torn (a verify failure) and drops it.
 */
static bool
torn (struct cachefile *cf, const struct cf_cand *c, bool lazily)
{
  struct cf_problem *p;

  if (c->state != LAYOUT_DIRTY || cf->was_clean || c->data_ok)
    return false;
  cf->rec.dirty_dropped++;
  if (lazily) {
    cf->rec.loaded_slots++;
    cf->rec.verify_failures++;
  }
  p = data_problem (cf, c, lazily
                    ? "after an unclean shutdown (a write torn by the "
                    "crash, never flushed, or damaged data) its first use "
                    "drops it and uses the backend's data"
                    : "after an unclean shutdown (a write torn by the "
                    "crash, never flushed, or damaged data) a start drops "
                    "it and uses the next older version or the backend's "
                    "data");
  set_risk (cf, p, c->page, true, "slot %" PRIu32 ": " PAGE_FMT ": %s: "
            "DIRTY DATA LOST at the next %s", c->slot,
            PAGE_ARGS (cf, c->page), data_why (c),
            lazily ? "use" : "start");
  return true;
}

/* free_loser: an older version than the page's winner. */
static void
loser (struct cachefile *cf, const struct cf_cand *c)
{
  cf->rec.dropped_entries++;
  if (!c->data_ok)
    data_problem (cf, c, "an older version, which a start frees anyway "
                  "(nothing is lost)");
}

/* older_after_drop: the newest usable version, but a newer one was
 * dropped (unsealed or torn).  A clean one goes (the backend may be
 * newer); a dirty one keeps its dirty sectors, if its data verifies.
 */
static void
after_drop (struct cachefile *cf, const struct cf_cand *c)
{
  struct cf_problem *p;

  if (c->state != LAYOUT_DIRTY) {
    cf->rec.dropped_entries++;
    if (!c->data_ok)
      data_problem (cf, c, "a newer version was dropped, so a start drops "
                    "this one anyway (nothing is lost)");
    return;
  }
  if (!c->data_ok) {
    cf->rec.dropped_entries++;
    p = data_problem (cf, c, "a newer unflushed version was dropped, and a "
                      "start drops this one too");
    set_risk (cf, p, c->page, true, "slot %" PRIu32 ": " PAGE_FMT ": %s: "
              "dirty data lost at the next start", c->slot,
              PAGE_ARGS (cf, c->page), data_why (c));
    return;
  }
  cf->rec.loaded_slots++;
  cf->rec.dirty_pages++;
}

/* take_winner: kept.  Its data is checked on first use (a dirty one
 * already at start after an unclean shutdown, in torn).
 */
static void
winner (struct cachefile *cf, const struct cf_cand *c)
{
  struct cf_problem *p;

  cf->rec.loaded_slots++;
  if (c->state == LAYOUT_DIRTY)
    cf->rec.dirty_pages++;
  if (c->data_ok)
    return;
  cf->rec.verify_failures++;
  if (c->state != LAYOUT_DIRTY) {
    data_problem (cf, c, "it is dropped on first use and read from the "
                  "backend again (nothing is lost)");
    return;
  }
  p = data_problem (cf, c, "reads of it will fail with EIO (dirty_lost)");
  set_risk (cf, p, c->page, true, "slot %" PRIu32 ": " PAGE_FMT ": %s: "
            "reads of it fail with EIO", c->slot, PAGE_ARGS (cf, c->page),
            data_why (c));
}

/* One page: its candidates are cand[i, j), newest first. */
static void
recover_page (struct cachefile *cf, size_t i, size_t j)
{
  bool won = false, newer_dropped = false;

  for (size_t k = i; k < j; k++) {
    const struct cf_cand *c = &cf->cand[k];

    if (c->unsealed) {
      newer_dropped |= !won;
      continue;
    }
    if (!won && torn (cf, c, j - i == 1)) {
      newer_dropped = true;
      continue;
    }
    if (won) {
      loser (cf, c);
      continue;
    }
    won = true;
    if (newer_dropped)
      after_drop (cf, c);
    else
      winner (cf, c);
  }
}

void
cf_recover (struct cachefile *cf)
{
  sort_cands (cf);
  for (size_t i = 0; i < cf->ncand;) {
    const size_t j = page_end (cf, i);

    recover_page (cf, i, j);
    i = j;
  }
  if (cf->nprob > 0)
    qsort (cf->prob, cf->nprob, sizeof *cf->prob, cmp_problem);
}

void
cf_close (struct cachefile *cf)
{
  if (cf->fd >= 0)
    close (cf->fd);
  cf->fd = -1;
  for (size_t i = 0; i < cf->nprob; i++) {
    free (cf->prob[i].msg);
    free (cf->prob[i].risk);
  }
  free (cf->prob);
  free (cf->cand);
  free (cf->spare.msg);
  free (cf->spare.risk);
  memset (&cf->spare, 0, sizeof cf->spare);
  cf->prob = NULL;
  cf->cand = NULL;
  cf->nprob = cf->ncand = 0;
}
