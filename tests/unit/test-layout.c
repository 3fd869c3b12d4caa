/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: the on-SSD format (layout.c).
 *
 * CRC32C, geometry, superblock and page-table entry encode/decode, and
 * rejection of every single-bit corruption of an encoded superblock and
 * of an encoded entry.
 *
 * "Valid CRC but bad content" cases are built by encoding, patching a
 * field and recomputing the CRC by hand, following the documented
 * format: superblock CRC32C of bytes [0, 4092) stored little-endian at
 * 4092; entry CRC32C of bytes [0, 60) stored little-endian at 60.
 * Field offsets are found by diffing encodings that differ in one field
 * only, so these tests do not hard-code more of the format than needed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "layout.h"

#define SB_CRC_OFFSET    (LAYOUT_SB_SIZE - 4)
#define ENTRY_CRC_OFFSET (LAYOUT_ENTRY_SIZE - 4)

static uint32_t
get_le32 (const uint8_t *p)
{
  return (uint32_t) p[0] | ((uint32_t) p[1] << 8) |
    ((uint32_t) p[2] << 16) | ((uint32_t) p[3] << 24);
}

static void
put_le32 (uint8_t *p, uint32_t v)
{
  p[0] = v; p[1] = v >> 8; p[2] = v >> 16; p[3] = v >> 24;
}

static void
fix_sb_crc (uint8_t *buf)
{
  put_le32 (buf + SB_CRC_OFFSET, layout_crc32c (buf, SB_CRC_OFFSET));
}

static void
fix_entry_crc (uint8_t *buf)
{
  put_le32 (buf + ENTRY_CRC_OFFSET, layout_crc32c (buf, ENTRY_CRC_OFFSET));
}

/* Offsets where a and b differ; returns how many (up to max stored). */
static size_t
diff_offsets (const uint8_t *a, const uint8_t *b, size_t len,
              size_t *offs, size_t max)
{
  size_t n = 0;

  for (size_t i = 0; i < len; ++i)
    if (a[i] != b[i]) {
      if (n < max)
        offs[n] = i;
      n++;
    }
  return n;
}

/*----------------------------------------------------------------------
 * CRC32C
 */

static void
test_crc32c_check_value (void **state)
{
  assert_int_equal (layout_crc32c ("123456789", 9), 0xe3069283);
  assert_int_equal (layout_crc32c ("", 0), 0);
  assert_int_equal (layout_crc32c_update (0, "123456789", 9), 0xe3069283);
}

/* RFC 3720 (iSCSI) appendix B.4 test vectors. */
static void
test_crc32c_rfc3720 (void **state)
{
  uint8_t buf[32];

  memset (buf, 0, sizeof buf);
  assert_int_equal (layout_crc32c (buf, sizeof buf), 0x8a9136aa);
  memset (buf, 0xff, sizeof buf);
  assert_int_equal (layout_crc32c (buf, sizeof buf), 0x62a8ab43);
  for (int i = 0; i < 32; ++i)
    buf[i] = i;
  assert_int_equal (layout_crc32c (buf, sizeof buf), 0x46dd794e);
  for (int i = 0; i < 32; ++i)
    buf[i] = 31 - i;
  assert_int_equal (layout_crc32c (buf, sizeof buf), 0x113fdb5c);
}

static void
test_crc32c_chaining (void **state)
{
  const char *s = "123456789";
  uint8_t big[10000];
  uint32_t whole;

  for (size_t split = 0; split <= 9; ++split) {
    uint32_t c = layout_crc32c_update (0, s, split);
    c = layout_crc32c_update (c, s + split, 9 - split);
    assert_int_equal (c, 0xe3069283);
  }

  srandom (1);
  for (size_t i = 0; i < sizeof big; ++i)
    big[i] = random ();
  whole = layout_crc32c (big, sizeof big);
  for (size_t split = 0; split <= sizeof big; split += 97) {
    uint32_t c = layout_crc32c_update (0, big, split);
    c = layout_crc32c_update (c, big + split, sizeof big - split);
    assert_int_equal (c, whole);
  }
  /* Three pieces, odd sizes, and a zero-length piece in the middle. */
  {
    uint32_t c = layout_crc32c_update (0, big, 1);
    c = layout_crc32c_update (c, big + 1, 0);
    c = layout_crc32c_update (c, big + 1, 4095);
    c = layout_crc32c_update (c, big + 4096, sizeof big - 4096);
    assert_int_equal (c, whole);
  }
  /* Any change of one byte changes the CRC. */
  big[5000] ^= 1;
  assert_int_not_equal (layout_crc32c (big, sizeof big), whole);
}

/* layout_crc32c_patch: the CRC after changing bytes [off, off+n) equals
 * the CRC recomputed over the whole changed buffer.
 */
