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
#include "tcp_wire.h"
#include "transport.h"
#include "util.h"

#define TCP_READ_CHUNK (256u << 10)
#define TCP_TICK_MS 100
#define TCP_ACCEPT_PAUSE_MS 100 /* out of descriptors: the listener rests this long */
#define TCP_LISTEN_BACKLOG 256
/* What a connection may make us buffer before it is accepted: one CONNECT frame (a stranger's), or
 * on our own dial one ACCEPT frame (the acceptor's proof makes it longer). */
#define TCP_HANDSHAKE_MAX (TCP_FRAME_HDR_LEN + TCP_FRAME_PDATA_MAX)
#define TCP_DIAL_HANDSHAKE_MAX (TCP_FRAME_HDR_LEN + TCP_FRAME_ACCEPT_PDATA_MAX)
_Static_assert(TCP_FRAME_PDATA_MAX == XPORT_CONNECT_PDATA_MAX && TCP_FRAME_ACCEPT_PDATA_MAX == XPORT_PDATA_MAX,
	       "tcp frames and the transport disagree on private data sizes");
/* Connections that have not said who they are yet (no CONNECT): in all, and from one address. A
 * real node's QPs pass this state in microseconds; a stranger holding sockets open is capped
 * (sshd's MaxStartups is the same idea) and dropped at connect_timeout_ms. Strangers may fill the
 * cap but cannot keep a node out: a newcomer from a node's address takes the oldest stranger's
 * place (tcp_too_many_pending). */
#define TCP_PENDING_MAX 256u
#define TCP_PENDING_PER_SOURCE 64u
/* READ responses queued for the socket: beyond this the requester's further input waits until
 * they drain (an RC responder has a bounded number of reads in flight too). */
#define TCP_OUT_MAX (32u << 20)
/* Payloads from this size on are written to the socket from where they were posted, not copied
 * into the frame first (with the receiver's two copies, design.md "tcp provider": 7% of the
 * machine's samples at 64 KiB); smaller ones are copied, so a small frame stays one piece. */
#define TCP_SEND_IN_PLACE_MIN 1024u
/* WRITE payloads from this size on are received straight into their region once their header
 * is in (tcp_place_start); input is then read this much at a time until a small frame comes. */
#define TCP_PLACE_MIN 8192u
#define TCP_PLACE_READ 4096u
#define TCP_FLUSH_IOV 64 /* pieces per sendmsg: 32 frames with their payloads in place at least */

enum tcp_conn_state {
	TC_CONNECTING,   /* active: TCP connect in progress */
	TC_WAIT_ACCEPT,  /* active: CONNECT sent */
	TC_WAIT_REQUEST, /* passive: waiting for the CONNECT frame */
	TC_REQUESTED,    /* passive: CONNECT_REQUEST raised, owner decides */
	TC_ESTABLISHED,
	TC_CLOSED, /* socket closed; DISCONNECTED or a failure was raised */
};

struct tcp_out {
	struct tcp_out *next;
	size_t len, off; /* of header and payload together */
	uint64_t wr_id;
	enum xport_op op; /* completion to raise once written; 0 = none */
	/* A large payload is sent from the caller's registered memory, which verbs' rules keep
	 * unchanged until the completion (as the NIC reads it then): data holds the header alone. */
	const uint8_t *ext;
	uint8_t data[]; /* header (+ payload when copied) */
};

/* A SEND/WRITE/WRITE_IMM written to the socket, waiting for the peer's ACK. */
struct tcp_unacked {
	struct tcp_unacked *next;
	uint64_t wr_id;
	enum xport_op op;
	uint32_t len;
};

struct tcp_recv {
	void *buf;
	uint32_t len;
	uint64_t wr_id;
};

struct tcp_read {
	struct tcp_read *next;
	uint64_t id;
	void *buf;
	uint32_t len;
	uint64_t wr_id;
};

struct tcp_xport;

