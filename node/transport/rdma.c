/*
 * The rdma provider: librdmacm for connection management, libibverbs for PD/MR/CQ/QP.
 *
 * One rdma_cm event channel per provider instance; per device (ibv_context seen on a cm id) one
 * completion channel, and one PD per connection scope (xport_conn.scope: meshd's link), so an rkey
 * given to one peer is refused by the NIC on every other peer's QPs; per connection one CQ, so that
 * destroying a connection also destroys every completion it could still report (no stale wr_id can
 * reach the owner after conn_destroy). The provider's event fd is an epoll fd holding the cm channel and every
 * completion channel, so the owner waits on one fd.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "log.h"
#include "transport.h"
#include "util.h"

#define RDMA_CQ_DEPTH_MIN 64
#define RDMA_RD_ATOMIC_MAX 4
#define RDMA_LISTEN_BACKLOG 256

struct rdma_dev {
	struct rdma_dev *next;
	struct ibv_context *verbs;
	struct ibv_comp_channel *cch;
	uint8_t rd_atomic; /* RDMA READs in flight we may ask for / grant */
};

/* The protection domain of one scope on one device, held by its connections and registrations. */
struct rdma_pd {
	struct rdma_pd *next;
	struct rdma_dev *dev;
	const void *scope;
	struct ibv_pd *pd;
	unsigned refs;
};

struct rdma_conn;

struct rdma_xport {
	struct xport base;
	struct xport_attr attr;
	struct rdma_event_channel *ech;
	int epfd;
	struct rdma_cm_id *listen_id;
	struct rdma_dev *devs;
	struct rdma_pd *pds;
	struct rdma_conn *conns;   /* all live connections */
	struct rdma_conn *dirty;   /* connections whose CQ may hold completions */
	bool polling;              /* busy polling (poll_all): notifications are not re-armed */
	struct rdma_parked *parked; /* cm ids to destroy once their port is ACTIVE (rdma_park) */
	uint64_t parked_look_ms;
};

/* A cm id whose port was down when its connection was torn down (rdma_park). */
struct rdma_parked {
	struct rdma_parked *next;
	struct rdma_cm_id *id;
};

/* The context of a parked id: its events (a late DISCONNECTED, TIMEWAIT_EXIT) are nobody's. */
static char rdma_parked_ctx;

struct rdma_conn {
	struct xport_conn base;
	struct rdma_xport *rx;
	struct rdma_cm_id *id;
	struct rdma_dev *dev;
	struct rdma_pd *pd; /* its scope's on its device, once its QP exists */
	struct ibv_cq *cq;
	struct rdma_conn *prev, *next;
	struct rdma_conn *dirty_next;
	bool is_dirty;
	bool armed; /* a completion will raise a notification */
	bool passive;
	uint16_t port;
	uint8_t req_initiator_depth;    /* from the connect request (passive side) */
	uint8_t req_responder_resources;
	uint8_t pdata_len;
	uint8_t pdata[XPORT_PDATA_MAX]; /* connect private data, sent once the route is resolved */
};

struct rdma_mr {
	struct xport_mr base;
	struct ibv_mr *mr;
	struct rdma_pd *pd;
};

static struct rdma_xport *to_rx(xport_t *x)
{
	return (struct rdma_xport *)x;
}

static struct rdma_conn *to_rc(xport_conn_t *c)
{
	return (struct rdma_conn *)c;
}

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

static int addr_parse(const char *addr, uint16_t port, struct sockaddr_storage *ss)
{
	struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV, .ai_family = AF_UNSPEC};
	struct addrinfo *res;
	char ps[8];
	int ret;

	snprintf(ps, sizeof(ps), "%u", port);
	ret = getaddrinfo(addr, ps, &hints, &res);
	if (ret)
		return -EINVAL;
	memset(ss, 0, sizeof(*ss));
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	freeaddrinfo(res);
	return 0;
}

static void rdma_dev_destroy(struct rdma_dev *d)
{
	if (!d)
		return;
	if (d->cch)
		ibv_destroy_comp_channel(d->cch);
	free(d);
}

/* The PD of scope on dev, allocated on first use; the caller holds a reference. */
static struct rdma_pd *rdma_pd_get(struct rdma_xport *rx, struct rdma_dev *dev, const void *scope)
{
	struct rdma_pd *p;

	for (p = rx->pds; p; p = p->next)
		if (p->dev == dev && p->scope == scope) {
			p->refs++;
			return p;
		}
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->pd = ibv_alloc_pd(dev->verbs);
	if (!p->pd) {
		log_error("ibv_alloc_pd %s: %m", ibv_get_device_name(dev->verbs->device));
		free(p);
		return NULL;
	}
	p->dev = dev;
	p->scope = scope;
	p->refs = 1;
	p->next = rx->pds;
	rx->pds = p;
	return p;
}

static void rdma_pd_put(struct rdma_xport *rx, struct rdma_pd *p)
{
	struct rdma_pd **pp;

	if (!p || --p->refs)
		return;
	for (pp = &rx->pds; *pp != p; pp = &(*pp)->next)
		;
	*pp = p->next;
	if (ibv_dealloc_pd(p->pd))
		log_warn("ibv_dealloc_pd: %m");
	free(p);
}

