/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: fuzz target for the on-disk decoder (layout.c).
 *
 * Built two ways from this one file:
 *  - with clang -fsanitize=fuzzer,address,undefined as a libFuzzer
 *    binary ("make fuzz", tests/test-ssdcache-fuzz.sh);
 *  - with the project compiler and tests/fuzz/replay.c as a plain
 *    program that runs every file of the seed corpus through
 *    LLVMFuzzerTestOneInput (a unit test; no clang needed).
 *
 * Input format (so that the fuzzer gets past the CRC checks):
 *
 *   byte 0     control:
 *                bit 0  store a correct CRC in the superblock before decoding
 *                bit 1  store a correct CRC in every entry before decoding
 *   byte 1     entry nsectors seed: nsectors = 1 + (byte % 128)
 *   bytes 2..  payload
 *
 * The superblock candidate is the first LAYOUT_SB_SIZE bytes of the
 * payload, zero-padded if the payload is shorter.  The entry candidates
 * are the payload cut in LAYOUT_ENTRY_SIZE pieces (the last one
 * zero-padded), at most MAX_ENTRIES of them.  Every candidate is copied
 * into a heap buffer of exactly the on-disk size, so that ASan catches a
 * decoder that reads past it.
 *
 * Invariants checked (abort() on a violation, so libFuzzer records the
 * input as a crash):
 *
 * superblock
 *  - decode returns 0 or -1 and never writes to its input; on -1 it sets
 *    a non-empty reason, and the same input gives the same answer with
 *    why == NULL;
 *  - an accepted superblock satisfies the documented contract (magic,
 *    version, CRC against an independent bitwise CRC32C, page size, sector
 *    size, geometry, mode, flags, terminated identity, zero reserved
 *    bytes);
 *  - it re-encodes to bytes that decode to the same struct, equal to the
 *    input except for bytes after the identity's terminating NUL (which
 *    the encoder zeroes) and, then, the CRC.
 *
 * entry
 *  - nsectors 0, LAYOUT_MAX_SECTORS + 1 and UINT32_MAX are refused;
 *  - for nsectors 1..128 (all of them for the first piece, the seeded
 *    value and the boundary for the others): accepted exactly when the
 *    CRC (checked against the bitwise CRC32C), the flags (only "unsealed",
 *    never on free entries), the flush generation (dirty entries only), the
 *    state and the bitmaps are valid and no bit names a sector >= nsectors;
 *  - an accepted entry re-encodes to exactly the input bytes.
 *
 * Also (cheap, same pure module): layout_geometry never claims success
 * for a result that overflowed, and layout_crc32c_patch agrees with a
 * full CRC of the patched buffer.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"

#include "fuzz-layout.h"

#define MAX_ENTRIES 64
#define SB_CRC_OFF  (LAYOUT_SB_SIZE - 4)
#define ENT_CRC_OFF (LAYOUT_ENTRY_SIZE - 4)
#define ID_OFF      104

struct fuzz_layout_counts fuzz_layout_counts;

#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf (stderr, "fuzz-layout: %s:%d: invariant failed: %s\n",    \
               __FILE__, __LINE__, #cond);                              \
      abort ();                                                         \
    }                                                                   \
  } while (0)

/* Independent reference CRC32C (Castagnoli, reflected 0x82f63b78),
 * bit by bit: no table, no ISA-L.
 */
static uint32_t
ref_crc32c (const uint8_t *p, size_t len)
{
  uint32_t crc = 0xffffffff;

  for (size_t i = 0; i < len; i++) {
    crc ^= p[i];
    for (int k = 0; k < 8; k++)
      crc = (crc >> 1) ^ (0x82f63b78 & -(crc & 1));
  }
  return ~crc;
}

static uint32_t
le32 (const uint8_t *p)
{
  return (uint32_t) p[0] | ((uint32_t) p[1] << 8) |
    ((uint32_t) p[2] << 16) | ((uint32_t) p[3] << 24);
}

static uint64_t
le64 (const uint8_t *p)
{
  return (uint64_t) le32 (p) | ((uint64_t) le32 (p + 4) << 32);
}

static void
put_le32 (uint8_t *p, uint32_t v)
{
  p[0] = v; p[1] = v >> 8; p[2] = v >> 16; p[3] = v >> 24;
}

static void *
xmalloc (size_t n)
{
  void *p = malloc (n);

  if (p == NULL) {
    perror ("fuzz-layout: malloc");
    abort ();
  }
  return p;
}

