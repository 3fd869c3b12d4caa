/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter: runtime control (ssdcache-control=SOCKET).
 *
 * Owns struct control, its socket and its thread; see control.h for
 * the protocol.  A command runs to its end even if the client goes
 * away meanwhile (its answer is then dropped): nothing is left half
 * done.  A client that has not sent its whole line within
 * CONTROL_TIMEOUT_MS of connecting, or does not take its answer within
 * as long, is dropped, so none can hold the thread; control_stop ends
 * such a wait at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "behind.h"
#include "control.h"
#include "log.h"
#include "stats.h"
#include "writeback.h"

#define CONTROL_LINE_MAX 1024
#define CONTROL_TIMEOUT_MS 5000

struct control {
  struct cache *c;
  const struct control_ops *ops;
  char *path;
  int fd;                        /* the listening socket */
  int stop_pipe[2];              /* written to by control_stop */
  pthread_t thread;
};

static const char *const mode_names[] = {
  [LAYOUT_MODE_WRITETHROUGH] = "writethrough",
  [LAYOUT_MODE_WRITEBACK] = "writeback",
  [LAYOUT_MODE_WRITEAROUND] = "writearound",
};

static const char *
mode_name (enum layout_mode m)
{
  return (unsigned) m < sizeof mode_names / sizeof mode_names[0] &&
    mode_names[m] ? mode_names[m] : "unknown";
}

static void
cmd_status (struct cache *c, FILE *out)
{
  const struct stats *st = cache_stats (c);

  fprintf (out, "mode: %s\n", mode_name (cache_mode (c)));
  fprintf (out, "degraded: %" PRIu64 "\n", STATS_GET (st, degraded));
  fprintf (out, "dirty_pages: %" PRIu64 "\n", cache_dirty_pages (c));
  fprintf (out, "dirty_bytes: %" PRIu64 "\n",
           cache_dirty_pages (c) * cache_page_size (c));
  fprintf (out, "slots: %" PRIu64 "\n", cache_nslots (c));
  fprintf (out, "page_size: %" PRIu32 "\n", cache_page_size (c));
  fprintf (out, "backend_size: %" PRIu64 "\n", cache_backend_size (c));
  fprintf (out, "writeback_thread: %s\n",
           writeback_running (c) ? "running" : "stopped");
  fputs ("OK\n", out);
}

static void
cmd_stats (struct cache *c, FILE *out)
{
  struct stats_extra x = { .page_size = cache_page_size (c) };

  stats_write (cache_stats (c), &x, STATS_TEXT, out);
  fputs ("OK\n", out);
}

/* Write everything back through the writeback thread; wait: until it
 * is done (and the read misses waiting to be stored are stored).
 * Returns 0 or -1 (the message in out).
 */
static int
drain (struct cache *c, bool wait, FILE *out)
{
  int err = 0;

  if (wait)
    behind_drain (c);

  if (!writeback_running (c)) {
    if (cache_dirty_pages (c) == 0)
      return 0;
    fprintf (out, "ERROR no writeback thread runs, and %" PRIu64
             " pages are dirty\n", cache_dirty_pages (c));
    return -1;
  }
  if (!wait) {
    writeback_request (c);
    return 0;
  }
  if (writeback_request_all (c, &err) == -1) {
    fprintf (out, "ERROR writeback failed: %s (the data stays dirty and "
             "is retried)\n", strerror (err));
    return -1;
  }
  return 0;
}

static void
cmd_drain (struct cache *c, char **argv, int argc, FILE *out)
{
  bool wait = argc == 2 && strcmp (argv[1], "--wait") == 0;

  if (argc > 2 || (argc == 2 && !wait)) {
    fputs ("ERROR usage: drain [--wait]\n", out);
    return;
  }
  if (drain (c, wait, out) == 0)
    fprintf (out, "%sOK\n", wait ? "" : "writeback started\n");
}

static void
cmd_mode (struct cache *c, const struct control_ops *ops, char **argv,
          int argc, FILE *out)
{
  enum layout_mode want, now = cache_mode (c);
  char err[256] = "";
  unsigned i;

  for (i = 0; argc == 2 && i < sizeof mode_names / sizeof mode_names[0];
       i++)
    if (mode_names[i] && strcmp (argv[1], mode_names[i]) == 0)
      break;
  if (argc != 2 || i == sizeof mode_names / sizeof mode_names[0]) {
    fputs ("ERROR usage: mode writethrough|writeback|writearound\n", out);
    return;
  }
  want = i;
  if (want == now) {
    /* Already there.  But a switch out of writeback whose write-back
     * failed left dirty data: asked again, it goes back now, so that
     * OK always means what it means after a switch (the backend has
     * every write).
     */
    if (now != LAYOUT_MODE_WRITEBACK && cache_dirty_pages (c) > 0 &&
        drain (c, true, out) == -1)
      return;
    fprintf (out, "mode: %s\nOK\n", mode_name (now));
    return;
  }
  if (want == LAYOUT_MODE_WRITEBACK &&
      ops->start_writeback (err, sizeof err) == -1) {
    fprintf (out, "ERROR cannot switch to writeback: %s\n", err);
    return;
  }
  cache_set_mode (c, want);
  log_debug ("ssdcache-control: mode %s -> %s", mode_name (now),
             mode_name (want));
  /* Leaving writeback: what is dirty goes back now. */
  if (now == LAYOUT_MODE_WRITEBACK && drain (c, true, out) == -1)
    return;
  fprintf (out, "mode: %s\nOK\n", mode_name (want));
}

