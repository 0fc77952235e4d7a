/*
 * The growing text buffer the metrics are written into (metrics.h's struct metrics_buf): printf,
 * a label value escaped, the text taken or freed. It calls nothing of meshd, so the renderer
 * (metrics.c) and the process_* families (metrics_process.c) both stand on it.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

static bool buf_room(struct metrics_buf *b, size_t more)
{
	size_t cap;
	char *s;

	if (b->oom)
		return false;
	if (b->len + more + 1 <= b->cap)
		return true;
	cap = b->cap ? b->cap : 4096;
	while (cap < b->len + more + 1)
		cap *= 2;
	s = realloc(b->s, cap);
	if (!s) {
		b->oom = true;
		return false;
	}
	b->s = s;
	b->cap = cap;
	return true;
}

void metrics_buf_printf(struct metrics_buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!buf_room(b, 256))
		return;
	va_start(ap, fmt);
	n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= b->cap - b->len) {
		if (!buf_room(b, (size_t)n))
			return;
		va_start(ap, fmt);
		vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
	}
	b->len += (size_t)n;
}

void metrics_buf_label_value(struct metrics_buf *b, const char *v)
{
	if (!buf_room(b, 2 * strlen(v)))
		return;
	for (; *v; v++) {
		if (*v == '\\' || *v == '"') {
			b->s[b->len++] = '\\';
			b->s[b->len++] = *v;
		} else if (*v == '\n') {
			b->s[b->len++] = '\\';
			b->s[b->len++] = 'n';
		} else {
			b->s[b->len++] = *v;
		}
	}
	b->s[b->len] = '\0';
}

char *metrics_buf_take(struct metrics_buf *b, size_t *len)
{
	char *s = b->s;

	*len = b->len;
	memset(b, 0, sizeof(*b));
	return s;
}

void metrics_buf_free(struct metrics_buf *b)
{
	if (!b)
		return;
	free(b->s);
	memset(b, 0, sizeof(*b));
}
