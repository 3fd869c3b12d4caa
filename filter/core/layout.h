/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: on-SSD format (pure: no I/O, no nbdkit).
 *
 * This file owns the byte layout of the cache file and nothing else:
 * encoding and decoding of the two superblock copies and of the
 * fixed-size page-table entries, with their CRC32C checks.  It has no
 * state and takes no locks, so it can be unit tested and fuzzed
 * directly.
 *
 *   [ superblock A | superblock B | page table | page pool ]
 *     4 KiB          4 KiB          nslots*64    nslots*page_size
 *     offset 0       offset 4096    offset 8192  aligned to 1 MiB
 *
 * All integers are little-endian.
 */
#ifndef SSDCACHE_LAYOUT_H
#define SSDCACHE_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LAYOUT_MAGIC            "NBDKSSDC"
#define LAYOUT_VERSION          1
#define LAYOUT_SB_SIZE          4096
#define LAYOUT_SB_COUNT         2
#define LAYOUT_PT_OFFSET        (LAYOUT_SB_SIZE * LAYOUT_SB_COUNT)
#define LAYOUT_ENTRY_SIZE       64
#define LAYOUT_POOL_ALIGN       (1024 * 1024)
#define LAYOUT_MAX_SECTORS      128      /* bits in one bitmap */
#define LAYOUT_MIN_SECTOR       512
#define LAYOUT_MIN_PAGE         4096
#define LAYOUT_MAX_PAGE         (2 * 1024 * 1024)
#define LAYOUT_ID_MAX           256      /* bytes of printable id kept */
#define LAYOUT_HINT_MAX         3        /* largest policy hint in an entry */

/* Superblock flags. */
#define LAYOUT_SB_CLEAN         1u       /* closed cleanly */
#define LAYOUT_SB_DIRTY         2u       /* may hold dirty data */
#define LAYOUT_SB_PTINIT        4u       /* every entry was written when the
                                            cache was made (a FREE entry
                                            at least): an all-zero entry
                                            is damage, not an unused slot */
#define LAYOUT_SB_RESIZING      8u       /* a change of size began and has
                                            not ended: the page table may
                                            mix both sizes' entries, so it
                                            is not used (the cache held no
                                            dirty data when it began) */
#define LAYOUT_SB_FLAGS         (LAYOUT_SB_CLEAN | LAYOUT_SB_DIRTY | \
                                 LAYOUT_SB_PTINIT | LAYOUT_SB_RESIZING)

/* Cache modes recorded in the superblock (last mode the cache ran in). */
enum layout_mode {
  LAYOUT_MODE_WRITETHROUGH = 0,
  LAYOUT_MODE_WRITEAROUND = 1,
  LAYOUT_MODE_WRITEBACK = 2,
};

struct layout_sb {
  uint32_t version;
  uint32_t flags;
  uint8_t uuid[16];
  uint32_t page_size;
  uint32_t sector_size;
  uint64_t nslots;
  uint64_t pt_offset;
  uint64_t pool_offset;
  uint64_t backend_size;
  uint64_t id_digest[2];           /* digest of the backend identity */
  char id_text[LAYOUT_ID_MAX];     /* printable summary, NUL terminated */
  uint64_t generation;
  uint32_t mode;                   /* enum layout_mode */
};

/* Page-table entry states. */
enum layout_state {
  LAYOUT_FREE = 0,
  LAYOUT_CLEAN = 1,
  LAYOUT_DIRTY = 2,
};

struct layout_entry {
  uint64_t page;                   /* backend page number */
  uint64_t seq;                    /* higher is newer */
  uint8_t valid[LAYOUT_MAX_SECTORS / 8];
  uint8_t dirty[LAYOUT_MAX_SECTORS / 8];
  uint32_t data_crc;               /* CRC32C of the page, invalid sectors as 0 */
  uint8_t state;                   /* enum layout_state */
  uint8_t hint;                    /* replacement-policy hotness, 0..3 */
  uint8_t flags;                   /* LAYOUT_ENT_* */
  uint64_t gen;                    /* dirty entries: flush generation of
                                      the data (40 bits; 0 in caches made
                                      before it was kept, with the offset
                                      order, and in other states) */
};
#define LAYOUT_GEN_MASK         ((1ULL << 40) - 1)

