/* SPDX-License-Identifier: BSD-3-Clause */
/* ssdcache-sim: replay block traces through the ssdcache replacement
 * policies and print hit ratios.
 *
 * Built from the filter's own policy code (filter/core/evict.c, admit.c): no
 * nbdkit needed.  Every policy of evict.h is run, each also with the
 * admission filters of admit.h (sequential cutoff; sequential cutoff +
 * promotion after N misses), next to two references computed here: LRU
 * and Belady's MIN (evict the page used furthest in the future; also
 * "MIN+bypass", which may decline to insert the missing page, the
 * optimum for a cache with admission control).
 *
 * Traces: built-in generators (zipf, hotset, loop, mix) or a text file
 * of requests, one per line "offset length r|w" (decimal or 0x hex;
 * blank lines and lines starting with # ignored), split into pages.
 *
 * A hit is an access to a page that is in the cache; every access of
 * every request counts, reads and writes alike (writes fill the cache
 * as in writethrough mode).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admit.h"
#include "evict.h"

#define NOPE UINT64_MAX

static void *
xmalloc (size_t n)
{
  void *p = malloc (n ? n : 1);
  if (p == NULL) {
    perror ("malloc");
    exit (EXIT_FAILURE);
  }
  return p;
}

static void *
xcalloc (size_t n, size_t s)
{
  void *p = calloc (n ? n : 1, s ? s : 1);
  if (p == NULL) {
    perror ("calloc");
    exit (EXIT_FAILURE);
  }
  return p;
}

/*----------------------------------------------------------------------
 * Random numbers (splitmix64), deterministic for a seed.
 */

static uint64_t rng_state;

static uint64_t
mix64 (uint64_t x)
{
  x = (x ^ (x >> 30)) * UINT64_C (0xbf58476d1ce4e5b9);
  x = (x ^ (x >> 27)) * UINT64_C (0x94d049bb133111eb);
  return x ^ (x >> 31);
}

static uint64_t
rnd (void)
{
  rng_state += UINT64_C (0x9e3779b97f4a7c15);
  return mix64 (rng_state);
}

static uint64_t
rnd_below (uint64_t n)
{
  return n ? rnd () % n : 0;
}

static double
rnd_unit (void)
{
  return (rnd () >> 11) * (1.0 / 9007199254740992.0);
}

/*----------------------------------------------------------------------
 * page -> value map: open addressing, linear probing, backward-shift
 * deletion.  Keys are page numbers (NOPE is the empty key).
 */

struct map {
  uint64_t *key;
  uint64_t *val;
  size_t mask;
  size_t count;
};

static void
map_init (struct map *m, size_t expect)
{
  size_t cap = 16;

  while (cap < 2 * expect + 16)
    cap <<= 1;
  m->key = xmalloc (cap * sizeof *m->key);
  m->val = xmalloc (cap * sizeof *m->val);
  for (size_t i = 0; i < cap; ++i)
    m->key[i] = NOPE;
  m->mask = cap - 1;
  m->count = 0;
}

static void
map_free (struct map *m)
{
  free (m->key);
  free (m->val);
}

static size_t
map_pos (const struct map *m, uint64_t k)
{
  return mix64 (k + 1) & m->mask;
}

static uint64_t *
map_get (const struct map *m, uint64_t k)
{
  for (size_t i = map_pos (m, k);; i = (i + 1) & m->mask) {
    if (m->key[i] == k)
      return &m->val[i];
    if (m->key[i] == NOPE)
      return NULL;
  }
}

static void map_put (struct map *m, uint64_t k, uint64_t v);

static void
map_grow (struct map *m)
{
  struct map n;
  size_t cap = m->mask + 1;

  map_init (&n, cap);
  for (size_t i = 0; i < cap; ++i)
    if (m->key[i] != NOPE)
      map_put (&n, m->key[i], m->val[i]);
  map_free (m);
  *m = n;
}

