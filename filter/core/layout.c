/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: on-SSD format (pure: no I/O, no nbdkit).
 *
 * Owns encoding/decoding of superblocks and page-table entries; see
 * layout.h for the picture.  No state, no locks.
 *
 * Superblock (LAYOUT_SB_SIZE bytes, little-endian):
 *    0 magic[8]  8 version  12 flags  16 uuid[16]  32 page_size
 *   36 sector_size  40 nslots  48 pt_offset  56 pool_offset
 *   64 backend_size  72 id_digest[2]  88 generation  96 mode
 *  100 reserved (0)  104 id_text[256]  ... zero ...  4092 crc32c(0..4091)
 *
 * Entry (LAYOUT_ENTRY_SIZE = 64 bytes):
 *    0 page  8 seq  16 valid[16]  32 dirty[16]  48 data_crc  52 state
 *   53 hint (0..3: replacement-policy hotness, so that a warm cache
 *   keeps knowing its hot pages)  54 flags (LAYOUT_ENT_*)
 *   55 gen[5] (dirty: flush generation)  60 crc32c(0..59)
 */
#include <endian.h>
#include <pthread.h>
#include <string.h>

#include <isa-l/crc.h>

#include "layout.h"

#define SB_CRC_OFF   (LAYOUT_SB_SIZE - 4)
#define ENT_CRC_OFF  (LAYOUT_ENTRY_SIZE - 4)

uint32_t
layout_crc32c_update (uint32_t crc, const void *buf, size_t len)
{
  /* ISA-L keeps the CRC state un-inverted; the standard CRC32C inverts
   * on entry and exit.
   */
  uint32_t state = ~crc;

  while (len > 0) {
    int n = len > (1u << 30) ? (1 << 30) : (int) len;
    state = crc32_iscsi ((unsigned char *) buf, n, state);
    buf = (const unsigned char *) buf + n;
    len -= n;
  }
  return ~state;
}

uint32_t
layout_crc32c (const void *buf, size_t len)
{
  return layout_crc32c_update (0, buf, len);
}

/* GF(2) arithmetic on reflected CRC32C remainders (bit 31 is x^0):
 * a * b mod P.  Used to move a CRC over a run of zero bytes without
 * feeding them through the CRC unit.
 */
#define CRC32C_POLY_REFLECTED 0x82f63b78u

static uint32_t
gf2_mulmod (uint32_t a, uint32_t b)
{
  uint32_t m = UINT32_C (1) << 31, p = 0;

  while (m) {
    if (a & m)
      p ^= b;
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ CRC32C_POLY_REFLECTED : b >> 1;
  }
  return p;
}

static uint32_t pow2[64];        /* x^(2^k) mod P, k = 0..63 */
static pthread_once_t pow2_once = PTHREAD_ONCE_INIT;

static void
pow2_init (void)
{
  pow2[0] = UINT32_C (1) << 30;         /* x^1 */
  for (int i = 1; i < 64; i++)
    pow2[i] = gf2_mulmod (pow2[i - 1], pow2[i - 1]);
}

/* x^(8 * n) mod P: appending n zero bytes multiplies a raw CRC by it. */
static uint32_t
zeros_operator (uint64_t n)
{
  uint32_t r = UINT32_C (1) << 31;      /* x^0 */
  unsigned k = 3;                       /* 8 * n = n << 3 */

  /* (Once: two threads filling the table at the same time, even with
   * the same values, would be a data race.)
   */
  pthread_once (&pow2_once, pow2_init);
  for (; n; n >>= 1, k++)
    if (n & 1)
      r = gf2_mulmod (pow2[k & 63], r);
  return r;
}

uint32_t
layout_crc32c_patch (uint32_t crc, uint64_t len, uint64_t off,
                     const void *old_bytes, const void *new_bytes, size_t n)
{
  /* CRC32C is affine: for equal lengths crc(A) ^ crc(B) is the raw
   * (no init, no final xor) CRC of A ^ B, and the raw CRC is linear, so
   * raw(old ^ new) = raw(old) ^ raw(new).  A ^ B is zero outside the
   * changed bytes; leading zeroes do not change a raw CRC, and the
   * trailing ones are a multiplication by x^(8 * tail) mod P.
   */
  uint64_t tail = len - off - n;
  uint32_t raw;

  /* n is at most one page (2 MiB), well within int. */
  raw = crc32_iscsi ((unsigned char *) old_bytes, (int) n, 0) ^
    crc32_iscsi ((unsigned char *) new_bytes, (int) n, 0);
  if (tail > 0 && raw != 0)
    raw = gf2_mulmod (zeros_operator (tail), raw);
  return crc ^ raw;
}

/* Little-endian fields at any alignment: one load or store each (a
 * loop over bytes is not turned into one, and a start decodes every
 * entry of the page table).
 */
static void
put32 (uint8_t *p, uint32_t v)
{
  v = htole32 (v);
  memcpy (p, &v, sizeof v);
}

static void
put64 (uint8_t *p, uint64_t v)
{
  v = htole64 (v);
  memcpy (p, &v, sizeof v);
}