/* The device state of a cm id's ibv_context, created on first use. */
static int rdma_dev_get(struct rdma_xport *rx, struct ibv_context *verbs, struct rdma_dev **out)
{
	struct rdma_dev *d;
	struct ibv_device_attr da;
	struct epoll_event ee = {.events = EPOLLIN};
	int ret;

	for (d = rx->devs; d; d = d->next) {
		if (d->verbs == verbs) {
			*out = d;
			return 0;
		}
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->verbs = verbs;
	ret = ibv_query_device(verbs, &da);
	if (ret) {
		ret = -ret;
		log_error("ibv_query_device %s: %s", ibv_get_device_name(verbs->device), strerror(-ret));
		goto err_free;
	}
	d->rd_atomic = (uint8_t)MIN(MIN(da.max_qp_rd_atom, da.max_qp_init_rd_atom), RDMA_RD_ATOMIC_MAX);
	d->cch = ibv_create_comp_channel(verbs);
	if (!d->cch) {
		ret = errno ? -errno : -ENOMEM;
		log_error("ibv_create_comp_channel %s: %m", ibv_get_device_name(verbs->device));
		goto err_free;
	}
	ret = set_nonblock(d->cch->fd);
	if (ret)
		goto err_free;
	ee.data.ptr = d;
	if (epoll_ctl(rx->epfd, EPOLL_CTL_ADD, d->cch->fd, &ee) < 0) {
		ret = -errno;
		log_error("epoll_ctl add completion channel: %m");
		goto err_free;
	}
	log_info("rdma device %s: rd_atomic %u", ibv_get_device_name(verbs->device), d->rd_atomic);
	d->next = rx->devs;
	rx->devs = d;
	*out = d;
	return 0;
err_free:
	rdma_dev_destroy(d);
	return ret;
}

static struct rdma_conn *rdma_conn_new(struct rdma_xport *rx, struct rdma_cm_id *id)
{
	struct rdma_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->base.xport = &rx->base;
	c->rx = rx;
	c->id = id;
	c->next = rx->conns;
	if (rx->conns)
		rx->conns->prev = c;
	rx->conns = c;
	return c;
}

/* Marks the connection's CQ for draining by the next poll (once). */
static void rdma_conn_dirty(struct rdma_conn *c)
{
	if (c->is_dirty)
		return;
	c->is_dirty = true;
	c->dirty_next = c->rx->dirty;
	c->rx->dirty = c;
}

static void rdma_conn_undirty(struct rdma_conn *c)
{
	struct rdma_conn **pp;

	if (!c->is_dirty)
		return;
	for (pp = &c->rx->dirty; *pp; pp = &(*pp)->dirty_next) {
		if (*pp == c) {
			*pp = c->dirty_next;
			break;
		}
	}
	c->is_dirty = false;
}

/* Whether the id's port can send management datagrams now (unknown counts as yes). */
static bool rdma_port_active(struct rdma_cm_id *id)
{
	struct ibv_port_attr pa;

	if (!id->verbs || !id->port_num)
		return true;
	return ibv_query_port(id->verbs, id->port_num, &pa) || pa.state == IBV_PORT_ACTIVE;
}

/* Tearing down a connection sends the CM's DREQ (rdma_disconnect, and rdma_destroy_id of a
 * connected id) or a REJ. Soft-RoCE with its netdev down (`ip link set railK down`) fails to route
 * that datagram and puts the device's management QP in the error state for good: no connection on
 * that device ever formed again once the netdev was up, not a re-dial, not a fresh meshd, not a
 * fresh rping (the VM, kernel 6.1; rdma_destroy_id also held the data-path thread for 16 s). So
 * while the id's port is not ACTIVE its connection's QP and CQ go at once, and the id itself
 * waits here (its context a marker, its events ignored) until the port is back: each poll looks,
 * every RDMA_PARK_LOOK_MS. A hardware NIC loses nothing by it: the DREQ goes late. */
#define RDMA_PARK_LOOK_MS 100

static void rdma_park(struct rdma_xport *rx, struct rdma_cm_id *id)
{
	struct rdma_parked *p = calloc(1, sizeof(*p));

	if (!p) {
		rdma_destroy_id(id);
		return;
	}
	id->context = &rdma_parked_ctx;
	p->id = id;
	p->next = rx->parked;
	rx->parked = p;
	log_debug("rdma: a cm id waits for its port (%s port %u) before it is destroyed",
		  id->verbs ? ibv_get_device_name(id->verbs->device) : "?", id->port_num);
}

static void rdma_park_reap(struct rdma_xport *rx, bool all)
{
	struct rdma_parked **pp = &rx->parked;
	uint64_t now;

	if (!rx->parked)
		return;
	now = util_now_ms();
	if (!all && now - rx->parked_look_ms < RDMA_PARK_LOOK_MS)
		return;
	rx->parked_look_ms = now;
	while (*pp) {
		struct rdma_parked *p = *pp;

		if (!all && !rdma_port_active(p->id)) {
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		rdma_destroy_id(p->id);
		free(p);
	}
}

static void rdma_conn_destroy(xport_conn_t *xc)
{
	struct rdma_conn *c = to_rc(xc);
	struct rdma_xport *rx;

	if (!c)
		return;
	rx = c->rx;
	rdma_conn_undirty(c);
	if (c->id && c->id->qp)
		rdma_destroy_qp(c->id);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	rdma_pd_put(rx, c->pd);
	if (c->id && !rdma_port_active(c->id))
		rdma_park(rx, c->id);
	else if (c->id)
		rdma_destroy_id(c->id);
	if (c->prev)
		c->prev->next = c->next;
	else
		rx->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	free(c);
}

/* Creates the CQ and the RC QP of a connection on the id's device. */
static int rdma_conn_setup_qp(struct rdma_conn *c)
{
	struct rdma_xport *rx = c->rx;
	struct ibv_qp_init_attr qa;
	int ret, depth = (int)MAX(rx->attr.max_send_wr + rx->attr.max_recv_wr, RDMA_CQ_DEPTH_MIN);

	ret = rdma_dev_get(rx, c->id->verbs, &c->dev);
	if (ret)
		return ret;
	c->pd = rdma_pd_get(rx, c->dev, c->base.scope);
	if (!c->pd)
		return -ENOMEM;
	c->cq = ibv_create_cq(c->id->verbs, depth, c, c->dev->cch, 0);
	if (!c->cq) {
		ret = errno ? -errno : -ENOMEM;
		log_error("ibv_create_cq (depth %d) to %s: %m", depth, c->base.peer_addr);
		return ret;
	}
	ret = ibv_req_notify_cq(c->cq, 0);
	if (ret) {
		log_error("ibv_req_notify_cq to %s: %s", c->base.peer_addr, strerror(ret));
		return -ret;
	}
	c->armed = true;
	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_RC;
	qa.send_cq = c->cq;
	qa.recv_cq = c->cq;
	qa.cap.max_send_wr = rx->attr.max_send_wr;
	qa.cap.max_recv_wr = rx->attr.max_recv_wr;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.sq_sig_all = 0;
	if (rdma_create_qp(c->id, c->pd->pd, &qa)) {
		ret = -errno;
		/* For an incoming request this is the peer's attempt failing, not meshd: the caller rejects
		 * it with a warning and the peer re-dials. Seen as EINVAL under emulation when a restarted
		 * meshd takes up requests that queued up while it started. */
		if (c->passive)
			log_warn("rdma_create_qp for the request of %s: %m", c->base.peer_addr);
		else
			log_error("rdma_create_qp to %s: %m", c->base.peer_addr);
		return ret;
	}
	return 0;
}

static void rdma_conn_param_fill(struct rdma_conn *c, struct rdma_conn_param *p, const void *pdata, size_t len)
{
	memset(p, 0, sizeof(*p));
	p->private_data = pdata;
	p->private_data_len = (uint8_t)len;
	p->responder_resources = c->dev->rd_atomic;
	p->initiator_depth = c->dev->rd_atomic;
	if (c->passive) {
		/* Grant no more than the requester can use, ask no more than it grants. */
		p->responder_resources = MIN(p->responder_resources, c->req_initiator_depth);
		p->initiator_depth = MIN(p->initiator_depth, c->req_responder_resources);
	}
	/* Emulated devices (rxe under TCG) are ~100x slower: retry generously; 7 = RNR retry forever. */
	p->retry_count = 7;
	p->rnr_retry_count = 7;
}

/* The ACK timeout of the id's QP (xport_attr.ack_timeout), before its move to RTS: on the active
 * side before the connect, on the passive side before the accept. A kernel without the option (before
 * 5.1) keeps its default, said once. */
static void rdma_set_ack_timeout(struct rdma_xport *rx, struct rdma_cm_id *id)
{
	static bool warned;
	uint8_t t = rx->attr.ack_timeout;

	if (!t)
		return;
	if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof(t)) && !warned) {
		warned = true;
		log_warn("rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT, %u): %m: queue pairs keep the kernel's ACK "
			 "timeout, and a lost packet may stall a rail past the keepalive timeout", t);
	}
}