static void
map_put (struct map *m, uint64_t k, uint64_t v)
{
  size_t i;

  if (2 * (m->count + 1) > m->mask + 1)
    map_grow (m);
  for (i = map_pos (m, k); m->key[i] != NOPE; i = (i + 1) & m->mask)
    if (m->key[i] == k) {
      m->val[i] = v;
      return;
    }
  m->key[i] = k;
  m->val[i] = v;
  m->count++;
}

static void
map_del (struct map *m, uint64_t k)
{
  size_t i, j;

  for (i = map_pos (m, k);; i = (i + 1) & m->mask) {
    if (m->key[i] == NOPE)
      return;
    if (m->key[i] == k)
      break;
  }
  m->count--;
  /* Backward shift. */
  for (j = (i + 1) & m->mask; m->key[j] != NOPE; j = (j + 1) & m->mask) {
    size_t h = map_pos (m, m->key[j]);
    /* Move j to i if h is not cyclically in (i, j]. */
    if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
      m->key[i] = m->key[j];
      m->val[i] = m->val[j];
      i = j;
    }
  }
  m->key[i] = NOPE;
}

/*----------------------------------------------------------------------
 * Traces.
 */

#define A_WRITE    0x01
#define A_PROBE    0x02          /* hot-set access right after a scan */
#define A_SEQSKIP  0x04          /* beyond the sequential cutoff */

struct trace {
  char *name;
  bool own_name;
  size_t n, cap;
  uint64_t *page;
  uint8_t *flags;
  bool has_probe;
  struct admit_seq *seq;        /* computes A_SEQSKIP while building */
};

static uint32_t page_size = 65536;
static uint64_t seq_cutoff = ADMIT_SEQ_DEFAULT_CUTOFF;
static unsigned seq_streams = ADMIT_SEQ_DEFAULT_STREAMS;

static void
trace_init (struct trace *t, const char *name, bool own)
{
  memset (t, 0, sizeof *t);
  t->name = (char *) name;
  t->own_name = own;
  t->seq = admit_seq_new (seq_cutoff, seq_streams);
  if (t->seq == NULL) {
    perror ("admit_seq_new");
    exit (EXIT_FAILURE);
  }
}

static void
trace_free (struct trace *t)
{
  if (t->own_name)
    free (t->name);
  free (t->page);
  free (t->flags);
  admit_seq_free (t->seq);
}

static void
trace_push (struct trace *t, uint64_t page, uint8_t flags)
{
  if (t->n == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 4096;
    t->page = realloc (t->page, t->cap * sizeof *t->page);
    t->flags = realloc (t->flags, t->cap);
    if (t->page == NULL || t->flags == NULL) {
      perror ("realloc");
      exit (EXIT_FAILURE);
    }
  }
  t->page[t->n] = page;
  t->flags[t->n] = flags;
  t->n++;
}

/* One request, in bytes: split into pages. */
static void
trace_request (struct trace *t, uint64_t off, uint64_t len, uint8_t flags)
{
  uint64_t adm, first, last;

  if (len == 0)
    return;
  adm = admit_seq_access (t->seq, off, len);
  first = off / page_size;
  last = (off + len - 1) / page_size;
  for (uint64_t p = first; p <= last; ++p) {
    uint8_t f = flags;
    uint64_t start = p * page_size > off ? p * page_size : off;
    /* A page whose part in this request starts beyond the admitted
     * prefix is skipped.
     */
    if (start >= off + adm)
      f |= A_SEQSKIP;
    trace_push (t, p, f);
  }
}

/* One request of one page. */
static void
trace_page (struct trace *t, uint64_t page, uint8_t flags)
{
  trace_request (t, page * page_size, page_size, flags);
}