static bool
is_pow2 (uint64_t v)
{
  return v != 0 && (v & (v - 1)) == 0;
}

static bool
sb_equal (const struct layout_sb *a, const struct layout_sb *b)
{
  return a->version == b->version && a->flags == b->flags &&
    memcmp (a->uuid, b->uuid, sizeof a->uuid) == 0 &&
    a->page_size == b->page_size && a->sector_size == b->sector_size &&
    a->nslots == b->nslots && a->pt_offset == b->pt_offset &&
    a->pool_offset == b->pool_offset && a->backend_size == b->backend_size &&
    a->id_digest[0] == b->id_digest[0] && a->id_digest[1] == b->id_digest[1] &&
    strcmp (a->id_text, b->id_text) == 0 &&
    a->generation == b->generation && a->mode == b->mode;
}

/*----------------------------------------------------------------------
 * Superblock
 */

static void
check_sb (const uint8_t *payload, size_t len, bool fix_crc)
{
  uint8_t *buf = xmalloc (LAYOUT_SB_SIZE);
  uint8_t *copy = xmalloc (LAYOUT_SB_SIZE);
  uint8_t *enc = xmalloc (LAYOUT_SB_SIZE);
  struct layout_sb sb, sb2, sb3;
  const char *why = NULL;
  int r, r2;
  size_t idlen;

  memset (buf, 0, LAYOUT_SB_SIZE);
  memcpy (buf, payload, len < LAYOUT_SB_SIZE ? len : LAYOUT_SB_SIZE);
  if (fix_crc)
    put_le32 (buf + SB_CRC_OFF, ref_crc32c (buf, SB_CRC_OFF));
  memcpy (copy, buf, LAYOUT_SB_SIZE);

  memset (&sb, 0xa5, sizeof sb);
  r = layout_sb_decode (buf, &sb, &why);
  CHECK (r == 0 || r == -1);
  CHECK (memcmp (buf, copy, LAYOUT_SB_SIZE) == 0);
  r2 = layout_sb_decode (buf, &sb3, NULL);
  CHECK (r2 == r);

  if (r == -1) {
    CHECK (why != NULL && why[0] != '\0');
    fuzz_layout_counts.sb_rejected++;
    goto out;
  }
  fuzz_layout_counts.sb_accepted++;

  /* The contract the rest of the filter relies on. */
  CHECK (memcmp (buf, LAYOUT_MAGIC, 8) == 0);
  CHECK (le32 (buf + SB_CRC_OFF) == ref_crc32c (buf, SB_CRC_OFF));
  CHECK (sb.version == LAYOUT_VERSION);
  CHECK ((sb.flags & ~LAYOUT_SB_FLAGS) == 0);
  CHECK (is_pow2 (sb.page_size));
  CHECK (sb.page_size >= LAYOUT_MIN_PAGE && sb.page_size <= LAYOUT_MAX_PAGE);
  CHECK (sb.sector_size >= LAYOUT_MIN_SECTOR);
  CHECK (sb.page_size % sb.sector_size == 0);
  CHECK (sb.page_size / sb.sector_size <= LAYOUT_MAX_SECTORS);
  CHECK (sb.sector_size == layout_sector_size (sb.page_size));
  CHECK (sb.nslots >= 1 && sb.nslots < UINT32_MAX);
  CHECK (sb.pt_offset == LAYOUT_PT_OFFSET);
  CHECK (sb.pool_offset % LAYOUT_POOL_ALIGN == 0);
  CHECK (sb.pool_offset >= sb.pt_offset + sb.nslots * LAYOUT_ENTRY_SIZE);
  {
    unsigned __int128 end = (unsigned __int128) sb.pool_offset +
      (unsigned __int128) sb.nslots * sb.page_size;
    CHECK (end <= INT64_MAX);
  }
  CHECK (sb.mode <= LAYOUT_MODE_WRITEBACK);
  CHECK (memchr (sb.id_text, '\0', LAYOUT_ID_MAX) != NULL);
  CHECK (le32 (buf + 100) == 0);
  for (size_t i = ID_OFF + LAYOUT_ID_MAX; i < SB_CRC_OFF; i++)
    CHECK (buf[i] == 0);

  /* Round trip. */
  layout_sb_encode (&sb, enc);
  why = NULL;
  CHECK (layout_sb_decode (enc, &sb2, &why) == 0);
  CHECK (sb_equal (&sb, &sb2));
  layout_sb_encode (&sb2, copy);
  CHECK (memcmp (enc, copy, LAYOUT_SB_SIZE) == 0);

  /* The encoding equals the input but for what follows the identity's
   * NUL (zeroed by the encoder) and then the CRC.
   */
  idlen = strlen (sb.id_text);
  CHECK (idlen < LAYOUT_ID_MAX);
  {
    bool junk = false;
    for (size_t i = 0; i < SB_CRC_OFF; i++) {
      if (i > ID_OFF + idlen && i < ID_OFF + LAYOUT_ID_MAX) {
        CHECK (enc[i] == 0);
        junk |= buf[i] != 0;
      }
      else
        CHECK (enc[i] == buf[i]);
    }
    if (!junk)
      CHECK (memcmp (enc + SB_CRC_OFF, buf + SB_CRC_OFF, 4) == 0);
  }

 out:
  free (enc);
  free (copy);
  free (buf);
}