struct tcp_conn {
	struct xport_conn base;
	struct tcp_xport *tx;
	struct tcp_conn *prev, *next;
	int fd;
	enum tcp_conn_state state;
	uint64_t deadline_ms; /* connect / request deadline */
	uint32_t ev_mask;     /* EPOLLIN/EPOLLOUT currently asked for */
	bool in_blocked;      /* a SEND waits for a posted receive, or a READ request for output room */
	bool out_waiting;     /* that READ request: flushing below TCP_OUT_MAX / 2 lets it go on */
	bool kicked;          /* buffered input to process in the next poll */
	bool placing;         /* receiving the payload of `place` straight into its region */
	bool read_small;      /* the last frame was a large WRITE: read TCP_PLACE_READ at a time */
	bool from_node;       /* passive: it comes from one of attr.node_addrs */
	struct tcp_frame place;
	uint32_t place_done;
	/* input */
	uint8_t *in;
	size_t in_len, in_cap;
	/* output */
	struct tcp_out *out_head, *out_tail;
	size_t out_bytes; /* queued, not written yet */
	struct tcp_unacked *unacked_head, *unacked_tail;
	uint32_t n_unacked;
	uint32_t acks_owed; /* frames we applied and have not acknowledged yet */
	/* Work requests posted (SEND, WRITE, WRITE_IMM, READ) whose completion is not raised yet: what
	 * max_send_wr bounds, as a send queue would. ACK and READ_RESP frames of our own are not work
	 * requests and do not count, or a peer writing to us while our output is stuck could make a
	 * post fail. */
	uint32_t sq_wrs;
	/* posted receives (FIFO ring) */
	struct tcp_recv *recvs;
	uint32_t recv_head, recv_count, recv_cap;
	/* outstanding READs */
	struct tcp_read *reads;
	uint64_t next_read_id;
	uint8_t pdata_len;
	uint8_t pdata[XPORT_PDATA_MAX];
};

struct tcp_mr {
	struct xport_mr base;
	unsigned access;
	const void *scope; /* only connections of this scope may reach it (xport_conn.scope) */
	struct tcp_mr *next;
};

struct tcp_xport {
	struct xport base;
	struct xport_attr attr;
	int epfd, lfd, evfd, tfd;
	/* Out of descriptors (EMFILE, ENFILE) the listener stays readable: it leaves the epoll set
	 * until this time instead of waking the loop without end. 0: watched. */
	uint64_t accept_paused_until;
	uint64_t accept_pauses; /* logged on the first and every 100th */
	uint64_t pending_refused; /* connections closed at once: too many not past CONNECT */
	uint64_t pending_evicted; /* strangers' connections closed to make room for a node's */
	uint8_t (*node_addrs)[16]; /* attr.node_addrs, as util_addr_bytes gives them */
	uint32_t n_node_addrs;
	struct log_ratelimit pending_log;
	struct log_ratelimit proto_log; /* protocol errors: strangers choose how many (tcp_conn_protocol_error) */
	char listen_addr[XPORT_ADDR_MAX];
	bool timer_on;
	struct tcp_conn *conns;
	/* Connections that ended before their CONNECT: off conns at once, freed at the end of the poll
	 * that ended them (an event of that poll's epoll batch may still name one). Nobody else knows
	 * them, so nothing else waits for them. */
	struct tcp_conn *dead;
	struct tcp_mr *mrs;
	/* event queue (ring) */
	struct xport_event *q;
	size_t q_head, q_len, q_cap;
};

static struct tcp_xport *to_tx(xport_t *x)
{
	return (struct tcp_xport *)x;
}

static struct tcp_conn *to_tc(xport_conn_t *c)
{
	return (struct tcp_conn *)c;
}

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

/* ---- event queue ---- */