/* The RNR NAK timer the QP advertises to its peer (IBTA spec, 9.7.5.2.8: how long the peer waits
 * before sending again a SEND or WRITE with immediate that found no receive posted here). The CM
 * leaves it 0, which encodes the longest, 655.36 ms: one receive queue that ran dry would stall the
 * QP, and the keepalives and messages behind it, that long per RNR NAK. 12 encodes 0.64 ms (perftest's
 * value). It is an optional attribute of RTS to RTS, set once the connection is established; a
 * provider that refuses it keeps the CM's, said once. At debug level the QP's attributes are logged. */
#define RDMA_MIN_RNR_TIMER 12

static void rdma_qp_established(struct rdma_conn *c)
{
	static bool warned;
	struct ibv_qp_attr qa = {.min_rnr_timer = RDMA_MIN_RNR_TIMER};
	struct ibv_qp_init_attr qi;
	int ret = ibv_modify_qp(c->id->qp, &qa, IBV_QP_MIN_RNR_TIMER);

	if (ret && !warned) {
		warned = true;
		log_warn("%s: ibv_modify_qp(min_rnr_timer %u): %s: queue pairs keep the CM's RNR NAK timer "
			 "(655 ms), and a receive queue that runs dry stalls its QP that long",
			 c->base.peer_addr, RDMA_MIN_RNR_TIMER, strerror(ret));
	}
	/* What the QP got of rdma_cm's attributes and ours (ack_timeout, min_rnr_timer). */
	if (log_current_level >= LOG_LVL_DEBUG &&
	    !ibv_query_qp(c->id->qp, &qa, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MIN_RNR_TIMER,
			  &qi))
		log_debug("%s: established: ACK timeout 2^%u x 4.096 us, retry %u, RNR retry %u, min RNR timer %u",
			  c->base.peer_addr, qa.timeout, qa.retry_cnt, qa.rnr_retry, qa.min_rnr_timer);
}