static void
gen_zipf (struct trace *t, uint64_t cache, size_t nreq, double alpha)
{
  uint64_t n = 4 * cache;
  double *cdf = xmalloc (n * sizeof *cdf);
  uint64_t *perm = xmalloc (n * sizeof *perm);
  double sum = 0;

  for (uint64_t i = 0; i < n; ++i) {
    sum += 1.0 / pow ((double) (i + 1), alpha);
    cdf[i] = sum;
    perm[i] = i;
  }
  /* Scatter the ranks over the data set. */
  for (uint64_t i = n - 1; i > 0; --i) {
    uint64_t j = rnd_below (i + 1), x = perm[i];
    perm[i] = perm[j];
    perm[j] = x;
  }
  for (size_t r = 0; r < nreq; ++r) {
    double u = rnd_unit () * sum;
    uint64_t lo = 0, hi = n - 1;
    while (lo < hi) {
      uint64_t mid = (lo + hi) / 2;
      if (cdf[mid] < u)
        lo = mid + 1;
      else
        hi = mid;
    }
    trace_page (t, perm[lo], 0);
  }
  free (cdf);
  free (perm);
}

/* Hot set of cache/2 pages at the start of a 4 * cache data set, random
 * accesses to it, and every 10 * hot accesses a full sequential scan of
 * the data set.  Right after each scan every hot page is accessed once,
 * in random order: these accesses are the probes (the share of the hot
 * set that survived the scan).
 */
static void
gen_hotset (struct trace *t, uint64_t cache, size_t nreq)
{
  uint64_t hot = cache / 2 ? cache / 2 : 1;
  uint64_t data = 4 * cache;
  uint64_t *perm = xmalloc (hot * sizeof *perm);
  size_t r = 0;

  t->has_probe = true;
  while (r < nreq) {
    for (uint64_t i = 0; i < 10 * hot && r < nreq; ++i, ++r)
      trace_page (t, rnd_below (hot), 0);
    for (uint64_t p = 0; p < data && r < nreq; ++p, ++r)
      trace_page (t, p, 0);
    for (uint64_t i = 0; i < hot; ++i) {
      uint64_t j = rnd_below (i + 1);
      perm[i] = perm[j];
      perm[j] = i;
    }
    for (uint64_t i = 0; i < hot && r < nreq; ++i, ++r)
      trace_page (t, perm[i], A_PROBE);
  }
  free (perm);
}

/* A loop slightly (10%) larger than the cache. */
static void
gen_loop (struct trace *t, uint64_t cache, size_t nreq)
{
  uint64_t len = cache + (cache / 10 ? cache / 10 : 1);

  for (size_t r = 0; r < nreq; ++r)
    trace_page (t, r % len, 0);
}

/* 60% Zipf(alpha) over 2 * cache pages, and two concurrent sequential
 * readers (20% each) of a large cold region, interleaved at random.
 */
static void
gen_mix (struct trace *t, uint64_t cache, size_t nreq, double alpha)
{
  uint64_t n = 2 * cache;
  double *cdf = xmalloc (n * sizeof *cdf);
  double sum = 0;
  uint64_t sa = 1000 * cache, sb = 2000 * cache;

  for (uint64_t i = 0; i < n; ++i) {
    sum += 1.0 / pow ((double) (i + 1), alpha);
    cdf[i] = sum;
  }
  for (size_t r = 0; r < nreq; ++r) {
    uint64_t x = rnd_below (10);
    if (x < 6) {
      double u = rnd_unit () * sum;
      uint64_t lo = 0, hi = n - 1;
      while (lo < hi) {
        uint64_t mid = (lo + hi) / 2;
        if (cdf[mid] < u)
          lo = mid + 1;
        else
          hi = mid;
      }
      /* Spread the ranks so that neighbours are not contiguous. */
      trace_page (t, 3 * lo, 0);
    }
    else if (x < 8)
      trace_page (t, sa++, 0);
    else
      trace_page (t, sb++, 0);
  }
  free (cdf);
}

static uint64_t
parse_num (const char *s, char **end)
{
  while (isspace ((unsigned char) *s))
    s++;
  errno = 0;
  if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
    return strtoull (s, end, 16);
  if (!isdigit ((unsigned char) *s)) {
    *end = (char *) s;
    errno = EINVAL;
    return 0;
  }
  return strtoull (s, end, 10);
}

