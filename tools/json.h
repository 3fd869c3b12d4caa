/* SPDX-License-Identifier: BSD-3-Clause */
/* ssdcache tool: a small JSON writer.
 *
 * Owns the JSON syntax of the tool's output: nesting, commas,
 * indentation and the escaping of strings (quotes, backslashes,
 * control characters; bytes that are not valid UTF-8 become \u00XX,
 * so that the output is always valid JSON whatever a file name or an
 * identity holds).  Values are written as they come, nothing is kept.
 *
 * Inside an object every value has a key; inside an array (or at the
 * top) key is NULL.
 */
#ifndef SSDCACHE_TOOL_JSON_H
#define SSDCACHE_TOOL_JSON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define JSON_MAX_DEPTH 16

struct json {
  FILE *fp;
  int depth;
  bool first[JSON_MAX_DEPTH];   /* nothing written yet at this depth */
};

extern void json_init (struct json *j, FILE *fp);
extern void json_begin_object (struct json *j, const char *key);
extern void json_end_object (struct json *j);
extern void json_begin_array (struct json *j, const char *key);
extern void json_end_array (struct json *j);
extern void json_string (struct json *j, const char *key, const char *s);
extern void json_uint (struct json *j, const char *key, uint64_t v);
extern void json_int (struct json *j, const char *key, int64_t v);
extern void json_bool (struct json *j, const char *key, bool v);
extern void json_null (struct json *j, const char *key);
/* After the outermost value: the final newline. */
extern void json_finish (struct json *j);

/* s as a JSON string literal, quotes included. */
extern void json_write_string (FILE *fp, const char *s);

#endif /* SSDCACHE_TOOL_JSON_H */
