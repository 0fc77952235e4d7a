/*
 * The tcp provider: the semantics of the rdma provider over TCP sockets, for clusters, hosts and
 * test machines without RDMA (what libfabric's tcp provider and UCX's tcp transport are).
 *
 * One TCP connection per "QP". The connect handshake carries the same private data as rdma_cm
 * (CONNECT, then ACCEPT or REJECT frames). One-sided operations are emulated by the receiving
 * side against its registered regions: WRITE looks the region up by rkey, checks access and
 * bounds, then copies; READ_REQ is answered with READ_RESP; WRITE_IMM and SEND consume a posted
 * receive and raise its completion. An unknown key, a missing access right or an out-of-range
 * access is a protocol error: the connection is closed with a logged reason and nothing is written.
 *
 * Like an RC QP with rnr_retry 7, a SEND or WRITE_IMM that finds no posted receive waits: the
 * provider stops reading that socket (TCP pushes back on the sender) until a receive is posted.
 * As on RC, a SEND or WRITE completes successfully only once the peer applied it: the receiver
 * acknowledges applied frames (one ACK per batch of input, and before any READ response, so
 * completions keep the order of the send queue). When a connection fails, whatever was posted
 * and not completed is flushed with an error completion, then DISCONNECTED is raised.
 *
 * Events are queued and an eventfd in the provider's epoll set says the queue is not empty, so the
 * owner's epoll wakes for events raised outside poll() too.
 *
 * tcp.c has the ops, listening, accepting and dialling; tcp_conn.c a connection's plumbing.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include "log.h"
#include "tcp_internal.h"
#include "tcp_wire.h"
#include "transport.h"
#include "util.h"

/* epoll tags: the listening socket, the eventfd and the timer are told apart from connections. */
static char tag_listen, tag_evfd, tag_timer;

static int tcp_addr_parse(const char *addr, uint16_t port, struct sockaddr_storage *ss, socklen_t *sl)
{
	struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV, .ai_family = AF_UNSPEC};
	struct addrinfo *res;
	char ps[8];

	snprintf(ps, sizeof(ps), "%u", port);
	if (getaddrinfo(addr, ps, &hints, &res))
		return -EINVAL;
	memset(ss, 0, sizeof(*ss));
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*sl = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

/* ---- ops ---- */

static void tcp_conn_free(struct tcp_conn *c)
{
	free(c->in);
	free(c->recvs);
	free(c);
}

static void tcp_conn_destroy(xport_conn_t *xc)
{
	struct tcp_conn *c = to_tc(xc);
	struct tcp_xport *tx;
	size_t w = 0;

	if (!c)
		return;
	tx = c->tx;
	/* Best effort: a REJECT or DISCONNECT still queued gets its chance to leave. */
	if (c->fd >= 0 && c->out_head)
		tcp_conn_flush(c);
	tcp_conn_close_fd(c);
	/* No event may name this connection once it is gone. */
	for (size_t i = 0; i < tx->q_len; i++) {
		struct xport_event *ev = &tx->q[(tx->q_head + i) % tx->q_cap];

		if (ev->conn != xc)
			tx->q[(tx->q_head + w++) % tx->q_cap] = *ev;
	}
	tx->q_len = w;
	while (c->out_head) {
		struct tcp_out *o = c->out_head;

		c->out_head = o->next;
		free(o);
	}
	while (c->reads) {
		struct tcp_read *r = c->reads;

		c->reads = r->next;
		free(r);
	}
	while (c->unacked_head) {
		struct tcp_unacked *u = c->unacked_head;

		c->unacked_head = u->next;
		free(u);
	}
	tcp_conn_unlink(c);
	tcp_conn_free(c);
	tcp_timer_update(tx);
}

/* Frees the connections that ended before their CONNECT (tcp_conn_fail): nothing was queued or
 * posted on them, and no event names them. */
static void tcp_reap(struct tcp_xport *tx)
{
	while (tx->dead) {
		struct tcp_conn *c = tx->dead;

		tx->dead = c->next;
		tcp_conn_free(c);
	}
}

