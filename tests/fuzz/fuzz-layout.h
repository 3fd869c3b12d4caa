/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the fuzz target's entry point, shared by
 * fuzz-layout.c (the target) and replay.c (its driver without libFuzzer).
 */
#ifndef SSDCACHE_FUZZ_LAYOUT_H
#define SSDCACHE_FUZZ_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

/* How many decodes accepted / rejected so far (replay.c prints them, so
 * that a corpus that no longer reaches the round-trip checks is noticed).
 */
struct fuzz_layout_counts {
  unsigned long sb_accepted, sb_rejected;
  unsigned long entry_accepted, entry_rejected;
};
extern struct fuzz_layout_counts fuzz_layout_counts;

extern int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

#endif /* SSDCACHE_FUZZ_LAYOUT_H */
