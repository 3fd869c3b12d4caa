/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: write the seed corpus of the layout fuzz target.
 *
 *   make-seeds DIR
 *
 * Writes into DIR valid superblocks and page-table entries encoded by
 * layout.c itself, and corrupted variants of them (bad CRC, bad CRC
 * with the fuzz target's "fix the CRC" bit set so that the semantic
 * checks are reached, future version, bad magic, truncation, zeroed and
 * flipped regions, bitmaps past the page, unknown states).  The input
 * format (a control byte, an nsectors byte, the payload) is described in
 * fuzz-layout.c.  Deterministic: the same files every run.
 *
 * Regenerate with "make -C tests fuzz-seeds".
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"

#define CTRL_FIX_SB   1
#define CTRL_FIX_ENT  2

static const char *dir;
static unsigned nfiles;

static void
emit (const char *name, uint8_t control, uint8_t nseed,
      const uint8_t *payload, size_t len)
{
  char path[4096];
  FILE *fp;

  snprintf (path, sizeof path, "%s/%s", dir, name);
  fp = fopen (path, "wb");
  if (fp == NULL || fputc (control, fp) == EOF || fputc (nseed, fp) == EOF ||
      fwrite (payload, 1, len, fp) != len || fclose (fp) != 0) {
    perror (path);
    exit (1);
  }
  nfiles++;
}

static void
put32 (uint8_t *p, uint32_t v)
{
  for (int i = 0; i < 4; i++)
    p[i] = v >> (8 * i);
}

static void
fix_sb_crc (uint8_t *p)
{
  put32 (p + LAYOUT_SB_SIZE - 4, layout_crc32c (p, LAYOUT_SB_SIZE - 4));
}

static void
fix_ent_crc (uint8_t *p)
{
  put32 (p + LAYOUT_ENTRY_SIZE - 4, layout_crc32c (p, LAYOUT_ENTRY_SIZE - 4));
}

static void
make_sb (struct layout_sb *sb, uint32_t page_size, uint64_t nslots,
         uint32_t mode, uint32_t flags, const char *id)
{
  uint64_t total;

  memset (sb, 0, sizeof *sb);
  sb->version = LAYOUT_VERSION;
  sb->flags = flags;
  for (int i = 0; i < 16; i++)
    sb->uuid[i] = 0x10 + i * 7;
  sb->page_size = page_size;
  sb->sector_size = layout_sector_size (page_size);
  sb->nslots = nslots;
  if (!layout_geometry (page_size, nslots, &sb->pt_offset, &sb->pool_offset,
                        &total)) {
    fprintf (stderr, "make-seeds: bad geometry\n");
    exit (1);
  }
  sb->backend_size = nslots * (uint64_t) page_size * 3 + 12345;
  sb->id_digest[0] = 0x0123456789abcdefULL;
  sb->id_digest[1] = 0xfedcba9876543210ULL;
  snprintf (sb->id_text, sizeof sb->id_text, "%s", id);
  sb->generation = 42;
  sb->mode = mode;
}

static void
make_entry (struct layout_entry *e, uint64_t page, uint64_t seq,
            uint8_t state, unsigned nvalid, unsigned ndirty)
{
  memset (e, 0, sizeof *e);
  e->page = page;
  e->seq = seq;
  e->state = state;
  for (unsigned i = 0; i < nvalid; i++)
    layout_bit_set (e->valid, i);
  for (unsigned i = 0; i < ndirty; i++)
    layout_bit_set (e->dirty, i * 2 < nvalid ? i * 2 : i);
  e->data_crc = 0xdeadbeef ^ (uint32_t) page;
}

/* sb encoded into buf (LAYOUT_SB_SIZE bytes) and written as name. */
static void
emit_sb (const char *name, uint8_t control, uint8_t nseed,
         const struct layout_sb *sb, uint8_t *buf)
{
  layout_sb_encode (sb, buf);
  emit (name, control, nseed, buf, LAYOUT_SB_SIZE);
}

/* e encoded into buf (LAYOUT_ENTRY_SIZE bytes) and written as name. */
static void
emit_entry (const char *name, uint8_t nseed, const struct layout_entry *e,
            uint8_t *buf)
{
  layout_entry_encode (e, buf);
  emit (name, 0, nseed, buf, LAYOUT_ENTRY_SIZE);
}