static void tcp_destroy(xport_t *x)
{
	struct tcp_xport *tx = to_tx(x);

	while (tx->conns)
		tcp_conn_destroy(&tx->conns->base);
	tcp_reap(tx);
	while (tx->mrs) {
		struct tcp_mr *m = tx->mrs;

		tx->mrs = m->next;
		free(m);
	}
	if (tx->lfd >= 0)
		close(tx->lfd);
	close(tx->tfd);
	close(tx->evfd);
	close(tx->epfd);
	free(tx->q);
	free(tx->node_addrs);
	free(tx);
}

/* The other nodes' addresses, kept as 16 bytes each: compared with every newcomer's. At create,
 * and again at a reload (connections accepted before keep what they were judged). */
static int tcp_set_node_addrs(xport_t *x, const char *const *addrs, uint32_t n)
{
	struct tcp_xport *tx = to_tx(x);
	uint8_t(*a)[16] = n ? calloc(n, sizeof(*a)) : NULL;
	uint32_t k = 0;

	if (n && !a)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		if (util_addr_bytes(addrs[i], a[k])) {
			log_warn("tcp: node address %s is not numeric: it gets no room among strangers", addrs[i]);
			continue;
		}
		k++;
	}
	free(tx->node_addrs);
	tx->node_addrs = a;
	tx->n_node_addrs = k;
	return 0;
}

static int tcp_create(const struct xport_attr *attr, xport_t **out)
{
	struct tcp_xport *tx = calloc(1, sizeof(*tx));
	struct epoll_event ee = {.events = EPOLLIN};
	int ret;

	if (!tx)
		return -ENOMEM;
	tx->base.ops = &xport_tcp_ops;
	tx->attr = *attr;
	tx->attr.node_addrs = NULL; /* the caller's; ours are in tx->node_addrs */
	tx->attr.n_node_addrs = 0;
	ret = tcp_set_node_addrs(&tx->base, attr->node_addrs, attr->n_node_addrs);
	if (ret)
		goto err_free;
	tx->pending_log.burst = 10;
	tx->pending_log.interval_ms = 10000;
	tx->proto_log.burst = 20;
	tx->proto_log.interval_ms = 10000;
	tx->lfd = tx->evfd = tx->tfd = -1;
	tx->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (tx->epfd < 0) {
		ret = -errno;
		log_error("epoll_create1: %m");
		goto err_free_addrs;
	}
	tx->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (tx->evfd < 0) {
		ret = -errno;
		log_error("eventfd: %m");
		goto err_close_epfd;
	}
	tx->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (tx->tfd < 0) {
		ret = -errno;
		log_error("timerfd_create: %m");
		goto err_close_evfd;
	}
	ee.data.ptr = &tag_evfd;
	if (epoll_ctl(tx->epfd, EPOLL_CTL_ADD, tx->evfd, &ee)) {
		ret = -errno;
		goto err_close_tfd;
	}
	ee.data.ptr = &tag_timer;
	if (epoll_ctl(tx->epfd, EPOLL_CTL_ADD, tx->tfd, &ee)) {
		ret = -errno;
		goto err_close_tfd;
	}
	*out = &tx->base;
	return 0;
err_close_tfd:
	close(tx->tfd);
err_close_evfd:
	close(tx->evfd);
err_close_epfd:
	close(tx->epfd);
err_free_addrs:
	free(tx->node_addrs);
err_free:
	free(tx);
	return ret;
}

static int tcp_event_fd(xport_t *x)
{
	return to_tx(x)->epfd;
}

static int tcp_listen_on(xport_t *x, const char *addr, uint16_t port)
{
	struct tcp_xport *tx = to_tx(x);
	struct sockaddr_storage ss;
	struct epoll_event ee = {.events = EPOLLIN, .data.ptr = &tag_listen};
	socklen_t sl;
	int fd, one = 1, ret;

	if (tx->lfd >= 0)
		return -EBUSY;
	ret = tcp_addr_parse(addr, port, &ss, &sl);
	if (ret) {
		log_error("listen address %s is not numeric", addr);
		return ret;
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		ret = -errno;
		log_error("socket: %m");
		return ret;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	/* Not logged: the caller names the node and what to do about it (meshd's check_listen_why). */
	if (bind(fd, (struct sockaddr *)&ss, sl) || listen(fd, TCP_LISTEN_BACKLOG)) {
		ret = -errno;
		close(fd);
		return ret;
	}
	if (epoll_ctl(tx->epfd, EPOLL_CTL_ADD, fd, &ee)) {
		ret = -errno;
		close(fd);
		return ret;
	}
	tx->lfd = fd;
	util_strlcpy(tx->listen_addr, addr, sizeof(tx->listen_addr));
	return 0;
}

/* The numeric host of ss into host; returns its port. */
static uint16_t peer_host(const struct sockaddr_storage *ss, char *host, size_t len)
{
	snprintf(host, len, "?");
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)ss;

		inet_ntop(AF_INET, &s->sin_addr, host, (socklen_t)len);
		return ntohs(s->sin_port);
	}
	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)ss;

		inet_ntop(AF_INET6, &s->sin6_addr, host, (socklen_t)len);
		return ntohs(s->sin6_port);
	}
	return 0;
}

