/* nbdkit-ssdcache-filter: the cache file (page pool and its metadata).
 *
 * Owns the file descriptor of the cache file or device: opening,
 * creating (mode 0600), the one-owner lock (flock, held for the life of
 * the process), sizing, and positioned I/O of superblocks, page-table
 * entries and slot data.  It keeps no per-slot state.
 *
 * Locking: the pool fields are written only during open/format/close,
 * which run single-threaded.  pool_write_sb is serialised by the caller.
 * Slot I/O uses pread/pwrite and needs no lock; the caller guarantees
 * that nobody reuses a slot while it is being read or written (pins).
 */
#ifndef SSDCACHE_POOL_H
#define SSDCACHE_POOL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "layout.h"

struct pool {
  int fd;
  char *path;
  bool is_blockdev;
  uint64_t dev_size;          /* size of the file/device when opened */
  struct layout_sb sb;        /* last superblock read or written */
  unsigned next_sb;           /* copy (0/1) the next pool_write_sb writes */
  bool sb_damaged;            /* pool_load_sb found one copy unusable */
};

/* Open (creating it if missing, mode 0600) and lock the cache file.
 * Errors are reported with log_error, naming the file.
 * Returns 0 or -1.
 */
extern int pool_open (struct pool *p, const char *path);
extern void pool_close (struct pool *p);

/* Read both superblock copies and keep the valid one with the highest
 * generation in p->sb.  Returns 1 if one was found (p->sb_damaged: the
 * other copy is damaged, logged), 0 if the file has no superblock at
 * all (new, or zeroes up to the page table), -1 if superblocks exist
 * but none is usable, if either copy is from a newer format version,
 * or if zeroed superblocks sit in front of a page table (reason logged
 * with the file name).
 */
extern int pool_load_sb (struct pool *p);

/* Lay out a new, empty cache described by sb (geometry fields must be
 * filled): size the file, write a FREE entry for every slot, write both
 * superblocks (with LAYOUT_SB_PTINIT).
 */
extern int pool_format (struct pool *p, const struct layout_sb *sb);

/* Write sb (generation incremented) to the older copy, then fdatasync.
 * Returns 0 or -1.
 */
extern int pool_write_sb (struct pool *p, struct layout_sb *sb);

/* Page-table entries. */
extern int pool_read_entries (struct pool *p, uint64_t first, uint64_t n,
                              void *buf);
extern int pool_write_entry (struct pool *p, uint64_t slot,
                             const struct layout_entry *e);
extern int pool_write_entries (struct pool *p, uint64_t first, uint64_t n,
                               const void *buf);

/* Slot data: count bytes at offset within the slot's page. */
extern int pool_read_data (struct pool *p, uint64_t slot, void *buf,
                           uint32_t count, uint32_t offset);
extern int pool_write_data (struct pool *p, uint64_t slot, const void *buf,
                            uint32_t count, uint32_t offset);

/* Make all completed writes durable (fdatasync). */
extern int pool_sync (struct pool *p);

#endif /* SSDCACHE_POOL_H */
