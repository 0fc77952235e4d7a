/*
 * Sessions, listeners and connects: everything that talks to meshd over its control socket.
 *
 * A session only names the socket. mesh_connect opens a control connection, sends CONNECT, waits for
 * the one reply (a setup and four descriptors, or a status) and closes the connection. mesh_listen
 * keeps its connection: after the LISTEN answer, every reply with a setup is an incoming channel.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "sockerr.h"
#include "wire.h"

MESH_EXPORT int mesh_open(const char *socket_path, mesh_session_t **out)
{
	const char *path = socket_path;
	mesh_session_t *s;

	if (!out)
		return -EINVAL;
	if (!path) {
		path = getenv(MESH_SOCKET_ENV);
		if (!path || !*path)
			path = MESH_SOCKET_DEFAULT;
	}
	if (!*path)
		return -EINVAL;
	if (strlen(path) >= sizeof(s->path))
		return -ENAMETOOLONG;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	memcpy(s->path, path, strlen(path) + 1);
	*out = s;
	return 0;
}

MESH_EXPORT void mesh_session_close(mesh_session_t *s)
{
	free(s);
}

MESH_EXPORT const char *mesh_session_error(const mesh_session_t *s)
{
	return s ? s->error : "";
}

/* A control connection for s; when meshd cannot be reached, the session's error says why in
 * words (mesh_sock_explain). The fd or a negative errno. */
static int session_ctl_open(mesh_session_t *s, const struct timespec *deadline)
{
	int fd = ctl_open(s->path, deadline);

	if (fd < 0)
		mesh_sock_explain(s->path, fd, s->error, sizeof(s->error));
	return fd;
}

/* A reply's status as a return value: 0 or negative. A positive status is not in the contract.
 * meshd's explanation of a failure is kept for mesh_session_error (s may be NULL). */