/*----------------------------------------------------------------------
 * Page-table entries
 */

/* What layout_entry_decode must answer, derived independently from the
 * raw bytes: -1 if the entry is invalid whatever nsectors, else the
 * smallest nsectors (1..128) that accepts it.
 */
static int
entry_min_sectors (const uint8_t *p)
{
  const uint8_t *valid = p + 16, *dirty = p + 32;
  bool any_valid = false, any_dirty = false;
  int top = 0;

  if (le32 (p + ENT_CRC_OFF) != ref_crc32c (p, ENT_CRC_OFF))
    return -1;
  if (p[53] > 3)                /* the policy hint */
    return -1;
  if (p[54] > 1)                /* flags: only "unsealed" */
    return -1;
  if (p[54] == 1 && p[52] == LAYOUT_FREE)
    return -1;                  /* only cached data is ever unsealed */
  for (int i = 55; i < ENT_CRC_OFF; i++)
    if (p[i] != 0 && p[52] != LAYOUT_DIRTY)
      return -1;                /* the flush generation: dirty only */
  for (int i = 0; i < LAYOUT_MAX_SECTORS; i++) {
    bool v = (valid[i / 8] >> (i % 8)) & 1, d = (dirty[i / 8] >> (i % 8)) & 1;
    if (d && !v)
      return -1;
    if (v)
      top = i + 1;
    any_valid |= v;
    any_dirty |= d;
  }
  switch (p[52]) {
  case LAYOUT_FREE:  if (any_valid || any_dirty) return -1; break;
  case LAYOUT_CLEAN: if (!any_valid || any_dirty) return -1; break;
  case LAYOUT_DIRTY: if (!any_dirty) return -1; break;
  default: return -1;
  }
  return top > 0 ? top : 1;
}

static void
decode_one (const uint8_t *buf, uint32_t nsectors, int min)
{
  uint8_t *copy = xmalloc (LAYOUT_ENTRY_SIZE);
  uint8_t *enc = xmalloc (LAYOUT_ENTRY_SIZE);
  struct layout_entry e;
  bool want;
  int r;

  memcpy (copy, buf, LAYOUT_ENTRY_SIZE);
  memset (&e, 0x5a, sizeof e);
  r = layout_entry_decode (buf, nsectors, &e);
  CHECK (r == 0 || r == -1);
  CHECK (memcmp (buf, copy, LAYOUT_ENTRY_SIZE) == 0);
  want = min > 0 && nsectors >= (uint32_t) min &&
    nsectors <= LAYOUT_MAX_SECTORS;
  if (want != (r == 0)) {
    fprintf (stderr, "fuzz-layout: entry decode with nsectors %u returned %d,"
             " expected %s (smallest accepted nsectors %d)\n",
             nsectors, r, want ? "0" : "-1", min);
    CHECK (want == (r == 0));
  }
  if (r == 0) {
    fuzz_layout_counts.entry_accepted++;
    CHECK (e.state <= LAYOUT_DIRTY);
    CHECK (e.page == le64 (buf) && e.seq == le64 (buf + 8));
    CHECK (e.data_crc == le32 (buf + 48));
    CHECK (e.flags == buf[54]);
    CHECK (e.gen == (le64 (buf + 52) >> 24 & ((1ULL << 40) - 1)));
    for (unsigned i = 0; i < LAYOUT_MAX_SECTORS; i++) {
      if (layout_bit_test (e.dirty, i))
        CHECK (layout_bit_test (e.valid, i));
      if (i >= nsectors)
        CHECK (!layout_bit_test (e.valid, i));
    }
    layout_entry_encode (&e, enc);
    CHECK (memcmp (enc, buf, LAYOUT_ENTRY_SIZE) == 0);
  }
  else
    fuzz_layout_counts.entry_rejected++;
  free (enc);
  free (copy);
}

