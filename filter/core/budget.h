/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: one cache-space budget shared by several
 * caches (one per export, see ../exports.c).
 *
 * Owns struct budget: the bytes of cache slots in use across every
 * page table linked to it (pagetable_set_budget), against one limit
 * (ssdcache-size).  Lock free: `used' is atomic; the limit is set
 * before any table is linked.  No nbdkit, no I/O.
 */
#ifndef SSDCACHE_BUDGET_H
#define SSDCACHE_BUDGET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct budget {
  _Atomic uint64_t used;         /* bytes of slots not on a free list */
  uint64_t limit;                /* the most that may be taken */
};

extern void budget_init (struct budget *b, uint64_t limit);
/* Take n bytes if that stays within the limit.  False: nothing taken. */
extern bool budget_take (struct budget *b, uint64_t n);
/* Take n bytes whatever the limit (slots a cache file already holds,
 * counted while it loads: the total may then exceed the limit until
 * slots are given back).
 */
extern void budget_charge (struct budget *b, uint64_t n);
extern void budget_give (struct budget *b, uint64_t n);
extern uint64_t budget_used (const struct budget *b);

#endif /* SSDCACHE_BUDGET_H */
