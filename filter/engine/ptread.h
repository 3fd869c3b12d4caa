/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: reading and decoding the page table ahead of
 * the loader (recover.c), on a thread of its own.  ptread.c says how.
 */
#ifndef SSDCACHE_PTREAD_H
#define SSDCACHE_PTREAD_H

#include <stdbool.h>
#include <stdint.h>

#include "layout.h"
#include "pagetable.h"

struct cache;
struct ptread;

/* A chunk of entries, read and decoded: slots [base, base + n).
 * ents[k] is raw's entry k decoded (layout_entry_decode), unless
 * bad[k]: it then failed its checks (raw tells why).  If has_img[k],
 * imgs[k] is its stored form in the page table (pagetable_rec_encode).
 */
struct ptread_chunk {
  uint64_t base, n;
  uint8_t *raw;
  struct layout_entry *ents;
  bool *bad;
  struct pt_rec *imgs;
  bool *has_img;
};

/* Start reading c's page table from slot 0.  Returns NULL (logged) on
 * ENOMEM.
 */
extern struct ptread *ptread_start (struct cache *c);
/* The next chunk, in slot order, waiting for it if need be; it stays
 * valid until the next call.  Returns NULL at the end, or with *err
 * set to -1 (logged) if the page table could not be read.
 */
extern const struct ptread_chunk *ptread_next (struct ptread *t, int *err);
/* Stop (at any point) and free. */
extern void ptread_stop (struct ptread *t);

#endif /* SSDCACHE_PTREAD_H */
