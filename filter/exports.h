/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: one cache per export (nbdkit layer).
 *
 * Owns the table of exports, each with its own cache (engine), its
 * own background threads and its own counters, and the backend
 * contexts those threads use.  A plugin that serves several exports
 * (file dir=, nbd, sh list_exports, ondemand) tells them apart only
 * inside a client connection: in nbdkit 1.32 a shared context cannot
 * name an export.  So an export is attached (its size checked, its
 * page table loaded) when its first client connection is prepared,
 * and its threads borrow the backend contexts of its live connections
 * ("lenders"); they are stopped before the last one goes.  The
 * default export of a plugin that works outside a connection (probed
 * at start, ssdcache.c) is "fixed": attached at start, with contexts
 * of its own, as the filter always did.
 *
 * All caches share one space budget (ssdcache-size, core/budget.h):
 * a cache that needs a slot when the budget is used up first takes a
 * clean slot from an export that has been idle (EXPORTS_IDLE_MS), and
 * otherwise evicts one of its own.  Dirty slots are never taken.
 *
 * An export whose last client left gives its cache back (file, fd,
 * counters) unless it holds dirty data; at most ssdcache-exports-max
 * are open at once.  A plugin whose requests are serialised (ssh,
 * curl) sees one call at a time on each context: the connections and
 * the threads that borrow their contexts take turns (l->turn).
 *
 * Locks (exports_lock, e->bg_lock, l->turn): the lock table in
 * docs/design.md ("Locks"), the one table of every lock of the filter.
 */
#ifndef SSDCACHE_EXPORTS_H
#define SSDCACHE_EXPORTS_H

#include <stdbool.h>
#include <stdint.h>

#include <nbdkit-filter.h>

#include "cache.h"

#define EXPORTS_IDLE_MS 1000
/* A connection over ssdcache-exports-max waits this long for a count
 * to free (a client that just left: nbdkit closes its connection after
 * the client is gone), and for as long as an export is closing.
 */
#define EXPORTS_LIMIT_GRACE_MS 2000

struct export;
struct lender;

/* Debug flag -D ssdcache.exports=1. */
extern int ssdcache_debug_exports;

/* Before the first export: the space budget shared by all, or 0 for
 * none (a single cache of its own size); the server's thread model
 * (.get_ready's: a plugin that serialises requests gets one call at a
 * time on each context, or on all of them, from the filter's threads
 * and the connections together: export_turn_take); how many exports
 * may have a cache open at once (ssdcache-exports-max).
 */
extern void exports_init (uint64_t budget_bytes, int thread_model,
                          unsigned max);

/* The export called name, opened (its cache file locked and its
 * superblock read) on first use, with a reference for the caller
 * (export_put).  NULL on error, or when max exports are open already
 * (logged): nothing is created then.
 */
extern struct export *exports_get (const char *name);
/* Another reference to e; pin: e is never closed before exit (the
 * default export attached at start, the one the control socket
 * steers).
 */
extern void export_hold (struct export *e, bool pin);
/* Give a reference back.  With the last, an export that is not pinned
 * and holds no dirty data is closed: its file, fd and counters go (its
 * threads went with its last connection); the next exports_get of its
 * name opens it again, warm.
 */
extern void export_put (struct export *e);

extern struct cache *export_cache (const struct export *e);
/* Attached at start with contexts of its own (export_attach_fixed). */
extern bool export_fixed (const struct export *e);
/* ... and one of them is writable. */
extern bool export_has_writer (struct export *e);

/* The default export at start: attach it now with the backend size
 * (it is then "fixed": its threads use contexts of its own).
 */
extern int export_attach_fixed (struct export *e, int64_t size);
/* ... and lend it those contexts (wb: writable, or NULL; ra: for
 * readahead, or NULL: no readahead), kept until exports_cleanup, and
 * start its threads (writing back first, synchronously, dirty data
 * left by a writeback run when the mode is no longer writeback).
 */
extern int export_start_fixed (struct export *e, nbdkit_next *wb,
                               nbdkit_next *ra);

/* A client connection of e was prepared (next: its context): attach e
 * if it is not yet, lend next to its threads and start them with the
 * first connection.  Returns the lender to give back, or NULL (error
 * logged).
 */
extern struct lender *export_connect (struct export *e, nbdkit_next *next,
                                      bool readonly);
/* The connection is being finalized: with the last one, write back
 * (ssdcache-writeback-on-exit) and stop e's threads; then take the
 * context back, waiting for the requests of e's threads on it.
 */
extern void export_disconnect (struct export *e, struct lender *l);

/* The backend of one client request on next (counts its failures in
 * e's backend_errors).  ctx must outlive the returned value.
 */
struct export_req {
  nbdkit_next *next;
  struct cache *cache;
  struct lender *lender;         /* next's, for its turn (or NULL) */
};

/* Around a call on the context of lender l (a connection's) made
 * outside export_backend: one call at a time when the plugin
 * serialises requests (exports_init).  l may be NULL.
 */
extern void export_turn_take (struct lender *l);
extern void export_turn_give (struct lender *l);
extern struct cache_backend export_backend (struct export_req *ctx);

/* A backend whose requests go to one of e's lenders (write: a writable
 * one): what e's background threads use.
 */
extern struct cache_backend export_lent_backend (struct export *e,
                                                 bool write);

/* Start e's writeback thread on lent contexts if needed (a switch to
 * writeback at run time).  Returns 0, or -1 with a message in err.
 */
extern int export_start_writeback (struct export *e, char *err, size_t len);

/* At exit: stop every thread, write back what can be (fixed exports),
 * close every cache.
 */
extern void exports_cleanup (void);

#endif /* SSDCACHE_EXPORTS_H */