static int rdma_create(const struct xport_attr *attr, xport_t **out)
{
	struct rdma_xport *rx;
	struct epoll_event ee = {.events = EPOLLIN};
	int ret;

	rx = calloc(1, sizeof(*rx));
	if (!rx)
		return -ENOMEM;
	rx->base.ops = &xport_rdma_ops;
	rx->attr = *attr;
	rx->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (rx->epfd < 0) {
		ret = -errno;
		log_error("epoll_create1: %m");
		goto err_free;
	}
	rx->ech = rdma_create_event_channel();
	if (!rx->ech) {
		ret = errno ? -errno : -ENODEV;
		log_error("rdma_create_event_channel: %m (no RDMA: is rdma_ucm loaded and a device present?)");
		goto err_close_epfd;
	}
	ret = set_nonblock(rx->ech->fd);
	if (ret)
		goto err_destroy_ech;
	ee.data.ptr = rx->ech;
	if (epoll_ctl(rx->epfd, EPOLL_CTL_ADD, rx->ech->fd, &ee) < 0) {
		ret = -errno;
		log_error("epoll_ctl add rdma_cm channel: %m");
		goto err_destroy_ech;
	}
	*out = &rx->base;
	return 0;
err_destroy_ech:
	rdma_destroy_event_channel(rx->ech);
err_close_epfd:
	close(rx->epfd);
err_free:
	free(rx);
	return ret;
}

static void rdma_destroy(xport_t *x)
{
	struct rdma_xport *rx = to_rx(x);
	struct rdma_dev *d;

	while (rx->conns)
		rdma_conn_destroy(&rx->conns->base);
	rdma_park_reap(rx, true);
	if (rx->listen_id)
		rdma_destroy_id(rx->listen_id);
	/* Registrations the owner still holds keep their PD: report, then free what is left. */
	while (rx->pds) {
		struct rdma_pd *p = rx->pds;

		rx->pds = p->next;
		log_warn("rdma: a protection domain still held %u times at exit", p->refs);
		ibv_dealloc_pd(p->pd);
		free(p);
	}
	while ((d = rx->devs)) {
		rx->devs = d->next;
		rdma_dev_destroy(d);
	}
	rdma_destroy_event_channel(rx->ech);
	close(rx->epfd);
	free(rx);
}

static int rdma_event_fd(xport_t *x)
{
	return to_rx(x)->epfd;
}

static int rdma_listen_on(xport_t *x, const char *addr, uint16_t port)
{
	struct rdma_xport *rx = to_rx(x);
	struct sockaddr_storage ss;
	int ret;

	if (rx->listen_id)
		return -EBUSY;
	ret = addr_parse(addr, port, &ss);
	if (ret) {
		log_error("listen address %s is not numeric", addr);
		return ret;
	}
	if (rdma_create_id(rx->ech, &rx->listen_id, rx, RDMA_PS_TCP)) {
		ret = -errno;
		log_error("rdma_create_id: %m");
		return ret;
	}
	/* A bind or listen that fails is not logged: the caller names the node and what to do about it
	 * (meshd's check_listen_why). */
	if (rdma_bind_addr(rx->listen_id, (struct sockaddr *)&ss) || rdma_listen(rx->listen_id, RDMA_LISTEN_BACKLOG)) {
		ret = -errno;
		goto err_destroy_id;
	}
	return 0;
err_destroy_id:
	rdma_destroy_id(rx->listen_id);
	rx->listen_id = NULL;
	return ret;
}