/* Entry flags.  UNSEALED: a page being rewritten in place since the
 * last client flush (dirty data, or clean data in writethrough);
 * data_crc is not kept up to date, so the data cannot be verified and
 * recovery after a crash never uses it (it was not flushed: the
 * previous version, or the backend, is right).  A client flush,
 * writeback and a clean close seal it again.  Never on a free entry.
 */
#define LAYOUT_ENT_UNSEALED     1u
#define LAYOUT_ENT_FLAGS        LAYOUT_ENT_UNSEALED

/* CRC32C (Castagnoli) of a buffer, the standard one (check value of
 * "123456789" is 0xe3069283).  layout_crc32c_update chains pieces:
 * start from 0, feed pieces in order.
 */
extern uint32_t layout_crc32c (const void *buf, size_t len);
extern uint32_t layout_crc32c_update (uint32_t crc, const void *buf, size_t len);

/* The CRC32C of a len-byte buffer whose bytes [off, off+n) change from
 * old_bytes to new_bytes, given its CRC32C crc before the change.  Costs
 * O(n) plus feeding (len - off - n) zero bytes through the CRC unit;
 * the rest of the buffer need not be read.
 */
extern uint32_t layout_crc32c_patch (uint32_t crc, uint64_t len, uint64_t off,
                                     const void *old_bytes,
                                     const void *new_bytes, size_t n);

/* Sector size used for the valid/dirty bitmaps of a page size. */
extern uint32_t layout_sector_size (uint32_t page_size);

/* Byte offsets derived from page size and slot count.  Returns false
 * on arithmetic overflow.
 */
extern bool layout_geometry (uint32_t page_size, uint64_t nslots,
                             uint64_t *pt_offset, uint64_t *pool_offset,
                             uint64_t *total_size);

/* Superblock: encode into exactly LAYOUT_SB_SIZE bytes; decode returns
 * 0 on success or -1 with a static reason in *why (bad magic, bad CRC,
 * unsupported version, inconsistent geometry).
 */
extern void layout_sb_encode (const struct layout_sb *sb, void *buf);
extern int layout_sb_decode (const void *buf, struct layout_sb *sb,
                             const char **why);
/* Does the CRC32C at the end of a LAYOUT_SB_SIZE-byte superblock match
 * its contents?  (Whatever the version field says.)
 */
extern bool layout_sb_crc_ok (const void *buf);

/* Entry: encode into LAYOUT_ENTRY_SIZE bytes; decode returns 0 or -1
 * (CRC mismatch, unknown state, free entry with data, bitmaps that
 * name sectors past the page).  nsectors is page_size/sector_size.
 */
extern void layout_entry_encode (const struct layout_entry *e, void *buf);
extern int layout_entry_decode (const void *buf, uint32_t nsectors,
                                struct layout_entry *e);

/* Bitmap helpers over LAYOUT_MAX_SECTORS-bit maps. */
static inline bool
layout_bit_test (const uint8_t *map, unsigned i)
{
  return (map[i >> 3] >> (i & 7)) & 1;
}
static inline void
layout_bit_set (uint8_t *map, unsigned i)
{
  map[i >> 3] |= 1u << (i & 7);
}
static inline void
layout_bit_clear (uint8_t *map, unsigned i)
{
  map[i >> 3] &= ~(1u << (i & 7));
}
static inline bool
layout_map_empty (const uint8_t *map)
{
  for (unsigned i = 0; i < LAYOUT_MAX_SECTORS / 8; i++)
    if (map[i])
      return false;
  return true;
}

/* Offset of the first non-zero byte of b[0, n), or n if all are zero
 * (blank files and entries).
 */
extern size_t layout_first_nonzero (const uint8_t *b, size_t n);

#endif /* SSDCACHE_LAYOUT_H */