static void
test_crc32c_patch (void **state)
{
  static uint8_t buf[3 * 65536 + 17], old[9000];
  uint64_t x = 12345;

  for (size_t i = 0; i < sizeof buf; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    buf[i] = x >> 56;
  }
  for (int round = 0; round < 200; ++round) {
    size_t len = 1 + (round * 7919) % sizeof buf;
    uint32_t before, patched;
    size_t off, n;

    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    off = (x >> 20) % len;
    n = 1 + (x >> 40) % (len - off < sizeof old ? len - off : sizeof old);
    if (round % 10 == 0) {             /* edges */
      off = round % 20 ? 0 : len - n;
    }
    before = layout_crc32c (buf, len);
    memcpy (old, buf + off, n);
    for (size_t i = 0; i < n; ++i)
      buf[off + i] ^= (uint8_t) (i * 31 + round + 1) | 1;
    patched = layout_crc32c_patch (before, len, off, old, buf + off, n);
    if (patched != layout_crc32c (buf, len))
      fail_msg ("crc32c_patch len=%zu off=%zu n=%zu: got 0x%08x, "
                "want 0x%08x", len, off, n, patched,
                layout_crc32c (buf, len));
  }
  /* No change at all: same CRC. */
  {
    uint32_t c = layout_crc32c (buf, 4096);
    memcpy (old, buf + 100, 50);
    assert_int_equal (layout_crc32c_patch (c, 4096, 100, old, buf + 100, 50),
                      c);
  }
}

/*----------------------------------------------------------------------
 * Geometry
 */

static void
test_sector_size (void **state)
{
  /* max(512, page_size / 128) */
  assert_int_equal (layout_sector_size (4096), 512);
  assert_int_equal (layout_sector_size (8192), 512);
  assert_int_equal (layout_sector_size (16384), 512);
  assert_int_equal (layout_sector_size (32768), 512);
  assert_int_equal (layout_sector_size (65536), 512);
  assert_int_equal (layout_sector_size (131072), 1024);
  assert_int_equal (layout_sector_size (262144), 2048);
  assert_int_equal (layout_sector_size (524288), 4096);
  assert_int_equal (layout_sector_size (1048576), 8192);
  assert_int_equal (layout_sector_size (2097152), 16384);

  for (uint32_t ps = LAYOUT_MIN_PAGE; ps <= LAYOUT_MAX_PAGE; ps *= 2) {
    uint32_t ss = layout_sector_size (ps);
    assert_true (ss >= LAYOUT_MIN_SECTOR);
    assert_int_equal (ps % ss, 0);
    assert_true (ps / ss <= LAYOUT_MAX_SECTORS);
    assert_int_equal (ss & (ss - 1), 0);
  }
}

static uint64_t
round_up (uint64_t v, uint64_t a)
{
  return (v + a - 1) / a * a;
}

static void
check_geometry (uint32_t ps, uint64_t nslots)
{
  uint64_t pt = 0, pool = 0, total = 0;

  assert_true (layout_geometry (ps, nslots, &pt, &pool, &total));
  assert_int_equal (pt, LAYOUT_PT_OFFSET);
  assert_int_equal (pool,
                    round_up (LAYOUT_PT_OFFSET + nslots * LAYOUT_ENTRY_SIZE,
                              LAYOUT_POOL_ALIGN));
  assert_int_equal (pool % LAYOUT_POOL_ALIGN, 0);
  assert_true (pool >= pt + nslots * LAYOUT_ENTRY_SIZE);
  assert_int_equal (total, pool + nslots * ps);
}

static void
test_geometry (void **state)
{
  uint64_t pt, pool, total;

  /* Exact values for a few cases. */
  assert_true (layout_geometry (4096, 1, &pt, &pool, &total));
  assert_int_equal (pt, 8192);
  assert_int_equal (pool, 1024 * 1024);
  assert_int_equal (total, 1024 * 1024 + 4096);

  assert_true (layout_geometry (65536, 16384, &pt, &pool, &total));
  assert_int_equal (pt, 8192);
  assert_int_equal (pool, 2 * 1024 * 1024);   /* 8K + 1M rounded up */
  assert_int_equal (total, 2 * 1024 * 1024 + 16384ULL * 65536);

  /* Exactly filling the first MiB: 8192 + n*64 == 1 MiB. */
  assert_true (layout_geometry (4096, (1024 * 1024 - 8192) / 64,
                                &pt, &pool, &total));
  assert_int_equal (pool, 1024 * 1024);

  check_geometry (4096, 4);
  check_geometry (4096, 16383);
  check_geometry (4096, 16384);
  check_geometry (65536, 16385);
  check_geometry (2097152, 1 << 20);              /* 2 TiB of data */
  check_geometry (65536, 1ULL << 31);              /* 128 TiB */
}

static void
test_geometry_overflow (void **state)
{
  uint64_t pt, pool, total;

  assert_false (layout_geometry (4096, UINT64_MAX, &pt, &pool, &total));
  assert_false (layout_geometry (4096, UINT64_MAX / 64 + 1,
                                 &pt, &pool, &total));
  /* page table fits but the pool overflows */
  assert_false (layout_geometry (2097152, 1ULL << 50, &pt, &pool, &total));
  assert_false (layout_geometry (LAYOUT_MAX_PAGE,
                                 UINT64_MAX / LAYOUT_MAX_PAGE,
                                 &pt, &pool, &total));
  /* Page table exactly at the limit plus rounding overflows. */
  assert_false (layout_geometry (4096, (UINT64_MAX - 8192) / 64,
                                 &pt, &pool, &total));
}

