/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the cache file (page pool and its metadata).
 *
 * Owns the file descriptor of the cache file or device: opening,
 * creating (mode 0600), the one-owner lock (flock, held for the life of
 * the process), sizing, and positioned I/O of superblocks, page-table
 * entries and slot data.  It keeps no per-slot state.
 *
 * Direct I/O (ssdcache-direct=true): the file is opened with O_DIRECT
 * and every pread/pwrite on it is aligned to POOL_DIRECT_ALIGN (offset,
 * length and memory).  The callers do not need to care: unaligned
 * reads go through an aligned bounce buffer (the enclosing aligned
 * span is read), unaligned writes are split into a read-modify-write of
 * the partial first and last blocks and an aligned middle.  That is how
 * a 64-byte page-table entry is written: its 4 KiB block is read,
 * patched and written back, under that block's stripe lock, so that two
 * threads writing different entries of one block never lose each
 * other's update.
 *
 * Locking: the pool fields are written only during open/format/close,
 * which run single-threaded.  pool_write_sb is serialised by the caller.
 * Slot I/O uses pread/pwrite and needs no lock; the caller guarantees
 * that nobody reuses a slot while it is being read or written (pins),
 * and that writes to one slot are serialised (range locks).  With
 * direct I/O, p->blk_locks[i] serialises the read-modify-write of the
 * blocks whose number is i modulo POOL_BLOCK_LOCKS; it is held across
 * that block's pread and pwrite only, and no other lock is taken while
 * it is held.
 *
 * Page-table blocks, direct I/O only: the file has no page cache to
 * serve a lone entry read, so line i of p->pt_lines holds one 4 KiB
 * block of the page table (of the current geometry), the one whose
 * number is i modulo POOL_BLOCK_LOCKS, under p->blk_locks[i].  Lines
 * are written through: a read-modify-write of an entry updates the
 * line with the block it writes, a whole-block write invalidates the
 * lines it covers, and a new superblock (a new geometry) empties them
 * all.  Once the write that changed a block has returned, its line
 * (if any) holds what the file holds.
 */
#ifndef SSDCACHE_POOL_H
#define SSDCACHE_POOL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "layout.h"

/* Alignment of every I/O with direct I/O: at least the logical block
 * size of any device in use today (a device or file system asking for
 * more is refused at open).  The layout keeps superblocks, the page
 * table and every slot on such boundaries.
 */
#define POOL_DIRECT_ALIGN 4096
#define POOL_BLOCK_LOCKS 64

struct pool {
  int fd;
  char *path;
  bool is_blockdev;
  bool direct;                /* opened with O_DIRECT */
  pthread_mutex_t *blk_locks; /* direct: POOL_BLOCK_LOCKS stripes */
  uint8_t *pt_lines;          /* direct: POOL_BLOCK_LOCKS cached blocks */
  uint64_t *pt_tags;          /* direct: line i holds block pt_tags[i]-1
                                 (0: none) */
  uint64_t dev_size;          /* size of the file/device when opened */
  struct layout_sb sb;        /* last superblock read or written */
  unsigned next_sb;           /* copy (0/1) the next pool_write_sb writes */
  bool sb_damaged;            /* pool_load_sb found one copy unusable */
  bool foreign;               /* pool_load_sb found no cache, but data:
                                 never to be overwritten, not even by a
                                 reset */
  bool sparse;                /* pool_format reserves the entries only:
                                 slot data takes room as it is written
                                 and pool_punch_slot gives it back (one
                                 file per export, exports.c) */
};

/* Open (creating it if missing, mode 0600) and lock the cache file,
 * with O_DIRECT if direct (a file system that refuses it is an error
 * naming ssdcache-direct).  Errors are reported with log_error, naming
 * the file.  Returns 0 or -1.
 */
extern int pool_open (struct pool *p, const char *path, bool direct);
/* Remove the cache file at path, if it is a regular file that no
 * process holds (its lock taken first, without waiting).  Returns 0,
 * or -1 (left as it is; errno).
 */
extern int pool_remove_file (const char *path);

/* pool_open for the default cache file, which the filter named in a
 * directory of the user's own (config.c): it is never reached through
 * a symbolic link (lstat, then O_NOFOLLOW), and it must be a regular
 * file owned by the effective uid that neither group nor others can
 * write.  Anything else is refused, with a message saying to delete
 * it.
 */