static void peer_str(const struct sockaddr_storage *ss, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN];
	uint16_t port = peer_host(ss, host, sizeof(host));

	snprintf(buf, len, "%s:%u", host, port);
}

/* Whether ss is one of the other nodes' addresses (attr.node_addrs). */
static bool tcp_from_node(const struct tcp_xport *tx, const struct sockaddr_storage *ss)
{
	uint8_t a[16] = {0};

	if (ss->ss_family == AF_INET) {
		a[10] = a[11] = 0xff; /* IPv4-mapped, as util_addr_bytes */
		memcpy(a + 12, &((const struct sockaddr_in *)ss)->sin_addr, 4);
	} else if (ss->ss_family == AF_INET6) {
		memcpy(a, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
	} else {
		return false;
	}
	for (uint32_t i = 0; i < tx->n_node_addrs; i++)
		if (!memcmp(a, tx->node_addrs[i], 16))
			return true;
	return false;
}

/* Whether a new connection from ss (from a node's address: node) must be closed at once: its
 * address holds TCP_PENDING_PER_SOURCE connections that have not sent their CONNECT yet, or
 * TCP_PENDING_MAX do in all. Strangers holding the cap (for connect_timeout_ms, re-opened as they
 * are dropped, at no cost to them) would keep a real node out: a node's newcomer closes the oldest
 * stranger's connection instead and comes in. Says so, rate-limited. */
static bool tcp_too_many_pending(struct tcp_xport *tx, const struct sockaddr_storage *ss, bool node)
{
	char src[INET6_ADDRSTRLEN];
	uint32_t total = 0, same = 0;
	struct tcp_conn *oldest = NULL;
	uint64_t dropped;

	peer_host(ss, src, sizeof(src));
	for (struct tcp_conn *c = tx->conns; c; c = c->next)
		if (c->state == TC_WAIT_REQUEST) {
			total++;
			same += util_addr_same_host(c->base.peer_addr, src);
			if (!c->from_node && (!oldest || c->deadline_ms < oldest->deadline_ms))
				oldest = c;
		}
	if (same < TCP_PENDING_PER_SOURCE && total < TCP_PENDING_MAX)
		return false;
	if (same < TCP_PENDING_PER_SOURCE && node && oldest) {
		tx->pending_evicted++;
		if (log_ratelimit_ok(&tx->pending_log, util_now_ms(), &dropped))
			log_warn("tcp %s: %u connections have not said who they are yet, at most %u: closing the "
				 "oldest, %s's, for one from %s, a node's address; %llu closed so far",
				 tx->listen_addr, total, TCP_PENDING_MAX, oldest->base.peer_addr, src,
				 (unsigned long long)tx->pending_evicted);
		tcp_conn_fail(oldest, XPORT_EV_CONNECT_ERROR, -ECONNABORTED, "its place went to a node");
		return false;
	}
	tx->pending_refused++;
	if (log_ratelimit_ok(&tx->pending_log, util_now_ms(), &dropped))
		log_warn("tcp %s: closing the connection of %s at once: %u connections (%u from that address) have "
			 "not said who they are yet, at most %u (%u per address); %llu closed so far",
			 tx->listen_addr, src, total, same, TCP_PENDING_MAX, TCP_PENDING_PER_SOURCE,
			 (unsigned long long)tx->pending_refused);
	return true;
}

static void tcp_accept_all(struct tcp_xport *tx)
{
	for (;;) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		struct tcp_conn *c;
		bool node;
		int fd = accept4(tx->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				/* The pending connection stays queued (the kernel's backlog bounds them); we
				 * look again when descriptors may have been freed. */
				if (!(tx->accept_pauses++ % 100))
					log_warn("tcp accept on %s: %m; not accepting for %d ms (%llu times so far)",
						 tx->listen_addr, TCP_ACCEPT_PAUSE_MS, (unsigned long long)tx->accept_pauses);
				epoll_ctl(tx->epfd, EPOLL_CTL_DEL, tx->lfd, NULL);
				tx->accept_paused_until = util_now_ms() + TCP_ACCEPT_PAUSE_MS;
				tcp_timer_update(tx);
			} else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
				log_warn("tcp accept: %m");
			}
			return;
		}
		node = tcp_from_node(tx, &ss);
		if (tcp_too_many_pending(tx, &ss, node)) {
			close(fd);
			continue;
		}
		c = tcp_conn_new(tx, fd);
		if (!c) {
			close(fd);
			continue;
		}
		c->from_node = node;
		peer_str(&ss, c->base.peer_addr, sizeof(c->base.peer_addr));
		c->state = TC_WAIT_REQUEST;
		/* A client that connects and never says who it is is dropped after the timeout. */
		c->deadline_ms = util_now_ms() + tx->attr.connect_timeout_ms;
		tcp_conn_watch(c);
		tcp_timer_update(tx);
	}
}