/*----------------------------------------------------------------------
 * Superblock
 */

static void
make_sb (struct layout_sb *sb)
{
  memset (sb, 0, sizeof *sb);
  sb->version = LAYOUT_VERSION;
  sb->flags = LAYOUT_SB_CLEAN;
  for (int i = 0; i < 16; ++i)
    sb->uuid[i] = 0xa0 + i;
  sb->page_size = 65536;
  sb->sector_size = layout_sector_size (65536);
  sb->nslots = 1000;
  uint64_t total;
  assert_true (layout_geometry (sb->page_size, sb->nslots, &sb->pt_offset,
                                &sb->pool_offset, &total));
  sb->backend_size = 123456789012ULL;
  sb->id_digest[0] = 0x0123456789abcdefULL;
  sb->id_digest[1] = 0xfedcba9876543210ULL;
  snprintf (sb->id_text, sizeof sb->id_text,
            "file=/var/tmp/disk.img export=\"\"");
  sb->generation = 0x1122334455667788ULL;
  sb->mode = LAYOUT_MODE_WRITEAROUND;
}

static void
assert_sb_equal (const struct layout_sb *a, const struct layout_sb *b)
{
  assert_int_equal (a->version, b->version);
  assert_int_equal (a->flags, b->flags);
  assert_memory_equal (a->uuid, b->uuid, 16);
  assert_int_equal (a->page_size, b->page_size);
  assert_int_equal (a->sector_size, b->sector_size);
  assert_int_equal (a->nslots, b->nslots);
  assert_int_equal (a->pt_offset, b->pt_offset);
  assert_int_equal (a->pool_offset, b->pool_offset);
  assert_int_equal (a->backend_size, b->backend_size);
  assert_int_equal (a->id_digest[0], b->id_digest[0]);
  assert_int_equal (a->id_digest[1], b->id_digest[1]);
  assert_string_equal (a->id_text, b->id_text);
  assert_int_equal (a->generation, b->generation);
  assert_int_equal (a->mode, b->mode);
}

static void
test_sb_roundtrip (void **state)
{
  struct layout_sb sb, out;
  uint8_t buf[LAYOUT_SB_SIZE], buf2[LAYOUT_SB_SIZE];
  const char *why = NULL;

  make_sb (&sb);
  memset (buf, 0x5a, sizeof buf);
  layout_sb_encode (&sb, buf);
  assert_memory_equal (buf, LAYOUT_MAGIC, 8);
  /* Documented CRC placement. */
  assert_int_equal (get_le32 (buf + SB_CRC_OFFSET),
                    layout_crc32c (buf, SB_CRC_OFFSET));

  memset (&out, 0xee, sizeof out);
  assert_int_equal (layout_sb_decode (buf, &out, &why), 0);
  assert_sb_equal (&sb, &out);

  /* Encoding is deterministic and does not depend on the old buffer
   * contents (padding is zeroed).
   */
  memset (buf2, 0xa5, sizeof buf2);
  layout_sb_encode (&sb, buf2);
  assert_memory_equal (buf, buf2, sizeof buf);

  /* Every mode, other flags, other page sizes, id_text at full length. */
  for (uint32_t ps = LAYOUT_MIN_PAGE; ps <= LAYOUT_MAX_PAGE; ps *= 2) {
    uint64_t total;
    make_sb (&sb);
    sb.page_size = ps;
    sb.sector_size = layout_sector_size (ps);
    sb.nslots = 1 + ps / 4096 * 7;
    assert_true (layout_geometry (ps, sb.nslots, &sb.pt_offset,
                                  &sb.pool_offset, &total));
    sb.flags = (ps & 0x10000) ? LAYOUT_SB_CLEAN : 0;
    sb.mode = (ps / 4096) % 3;
    sb.generation = ps;
    memset (sb.id_text, 0, sizeof sb.id_text);
    memset (sb.id_text, 'a' + (ps / 4096) % 26, LAYOUT_ID_MAX - 1);
    layout_sb_encode (&sb, buf);
    why = NULL;
    assert_int_equal (layout_sb_decode (buf, &out, &why), 0);
    assert_sb_equal (&sb, &out);
  }

  /* Empty id_text. */
  make_sb (&sb);
  sb.id_text[0] = '\0';
  layout_sb_encode (&sb, buf);
  assert_int_equal (layout_sb_decode (buf, &out, &why), 0);
  assert_sb_equal (&sb, &out);
}

