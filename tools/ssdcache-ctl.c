/* SPDX-License-Identifier: BSD-3-Clause */
/* ssdcache ctl SOCKET CMD [ARGS...]: a client of the filter's control
 * socket (ssdcache-control=SOCKET; the protocol is in
 * filter/bg/control.h).  Sends the command as one line, prints the
 * answer's output lines on stdout and an error on stderr.  Exit
 * status: 0 the command succeeded, 1 the filter refused it or it
 * failed, 2 a usage error or the socket could not be used.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "ssdcache.h"

#define CTL_USAGE "ctl SOCKET status | stats | drain [--wait] | " \
  "mode writethrough|writeback|writearound | invalidate [OFFSET LENGTH]"

static int
ctl_connect (const char *path)
{
  struct sockaddr_un sun = { .sun_family = AF_UNIX };
  int fd;

  if (strlen (path) >= sizeof sun.sun_path) {
    fprintf (stderr, "ssdcache ctl: %s: socket path too long\n", path);
    return -1;
  }
  strcpy (sun.sun_path, path);
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1 ||
      connect (fd, (struct sockaddr *) &sun, sizeof sun) == -1) {
    fprintf (stderr, "ssdcache ctl: %s: %s\n", path, strerror (errno));
    if (fd != -1)
      close (fd);
    return -1;
  }
  return fd;
}

/* The command line to send: the words joined by spaces, and '\n'. */
static char *
ctl_line (int argc, char **argv)
{
  size_t n = 2;
  char *line;

  for (int i = 0; i < argc; i++)
    n += strlen (argv[i]) + 1;
  line = malloc (n);
  if (line == NULL)
    return NULL;
  line[0] = '\0';
  for (int i = 0; i < argc; i++) {
    if (strchr (argv[i], '\n')) {
      free (line);
      errno = EINVAL;
      return NULL;
    }
    strcat (line, argv[i]);
    strcat (line, i + 1 < argc ? " " : "\n");
  }
  return line;
}

/* Print the answer read from fp; returns the exit status. */
static int
ctl_answer (FILE *fp)
{
  char buf[4096];
  int status = 2;

  while (fgets (buf, sizeof buf, fp)) {
    if (strcmp (buf, "OK\n") == 0)
      status = 0;
    else if (strncmp (buf, "ERROR ", 6) == 0) {
      fprintf (stderr, "ssdcache ctl: %s", buf + 6);
      status = 1;
    }
    else
      fputs (buf, stdout);
  }
  if (status == 2)
    fprintf (stderr, "ssdcache ctl: the filter closed the connection "
             "without an answer\n");
  return status;
}

static int
ctl_main (int argc, char **argv)
{
  char *line;
  FILE *fp;
  int fd;

  /* argv[0] is "ctl"; then SOCKET and the command. */
  argc--;
  argv++;
  if (argc < 2)
    return tool_usage_error ("ctl", "usage: %s", CTL_USAGE);
  line = ctl_line (argc - 1, argv + 1);
  if (line == NULL) {
    fprintf (stderr, "ssdcache ctl: %s\n", strerror (errno));
    return 2;
  }
  fd = ctl_connect (argv[0]);
  if (fd == -1) {
    free (line);
    return 2;
  }
  if (write (fd, line, strlen (line)) != (ssize_t) strlen (line)) {
    fprintf (stderr, "ssdcache ctl: %s: %s\n", argv[0], strerror (errno));
    free (line);
    close (fd);
    return 2;
  }
  free (line);
  shutdown (fd, SHUT_WR);
  fp = fdopen (fd, "r");
  if (fp == NULL) {
    close (fd);
    return 2;
  }
  {
    int r = ctl_answer (fp);
    fclose (fp);
    return r;
  }
}

static const struct tool_command ctl_command = {
  .name = "ctl",
  .synopsis = "SOCKET status|stats|drain [--wait]|mode MODE|"
              "invalidate [OFFSET LENGTH]",
  .summary = "send a command to a running filter (ssdcache-control)",
  .run = ctl_main,
};
TOOL_COMMAND (ctl_command);