/* An entry input: make_entry's arguments, its name and nsectors byte. */
struct entry_seed {
  const char *name;
  uint8_t nseed;
  uint64_t page, seq;
  uint8_t state;
  unsigned nvalid, ndirty;
};

static void
emit_entries (const struct entry_seed *t, size_t n, uint8_t *buf)
{
  struct layout_entry e;

  for (size_t i = 0; i < n; i++) {
    make_entry (&e, t[i].page, t[i].seq, t[i].state, t[i].nvalid,
                t[i].ndirty);
    emit_entry (t[i].name, t[i].nseed, &e, buf);
  }
}

/* A superblock input with len bytes at off set to c, and its CRC made
 * right again (so that the field checks are reached).
 */
struct sb_patch {
  const char *name;
  size_t off;
  uint8_t c;
  size_t len;
};

static void
emit_sb_patches (const struct layout_sb *sb, const struct sb_patch *t,
                 size_t n, uint8_t *buf)
{
  for (size_t i = 0; i < n; i++) {
    layout_sb_encode (sb, buf);
    memset (buf + t[i].off, t[i].c, t[i].len);
    fix_sb_crc (buf);
    emit (t[i].name, 0, 0, buf, LAYOUT_SB_SIZE);
  }
}

/* Valid superblocks, alone and followed by a page table. */
static void
seeds_sb_valid (uint8_t *buf, size_t size)
{
  static uint8_t sbuf[LAYOUT_SB_SIZE];
  uint8_t *ents = buf + LAYOUT_SB_SIZE;
  struct layout_sb sb;
  struct layout_entry e;
  char id[LAYOUT_ID_MAX];

  make_sb (&sb, 4096, 1, LAYOUT_MODE_WRITETHROUGH, LAYOUT_SB_CLEAN,
           "file:/var/tmp/disk.img");
  emit_sb ("sb-valid-4k", 0, 7, &sb, sbuf);

  make_sb (&sb, 65536, 16384, LAYOUT_MODE_WRITEBACK, LAYOUT_SB_DIRTY,
           "ssh:host=server path=/images/disk.img");
  emit_sb ("sb-valid-64k-writeback", 0, 127, &sb, sbuf);

  make_sb (&sb, LAYOUT_MAX_PAGE, UINT32_MAX - 1, LAYOUT_MODE_WRITEAROUND,
           0, "");
  emit_sb ("sb-valid-2m-maxslots", 0, 0, &sb, sbuf);

  memset (id, 'x', sizeof id - 1);
  id[sizeof id - 1] = '\0';
  make_sb (&sb, 8192, 1000, LAYOUT_MODE_WRITEBACK,
           LAYOUT_SB_CLEAN | LAYOUT_SB_DIRTY, id);
  emit_sb ("sb-valid-longest-id", 0, 15, &sb, sbuf);

  /* A superblock followed by a page table: one input for both decoders. */
  make_sb (&sb, 65536, 16, LAYOUT_MODE_WRITEBACK, LAYOUT_SB_DIRTY,
           "file:backing.img");
  layout_sb_encode (&sb, buf);
  for (unsigned i = 0; i < 16; i++) {
    static const uint8_t states[] = { LAYOUT_FREE, LAYOUT_CLEAN, LAYOUT_DIRTY };
    uint8_t st = states[i % 3];
    make_entry (&e, i * 3, 100 + i, st,
                st == LAYOUT_FREE ? 0 : 1 + (i * 11) % 128,
                st == LAYOUT_DIRTY ? 1 + i % 5 : 0);
    layout_entry_encode (&e, ents + i * LAYOUT_ENTRY_SIZE);
  }
  emit ("sbpt-valid-64k", 0, 127, buf, size);
}

/* A valid superblock with bits flipped, with and without its CRC made
 * right again.
 */