static void
test_sb_every_bit_flip (void **state)
{
  struct layout_sb sb, out;
  static uint8_t buf[LAYOUT_SB_SIZE];
  size_t accepted = 0;
  long first_accepted = -1;

  make_sb (&sb);
  layout_sb_encode (&sb, buf);
  for (size_t bit = 0; bit < LAYOUT_SB_SIZE * 8; ++bit) {
    const char *why = NULL;
    buf[bit / 8] ^= 1u << (bit % 8);
    if (layout_sb_decode (buf, &out, &why) == 0) {
      if (first_accepted < 0)
        first_accepted = bit;
      accepted++;
    }
    else if (why == NULL) {
      fail_msg ("bit %zu: decode failed but gave no reason", bit);
    }
    buf[bit / 8] ^= 1u << (bit % 8);
  }
  if (accepted)
    fail_msg ("%zu single-bit corruptions of the superblock were accepted "
              "(first: bit %ld, byte %ld)", accepted, first_accepted,
              first_accepted / 8);
  /* And the untouched buffer still decodes. */
  assert_int_equal (layout_sb_decode (buf, &out, &(const char *){NULL}), 0);
}

static void
test_sb_zero_and_garbage (void **state)
{
  static uint8_t buf[LAYOUT_SB_SIZE];
  struct layout_sb out;
  const char *why;

  memset (buf, 0, sizeof buf);
  why = NULL;
  assert_int_equal (layout_sb_decode (buf, &out, &why), -1);
  assert_non_null (why);

  memset (buf, 0xff, sizeof buf);
  why = NULL;
  assert_int_equal (layout_sb_decode (buf, &out, &why), -1);
  assert_non_null (why);

  /* Zeros with a valid CRC: still no magic. */
  memset (buf, 0, sizeof buf);
  fix_sb_crc (buf);
  why = NULL;
  assert_int_equal (layout_sb_decode (buf, &out, &why), -1);
  assert_non_null (why);
}

static void
test_sb_bad_magic (void **state)
{
  struct layout_sb sb, out;
  uint8_t buf[LAYOUT_SB_SIZE];
  const char *why;

  make_sb (&sb);
  for (int i = 0; i < 8; ++i) {
    layout_sb_encode (&sb, buf);
    buf[i] ^= 0x20;                 /* e.g. "nBDKSSDC" */
    fix_sb_crc (buf);
    why = NULL;
    assert_int_equal (layout_sb_decode (buf, &out, &why), -1);
    assert_non_null (why);
    if (strcasestr (why, "magic") == NULL)
      fail_msg ("bad magic rejected with reason \"%s\" (no \"magic\")", why);
  }
  /* Without fixing the CRC it is also rejected. */
  layout_sb_encode (&sb, buf);
  memcpy (buf, "NBDKSSDD", 8);
  assert_int_equal (layout_sb_decode (buf, &out, &(const char *){NULL}), -1);
}

/* Find the offset of the 32-bit LE version field: the encoding of a
 * superblock with version 1 vs 2 (if the encoder stores sb->version),
 * else the first LE32 equal to LAYOUT_VERSION after the magic.
 */
static size_t
find_version_offset (void)
{
  struct layout_sb sb;
  uint8_t a[LAYOUT_SB_SIZE], b[LAYOUT_SB_SIZE];
  size_t offs[4], n;

  make_sb (&sb);
  layout_sb_encode (&sb, a);
  sb.version = LAYOUT_VERSION + 1;
  layout_sb_encode (&sb, b);
  n = diff_offsets (a, b, SB_CRC_OFFSET, offs, 4);
  if (n >= 1 && n <= 4) {
    assert_int_equal (get_le32 (a + offs[0]), LAYOUT_VERSION);
    return offs[0];
  }
  assert_int_equal (get_le32 (a + 8), LAYOUT_VERSION);
  return 8;
}

static void
test_sb_future_version (void **state)
{
  struct layout_sb sb, out;
  uint8_t buf[LAYOUT_SB_SIZE];
  const char *why;
  size_t voff = find_version_offset ();
  uint32_t versions[] = { LAYOUT_VERSION + 1, 2, 3, 100, UINT32_MAX, 0 };

  make_sb (&sb);
  for (size_t i = 0; i < sizeof versions / sizeof versions[0]; ++i) {
    if (versions[i] == LAYOUT_VERSION)
      continue;
    layout_sb_encode (&sb, buf);
    put_le32 (buf + voff, versions[i]);
    fix_sb_crc (buf);
    why = NULL;
    assert_int_equal (layout_sb_decode (buf, &out, &why), -1);
    assert_non_null (why);
    if (strcasestr (why, "version") == NULL)
      fail_msg ("version %u rejected with reason \"%s\" (no \"version\")",
                versions[i], why);
  }

  /* Sanity: patching the version back to 1 with a fixed CRC is fine,
   * so the rejection above was about the version.
   */
  layout_sb_encode (&sb, buf);
  put_le32 (buf + voff, LAYOUT_VERSION);
  fix_sb_crc (buf);
  assert_int_equal (layout_sb_decode (buf, &out, &(const char *){NULL}), 0);
}