static int reply_status(mesh_session_t *s, const CtlReply *r)
{
	if (s && r->status < 0) {
		/* Shown to people: printable characters only, whatever meshd sent. */
		size_t i = 0;

		for (const char *p = r->error ? r->error : ""; *p && i + 1 < sizeof(s->error); p++)
			s->error[i++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
		s->error[i] = 0;
	}
	if (r->status <= 0)
		return r->status;
	lib_debug("control reply with positive status %d", r->status);
	return -EPROTO;
}

/* The node a reply names as meshd's own (meshd fills it in every reply), MESH_NODE_UNKNOWN when
 * absent, or -EPROTO when out of range. */
static int64_t reply_node(const CtlReply *r)
{
	if (!r->node)
		return MESH_NODE_UNKNOWN;
	if (r->node->id > MESH_NODE_ID_MAX) {
		lib_debug("control reply names node %u, above %u", r->node->id, MESH_NODE_ID_MAX);
		return -EPROTO;
	}
	return r->node->id;
}

/* The reply that carries a channel: status 0, a setup and exactly four descriptors. Consumes the
 * reply's descriptors whatever happens. */
static int reply_channel(mesh_session_t *s, const CtlReply *r, int *fds, int nfds, mesh_channel_t **out)
{
	int ret = reply_status(s, r);
	int64_t node = reply_node(r);

	if (!ret && (!r->setup || nfds != CTL_FDS_SETUP)) {
		lib_debug("channel reply with %s and %d descriptors (expected a setup and %d)",
			  r->setup ? "a setup" : "no setup", nfds, CTL_FDS_SETUP);
		ret = -EPROTO;
	}
	if (!ret && node < 0)
		ret = (int)node;
	if (ret) {
		ctl_fds_close(fds, nfds);
		return ret;
	}
	return chan_create(r->setup, (uint32_t)node, fds, out);
}

static int opts_check(const struct mesh_channel_opts *o)
{
	const uint32_t known = MESH_OPT_RING_SIZE | MESH_OPT_QPS | MESH_OPT_NUMA_NODE | MESH_OPT_TIMEOUT_MS |
			       MESH_OPT_RAIL | MESH_OPT_WAIT_LINK;

	if (!o)
		return 0;
	if (o->mask & ~known)
		return -EINVAL;
	if ((o->mask & MESH_OPT_RING_SIZE) && !mesh_ring_size_valid(o->ring_size))
		return -EINVAL;
	if ((o->mask & MESH_OPT_QPS) && (o->qps < 1 || o->qps > MESH_QPS_PER_LINK_MAX))
		return -EINVAL;
	if ((o->mask & MESH_OPT_NUMA_NODE) && o->numa_node < 0)
		return -EINVAL;
	if ((o->mask & MESH_OPT_TIMEOUT_MS) && !o->timeout_ms)
		return -EINVAL;
	if ((o->mask & MESH_OPT_RAIL) && o->rail >= MESH_RAILS_MAX)
		return -EINVAL;
	return 0;
}

/* A connect under way: its own control connection, and when it gives up. */
struct mesh_connecting {
	mesh_session_t *s; /* its error text goes there */
	int fd;
	struct timespec deadline;
	uint32_t node, timeout_ms; /* for the text of our own timeout */
	bool wait_link;
};

MESH_EXPORT int mesh_connect_start(mesh_session_t *s, uint32_t node, uint16_t port,
				   const struct mesh_channel_opts *opts, mesh_connecting_t **out)
{
	CtlRequest req = CTL_REQUEST__INIT;
	uint32_t timeout_ms = MESH_CONNECT_TIMEOUT_MS;
	mesh_connecting_t *p;
	int ret;

	if (!s || !out || node > MESH_NODE_ID_MAX)
		return -EINVAL;
	s->error[0] = 0;
	ret = opts_check(opts);
	if (ret)
		return ret;
	req.version = MESH_CTL_VERSION;
	req.op = CTL_OP__CTL_OP_CONNECT;
	req.node = node;
	req.port = port;
	{
		/* Where this thread runs: with several RDMA devices meshd picks the one on this node. */
		unsigned cpu, numa;

		if (!getcpu(&cpu, &numa)) {
			req.has_caller_node = 1;
			req.caller_node = numa;
		}
	}
	if (opts) {
		if (opts->mask & MESH_OPT_RING_SIZE)
			req.ring_size = opts->ring_size;
		if (opts->mask & MESH_OPT_QPS)
			req.qps = opts->qps;
		if (opts->mask & MESH_OPT_NUMA_NODE) {
			req.has_numa = 1;
			req.numa_node = opts->numa_node;
		}
		if (opts->mask & MESH_OPT_TIMEOUT_MS)
			timeout_ms = opts->timeout_ms;
		if (opts->mask & MESH_OPT_RAIL) {
			req.has_rail = 1;
			req.rail = opts->rail;
		}
	}
	/* meshd waits for the link as long as we wait for its answer (at most a day: wire.h). */
	if (opts && (opts->mask & MESH_OPT_WAIT_LINK))
		req.link_wait_ms = timeout_ms < MESH_CONNECT_WAIT_MAX_MS ? timeout_ms : MESH_CONNECT_WAIT_MAX_MS;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->s = s;
	p->node = node;
	p->timeout_ms = timeout_ms;
	p->wait_link = req.link_wait_ms != 0;
	ctl_deadline(&p->deadline, timeout_ms);
	/* A local unix socket: connecting and sending one datagram do not wait for the peer node. */
	p->fd = session_ctl_open(s, &p->deadline);
	if (p->fd < 0) {
		ret = p->fd;
		free(p);
		return ret;
	}
	ret = ctl_send(p->fd, &req);
	if (ret) {
		close(p->fd);
		free(p);
		return ret;
	}
	*out = p;
	return 0;
}

MESH_EXPORT int mesh_connect_fd(const mesh_connecting_t *p)
{
	return p ? p->fd : -EINVAL;
}

MESH_EXPORT void mesh_connect_cancel(mesh_connecting_t *p)
{
	if (!p)
		return;
	close(p->fd); /* meshd sees it close: the channel that may still come is closed there */
	free(p);
}

/* Our own deadline passed without meshd's answer: -ETIMEDOUT, and words for it (meshd's answer at
 * the end of a link wait names the link, but ours may come first). */
static int connect_timed_out(mesh_connecting_t *p)
{
	snprintf(p->s->error, sizeof(p->s->error), "no answer within %u ms: node %u did not accept%s", p->timeout_ms,
		 p->node, p->wait_link ? ", or its link did not come UP (meshctl links says which)" : "");
	return -ETIMEDOUT;
}

MESH_EXPORT int mesh_connect_finish(mesh_connecting_t *p, mesh_channel_t **out)
{
	struct timespec now;
	int fds[CTL_FDS_MAX], nfds, ret;
	CtlReply *r;

	if (!p || !out)
		return -EINVAL;
	ret = ctl_recv(p->fd, &r, fds, &nfds);
	if (ret == -EAGAIN) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec < p->deadline.tv_sec ||
		    (now.tv_sec == p->deadline.tv_sec && now.tv_nsec < p->deadline.tv_nsec))
			return -EAGAIN;
		ret = connect_timed_out(p);
	}
	if (!ret) {
		ret = reply_channel(p->s, r, fds, nfds, out);
		ctl_reply__free_unpacked(r, NULL);
	}
	mesh_connect_cancel(p);
	return ret;
}