static int
read_trace (struct trace *t, const char *file)
{
  FILE *fp = strcmp (file, "-") == 0 ? stdin : fopen (file, "r");
  char line[1024];
  unsigned lineno = 0;

  if (fp == NULL) {
    perror (file);
    return -1;
  }
  while (fgets (line, sizeof line, fp)) {
    char *p = line, *e;
    uint64_t off, len;
    uint8_t f = 0;

    lineno++;
    while (isspace ((unsigned char) *p))
      p++;
    if (*p == '#' || *p == '\0')
      continue;
    off = parse_num (p, &e);
    if (errno || e == p)
      goto bad;
    p = e;
    len = parse_num (p, &e);
    if (errno || e == p)
      goto bad;
    p = e;
    while (isspace ((unsigned char) *p))
      p++;
    if (*p == 'w' || *p == 'W')
      f = A_WRITE;
    else if (*p != 'r' && *p != 'R')
      goto bad;
    p++;
    while (isspace ((unsigned char) *p))
      p++;
    if (*p != '\0')
      goto bad;
    trace_request (t, off, len, f);
    continue;
  bad:
    fprintf (stderr, "%s:%u: expected \"offset length r|w\"\n", file, lineno);
    if (fp != stdin)
      fclose (fp);
    return -1;
  }
  if (fp != stdin)
    fclose (fp);
  return 0;
}

/*----------------------------------------------------------------------
 * Results.
 */

struct result {
  uint64_t hits, accesses;
  uint64_t probe_hits, probes;
};

static void
account (struct result *res, const struct trace *t, size_t i, bool hit)
{
  res->accesses++;
  res->hits += hit;
  if (t->flags[i] & A_PROBE) {
    res->probes++;
    res->probe_hits += hit;
  }
}

/*----------------------------------------------------------------------
 * The policies of evict.h, with or without admission.
 */

struct pcache {
  uint64_t *slot_page;
};

static bool
take_all (void *opaque, uint32_t slot)
{
  return true;
}

static uint64_t
page_of (void *opaque, uint32_t slot)
{
  const struct pcache *pc = opaque;
  return pc->slot_page[slot];
}

static void
run_policy (const struct trace *t, uint32_t cache, enum evict_policy pol,
            bool seqcut, unsigned promote, struct result *res)
{
  struct pcache pc;
  struct evict *ev = evict_new_policy (pol, cache);
  struct admit_nhit *an = admit_nhit_new (promote, 4 * cache);
  struct map where;
  uint32_t used = 0;

  if (ev == NULL || an == NULL) {
    perror ("evict_new_policy");
    exit (EXIT_FAILURE);
  }
  pc.slot_page = xmalloc (cache * sizeof *pc.slot_page);
  evict_set_page_fn (ev, page_of, &pc);
  map_init (&where, cache);
  memset (res, 0, sizeof *res);

  for (size_t i = 0; i < t->n; ++i) {
    uint64_t p = t->page[i], *v = map_get (&where, p);
    uint32_t s;

    account (res, t, i, v != NULL);
    if (v) {
      evict_touch (ev, (uint32_t) *v);
      continue;
    }
    if (seqcut && (t->flags[i] & A_SEQSKIP))
      continue;
    if (!admit_nhit_miss (an, p))
      continue;
    if (used < cache)
      s = used++;
    else {
      s = evict_victim (ev, take_all, NULL);
      if (s == EVICT_NONE) {
        fprintf (stderr, "evict_victim: no victim in a full cache\n");
        exit (EXIT_FAILURE);
      }
      map_del (&where, pc.slot_page[s]);
    }
    pc.slot_page[s] = p;
    map_put (&where, p, s);
    evict_insert_page (ev, s, p);
  }
  if (evict_resident (ev) != used) {
    fprintf (stderr, "evict_resident %u != %u\n", evict_resident (ev), used);
    exit (EXIT_FAILURE);
  }
  map_free (&where);
  free (pc.slot_page);
  admit_nhit_free (an);
  evict_free (ev);
}

/*----------------------------------------------------------------------
 * LRU (reference): doubly linked list of slots + map.
 */

