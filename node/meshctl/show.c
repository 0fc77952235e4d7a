/*
 * `meshctl [OBJECT]`: one look at links, node, channels or ports, fetched from meshd as one listing and
 * printed by the object's renderer (render.c); with --watch, one look every few seconds until
 * interrupted, as watch(1).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "meshctl.h"

/* One look at an object: 0, or 2 when meshd cannot be reached or refused (said). */
int cmd_show(const char *path, struct out *o, const struct object *ob, bool live)
{
	struct listing ls;
	CtlReply *r;

	if (listing_fetch(path, ob->obj, live, &ls))
		return 2;
	r = &ls.view;
	if (r->status) {
		fprintf(stderr, "meshctl: meshd: %s (%s)\n", r->error && *r->error ? r->error : "error",
			mesh_strerror(r->status));
		listing_free(&ls);
		return 2;
	}
	/* meshd answered from what its data path last published (admin.h): say how old it is. */
	if (r->node && r->node->from_snapshot)
		fprintf(stderr, "meshctl: meshd's data path is busy (link work): its state of %" PRIu64 " ms ago\n",
			r->node->snapshot_age_ms);
	o->first = true;
	o->depth = 0;
	ob->print(o, r);
	listing_free(&ls);
	return 0;
}

/* `meshctl -w SEC OBJECT`: as watch(1), the object again every SEC seconds until interrupted (exit 0),
 * under a header with the time; the screen cleared first on a terminal, one look after the other
 * otherwise (a log); with -j one JSON document per look, no header. meshd unreachable for a while
 * is said on stderr and looked at again. */
int cmd_watch(const char *path, struct out *o, const struct object *ob, bool live, uint32_t every_ms,
	      const char *what)
{
	bool tty = isatty(STDOUT_FILENO);

	catch_interrupts();
	while (!interrupted) {
		struct timespec ts = {.tv_sec = every_ms / 1000, .tv_nsec = (long)(every_ms % 1000) * 1000000L};
		char when[32];
		time_t now = time(NULL);
		struct tm tm;

		if (tty && !o->json)
			fputs("\033[H\033[2J", stdout);
		if (!o->json) {
			strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S%z", localtime_r(&now, &tm) ? &tm : gmtime_r(&now, &tm));
			printf("Every %.1fs: meshctl %s    %s\n\n", every_ms / 1000.0, what, when);
		}
		cmd_show(path, o, ob, live);
		if (!tty && !o->json)
			putchar('\n');
		fflush(stdout);
		while (!interrupted && nanosleep(&ts, &ts) && errno == EINTR)
			;
	}
	return 0;
}
