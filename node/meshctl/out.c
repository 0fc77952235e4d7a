/*
 * meshctl's output: every field is described once (a struct field of render.c's tables) and printed
 * through these helpers for both forms, an aligned table with a header or JSON (-j, -p indented), so
 * text and JSON never drift. Enums print as words, durations as 850ms..3d04h in a table and as
 * milliseconds in JSON.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>

#include "meshctl.h"

void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

static void json_sep(struct out *o)
{
	if (!o->first)
		putchar(',');
	o->first = false;
	if (o->pretty)
		printf("\n%*s", o->depth * 2, "");
}

void json_key(struct out *o, const char *key)
{
	json_sep(o);
	json_str(key);
	putchar(':');
	if (o->pretty)
		putchar(' ');
}

void json_open(struct out *o, const char *key, char brace)
{
	if (key)
		json_key(o, key);
	else if (o->depth)
		json_sep(o);
	putchar(brace);
	o->depth++;
	o->first = true;
}

void json_close(struct out *o, char brace)
{
	o->depth--;
	if (o->pretty && !o->first)
		printf("\n%*s", o->depth * 2, "");
	putchar(brace);
	o->first = false;
}

static const char *state_name(int s)
{
	switch (s) {
	case LINK_STATE__LINK_STATE_UP:
		return "UP";
	case LINK_STATE__LINK_STATE_CONNECTING:
		return "CONNECTING";
	default:
		return "DOWN";
	}
}

/* A duration as a table shows it: 850ms, 12.3s, 4m05s, 2h03m, 3d04h. */
static void duration_text(char *buf, size_t size, uint64_t ms)
{
	uint64_t secs = ms / 1000;

	if (ms < 1000)
		snprintf(buf, size, "%" PRIu64 "ms", ms);
	else if (secs < 60)
		snprintf(buf, size, "%" PRIu64 ".%" PRIu64 "s", secs, ms % 1000 / 100);
	else if (secs < 3600)
		snprintf(buf, size, "%" PRIu64 "m%02" PRIu64 "s", secs / 60, secs % 60);
	else if (secs < 86400)
		snprintf(buf, size, "%" PRIu64 "h%02" PRIu64 "m", secs / 3600, secs % 3600 / 60);
	else
		snprintf(buf, size, "%" PRIu64 "d%02" PRIu64 "h", secs / 86400, secs % 86400 / 3600);
}

/* Formats one field as table text (json = false) or as a JSON value. */
void field_print(struct out *o, const struct field *f, const void *obj, bool table)
{
	const char *p = (const char *)obj + f->off;
	char buf[96];
	const char *s = NULL;
	bool quote = false;

	switch (f->kind) {
	case F_U32:
		snprintf(buf, sizeof(buf), "%" PRIu32, *(const uint32_t *)p);
		break;
	case F_I32:
		snprintf(buf, sizeof(buf), "%" PRId32, *(const int32_t *)p);
		break;
	case F_U64:
		snprintf(buf, sizeof(buf), "%" PRIu64, *(const uint64_t *)p);
		break;
	case F_BOOL:
		snprintf(buf, sizeof(buf), "%s", *(const protobuf_c_boolean *)p ? "true" : "false");
		break;
	case F_DURATION_MS:
		if (table)
			duration_text(buf, sizeof(buf), *(const uint64_t *)p);
		else
			snprintf(buf, sizeof(buf), "%" PRIu64, *(const uint64_t *)p);
		break;
	case F_WALL_US: {
		uint64_t us = *(const uint64_t *)p;
		time_t t = (time_t)(us / 1000000);
		struct tm tm;

		if (table && !us)
			s = "-";
		else if (table && gmtime_r(&t, &tm))
			strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
		else
			snprintf(buf, sizeof(buf), "%" PRIu64, us);
		break;
	}
	case F_NODE: {
		int32_t v = *(const int32_t *)p;

		if (table && v < 0)
			s = v == -2 ? "spread" : "-";
		else
			snprintf(buf, sizeof(buf), "%" PRId32, v);
		break;
	}
	case F_STR:
		s = *(char *const *)p ? *(char *const *)p : "";
		quote = true;
		if (table && !*s)
			s = "-";
		break;
	case F_STATE:
		s = state_name(*(const int *)p);
		quote = true;
		break;
	case F_MAILBOX: {
		const MailboxInfo *mb = *(MailboxInfo *const *)p;
		uint64_t addr = mb ? mb->addr : 0;
		uint32_t len = mb ? mb->len : 0, rkey = mb ? mb->rkey : 0;

		if (!table) {
			json_open(o, f->key, '{');
			json_key(o, "addr");
			printf("%" PRIu64, addr);
			json_key(o, "len");
			printf("%" PRIu32, len);
			json_key(o, "rkey");
			printf("%" PRIu32, rkey);
			json_close(o, '}');
			return;
		}
		if (len)
			snprintf(buf, sizeof(buf), "0x%" PRIx64 ":%" PRIu32 ":0x%" PRIx32, addr, len, rkey);
		else
			snprintf(buf, sizeof(buf), "-");
		break;
	}
	}
	if (!s)
		s = buf;
	if (table) {
		printf("%*s", f->width == -1 ? 0 : f->width, s);
		return;
	}
	json_key(o, f->key);
	if (quote)
		json_str(s);
	else
		fputs(s, stdout);
}

/* A column's header: its JSON key in capitals, so that a table and its JSON name a value alike. */
static void print_head(const struct field *f, bool more)
{
	char head[64];
	size_t i;

	for (i = 0; f->key[i] && i + 1 < sizeof(head); i++)
		head[i] = (char)(f->key[i] >= 'a' && f->key[i] <= 'z' ? f->key[i] - 'a' + 'A' : f->key[i]);
	head[i] = '\0';
	printf("%*s%s", f->width == -1 ? 0 : f->width, head, more ? "  " : "");
}

/* A table or a JSON array of objects, from a field table. */
void print_rows(struct out *o, const char *key, const struct field *fields, size_t nf, void *const *rows,
		size_t n)
{
	if (o->json) {
		json_open(o, key, '[');
		for (size_t i = 0; i < n; i++) {
			json_open(o, NULL, '{');
			for (size_t f = 0; f < nf; f++)
				field_print(o, &fields[f], rows[i], false);
			json_close(o, '}');
		}
		json_close(o, ']');
		return;
	}
	for (size_t f = 0; f < nf; f++)
		if (fields[f].table && (o->wide || !fields[f].wide))
			print_head(&fields[f], f + 1 < nf);
	putchar('\n');
	for (size_t i = 0; i < n; i++) {
		for (size_t f = 0; f < nf; f++) {
			if (!fields[f].table || (fields[f].wide && !o->wide))
				continue;
			field_print(o, &fields[f], rows[i], true);
			if (f + 1 < nf)
				fputs("  ", stdout);
		}
		putchar('\n');
	}
}

/* A list object: JSON {"node": id, key: [rows]}, or a title line (when meshd named its node) over
 * the table. */
void print_list(struct out *o, const CtlReply *r, const char *key, const struct field *fields, size_t nf,
		void *const *rows, size_t n, const char *title)
{
	if (o->json) {
		json_open(o, NULL, '{');
		json_key(o, "node");
		printf("%" PRIu32, r->node ? r->node->id : 0);
		print_rows(o, key, fields, nf, rows, n);
		json_close(o, '}');
		putchar('\n');
		return;
	}
	if (r->node)
		puts(title);
	print_rows(o, NULL, fields, nf, rows, n);
}
