/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: runtime control (ssdcache-control=SOCKET).
 *
 * Owns the control socket and the thread that answers it.  The
 * protocol: a client connects, sends one line, a command and its
 * arguments separated by spaces; the answer is zero or more lines of
 * output, then a last line "OK" or "ERROR message"; the server closes.
 * Commands: status, stats, drain [--wait],
 * mode writethrough|writeback|writearound, invalidate [OFFSET LENGTH].
 * One client at a time.  Locks: the lock table in docs/design.md
 * (none of its own; the thread only calls the engine and bg/writeback).
 */
#ifndef SSDCACHE_CONTROL_H
#define SSDCACHE_CONTROL_H

#include <stddef.h>
#include <stdio.h>

#include "cache.h"

struct control;

/* What the filter does for the control thread. */
struct control_ops {
  /* Make sure the writeback thread runs, before a switch to writeback
   * mode: 0, or -1 with a message in err.
   */
  int (*start_writeback) (char *err, size_t len);
};

/* Create the socket at path (mode 0600) and start answering.  Returns
 * NULL on error (logged).
 */
extern struct control *control_start (struct cache *c, const char *path,
                                      const struct control_ops *ops);

/* Stop the thread and remove the socket.  NULL: nothing. */
extern void control_stop (struct control *ctl);

/* Answer one command line (no newline) into out: the output lines,
 * then "OK" or "ERROR ...".  For the thread, and the unit tests.
 */
extern void control_command (struct cache *c, const struct control_ops *ops,
                             char *line, FILE *out);

#endif /* SSDCACHE_CONTROL_H */