static void
test_sb_bad_geometry (void **state)
{
  struct layout_sb sb, out;
  uint8_t buf[LAYOUT_SB_SIZE];
  const char *why;

  /* Page size not a power of two. */
  make_sb (&sb);
  sb.page_size = 65536 + 512;
  layout_sb_encode (&sb, buf);
  why = NULL;
  assert_int_equal (layout_sb_decode (buf, &out, &why), -1);
  assert_non_null (why);

  /* Page size out of range. */
  make_sb (&sb);
  sb.page_size = 2048;
  sb.sector_size = 512;
  layout_sb_encode (&sb, buf);
  assert_int_equal (layout_sb_decode (buf, &out, &(const char *){NULL}), -1);
  make_sb (&sb);
  sb.page_size = 4 * 1024 * 1024;
  sb.sector_size = layout_sector_size (2 * 1024 * 1024) * 2;
  layout_sb_encode (&sb, buf);
  assert_int_equal (layout_sb_decode (buf, &out, &(const char *){NULL}), -1);

  /* Sector size not the one of the page size. */
  make_sb (&sb);
  sb.sector_size = 4096;
  layout_sb_encode (&sb, buf);
  assert_int_equal (layout_sb_decode (buf, &out, &(const char *){NULL}), -1);

  /* Region offsets that do not match the slot count. */
  make_sb (&sb);
  sb.pool_offset += LAYOUT_POOL_ALIGN;
  layout_sb_encode (&sb, buf);
  assert_int_equal (layout_sb_decode (buf, &out, &(const char *){NULL}), -1);

  make_sb (&sb);
  sb.pt_offset = 4096;
  layout_sb_encode (&sb, buf);
  assert_int_equal (layout_sb_decode (buf, &out, &(const char *){NULL}), -1);

  make_sb (&sb);
  sb.nslots = 1ULL << 60;
  layout_sb_encode (&sb, buf);
  assert_int_equal (layout_sb_decode (buf, &out, &(const char *){NULL}), -1);

  /* No slots. */
  make_sb (&sb);
  sb.nslots = 0;
  assert_true (layout_geometry (sb.page_size, 1, &sb.pt_offset,
                                &sb.pool_offset, &(uint64_t){0}));
  layout_sb_encode (&sb, buf);
  assert_int_equal (layout_sb_decode (buf, &out, &(const char *){NULL}), -1);
}

/*----------------------------------------------------------------------
 * Page-table entries
 */

static void
make_entry (struct layout_entry *e, uint8_t state)
{
  memset (e, 0, sizeof *e);
  e->state = state;
  if (state == LAYOUT_FREE)
    return;
  e->page = (1ULL << 50) + 12345;
  e->seq = 0x0102030405060708ULL;
  e->data_crc = 0xdeadbeef;
  for (unsigned i = 0; i < LAYOUT_MAX_SECTORS; i += 3)
    layout_bit_set (e->valid, i);
  layout_bit_set (e->valid, LAYOUT_MAX_SECTORS - 1);
  if (state == LAYOUT_DIRTY) {
    for (unsigned i = 0; i < LAYOUT_MAX_SECTORS; i += 6)
      layout_bit_set (e->dirty, i);
    layout_bit_set (e->dirty, LAYOUT_MAX_SECTORS - 1);
  }
}

static void
assert_entry_equal (const struct layout_entry *a, const struct layout_entry *b)
{
  assert_int_equal (a->state, b->state);
  assert_int_equal (a->page, b->page);
  assert_int_equal (a->seq, b->seq);
  assert_int_equal (a->data_crc, b->data_crc);
  assert_int_equal (a->flags, b->flags);
  assert_memory_equal (a->valid, b->valid, sizeof a->valid);
  assert_memory_equal (a->dirty, b->dirty, sizeof a->dirty);
}

/* e encoded, then decoded for a page of nsec sectors: the result. */
static int
entry_redecode (const struct layout_entry *e, unsigned nsec)
{
  uint8_t buf[LAYOUT_ENTRY_SIZE];
  struct layout_entry out;

  layout_entry_encode (e, buf);
  return layout_entry_decode (buf, nsec, &out);
}

/* e encoded, then decoded for a page of nsec sectors, is e again. */
static void
assert_entry_round_trip (const struct layout_entry *e, unsigned nsec)
{
  uint8_t buf[LAYOUT_ENTRY_SIZE];
  struct layout_entry out;

  layout_entry_encode (e, buf);
  assert_int_equal (layout_entry_decode (buf, nsec, &out), 0);
  assert_entry_equal (e, &out);
}

