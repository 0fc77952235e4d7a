/*
 * What tcp.c (the provider's ops) and tcp_conn.c (a connection's plumbing) share.
 */
#ifndef MESH_TRANSPORT_TCP_INTERNAL_H
#define MESH_TRANSPORT_TCP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "log.h"
#include "tcp_wire.h"
#include "transport.h"

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

static inline struct tcp_xport *to_tx(xport_t *x)
{
	return (struct tcp_xport *)x;
}

static inline struct tcp_conn *to_tc(xport_conn_t *c)
{
	return (struct tcp_conn *)c;
}

/* tcp_conn.c */
void tcp_wake(struct tcp_xport *tx);
struct xport_event *tcp_ev_push(struct tcp_xport *tx, enum xport_ev_type type, struct tcp_conn *c);
int tcp_conn_watch(struct tcp_conn *c);
void tcp_timer_update(struct tcp_xport *tx);
struct tcp_conn *tcp_conn_new(struct tcp_xport *tx, int fd);
void tcp_conn_unlink(struct tcp_conn *c);
void tcp_conn_close_fd(struct tcp_conn *c);
void tcp_conn_fail(struct tcp_conn *c, enum xport_ev_type type, int status, const char *why);
int tcp_queue(struct tcp_conn *c, const struct tcp_frame *f, const void *payload, enum xport_op op,
		     uint64_t wr_id);
void tcp_conn_flush(struct tcp_conn *c);
struct tcp_mr *tcp_mr_find(struct tcp_xport *tx, uint32_t rkey);
void tcp_conn_process(struct tcp_conn *c);
void tcp_conn_readable(struct tcp_conn *c);
void tcp_conn_writable(struct tcp_conn *c);

#endif