static void
run_lru (const struct trace *t, uint32_t cache, struct result *res)
{
  uint64_t *sp = xmalloc (cache * sizeof *sp);
  uint32_t *prev = xmalloc (cache * sizeof *prev);
  uint32_t *next = xmalloc (cache * sizeof *next);
  uint32_t head = UINT32_MAX, tail = UINT32_MAX, used = 0;
  struct map where;

  map_init (&where, cache);
  memset (res, 0, sizeof *res);
  for (size_t i = 0; i < t->n; ++i) {
    uint64_t p = t->page[i], *v = map_get (&where, p);
    uint32_t s;

    account (res, t, i, v != NULL);
    if (v) {
      s = (uint32_t) *v;
      /* unlink */
      if (prev[s] != UINT32_MAX)
        next[prev[s]] = next[s];
      else
        head = next[s];
      if (next[s] != UINT32_MAX)
        prev[next[s]] = prev[s];
      else
        tail = prev[s];
    }
    else if (used < cache)
      s = used++;
    else {
      s = tail;
      tail = prev[s];
      if (tail != UINT32_MAX)
        next[tail] = UINT32_MAX;
      else
        head = UINT32_MAX;
      map_del (&where, sp[s]);
    }
    if (!v) {
      sp[s] = p;
      map_put (&where, p, s);
    }
    /* push at head (most recent) */
    prev[s] = UINT32_MAX;
    next[s] = head;
    if (head != UINT32_MAX)
      prev[head] = s;
    head = s;
    if (tail == UINT32_MAX)
      tail = s;
  }
  map_free (&where);
  free (sp);
  free (prev);
  free (next);
}

/*----------------------------------------------------------------------
 * Belady's MIN: next use of every access, then a max-heap of resident
 * pages by next use with lazy deletion (stale entries are skipped and
 * the heap is compacted when it grows past 2 * cache).  O(n log n).
 */

struct hent {
  uint64_t next;
  uint64_t page;
};

struct heap {
  struct hent *h;
  size_t n, cap;
};

static void
heap_push (struct heap *hp, struct hent e)
{
  size_t i;

  if (hp->n == hp->cap) {
    hp->cap = hp->cap ? 2 * hp->cap : 1024;
    hp->h = realloc (hp->h, hp->cap * sizeof *hp->h);
    if (hp->h == NULL) {
      perror ("realloc");
      exit (EXIT_FAILURE);
    }
  }
  i = hp->n++;
  while (i > 0 && hp->h[(i - 1) / 2].next < e.next) {
    hp->h[i] = hp->h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  hp->h[i] = e;
}

static void
heap_sift_down (struct heap *hp, size_t i)
{
  struct hent e = hp->h[i];

  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= hp->n)
      break;
    if (c + 1 < hp->n && hp->h[c + 1].next > hp->h[c].next)
      c++;
    if (hp->h[c].next <= e.next)
      break;
    hp->h[i] = hp->h[c];
    i = c;
  }
  hp->h[i] = e;
}

static void
heap_pop (struct heap *hp)
{
  hp->h[0] = hp->h[--hp->n];
  if (hp->n > 0)
    heap_sift_down (hp, 0);
}

static bool
hent_valid (const struct map *res, struct hent e)
{
  const uint64_t *v = map_get (res, e.page);
  return v && *v == e.next;
}

/* The resident page with the furthest next use (top of the heap after
 * dropping stale entries).
 */
static struct hent
heap_top_valid (struct heap *hp, const struct map *resid)
{
  while (!hent_valid (resid, hp->h[0]))
    heap_pop (hp);
  return hp->h[0];
}

static void
heap_compact (struct heap *hp, const struct map *resid)
{
  size_t k = 0;

  for (size_t i = 0; i < hp->n; ++i)
    if (hent_valid (resid, hp->h[i]))
      hp->h[k++] = hp->h[i];
  hp->n = k;
  for (size_t i = k / 2; i-- > 0;)
    heap_sift_down (hp, i);
}

