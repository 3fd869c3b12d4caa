/* SPDX-License-Identifier: BSD-3-Clause */
/* ssdcache tool: the info and check subcommands.
 *
 * Owns their options and their output, as text ("name: value" lines,
 * like the filter's ssdcache-stats file) and as JSON (--json).  Both
 * read the file through cachefile.c, read only: info the superblock
 * and the page table, check also the data of every slot and what the
 * next start would make of it.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cachefile.h"
#include "json.h"
#include "ssdcache.h"

struct opts {
  bool json;
  const char *file;
};

/* getopt_long found an option it does not know: arg (long), or optopt
 * (short).
 */
static int
unknown_option (const struct tool_command *cmd, const char *arg)
{
  char s[3] = { '-', (char) optopt, '\0' };

  return tool_usage_error (cmd->name, "unknown option '%s'",
                           strncmp (arg, "--", 2) == 0 || optopt == 0
                           ? arg : s);
}

/* Options of info and check: [--json] FILE, in any order.  Returns -1
 * to go on, or the exit status (--help, a usage error).
 */
static int
parse_args (const struct tool_command *cmd, int argc, char **argv,
            struct opts *o)
{
  static const struct option longopts[] = {
    { "help", no_argument, NULL, 'h' },
    { "json", no_argument, NULL, 'j' },
    { NULL, 0, NULL, 0 },
  };
  int c;