static int rdma_connect_to(xport_t *x, const char *src, const char *addr, uint16_t port, const void *pdata,
			   size_t len, void *ctx, uint32_t index, xport_conn_t **out)
{
	struct rdma_xport *rx = to_rx(x);
	struct sockaddr_storage dst, srcs;
	struct rdma_cm_id *id;
	struct rdma_conn *c;
	int ret;

	if (len > XPORT_CONNECT_PDATA_MAX)
		return -EMSGSIZE;
	ret = addr_parse(addr, port, &dst);
	if (ret)
		return ret;
	if (src) {
		ret = addr_parse(src, 0, &srcs);
		if (ret)
			return ret;
	}
	if (rdma_create_id(rx->ech, &id, NULL, RDMA_PS_TCP)) {
		ret = -errno;
		log_error("rdma_create_id: %m");
		return ret;
	}
	c = rdma_conn_new(rx, id);
	if (!c) {
		rdma_destroy_id(id);
		return -ENOMEM;
	}
	id->context = c;
	rdma_set_ack_timeout(rx, id);
	c->base.ctx = ctx;
	c->base.scope = ctx;
	c->base.index = index;
	c->port = port;
	snprintf(c->base.peer_addr, sizeof(c->base.peer_addr), "%s:%u", addr, port);
	memcpy(c->pdata, pdata, len);
	c->pdata_len = (uint8_t)len;
	if (rdma_resolve_addr(id, src ? (struct sockaddr *)&srcs : NULL, (struct sockaddr *)&dst,
			      (int)rx->attr.connect_timeout_ms)) {
		ret = -errno;
		log_warn("rdma_resolve_addr %s: %m", c->base.peer_addr);
		rdma_conn_destroy(&c->base);
		return ret;
	}
	*out = &c->base;
	return 0;
}

/* An incoming request the owner will accept: its CQ and QP, now and not at the request, so a
 * stranger's requests cost no verbs resources. On failure the request is rejected here. */
static int rdma_admit(xport_conn_t *xc)
{
	struct rdma_conn *c = to_rc(xc);
	int ret;

	if (!c->passive || c->cq)
		return 0;
	ret = rdma_conn_setup_qp(c);
	if (ret) {
		log_warn("rejecting %s: cannot set up its QP: %s", c->base.peer_addr, strerror(-ret));
		rdma_reject(c->id, NULL, 0);
	}
	return ret;
}

static int rdma_accept_conn(xport_conn_t *xc, const void *pdata, size_t len)
{
	struct rdma_conn *c = to_rc(xc);
	struct rdma_conn_param p;

	if (len > XPORT_PDATA_MAX)
		return -EMSGSIZE;
	rdma_conn_param_fill(c, &p, pdata, len);
	rdma_set_ack_timeout(c->rx, c->id);
	if (rdma_accept(c->id, &p)) {
		int ret = -errno;

		log_warn("rdma_accept from %s: %m", c->base.peer_addr);
		return ret;
	}
	return 0;
}

static int rdma_reject_conn(xport_conn_t *xc, const void *pdata, size_t len)
{
	struct rdma_conn *c = to_rc(xc);

	if (rdma_reject(c->id, pdata, (uint8_t)MIN(len, XPORT_CONNECT_PDATA_MAX))) {
		int ret = -errno;

		log_warn("rdma_reject to %s: %m", c->base.peer_addr);
		return ret;
	}
	return 0;
}

static int rdma_disconnect_conn(xport_conn_t *xc)
{
	struct rdma_conn *c = to_rc(xc);

	/* Not while the port is down: its DREQ would break the device (rdma_park). */
	if (!rdma_port_active(c->id))
		return 0;
	/* EINVAL when it never connected: nothing to tear down then. */
	if (rdma_disconnect(c->id) && errno != EINVAL)
		return -errno;
	return 0;
}

static int rdma_mr_register(xport_conn_t *xc, void *addr, size_t len, unsigned access, xport_mr_t **out)
{
	struct rdma_conn *c = to_rc(xc);
	struct rdma_mr *m;
	int flags = 0;

	if (!c->pd)
		return -ENOTCONN;
	if (access & XPORT_ACCESS_LOCAL)
		flags |= IBV_ACCESS_LOCAL_WRITE;
	if (access & XPORT_ACCESS_REMOTE_WRITE)
		flags |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
	if (access & XPORT_ACCESS_REMOTE_READ)
		flags |= IBV_ACCESS_REMOTE_READ;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->mr = ibv_reg_mr(c->pd->pd, addr, len, flags);
	if (!m->mr) {
		int ret = errno ? -errno : -ENOMEM;

		log_error("ibv_reg_mr %zu bytes: %m", len);
		free(m);
		return ret;
	}
	m->pd = c->pd;
	m->pd->refs++;
	m->base.xport = xc->xport;
	m->base.addr = addr;
	m->base.len = len;
	m->base.lkey = m->mr->lkey;
	m->base.rkey = m->mr->rkey;
	*out = &m->base;
	return 0;
}

static void rdma_mr_deregister(xport_mr_t *xm)
{
	struct rdma_mr *m = (struct rdma_mr *)xm;

	if (!m)
		return;
	ibv_dereg_mr(m->mr);
	rdma_pd_put(to_rx(m->base.xport), m->pd);
	free(m);
}

static int rdma_post(struct rdma_conn *c, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	int ret;

	if (!c->id->qp)
		return -ENOTCONN;
	ret = ibv_post_send(c->id->qp, wr, &bad);
	return ret ? -ret : 0;
}