static uint64_t *
next_uses (const struct trace *t)
{
  uint64_t *nx = xmalloc (t->n * sizeof *nx);
  struct map last;

  map_init (&last, 1024);
  for (size_t i = t->n; i-- > 0;) {
    uint64_t *v = map_get (&last, t->page[i]);
    /* Never used again: beyond the end, all distinct. */
    nx[i] = v ? *v : t->n + i;
    map_put (&last, t->page[i], i);
  }
  map_free (&last);
  return nx;
}

static void
run_min (const struct trace *t, const uint64_t *nx, uint32_t cache,
         bool bypass, struct result *res)
{
  struct map resid;             /* page -> its next use */
  struct heap hp = { 0 };

  map_init (&resid, cache);
  memset (res, 0, sizeof *res);
  for (size_t i = 0; i < t->n; ++i) {
    uint64_t p = t->page[i], *v = map_get (&resid, p);

    account (res, t, i, v != NULL);
    if (v) {
      *v = nx[i];
    }
    else {
      if (resid.count >= cache) {
        struct hent top = heap_top_valid (&hp, &resid);
        if (bypass && nx[i] >= top.next)
          continue;             /* the new page is needed last: skip it */
        heap_pop (&hp);
        map_del (&resid, top.page);
      }
      map_put (&resid, p, nx[i]);
    }
    heap_push (&hp, (struct hent) { nx[i], p });
    if (hp.n > 2 * (size_t) cache + 1024)
      heap_compact (&hp, &resid);
  }
  map_free (&resid);
  free (hp.h);
}

/*----------------------------------------------------------------------
 * Main.
 */

enum kind { K_POLICY, K_LRU, K_MIN, K_MINB };

struct row {
  char name[48];
  enum kind kind;
  enum evict_policy pol;
  bool seqcut;
  unsigned promote;
};

static void
usage (FILE *fp)
{
  fprintf (fp,
"Usage: ssdcache-sim [options]\n"
"Replay block traces through the ssdcache replacement policies.\n"
"\n"
"  --cache-pages N     cache size in pages (default 1000)\n"
"  --page-size BYTES   page size (default 65536)\n"
"  --gen NAME          built-in trace: zipf, hotset, loop, mix, all\n"
"                      (repeatable; default: all unless --trace)\n"
"  --trace FILE        replay FILE (\"offset length r|w\" per line, - for\n"
"                      stdin; repeatable)\n"
"  --requests N        requests per generated trace (default 200000)\n"
"  --seed N            random seed (default 1)\n"
"  --alpha A           Zipf exponent (default 1.2)\n"
"  --seq-cutoff BYTES  sequential cutoff of the +seq rows (default %u)\n"
"  --streams N         streams tracked by the cutoff (default %u)\n"
"  --promote N         misses before admission, +seq+Nhit rows (default 2)\n"
"  --counts            print hit counts instead of percentages\n"
"  --help\n",
           ADMIT_SEQ_DEFAULT_CUTOFF, ADMIT_SEQ_DEFAULT_STREAMS);
}

static uint64_t
parse_opt_num (const char *opt, const char *s)
{
  char *e;
  uint64_t v = parse_num (s, &e);

  if (errno || e == s || *e != '\0') {
    fprintf (stderr, "ssdcache-sim: %s: bad number '%s'\n", opt, s);
    exit (EXIT_FAILURE);
  }
  return v;
}

static void
cell (char *buf, size_t n, uint64_t hits, uint64_t acc, bool counts)
{
  if (counts)
    snprintf (buf, n, "%" PRIu64, hits);
  else if (acc == 0)
    snprintf (buf, n, "-");
  else
    snprintf (buf, n, "%.2f%%", 100.0 * hits / acc);
}

