/*
 * The commands that print no table of an object: metrics (meshd's Prometheus text, as it serves it at
 * /metrics), reload and drain (which change the node, root or meshd's user only), and keygen (a fresh
 * cluster key, without meshd).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "auth.h"
#include "meshctl.h"

/* meshd's metrics text, page by page on one connection (the pages of one rendering), to stdout
 * as it comes. Returns the exit status: 0, or 2 (meshd cannot be reached, refused or answered
 * wrongly). */
int cmd_metrics(const char *path)
{
	CtlRequest req = CTL_REQUEST__INIT;
	uint64_t off = 0, total = 0;
	int fd = ctl_connect(path), status = 0;

	if (fd < 0)
		return 2;
	req.version = MESH_CTL_VERSION;
	req.object = CTL_OBJECT__CTL_OBJECT_METRICS;
	do {
		CtlReply *r = NULL;
		const MetricsPage *p;

		req.offset = off;
		if (ctl_call(fd, path, &req, &r)) {
			status = 2;
			break;
		}
		p = r->metrics;
		if (r->status) {
			fprintf(stderr, "meshctl: meshd: %s (%s)\n", r->error && *r->error ? r->error : "error",
				mesh_strerror(r->status));
			status = 2;
		} else if (!p || p->offset != off || (off && p->total != total) || !p->text.len ||
			   p->text.len > p->total - off) {
			fprintf(stderr, "meshctl: meshd at %s sent a metrics page that does not fit (offset %" PRIu64
				"): is it of another version?\n", path, off);
			status = 2;
		} else {
			total = p->total;
			fwrite(p->text.data, 1, p->text.len, stdout);
			off += p->text.len;
		}
		ctl_reply__free_unpacked(r, NULL);
	} while (!status && off < total);
	close(fd);
	if (!status && fflush(stdout)) {
		fprintf(stderr, "meshctl: writing the metrics: %s\n", strerror(errno));
		status = 2;
	}
	return status;
}

/* reload's JSON: the node's config_* fields. */
static bool config_key(const char *key)
{
	return !strncmp(key, "config_", 7);
}

/* `meshctl reload`: 0 when meshd applied the file, 2 when it refused it (its reason on stderr) or
 * cannot be reached. Prints the configuration in force afterwards either way. */
int cmd_reload(const char *path, struct out *o)
{
	int status = 0;
	CtlReply *r;

	if (node_op(path, CTL_OP__CTL_OP_RELOAD, 0, &r))
		return 2;
	if (r->status) {
		fprintf(stderr, "meshctl: reload refused, nothing was changed: %s\n",
			r->error && *r->error ? r->error : mesh_strerror(r->status));
		status = 2;
	}
	if (r->node && o->json) {
		json_open(o, NULL, '{');
		json_key(o, "reloaded");
		fputs(r->status ? "false" : "true", stdout);
		print_node_members(o, r->node, config_key);
		json_close(o, '}');
		putchar('\n');
	} else if (r->node && !r->status) {
		printf("reloaded %s: generation %" PRIu64 " (%" PRIu64 " reload%s, %" PRIu64 " refused)\n",
		       r->node->config_path, r->node->config_generation, r->node->config_reloads,
		       r->node->config_reloads == 1 ? "" : "s", r->node->config_refused);
	}
	ctl_reply__free_unpacked(r, NULL);
	return status;
}

/* drain's JSON: the node's channels and the time left. */
static bool drain_key(const char *key)
{
	return !strcmp(key, "channels") || !strcmp(key, "drain_left_ms");
}

/* `meshctl drain`: 0 once meshd drains (with wait: once it stopped), 2 when it refused or cannot be
 * reached. */
int cmd_drain(const char *path, struct out *o, uint32_t deadline_ms, bool wait)
{
	int status = 0;
	CtlReply *r;

	if (node_op(path, CTL_OP__CTL_OP_DRAIN, deadline_ms, &r))
		return 2;
	if (r->status || !r->node) {
		fprintf(stderr, "meshctl: drain refused: %s\n",
			r->error && *r->error ? r->error : mesh_strerror(r->status ? r->status : -EPROTO));
		ctl_reply__free_unpacked(r, NULL);
		return 2;
	}
	if (o->json) {
		json_open(o, NULL, '{');
		json_key(o, "draining");
		fputs("true", stdout);
		print_node_members(o, r->node, drain_key);
		json_close(o, '}');
		putchar('\n');
	} else {
		printf("node %u draining: no new channels; %u channel%s open; meshd stops once none is left, at the latest "
		       "in %" PRIu64 " s\n", r->node->id, r->node->channels, r->node->channels == 1 ? "" : "s",
		       (r->node->drain_left_ms + 999) / 1000);
	}
	ctl_reply__free_unpacked(r, NULL);
	fflush(stdout);
	/* Until the control socket is gone: meshd stopped. */
	while (wait && !status) {
		struct listing ls;
		uint32_t left;

		sleep(1);
		ctl_quiet = true;
		if (listing_fetch(path, CTL_OBJECT__CTL_OBJECT_NODE, false, &ls)) {
			if (!o->json)
				printf("meshd stopped\n");
			break;
		}
		left = ls.view.node ? ls.view.node->channels : 0;
		listing_free(&ls);
		if (!o->json)
			printf("%u channel%s left\n", left, left == 1 ? "" : "s");
		fflush(stdout);
	}
	return status;
}

/* `meshctl keygen`: a fresh cluster key (getrandom) in cluster.key_file's format; needs no meshd.
 * 0, or 2 when that fails (said). */
int cmd_keygen(struct out *o)
{
	char key[AUTH_KEY_B64_LEN + 1];
	int ret;

	ret = auth_keygen(key, sizeof(key));
	if (ret) {
		fprintf(stderr, "meshctl: keygen: %s\n", mesh_strerror(ret));
		return 2;
	}
	if (o->json) {
		json_open(o, NULL, '{');
		json_key(o, "key");
		json_str(key);
		json_close(o, '}');
		putchar('\n');
	} else {
		printf("%s\n", key);
	}
	explicit_bzero(key, sizeof(key));
	return 0;
}