static int rdma_post_one(xport_conn_t *xc, enum ibv_wr_opcode op, xport_mr_t *mr, const void *buf, uint32_t len,
			 uint64_t raddr, uint32_t rkey, uint32_t imm, uint64_t wr_id)
{
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = len, .lkey = mr->lkey};
	struct ibv_send_wr wr = {
		.wr_id = wr_id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
	};

	if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_RDMA_READ) {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	if (op == IBV_WR_RDMA_WRITE_WITH_IMM)
		wr.imm_data = htonl(imm);
	return rdma_post(to_rc(xc), &wr);
}

static int rdma_post_send(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len, uint64_t wr_id)
{
	return rdma_post_one(c, IBV_WR_SEND, mr, buf, len, 0, 0, 0, wr_id);
}

static int rdma_post_write(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len, uint64_t raddr,
			   uint32_t rkey, uint64_t wr_id)
{
	return rdma_post_one(c, IBV_WR_RDMA_WRITE, mr, buf, len, raddr, rkey, 0, wr_id);
}

static int rdma_post_write_imm(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len, uint64_t raddr,
			       uint32_t rkey, uint32_t imm, uint64_t wr_id)
{
	return rdma_post_one(c, IBV_WR_RDMA_WRITE_WITH_IMM, mr, buf, len, raddr, rkey, imm, wr_id);
}

static int rdma_post_read(xport_conn_t *c, xport_mr_t *mr, void *buf, uint32_t len, uint64_t raddr, uint32_t rkey,
			  uint64_t wr_id)
{
	return rdma_post_one(c, IBV_WR_RDMA_READ, mr, buf, len, raddr, rkey, 0, wr_id);
}

static int rdma_post_recv(xport_conn_t *xc, xport_mr_t *mr, void *buf, uint32_t len, uint64_t wr_id)
{
	struct rdma_conn *c = to_rc(xc);
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = len, .lkey = mr ? mr->lkey : 0};
	/* No buffer: a receive for immediates only (RDMA WRITE_WITH_IMM consumes it, writes nothing). */
	struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = len ? 1 : 0}, *bad;
	int ret;

	if (!c->id->qp)
		return -ENOTCONN;
	ret = ibv_post_recv(c->id->qp, &wr, &bad);
	return ret ? -ret : 0;
}

static void ev_conn(struct xport_event *ev, enum xport_ev_type type, struct rdma_conn *c, int status,
		    const struct rdma_cm_event *cme)
{
	memset(ev, 0, sizeof(*ev));
	ev->type = type;
	ev->conn = &c->base;
	ev->status = status;
	ev->status_str = rdma_event_str(cme->event);
	if (cme->param.conn.private_data && cme->param.conn.private_data_len) {
		ev->pdata_len = (uint8_t)MIN(cme->param.conn.private_data_len, XPORT_PDATA_MAX);
		memcpy(ev->pdata, cme->param.conn.private_data, ev->pdata_len);
	}
}

/* A status of a cm failure event as a negative errno (rdma_cm reports some as positive IB codes). */
static int cm_status(const struct rdma_cm_event *cme, int fallback)
{
	if (cme->status < 0)
		return cme->status;
	return fallback;
}

static void peer_addr_str(struct rdma_cm_id *id, char *buf, size_t len)
{
	struct sockaddr *sa = rdma_get_peer_addr(id);
	char host[INET6_ADDRSTRLEN] = "?";

	if (sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)sa)->sin_addr, host, sizeof(host));
	else if (sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)sa)->sin6_addr, host, sizeof(host));
	snprintf(buf, len, "%s:%u", host, ntohs(rdma_get_dst_port(id)));
}

/* Translates one cm event; returns 1 if *ev was filled for the owner. */
static int rdma_cm_handle(struct rdma_xport *rx, struct rdma_cm_event *cme, struct xport_event *ev)
{
	struct rdma_conn *c = cme->id->context;
	struct rdma_conn_param p;
	int ret;

	if (cme->id == rx->listen_id) {
		log_warn("listener: %s (status %d)", rdma_event_str(cme->event), cme->status);
		return 0;
	}
	if (cme->id->context == &rdma_parked_ctx)
		return 0; /* a parked id's (rdma_park) */
	switch (cme->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST:
		c = rdma_conn_new(rx, cme->id);
		if (!c) {
			rdma_reject(cme->id, NULL, 0);
			rdma_destroy_id(cme->id);
			return 0;
		}
		cme->id->context = c;
		c->passive = true;
		c->req_initiator_depth = cme->param.conn.initiator_depth;
		c->req_responder_resources = cme->param.conn.responder_resources;
		peer_addr_str(cme->id, c->base.peer_addr, sizeof(c->base.peer_addr));
		/* No CQ or QP yet: the owner judges the private data first (rdma_admit). */
		ev_conn(ev, XPORT_EV_CONNECT_REQUEST, c, 0, cme);
		return 1;
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (rdma_resolve_route(cme->id, (int)rx->attr.connect_timeout_ms)) {
			ev_conn(ev, XPORT_EV_CONNECT_ERROR, c, -errno, cme);
			ev->status_str = "rdma_resolve_route failed";
			return 1;
		}
		return 0;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		ret = rdma_conn_setup_qp(c);
		if (!ret) {
			rdma_conn_param_fill(c, &p, c->pdata, c->pdata_len);
			if (rdma_connect(cme->id, &p))
				ret = -errno;
		}
		if (ret) {
			ev_conn(ev, XPORT_EV_CONNECT_ERROR, c, ret, cme);
			ev->status_str = "QP setup or rdma_connect failed";
			return 1;
		}
		return 0;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
		ev_conn(ev, XPORT_EV_CONNECT_ERROR, c, cm_status(cme, -ECONNREFUSED), cme);
		return 1;
	case RDMA_CM_EVENT_REJECTED:
		ev_conn(ev, XPORT_EV_REJECTED, c, -ECONNREFUSED, cme);
		return 1;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (c && c->id && c->id->qp)
			rdma_qp_established(c);
		ev_conn(ev, XPORT_EV_ESTABLISHED, c, 0, cme);
		return 1;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		ev_conn(ev, XPORT_EV_DISCONNECTED, c, -ECONNRESET, cme);
		return 1;
	default:
		/* TIMEWAIT_EXIT, ADDR_CHANGE and friends need nothing from the owner. */
		log_debug("%s: %s (status %d)", c ? c->base.peer_addr : "?", rdma_event_str(cme->event), cme->status);
		return 0;
	}
}