static uint32_t
get32 (const uint8_t *p)
{
  uint32_t v;

  memcpy (&v, p, sizeof v);
  return le32toh (v);
}

static uint64_t
get64 (const uint8_t *p)
{
  uint64_t v;

  memcpy (&v, p, sizeof v);
  return le64toh (v);
}

static bool
is_pow2 (uint64_t v)
{
  return v != 0 && (v & (v - 1)) == 0;
}

uint32_t
layout_sector_size (uint32_t page_size)
{
  uint32_t s = page_size / LAYOUT_MAX_SECTORS;
  return s < LAYOUT_MIN_SECTOR ? LAYOUT_MIN_SECTOR : s;
}

bool
layout_geometry (uint32_t page_size, uint64_t nslots,
                 uint64_t *pt_offset, uint64_t *pool_offset,
                 uint64_t *total_size)
{
  uint64_t pt_end, pool, data;

  if (nslots > UINT64_MAX / LAYOUT_ENTRY_SIZE)
    return false;
  pt_end = LAYOUT_PT_OFFSET + nslots * LAYOUT_ENTRY_SIZE;
  if (pt_end < LAYOUT_PT_OFFSET || pt_end > UINT64_MAX - LAYOUT_POOL_ALIGN)
    return false;
  pool = (pt_end + LAYOUT_POOL_ALIGN - 1) & ~(uint64_t) (LAYOUT_POOL_ALIGN - 1);
  if (page_size == 0 || nslots > UINT64_MAX / page_size)
    return false;
  data = nslots * page_size;
  if (pool > UINT64_MAX - data || pool + data > INT64_MAX)
    return false;
  *pt_offset = LAYOUT_PT_OFFSET;
  *pool_offset = pool;
  *total_size = pool + data;
  return true;
}

void
layout_sb_encode (const struct layout_sb *sb, void *buf)
{
  uint8_t *p = buf;

  memset (p, 0, LAYOUT_SB_SIZE);
  memcpy (p, LAYOUT_MAGIC, 8);
  put32 (p + 8, sb->version);
  put32 (p + 12, sb->flags);
  memcpy (p + 16, sb->uuid, 16);
  put32 (p + 32, sb->page_size);
  put32 (p + 36, sb->sector_size);
  put64 (p + 40, sb->nslots);
  put64 (p + 48, sb->pt_offset);
  put64 (p + 56, sb->pool_offset);
  put64 (p + 64, sb->backend_size);
  put64 (p + 72, sb->id_digest[0]);
  put64 (p + 80, sb->id_digest[1]);
  put64 (p + 88, sb->generation);
  put32 (p + 96, sb->mode);
  /* id_text: always NUL terminated on disk. */
  memcpy (p + 104, sb->id_text, strnlen (sb->id_text, LAYOUT_ID_MAX - 1));
  put32 (p + SB_CRC_OFF, layout_crc32c (p, SB_CRC_OFF));
}

bool
layout_sb_crc_ok (const void *buf)
{
  const uint8_t *p = buf;

  return get32 (p + SB_CRC_OFF) == layout_crc32c (p, SB_CRC_OFF);
}

int
layout_sb_decode (const void *buf, struct layout_sb *sb, const char **why)
{
  const uint8_t *p = buf;
  uint64_t pt, pool, total;
  const char *dummy;

  if (why == NULL)
    why = &dummy;
  if (memcmp (p, LAYOUT_MAGIC, 8) != 0) {
    *why = "not an ssdcache superblock (bad magic)";
    return -1;
  }
  sb->version = get32 (p + 8);
  if (sb->version > LAYOUT_VERSION) {
    *why = "written by a newer format version than this filter supports";
    return -1;
  }
  if (get32 (p + SB_CRC_OFF) != layout_crc32c (p, SB_CRC_OFF)) {
    *why = "superblock checksum mismatch";
    return -1;
  }
  if (sb->version != LAYOUT_VERSION) {
    *why = "unsupported format version";
    return -1;
  }
  sb->flags = get32 (p + 12);
  memcpy (sb->uuid, p + 16, 16);
  sb->page_size = get32 (p + 32);
  sb->sector_size = get32 (p + 36);
  sb->nslots = get64 (p + 40);
  sb->pt_offset = get64 (p + 48);
  sb->pool_offset = get64 (p + 56);
  sb->backend_size = get64 (p + 64);
  sb->id_digest[0] = get64 (p + 72);
  sb->id_digest[1] = get64 (p + 80);
  sb->generation = get64 (p + 88);
  sb->mode = get32 (p + 96);
  memcpy (sb->id_text, p + 104, LAYOUT_ID_MAX);

  if ((sb->flags & ~LAYOUT_SB_FLAGS) != 0 || get32 (p + 100) != 0) {
    *why = "unknown superblock flags";
    return -1;
  }
  if (!is_pow2 (sb->page_size) || sb->page_size < LAYOUT_MIN_PAGE ||
      sb->page_size > LAYOUT_MAX_PAGE ||
      sb->sector_size != layout_sector_size (sb->page_size)) {
    *why = "invalid page or sector size";
    return -1;
  }
  if (sb->nslots == 0 || sb->nslots > UINT32_MAX - 1 ||
      !layout_geometry (sb->page_size, sb->nslots, &pt, &pool, &total) ||
      sb->pt_offset != pt || sb->pool_offset != pool) {
    *why = "inconsistent geometry";
    return -1;
  }
  if (sb->mode > LAYOUT_MODE_WRITEBACK) {
    *why = "unknown cache mode";
    return -1;
  }
  if (memchr (sb->id_text, '\0', LAYOUT_ID_MAX) == NULL) {
    *why = "identity text not terminated";
    return -1;
  }
  for (size_t i = 104 + LAYOUT_ID_MAX; i < SB_CRC_OFF; i++)
    if (p[i] != 0) {
      *why = "non-zero reserved bytes";
      return -1;
    }
  return 0;
}