static void
seeds_sb_flips (uint8_t *buf)
{
  static const size_t flips[] = { 8, 12, 33, 36, 40, 47, 48, 56, 64, 96, 100,
                                  104, 360, 2000, 4092 };
  static uint8_t sbuf[LAYOUT_SB_SIZE];
  struct layout_sb sb;
  char name[64];

  make_sb (&sb, 65536, 16384, LAYOUT_MODE_WRITEBACK, LAYOUT_SB_DIRTY,
           "file:/var/tmp/disk.img");
  layout_sb_encode (&sb, sbuf);

  memcpy (buf, sbuf, sizeof sbuf);
  buf[0] ^= 0x20;
  emit ("sb-bad-magic", 0, 0, buf, LAYOUT_SB_SIZE);

  for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
    memcpy (buf, sbuf, sizeof sbuf);
    buf[flips[i]] ^= 1u << (i % 8);
    snprintf (name, sizeof name, "sb-flip-%zu", flips[i]);
    emit (name, 0, 0, buf, LAYOUT_SB_SIZE);
    /* Same flip with the CRC made right: reaches the field checks. */
    snprintf (name, sizeof name, "sb-flip-%zu-crcfix", flips[i]);
    emit (name, CTRL_FIX_SB, 0, buf, LAYOUT_SB_SIZE);
  }

  sb.version = LAYOUT_VERSION + 1;
  emit_sb ("sb-future-version", 0, 0, &sb, buf);
  buf[200] ^= 0xff;             /* a newer format, other CRC */
  emit ("sb-future-version-badcrc", 0, 0, buf, LAYOUT_SB_SIZE);
  sb.version = 0;
  emit_sb ("sb-version-0", 0, 0, &sb, buf);
  sb.version = LAYOUT_VERSION;

  sb.page_size = 3 * 4096;
  emit_sb ("sb-page-not-pow2", 0, 0, &sb, buf);
}

/* Superblocks with a wrong field (a right CRC), bytes that must be
 * zero, damaged and truncated.
 */
static void
seeds_sb_fields (uint8_t *buf)
{
  static const struct sb_patch patches[] = {
    { "sb-id-unterminated", 104, 'y', LAYOUT_ID_MAX },  /* no NUL */
    { "sb-id-junk-after-nul", 110, 'z', 20 },           /* after the NUL */
    { "sb-reserved-100", 100, 1, 1 },                   /* reserved word */
    { "sb-reserved-tail", 3000, 1, 1 },                 /* reserved tail */
  };
  struct layout_sb sb;

  make_sb (&sb, 65536, 16384, LAYOUT_MODE_WRITEBACK, LAYOUT_SB_DIRTY, "id");
  sb.sector_size = 512;
  emit_sb ("sb-wrong-sector", 0, 0, &sb, buf);
  make_sb (&sb, 65536, 16384, LAYOUT_MODE_WRITEBACK, LAYOUT_SB_DIRTY, "id");
  sb.nslots = UINT64_MAX / 64;
  emit_sb ("sb-nslots-overflow", 0, 0, &sb, buf);
  sb.nslots = 0;
  emit_sb ("sb-nslots-0", 0, 0, &sb, buf);
  make_sb (&sb, 65536, 16384, LAYOUT_MODE_WRITEBACK, LAYOUT_SB_DIRTY, "id");
  sb.pool_offset += LAYOUT_POOL_ALIGN;
  emit_sb ("sb-pool-offset", 0, 0, &sb, buf);
  make_sb (&sb, 65536, 16384, 3, LAYOUT_SB_DIRTY, "id");
  emit_sb ("sb-mode-3", 0, 0, &sb, buf);
  make_sb (&sb, 65536, 16384, 2, 4, "id");
  emit_sb ("sb-flags-4", 0, 0, &sb, buf);

  make_sb (&sb, 65536, 16384, 2, LAYOUT_SB_DIRTY, "id");
  emit_sb_patches (&sb, patches, sizeof patches / sizeof patches[0], buf);

  layout_sb_encode (&sb, buf);
  memset (buf + 512, 0, 1024);                 /* a zeroed region */
  emit ("sb-zeroed-region", 0, 0, buf, LAYOUT_SB_SIZE);
  memset (buf, 0, LAYOUT_SB_SIZE);
  emit ("sb-all-zero", 0, 0, buf, LAYOUT_SB_SIZE);
  memset (buf, 0xff, LAYOUT_SB_SIZE);
  emit ("sb-all-ff", CTRL_FIX_SB, 0, buf, LAYOUT_SB_SIZE);
  layout_sb_encode (&sb, buf);
  emit ("sb-truncated-100", 0, 0, buf, 100);
  emit ("sb-truncated-4000", CTRL_FIX_SB, 0, buf, 4000);
}

/* Page-table entries, valid and corrupted (most with the CRC fixed, to
 * reach the checks).
 */