static enum xport_op wc_op(const struct ibv_wc *wc)
{
	switch (wc->opcode) {
	case IBV_WC_SEND:
		return XPORT_OP_SEND;
	case IBV_WC_RDMA_WRITE:
		return XPORT_OP_WRITE;
	case IBV_WC_RDMA_READ:
		return XPORT_OP_READ;
	case IBV_WC_RECV_RDMA_WITH_IMM:
		return XPORT_OP_RECV_IMM;
	default:
		return XPORT_OP_RECV;
	}
}

/* Drains c's CQ into evs[n..max) (as much as there is room for: it stays dirty while it may hold
 * more). Returns the new count. */
static int rdma_drain_conn(struct rdma_conn *c, struct xport_event *evs, int n, int max)
{
	while (n < max) {
		struct ibv_wc wc[16];
		int want = MIN(max - n, (int)ARRAY_SIZE(wc));
		int got = ibv_poll_cq(c->cq, want, wc);

		if (got < 0) {
			log_error("ibv_poll_cq to %s failed", c->base.peer_addr);
			got = 0;
		}
		for (int i = 0; i < got; i++) {
			struct xport_event *ev = &evs[n++];

			memset(ev, 0, sizeof(*ev));
			ev->type = XPORT_EV_COMPLETION;
			ev->conn = &c->base;
			ev->wr_id = wc[i].wr_id;
			if (wc[i].status != IBV_WC_SUCCESS) {
				ev->status = -EIO;
				ev->wc_status = wc[i].status;
				ev->status_str = ibv_wc_status_str(wc[i].status);
				/* The opcode of a failed completion is undefined: the owner goes by wr_id. */
				continue;
			}
			ev->op = wc_op(&wc[i]);
			ev->byte_len = wc[i].byte_len;
			if (wc[i].wc_flags & IBV_WC_WITH_IMM) {
				ev->has_imm = true;
				ev->imm = ntohl(wc[i].imm_data);
			}
		}
		if (got < want) {
			rdma_conn_undirty(c);
			break;
		}
	}
	return n;
}

/* Drains the dirty CQs into evs[n..max). Returns the new count. */
static int rdma_drain(struct rdma_xport *rx, struct xport_event *evs, int n, int max)
{
	while (n < max && rx->dirty)
		n = rdma_drain_conn(rx->dirty, evs, n, max);
	return n;
}

static int rdma_poll(xport_t *x, struct xport_event *evs, int max)
{
	struct rdma_xport *rx = to_rx(x);
	struct rdma_cm_event *cme;
	struct rdma_dev *d;
	struct ibv_cq *cq;
	void *cq_ctx;
	int n = 0;

	/* 1. connection events; each is copied and acked at once (rdma_destroy_id waits for acks) */
	while (n < max && !rdma_get_cm_event(rx->ech, &cme)) {
		struct rdma_conn *dead = NULL, *c = cme->id->context;
		int r;

		if (cme->event == RDMA_CM_EVENT_DISCONNECTED && c && cme->id->context != &rdma_parked_ctx && c->cq &&
		    n < max - 1) {
			/* What the peer sent before it hung up comes first, as a socket's last bytes are
			 * read before its end of file: its Goodbye says why the link goes (a restart,
			 * not a failure), and it is already in our CQ (the peer saw it acknowledged). */
			rdma_conn_dirty(c);
			n = rdma_drain_conn(c, evs, n, max - 1);
		}
		r = rdma_cm_handle(rx, cme, &evs[n]);

		if (r < 0)
			dead = cme->id->context;
		rdma_ack_cm_event(cme);
		if (dead)
			rdma_conn_destroy(&dead->base);
		if (r > 0)
			n++;
	}
	rdma_park_reap(rx, false);
	/* 2. completion notifications: re-arm, then mark the CQ for draining; 3. drain */
	for (d = rx->devs; d; d = d->next) {
		while (!ibv_get_cq_event(d->cch, &cq, &cq_ctx)) {
			struct rdma_conn *c = cq_ctx;

			ibv_ack_cq_events(cq, 1);
			/* A polling owner looks into every CQ anyway: re-arming (a system call on
			 * some providers) waits until it goes to sleep (rdma_arm). */
			c->armed = rx->polling ? false : !ibv_req_notify_cq(cq, 0);
			rdma_conn_dirty(c);
		}
	}
	return rdma_drain(rx, evs, n, max);
}