MESH_EXPORT int mesh_connect(mesh_session_t *s, uint32_t node, uint16_t port, const struct mesh_channel_opts *opts,
			     mesh_channel_t **out)
{
	mesh_connecting_t *p;
	int ret;

	if (!out)
		return -EINVAL;
	ret = mesh_connect_start(s, node, port, opts, &p);
	if (ret)
		return ret;
	/* One reply, once the peer accepted or refused. A signal does not abort the wait: the
	 * channel would be half made. */
	do {
		ret = ctl_wait(p->fd, &p->deadline, true);
		if (ret == -ETIMEDOUT)
			ret = connect_timed_out(p);
		if (ret && ret != -EAGAIN) {
			mesh_connect_cancel(p);
			return ret;
		}
		ret = mesh_connect_finish(p, out);
	} while (ret == -EAGAIN);
	return ret;
}

MESH_EXPORT int mesh_listen(mesh_session_t *s, uint16_t port, mesh_listener_t **out)
{
	CtlRequest req = CTL_REQUEST__INIT;
	int fds[CTL_FDS_MAX], nfds, fd, ret;
	struct timespec deadline;
	mesh_listener_t *l;
	CtlReply *r;

	if (!s || !out)
		return -EINVAL;
	s->error[0] = 0;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	req.version = MESH_CTL_VERSION;
	req.op = CTL_OP__CTL_OP_LISTEN;
	req.port = port;
	/* meshd answers LISTEN at once: the connect timeout bounds a stuck daemon. */
	ctl_deadline(&deadline, MESH_CONNECT_TIMEOUT_MS);
	fd = ctl_request(session_ctl_open(s, &deadline), &req, &deadline, &r, fds, &nfds);
	if (fd < 0) {
		ret = fd;
		goto err_free;
	}
	ret = reply_status(s, r);
	if (!ret && (r->setup || nfds)) {
		lib_debug("LISTEN answer carries %s and %d descriptors", r->setup ? "a setup" : "no setup", nfds);
		ret = -EPROTO; /* LISTEN's answer carries no channel */
	}
	if (!ret) {
		int64_t node = reply_node(r);

		if (node < 0)
			ret = (int)node;
		else
			l->node = (uint32_t)node;
	}
	ctl_fds_close(fds, nfds);
	ctl_reply__free_unpacked(r, NULL);
	if (ret)
		goto err_close;
	l->fd = fd;
	l->port = port;
	*out = l;
	return 0;

err_close:
	close(fd);
err_free:
	free(l);
	return ret;
}

MESH_EXPORT int mesh_accept(mesh_listener_t *l, int flags, mesh_channel_t **out)
{
	int fds[CTL_FDS_MAX], nfds, ret;
	CtlReply *r;

	if (!l || !out || (flags & ~MESH_NONBLOCK))
		return -EINVAL;
	for (;;) {
		ret = ctl_recv(l->fd, &r, fds, &nfds);
		if (ret != -EAGAIN)
			break;
		if (flags & MESH_NONBLOCK)
			return -EAGAIN;
		ret = ctl_wait(l->fd, NULL, false);
		if (ret)
			return ret; /* -EINTR when a signal came, like accept(2) */
	}
	if (ret)
		return ret;
	ret = reply_channel(NULL, r, fds, nfds, out);
	ctl_reply__free_unpacked(r, NULL);
	return ret;
}

