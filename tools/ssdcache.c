/* SPDX-License-Identifier: BSD-3-Clause */
/* ssdcache: the command-line tool of nbdkit-ssdcache-filter.
 *
 * Owns main: the subcommand dispatcher, the top-level options
 * (--help, --version), the usage text and the message helpers of
 * ssdcache.h.  It knows no subcommand by name: each registers itself
 * (TOOL_COMMAND) from its own file, e.g. ssdcache-info.c for info and
 * check.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ssdcache.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

#define MAX_COMMANDS 16

static const struct tool_command *commands[MAX_COMMANDS];
static size_t ncommands;

void
tool_register (const struct tool_command *cmd)
{
  size_t i;

  if (ncommands == MAX_COMMANDS) {
    fprintf (stderr, "%s: too many subcommands (raise MAX_COMMANDS)\n",
             TOOL_NAME);
    abort ();
  }
  /* Kept sorted by name: constructors run in no particular order. */
  for (i = ncommands; i > 0 && strcmp (commands[i - 1]->name,
                                       cmd->name) > 0; i--)
    commands[i] = commands[i - 1];
  commands[i] = cmd;
  ncommands++;
}

void
tool_error (const char *fs, ...)
{
  va_list ap;

  fflush (stdout);
  fprintf (stderr, "%s: ", TOOL_NAME);
  va_start (ap, fs);
  vfprintf (stderr, fs, ap);
  va_end (ap);
  fputc ('\n', stderr);
}

int
tool_usage_error (const char *cmd, const char *fs, ...)
{
  va_list ap;

  fflush (stdout);
  fprintf (stderr, "%s %s: ", TOOL_NAME, cmd);
  va_start (ap, fs);
  vfprintf (stderr, fs, ap);
  va_end (ap);
  fprintf (stderr, " (see %s %s --help)\n", TOOL_NAME, cmd);
  return TOOL_EXIT_ERROR;
}

void
tool_print_usage (FILE *fp, const struct tool_command *cmd)
{
  fprintf (fp, "Usage: %s %s %s\n  %s\n", TOOL_NAME, cmd->name,
           cmd->synopsis, cmd->summary);
}

static void
usage (FILE *fp)
{
  fprintf (fp,
           "%s: inspect and check nbdkit-ssdcache-filter cache files\n"
           "\n"
           "Usage: %s COMMAND [ARGS...]\n"
           "       %s --help | --version\n"
           "\n"
           "Commands:\n", TOOL_NAME, TOOL_NAME, TOOL_NAME);
  for (size_t i = 0; i < ncommands; i++)
    fprintf (fp, "  %s %s\n      %s\n", commands[i]->name,
             commands[i]->synopsis, commands[i]->summary);
  fprintf (fp,
           "\n"
           "Exit status: 0 success (check: no damage), 1 check found "
           "damage,\n"
           "2 usage error, not a cache file, or it cannot be read.\n"
           "'%s COMMAND --help' shows a command's options; the manual "
           "is %s(1).\n", TOOL_NAME, TOOL_NAME);
}

static const struct tool_command *
find_command (const char *name)
{
  for (size_t i = 0; i < ncommands; i++)
    if (strcmp (commands[i]->name, name) == 0)
      return commands[i];
  return NULL;
}

int
main (int argc, char **argv)
{
  const struct tool_command *cmd;
  const char *arg = argc > 1 ? argv[1] : NULL;
  int status;

  if (arg == NULL) {
    usage (stderr);
    return TOOL_EXIT_ERROR;
  }
  if (strcmp (arg, "--help") == 0 || strcmp (arg, "-h") == 0) {
    usage (stdout);
    return TOOL_EXIT_OK;
  }
  if (strcmp (arg, "--version") == 0 || strcmp (arg, "-V") == 0) {
    printf ("%s %s\n", TOOL_NAME, PACKAGE_VERSION);
    return TOOL_EXIT_OK;
  }
  if (arg[0] == '-') {
    tool_error ("unknown option '%s' (see %s --help)", arg, TOOL_NAME);
    return TOOL_EXIT_ERROR;
  }
  cmd = find_command (arg);
  if (cmd == NULL) {
    tool_error ("unknown command '%s' (see %s --help)", arg, TOOL_NAME);
    return TOOL_EXIT_ERROR;
  }
  status = cmd->run (argc - 1, argv + 1);
  /* Output that did not reach its file (a full disk, a closed pipe)
   * is an error too.
   */
  if (fclose (stdout) != 0) {
    tool_error ("writing the output: %s", strerror (errno));
    return TOOL_EXIT_ERROR;
  }
  return status;
}