/* Busy polling: every live connection's CQ is looked into, notified or not, and nothing else: no
 * system call, as ibv_poll_cq is the provider's own memory. Connection events and notifications
 * make event_fd readable and are taken by rdma_poll; a notification that fires meanwhile is not
 * re-armed until rdma_arm, before the owner sleeps. */
static int rdma_poll_all(xport_t *x, struct xport_event *evs, int max)
{
	struct rdma_xport *rx = to_rx(x);

	rx->polling = true;
	for (struct rdma_conn *c = rx->conns; c; c = c->next)
		if (c->cq)
			rdma_conn_dirty(c);
	return rdma_drain(rx, evs, 0, max);
}

static int rdma_device(xport_t *x, char *name, size_t len)
{
	struct rdma_xport *rx = to_rx(x);

	if (!rx->listen_id || !rx->listen_id->verbs)
		return -ENODEV;
	util_strlcpy(name, ibv_get_device_name(rx->listen_id->verbs->device), len);
	return 0;
}

/* What another process's QP on our device needs to reach the peer of c's QP: read off the QP that
 * rdma_cm connected (its address vector carries the route it resolved). */
static int rdma_path(xport_conn_t *xc, struct xport_path *out)
{
	struct rdma_conn *c = to_rc(xc);
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr init;
	int ret;

	if (!c->id || !c->id->qp || !c->id->verbs)
		return -ENOTCONN;
	ret = ibv_query_qp(c->id->qp, &a, IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_TIMEOUT, &init);
	if (ret)
		return -ret;
	if (!a.ah_attr.is_global)
		return -EOPNOTSUPP; /* InfiniBand without a GRH: LIDs, which the AQ area does not carry */
	memset(out, 0, sizeof(*out));
	util_strlcpy(out->dev, ibv_get_device_name(c->id->verbs->device), sizeof(out->dev));
	out->port = a.ah_attr.port_num ? a.ah_attr.port_num : c->id->port_num;
	out->sgid_index = a.ah_attr.grh.sgid_index;
	out->path_mtu = (uint8_t)a.path_mtu;
	out->hop_limit = a.ah_attr.grh.hop_limit;
	out->traffic_class = a.ah_attr.grh.traffic_class;
	out->ack_timeout = a.timeout;
	memcpy(out->dgid, a.ah_attr.grh.dgid.raw, sizeof(out->dgid));
	return 0;
}

/* The owner stops polling: every CQ notifies again. It polls once more after this (poll_all), so a
 * completion that came before the arm is not left unseen. */
static void rdma_arm(xport_t *x)
{
	struct rdma_xport *rx = to_rx(x);

	rx->polling = false;
	for (struct rdma_conn *c = rx->conns; c; c = c->next) {
		if (c->cq && !c->armed) {
			int ret = ibv_req_notify_cq(c->cq, 0);

			if (ret)
				log_error("ibv_req_notify_cq to %s: %s", c->base.peer_addr, strerror(ret));
			c->armed = !ret;
		}
	}
}

/* An RDMA device serves addr if rdma_cm can bind a cm id to it and finds a device there. */
static int rdma_probe(const char *addr)
{
	struct rdma_event_channel *ech;
	struct rdma_cm_id *id;
	struct sockaddr_storage ss;
	int ok = 0;

	if (addr_parse(addr, 0, &ss))
		return 0;
	ech = rdma_create_event_channel();
	if (!ech)
		return 0;
	if (!rdma_create_id(ech, &id, NULL, RDMA_PS_TCP)) {
		ok = !rdma_bind_addr(id, (struct sockaddr *)&ss) && id->verbs;
		rdma_destroy_id(id);
	}
	rdma_destroy_event_channel(ech);
	return ok;
}

const struct xport_ops xport_rdma_ops = {
	.name = "rdma",
	.probe = rdma_probe,
	.create = rdma_create,
	.destroy = rdma_destroy,
	.event_fd = rdma_event_fd,
	.listen = rdma_listen_on,
	.connect = rdma_connect_to,
	.admit = rdma_admit,
	.accept = rdma_accept_conn,
	.reject = rdma_reject_conn,
	.disconnect = rdma_disconnect_conn,
	.conn_destroy = rdma_conn_destroy,
	.mr_reg = rdma_mr_register,
	.mr_dereg = rdma_mr_deregister,
	.post_send = rdma_post_send,
	.post_recv = rdma_post_recv,
	.post_write = rdma_post_write,
	.post_write_imm = rdma_post_write_imm,
	.post_read = rdma_post_read,
	.poll = rdma_poll,
	.poll_all = rdma_poll_all,
	.arm = rdma_arm,
	.device = rdma_device,
	.path = rdma_path,
};
