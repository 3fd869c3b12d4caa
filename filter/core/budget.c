/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: the shared cache-space budget (budget.h). */
#include "budget.h"

void
budget_init (struct budget *b, uint64_t limit)
{
  atomic_init (&b->used, 0);
  b->limit = limit;
}

bool
budget_take (struct budget *b, uint64_t n)
{
  uint64_t u = atomic_load (&b->used);

  do {
    if (u + n > b->limit)
      return false;
  } while (!atomic_compare_exchange_weak (&b->used, &u, u + n));
  return true;
}

void
budget_charge (struct budget *b, uint64_t n)
{
  atomic_fetch_add (&b->used, n);
}

void
budget_give (struct budget *b, uint64_t n)
{
  atomic_fetch_sub (&b->used, n);
}

uint64_t
budget_used (const struct budget *b)
{
  return atomic_load ((_Atomic uint64_t *) &b->used);
}
