/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-ssdcache-filter unit tests: the errors log-stderr.c logged.
 *
 * log-stderr.c implements log.h on stderr and keeps what it logged for
 * the tests to check.  Read from the main thread only: the mutex in
 * log-stderr.c guards the updates, not these reads.
 */
#ifndef SSDCACHE_LOG_STDERR_H
#define SSDCACHE_LOG_STDERR_H

/* Errors logged so far, and the last one. */
extern int log_error_count;
extern char log_error_last[512];

/* Forget the errors logged so far; is text in one logged since? */
extern void log_errors_forget (void);
extern int log_errors_contain (const char *text);

#endif /* SSDCACHE_LOG_STDERR_H */