static void
test_entry_roundtrip (void **state)
{
  uint8_t states[] = { LAYOUT_FREE, LAYOUT_CLEAN, LAYOUT_DIRTY };
  struct layout_entry e, out;
  uint8_t buf[LAYOUT_ENTRY_SIZE], buf2[LAYOUT_ENTRY_SIZE];

  for (size_t i = 0; i < 3; ++i) {
    make_entry (&e, states[i]);
    memset (buf, 0x5a, sizeof buf);
    layout_entry_encode (&e, buf);
    assert_int_equal (get_le32 (buf + ENTRY_CRC_OFFSET),
                      layout_crc32c (buf, ENTRY_CRC_OFFSET));
    memset (&out, 0xee, sizeof out);
    assert_int_equal (layout_entry_decode (buf, LAYOUT_MAX_SECTORS, &out), 0);
    assert_entry_equal (&e, &out);

    memset (buf2, 0xa5, sizeof buf2);
    layout_entry_encode (&e, buf2);
    assert_memory_equal (buf, buf2, sizeof buf);
  }

  /* Extreme values. */
  make_entry (&e, LAYOUT_CLEAN);
  e.page = UINT64_MAX - 1;
  e.seq = UINT64_MAX;
  e.data_crc = UINT32_MAX;
  memset (e.valid, 0xff, sizeof e.valid);
  assert_entry_round_trip (&e, LAYOUT_MAX_SECTORS);

  make_entry (&e, LAYOUT_DIRTY);
  memset (e.valid, 0xff, sizeof e.valid);
  memset (e.dirty, 0xff, sizeof e.dirty);
  e.page = 0;
  e.seq = 1;
  assert_entry_round_trip (&e, LAYOUT_MAX_SECTORS);

  /* Small page: 8 sectors (4 KiB / 512). */
  make_entry (&e, LAYOUT_CLEAN);
  memset (e.valid, 0, sizeof e.valid);
  e.valid[0] = 0xff;
  assert_entry_round_trip (&e, 8);
}

/* The flush generation (bytes 55..59): 40 bits kept in dirty entries;
 * any other state with one is refused, and so is a bigger value.
 */
static void
test_entry_gen (void **state)
{
  struct layout_entry e, out;
  uint8_t buf[LAYOUT_ENTRY_SIZE];

  make_entry (&e, LAYOUT_DIRTY);
  e.gen = 0xfedcba9876ULL;
  layout_entry_encode (&e, buf);
  assert_int_equal (buf[55], 0x76);
  assert_int_equal (buf[59], 0xfe);
  assert_int_equal (layout_entry_decode (buf, LAYOUT_MAX_SECTORS, &out), 0);
  assert_true (out.gen == 0xfedcba9876ULL);
  e.gen = LAYOUT_GEN_MASK + 2;             /* only 40 bits are kept */
  layout_entry_encode (&e, buf);
  assert_int_equal (layout_entry_decode (buf, LAYOUT_MAX_SECTORS, &out), 0);
  assert_true (out.gen == 1);
  make_entry (&e, LAYOUT_CLEAN);
  e.gen = 5;
  assert_int_equal (entry_redecode (&e, LAYOUT_MAX_SECTORS), -1);
  make_entry (&e, LAYOUT_FREE);
  e.gen = 5;
  assert_int_equal (entry_redecode (&e, LAYOUT_MAX_SECTORS), -1);
}

static void
test_entry_every_bit_flip (void **state)
{
  uint8_t states[] = { LAYOUT_FREE, LAYOUT_CLEAN, LAYOUT_DIRTY };
  struct layout_entry e, out;
  uint8_t buf[LAYOUT_ENTRY_SIZE];

  for (size_t s = 0; s < 3; ++s) {
    make_entry (&e, states[s]);
    layout_entry_encode (&e, buf);
    for (size_t bit = 0; bit < LAYOUT_ENTRY_SIZE * 8; ++bit) {
      buf[bit / 8] ^= 1u << (bit % 8);
      if (layout_entry_decode (buf, LAYOUT_MAX_SECTORS, &out) == 0)
        fail_msg ("state %u: flip of bit %zu (byte %zu) accepted",
                  states[s], bit, bit / 8);
      buf[bit / 8] ^= 1u << (bit % 8);
    }
    assert_int_equal (layout_entry_decode (buf, LAYOUT_MAX_SECTORS, &out), 0);
  }
}

static void
test_entry_all_zero (void **state)
{
  uint8_t buf[LAYOUT_ENTRY_SIZE];
  struct layout_entry out;

  memset (buf, 0, sizeof buf);
  assert_int_equal (layout_entry_decode (buf, LAYOUT_MAX_SECTORS, &out), -1);
  assert_int_equal (layout_entry_decode (buf, 8, &out), -1);
  memset (buf, 0xff, sizeof buf);
  assert_int_equal (layout_entry_decode (buf, LAYOUT_MAX_SECTORS, &out), -1);
}