/* A size argument: decimal or 0x hex, nothing after it. */
static bool
parse_u64 (const char *s, uint64_t *v)
{
  char *end;

  if (*s == '-' || *s == '\0')
    return false;
  errno = 0;
  *v = strtoull (s, &end, 0);
  return errno == 0 && *end == '\0';
}

static void
cmd_invalidate (struct cache *c, char **argv, int argc, FILE *out)
{
  uint64_t off = 0, len = 0;

  if (argc == 3 &&
      (!parse_u64 (argv[1], &off) || !parse_u64 (argv[2], &len) ||
       len == 0 || off >= cache_backend_size (c))) {
    fputs ("ERROR invalidate: OFFSET must be within the disk and "
           "LENGTH greater than 0\n", out);
    return;
  }
  if (argc != 1 && argc != 3) {
    fputs ("ERROR usage: invalidate [OFFSET LENGTH]\n", out);
    return;
  }
  fprintf (out, "dropped_pages: %" PRIu64 "\nOK\n",
           cache_drop_clean (c, off, len));
}

void
control_command (struct cache *c, const struct control_ops *ops,
                 char *line, FILE *out)
{
  char *argv[8], *save = NULL, *w;
  int argc = 0;

  for (w = strtok_r (line, " \t\r", &save); w && argc < 8;
       w = strtok_r (NULL, " \t\r", &save))
    argv[argc++] = w;
  if (argc == 0 || w != NULL) {
    fputs ("ERROR usage: status | stats | drain [--wait] | mode MODE | "
           "invalidate [OFFSET LENGTH]\n", out);
    return;
  }
  if (strcmp (argv[0], "status") == 0 && argc == 1)
    cmd_status (c, out);
  else if (strcmp (argv[0], "stats") == 0 && argc == 1)
    cmd_stats (c, out);
  else if (strcmp (argv[0], "drain") == 0)
    cmd_drain (c, argv, argc, out);
  else if (strcmp (argv[0], "mode") == 0)
    cmd_mode (c, ops, argv, argc, out);
  else if (strcmp (argv[0], "invalidate") == 0)
    cmd_invalidate (c, argv, argc, out);
  else
    fprintf (out, "ERROR unknown command '%s' (or wrong arguments)\n",
             argv[0]);
}

/* Wait until fd is ready for events, at most until deadline (ms of
 * cache_now_ms), or control_stop.  Returns true if it is.
 */
static bool
wait_ready (struct control *ctl, int fd, short events, uint64_t deadline)
{
  for (;;) {
    struct pollfd p[2] = { { .fd = fd, .events = events },
                           { .fd = ctl->stop_pipe[0], .events = POLLIN } };
    uint64_t now = cache_now_ms ();
    int r;

    if (now >= deadline)
      return false;
    r = poll (p, 2, deadline - now);
    if (r == -1 && errno == EINTR)
      continue;
    return r > 0 && p[1].revents == 0 && p[0].revents != 0;
  }
}

/* Read one line from fd (without its newline) into buf, all of it
 * within CONTROL_TIMEOUT_MS (a client that sends a byte now and then
 * holds the thread no longer than one that sends nothing).  Returns its
 * length, or -1 (timeout, too long, closed early, error, stopping).
 */
static ssize_t
read_line (struct control *ctl, int fd, char *buf, size_t size)
{
  const uint64_t deadline = cache_now_ms () + CONTROL_TIMEOUT_MS;
  size_t n = 0;

  while (n < size - 1) {
    ssize_t r;
    char *nl;

    if (!wait_ready (ctl, fd, POLLIN, deadline))
      return -1;
    r = read (fd, buf + n, size - 1 - n);
    if (r <= 0)
      return -1;
    n += r;
    nl = memchr (buf, '\n', n);
    if (nl) {
      *nl = '\0';
      return nl - buf;
    }
  }
  return -1;
}

/* Send the answer; a client that does not take it within
 * CONTROL_TIMEOUT_MS loses it (the command was done all the same).
 */