/* Makes the provider's fd readable so the owner calls poll(). */
static void tcp_wake(struct tcp_xport *tx)
{
	uint64_t one = 1;

	if (write(tx->evfd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn("eventfd write: %m");
}

static struct xport_event *tcp_ev_push(struct tcp_xport *tx, enum xport_ev_type type, struct tcp_conn *c)
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

static int tcp_conn_watch(struct tcp_conn *c)
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

static void tcp_timer_update(struct tcp_xport *tx)
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

static struct tcp_conn *tcp_conn_new(struct tcp_xport *tx, int fd)
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

static void tcp_conn_unlink(struct tcp_conn *c)
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

static void tcp_conn_close_fd(struct tcp_conn *c)
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
static void tcp_conn_fail(struct tcp_conn *c, enum xport_ev_type type, int status, const char *why)
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
static int tcp_queue(struct tcp_conn *c, const struct tcp_frame *f, const void *payload, enum xport_op op,
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
static void tcp_conn_flush(struct tcp_conn *c)
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

static struct tcp_mr *tcp_mr_find(struct tcp_xport *tx, uint32_t rkey)
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

static void tcp_conn_process(struct tcp_conn *c);

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

/* Handles one complete frame; returns 1 when consumed, 0 when it must wait (no receive posted),
 * -1 when the connection ended. */
static int tcp_conn_frame(struct tcp_conn *c, const struct tcp_frame *f)
{
	struct tcp_xport *tx = c->tx;
	struct xport_event *ev;
	struct tcp_recv r;
	uint8_t *dst;
	int ret;

	switch (f->type) {
	case TCP_F_CONNECT:
		if (c->state != TC_WAIT_REQUEST) {
			tcp_conn_protocol_error(c, "CONNECT in state %d", c->state);
			return -1;
		}
		c->state = TC_REQUESTED;
		c->deadline_ms = 0;
		ev = tcp_ev_push(tx, XPORT_EV_CONNECT_REQUEST, c);
		if (ev) {
			ev->pdata_len = (uint8_t)f->payload_len;
			memcpy(ev->pdata, f->payload, f->payload_len);
		}
		tcp_conn_watch(c);
		return 1;
	case TCP_F_ACCEPT:
	case TCP_F_REJECT:
		if (c->state != TC_WAIT_ACCEPT) {
			tcp_conn_protocol_error(c, "%s in state %d", f->type == TCP_F_ACCEPT ? "ACCEPT" : "REJECT",
						c->state);
			return -1;
		}
		c->deadline_ms = 0;
		if (f->type == TCP_F_ACCEPT) {
			c->state = TC_ESTABLISHED;
			ev = tcp_ev_push(tx, XPORT_EV_ESTABLISHED, c);
		} else {
			c->state = TC_CLOSED;
			tcp_conn_close_fd(c);
			ev = tcp_ev_push(tx, XPORT_EV_REJECTED, c);
			if (ev)
				ev->status = -ECONNREFUSED;
		}
		if (ev) {
			ev->pdata_len = (uint8_t)f->payload_len;
			memcpy(ev->pdata, f->payload, f->payload_len);
		}
		return f->type == TCP_F_ACCEPT ? 1 : -1;
	case TCP_F_DISCONNECT:
		tcp_conn_fail(c, XPORT_EV_DISCONNECTED, -ECONNRESET, "peer disconnected");
		return -1;
	case TCP_F_ACK:
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
	default:
		break;
	}
	if (c->state != TC_ESTABLISHED) {
		tcp_conn_protocol_error(c, "data frame type %u before the connection was accepted", f->type);
		return -1;
	}
	switch (f->type) {
	case TCP_F_SEND:
		ret = tcp_take_recv(c, f->payload_len, &r);
		if (ret <= 0)
			return ret;
		memcpy(r.buf, f->payload, f->payload_len);
		tcp_ev_completion(c, XPORT_OP_RECV, r.wr_id, f->payload_len, 0, NULL);
		c->acks_owed++;
		return 1;
	case TCP_F_WRITE:
	case TCP_F_WRITE_IMM:
		/* Check for a receive first: a WRITE_IMM that must wait is not applied twice. */
		if (f->type == TCP_F_WRITE_IMM && !c->recv_count)
			return 0;
		dst = tcp_region(c, f->rkey, f->raddr, f->payload_len, XPORT_ACCESS_REMOTE_WRITE, "WRITE");
		if (!dst)
			return -1;
		memcpy(dst, f->payload, f->payload_len);
		return tcp_write_applied(c, f);
	case TCP_F_READ_REQ: {
		struct tcp_frame resp = {.type = TCP_F_READ_RESP, .id = f->id, .payload_len = f->arg};

		if (c->out_bytes && c->out_bytes + TCP_FRAME_HDR_LEN + f->arg > TCP_OUT_MAX) {
			c->out_waiting = true; /* the requester does not read its responses: wait until they drain */
			return 0;
		}
		dst = tcp_region(c, f->rkey, f->raddr, f->arg, XPORT_ACCESS_REMOTE_READ, "READ");
		if (!dst)
			return -1;
		/* Earlier writes complete at the requester before this read does, as on RC. */
		if (tcp_send_ack(c) || tcp_queue(c, &resp, dst, 0, 0)) {
			tcp_conn_fail(c, XPORT_EV_DISCONNECTED, -ENOMEM, "cannot queue a read response");
			return -1;
		}
		return 1;
	}
	case TCP_F_READ_RESP: {
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
static void tcp_conn_process(struct tcp_conn *c)
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

static void tcp_conn_readable(struct tcp_conn *c)
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

static void tcp_conn_writable(struct tcp_conn *c)
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