  memset (o, 0, sizeof *o);
  opterr = 0;
  while ((c = getopt_long (argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'h':
      tool_print_usage (stdout, cmd);
      printf ("\n  --json   write JSON instead of \"name: value\" lines\n"
              "  --help   this text\n");
      return TOOL_EXIT_OK;
    case 'j':
      o->json = true;
      break;
    default:
      return unknown_option (cmd, argv[optind - 1]);
    }
  }
  if (optind == argc)
    return tool_usage_error (cmd->name, "no cache FILE given");
  if (argc - optind > 1)
    return tool_usage_error (cmd->name, "one FILE only: '%s' is one too "
                             "many", argv[optind + 1]);
  o->file = argv[optind];
  return -1;
}

/*----------------------------------------------------------------------
 * Pieces of the output.
 */

/* s with control characters escaped (it comes from the file). */
static void
print_escaped (FILE *fp, const char *s)
{
  for (const unsigned char *p = (const unsigned char *) s; *p; p++)
    if (*p < 0x20 || *p == 0x7f || *p == '\\')
      fprintf (fp, "\\x%02x", *p);
    else
      fputc (*p, fp);
}

static void
format_uuid (const uint8_t *u, char out[37])
{
  char *p = out;

  for (int i = 0; i < 16; i++) {
    p += sprintf (p, "%02x", u[i]);
    if (i == 3 || i == 5 || i == 7 || i == 9)
      *p++ = '-';
  }
  *p = '\0';
}

static void
format_digest (const uint64_t d[2], char out[33])
{
  snprintf (out, 33, "%016" PRIx64 "%016" PRIx64, d[0], d[1]);
}

static const char *
yes_no (bool b)
{
  return b ? "yes" : "no";
}

static void
print_in_use (const struct cachefile *cf)
{
  if (cf->locked_by > 0)
    printf ("in_use_by_pid: %d\n", (int) cf->locked_by);
  else
    printf ("in_use_by_pid: %s\n", cf->locked_by == 0 ? "none" : "unknown");
}

static void
json_in_use (struct json *j, const struct cachefile *cf)
{
  if (cf->locked_by > 0)
    json_int (j, "in_use_by_pid", cf->locked_by);
  else
    json_null (j, "in_use_by_pid");
}

static void
print_superblocks (const struct cachefile *cf)
{
  for (int i = 0; i < LAYOUT_SB_COUNT; i++) {
    if (cf->sb_ok[i])
      printf ("superblock_%c: valid, generation %" PRIu64 "%s\n", 'A' + i,
              cf->sbs[i].generation, cf->used == i ? " (used)" : "");
    else
      printf ("superblock_%c: damaged: %s\n", 'A' + i,
              cf->sb_why[i] ? cf->sb_why[i] : "not read");
  }
}

static void
json_superblocks (struct json *j, const struct cachefile *cf)
{
  json_begin_array (j, "superblocks");
  for (int i = 0; i < LAYOUT_SB_COUNT; i++) {
    const char copy[2] = { 'A' + i, '\0' };

    json_begin_object (j, NULL);
    json_string (j, "copy", copy);
    json_bool (j, "valid", cf->sb_ok[i]);
    json_bool (j, "used", cf->used == i);
    if (cf->sb_ok[i])
      json_uint (j, "generation", cf->sbs[i].generation);
    else
      json_string (j, "error", cf->sb_why[i] ? cf->sb_why[i] : "not read");
    json_end_object (j);
  }
  json_end_array (j);
  if (cf->used >= 0) {
    const char copy[2] = { 'A' + cf->used, '\0' };
    json_string (j, "superblock", copy);
  }
  else
    json_null (j, "superblock");
}

/*----------------------------------------------------------------------
 * info
 */

static void
info_text (const struct cachefile *cf)
{
  const struct layout_sb *sb = &cf->sb;
  char uuid[37], digest[33];

  format_uuid (sb->uuid, uuid);
  format_digest (sb->id_digest, digest);
  printf ("file: %s\n", cf->path);
  printf ("format_version: %" PRIu32 "\n", sb->version);
  printf ("superblock: %c\n", 'A' + cf->used);
  printf ("generation: %" PRIu64 "\n", sb->generation);
  print_superblocks (cf);
  printf ("uuid: %s\n", uuid);
  printf ("identity: ");
  print_escaped (stdout, sb->id_text);
  printf ("\nidentity_digest: %s\n", digest);
  printf ("backend_size: %" PRIu64 "\n", sb->backend_size);
  printf ("page_size: %" PRIu32 "\n", sb->page_size);
  printf ("sector_size: %" PRIu32 "\n", sb->sector_size);
  printf ("slots: %" PRIu64 "\n", sb->nslots);
  printf ("page_table_offset: %" PRIu64 "\n", sb->pt_offset);
  printf ("pool_offset: %" PRIu64 "\n", sb->pool_offset);
  printf ("cache_size: %" PRIu64 "\n", cf->total);
  printf ("file_size: %" PRIu64 "\n", cf->size);
  if (cf->data_end < sb->nslots)
    printf ("truncated: yes: the data of slots %" PRIu64 " and up is gone\n",
            cf->data_end);
  printf ("clean_shutdown: %s\n", yes_no (sb->flags & LAYOUT_SB_CLEAN));
  printf ("may_hold_dirty_data: %s\n", yes_no (sb->flags & LAYOUT_SB_DIRTY));
  printf ("entries_written_at_creation: %s\n",
          yes_no (sb->flags & LAYOUT_SB_PTINIT));
  printf ("resize_interrupted: %s\n",
          yes_no (sb->flags & LAYOUT_SB_RESIZING));
  printf ("last_mode: %s\n", cf_mode_name (sb->mode));
  print_in_use (cf);
}

static void
info_text_counts (const struct cachefile *cf)
{
  printf ("free_slots: %" PRIu64 "\n", cf->n_free);
  printf ("clean_slots: %" PRIu64 "\n", cf->n_clean);
  printf ("dirty_slots: %" PRIu64 "\n", cf->n_dirty);
  printf ("unsealed_slots: %" PRIu64 "\n", cf->n_unsealed);
  printf ("unsealed_dirty_slots: %" PRIu64 "\n", cf->n_unsealed_dirty);
  printf ("damaged_entries: %" PRIu64 "\n", cf->n_damaged);
  printf ("cached_pages: %" PRIu64 "\n", cf->pages);
  printf ("dirty_pages: %" PRIu64 "\n", cf->dirty_pages);
  printf ("dirty_bytes: %" PRIu64 "\n", cf->dirty_bytes);
  printf ("older_versions: %" PRIu64 "\n", cf->older_versions);
}

static void
info_json_geometry (struct json *j, const struct cachefile *cf)
{
  const struct layout_sb *sb = &cf->sb;

  json_uint (j, "backend_size", sb->backend_size);
  json_uint (j, "page_size", sb->page_size);
  json_uint (j, "sector_size", sb->sector_size);
  json_uint (j, "slots", sb->nslots);
  json_uint (j, "page_table_offset", sb->pt_offset);
  json_uint (j, "pool_offset", sb->pool_offset);
  json_uint (j, "cache_size", cf->total);
  json_uint (j, "file_size", cf->size);
  json_bool (j, "truncated", cf->data_end < sb->nslots);
  if (cf->data_end < sb->nslots)
    json_uint (j, "data_end_slot", cf->data_end);
}

static void
info_json (const struct cachefile *cf)
{
  const struct layout_sb *sb = &cf->sb;
  char uuid[37], digest[33];
  struct json j;

  format_uuid (sb->uuid, uuid);
  format_digest (sb->id_digest, digest);
  json_init (&j, stdout);
  json_begin_object (&j, NULL);
  json_string (&j, "file", cf->path);
  json_uint (&j, "format_version", sb->version);
  json_uint (&j, "generation", sb->generation);
  json_superblocks (&j, cf);
  json_string (&j, "uuid", uuid);
  json_string (&j, "identity", sb->id_text);
  json_string (&j, "identity_digest", digest);
  info_json_geometry (&j, cf);
  json_bool (&j, "clean_shutdown", sb->flags & LAYOUT_SB_CLEAN);
  json_bool (&j, "may_hold_dirty_data", sb->flags & LAYOUT_SB_DIRTY);
  json_bool (&j, "entries_written_at_creation", sb->flags & LAYOUT_SB_PTINIT);
  json_bool (&j, "resize_interrupted", sb->flags & LAYOUT_SB_RESIZING);
  json_string (&j, "last_mode", cf_mode_name (sb->mode));
  json_in_use (&j, cf);
  json_uint (&j, "free_slots", cf->n_free);
  json_uint (&j, "clean_slots", cf->n_clean);
  json_uint (&j, "dirty_slots", cf->n_dirty);
  json_uint (&j, "unsealed_slots", cf->n_unsealed);
  json_uint (&j, "unsealed_dirty_slots", cf->n_unsealed_dirty);
  json_uint (&j, "damaged_entries", cf->n_damaged);
  json_uint (&j, "cached_pages", cf->pages);
  json_uint (&j, "dirty_pages", cf->dirty_pages);
  json_uint (&j, "dirty_bytes", cf->dirty_bytes);
  json_uint (&j, "older_versions", cf->older_versions);
  json_end_object (&j);
  json_finish (&j);
}

static int
info_main (int argc, char **argv);

static const struct tool_command info_command = {
  .name = "info",
  .synopsis = "FILE [--json]",
  .summary = "describe a cache file (read only: works on a cache in use)",
  .run = info_main,
};
TOOL_COMMAND (info_command);

static int
info_main (int argc, char **argv)
{
  struct cachefile cf;
  struct opts o;
  enum cf_status st;
  int r = parse_args (&info_command, argc, argv, &o);

  if (r >= 0)
    return r;
  st = cf_open (&cf, o.file);
  if (st == CF_NO_SB)
    tool_error ("%s: %s (see %s check)", o.file, cf.prob[0].msg, TOOL_NAME);
  if (st != CF_OK || cf_scan (&cf, false) == -1) {
    cf_close (&cf);
    return TOOL_EXIT_ERROR;
  }
  cf_pages (&cf);
  if (o.json)
    info_json (&cf);
  else {
    info_text (&cf);
    info_text_counts (&cf);
  }
  cf_close (&cf);
  return TOOL_EXIT_OK;
}

/*----------------------------------------------------------------------
 * check
 */

static const char *
kind_name (enum cf_kind k)
{
  switch (k) {
  case CF_P_SUPERBLOCK: return "superblock";
  case CF_P_NO_SUPERBLOCK: return "no_superblock";
  case CF_P_TRUNCATED: return "truncated";
  case CF_P_ENTRY: return "entry";
  case CF_P_PAST_BACKEND: return "past_backend";
  case CF_P_CUT: return "cut_off";
  case CF_P_DATA: return "data";
  case CF_P_UNSEALED: return "unsealed";
  default: return "unknown";
  }
}

static void
check_text_scan (const struct cachefile *cf)
{
  printf ("clean_shutdown: %s\n", yes_no (cf->sb.flags & LAYOUT_SB_CLEAN));
  printf ("may_hold_dirty_data: %s\n",
          yes_no (cf->sb.flags & LAYOUT_SB_DIRTY));
  printf ("entries: %" PRIu64 " (%" PRIu64 " free, %" PRIu64 " clean, %"
          PRIu64 " dirty, %" PRIu64 " unsealed, %" PRIu64 " damaged)\n",
          cf->sb.nslots, cf->n_free, cf->n_clean, cf->n_dirty,
          cf->n_unsealed, cf->n_damaged);
  printf ("data_checked: %" PRIu64 "\n", cf->data_checked);
  printf ("data_bad: %" PRIu64 "\n", cf->data_bad);
  printf ("data_unsealed: %" PRIu64 "\n", cf->data_unsealed);
  if (cf->data_unsealed)
    printf ("note: unsealed slots have no data checksum, so their data is "
            "not checked; a start after an unclean shutdown drops them "
            "(writes not flushed yet)\n");
  if (cf->sb.flags & LAYOUT_SB_RESIZING)
    printf ("note: a change of size was interrupted: a start ignores the "
            "entries and starts an empty cache (it held no dirty data)\n");
  else if (!(cf->sb.flags & LAYOUT_SB_CLEAN))
    printf ("note: not closed cleanly (in use, or after a crash): a start "
            "recovers as after a crash\n");
}

static void
check_text_problems (const struct cachefile *cf)
{
  for (size_t i = 0; i < cf->nprob; i++)
    printf ("damage: %s\n", cf->prob[i].msg);
  if (cf->nprob_more)
    printf ("damage: %" PRIu64 " more problems, not listed (the first %d "
            "found are)\n", cf->nprob_more, CF_PROBLEMS_MAX);
  for (size_t i = 0; i < cf->nprob; i++)
    if (cf->prob[i].risk)
      printf ("at risk: %s\n", cf->prob[i].risk);
  if (cf->damaged_entries_may_dirty)
    printf ("at risk: DIRTY DATA MAY BE LOST: %" PRIu64 " damaged %s in a "
            "cache that may hold dirty data: whatever dirty data %s "
            "described is lost at the next start\n",
            cf->damaged_entries_may_dirty,
            cf->damaged_entries_may_dirty == 1 ? "entry" : "entries",
            cf->damaged_entries_may_dirty == 1 ? "it" : "they");
}

static void
check_text_recovery (const struct cachefile *cf)
{
  const struct cf_recovery *r = &cf->rec;

  printf ("next start (the filter's counters, with every page read):\n");
  printf ("clean_start: %s\n", yes_no (r->clean_start));
  printf ("loaded_slots: %" PRIu64 "\n", r->loaded_slots);
  printf ("dirty_pages: %" PRIu64 "\n", r->dirty_pages);
  printf ("dropped_entries: %" PRIu64 "\n", r->dropped_entries);
  printf ("damaged_entries: %" PRIu64 "\n", r->damaged_entries);
  printf ("dirty_dropped: %" PRIu64 "\n", r->dirty_dropped);
  printf ("unsealed_dropped: %" PRIu64 "\n", r->unsealed_dropped);
  printf ("verify_failures: %" PRIu64 "\n", r->verify_failures);
}

static void
check_text_result (const struct cachefile *cf)
{
  if (cf->nprob == 0) {
    printf ("result: clean\n");
    return;
  }
  printf ("result: damage found: %" PRIu64 " problem%s, %" PRIu64 " with "
          "dirty data at risk%s\n", cf->nprob + cf->nprob_more,
          cf->nprob + cf->nprob_more == 1 ? "" : "s",
          cf->at_risk, cf->damaged_entries_may_dirty
          ? ", and damaged entries that may have held dirty data" : "");
}

static void
check_text (const struct cachefile *cf, enum cf_status st)
{
  printf ("file: %s\n", cf->path);
  print_in_use (cf);
  print_superblocks (cf);
  if (st == CF_OK)
    check_text_scan (cf);
  check_text_problems (cf);
  if (st == CF_OK)
    check_text_recovery (cf);
  check_text_result (cf);
}

static void
json_problem (struct json *j, const struct cf_problem *p)
{
  json_begin_object (j, NULL);
  json_string (j, "what", kind_name (p->kind));
  if (p->slot >= 0) {
    json_int (j, "slot", p->slot);
    json_int (j, "last_slot", p->last_slot);
  }
  if (p->has_page) {
    json_uint (j, "page", p->page);
    json_bool (j, "page_verified", p->page_known);
  }
  if (p->state >= 0)
    json_string (j, "state", cf_state_name (p->state));
  json_string (j, "message", p->msg);
  json_bool (j, "dirty_at_risk", p->risk != NULL);
  json_end_object (j);
}

static void
json_risks (struct json *j, const struct cachefile *cf)
{
  json_begin_array (j, "dirty_at_risk");
  for (size_t i = 0; i < cf->nprob; i++) {
    const struct cf_problem *p = &cf->prob[i];

    if (p->risk == NULL)
      continue;
    json_begin_object (j, NULL);
    json_int (j, "slot", p->slot);
    json_uint (j, "page", p->page);
    json_bool (j, "page_verified", p->page_known);
    json_string (j, "message", p->risk);
    json_end_object (j);
  }
  json_end_array (j);
  json_uint (j, "damaged_entries_may_hold_dirty",
             cf->damaged_entries_may_dirty);
}

static void
json_scan (struct json *j, const struct cachefile *cf)
{
  json_bool (j, "clean_shutdown", cf->sb.flags & LAYOUT_SB_CLEAN);
  json_bool (j, "may_hold_dirty_data", cf->sb.flags & LAYOUT_SB_DIRTY);
  json_begin_object (j, "entries");
  json_uint (j, "slots", cf->sb.nslots);
  json_uint (j, "free", cf->n_free);
  json_uint (j, "clean", cf->n_clean);
  json_uint (j, "dirty", cf->n_dirty);
  json_uint (j, "unsealed", cf->n_unsealed);
  json_uint (j, "damaged", cf->n_damaged);
  json_end_object (j);
  json_begin_object (j, "data");
  json_uint (j, "checked", cf->data_checked);
  json_uint (j, "bad", cf->data_bad);
  json_uint (j, "unsealed_not_checked", cf->data_unsealed);
  json_end_object (j);
}

static void
json_recovery (struct json *j, const struct cachefile *cf)
{
  const struct cf_recovery *r = &cf->rec;

  json_begin_object (j, "next_start");
  json_bool (j, "clean_start", r->clean_start);
  json_uint (j, "loaded_slots", r->loaded_slots);
  json_uint (j, "dirty_pages", r->dirty_pages);
  json_uint (j, "dropped_entries", r->dropped_entries);
  json_uint (j, "damaged_entries", r->damaged_entries);
  json_uint (j, "dirty_dropped", r->dirty_dropped);
  json_uint (j, "unsealed_dropped", r->unsealed_dropped);
  json_uint (j, "verify_failures", r->verify_failures);
  json_end_object (j);
}

static void
check_json (const struct cachefile *cf, enum cf_status st)
{
  struct json j;

  json_init (&j, stdout);
  json_begin_object (&j, NULL);
  json_string (&j, "file", cf->path);
  json_in_use (&j, cf);
  json_superblocks (&j, cf);
  if (st == CF_OK)
    json_scan (&j, cf);
  json_begin_array (&j, "damage");
  for (size_t i = 0; i < cf->nprob; i++)
    json_problem (&j, &cf->prob[i]);
  json_end_array (&j);
  json_int (&j, "damage_not_listed", cf->nprob_more);
  json_risks (&j, cf);
  if (st == CF_OK)
    json_recovery (&j, cf);
  else
    json_null (&j, "next_start");
  json_string (&j, "result", cf->nprob ? "damage found" : "clean");
  json_int (&j, "exit_status", cf->nprob ? TOOL_EXIT_DAMAGE : TOOL_EXIT_OK);
  json_end_object (&j);
  json_finish (&j);
}

static int
check_main (int argc, char **argv);

static const struct tool_command check_command = {
  .name = "check",
  .synopsis = "FILE [--json]",
  .summary = "verify every checksum, list damage and dirty data at risk",
  .run = check_main,
};
TOOL_COMMAND (check_command);

static int
check_main (int argc, char **argv)
{
  struct cachefile cf;
  struct opts o;
  enum cf_status st;
  int r = parse_args (&check_command, argc, argv, &o);

  if (r >= 0)
    return r;
  st = cf_open (&cf, o.file);
  if (st == CF_ERROR || (st == CF_OK && cf_scan (&cf, true) == -1)) {
    cf_close (&cf);
    return TOOL_EXIT_ERROR;
  }
  if (cf.locked_by > 0)
    tool_error ("warning: %s is in use by process %d: it may change while "
                "it is checked, and what is reported as damage may be a "
                "change in progress", o.file, (int) cf.locked_by);
  if (st == CF_OK)
    cf_recover (&cf);
  if (o.json)
    check_json (&cf, st);
  else
    check_text (&cf, st);
  r = cf.nprob ? TOOL_EXIT_DAMAGE : TOOL_EXIT_OK;
  cf_close (&cf);
  return r;
}
