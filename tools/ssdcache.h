/* SPDX-License-Identifier: BSD-3-Clause */
/* ssdcache tool: what the subcommands share.
 *
 * Owns the interface between the dispatcher (ssdcache.c) and the
 * subcommands: the exit statuses, the registration of a subcommand
 * and the message helpers, so that every subcommand reports in the
 * same style ("ssdcache: FILE: what is wrong" on stderr).
 *
 * A subcommand lives in a file of its own and registers itself:
 *
 *   static int ctl_main (int argc, char **argv);
 *   static const struct tool_command ctl_command = {
 *     .name = "ctl", .synopsis = "SOCKET CMD [ARGS...]",
 *     .summary = "talk to a running filter", .run = ctl_main,
 *   };
 *   TOOL_COMMAND (ctl_command);
 *
 * Adding one is a new file in ssdcache_SOURCES (tools/Makefile.am)
 * and a section in ssdcache.pod; the dispatcher needs no change.
 */
#ifndef SSDCACHE_TOOL_H
#define SSDCACHE_TOOL_H

#include <stdbool.h>
#include <stdio.h>

/* Exit statuses of every subcommand. */
#define TOOL_EXIT_OK      0     /* done; check: no damage */
#define TOOL_EXIT_DAMAGE  1     /* check: damage found */
#define TOOL_EXIT_ERROR   2     /* usage error, not a cache file, cannot
                                   be read */

#define TOOL_NAME "ssdcache"

struct tool_command {
  const char *name;             /* e.g. "info" */
  const char *synopsis;         /* the arguments, e.g. "FILE [--json]" */
  const char *summary;          /* one line for ssdcache --help */
  /* argv[0] is the subcommand's name, options and operands follow;
   * returns the exit status.
   */
  int (*run) (int argc, char **argv);
};

/* Make a subcommand known to the dispatcher (before main runs). */
extern void tool_register (const struct tool_command *cmd);
#define TOOL_COMMAND(cmd)                                       \
  static void __attribute__ ((constructor))                     \
  cmd##_register (void)                                         \
  {                                                             \
    tool_register (&(cmd));                                     \
  }

/* "ssdcache: MESSAGE" on stderr, one line. */
extern void tool_error (const char *fs, ...)
  __attribute__ ((format (printf, 1, 2)));

/* A usage error of subcommand cmd: "ssdcache CMD: MESSAGE (see
 * ssdcache CMD --help)" on stderr.  Returns TOOL_EXIT_ERROR.
 */
extern int tool_usage_error (const char *cmd, const char *fs, ...)
  __attribute__ ((format (printf, 2, 3)));

/* Print "Usage: ssdcache CMD SYNOPSIS" and the summary of cmd. */
extern void tool_print_usage (FILE *fp, const struct tool_command *cmd);

#endif /* SSDCACHE_TOOL_H */
