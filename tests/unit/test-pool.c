/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: the cache file's I/O (pool.c),
 * above all direct I/O (ssdcache-direct=true).
 *
 * This program defines its own pread, pwrite and open, which the pool
 * code linked into it calls instead of the C library's: on a descriptor
 * opened with O_DIRECT they count every call whose offset, length or
 * buffer is not aligned to POOL_DIRECT_ALIGN (the kernel only enforces
 * the device's logical block, often 512, so it would not catch them),
 * and open can be told to refuse O_DIRECT as tmpfs once did.
 *
 * Tests: the span arithmetic of pool_split_span; O_DIRECT really set;
 * random data reads and writes at any offset, length and buffer
 * alignment against a model, with no unaligned call; concurrent writes
 * of different page-table entries of the same 4 KiB blocks (none may
 * be lost); the refusal of a file system without direct I/O.
 *
 * What is a cache: a blank file is a new one; a file holding anything
 * without a superblock or page-table entry is foreign (never to be
 * overwritten); a cache with wiped superblocks is still one.
 *
 * The default cache file (pool_open_private) must be the user's own
 * regular file, not a symbolic link, not writable by others.
 *
 * Deferred slot writes (defer.c): queued writes are not made by the
 * caller; every read or write of a slot sees the writes queued for it
 * before, in order; pool_sync and defer_stop write the queue out; a
 * failed queued write fails every later slot read and write, and is
 * reported once; threads doing all of that on their own slots at once,
 * buffered and direct, end with the file equal to their models.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "defer.h"
#include "layout.h"
#include "log-stderr.h"
#include "pool.h"
#include "testfile.h"

/* -- the C library, watched --------------------------------------------- */

static atomic_uint unaligned_calls;   /* on O_DIRECT descriptors */
static atomic_uint direct_calls;      /* all calls on O_DIRECT descriptors */
static atomic_bool refuse_direct;     /* open: EINVAL for O_DIRECT */
static atomic_int fail_fd = -1;       /* pwrite: EIO on this descriptor */
static _Thread_local unsigned my_pwrites;   /* this thread's pwrites */
/* open: just before opening swap_to, rename swap_from over it (once):
 * a file replaced between pool_open_private's lstat and its open.
 */
static const char *swap_from, *swap_to;
static unsigned opens_of_other;   /* open: calls naming other_path */
static const char *other_path;

static void
check_call (int fd, const void *buf, size_t count, off_t off)
{
  int fl = fcntl (fd, F_GETFL);

  if (fl == -1 || !(fl & O_DIRECT))
    return;
  atomic_fetch_add (&direct_calls, 1);
  if ((uintptr_t) buf % POOL_DIRECT_ALIGN || count % POOL_DIRECT_ALIGN ||
      off % POOL_DIRECT_ALIGN) {
    atomic_fetch_add (&unaligned_calls, 1);
    fprintf (stderr, "unaligned direct I/O: buf %p count %zu off %lld\n",
             buf, count, (long long) off);
  }
}

ssize_t
pread (int fd, void *buf, size_t count, off_t off)
{
  static ssize_t (*real) (int, void *, size_t, off_t);

  if (real == NULL)
    real = dlsym (RTLD_NEXT, "pread");
  check_call (fd, buf, count, off);
  return real (fd, buf, count, off);
}

ssize_t
pwrite (int fd, const void *buf, size_t count, off_t off)
{
  static ssize_t (*real) (int, const void *, size_t, off_t);

  if (real == NULL)
    real = dlsym (RTLD_NEXT, "pwrite");
  check_call (fd, buf, count, off);
  my_pwrites++;
  if (fd == atomic_load (&fail_fd)) {
    errno = EIO;
    return -1;
  }
  return real (fd, buf, count, off);
}

int
open (const char *path, int flags, ...)
{
  static int (*real) (const char *, int, ...);
  mode_t mode = 0;

  if (real == NULL)
    real = dlsym (RTLD_NEXT, "open");
  if (flags & O_CREAT) {
    va_list ap;
    va_start (ap, flags);
    mode = va_arg (ap, mode_t);
    va_end (ap);
  }
  if (other_path && strcmp (path, other_path) == 0)
    opens_of_other++;
  if (swap_to && strcmp (path, swap_to) == 0) {
    assert_int_equal (rename (swap_from, swap_to), 0);
    swap_to = NULL;
  }
  if ((flags & O_DIRECT) && atomic_load (&refuse_direct)) {
    errno = EINVAL;
    return -1;
  }
  return real (path, flags, mode);
}

/* -- helpers ------------------------------------------------------------ */

#define PS 65536u                /* page size */
#define NSLOTS 256u              /* 4 blocks of entries */

static void
format (struct pool *p, bool direct)
{
  struct layout_sb sb;

  memset (&sb, 0, sizeof sb);
  sb.version = LAYOUT_VERSION;
  sb.page_size = PS;
  sb.sector_size = layout_sector_size (PS);
  sb.nslots = NSLOTS;
  sb.backend_size = (uint64_t) PS * 1000;
  strcpy (sb.id_text, "pool unit test");
  assert_int_equal (pool_open (p, testfile_path, direct), 0);
  assert_int_equal (pool_format (p, &sb), 0);
}

static void
reset_counts (void)
{
  atomic_store (&unaligned_calls, 0);
  atomic_store (&direct_calls, 0);
}

/* -- tests --------------------------------------------------------------- */

static void
check_span (uint64_t off, uint64_t len,
            uint64_t ho, uint64_t hl, uint64_t mo, uint64_t ml,
            uint64_t to, uint64_t tl)
{
  struct pool_span sp;

  pool_split_span (off, len, 4096, &sp);
  if (sp.head_len != hl || sp.mid_len != ml || sp.tail_len != tl ||
      (hl && sp.head_off != ho) || (ml && sp.mid_off != mo) ||
      (tl && sp.tail_off != to))
    fail_msg ("split(%llu, %llu): head %llu+%llu mid %llu+%llu tail "
              "%llu+%llu", (unsigned long long) off, (unsigned long long) len,
              (unsigned long long) sp.head_off,
              (unsigned long long) sp.head_len,
              (unsigned long long) sp.mid_off,
              (unsigned long long) sp.mid_len,
              (unsigned long long) sp.tail_off,
              (unsigned long long) sp.tail_len);
}

static void
test_split_span (void **state)
{
  /* aligned: all middle */
  check_span (8192, 8192,        0, 0,  8192, 8192,  0, 0);
  /* one entry inside a block */
  check_span (8192 + 64, 64,     8256, 64,  0, 0,  0, 0);
  /* starts aligned, ends inside the block: a tail only */
  check_span (4096, 100,         0, 0,  0, 0,  4096, 100);
  /* ends at a block end: a head only */
  check_span (4000, 96,          4000, 96,  0, 0,  0, 0);
  /* both edges, nothing whole between */
  check_span (4000, 200,         4000, 96,  0, 0,  4096, 104);
  /* both edges and whole blocks */
  check_span (1, 3 * 4096,       1, 4095,  4096, 8192,  12288, 1);
  /* first block partial, then whole */
  check_span (512, 4096 - 512 + 8192,  512, 3584,  4096, 8192,  0, 0);
  /* empty */
  check_span (4097, 0,           0, 0,  0, 0,  0, 0);
  /* the sum of the parts is always the span, in order */
  srandom (1);
  for (int i = 0; i < 100000; i++) {
    uint64_t off = random () % (1 << 20), len = random () % (1 << 18);
    struct pool_span sp;
    uint64_t pos = off;

    pool_split_span (off, len, 4096, &sp);
    if (sp.head_len) {
      assert_int_equal (sp.head_off, pos);
      assert_true (sp.head_off % 4096 != 0);
      assert_true (sp.head_off / 4096 ==
                   (sp.head_off + sp.head_len - 1) / 4096);
      pos += sp.head_len;
    }
    if (sp.mid_len) {
      assert_int_equal (sp.mid_off, pos);
      assert_int_equal (sp.mid_off % 4096, 0);
      assert_int_equal (sp.mid_len % 4096, 0);
      pos += sp.mid_len;
    }
    if (sp.tail_len) {
      assert_int_equal (sp.tail_off, pos);
      assert_int_equal (sp.tail_off % 4096, 0);
      assert_true (sp.tail_len < 4096);
      pos += sp.tail_len;
    }
    assert_int_equal (pos, off + len);
  }
}

static void
test_direct_flag (void **state)
{
  struct pool p;
  int fl;

  format (&p, false);
  fl = fcntl (p.fd, F_GETFL);
  assert_false (fl & O_DIRECT);
  pool_close (&p);

  reset_counts ();
  assert_int_equal (pool_open (&p, testfile_path, true), 0);
  fl = fcntl (p.fd, F_GETFL);
  assert_true (fl & O_DIRECT);
  assert_int_equal (pool_load_sb (&p), 1);
  assert_int_equal (p.sb.nslots, NSLOTS);
  pool_close (&p);
  assert_true (atomic_load (&direct_calls) > 0);
  assert_int_equal (atomic_load (&unaligned_calls), 0);
}

/* Random data I/O at any offset, length and buffer alignment, against
 * a model; then the file itself is compared with the model.
 */
static void
test_direct_data (void **state)
{
  struct pool p;
  size_t total = (size_t) NSLOTS * PS;
  uint8_t *model = calloc (1, total);
  uint8_t *mem = NULL, *chk = malloc (PS);
  int fd;

  assert_non_null (model);
  assert_non_null (chk);
  assert_int_equal (posix_memalign ((void **) &mem, 4096, 2 * PS + 8192), 0);
  reset_counts ();
  format (&p, true);
  srandom (42);
  for (int i = 0; i < 4000; i++) {
    uint32_t s = random () % NSLOTS;
    uint32_t off, n;
    uint8_t *buf = mem + random () % 8192;   /* any memory alignment */

    switch (random () % 4) {
    case 0:                    /* whole, aligned */
      off = (random () % (PS / 4096)) * 4096;
      n = 4096 * (1 + random () % ((PS - off) / 4096));
      break;
    case 1:                    /* small: an entry-sized piece, a sector */
      off = random () % PS;
      n = 1 + random () % 600;
      if (n > PS - off)
        n = PS - off;
      break;
    default:                   /* anything */
      off = random () % PS;
      n = 1 + random () % (PS - off);
      break;
    }
    if (random () % 2) {
      for (uint32_t k = 0; k < n; k++)
        buf[k] = random ();
      assert_int_equal (pool_write_data (&p, s, buf, n, off), 0);
      memcpy (model + (size_t) s * PS + off, buf, n);
    }
    else {
      assert_int_equal (pool_read_data (&p, s, buf, n, off), 0);
      if (memcmp (buf, model + (size_t) s * PS + off, n) != 0)
        fail_msg ("read %u bytes at %u of slot %u: wrong data", n, off, s);
    }
  }
  assert_int_equal (atomic_load (&unaligned_calls), 0);
  assert_true (atomic_load (&direct_calls) > 4000);
  pool_close (&p);

  /* What reached the file, through a buffered descriptor. */
  fd = open (testfile_path, O_RDONLY);
  assert_true (fd >= 0);
  {
    struct pool q;
    assert_int_equal (pool_open (&q, testfile_path, false), 0);
    assert_int_equal (pool_load_sb (&q), 1);
    for (uint32_t s = 0; s < NSLOTS; s++) {
      assert_int_equal (pread (fd, chk, PS, q.sb.pool_offset +
                               (uint64_t) s * PS), PS);
      if (memcmp (chk, model + (size_t) s * PS, PS) != 0)
        fail_msg ("slot %u on the file differs from the model", s);
    }
    pool_close (&q);
  }
  close (fd);
  free (mem);
  free (chk);
  free (model);
}

/* Threads write entries of their own slots, all in the same 4 KiB
 * blocks (64 entries a block), again and again; at the end every entry
 * must hold its owner's last write.  A read-modify-write of the block
 * that is not serialised loses some of them.  A reader meanwhile reads
 * single entries (served from the page-table lines): no slot's
 * sequence number may go back.
 */
#define NTHREADS 8
#define ROUNDS 300

static struct pool shared_pool;

/* The entry these tests write for slot s: page 1000 + s, clean. */
static struct layout_entry
test_entry (uint32_t s, uint64_t seq)
{
  struct layout_entry e;

  memset (&e, 0, sizeof e);
  e.page = 1000 + s;
  e.seq = seq;
  e.state = LAYOUT_CLEAN;
  e.valid[0] = 1;
  return e;
}

static void *
entry_writer (void *arg)
{
  unsigned t = (uintptr_t) arg;

  for (unsigned r = 1; r <= ROUNDS; r++)
    for (uint32_t s = t; s < NSLOTS; s += NTHREADS) {
      struct layout_entry e = test_entry (s, r);

      if (pool_write_entry (&shared_pool, s, &e) != 0)
        return (void *) 1;
    }
  return NULL;
}

static atomic_bool writers_done;

static void *
entry_reader (void *arg)
{
  uint64_t last[NSLOTS] = { 0 };
  uint32_t nsectors = PS / layout_sector_size (PS);

  while (!atomic_load (&writers_done))
    for (uint32_t s = 0; s < NSLOTS; s++) {
      uint8_t raw[LAYOUT_ENTRY_SIZE];
      struct layout_entry e;

      if (pool_read_entries (&shared_pool, s, 1, raw) != 0 ||
          layout_entry_decode (raw, nsectors, &e) != 0)
        return (void *) 1;
      if (e.seq < last[s] || (e.seq > 0 && e.page != 1000 + s))
        return (void *) 2;
      last[s] = e.seq;
    }
  return NULL;
}

static void
test_direct_entries_concurrent (void **state)
{
  pthread_t th[NTHREADS], rd;
  void *rr;
  uint8_t raw[NSLOTS * LAYOUT_ENTRY_SIZE];
  uint32_t nsectors = PS / layout_sector_size (PS);

  reset_counts ();
  format (&shared_pool, true);
  atomic_store (&writers_done, false);
  assert_int_equal (pthread_create (&rd, NULL, entry_reader, NULL), 0);
  for (uintptr_t t = 0; t < NTHREADS; t++)
    assert_int_equal (pthread_create (&th[t], NULL, entry_writer,
                                      (void *) t), 0);
  for (int t = 0; t < NTHREADS; t++) {
    void *r;
    pthread_join (th[t], &r);
    assert_null (r);
  }
  atomic_store (&writers_done, true);
  pthread_join (rd, &rr);
  assert_null (rr);
  assert_int_equal (pool_read_entries (&shared_pool, 0, NSLOTS, raw), 0);
  for (uint32_t s = 0; s < NSLOTS; s++) {
    struct layout_entry e;
    if (layout_entry_decode (raw + s * LAYOUT_ENTRY_SIZE, nsectors, &e) != 0)
      fail_msg ("entry %u does not decode", s);
    if (e.page != 1000 + s || e.seq != ROUNDS)
      fail_msg ("entry %u: page %llu seq %llu, expected page %u seq %u "
                "(an update was lost)", s, (unsigned long long) e.page,
                (unsigned long long) e.seq, 1000 + s, ROUNDS);
  }
  assert_int_equal (atomic_load (&unaligned_calls), 0);
  pool_close (&shared_pool);
}

/* Direct I/O keeps the page-table blocks it reads or patches (pool.h,
 * lines): a lone entry read is served from its block's line, a patch
 * updates the line, a whole-block write and a new superblock drop it,
 * and a patch that fails leaves no line the file does not match.
 */
static void
put_entry (struct pool *p, uint32_t s, uint64_t seq, int want)
{
  struct layout_entry e = test_entry (s, seq);

  assert_int_equal (pool_write_entry (p, s, &e), want);
}

static uint64_t
entry_seq (struct pool *p, uint32_t s)
{
  uint8_t raw[LAYOUT_ENTRY_SIZE];
  struct layout_entry e;

  assert_int_equal (pool_read_entries (p, s, 1, raw), 0);
  assert_int_equal (layout_entry_decode (raw, PS / layout_sector_size (PS),
                                         &e), 0);
  assert_int_equal (e.page, 1000 + s);
  return e.seq;
}

static void
test_direct_pt_lines (void **state)
{
  static uint8_t blk[64 * LAYOUT_ENTRY_SIZE]
    __attribute__ ((aligned (POOL_DIRECT_ALIGN)));
  struct pool p;

  format (&p, true);
  put_entry (&p, 5, 1, 0);
  reset_counts ();
  assert_int_equal (entry_seq (&p, 5), 1);      /* the patch kept the line */
  put_entry (&p, 6, 2, 0);
  assert_int_equal (entry_seq (&p, 6), 2);
  assert_int_equal (atomic_load (&direct_calls), 1);     /* one pwrite */

  for (uint32_t s = 0; s < 64; s++) {           /* block 0, entry by entry */
    struct layout_entry e = test_entry (s, 7);
    layout_entry_encode (&e, blk + s * LAYOUT_ENTRY_SIZE);
  }
  assert_int_equal (pool_write_entries (&p, 0, 64, blk), 0);
  assert_int_equal (entry_seq (&p, 5), 7);

  atomic_store (&fail_fd, p.fd);
  put_entry (&p, 5, 9, -1);
  atomic_store (&fail_fd, -1);
  assert_int_equal (entry_seq (&p, 5), 7);

  assert_int_equal (pool_write_sb (&p, &p.sb), 0);
  reset_counts ();
  assert_int_equal (entry_seq (&p, 6), 7);
  assert_int_equal (atomic_load (&direct_calls), 1);     /* read again */
  assert_int_equal (entry_seq (&p, 6), 7);
  assert_int_equal (atomic_load (&direct_calls), 1);
  assert_int_equal (atomic_load (&unaligned_calls), 0);
  pool_close (&p);
}

static void
test_direct_refused (void **state)
{
  struct pool p;

  log_errors_forget ();
  atomic_store (&refuse_direct, true);
  assert_int_equal (pool_open (&p, testfile_path, true), -1);
  atomic_store (&refuse_direct, false);
  assert_true (log_errors_contain ("ssdcache-direct:"));
  assert_true (log_errors_contain ("does not support direct I/O"));
  assert_int_equal (p.fd, -1);
  /* Without direct I/O the same file opens. */
  assert_int_equal (pool_open (&p, testfile_path, false), 0);
  pool_close (&p);
}

/* -- what is a cache (pool_load_sb) ----------------------------------------- */

/* Write n bytes of b at off of the test file. */
static void
put (const void *b, size_t n, off_t off)
{
  int fd = open (testfile_path, O_WRONLY);

  assert_true (fd >= 0);
  assert_int_equal (pwrite (fd, b, n, off), (ssize_t) n);
  close (fd);
}

/* pool_load_sb on the test file as it is: its result and p.foreign. */
static int
load (bool direct, bool *foreign)
{
  struct pool p;
  int r;

  log_errors_forget ();
  assert_int_equal (pool_open (&p, testfile_path, direct), 0);
  r = pool_load_sb (&p);
  *foreign = p.foreign;
  pool_close (&p);
  return r;
}

/* Blank (empty, zeroes, holes) is a new cache; a file with anything
 * else that has neither a superblock nor a valid page-table entry at
 * its start is foreign, wherever its first non-zero byte is; a cache
 * whose superblocks are zeroed or overwritten is still a cache.
 */
static void
check_contents (bool direct)
{
  uint8_t junk[LAYOUT_PT_OFFSET];
  struct pool p;
  bool foreign;

  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (uint8_t) (i * 7 + 1);
  reset_counts ();
  assert_int_equal (truncate (testfile_path, 0), 0);
  assert_int_equal (load (direct, &foreign), 0);
  assert_int_equal (truncate (testfile_path, 100), 0);
  assert_int_equal (load (direct, &foreign), 0);        /* 100 zeroes */
  assert_int_equal (truncate (testfile_path, 8 << 20), 0);
  assert_int_equal (load (direct, &foreign), 0);        /* holes */
  put ("x", 1, 5 << 20);
  assert_int_equal (load (direct, &foreign), -1);
  assert_true (foreign);
  assert_true (log_errors_contain ("byte 5242880 is not zero"));
  assert_true (log_errors_contain ("delete it"));
  assert_int_equal (truncate (testfile_path, 0), 0);
  put (junk, 100, 0);
  assert_int_equal (load (direct, &foreign), -1);
  assert_true (foreign);
  assert_int_equal (truncate (testfile_path, 0), 0);
  assert_int_equal (truncate (testfile_path, 4 << 20), 0);
  put (junk, sizeof junk, LAYOUT_PT_OFFSET);            /* no entry */
  assert_int_equal (load (direct, &foreign), -1);
  assert_true (foreign);

  assert_int_equal (truncate (testfile_path, 0), 0);
  format (&p, direct);
  pool_close (&p);
  memset (junk, 0, sizeof junk);
  put (junk, sizeof junk, 0);                           /* wiped */
  assert_int_equal (load (direct, &foreign), -1);
  assert_false (foreign);
  assert_true (log_errors_contain ("both superblocks are zeroed"));
  memset (junk, 0xa5, sizeof junk);
  put (junk, sizeof junk, 0);                           /* overwritten */
  assert_int_equal (load (direct, &foreign), -1);
  assert_false (foreign);
  assert_true (log_errors_contain ("no valid superblock"));
  assert_int_equal (atomic_load (&unaligned_calls), 0);
}

static void
test_contents (void **state)
{
  check_contents (false);
}

static void
test_contents_direct (void **state)
{
  check_contents (true);
}

/* -- the default cache file (pool_open_private) ----------------------------- */

/* pool_open_private: a symbolic link, a FIFO (not even opened), a file
 * others can write, a file of another uid (as root), and a file
 * replaced by either between the lstat and the open are refused; the
 * user's own file, or a missing one (created 0600), is opened.
 */
static void
test_private (void **state)
{
  char lnk[sizeof testfile_path + 8], other[sizeof testfile_path + 8];
  struct pool p;
  struct stat st;
  int fd;

  snprintf (lnk, sizeof lnk, "%s.link", testfile_path);
  snprintf (other, sizeof other, "%s.other", testfile_path);
  assert_int_equal (pool_open_private (&p, testfile_path, false), 0);
  pool_close (&p);

  assert_int_equal (symlink (testfile_path, lnk), 0);
  log_errors_forget ();
  assert_int_equal (pool_open_private (&p, lnk, false), -1);
  assert_true (log_errors_contain ("is a symbolic link"));
  assert_int_equal (pool_open (&p, lnk, false), 0);     /* given: trusted */
  pool_close (&p);
  unlink (lnk);

  /* A FIFO (or a device) is not even opened. */
  assert_int_equal (mkfifo (other, 0600), 0);
  log_errors_forget ();
  other_path = other;
  opens_of_other = 0;
  assert_int_equal (pool_open_private (&p, other, false), -1);
  assert_int_equal (opens_of_other, 0);
  other_path = NULL;
  assert_true (log_errors_contain ("default cache file"));
  assert_true (log_errors_contain ("is not a regular file"));
  unlink (other);

  assert_int_equal (chmod (testfile_path, 0620), 0);
  log_errors_forget ();
  assert_int_equal (pool_open_private (&p, testfile_path, false), -1);
  assert_true (log_errors_contain ("writable by group or others"));
  assert_int_equal (chmod (testfile_path, 0600), 0);

  if (geteuid () == 0) {
    assert_int_equal (chown (testfile_path, 65534, -1), 0);
    log_errors_forget ();
    assert_int_equal (pool_open_private (&p, testfile_path, false), -1);
    assert_true (log_errors_contain ("is owned by uid 65534"));
    assert_int_equal (chown (testfile_path, 0, -1), 0);
  }

  /* Replaced between the lstat and the open: by a symbolic link
   * (O_NOFOLLOW refuses it), by a file others can write (the check
   * after the open refuses it).
   */
  fd = open (other, O_WRONLY | O_CREAT | O_EXCL, 0600);
  assert_true (fd >= 0);
  close (fd);
  assert_int_equal (symlink (other, lnk), 0);
  swap_from = lnk;
  swap_to = testfile_path;
  log_errors_forget ();
  assert_int_equal (pool_open_private (&p, testfile_path, false), -1);
  assert_null (swap_to);
  assert_true (log_errors_contain ("is a symbolic link"));
  assert_int_equal (unlink (testfile_path), 0);
  fd = open (testfile_path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  assert_true (fd >= 0);
  close (fd);
  assert_int_equal (chmod (other, 0606), 0);
  swap_from = other;
  swap_to = testfile_path;
  log_errors_forget ();
  assert_int_equal (pool_open_private (&p, testfile_path, false), -1);
  assert_null (swap_to);
  assert_true (log_errors_contain ("writable by group or others"));

  unlink (testfile_path);
  assert_int_equal (pool_open_private (&p, testfile_path, false), 0);
  assert_int_equal (fstat (p.fd, &st), 0);
  assert_int_equal (st.st_mode & 0077, 0);
  pool_close (&p);
}

/* -- deferred slot writes (defer.c) -------------------------------------- */

static atomic_uint defer_errors;
static atomic_ullong defer_error_slot;

static void
count_error (void *opaque, uint64_t slot, int err)
{
  assert_int_equal (err, EIO);
  atomic_fetch_add (&defer_errors, 1);
  atomic_store (&defer_error_slot, slot);
}

static void
fill_bytes (uint8_t *b, uint32_t n, unsigned seed)
{
  for (uint32_t i = 0; i < n; i++)
    b[i] = (uint8_t) (seed * 131 + i * 7 + (i >> 8));
}

/* Read slot s bytes [off, off+n) from the file itself, past the queue. */
static void
file_read (struct pool *p, uint64_t s, void *buf, uint32_t n, uint32_t off)
{
  assert_int_equal (pool_pread (p, buf, n, p->sb.pool_offset + s * PS + off),
                    0);
}

/* Queued writes are not the caller's; reads and writes of the slot
 * see them, in order; other slots are not held up by them.
 */
static void
test_defer_order (void **state)
{
  struct pool p;
  struct defer d;
  struct stats st;
  uint8_t a[1000], b[300], c[PS], got[PS];
  unsigned before;

  memset (&st, 0, sizeof st);
  format (&p, testfile_direct ());
  assert_int_equal (defer_start (&d, &p, &st, count_error, NULL), 0);
  assert_true (atomic_load (&d.active));

  /* Two overlapping writes to slot 3, one to slot 4: none by us. */
  fill_bytes (a, sizeof a, 1);
  fill_bytes (b, sizeof b, 2);
  before = my_pwrites;
  assert_int_equal (defer_write_data_later (&d, &p, 3, a, sizeof a, 100), 0);
  assert_int_equal (defer_write_data_later (&d, &p, 3, b, sizeof b, 900), 0);
  assert_int_equal (defer_write_data_later (&d, &p, 4, b, sizeof b, 0), 0);
  assert_int_equal (my_pwrites, before);
  assert_int_equal (STATS_GET (&st, writes_deferred), 3);

  /* Read at once: the queued writes come first, the later one on top. */
  assert_int_equal (defer_read_data (&d, &p, 3, got, 1200, 0), 0);
  for (uint32_t i = 0; i < 1200; i++) {
    uint8_t want = i < 100 ? 0 : i < 900 ? a[i - 100] : b[i - 900];
    if (got[i] != want)
      fail_msg ("slot 3 byte %u: %u, expected %u (a queued write not "
                "seen, or seen out of order)", i, got[i], want);
  }
  assert_int_equal (defer_read_data (&d, &p, 4, got, sizeof b, 0), 0);
  assert_memory_equal (got, b, sizeof b);

  /* A write now (not queued) after a queued one to the same bytes:
   * the file ends with the later one.
   */
  fill_bytes (c, PS, 3);
  assert_int_equal (defer_write_data_later (&d, &p, 5, a, sizeof a, 0), 0);
  assert_int_equal (defer_write_data (&d, &p, 5, c, PS, 0), 0);
  /* More than DEFER_MAX_BYTES: written at once, after the queue. */
  assert_int_equal (defer_write_data_later (&d, &p, 6, a, sizeof a, 0), 0);
  before = my_pwrites;
  assert_int_equal (defer_write_data_later (&d, &p, 6, c, DEFER_MAX_BYTES + 512,
                                           0), 0);
  assert_true (my_pwrites > before);
  assert_int_equal (defer_sync (&d, &p), 0);
  file_read (&p, 5, got, PS, 0);
  assert_memory_equal (got, c, PS);
  file_read (&p, 6, got, DEFER_MAX_BYTES + 512, 0);
  assert_memory_equal (got, c, DEFER_MAX_BYTES + 512);

  defer_stop (&d);
  assert_false (atomic_load (&d.active));
  assert_int_equal (atomic_load (&defer_errors), 0);
  pool_close (&p);
}

/* pool_sync and defer_stop write the queue out; so does a full queue
 * (the writer waits), and nothing is lost or reordered.
 */
static void
test_defer_drain (void **state)
{
  struct pool p;
  struct defer d;
  struct stats st;
  uint8_t buf[512], got[512];

  memset (&st, 0, sizeof st);
  format (&p, testfile_direct ());
  assert_int_equal (defer_start (&d, &p, &st, count_error, NULL), 0);
  fill_bytes (buf, sizeof buf, 7);
  assert_int_equal (defer_write_data_later (&d, &p, 10, buf, sizeof buf, 4096),
                    0);
  assert_int_equal (defer_sync (&d, &p), 0);
  file_read (&p, 10, got, sizeof got, 4096);
  assert_memory_equal (got, buf, sizeof buf);

  /* Many more writes than entries, to the same sector of a few slots:
   * each slot ends with its last one.
   */
  for (unsigned i = 0; i < 5 * DEFER_ENTRIES; i++) {
    fill_bytes (buf, sizeof buf, 100 + i);
    assert_int_equal (defer_write_data_later (&d, &p, 20 + i % 7, buf, sizeof buf,
                                             0), 0);
  }
  assert_int_equal (STATS_GET (&st, writes_deferred), 1 + 5 * DEFER_ENTRIES);
  defer_stop (&d);
  for (unsigned k = 0; k < 7; k++) {
    /* the last i with i % 7 == k */
    unsigned last = k + 7 * ((5 * DEFER_ENTRIES - 1 - k) / 7);
    fill_bytes (buf, sizeof buf, 100 + last);
    file_read (&p, 20 + k, got, sizeof got, 0);
    if (memcmp (got, buf, sizeof buf) != 0)
      fail_msg ("slot %u does not hold its last write (%u)", 20 + k, last);
  }
  assert_int_equal (atomic_load (&defer_errors), 0);
  pool_close (&p);
}

/* After a failed queued write: a read of slot fails with EIO, and so
 * do every later write (queued or not) and a sync.
 */
static void
defer_all_fail (struct defer *d, struct pool *p, uint32_t slot)
{
  uint8_t buf[1024];

  fill_bytes (buf, sizeof buf, 9);
  errno = 0;
  assert_int_equal (defer_read_data (d, p, slot, buf, sizeof buf, 0), -1);
  assert_int_equal (errno, EIO);
  assert_int_equal (defer_write_data (d, p, 100, buf, sizeof buf, 0), -1);
  assert_int_equal (defer_write_data_later (d, p, 100, buf, sizeof buf, 0),
                    -1);
  assert_int_equal (defer_sync (d, p), -1);
}

/* A queued write that fails: reported once, and from then on every
 * slot read and write through the pool fails with EIO, after
 * defer_stop too (the stale data under the failed write must never be
 * read).
 */
static void
test_defer_error (void **state)
{
  struct pool p;
  struct defer d;
  uint8_t buf[1024];

  atomic_store (&defer_errors, 0);
  format (&p, false);
  assert_int_equal (defer_start (&d, &p, NULL, count_error, NULL), 0);
  fill_bytes (buf, sizeof buf, 9);
  atomic_store (&fail_fd, p.fd);
  assert_int_equal (defer_write_data_later (&d, &p, 8, buf, sizeof buf, 0), 0);
  assert_int_equal (defer_write_data_later (&d, &p, 9, buf, sizeof buf, 0), 0);
  errno = 0;
  assert_int_equal (defer_read_data (&d, &p, 8, buf, sizeof buf, 0), -1);
  assert_int_equal (errno, EIO);
  atomic_store (&fail_fd, -1);         /* the device is back: too late */
  assert_int_equal (atomic_load (&defer_errors), 1);
  assert_int_equal (atomic_load (&defer_error_slot), 8);
  defer_all_fail (&d, &p, 100);
  defer_stop (&d);
  assert_int_equal (atomic_load (&defer_errors), 1);
  /* Stopped (at close) it still fails: sealing slot 8 from its older
   * bytes would make them verify at the next start.  The pool itself
   * works.
   */
  defer_all_fail (&d, &p, 8);
  assert_int_equal (pool_read_data (&p, 8, buf, sizeof buf, 0), 0);
  pool_close (&p);
}

/* Threads, each owning some slots (as range locks make them), queue
 * small writes, write big ones now and read, at random, against their
 * own models, while the defer thread writes the queue out.
 */
#define DTHREADS 4
#define DOPS 3000

static struct pool dpool;
static struct defer ddefer;

struct dworker {
  unsigned t;
  uint8_t *model;               /* its slots, zeroes after format */
  const char *error;            /* NULL: all went well */
};

static void *
defer_worker (void *arg)
{
  struct dworker *w = arg;
  const unsigned t = w->t;
  uint8_t *model = w->model;
  uint8_t *buf = malloc (PS), *got = malloc (PS);
  unsigned seed = 1000 + t;
  const char *ret = NULL;

  if (buf == NULL || got == NULL)
    ret = "malloc";
  for (unsigned i = 0; i < DOPS && ret == NULL; i++) {
    unsigned k = rand_r (&seed) % (NSLOTS / DTHREADS);
    uint64_t s = (uint64_t) k * DTHREADS + t;
    uint8_t *m = model + (size_t) k * PS;
    unsigned what = rand_r (&seed) % 8;
    uint32_t off = (rand_r (&seed) % (PS / 512)) * 512, n;

    if (what < 4) {               /* small, queued */
      n = 512 * (1 + rand_r (&seed) % (DEFER_MAX_BYTES / 512));
      if (n > PS - off)
        n = PS - off;
      fill_bytes (buf, n, rand_r (&seed));
      if (defer_write_data_later (&ddefer, &dpool, s, buf, n, off) != 0)
        ret = "queued write failed";
      memcpy (m + off, buf, n);
    }
    else if (what < 5) {          /* big, now */
      n = PS - off;
      fill_bytes (buf, n, rand_r (&seed));
      if (defer_write_data (&ddefer, &dpool, s, buf, n, off) != 0)
        ret = "write failed";
      memcpy (m + off, buf, n);
    }
    else {
      n = 1 + rand_r (&seed) % (PS - off);
      if (defer_read_data (&ddefer, &dpool, s, got, n, off) != 0)
        ret = "read failed";
      else if (memcmp (got, m + off, n) != 0)
        ret = "read data differs from the model";
    }
  }
  w->error = ret;
  free (buf);
  free (got);
  return NULL;
}

static void
defer_threads (bool direct)
{
  pthread_t th[DTHREADS];
  struct dworker w[DTHREADS];
  struct stats st;
  uint8_t *got = malloc (PS);

  memset (&st, 0, sizeof st);
  reset_counts ();
  atomic_store (&defer_errors, 0);
  format (&dpool, direct);
  assert_int_equal (defer_start (&ddefer, &dpool, &st, count_error, NULL), 0);
  for (unsigned t = 0; t < DTHREADS; t++) {
    w[t].t = t;
    w[t].model = calloc (NSLOTS / DTHREADS, PS);
    w[t].error = NULL;
    assert_non_null (w[t].model);
    assert_int_equal (pthread_create (&th[t], NULL, defer_worker, &w[t]), 0);
  }
  for (int t = 0; t < DTHREADS; t++)
    pthread_join (th[t], NULL);
  defer_stop (&ddefer);
  for (int t = 0; t < DTHREADS; t++)
    if (w[t].error)
      fail_msg ("worker %d: %s", t, w[t].error);
  for (unsigned s = 0; s < NSLOTS; s++) {
    const uint8_t *m = w[s % DTHREADS].model + (size_t) (s / DTHREADS) * PS;
    file_read (&dpool, s, got, PS, 0);
    if (memcmp (got, m, PS) != 0)
      fail_msg ("slot %u in the file differs from its model", s);
  }
  assert_true (STATS_GET (&st, writes_deferred) > DOPS);
  assert_int_equal (atomic_load (&unaligned_calls), 0);
  assert_int_equal (atomic_load (&defer_errors), 0);
  for (int t = 0; t < DTHREADS; t++)
    free (w[t].model);
  free (got);
  pool_close (&dpool);
}

static void
test_defer_threads (void **state)
{
  defer_threads (false);
}

static void
test_defer_threads_direct (void **state)
{
  defer_threads (true);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_split_span),
    TESTFILE_TEST (test_direct_flag),
    TESTFILE_TEST (test_direct_data),
    TESTFILE_TEST (test_direct_entries_concurrent),
    TESTFILE_TEST (test_direct_pt_lines),
    TESTFILE_TEST (test_direct_refused),
    TESTFILE_TEST (test_contents),
    TESTFILE_TEST (test_contents_direct),
    TESTFILE_TEST (test_private),
    TESTFILE_TEST (test_defer_order),
    TESTFILE_TEST (test_defer_drain),
    TESTFILE_TEST (test_defer_error),
    TESTFILE_TEST (test_defer_threads),
    TESTFILE_TEST (test_defer_threads_direct),
  };

  testfile_name = "pool";
  testfile_watchdog_seconds = 120;
  /* Direct I/O needs a file system that has it: not tmpfs before Linux
   * 6.6.  The default for the test files is /var/tmp.
   */
  if (getenv ("TMPDIR") == NULL)
    setenv ("TMPDIR", "/var/tmp", 1);
  return cmocka_run_group_tests (tests, NULL, NULL);
}
