/*
 * The tcp provider's connections (tcp_internal.h): the event queue, and each connection's plumbing:
 * frames queued and flushed to the socket (payloads of large writes from where they were posted),
 * frames read, checked against the registered regions and applied (large WRITEs received straight
 * into their region), acknowledgements and completions in the order of the send queue, and a
 * failure flushing whatever was posted. tcp.c has the provider's ops, listening and dialling.
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

/* ---- event queue ---- */

/* Makes the provider's fd readable so the owner calls poll(). */
void tcp_wake(struct tcp_xport *tx)
{
	uint64_t one = 1;

	if (write(tx->evfd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn("eventfd write: %m");
}

struct xport_event *tcp_ev_push(struct tcp_xport *tx, enum xport_ev_type type, struct tcp_conn *c)
{
	struct xport_event *ev;

	if (tx->q_len == tx->q_cap) {
		size_t nc = tx->q_cap ? tx->q_cap * 2 : 64;
		struct xport_event *nq = malloc(nc * sizeof(*nq));

		if (!nq) {
			log_error("out of memory queueing a transport event");
			return NULL;
		}
		for (size_t i = 0; i < tx->q_len; i++)
			nq[i] = tx->q[(tx->q_head + i) % tx->q_cap];
		free(tx->q);
		tx->q = nq;
		tx->q_head = 0;
		tx->q_cap = nc;
	}
	ev = &tx->q[(tx->q_head + tx->q_len) % tx->q_cap];
	tx->q_len++;
	memset(ev, 0, sizeof(*ev));
	ev->type = type;
	ev->conn = &c->base;
	if (tx->q_len == 1)
		tcp_wake(tx);
	return ev;
}

static void tcp_ev_completion(struct tcp_conn *c, enum xport_op op, uint64_t wr_id, uint32_t len, int status,
			      const char *why)
{
	struct xport_event *ev;

	if (op != XPORT_OP_RECV && op != XPORT_OP_RECV_IMM && c->sq_wrs)
		c->sq_wrs--;
	ev = tcp_ev_push(c->tx, XPORT_EV_COMPLETION, c);
	if (!ev)
		return;
	ev->op = op;
	ev->wr_id = wr_id;
	ev->byte_len = len;
	ev->status = status;
	ev->status_str = why;
}

/* ---- connection plumbing ---- */

int tcp_conn_watch(struct tcp_conn *c)
{
	struct epoll_event ee = {.data.ptr = c};
	uint32_t want = 0;

	if (c->fd < 0)
		return 0;
	if (c->state == TC_CONNECTING || c->out_head)
		want |= EPOLLOUT;
	if (c->state != TC_CONNECTING && c->state != TC_REQUESTED && c->state != TC_CLOSED && !c->in_blocked)
		want |= EPOLLIN;
	if (want == c->ev_mask)
		return 0;
	ee.events = want;
	if (epoll_ctl(c->tx->epfd, EPOLL_CTL_MOD, c->fd, &ee))
		return -errno;
	c->ev_mask = want;
	return 0;
}

void tcp_timer_update(struct tcp_xport *tx)
{
	bool need = false;
	struct itimerspec its = {{0, 0}, {0, 0}};

	need = tx->accept_paused_until != 0;
	for (struct tcp_conn *c = tx->conns; c && !need; c = c->next)
		need = c->deadline_ms != 0;
	if (need == tx->timer_on)
		return;
	if (need) {
		its.it_interval.tv_nsec = TCP_TICK_MS * 1000000L;
		its.it_value.tv_nsec = TCP_TICK_MS * 1000000L;
	}
	timerfd_settime(tx->tfd, 0, &its, NULL);
	tx->timer_on = need;
}

struct tcp_conn *tcp_conn_new(struct tcp_xport *tx, int fd)
{
	struct tcp_conn *c = calloc(1, sizeof(*c));
	struct epoll_event ee = {.events = 0};
	int one = 1;

	if (!c)
		return NULL;
	c->recv_cap = MAX(tx->attr.max_recv_wr, 1u);
	c->recvs = calloc(c->recv_cap, sizeof(*c->recvs));
	if (!c->recvs) {
		free(c);
		return NULL;
	}
	c->base.xport = &tx->base;
	c->tx = tx;
	c->fd = fd;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	ee.data.ptr = c;
	if (epoll_ctl(tx->epfd, EPOLL_CTL_ADD, fd, &ee)) {
		log_error("epoll_ctl add tcp connection: %m");
		free(c->recvs);
		free(c);
		return NULL;
	}
	c->next = tx->conns;
	if (tx->conns)
		tx->conns->prev = c;
	tx->conns = c;
	return c;
}

void tcp_conn_unlink(struct tcp_conn *c)
{
	struct tcp_xport *tx = c->tx;

	if (c->prev)
		c->prev->next = c->next;
	else
		tx->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
}

void tcp_conn_close_fd(struct tcp_conn *c)
{
	if (c->fd < 0)
		return;
	epoll_ctl(c->tx->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	c->fd = -1;
	c->ev_mask = 0;
}

/* Everything posted and not completed completes with an error, as a QP in error flushes its queues. */
static void tcp_conn_flush_wrs(struct tcp_conn *c)
{
	while (c->out_head) {
		struct tcp_out *o = c->out_head;

		c->out_head = o->next;
		if (o->op)
			tcp_ev_completion(c, o->op, o->wr_id, 0, -EIO, "flushed");
		free(o);
	}
	c->out_tail = NULL;
	while (c->unacked_head) {
		struct tcp_unacked *u = c->unacked_head;

		c->unacked_head = u->next;
		tcp_ev_completion(c, u->op, u->wr_id, 0, -EIO, "flushed");
		free(u);
	}
	c->unacked_tail = NULL;
	c->n_unacked = 0;
	while (c->reads) {
		struct tcp_read *r = c->reads;

		c->reads = r->next;
		tcp_ev_completion(c, XPORT_OP_READ, r->wr_id, 0, -EIO, "flushed");
		free(r);
	}
	while (c->recv_count) {
		tcp_ev_completion(c, XPORT_OP_RECV, c->recvs[c->recv_head].wr_id, 0, -EIO, "flushed");
		c->recv_head = (c->recv_head + 1) % c->recv_cap;
		c->recv_count--;
	}
}

/* Ends a connection after an error or EOF, once: raises `type` (DISCONNECTED or CONNECT_ERROR). */
void tcp_conn_fail(struct tcp_conn *c, enum xport_ev_type type, int status, const char *why)
{
	struct xport_event *ev;

	if (c->state == TC_CLOSED)
		return;
	/* A passive connection nobody was told about yet disappears silently, and at once: a stranger
	 * that connects and closes in a loop must not leave a connection behind each time. */
	if (c->state == TC_WAIT_REQUEST) {
		log_debug("tcp connection from %s dropped: %s", c->base.peer_addr, why);
		c->state = TC_CLOSED;
		c->deadline_ms = 0;
		tcp_conn_close_fd(c);
		tcp_conn_unlink(c);
		c->next = c->tx->dead;
		c->tx->dead = c;
		return;
	}
	c->state = TC_CLOSED;
	c->deadline_ms = 0;
	tcp_conn_close_fd(c);
	/* The cause first: an owner that detaches on it skips the flushed completions behind it. */
	ev = tcp_ev_push(c->tx, type, c);
	if (ev) {
		ev->status = status;
		ev->status_str = why;
	}
	tcp_conn_flush_wrs(c);
}

/* A peer broke the protocol: log what and where, close, and tell the owner. */
static void tcp_conn_protocol_error(struct tcp_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void tcp_conn_protocol_error(struct tcp_conn *c, const char *fmt, ...)
{
	char why[160];
	va_list ap;

	uint64_t dropped = 0;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	/* A stranger's junk makes one per connection: 3,000 junk connections wrote 2,594 lines. */
	if (log_ratelimit_ok(&c->tx->proto_log, util_now_ms(), &dropped)) {
		if (dropped)
			log_warn("tcp: %llu protocol errors were not logged (at most %u in %u s)",
				 (unsigned long long)dropped, c->tx->proto_log.burst, c->tx->proto_log.interval_ms / 1000);
		log_warn("tcp connection %s: protocol error: %s; closing it", c->base.peer_addr, why);
	}
	tcp_conn_fail(c, c->state == TC_ESTABLISHED ? XPORT_EV_DISCONNECTED : XPORT_EV_CONNECT_ERROR, -EPROTO,
		      "protocol error");
}

/* Queues a frame for the socket. A work request's payload (op set) of TCP_SEND_IN_PLACE_MIN bytes or
 * more stays where the caller posted it; anything else is copied. */
int tcp_queue(struct tcp_conn *c, const struct tcp_frame *f, const void *payload, enum xport_op op,
		     uint64_t wr_id)
{
	struct tcp_out *o;
	bool ext;

	if (c->state == TC_CLOSED || c->fd < 0)
		return -ENOTCONN;
	if (!payload && f->payload_len) /* a caller's bug: header-only frames pass NULL */
		return -EINVAL;
	ext = op && f->payload_len >= TCP_SEND_IN_PLACE_MIN;
	o = malloc(sizeof(*o) + TCP_FRAME_HDR_LEN + (ext ? 0 : f->payload_len));
	if (!o)
		return -ENOMEM;
	o->next = NULL;
	o->len = TCP_FRAME_HDR_LEN + f->payload_len;
	o->off = 0;
	o->wr_id = wr_id;
	o->op = op;
	o->ext = ext ? payload : NULL;
	tcp_frame_header(f, o->data);
	if (payload && !ext)
		memcpy(o->data + TCP_FRAME_HDR_LEN, payload, f->payload_len);
	c->out_bytes += o->len;
	if (c->out_tail)
		c->out_tail->next = o;
	else
		c->out_head = o;
	c->out_tail = o;
	return tcp_conn_watch(c);
}

/* The unwritten bytes of the queued frames from o on, as at most max pieces; returns the count. */
static int tcp_out_iov(const struct tcp_out *o, struct iovec *iov, int max)
{
	int n = 0;

	for (; o && n + 2 <= max; o = o->next) {
		size_t hdr = o->ext ? TCP_FRAME_HDR_LEN : o->len;

		if (o->off < hdr)
			iov[n++] = (struct iovec){.iov_base = (void *)(o->data + o->off), .iov_len = hdr - o->off};
		if (o->ext && o->len > hdr) {
			size_t done = o->off > hdr ? o->off - hdr : 0;

			iov[n++] = (struct iovec){.iov_base = (void *)(o->ext + done), .iov_len = o->len - hdr - done};
		}
	}
	return n;
}

/* Retires the head frame, fully written: a work request waits for the peer's ACK. False when the
 * connection failed (out of memory). */
static bool tcp_out_retire(struct tcp_conn *c)
{
	struct tcp_out *o = c->out_head;

	c->out_head = o->next;
	if (!c->out_head)
		c->out_tail = NULL;
	c->out_bytes -= o->len;
	if (o->op) {
		struct tcp_unacked *u = malloc(sizeof(*u));

		if (!u) {
			free(o);
			tcp_conn_fail(c, XPORT_EV_DISCONNECTED, -ENOMEM, "out of memory");
			return false;
		}
		u->next = NULL;
		u->wr_id = o->wr_id;
		u->op = o->op;
		u->len = (uint32_t)(o->len - TCP_FRAME_HDR_LEN);
		if (c->unacked_tail)
			c->unacked_tail->next = u;
		else
			c->unacked_head = u;
		c->unacked_tail = u;
		c->n_unacked++;
	}
	free(o);
	return true;
}

/* Writes what the socket takes, up to TCP_FLUSH_IOV pieces of the queued frames per system call;
 * raises send-side completions of frames fully written. */
void tcp_conn_flush(struct tcp_conn *c)
{
	while (c->out_head && c->fd >= 0) {
		struct iovec iov[TCP_FLUSH_IOV];
		struct msghdr mh = {.msg_iov = iov};
		size_t offered = 0, left;
		ssize_t n;

		mh.msg_iovlen = (size_t)tcp_out_iov(c->out_head, iov, TCP_FLUSH_IOV);
		for (size_t i = 0; i < mh.msg_iovlen; i++)
			offered += iov[i].iov_len;
		n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			if (errno == EINTR)
				continue;
			tcp_conn_fail(c, c->state == TC_ESTABLISHED ? XPORT_EV_DISCONNECTED : XPORT_EV_CONNECT_ERROR,
				      -errno, "send failed");
			return;
		}
		for (left = (size_t)n; left;) {
			struct tcp_out *o = c->out_head;
			size_t take = MIN(left, o->len - o->off);

			o->off += take;
			left -= take;
			if (o->off < o->len)
				break;
			if (!tcp_out_retire(c))
				return;
		}
		if ((size_t)n < offered)
			break; /* the socket is full */
	}
	if (c->out_waiting && c->out_bytes <= TCP_OUT_MAX / 2 && c->state == TC_ESTABLISHED) {
		/* The READ request that waited for room goes on. */
		c->out_waiting = false;
		c->in_blocked = false;
		c->kicked = true;
		tcp_wake(c->tx);
	}
	tcp_conn_watch(c);
}

struct tcp_mr *tcp_mr_find(struct tcp_xport *tx, uint32_t rkey)
{
	for (struct tcp_mr *m = tx->mrs; m; m = m->next)
		if (m->base.rkey == rkey)
			return m;
	return NULL;
}

/* The bytes [raddr, raddr + len) of region rkey with the access asked for, or NULL. */
static uint8_t *tcp_region(struct tcp_conn *c, uint32_t rkey, uint64_t raddr, uint32_t len, unsigned access,
			   const char *what)
{
	struct tcp_mr *m = tcp_mr_find(c->tx, rkey);
	uint64_t base;

	if (!m) {
		tcp_conn_protocol_error(c, "%s with unknown rkey 0x%x", what, rkey);
		return NULL;
	}
	if (m->scope != c->base.scope) {
		/* A key this peer was never given: another link's (as a QP of another PD on rdma). */
		tcp_conn_protocol_error(c, "%s with rkey 0x%x, which was given to another peer", what, rkey);
		return NULL;
	}
	if (!(m->access & access)) {
		tcp_conn_protocol_error(c, "%s to rkey 0x%x, which does not allow it", what, rkey);
		return NULL;
	}
	base = (uintptr_t)m->base.addr;
	if (raddr < base || raddr - base > m->base.len || len > m->base.len - (raddr - base)) {
		tcp_conn_protocol_error(c, "%s of %u bytes at 0x%llx outside rkey 0x%x [0x%llx, +%zu)", what, len,
					(unsigned long long)raddr, rkey, (unsigned long long)base, m->base.len);
		return NULL;
	}
	return (uint8_t *)(uintptr_t)raddr;
}

/* Whether the oldest posted receive takes a message of len bytes: 1, 0 when none is posted (wait),
 * -1 after a protocol error (too long). */
static int tcp_recv_fits(struct tcp_conn *c, uint32_t len)
{
	if (!c->recv_count)
		return 0;
	if (len > c->recvs[c->recv_head].len) {
		tcp_conn_protocol_error(c, "message of %u bytes for a receive of %u", len, c->recvs[c->recv_head].len);
		return -1;
	}
	return 1;
}

/* Takes the oldest posted receive for a message of len bytes; 0 if none is posted (wait). */
static int tcp_take_recv(struct tcp_conn *c, uint32_t len, struct tcp_recv *out)
{
	int ret = tcp_recv_fits(c, len);

	if (ret <= 0)
		return ret;
	*out = c->recvs[c->recv_head];
	c->recv_head = (c->recv_head + 1) % c->recv_cap;
	c->recv_count--;
	return 1;
}

/* The link to the outstanding read `id` of len bytes, or NULL after a protocol error. */
static struct tcp_read **tcp_read_find(struct tcp_conn *c, uint64_t id, uint32_t len)
{
	struct tcp_read **pp;

	for (pp = &c->reads; *pp && (*pp)->id != id; pp = &(*pp)->next)
		;
	if (!*pp || (*pp)->len != len) {
		tcp_conn_protocol_error(c, "READ response %llu of %u bytes matches no outstanding read",
					(unsigned long long)id, len);
		return NULL;
	}
	return pp;
}

static int tcp_send_ack(struct tcp_conn *c)
{
	struct tcp_frame f = {.type = TCP_F_ACK, .arg = c->acks_owed};
	int ret;

	if (!c->acks_owed)
		return 0;
	ret = tcp_queue(c, &f, NULL, 0, 0);
	if (!ret)
		c->acks_owed = 0;
	return ret;
}

/* A WRITE or WRITE_IMM whose payload is in its region: acknowledged, and a WRITE_IMM consumes
 * the receive its sender's immediate completes (checked to be there before the bytes were placed).
 * 1, or -1 after a protocol error. */
static int tcp_write_applied(struct tcp_conn *c, const struct tcp_frame *f)
{
	struct xport_event *ev;
	struct tcp_recv r;

	c->acks_owed++;
	if (f->type == TCP_F_WRITE)
		return 1;
	if (tcp_take_recv(c, 0, &r) <= 0)
		return -1;
	ev = tcp_ev_push(c->tx, XPORT_EV_COMPLETION, c);
	if (ev) {
		ev->op = XPORT_OP_RECV_IMM;
		ev->wr_id = r.wr_id;
		ev->byte_len = f->payload_len;
		ev->imm = f->arg;
		ev->has_imm = true;
	}
	return 1;
}

/* A WRITE or WRITE_IMM large enough to be received straight into its region. */
static bool tcp_placeable(const struct tcp_frame *f)
{
	return (f->type == TCP_F_WRITE || f->type == TCP_F_WRITE_IMM) && f->payload_len >= TCP_PLACE_MIN;
}

/* Direct placement: a large WRITE or WRITE_IMM whose header arrived and whose payload has not is
 * received straight into its region (as an RNIC places it), instead of through the input buffer
 * and a copy; have bytes of it, already buffered, are copied first. Only when it can be applied
 * now: its region checked, a WRITE_IMM's receive posted. Returns whether it started. */
static bool tcp_place_start(struct tcp_conn *c, const struct tcp_frame *f, const uint8_t *have, size_t have_len)
{
	uint8_t *dst;

	if (!tcp_placeable(f) || (f->type == TCP_F_WRITE_IMM && !c->recv_count))
		return false;
	dst = tcp_region(c, f->rkey, f->raddr, f->payload_len, XPORT_ACCESS_REMOTE_WRITE, "WRITE");
	if (!dst)
		return false;
	memcpy(dst, have, have_len);
	c->place = *f;
	c->place.payload = NULL;
	c->place_done = (uint32_t)have_len;
	c->placing = true;
	c->read_small = true;
	return true;
}

/* Where the rest of the frame being placed goes, and how much of it there is (*room). The region
 * is looked up again before every receive: its owner may have released it meanwhile (on rdma the
 * peer's write would then fail the QP; here the connection fails the same way, and nothing is
 * written). NULL after that protocol error. */
static uint8_t *tcp_place_space(struct tcp_conn *c, size_t *room)
{
	const struct tcp_frame *f = &c->place;
	uint8_t *dst = tcp_region(c, f->rkey, f->raddr, f->payload_len, XPORT_ACCESS_REMOTE_WRITE, "WRITE");

	if (!dst)
		return NULL;
	*room = f->payload_len - c->place_done;
	return dst + c->place_done;
}

/* n more bytes of the frame being placed arrived; once it is complete it is applied. */
static void tcp_placed(struct tcp_conn *c, size_t n)
{
	c->place_done += (uint32_t)n;
	if (c->place_done < c->place.payload_len)
		return;
	c->placing = false;
	if (tcp_write_applied(c, &c->place) > 0)
		tcp_conn_process(c); /* its ACK (nothing followed it into the buffer) */
}

/* The handshake's frames: CONNECT (a request for the owner), ACCEPT or REJECT of our dial. */
static int tcp_frame_connect(struct tcp_conn *c, const struct tcp_frame *f)
{
	struct xport_event *ev;

	if (c->state != TC_WAIT_REQUEST) {
		tcp_conn_protocol_error(c, "CONNECT in state %d", c->state);
		return -1;
	}
	c->state = TC_REQUESTED;
	c->deadline_ms = 0;
	ev = tcp_ev_push(c->tx, XPORT_EV_CONNECT_REQUEST, c);
	if (ev) {
		ev->pdata_len = (uint8_t)f->payload_len;
		memcpy(ev->pdata, f->payload, f->payload_len);
	}
	tcp_conn_watch(c);
	return 1;
}

static int tcp_frame_answer(struct tcp_conn *c, const struct tcp_frame *f)
{
	struct xport_event *ev;

	if (c->state != TC_WAIT_ACCEPT) {
		tcp_conn_protocol_error(c, "%s in state %d", f->type == TCP_F_ACCEPT ? "ACCEPT" : "REJECT", c->state);
		return -1;
	}
	c->deadline_ms = 0;
	if (f->type == TCP_F_ACCEPT) {
		c->state = TC_ESTABLISHED;
		ev = tcp_ev_push(c->tx, XPORT_EV_ESTABLISHED, c);
	} else {
		c->state = TC_CLOSED;
		tcp_conn_close_fd(c);
		ev = tcp_ev_push(c->tx, XPORT_EV_REJECTED, c);
		if (ev)
			ev->status = -ECONNREFUSED;
	}
	if (ev) {
		ev->pdata_len = (uint8_t)f->payload_len;
		memcpy(ev->pdata, f->payload, f->payload_len);
	}
	return f->type == TCP_F_ACCEPT ? 1 : -1;
}

/* The peer applied our oldest f->arg frames: their completions, in the order of the send queue. */
static int tcp_frame_ack(struct tcp_conn *c, const struct tcp_frame *f)
{
	if (c->state != TC_ESTABLISHED || f->arg == 0 || f->arg > c->n_unacked) {
		tcp_conn_protocol_error(c, "ACK of %u frames, %u outstanding", f->arg, c->n_unacked);
		return -1;
	}
	for (uint32_t i = 0; i < f->arg; i++) {
		struct tcp_unacked *u = c->unacked_head;

		c->unacked_head = u->next;
		if (!c->unacked_head)
			c->unacked_tail = NULL;
		c->n_unacked--;
		tcp_ev_completion(c, u->op, u->wr_id, u->len, 0, NULL);
		free(u);
	}
	return 1;
}

static int tcp_frame_send(struct tcp_conn *c, const struct tcp_frame *f)
{
	struct tcp_recv r;
	int ret = tcp_take_recv(c, f->payload_len, &r);

	if (ret <= 0)
		return ret;
	memcpy(r.buf, f->payload, f->payload_len);
	tcp_ev_completion(c, XPORT_OP_RECV, r.wr_id, f->payload_len, 0, NULL);
	c->acks_owed++;
	return 1;
}

static int tcp_frame_write(struct tcp_conn *c, const struct tcp_frame *f)
{
	uint8_t *dst;

	/* Check for a receive first: a WRITE_IMM that must wait is not applied twice. */
	if (f->type == TCP_F_WRITE_IMM && !c->recv_count)
		return 0;
	dst = tcp_region(c, f->rkey, f->raddr, f->payload_len, XPORT_ACCESS_REMOTE_WRITE, "WRITE");
	if (!dst)
		return -1;
	memcpy(dst, f->payload, f->payload_len);
	return tcp_write_applied(c, f);
}

static int tcp_frame_read_req(struct tcp_conn *c, const struct tcp_frame *f)
{
	struct tcp_frame resp = {.type = TCP_F_READ_RESP, .id = f->id, .payload_len = f->arg};
	uint8_t *src;

	if (c->out_bytes && c->out_bytes + TCP_FRAME_HDR_LEN + f->arg > TCP_OUT_MAX) {
		c->out_waiting = true; /* the requester does not read its responses: wait until they drain */
		return 0;
	}
	src = tcp_region(c, f->rkey, f->raddr, f->arg, XPORT_ACCESS_REMOTE_READ, "READ");
	if (!src)
		return -1;
	/* Earlier writes complete at the requester before this read does, as on RC. */
	if (tcp_send_ack(c) || tcp_queue(c, &resp, src, 0, 0)) {
		tcp_conn_fail(c, XPORT_EV_DISCONNECTED, -ENOMEM, "cannot queue a read response");
		return -1;
	}
	return 1;
}

static int tcp_frame_read_resp(struct tcp_conn *c, const struct tcp_frame *f)
{
	struct tcp_read **pp = tcp_read_find(c, f->id, f->payload_len), *rd;

	if (!pp)
		return -1;
	rd = *pp;
	*pp = rd->next;
	memcpy(rd->buf, f->payload, f->payload_len);
	tcp_ev_completion(c, XPORT_OP_READ, rd->wr_id, f->payload_len, 0, NULL);
	free(rd);
	return 1;
}

/* One whole frame: 1 read on, 0 it waits (no posted receive, or read responses to drain), -1 the
 * connection ended. Data frames only once the connection was accepted. */
static int tcp_conn_frame(struct tcp_conn *c, const struct tcp_frame *f)
{
	switch (f->type) {
	case TCP_F_CONNECT:
		return tcp_frame_connect(c, f);
	case TCP_F_ACCEPT:
	case TCP_F_REJECT:
		return tcp_frame_answer(c, f);
	case TCP_F_DISCONNECT:
		tcp_conn_fail(c, XPORT_EV_DISCONNECTED, -ECONNRESET, "peer disconnected");
		return -1;
	case TCP_F_ACK:
		return tcp_frame_ack(c, f);
	default:
		break;
	}
	if (c->state != TC_ESTABLISHED) {
		tcp_conn_protocol_error(c, "data frame type %u before the connection was accepted", f->type);
		return -1;
	}
	switch (f->type) {
	case TCP_F_SEND:
		return tcp_frame_send(c, f);
	case TCP_F_WRITE:
	case TCP_F_WRITE_IMM:
		return tcp_frame_write(c, f);
	case TCP_F_READ_REQ:
		return tcp_frame_read_req(c, f);
	case TCP_F_READ_RESP:
		return tcp_frame_read_resp(c, f);
	default:
		tcp_conn_protocol_error(c, "unexpected frame type %u", f->type);
		return -1;
	}
}

/* A frame whose header is in and whose payload is not yet: judged now, so that only a frame we will
 * take makes us buffer its payload (a stranger's header announcing 16 MiB costs us 32 bytes).
 * 1: read on, 0: it waits for a posted receive (stop reading), -1: the connection ended. */
static int tcp_conn_check_header(struct tcp_conn *c, const struct tcp_frame *f)
{
	if (f->type == TCP_F_CONNECT || f->type == TCP_F_ACCEPT || f->type == TCP_F_REJECT)
		return 1; /* at most 56 bytes (tcp_frame_peek); the state is checked when it is complete */
	if (c->state != TC_ESTABLISHED) {
		tcp_conn_protocol_error(c, "data frame type %u before the connection was accepted", f->type);
		return -1;
	}
	switch (f->type) {
	case TCP_F_SEND:
		return tcp_recv_fits(c, f->payload_len);
	case TCP_F_WRITE:
	case TCP_F_WRITE_IMM:
		return tcp_region(c, f->rkey, f->raddr, f->payload_len, XPORT_ACCESS_REMOTE_WRITE, "WRITE") ? 1 : -1;
	case TCP_F_READ_RESP:
		return tcp_read_find(c, f->id, f->payload_len) ? 1 : -1;
	default:
		return 1;
	}
}

/* Parses and handles the buffered input; stops when a frame must wait for a receive. */
void tcp_conn_process(struct tcp_conn *c)
{
	size_t off = 0;

	while (c->state != TC_CLOSED && c->state != TC_REQUESTED) {
		struct tcp_frame f;
		const char *why;
		long n = tcp_frame_parse(c->in + off, c->in_len - off, &f, &why);
		int r;

		if (n < 0) {
			tcp_conn_protocol_error(c, "%s", why);
			break;
		}
		if (n == 0) {
			if (tcp_frame_peek(c->in + off, c->in_len - off, &f, &why) == 1) {
				int ok = tcp_conn_check_header(c, &f);

				if (ok == 0)
					c->in_blocked = true;
				else if (ok == 1 && tcp_place_start(c, &f, c->in + off + TCP_FRAME_HDR_LEN,
								     c->in_len - off - TCP_FRAME_HDR_LEN))
					off = c->in_len; /* all of it was that frame's */
			}
			break;
		}
		c->read_small = tcp_placeable(&f);
		r = tcp_conn_frame(c, &f);
		if (r == 0) {
			c->in_blocked = true;
			break;
		}
		if (r < 0)
			break;
		off += (size_t)n;
	}
	if (off) {
		memmove(c->in, c->in + off, c->in_len - off);
		c->in_len -= off;
	}
	if (c->state == TC_ESTABLISHED && c->acks_owed) {
		if (tcp_send_ack(c)) {
			tcp_conn_fail(c, XPORT_EV_DISCONNECTED, -ENOMEM, "cannot queue an ACK");
			return;
		}
		tcp_conn_flush(c);
	}
	tcp_conn_watch(c);
}

/* Where the next input goes in the buffer, grown as needed, and how much may come (*room); NULL
 * when the connection failed. */
static uint8_t *tcp_in_space(struct tcp_conn *c, size_t *room)
{
	size_t hs_max = c->state == TC_WAIT_ACCEPT ? TCP_DIAL_HANDSHAKE_MAX : TCP_HANDSHAKE_MAX;

	if (c->state != TC_ESTABLISHED) {
		/* Not accepted yet: one CONNECT (or ACCEPT) frame is all we hold for it. */
		if (c->in_len >= hs_max) {
			tcp_conn_protocol_error(c, "more than a handshake frame before the connection was accepted");
			return NULL;
		}
		if (c->in_cap < hs_max) {
			uint8_t *p = realloc(c->in, hs_max);

			if (!p) {
				tcp_conn_fail(c, XPORT_EV_CONNECT_ERROR, -ENOMEM, "out of memory");
				return NULL;
			}
			c->in = p;
			c->in_cap = hs_max;
		}
	} else if (c->in_cap - c->in_len < TCP_READ_CHUNK) {
		/* Room for the frame being assembled, at most one maximal frame. */
		size_t nc = c->in_len + TCP_READ_CHUNK;
		uint8_t *p;

		if (nc > TCP_FRAME_HDR_LEN + TCP_FRAME_PAYLOAD_MAX + TCP_READ_CHUNK) {
			tcp_conn_protocol_error(c, "input buffer overflow");
			return NULL;
		}
		p = realloc(c->in, nc);
		if (!p) {
			tcp_conn_fail(c, XPORT_EV_DISCONNECTED, -ENOMEM, "out of memory");
			return NULL;
		}
		c->in = p;
		c->in_cap = nc;
	}
	*room = c->state == TC_ESTABLISHED ? c->in_cap - c->in_len : hs_max - c->in_len;
	/* After a large WRITE the next is likely large too: a short read takes its header (and the
	 * small frames before it) without swallowing its payload, which is then placed. */
	if (c->read_small)
		*room = MIN(*room, (size_t)TCP_PLACE_READ);
	return c->in + c->in_len;
}

void tcp_conn_readable(struct tcp_conn *c)
{
	for (int rounds = 0; rounds < 16 && c->state != TC_CLOSED && !c->in_blocked && c->state != TC_REQUESTED;
	     rounds++) {
		bool placing = c->placing;
		size_t room;
		uint8_t *dst = placing ? tcp_place_space(c, &room) : tcp_in_space(c, &room);
		ssize_t n;

		if (!dst)
			return;
		n = recv(c->fd, dst, room, MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			tcp_conn_fail(c, c->state == TC_ESTABLISHED ? XPORT_EV_DISCONNECTED : XPORT_EV_CONNECT_ERROR,
				      n == 0 ? -ECONNRESET : -errno, n == 0 ? "peer closed the connection" : "recv failed");
			return;
		}
		if (placing) {
			tcp_placed(c, (size_t)n);
			continue;
		}
		c->in_len += (size_t)n;
		tcp_conn_process(c);
		/* A complete buffer is handled: shrink a large one back after a big frame. */
		if (c->in_len == 0 && c->in_cap > 4 * TCP_READ_CHUNK) {
			free(c->in);
			c->in = NULL;
			c->in_cap = 0;
		}
	}
}

void tcp_conn_writable(struct tcp_conn *c)
{
	if (c->state == TC_CONNECTING) {
		int err = 0;
		socklen_t el = sizeof(err);
		struct tcp_frame f = {.type = TCP_F_CONNECT, .payload_len = c->pdata_len};

		getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
		if (err) {
			tcp_conn_fail(c, XPORT_EV_CONNECT_ERROR, -err, "tcp connect failed");
			return;
		}
		c->state = TC_WAIT_ACCEPT;
		if (tcp_queue(c, &f, c->pdata, 0, 0)) {
			tcp_conn_fail(c, XPORT_EV_CONNECT_ERROR, -ENOMEM, "cannot queue CONNECT");
			return;
		}
	}
	tcp_conn_flush(c);
}