static void
seeds_entries (uint8_t *buf)
{
  static const struct entry_seed valid[] = {
    { "ent-free", 0, 0, 0, LAYOUT_FREE, 0, 0 },
    { "ent-clean-full", 127, 12345, 7, LAYOUT_CLEAN, 128, 0 },
    { "ent-clean-8", 7, 99, 8, LAYOUT_CLEAN, 8, 0 },
    { "ent-dirty-full", 127, UINT64_MAX, UINT64_MAX, LAYOUT_DIRTY, 128, 64 },
    { "ent-dirty-1", 0, 5, 1, LAYOUT_DIRTY, 1, 1 },
    { "ent-dirty-16-seed3", 2, 6, 2, LAYOUT_DIRTY, 16, 3 },
  };
  static const struct entry_seed bad[] = {
    { "ent-past-page", 7, 6, 2, LAYOUT_CLEAN, 100, 0 },   /* past 8 sectors */
    { "ent-state-3", 127, 6, 2, 3, 4, 0 },
    { "ent-free-with-data", 127, 6, 2, LAYOUT_FREE, 4, 0 },
    { "ent-clean-empty", 127, 6, 2, LAYOUT_CLEAN, 0, 0 },
    { "ent-dirty-no-dirty-bits", 127, 6, 2, LAYOUT_DIRTY, 4, 0 },
  };
  struct layout_entry e;

  emit_entries (valid, sizeof valid / sizeof valid[0], buf);

  make_entry (&e, 6, 2, LAYOUT_DIRTY, 16, 3);
  layout_entry_encode (&e, buf);
  buf[20] ^= 4;
  emit ("ent-flip-badcrc", 0, 15, buf, LAYOUT_ENTRY_SIZE);
  emit ("ent-flip-crcfix", CTRL_FIX_ENT, 15, buf, LAYOUT_ENTRY_SIZE);

  make_entry (&e, 6, 2, LAYOUT_CLEAN, 4, 0);
  layout_bit_set (e.dirty, 9);                 /* dirty, not valid */
  emit_entry ("ent-dirty-not-valid", 127, &e, buf);
  emit_entries (bad, sizeof bad / sizeof bad[0], buf);
  make_entry (&e, 6, 2, LAYOUT_CLEAN, 4, 0);
  layout_entry_encode (&e, buf);
  buf[55] = 0x80;                              /* reserved byte */
  fix_ent_crc (buf);
  emit ("ent-reserved", 0, 127, buf, LAYOUT_ENTRY_SIZE);
  memset (buf, 0, LAYOUT_ENTRY_SIZE);
  emit ("ent-all-zero", 0, 0, buf, LAYOUT_ENTRY_SIZE);
  emit ("ent-all-zero-crcfix", CTRL_FIX_ENT, 0, buf, LAYOUT_ENTRY_SIZE);
  memset (buf, 0xff, LAYOUT_ENTRY_SIZE);
  emit ("ent-all-ff-crcfix", CTRL_FIX_ENT, 255, buf, LAYOUT_ENTRY_SIZE);
  make_entry (&e, 6, 2, LAYOUT_DIRTY, 16, 3);
  layout_entry_encode (&e, buf);
  emit ("ent-truncated-30", CTRL_FIX_ENT, 127, buf, 30);

  /* A page table with a torn (zeroed) sector in the middle. */
  for (unsigned i = 0; i < 16; i++) {
    make_entry (&e, 1000 + i, i, i % 2 ? LAYOUT_DIRTY : LAYOUT_CLEAN,
                128, i % 2 ? 128 : 0);
    layout_entry_encode (&e, buf + i * LAYOUT_ENTRY_SIZE);
  }
  memset (buf + 5 * LAYOUT_ENTRY_SIZE, 0, 512);
  emit ("pt-torn-sector", 0, 127, buf, 16 * LAYOUT_ENTRY_SIZE);
}

int
main (int argc, char *argv[])
{
  static uint8_t buf[LAYOUT_SB_SIZE + 16 * LAYOUT_ENTRY_SIZE];

  if (argc != 2) {
    fprintf (stderr, "usage: make-seeds DIR\n");
    return 2;
  }
  dir = argv[1];
  seeds_sb_valid (buf, sizeof buf);
  seeds_sb_flips (buf);
  seeds_sb_fields (buf);
  seeds_entries (buf);
  fprintf (stderr, "make-seeds: wrote %u files in %s\n", nfiles, dir);
  return 0;
}