static void
test_entry_bits_past_page (void **state)
{
  struct layout_entry e, out;
  uint8_t buf[LAYOUT_ENTRY_SIZE];

  /* 4 KiB pages have 8 sectors: bit 8 is past the page. */
  for (unsigned nsec = 8; nsec < LAYOUT_MAX_SECTORS; nsec *= 2) {
    /* valid bit at nsec */
    make_entry (&e, LAYOUT_CLEAN);
    memset (e.valid, 0, sizeof e.valid);
    layout_bit_set (e.valid, 0);
    layout_bit_set (e.valid, nsec - 1);
    assert_int_equal (entry_redecode (&e, nsec), 0);

    layout_bit_set (e.valid, nsec);
    layout_entry_encode (&e, buf);
    if (layout_entry_decode (buf, nsec, &out) != -1)
      fail_msg ("valid bit %u accepted with nsectors %u", nsec, nsec);
    /* The same entry is fine for a bigger page. */
    assert_int_equal (layout_entry_decode (buf, LAYOUT_MAX_SECTORS, &out), 0);

    /* last bit of the map */
    make_entry (&e, LAYOUT_CLEAN);
    memset (e.valid, 0, sizeof e.valid);
    layout_bit_set (e.valid, LAYOUT_MAX_SECTORS - 1);
    assert_int_equal (entry_redecode (&e, nsec), -1);

    /* dirty bit past the page (valid too, so subset holds) */
    make_entry (&e, LAYOUT_DIRTY);
    memset (e.valid, 0, sizeof e.valid);
    memset (e.dirty, 0, sizeof e.dirty);
    layout_bit_set (e.valid, nsec + 1);
    layout_bit_set (e.dirty, nsec + 1);
    layout_entry_encode (&e, buf);
    assert_int_equal (layout_entry_decode (buf, nsec, &out), -1);
    assert_int_equal (layout_entry_decode (buf, LAYOUT_MAX_SECTORS, &out), 0);
  }
}

/* The map checks against the rule, bit by bit: for every page size in
 * sectors, maps with a few random bits.
 */
static void
test_entry_bits_rule (void **state)
{
  struct layout_entry e, out;
  uint8_t buf[LAYOUT_ENTRY_SIZE];
  unsigned seed = 1;

  for (unsigned nsec = 1; nsec <= LAYOUT_MAX_SECTORS; nsec++)
    for (int k = 0; k < 200; k++) {
      bool ok = true;

      make_entry (&e, LAYOUT_DIRTY);
      memset (e.valid, 0, sizeof e.valid);
      memset (e.dirty, 0, sizeof e.dirty);
      layout_bit_set (e.valid, 0);
      layout_bit_set (e.dirty, 0);
      for (int n = 0; n < 3; n++) {
        layout_bit_set (e.valid, rand_r (&seed) % LAYOUT_MAX_SECTORS);
        if (rand_r (&seed) % 2)
          layout_bit_set (e.dirty, rand_r (&seed) % LAYOUT_MAX_SECTORS);
      }
      for (unsigned i = 0; i < LAYOUT_MAX_SECTORS; i++) {
        bool v = layout_bit_test (e.valid, i), d = layout_bit_test (e.dirty, i);

        ok &= !((v || d) && i >= nsec) && !(d && !v);
      }
      layout_entry_encode (&e, buf);
      if ((layout_entry_decode (buf, nsec, &out) == 0) != ok)
        fail_msg ("nsectors %u: entry %s, should be %s", nsec,
                  ok ? "refused" : "accepted", ok ? "accepted" : "refused");
    }
}

static void
test_entry_dirty_not_subset (void **state)
{
  struct layout_entry e;

  make_entry (&e, LAYOUT_DIRTY);
  memset (e.valid, 0, sizeof e.valid);
  memset (e.dirty, 0, sizeof e.dirty);
  layout_bit_set (e.valid, 3);
  layout_bit_set (e.dirty, 3);
  assert_int_equal (entry_redecode (&e, LAYOUT_MAX_SECTORS), 0);

  layout_bit_set (e.dirty, 5);          /* dirty but not valid */
  assert_int_equal (entry_redecode (&e, LAYOUT_MAX_SECTORS), -1);

  for (unsigned i = 0; i < LAYOUT_MAX_SECTORS; i += 17) {
    make_entry (&e, LAYOUT_DIRTY);
    memset (e.valid, 0xff, sizeof e.valid);
    memset (e.dirty, 0xff, sizeof e.dirty);
    layout_bit_clear (e.valid, i);
    if (entry_redecode (&e, LAYOUT_MAX_SECTORS) != -1)
      fail_msg ("dirty sector %u not valid, accepted", i);
  }
}

/* Offset of the state byte: CLEAN vs DIRTY entries with the same
 * fields (no dirty bits) differ only there.
 */
static size_t
find_state_offset (void)
{
  struct layout_entry e;
  uint8_t a[LAYOUT_ENTRY_SIZE], b[LAYOUT_ENTRY_SIZE];
  size_t offs[4];

  make_entry (&e, LAYOUT_CLEAN);
  layout_entry_encode (&e, a);
  e.state = LAYOUT_DIRTY;
  layout_entry_encode (&e, b);
  assert_int_equal (diff_offsets (a, b, ENTRY_CRC_OFFSET, offs, 4), 1);
  assert_int_equal (a[offs[0]], LAYOUT_CLEAN);
  assert_int_equal (b[offs[0]], LAYOUT_DIRTY);
  return offs[0];
}

