/* SPDX-License-Identifier: BSD-3-Clause */
/* ssdcache tool: a small JSON writer (see json.h).
 *
 * Owns the JSON syntax of the output: separators, two-space
 * indentation and string escaping.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "json.h"

/* Length of the valid UTF-8 sequence at s (1 to 4), or 0 if the bytes
 * there are not one (overlong forms, surrogates and code points above
 * U+10FFFF are not).
 */
static size_t
utf8_len (const unsigned char *s)
{
  unsigned char c = s[0];
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf;

  if (c < 0x80)
    return 1;
  if (c >= 0xc2 && c <= 0xdf)
    n = 2;
  else if (c >= 0xe0 && c <= 0xef)
    n = 3;
  else if (c >= 0xf0 && c <= 0xf4)
    n = 4;
  else
    return 0;
  /* The second byte's range excludes overlong forms and surrogates. */
  if (c == 0xe0)
    lo = 0xa0;
  else if (c == 0xed)
    hi = 0x9f;
  else if (c == 0xf0)
    lo = 0x90;
  else if (c == 0xf4)
    hi = 0x8f;
  if (s[1] < lo || s[1] > hi)
    return 0;
  for (size_t i = 2; i < n; i++)
    if (s[i] < 0x80 || s[i] > 0xbf)
      return 0;
  return n;
}

void
json_write_string (FILE *fp, const char *str)
{
  const unsigned char *s = (const unsigned char *) str;

  fputc ('"', fp);
  while (*s) {
    size_t n = utf8_len (s);

    if (*s == '"' || *s == '\\')
      fprintf (fp, "\\%c", *s);
    else if (*s == '\n')
      fputs ("\\n", fp);
    else if (*s == '\t')
      fputs ("\\t", fp);
    else if (*s == '\r')
      fputs ("\\r", fp);
    else if (*s < 0x20 || *s == 0x7f || n == 0)
      fprintf (fp, "\\u%04x", *s);        /* a stray byte as U+00XX */
    else {
      fwrite (s, 1, n, fp);
      s += n;
      continue;
    }
    s++;
  }
  fputc ('"', fp);
}

void
json_init (struct json *j, FILE *fp)
{
  memset (j, 0, sizeof *j);
  j->fp = fp;
  j->first[0] = true;
}

/* Separator, indentation and key before a value. */
static void
json_key (struct json *j, const char *key)
{
  if (!j->first[j->depth])
    fputc (',', j->fp);
  if (j->depth > 0) {
    fputc ('\n', j->fp);
    for (int i = 0; i < j->depth; i++)
      fputs ("  ", j->fp);
  }
  j->first[j->depth] = false;
  if (key) {
    json_write_string (j->fp, key);
    fputs (": ", j->fp);
  }
}

static void
json_open (struct json *j, const char *key, char c)
{
  json_key (j, key);
  fputc (c, j->fp);
  if (j->depth + 1 < JSON_MAX_DEPTH)
    j->depth++;
  j->first[j->depth] = true;
}

static void
json_close (struct json *j, char c)
{
  bool empty = j->first[j->depth];

  if (j->depth > 0)
    j->depth--;
  if (!empty) {
    fputc ('\n', j->fp);
    for (int i = 0; i < j->depth; i++)
      fputs ("  ", j->fp);
  }
  fputc (c, j->fp);
}

void
json_begin_object (struct json *j, const char *key)
{
  json_open (j, key, '{');
}

void
json_end_object (struct json *j)
{
  json_close (j, '}');
}

void
json_begin_array (struct json *j, const char *key)
{
  json_open (j, key, '[');
}

void
json_end_array (struct json *j)
{
  json_close (j, ']');
}

void
json_string (struct json *j, const char *key, const char *s)
{
  json_key (j, key);
  json_write_string (j->fp, s);
}

void
json_uint (struct json *j, const char *key, uint64_t v)
{
  json_key (j, key);
  fprintf (j->fp, "%" PRIu64, v);
}

void
json_int (struct json *j, const char *key, int64_t v)
{
  json_key (j, key);
  fprintf (j->fp, "%" PRId64, v);
}

void
json_bool (struct json *j, const char *key, bool v)
{
  json_key (j, key);
  fputs (v ? "true" : "false", j->fp);
}

void
json_null (struct json *j, const char *key)
{
  json_key (j, key);
  fputs ("null", j->fp);
}

void
json_finish (struct json *j)
{
  fputc ('\n', j->fp);
}