static void
check_entry (const uint8_t *piece, size_t len, bool fix_crc,
             uint32_t seed_nsectors, bool all_nsectors)
{
  uint8_t *buf = xmalloc (LAYOUT_ENTRY_SIZE);
  int min;

  memset (buf, 0, LAYOUT_ENTRY_SIZE);
  memcpy (buf, piece, len);
  if (fix_crc)
    put_le32 (buf + ENT_CRC_OFF, ref_crc32c (buf, ENT_CRC_OFF));
  min = entry_min_sectors (buf);

  decode_one (buf, 0, min);
  decode_one (buf, LAYOUT_MAX_SECTORS + 1, min);
  decode_one (buf, UINT32_MAX, min);
  if (all_nsectors) {
    for (uint32_t n = 1; n <= LAYOUT_MAX_SECTORS; n++)
      decode_one (buf, n, min);
  }
  else {
    decode_one (buf, seed_nsectors, min);
    decode_one (buf, LAYOUT_MAX_SECTORS, min);
    if (min > 1) {
      decode_one (buf, min - 1, min);
      decode_one (buf, min, min);
    }
  }
  free (buf);
}

/*----------------------------------------------------------------------
 * Geometry and CRC patching
 */

static void
check_geometry (const uint8_t *p, size_t len)
{
  uint8_t b[12] = { 0 };
  uint32_t page_size;
  uint64_t nslots, pt, pool, total;

  memcpy (b, p, len < sizeof b ? len : sizeof b);
  page_size = le32 (b);
  nslots = le64 (b + 4);
  if (layout_geometry (page_size, nslots, &pt, &pool, &total)) {
    unsigned __int128 pt_end = LAYOUT_PT_OFFSET +
      (unsigned __int128) nslots * LAYOUT_ENTRY_SIZE;
    unsigned __int128 end = (unsigned __int128) pool +
      (unsigned __int128) nslots * page_size;
    CHECK (page_size != 0);
    CHECK (pt == LAYOUT_PT_OFFSET);
    CHECK (pool % LAYOUT_POOL_ALIGN == 0);
    CHECK (pool >= pt_end && pool - pt_end < LAYOUT_POOL_ALIGN);
    CHECK (end == total && end <= INT64_MAX);
  }
}

static void
check_crc_patch (const uint8_t *p, size_t len)
{
  size_t off, n;
  uint8_t *buf, *newb;
  uint32_t crc, patched;

  if (len < 4)
    return;
  off = p[0] % len;
  n = p[1] % (len - off + 1);
  buf = xmalloc (len);
  newb = xmalloc (n ? n : 1);
  memcpy (buf, p, len);
  for (size_t i = 0; i < n; i++)
    newb[i] = buf[off + i] ^ p[(i + 2) % len] ^ 0x5c;
  crc = layout_crc32c (buf, len);
  CHECK (crc == ref_crc32c (buf, len));
  patched = layout_crc32c_patch (crc, len, off, buf + off, newb, n);
  memcpy (buf + off, newb, n);
  CHECK (patched == ref_crc32c (buf, len));
  free (newb);
  free (buf);
}

/*----------------------------------------------------------------------
 * Entry point
 */

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  const uint8_t *payload;
  size_t len;
  uint8_t control, nseed;

  if (size < 2)
    return 0;
  control = data[0];
  nseed = data[1];
  payload = data + 2;
  len = size - 2;

  check_sb (payload, len, control & 1);
  for (size_t i = 0, k = 0; i < len && k < MAX_ENTRIES;
       i += LAYOUT_ENTRY_SIZE, k++) {
    size_t n = len - i < LAYOUT_ENTRY_SIZE ? len - i : LAYOUT_ENTRY_SIZE;
    check_entry (payload + i, n, control & 2, 1 + nseed % LAYOUT_MAX_SECTORS,
                 k == 0);
  }
  check_geometry (payload, len);
  if (len <= 4096)
    check_crc_patch (payload, len);
  return 0;
}
