/*
 * A fake transport for the unit tests: implements every slot of struct xport_ops, never touches the
 * network, and records what its owner asked for (connects and their private data, accepts,
 * rejects, disconnects, posted work requests, registrations), so a test can play the peer.
 *
 * Records are values: they stay readable after the connection they name was destroyed (compare
 * conn_id, never dereference a recorded conn pointer after mesh_reap()).
 */
#ifndef MESH_TESTS_FAKE_XPORT_H
#define MESH_TESTS_FAKE_XPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define FAKE_MAX_RECS 256
#define FAKE_MAX_POSTS 4096
#define FAKE_MAX_EVENTS 64
#define FAKE_SEND_COPY 1024 /* bytes of a SEND's payload kept in its record (MESH_PEER_MSG_MAX) */

struct fake_xport;

struct fake_conn {
	xport_conn_t base; /* first: the owner sees an xport_conn_t */
	struct fake_xport *fx;
	unsigned id;  /* creation order, from 1 */
	bool passive; /* made by fake_conn_incoming(), not by connect */
	int disconnects;
	bool accepted, rejected;
	struct fake_conn *next, *prev; /* live connections */
};

struct fake_mr {
	xport_mr_t base;
	struct fake_xport *fx;
	unsigned access;
	unsigned id;
};

/* connect / accept / reject */
struct fake_cm_rec {
	struct fake_conn *conn; /* may dangle after mesh_reap(): use conn_id */
	unsigned conn_id;
	uint32_t index;
	void *ctx;
	char addr[XPORT_ADDR_MAX];
	char src_addr[XPORT_ADDR_MAX];
	uint16_t port;
	uint8_t pdata[XPORT_PDATA_MAX];
	size_t pdata_len;
};

struct fake_post {
	enum xport_op op;
	struct fake_conn *conn; /* may dangle after mesh_reap(): use conn_id */
	unsigned conn_id;
	xport_mr_t *mr;
	void *buf; /* local buffer (source of SEND/WRITE, target of RECV/READ) */
	uint32_t len;
	uint64_t raddr;
	uint32_t rkey;
	uint32_t imm;
	uint64_t wr_id;
	bool used; /* a test consumed it (e.g. filled a receive, completed a send) */
	/* SEND: the payload as it was posted (the owner may reuse buf once the send completed) */
	uint8_t sent[FAKE_SEND_COPY];
};

struct fake_reg {
	void *addr;
	size_t len;
	unsigned access;
	uint32_t lkey, rkey;
	unsigned conn_id;
	const void *scope; /* the connection's protection scope at the registration */
	bool gone;         /* deregistered */
};

struct fake_fail {
	int err; /* negative errno; 0: no failure armed */
	unsigned skip;
};

struct fake_xport {
	xport_t base; /* first */
	struct xport_attr attr;
	char listen_addr[XPORT_ADDR_MAX];
	uint16_t listen_port;
	unsigned next_conn_id, next_mr_id;

	/* Live objects: both must be 0 after the owner cleaned up. */
	int live_conns;
	int live_mrs;
	struct fake_conn *conns; /* list of live connections */

	struct fake_cm_rec connects[FAKE_MAX_RECS];
	size_t n_connects;
	struct fake_cm_rec accepts[FAKE_MAX_RECS];
	size_t n_accepts;
	struct fake_cm_rec rejects[FAKE_MAX_RECS];
	size_t n_rejects;
	unsigned disconnects[FAKE_MAX_RECS]; /* conn ids, in order */
	size_t n_disconnects;
	struct fake_post posts[FAKE_MAX_POSTS];
	size_t n_posts;
	struct fake_reg regs[FAKE_MAX_RECS];
	size_t n_regs;
	size_t n_deregs;

	/* Failure injection: the call of that kind after `skip` successful ones returns err (once). */
	struct fake_fail fail_connect;
	struct fake_fail fail_mr_reg;
	struct fake_fail fail_post_send;
	struct fake_fail fail_post_write; /* WRITE_WITH_IMM */
	/* xport_path answers (device "fake0", port 1) when set, else -EOPNOTSUPP as the tcp provider */
	bool path_ok;
	/* with path_ok: the tcp provider's path instead (10.0.0.1 to 10.0.0.2) */
	bool path_tcp;
	struct fake_fail fail_post_plain_write; /* WRITE without immediate (direct pairs, keepalives) */
	struct fake_fail fail_post_recv;
	struct fake_fail fail_accept;

	/* Events handed out by poll(), in order. */
	struct xport_event queue[FAKE_MAX_EVENTS];
	size_t q_head, q_tail;
};

extern const struct xport_ops fake_xport_ops;

/* Creates the fake with default attributes; never fails short of memory (asserts instead). */
struct fake_xport *fake_xport_new(void);
/* Frees the fake and every connection still alive (a test checks live_conns first). */
void fake_xport_free(struct fake_xport *fx);

/* A passive connection as a CONNECT_REQUEST carries it (ctx NULL, not yet accepted). */
struct fake_conn *fake_conn_incoming(struct fake_xport *fx, const char *peer_addr);

/* Queues an event for poll(). */
void fake_xport_push(struct fake_xport *fx, const struct xport_event *ev);

/* The live connection with this id, or NULL if it was destroyed. */
struct fake_conn *fake_conn_by_id(struct fake_xport *fx, unsigned id);

/* The i-th post (0-based) of this op on this connection since post index `from`, or NULL. */
struct fake_post *fake_post_find(struct fake_xport *fx, size_t from, enum xport_op op, unsigned conn_id,
				 size_t nth);
/* Number of posts of op since index `from` (conn_id 0: any connection). */
size_t fake_post_count(struct fake_xport *fx, size_t from, enum xport_op op, unsigned conn_id);
/* The registration with exactly these access flags, latest first; NULL if none. */
const struct fake_reg *fake_reg_find(const struct fake_xport *fx, unsigned access);
/* Whether conn_id was disconnected. */
bool fake_disconnected(const struct fake_xport *fx, unsigned conn_id);

#endif