MESH_EXPORT int mesh_listener_fd(const mesh_listener_t *l)
{
	return l ? l->fd : -EINVAL;
}

MESH_EXPORT int mesh_listener_info(const mesh_listener_t *l, struct mesh_listener_info *info)
{
	if (!l || !info)
		return -EINVAL;
	memset(info, 0, sizeof(*info));
	info->node = l->node;
	info->port = l->port;
	return 0;
}

MESH_EXPORT void mesh_listener_close(mesh_listener_t *l)
{
	if (!l)
		return;
	close(l->fd);
	free(l);
}

/* One SHOW request on a fresh control connection; *out is the reply (free it). */
static int ctl_show(mesh_session_t *s, CtlObject object, uint64_t offset, CtlReply **out)
{
	CtlRequest req = CTL_REQUEST__INIT;
	int fds[CTL_FDS_MAX], nfds, fd, ret;
	struct timespec deadline;
	CtlReply *r;

	req.version = MESH_CTL_VERSION;
	req.op = CTL_OP__CTL_OP_SHOW;
	req.object = object;
	req.offset = offset;
	ctl_deadline(&deadline, MESH_CONNECT_TIMEOUT_MS);
	fd = ctl_request(session_ctl_open(s, &deadline), &req, &deadline, &r, fds, &nfds);
	if (fd < 0)
		return fd;
	close(fd);
	ctl_fds_close(fds, nfds); /* a SHOW answer carries none */
	ret = reply_status(s, r);
	if (ret)
		ctl_reply__free_unpacked(r, NULL);
	else
		*out = r;
	return ret;
}

static void node_addr_set(struct mesh_node_addr *e, uint32_t node, uint32_t flags, const char *addr)
{
	size_t n = addr ? strnlen(addr, sizeof(e->addr) - 1) : 0;

	memset(e, 0, sizeof(*e));
	e->node = node;
	e->flags = flags;
	if (n)
		memcpy(e->addr, addr, n);
}

MESH_EXPORT int mesh_node_table(mesh_session_t *s, struct mesh_node_addr *nodes, size_t max)
{
	CtlReply *r;
	size_t count = 0, links = 0, total;
	int ret;

	if (!s || (!nodes && max))
		return -EINVAL;
	s->error[0] = 0;
	/* The LINKS answer carries this node's NodeInfo too, as every answer does; meshd pages it
	 * (CtlReply.total): ask again from where the last page ended. */
	do {
		ret = ctl_show(s, CTL_OBJECT__CTL_OBJECT_LINKS, links, &r);
		if (ret)
			return ret;
		/* A meshd before paging says no total: its one answer has every link. */
		total = r->total || links ? r->total : r->n_links;
		if (!r->node || r->node->id > MESH_NODE_ID_MAX || total > MESH_NODE_ID_MAX ||
		    links + r->n_links > total || (links < total && !r->n_links)) {
			lib_debug("node table: the LINKS answer names no node, or links %zu + %zu of %zu", links,
				  r->n_links, total);
			ret = -EPROTO;
			goto out_free;
		}
		if (!links) {
			if (count < max)
				node_addr_set(&nodes[count], r->node->id, MESH_NODE_SELF, r->node->addr);
			count++;
		}
		for (size_t i = 0; i < r->n_links; i++) {
			const LinkInfo *l = r->links[i];

			if (l->peer > MESH_NODE_ID_MAX) {
				lib_debug("node table: link to node %u, above %u", l->peer, MESH_NODE_ID_MAX);
				ret = -EPROTO;
				goto out_free;
			}
			if (count < max)
				node_addr_set(&nodes[count], l->peer, 0, l->peer_addr);
			count++;
		}
		links += r->n_links;
		ctl_reply__free_unpacked(r, NULL);
	} while (links < total);
	return (int)count;
out_free:
	ctl_reply__free_unpacked(r, NULL);
	return ret;
}