int
main (int argc, char *argv[])
{
  static const struct option longopts[] = {
    { "cache-pages", required_argument, NULL, 'c' },
    { "page-size", required_argument, NULL, 'p' },
    { "gen", required_argument, NULL, 'g' },
    { "trace", required_argument, NULL, 't' },
    { "requests", required_argument, NULL, 'n' },
    { "seed", required_argument, NULL, 's' },
    { "alpha", required_argument, NULL, 'a' },
    { "seq-cutoff", required_argument, NULL, 'C' },
    { "streams", required_argument, NULL, 'S' },
    { "promote", required_argument, NULL, 'P' },
    { "counts", no_argument, NULL, 'k' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  uint64_t cache = 1000, nreq = 200000, seed = 1;
  unsigned promote = 2;
  double alpha = 1.2;
  bool counts = false;
  const char *gens[16], *files[16];
  unsigned ngens = 0, nfiles = 0;
  struct trace traces[32];
  unsigned ntraces = 0;
  struct row rows[3 * EVICT_NR_POLICIES + 3];
  unsigned nrows = 0;
  struct result *res;
  int c;

  while ((c = getopt_long (argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'c': cache = parse_opt_num ("--cache-pages", optarg); break;
    case 'p': page_size = parse_opt_num ("--page-size", optarg); break;
    case 'n': nreq = parse_opt_num ("--requests", optarg); break;
    case 's': seed = parse_opt_num ("--seed", optarg); break;
    case 'C': seq_cutoff = parse_opt_num ("--seq-cutoff", optarg); break;
    case 'S': seq_streams = parse_opt_num ("--streams", optarg); break;
    case 'P': promote = parse_opt_num ("--promote", optarg); break;
    case 'k': counts = true; break;
    case 'a': {
      char *e;
      alpha = strtod (optarg, &e);
      if (e == optarg || *e || alpha <= 0) {
        fprintf (stderr, "ssdcache-sim: --alpha: bad value '%s'\n", optarg);
        exit (EXIT_FAILURE);
      }
      break;
    }
    case 'g':
      if (ngens == 16) {
        fprintf (stderr, "ssdcache-sim: too many --gen\n");
        exit (EXIT_FAILURE);
      }
      gens[ngens++] = optarg;
      break;
    case 't':
      if (nfiles == 16) {
        fprintf (stderr, "ssdcache-sim: too many --trace\n");
        exit (EXIT_FAILURE);
      }
      files[nfiles++] = optarg;
      break;
    case 'h': usage (stdout); exit (EXIT_SUCCESS);
    default: usage (stderr); exit (EXIT_FAILURE);
    }
  }
  if (optind < argc) {
    usage (stderr);
    exit (EXIT_FAILURE);
  }
  if (cache == 0 || cache > UINT32_MAX - 1 || page_size == 0) {
    fprintf (stderr, "ssdcache-sim: --cache-pages and --page-size must be > 0\n");
    exit (EXIT_FAILURE);
  }
  if (ngens == 0 && nfiles == 0)
    gens[ngens++] = "all";

  for (unsigned i = 0; i < ngens; ++i) {
    static const char *const all[] = { "zipf", "hotset", "loop", "mix" };
    const char *one[1] = { gens[i] };
    const char *const *list = one;
    unsigned nl = 1;

    if (strcmp (gens[i], "all") == 0) {
      list = all;
      nl = 4;
    }
    for (unsigned j = 0; j < nl; ++j) {
      struct trace *t = &traces[ntraces];
      char *name;

      if (ntraces == 16) {
        fprintf (stderr, "ssdcache-sim: too many traces\n");
        exit (EXIT_FAILURE);
      }
      name = xmalloc (32);

      rng_state = seed * UINT64_C (0x2545f4914f6cdd1d) + ntraces;
      if (strcmp (list[j], "zipf") == 0) {
        snprintf (name, 32, "zipf(%g)", alpha);
        trace_init (t, name, true);
        gen_zipf (t, cache, nreq, alpha);
      }
      else if (strcmp (list[j], "hotset") == 0) {
        snprintf (name, 32, "hotset+scan");
        trace_init (t, name, true);
        gen_hotset (t, cache, nreq);
      }
      else if (strcmp (list[j], "loop") == 0) {
        snprintf (name, 32, "loop(1.1x)");
        trace_init (t, name, true);
        gen_loop (t, cache, nreq);
      }
      else if (strcmp (list[j], "mix") == 0) {
        snprintf (name, 32, "mix");
        trace_init (t, name, true);
        gen_mix (t, cache, nreq, alpha);
      }
      else {
        fprintf (stderr, "ssdcache-sim: unknown generator '%s'\n", list[j]);
        exit (EXIT_FAILURE);
      }
      ntraces++;
    }
  }
  for (unsigned i = 0; i < nfiles; ++i) {
    struct trace *t = &traces[ntraces];
    const char *base = strrchr (files[i], '/');
    trace_init (t, base ? base + 1 : files[i], false);
    if (read_trace (t, files[i]) == -1)
      exit (EXIT_FAILURE);
    ntraces++;
  }

  for (unsigned p = 0; p < EVICT_NR_POLICIES; ++p) {
    const char *pn = evict_policy_name (p);
    struct row *r = &rows[nrows++];
    snprintf (r->name, sizeof r->name, "%s%s", pn,
              p == EVICT_DEFAULT ? " (default)" : "");
    r->kind = K_POLICY;
    r->pol = p;
    r->seqcut = false;
    r->promote = 1;
    r = &rows[nrows++];
    snprintf (r->name, sizeof r->name, "%s +seq", pn);
    r->kind = K_POLICY;
    r->pol = p;
    r->seqcut = true;
    r->promote = 1;
    r = &rows[nrows++];
    snprintf (r->name, sizeof r->name, "%s +seq+%uhit", pn, promote);
    r->kind = K_POLICY;
    r->pol = p;
    r->seqcut = true;
    r->promote = promote;
  }
  rows[nrows++] = (struct row) { .name = "LRU (reference)", .kind = K_LRU };
  rows[nrows++] = (struct row) { .name = "MIN (Belady)", .kind = K_MIN };
  rows[nrows++] = (struct row) { .name = "MIN+bypass", .kind = K_MINB };

  res = xcalloc ((size_t) nrows * ntraces, sizeof *res);
  for (unsigned j = 0; j < ntraces; ++j) {
    const struct trace *t = &traces[j];
    uint64_t *nx = next_uses (t);
    for (unsigned i = 0; i < nrows; ++i) {
      struct result *rs = &res[i * ntraces + j];
      switch (rows[i].kind) {
      case K_POLICY:
        run_policy (t, cache, rows[i].pol, rows[i].seqcut, rows[i].promote,
                    rs);
        break;
      case K_LRU: run_lru (t, cache, rs); break;
      case K_MIN: run_min (t, nx, cache, false, rs); break;
      case K_MINB: run_min (t, nx, cache, true, rs); break;
      }
    }
    free (nx);
  }

  printf ("Cache %" PRIu64 " pages of %u bytes; seed %" PRIu64
          "; sequential cutoff %" PRIu64 " bytes, %u streams.\n\n",
          cache, page_size, seed, seq_cutoff, seq_streams);
  printf ("| policy |");
  for (unsigned j = 0; j < ntraces; ++j) {
    printf (" %s |", traces[j].name);
    if (traces[j].has_probe)
      printf (" %s: hot after scan |", traces[j].name);
  }
  printf ("\n|---|");
  for (unsigned j = 0; j < ntraces; ++j)
    printf (traces[j].has_probe ? "---:|---:|" : "---:|");
  printf ("\n");
  for (unsigned i = 0; i < nrows; ++i) {
    printf ("| %s |", rows[i].name);
    for (unsigned j = 0; j < ntraces; ++j) {
      const struct result *rs = &res[i * ntraces + j];
      char buf[64];
      cell (buf, sizeof buf, rs->hits, rs->accesses, counts);
      printf (" %s |", buf);
      if (traces[j].has_probe) {
        cell (buf, sizeof buf, rs->probe_hits, rs->probes, counts);
        printf (" %s |", buf);
      }
    }
    printf ("\n");
  }
  printf ("\n| accesses |");
  for (unsigned j = 0; j < ntraces; ++j) {
    printf (" %zu |", traces[j].n);
    if (traces[j].has_probe)
      printf (" %" PRIu64 " |", res[j].probes);
  }
  printf ("\n");

  for (unsigned j = 0; j < ntraces; ++j)
    trace_free (&traces[j]);
  free (res);
  return 0;
}