static void
send_answer (struct control *ctl, int fd, const char *answer, size_t len)
{
  const uint64_t deadline = cache_now_ms () + CONTROL_TIMEOUT_MS;

  for (size_t done = 0; done < len;) {
    ssize_t r;

    if (!wait_ready (ctl, fd, POLLOUT, deadline))
      break;
    r = send (fd, answer + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r == -1 && (errno == EAGAIN || errno == EINTR))
      continue;
    if (r <= 0)
      break;
    done += r;
  }
}

static void
serve_client (struct control *ctl, int fd)
{
  char line[CONTROL_LINE_MAX];
  char *answer = NULL;
  size_t len = 0;
  FILE *out = open_memstream (&answer, &len);

  if (out == NULL)
    return;
  if (read_line (ctl, fd, line, sizeof line) == -1)
    fputs ("ERROR no command line (one line, at most 1023 bytes, within "
           "5 s)\n", out);
  else
    control_command (ctl->c, ctl->ops, line, out);
  if (fclose (out) == 0)
    send_answer (ctl, fd, answer, len);
  free (answer);
}

static void *
control_thread (void *arg)
{
  struct control *ctl = arg;

  for (;;) {
    struct pollfd p[2] = { { .fd = ctl->fd, .events = POLLIN },
                           { .fd = ctl->stop_pipe[0], .events = POLLIN } };
    int fd;

    if (poll (p, 2, -1) == -1) {
      if (errno == EINTR)
        continue;
      log_error ("ssdcache-control: poll: %m");
      break;
    }
    if (p[1].revents)
      break;
    fd = accept4 (ctl->fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd == -1)
      continue;
    serve_client (ctl, fd);
    close (fd);
  }
  return NULL;
}

/* A socket already at path: a live server's (refused), or one left by
 * a crash (removed).  Anything else there is refused.
 */
static int
clear_path (const char *path, const struct sockaddr_un *sun)
{
  struct stat st;
  int fd, r;

  if (lstat (path, &st) == -1)
    return errno == ENOENT ? 0 : -1;
  if (!S_ISSOCK (st.st_mode)) {
    errno = EEXIST;
    return -1;
  }
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1)
    return -1;
  r = connect (fd, (const struct sockaddr *) sun, sizeof *sun);
  close (fd);
  if (r == 0) {
    errno = EADDRINUSE;
    return -1;
  }
  return unlink (path);
}

/* The listening socket, mode 0600 (created so: the umask hides it from
 * others between bind and chmod).
 */
static int
listen_on (const char *path)
{
  struct sockaddr_un sun = { .sun_family = AF_UNIX };
  mode_t old;
  int fd, r;

  if (strlen (path) >= sizeof sun.sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  strcpy (sun.sun_path, path);
  if (clear_path (path, &sun) == -1)
    return -1;
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1)
    return -1;
  old = umask (0177);
  r = bind (fd, (struct sockaddr *) &sun, sizeof sun);
  umask (old);
  if (r == -1 || chmod (path, 0600) == -1 || listen (fd, 8) == -1) {
    int e = errno;
    close (fd);
    errno = e;
    return -1;
  }
  return fd;
}

struct control *
control_start (struct cache *c, const char *path,
               const struct control_ops *ops)
{
  struct control *ctl = calloc (1, sizeof *ctl);
  int r;

  if (ctl == NULL || (ctl->path = strdup (path)) == NULL) {
    log_error ("malloc: %m");
    free (ctl);
    return NULL;
  }
  ctl->c = c;
  ctl->ops = ops;
  ctl->fd = listen_on (path);
  if (ctl->fd == -1) {
    log_error ("ssdcache-control: %s: %m", path);
    goto err;
  }
  if (pipe2 (ctl->stop_pipe, O_CLOEXEC) == -1) {
    log_error ("ssdcache-control: pipe: %m");
    goto err_fd;
  }
  r = pthread_create (&ctl->thread, NULL, control_thread, ctl);
  if (r != 0) {
    errno = r;
    log_error ("ssdcache-control: cannot start its thread: %m");
    close (ctl->stop_pipe[0]);
    close (ctl->stop_pipe[1]);
    goto err_fd;
  }
  return ctl;

 err_fd:
  close (ctl->fd);
  unlink (path);
 err:
  free (ctl->path);
  free (ctl);
  return NULL;
}

void
control_stop (struct control *ctl)
{
  if (ctl == NULL)
    return;
  if (write (ctl->stop_pipe[1], "x", 1) != 1)
    log_error ("ssdcache-control: stopping: %m");
  pthread_join (ctl->thread, NULL);
  close (ctl->stop_pipe[0]);
  close (ctl->stop_pipe[1]);
  close (ctl->fd);
  unlink (ctl->path);
  free (ctl->path);
  free (ctl);
}
