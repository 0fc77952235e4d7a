/*
 * What an operator asks of meshd over the control socket beyond looking: `meshctl drain` and
 * `meshctl reload` (root or meshd's own user only), and `meshctl ping`, whose probes the link
 * layer sends (link_ping.c) and whose results stream back to the client from here.
 */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "admin.h"
#include "admin_int.h"
#include "channel.h"
#include "log.h"
#include "util.h"

/* Only root or meshd's own user may change the node (reload, drain): 0, or the refusal sent. */
static int admin_privileged(struct admin *a, int slot, int fd, const char *what, bool *refused)
{
	CtlReply r = CTL_REPLY__INIT;
	uint32_t uid = a->client_uid[slot];
	char why[96];

	*refused = uid && uid != (uint32_t)geteuid();
	if (!*refused)
		return 0;
	if (admin_client_log_ok(a))
		log_warn("local client pid %d uid %u: %s refused: only root or uid %u may", a->client_pid[slot], uid, what,
			 (unsigned)geteuid());
	atomic_fetch_add(&a->errors, 1);
	snprintf(why, sizeof(why), "only root (or meshd's own user) may %s", what);
	r.status = -EPERM;
	r.error = why;
	return admin_send_reply(fd, &r);
}

/* `meshctl drain`: no new channels; meshd stops once none is left or at the deadline (main.c). The
 * reply's node says how many are left and how long until the deadline. */
int admin_drain(struct admin *a, int slot, int fd, const CtlRequest *req)
{
	CtlReply r = CTL_REPLY__INIT;
	NodeInfo node = NODE_INFO__INIT;
	struct numa_show numa;
	uint32_t ms = req->drain_ms ? req->drain_ms : MESH_DRAIN_DEFAULT_MS;
	struct mesh *m = a->mesh;
	bool refused;
	int ret = admin_privileged(a, slot, fd, "drain the node", &refused);

	if (refused)
		return ret;
	log_info("local client pid %d uid %u: drain: no new channels; stopping once none of %u is left, at the latest in "
		 "%u ms", a->client_pid[slot], a->client_uid[slot], m->chans->n_channels, ms);
	m->chans->draining = true;
	m->chans->drain_deadline_ms = util_now_ms() + ms;
	admin_fill_node_show(m, &node, &numa);
	admin_fill_ctl_counters(a, &node);
	r.node = &node;
	return admin_send_reply(fd, &r);
}

/* A reply of a ping's stream (CTL_OP_PING), named by the node as every reply is. */
static int admin_ping_send(struct admin *a, int fd, PingReply *p)
{
	CtlReply r = CTL_REPLY__INIT;
	NodeInfo node = NODE_INFO__INIT;

	node.id = a->mesh->self->id;
	node.cluster = (char *)a->mesh->cfg->cluster_name;
	r.node = &node;
	r.ping = p;
	return admin_send_reply(fd, &r);
}

/* ping_ops.report: one result to the client of fd, if it is still there. */
int admin_ping_report(void *ctx, int fd, const struct ping_result *res)
{
	struct admin *a = ctx;
	PingReply p = PING_REPLY__INIT;

	if (admin_slot_of(a, fd) < 0)
		return -ENOTCONN;
	p.done = res->done;
	if (!res->done) {
		p.rail = res->rail;
		p.seq = res->seq;
		p.status = res->status;
		p.rtt_us = res->rtt_us;
		p.error = (char *)ping_status_text(res->status);
	}
	return admin_ping_send(a, fd, &p);
}

/* `meshctl ping`: bounded for everyone (wire.c: count, interval, timeout; ping.h: pings at once),
 * and the interval of ping(8) for users other than root and meshd's. The first reply says what is
 * probed; the link layer reports the rest (admin_ping_report). */
int admin_ping(struct admin *a, int slot, int fd, const CtlRequest *req)
{
	uint32_t uid = a->client_uid[slot];
	struct ping_request rq = {
		.peer = req->node,
		.rail = req->has_rail ? (int)req->rail : -1,
		.count = req->count,
		.interval_ms = req->interval_ms ? req->interval_ms : MESH_PING_INTERVAL_DEFAULT_MS,
		.timeout_ms = req->timeout_ms ? req->timeout_ms : MESH_PING_TIMEOUT_DEFAULT_MS,
		.uid = uid,
		.privileged = !uid || uid == (uint32_t)geteuid(),
	};
	PingReply p = PING_REPLY__INIT;
	struct link *l = mesh_link_find(a->mesh, req->node);
	const char *why = NULL;
	char buf[128];
	uint32_t rails;
	int ret;

	if (!rq.privileged && rq.interval_ms < MESH_PING_INTERVAL_USER_MS) {
		snprintf(buf, sizeof(buf), "interval %u ms: below %u ms only root (or meshd's own user) may ping", rq.interval_ms,
			 MESH_PING_INTERVAL_USER_MS);
		return admin_reply_error(a, slot, fd, -EPERM, buf);
	}
	ret = ping_start(a->mesh, fd, &rq, &rails, &why);
	if (ret) {
		/* A fair question (a node DOWN, every ping taken): answered, not counted as a bad request. */
		CtlReply r = CTL_REPLY__INIT;

		r.status = ret;
		r.error = (char *)why;
		return admin_send_reply(fd, &r);
	}
	p.rails = rails;
	p.transport = (char *)link_transport(l);
	p.peer_addr = (char *)l->peer->addr;
	ret = admin_ping_send(a, fd, &p);
	if (ret) {
		ping_client_gone(a->mesh, fd);
		return ret;
	}
	ping_tick(a->mesh, util_now_ms()); /* its first round now */
	return 0;
}

/* `meshctl reload`: root's or meshd's own user's alone (a reload may close links and channels of
 * every user); the reply carries the node as it is afterwards, and why nothing changed if so. */
int admin_reload(struct admin *a, int slot, int fd)
{
	CtlReply r = CTL_REPLY__INIT;
	NodeInfo node = NODE_INFO__INIT;
	struct numa_show numa;
	char err[512] = "";
	uint32_t uid = a->client_uid[slot];
	bool refused;
	int ret = admin_privileged(a, slot, fd, "reload the configuration", &refused);

	if (refused)
		return ret;
	log_info("local client pid %d uid %u asks for a reload", a->client_pid[slot], uid);
	ret = a->reload ? a->reload(a->reload_ctx, "meshctl reload", err, sizeof(err)) : -EOPNOTSUPP;
	admin_fill_node_show(a->mesh, &node, &numa);
	admin_fill_ctl_counters(a, &node);
	r.node = &node;
	r.status = ret;
	r.error = ret ? (err[0] ? err : (char *)mesh_strerror(ret)) : (char *)"";
	return admin_send_reply(fd, &r);
}