static void
test_entry_bad_state (void **state)
{
  struct layout_entry e, out;
  uint8_t buf[LAYOUT_ENTRY_SIZE];
  size_t soff = find_state_offset ();

  for (unsigned st = 3; st < 256; ++st) {
    make_entry (&e, LAYOUT_CLEAN);
    layout_entry_encode (&e, buf);
    buf[soff] = st;
    fix_entry_crc (buf);
    if (layout_entry_decode (buf, LAYOUT_MAX_SECTORS, &out) != -1)
      fail_msg ("unknown state %u accepted", st);
  }
  /* Sanity: patching back to CLEAN with a fixed CRC decodes. */
  make_entry (&e, LAYOUT_CLEAN);
  layout_entry_encode (&e, buf);
  buf[soff] = LAYOUT_CLEAN;
  fix_entry_crc (buf);
  assert_int_equal (layout_entry_decode (buf, LAYOUT_MAX_SECTORS, &out), 0);
}

static void
test_entry_free_with_data (void **state)
{
  struct layout_entry e;

  make_entry (&e, LAYOUT_FREE);
  layout_bit_set (e.valid, 0);
  assert_int_equal (entry_redecode (&e, LAYOUT_MAX_SECTORS), -1);

  make_entry (&e, LAYOUT_FREE);
  layout_bit_set (e.valid, 7);
  layout_bit_set (e.dirty, 7);
  assert_int_equal (entry_redecode (&e, LAYOUT_MAX_SECTORS), -1);
}

/* A CLEAN entry carries no dirty sectors. */
static void
test_entry_clean_with_dirty (void **state)
{
  struct layout_entry e;

  make_entry (&e, LAYOUT_CLEAN);
  memset (e.valid, 0xff, sizeof e.valid);
  layout_bit_set (e.dirty, 9);
  assert_int_equal (entry_redecode (&e, LAYOUT_MAX_SECTORS), -1);
}

/* The unsealed flag: kept for dirty and clean entries, refused on free
 * ones; unknown flag bits refused.
 */
static void
test_entry_unsealed (void **state)
{
  struct layout_entry e, out;
  uint8_t buf[LAYOUT_ENTRY_SIZE];

  make_entry (&e, LAYOUT_DIRTY);
  e.flags = LAYOUT_ENT_UNSEALED;
  layout_entry_encode (&e, buf);
  assert_int_equal (buf[54], LAYOUT_ENT_UNSEALED);
  assert_int_equal (layout_entry_decode (buf, LAYOUT_MAX_SECTORS, &out), 0);
  assert_entry_equal (&e, &out);
  /* Every single-bit flip of an unsealed entry is caught too. */
  for (size_t bit = 0; bit < LAYOUT_ENTRY_SIZE * 8; ++bit) {
    buf[bit / 8] ^= 1u << (bit % 8);
    assert_int_equal (layout_entry_decode (buf, LAYOUT_MAX_SECTORS, &out), -1);
    buf[bit / 8] ^= 1u << (bit % 8);
  }

  make_entry (&e, LAYOUT_CLEAN);
  e.flags = LAYOUT_ENT_UNSEALED;
  assert_entry_round_trip (&e, LAYOUT_MAX_SECTORS);

  make_entry (&e, LAYOUT_FREE);
  e.flags = LAYOUT_ENT_UNSEALED;
  assert_int_equal (entry_redecode (&e, LAYOUT_MAX_SECTORS), -1);

  for (unsigned f = 2; f < 256; f <<= 1) {
    make_entry (&e, LAYOUT_DIRTY);
    e.flags = f;
    assert_int_equal (entry_redecode (&e, LAYOUT_MAX_SECTORS), -1);
  }
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_crc32c_check_value),
    cmocka_unit_test (test_crc32c_rfc3720),
    cmocka_unit_test (test_crc32c_chaining),
    cmocka_unit_test (test_crc32c_patch),
    cmocka_unit_test (test_sector_size),
    cmocka_unit_test (test_geometry),
    cmocka_unit_test (test_geometry_overflow),
    cmocka_unit_test (test_sb_roundtrip),
    cmocka_unit_test (test_sb_every_bit_flip),
    cmocka_unit_test (test_sb_zero_and_garbage),
    cmocka_unit_test (test_sb_bad_magic),
    cmocka_unit_test (test_sb_future_version),
    cmocka_unit_test (test_sb_bad_geometry),
    cmocka_unit_test (test_entry_roundtrip),
    cmocka_unit_test (test_entry_gen),
    cmocka_unit_test (test_entry_every_bit_flip),
    cmocka_unit_test (test_entry_all_zero),
    cmocka_unit_test (test_entry_bits_past_page),
    cmocka_unit_test (test_entry_bits_rule),
    cmocka_unit_test (test_entry_dirty_not_subset),
    cmocka_unit_test (test_entry_bad_state),
    cmocka_unit_test (test_entry_free_with_data),
    cmocka_unit_test (test_entry_clean_with_dirty),
    cmocka_unit_test (test_entry_unsealed),
  };

  return cmocka_run_group_tests (tests, NULL, NULL);
}
