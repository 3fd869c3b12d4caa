/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: see fixture.h. */
#include <stdint.h>

#include "cache.h"
#include "fixture.h"
#include "testfile.h"

struct cache_config
fixture_config (uint64_t size, uint32_t page_size)
{
  struct cache_config cfg;

  cache_config_defaults (&cfg);
  cfg.path = testfile_path;
  cfg.size = size;
  cfg.page_size = page_size;
  cfg.id_digest[0] = 0x1111222233334444ULL;
  cfg.id_digest[1] = 0x5555666677778888ULL;
  cfg.id_text = FIXTURE_ID_TEXT;
  cfg.direct = testfile_direct ();
  return cfg;
}

struct cache_config
fixture_writeback_config (uint64_t size, uint32_t page_size)
{
  struct cache_config cfg = fixture_config (size, page_size);

  cfg.mode = LAYOUT_MODE_WRITEBACK;
  cfg.wb.high_pct = 100;
  cfg.wb.low_pct = 0;
  cfg.wb.idle_ms = 0;
  return cfg;
}