static int tcp_connect_to(xport_t *x, const char *src, const char *addr, uint16_t port, const void *pdata,
			  size_t len, void *ctx, uint32_t index, xport_conn_t **out)
{
	struct tcp_xport *tx = to_tx(x);
	struct sockaddr_storage dst, srcs;
	socklen_t dl, sl;
	struct tcp_conn *c;
	int fd, ret;

	if (len > XPORT_CONNECT_PDATA_MAX)
		return -EMSGSIZE;
	ret = tcp_addr_parse(addr, port, &dst, &dl);
	if (ret)
		return ret;
	fd = socket(dst.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (src) {
		ret = tcp_addr_parse(src, 0, &srcs, &sl);
		if (!ret && bind(fd, (struct sockaddr *)&srcs, sl))
			ret = -errno;
		if (ret) {
			log_warn("tcp bind to source %s: %s", src, strerror(-ret));
			close(fd);
			return ret;
		}
	}
	c = tcp_conn_new(tx, fd);
	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	c->base.ctx = ctx;
	c->base.scope = ctx;
	c->base.index = index;
	snprintf(c->base.peer_addr, sizeof(c->base.peer_addr), "%s:%u", addr, port);
	memcpy(c->pdata, pdata, len);
	c->pdata_len = (uint8_t)len;
	c->state = TC_CONNECTING;
	c->deadline_ms = util_now_ms() + tx->attr.connect_timeout_ms;
	if (connect(fd, (struct sockaddr *)&dst, dl) && errno != EINPROGRESS) {
		/* Reported like rdma_cm reports an unreachable peer: as an event, not a return. */
		tcp_conn_fail(c, XPORT_EV_CONNECT_ERROR, -errno, "tcp connect failed");
	}
	tcp_conn_watch(c);
	tcp_timer_update(tx);
	*out = &c->base;
	return 0;
}

static int tcp_accept_conn(xport_conn_t *xc, const void *pdata, size_t len)
{
	struct tcp_conn *c = to_tc(xc);
	struct tcp_frame f = {.type = TCP_F_ACCEPT, .payload_len = (uint32_t)len};
	int ret;

	if (len > XPORT_PDATA_MAX)
		return -EMSGSIZE;
	if (c->state != TC_REQUESTED)
		return -EINVAL;
	c->state = TC_ESTABLISHED;
	ret = tcp_queue(c, &f, pdata, 0, 0);
	if (ret)
		return ret;
	tcp_conn_flush(c);
	/* rdma_cm tells the passive side too once the connection is up. */
	tcp_ev_push(c->tx, XPORT_EV_ESTABLISHED, c);
	/* Frames that arrived behind the CONNECT are handled now. */
	if (c->in_len) {
		c->kicked = true;
		tcp_wake(c->tx);
	}
	return 0;
}

static int tcp_reject_conn(xport_conn_t *xc, const void *pdata, size_t len)
{
	struct tcp_conn *c = to_tc(xc);
	struct tcp_frame f = {.type = TCP_F_REJECT, .payload_len = (uint32_t)MIN(len, XPORT_CONNECT_PDATA_MAX)};
	int ret;

	if (c->state != TC_REQUESTED)
		return -EINVAL;
	ret = tcp_queue(c, &f, pdata, 0, 0);
	if (!ret)
		tcp_conn_flush(c);
	c->state = TC_CLOSED;
	return ret;
}

static int tcp_disconnect_conn(xport_conn_t *xc)
{
	struct tcp_conn *c = to_tc(xc);
	struct tcp_frame f = {.type = TCP_F_DISCONNECT};

	if (c->state == TC_CLOSED)
		return 0;
	if (c->state == TC_ESTABLISHED && !tcp_queue(c, &f, NULL, 0, 0))
		tcp_conn_flush(c);
	if (c->fd >= 0)
		shutdown(c->fd, SHUT_WR);
	tcp_conn_fail(c, XPORT_EV_DISCONNECTED, -ECONNRESET, "disconnected");
	return 0;
}

static int tcp_mr_register(xport_conn_t *xc, void *addr, size_t len, unsigned access, xport_mr_t **out)
{
	struct tcp_xport *tx = to_tc(xc)->tx;
	struct tcp_mr *m = calloc(1, sizeof(*m));
	uint32_t key;

	if (!m)
		return -ENOMEM;
	/* Keys from getrandom: a peer cannot predict the next one from those it was given (nor does a
	 * stale key of an earlier attempt name a live region). */
	do {
		int ret = util_random(&key, sizeof(key));

		if (ret) {
			free(m);
			return ret;
		}
	} while (!key || tcp_mr_find(tx, key));
	m->base.xport = &tx->base;
	m->base.addr = addr;
	m->base.len = len;
	m->base.lkey = key;
	m->base.rkey = key;
	m->access = access;
	m->scope = xc->scope;
	m->next = tx->mrs;
	tx->mrs = m;
	*out = &m->base;
	return 0;
}

static void tcp_mr_deregister(xport_mr_t *xm)
{
	struct tcp_mr *m = (struct tcp_mr *)xm;
	struct tcp_xport *tx;
	struct tcp_mr **pp;

	if (!m)
		return;
	tx = to_tx(m->base.xport);
	for (pp = &tx->mrs; *pp; pp = &(*pp)->next) {
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	}
	free(m);
}

/* The local buffer of a post must lie in the registration it names, of the connection's scope, as
 * verbs' lkey check. */
static int tcp_check_local(const struct tcp_conn *c, const xport_mr_t *mr, const void *buf, uint32_t len)
{
	uintptr_t b = (uintptr_t)buf, base;

	if (!mr || ((const struct tcp_mr *)mr)->scope != c->base.scope)
		return -EINVAL;
	base = (uintptr_t)mr->addr;
	if (b < base || b - base > mr->len || len > mr->len - (b - base))
		return -EFAULT;
	return 0;
}

static int tcp_post(xport_conn_t *xc, xport_mr_t *mr, uint8_t type, const void *buf, uint32_t len, uint64_t raddr,
		    uint32_t rkey, uint32_t arg, enum xport_op op, uint64_t wr_id)
{
	struct tcp_conn *c = to_tc(xc);
	struct tcp_frame f = {.type = type, .payload_len = len, .raddr = raddr, .rkey = rkey, .arg = arg};
	int ret;

	if (c->state != TC_ESTABLISHED)
		return -ENOTCONN;
	if (tcp_check_local(c, mr, buf, len))
		return -EFAULT;
	if (len > TCP_FRAME_PAYLOAD_MAX)
		return -EMSGSIZE;
	if (c->sq_wrs >= c->tx->attr.max_send_wr)
		return -ENOMEM; /* like a full send queue */
	ret = tcp_queue(c, &f, buf, op, wr_id);
	if (ret)
		return ret;
	c->sq_wrs++;
	tcp_conn_flush(c);
	return 0;
}

static int tcp_post_send(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len, uint64_t wr_id)
{
	return tcp_post(c, mr, TCP_F_SEND, buf, len, 0, 0, 0, XPORT_OP_SEND, wr_id);
}

static int tcp_post_write(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len, uint64_t raddr,
			  uint32_t rkey, uint64_t wr_id)
{
	return tcp_post(c, mr, TCP_F_WRITE, buf, len, raddr, rkey, 0, XPORT_OP_WRITE, wr_id);
}

static int tcp_post_write_imm(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len, uint64_t raddr,
			      uint32_t rkey, uint32_t imm, uint64_t wr_id)
{
	/* The requester's completion says WRITE, as verbs' IBV_WC_RDMA_WRITE does for both. */
	return tcp_post(c, mr, TCP_F_WRITE_IMM, buf, len, raddr, rkey, imm, XPORT_OP_WRITE, wr_id);
}

static int tcp_post_read(xport_conn_t *xc, xport_mr_t *mr, void *buf, uint32_t len, uint64_t raddr, uint32_t rkey,
			 uint64_t wr_id)
{
	struct tcp_conn *c = to_tc(xc);
	struct tcp_frame f = {.type = TCP_F_READ_REQ, .raddr = raddr, .rkey = rkey, .arg = len};
	struct tcp_read *rd;
	int ret;

	if (c->state != TC_ESTABLISHED)
		return -ENOTCONN;
	if (tcp_check_local(c, mr, buf, len))
		return -EFAULT;
	if (len > TCP_FRAME_PAYLOAD_MAX)
		return -EMSGSIZE;
	if (c->sq_wrs >= c->tx->attr.max_send_wr)
		return -ENOMEM;
	rd = calloc(1, sizeof(*rd));
	if (!rd)
		return -ENOMEM;
	rd->id = f.id = ++c->next_read_id;
	rd->buf = buf;
	rd->len = len;
	rd->wr_id = wr_id;
	ret = tcp_queue(c, &f, NULL, 0, 0);
	if (ret) {
		free(rd);
		return ret;
	}
	rd->next = c->reads;
	c->reads = rd;
	c->sq_wrs++;
	tcp_conn_flush(c);
	return 0;
}

static int tcp_post_recv(xport_conn_t *xc, xport_mr_t *mr, void *buf, uint32_t len, uint64_t wr_id)
{
	struct tcp_conn *c = to_tc(xc);
	struct tcp_recv *r;

	if (c->state == TC_CLOSED)
		return -ENOTCONN;
	if (len && tcp_check_local(c, mr, buf, len))
		return -EFAULT;
	if (c->recv_count == c->recv_cap)
		return -ENOMEM;
	r = &c->recvs[(c->recv_head + c->recv_count) % c->recv_cap];
	r->buf = buf;
	r->len = len;
	r->wr_id = wr_id;
	c->recv_count++;
	if (c->in_blocked) {
		/* The waiting SEND can land now: handle it in the next poll, not inside this call. */
		c->in_blocked = false;
		c->kicked = true;
		tcp_wake(c->tx);
	}
	return 0;
}

static void tcp_check_deadlines(struct tcp_xport *tx)
{
	uint64_t now = util_now_ms();

	if (tx->accept_paused_until && now >= tx->accept_paused_until) {
		struct epoll_event ee = {.events = EPOLLIN, .data.ptr = &tag_listen};

		tx->accept_paused_until = 0;
		if (epoll_ctl(tx->epfd, EPOLL_CTL_ADD, tx->lfd, &ee))
			log_error("tcp listener on %s: cannot watch it again: %m", tx->listen_addr);
	}

	for (struct tcp_conn *c = tx->conns, *next; c; c = next) {
		next = c->next; /* failing c may take it off the list */
		if (!c->deadline_ms || now < c->deadline_ms)
			continue;
		c->deadline_ms = 0;
		tcp_conn_fail(c, XPORT_EV_CONNECT_ERROR, -ETIMEDOUT,
			      c->state == TC_WAIT_REQUEST ? "no CONNECT in time" : "tcp connect timed out");
	}
	tcp_timer_update(tx);
}

static int tcp_device(xport_t *x, char *name, size_t len)
{
	struct tcp_xport *tx = to_tx(x);

	if (tx->lfd < 0)
		return -ENODEV;
	return util_addr_ifname(tx->listen_addr, name, len);
}

static int tcp_poll(xport_t *x, struct xport_event *evs, int max)
{
	struct tcp_xport *tx = to_tx(x);
	struct epoll_event ee[32];
	int n, out = 0;

	/* Readiness is turned into queued events only while the queue is short: bounded memory. */
	if (tx->q_len < (size_t)max) {
		for (struct tcp_conn *c = tx->conns, *next; c; c = next) {
			next = c->next; /* failing c may take it off the list */
			if (c->kicked) {
				c->kicked = false;
				tcp_conn_process(c);
				if (!c->in_blocked && c->state != TC_CLOSED)
					tcp_conn_readable(c);
			}
		}
		n = epoll_wait(tx->epfd, ee, (int)ARRAY_SIZE(ee), 0);
		for (int i = 0; i < n; i++) {
			void *p = ee[i].data.ptr;

			if (p == &tag_listen) {
				tcp_accept_all(tx);
			} else if (p == &tag_evfd) {
				uint64_t v;

				if (read(tx->evfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
					log_warn("eventfd read: %m");
			} else if (p == &tag_timer) {
				uint64_t v;

				if (read(tx->tfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
					log_warn("timerfd read: %m");
				tcp_check_deadlines(tx);
			} else {
				struct tcp_conn *c = p;

				if (ee[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
					tcp_conn_writable(c);
				if ((ee[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) && c->state != TC_CLOSED &&
				    c->state != TC_CONNECTING)
					tcp_conn_readable(c);
			}
		}
	}
	while (out < max && tx->q_len) {
		evs[out++] = tx->q[tx->q_head];
		tx->q_head = (tx->q_head + 1) % tx->q_cap;
		tx->q_len--;
	}
	/* Events left over keep the eventfd readable so the owner comes back. */
	if (tx->q_len)
		tcp_wake(tx);
	tcp_reap(tx);
	return out;
}

/* Any address this machine has: TCP serves it. */
static int tcp_probe(const char *addr)
{
	struct sockaddr_storage ss;
	socklen_t sl;

	return tcp_addr_parse(addr, 0, &ss, &sl) ? 0 : 1;
}

/* The two addresses of an established connection: an application's own connection between them
 * (proto/ring.h MESH_AQ_PATH_TCP) goes the way this one goes. */
static int tcp_path(xport_conn_t *xc, struct xport_path *out)
{
	struct tcp_conn *c = to_tc(xc);
	struct sockaddr_storage l, r;
	socklen_t ll = sizeof(l), rl = sizeof(r);

	if (c->state != TC_ESTABLISHED || c->fd < 0)
		return -ENOTCONN;
	if (getsockname(c->fd, (struct sockaddr *)&l, &ll) || getpeername(c->fd, (struct sockaddr *)&r, &rl))
		return -errno;
	if (l.ss_family != r.ss_family)
		return -EAFNOSUPPORT;
	memset(out, 0, sizeof(*out));
	out->kind = XPORT_PATH_TCP;
	out->family = l.ss_family;
	util_strlcpy(out->dev, "tcp", sizeof(out->dev));
	if (l.ss_family == AF_INET) {
		memcpy(out->local, &((struct sockaddr_in *)&l)->sin_addr, 4);
		memcpy(out->peer, &((struct sockaddr_in *)&r)->sin_addr, 4);
	} else if (l.ss_family == AF_INET6) {
		if (IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)&r)->sin6_addr))
			return -EOPNOTSUPP; /* its scope is not in the page */
		memcpy(out->local, &((struct sockaddr_in6 *)&l)->sin6_addr, 16);
		memcpy(out->peer, &((struct sockaddr_in6 *)&r)->sin6_addr, 16);
	} else {
		return -EAFNOSUPPORT;
	}
	return 0;
}

const struct xport_ops xport_tcp_ops = {
	.name = "tcp",
	.probe = tcp_probe,
	.create = tcp_create,
	.destroy = tcp_destroy,
	.event_fd = tcp_event_fd,
	.listen = tcp_listen_on,
	.connect = tcp_connect_to,
	.accept = tcp_accept_conn,
	.reject = tcp_reject_conn,
	.disconnect = tcp_disconnect_conn,
	.conn_destroy = tcp_conn_destroy,
	.mr_reg = tcp_mr_register,
	.mr_dereg = tcp_mr_deregister,
	.post_send = tcp_post_send,
	.post_recv = tcp_post_recv,
	.post_write = tcp_post_write,
	.post_write_imm = tcp_post_write_imm,
	.post_read = tcp_post_read,
	.poll = tcp_poll,
	.device = tcp_device,
	.path = tcp_path,
	.set_node_addrs = tcp_set_node_addrs,
};
