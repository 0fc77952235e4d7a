/*
 * What the files of meshctl share, and nothing outside them sees: meshctl.c (usage, the command line,
 * main), out.c (one set of helpers that print a field as table text or as JSON), render.c (the field
 * tables and what each object prints), ctl.c (talking to meshd over its control socket), show.c (one
 * look at an object, or one every few seconds), ping.c (`meshctl ping`) and ops.c (metrics, reload,
 * drain, keygen). Each cmd_* runs one command and returns meshctl's exit status.
 */
#ifndef MESH_MESHCTL_MESHCTL_H
#define MESH_MESHCTL_MESHCTL_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

#define REPLY_TIMEOUT_S 5

/* ---- out.c: one set of helpers for table and JSON ---- */

struct out {
	bool json, pretty;
	bool wide;  /* -o wide: every table column */
	long peer;  /* links, channels PEER: that peer's rows only; -1 all */
	int depth;
	bool first; /* no comma before the next JSON member */
};

enum field_kind {
	F_U32,
	F_I32,
	F_U64,
	F_STR,
	F_BOOL,
	F_STATE,
	F_MAILBOX,
	F_NODE, /* a NUMA node: JSON the number; table "-" for -1 (none/unknown), "spread" for -2 */
	F_WALL_US, /* wall clock in us: JSON the number; table UTC time, "-" for 0 */
	F_DURATION_MS, /* milliseconds: JSON the number; table 850ms, 12.3s, 4m05s, 2h03m, 3d04h */
};

struct field {
	const char *key;   /* JSON member */
	bool table;        /* a table column, headed by the JSON key in capitals; false: JSON only */
	int width;         /* table column width, negative = left aligned */
	enum field_kind kind;
	size_t off;
	bool wide; /* a table column only with -o wide (the default table fits 100 columns) */
};

void json_str(const char *s);
void json_key(struct out *o, const char *key);
void json_open(struct out *o, const char *key, char brace);
void json_close(struct out *o, char brace);
void field_print(struct out *o, const struct field *f, const void *obj, bool table);
void print_rows(struct out *o, const char *key, const struct field *fields, size_t nf, void *const *rows,
		size_t n);
void print_list(struct out *o, const CtlReply *r, const char *key, const struct field *fields, size_t nf,
		void *const *rows, size_t n, const char *title);

/* ---- render.c: what each object prints ---- */

void print_links(struct out *o, const CtlReply *r);
void print_node(struct out *o, const CtlReply *r);
void print_channels(struct out *o, const CtlReply *r);
void print_ports(struct out *o, const CtlReply *r);
void print_node_members(struct out *o, const NodeInfo *n, bool (*want)(const char *key));

/* ---- ctl.c: talking to meshd ---- */

extern bool ctl_quiet;
extern volatile sig_atomic_t interrupted;

void catch_interrupts(void);
int ctl_connect(const char *path);
int ctl_recv(int fd, const char *path, CtlReply **out);
int ctl_call(int fd, const char *path, const CtlRequest *req, CtlReply **out);

/* One listing: every reply (meshd pages lists: CtlReply.total), and a view of the first whose lists
 * are every page's items (arrays of pointers owned here, the items by their pages). */
struct listing {
	CtlReply **pages;
	size_t n_pages;
	CtlReply view;
};

int listing_fetch(const char *path, CtlObject obj, bool live, struct listing *ls);
void listing_free(struct listing *ls);
int node_op(const char *path, CtlOp op, uint32_t drain_ms, CtlReply **out);

/* ---- show.c: show, once or every few seconds ---- */

struct object {
	const char *name;
	CtlObject obj;
	void (*print)(struct out *, const CtlReply *);
};

int cmd_show(const char *path, struct out *o, const struct object *ob, bool live);
int cmd_watch(const char *path, struct out *o, const struct object *ob, bool live, uint32_t every_ms,
	      const char *what);

/* ---- ping.c ---- */

struct ping_args {
	uint32_t node, count, interval_ms, timeout_ms;
	int rail; /* -1: every UP rail */
};

int cmd_ping(const char *path, struct out *o, const struct ping_args *pa);

/* ---- ops.c: the commands without a table ---- */

int cmd_metrics(const char *path);
int cmd_reload(const char *path, struct out *o);
int cmd_drain(const char *path, struct out *o, uint32_t deadline_ms, bool wait);
int cmd_keygen(struct out *o);

#endif