void
layout_entry_encode (const struct layout_entry *e, void *buf)
{
  uint8_t *p = buf;

  memset (p, 0, LAYOUT_ENTRY_SIZE);
  put64 (p, e->page);
  put64 (p + 8, e->seq);
  memcpy (p + 16, e->valid, sizeof e->valid);
  memcpy (p + 32, e->dirty, sizeof e->dirty);
  put32 (p + 48, e->data_crc);
  p[52] = e->state;
  p[53] = e->hint;
  p[54] = e->flags;
  for (int i = 0; i < 5; i++)
    p[55 + i] = (e->gen & LAYOUT_GEN_MASK) >> (8 * i);
  put32 (p + ENT_CRC_OFF, layout_crc32c (p, ENT_CRC_OFF));
}

/* A map as two little-endian words: bit i is bit i % 64 of word
 * i / 64.
 */
static inline void
map_words (const uint8_t *map, uint64_t w[2])
{
  memcpy (w, map, 16);
  w[0] = le64toh (w[0]);
  w[1] = le64toh (w[1]);
}

/* Do the maps of an entry of a page of nsectors hold together?  No bit
 * names a sector past the page, dirty implies valid, and the state
 * says which may be empty.  (A word at a time: start-up decodes every
 * entry.)
 */
static bool
entry_maps_ok (const uint8_t *valid, const uint8_t *dirty,
               uint32_t nsectors, uint8_t state)
{
  uint64_t v[2], d[2], past[2];
  bool v_empty, d_empty;

  map_words (valid, v);
  map_words (dirty, d);
  past[0] = nsectors >= 64 ? 0 : UINT64_MAX << nsectors;
  past[1] = nsectors >= 128 ? 0
    : nsectors <= 64 ? UINT64_MAX : UINT64_MAX << (nsectors - 64);
  if ((((v[0] | d[0]) & past[0]) | ((v[1] | d[1]) & past[1])) ||
      ((d[0] & ~v[0]) | (d[1] & ~v[1])))
    return false;
  v_empty = (v[0] | v[1]) == 0;
  d_empty = (d[0] | d[1]) == 0;
  switch (state) {
  case LAYOUT_FREE: return v_empty && d_empty;
  case LAYOUT_CLEAN: return !v_empty && d_empty;
  case LAYOUT_DIRTY: return !d_empty;
  default: return false;
  }
}

int
layout_entry_decode (const void *buf, uint32_t nsectors,
                     struct layout_entry *e)
{
  const uint8_t *p = buf;

  if (nsectors == 0 || nsectors > LAYOUT_MAX_SECTORS)
    return -1;
  if (get32 (p + ENT_CRC_OFF) != layout_crc32c (p, ENT_CRC_OFF))
    return -1;
  if (p[53] > LAYOUT_HINT_MAX)
    return -1;
  if (p[54] & ~LAYOUT_ENT_FLAGS)
    return -1;
  _Static_assert (55 + 5 == ENT_CRC_OFF, "the generation fills the gap");

  e->page = get64 (p);
  e->seq = get64 (p + 8);
  memcpy (e->valid, p + 16, sizeof e->valid);
  memcpy (e->dirty, p + 32, sizeof e->dirty);
  e->data_crc = get32 (p + 48);
  e->state = p[52];
  e->hint = p[53];
  e->flags = p[54];
  e->gen = 0;
  for (int i = 0; i < 5; i++)
    e->gen |= (uint64_t) p[55 + i] << (8 * i);
  if (e->gen != 0 && e->state != LAYOUT_DIRTY)
    return -1;                  /* only dirty data has a generation */
  if (!entry_maps_ok (e->valid, e->dirty, nsectors, e->state))
    return -1;
  /* Only cached data is ever rewritten without its checksum. */
  if ((e->flags & LAYOUT_ENT_UNSEALED) && e->state == LAYOUT_FREE)
    return -1;
  return 0;
}

size_t
layout_first_nonzero (const uint8_t *b, size_t n)
{
  size_t i = 0;

  while (i < n && b[i] == 0)
    i++;
  return i;
}