extern int pool_open_private (struct pool *p, const char *path,
                              bool direct);
extern void pool_close (struct pool *p);
/* The file's descriptor, still open and locked, taken out of p (which
 * pool_close then leaves open), and pool_open for such a descriptor:
 * the lock stays held from one to the other.  A cache resized
 * (resize.c) is opened again that way: with nbdkit --run, its parent
 * keeps the first descriptor, and the lock with it.
 */
extern int pool_take_fd (struct pool *p);
extern int pool_open_fd (struct pool *p, const char *path, int fd,
                         bool direct);

/* Read both superblock copies and keep the valid one with the highest
 * generation in p->sb.  Returns 1 if one was found (p->sb_damaged: the
 * other copy is damaged, logged), 0 if the file is blank (empty, or
 * zeroes throughout: holes are skipped; on a block device, zeroes in
 * its first LAYOUT_POOL_ALIGN bytes), -1 if superblocks exist but
 * none is usable, if either copy is from a newer format version, or if
 * zeroed superblocks sit in front of a page table (reason logged with
 * the file name).  -1 with p->foreign: the file holds something that
 * is not a cache (no superblock magic, no valid entry at the start of
 * the page table, and a byte that is not zero), which must never be
 * overwritten, not even when the user asked for a reset.
 */
extern int pool_load_sb (struct pool *p);

/* Lay out a new, empty cache described by sb (geometry fields must be
 * filled): size the file, write a FREE entry for every slot, write both
 * superblocks (with LAYOUT_SB_PTINIT).
 */
extern int pool_format (struct pool *p, const struct layout_sb *sb);

/* Give slot's data space back to the file system (a sparse pool whose
 * slot another cache now uses).  Best effort: a file system without
 * hole punching keeps the space.
 */
extern void pool_punch_slot (struct pool *p, uint32_t slot);

/* Write sb (generation incremented) to the older copy, then fdatasync.
 * Returns 0 or -1.
 */
extern int pool_write_sb (struct pool *p, struct layout_sb *sb);

/* Page-table entries. */
extern int pool_read_entries (struct pool *p, uint64_t first, uint64_t n,
                              void *buf);
/* Tests only: this many more pool_write_entry calls fail (EIO). */
extern _Atomic unsigned pool_test_fail_entry_writes;
extern int pool_write_entry (struct pool *p, uint64_t slot,
                             const struct layout_entry *e);
extern int pool_write_entries (struct pool *p, uint64_t first, uint64_t n,
                               const void *buf);

/* Slot data: count bytes at offset within the slot's page.  (The
 * engine goes through io/defer.h, which keeps deferred writes in
 * order with these.)
 */
extern int pool_read_data (struct pool *p, uint64_t slot, void *buf,
                           uint32_t count, uint32_t offset);
extern int pool_write_data (struct pool *p, uint64_t slot, const void *buf,
                            uint32_t count, uint32_t offset);

/* Make all completed writes durable (fdatasync). */
extern int pool_sync (struct pool *p);

/* Is the device holding the cache file rotational (sysfs)?  1 or 0;
 * -1 if there is no such device to ask (tmpfs, overlayfs, btrfs, a
 * network file system).
 */
extern int pool_rotational (const struct pool *p);

/* Positioned I/O of any span of the cache file, aligned as needed for
 * direct I/O (see above).  Return 0 or -1 (errno set).
 */
extern int pool_pread (struct pool *p, void *buf, size_t count, uint64_t off);
extern int pool_pwrite (struct pool *p, const void *buf, size_t count,
                        uint64_t off);

/* How pool_pwrite cuts [off, off+len) for blocks of align bytes (a
 * power of two; pure, exposed for the unit tests): a partial first
 * block [head_off, head_off+head_len), whole blocks [mid_off,
 * mid_off+mid_len) and a partial last block [tail_off,
 * tail_off+tail_len).  Empty parts have length 0; a span inside one
 * block that touches neither of its ends is all head.
 */
struct pool_span {
  uint64_t head_off, mid_off, tail_off;
  uint64_t head_len, mid_len, tail_len;
};
extern void pool_split_span (uint64_t off, uint64_t len, uint32_t align,
                             struct pool_span *sp);

#endif /* SSDCACHE_POOL_H */
