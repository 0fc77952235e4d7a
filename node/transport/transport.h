/*
 * The transport layer: an RC-like interface small enough for two providers (rdma now, tcp next)
 * and large enough that link and channel code is written once. meshd reaches a provider only
 * through the const ops table below; nothing above this header knows which provider runs.
 *
 * Model: a provider instance (xport_t) owns one pollable fd. When it is readable the owner calls
 * xport_poll() until it returns fewer events than asked for; events are connection events
 * (requests, established, failures, disconnects) and work completions. A connection (xport_conn_t)
 * is one RC queue pair. Private data travels with connect and reject, at most
 * XPORT_CONNECT_PDATA_MAX bytes (an IB CM REQ's room after rdma_cm's header), and with accept, at
 * most XPORT_PDATA_MAX (an IB CM REP has 196 bytes).
 *
 * Lifetime: events returned by one poll may refer to a connection that the owner destroys while
 * handling an earlier event of the same batch. The owner therefore detaches a connection
 * (conn->ctx = NULL) and destroys it only after the batch; events whose conn->ctx is NULL are to be
 * skipped. After xport_conn_destroy() no further event refers to that connection.
 *
 * Errors: 0 or a count on success, a negative errno on failure.
 */
#ifndef MESH_TRANSPORT_H
#define MESH_TRANSPORT_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define XPORT_PDATA_MAX 96         /* accept; also what a connection event carries */
#define XPORT_CONNECT_PDATA_MAX 56 /* connect, reject */
#define XPORT_ADDR_MAX 64

typedef struct xport xport_t;
typedef struct xport_conn xport_conn_t;
typedef struct xport_mr xport_mr_t;
struct xport_ops;

/* Base structs: providers embed them first and keep their state after. */
struct xport {
	const struct xport_ops *ops;
};

struct xport_conn {
	xport_t *xport;
	void *ctx;      /* owner's pointer; NULL marks a detached connection */
	/* Protection scope: memory registered through this connection is reachable only by the peers
	 * of connections of the same scope (on rdma a protection domain per scope and device, in the
	 * tcp provider a registration table per scope), so a key given to one peer is worthless on
	 * another's connections. connect sets it to ctx; for an incoming request the owner sets it
	 * before admit. */
	const void *scope;
	uint32_t index; /* owner's index (e.g. QP number within a link) */
	char peer_addr[XPORT_ADDR_MAX];
};

enum xport_access {
	XPORT_ACCESS_LOCAL = 1 << 0,        /* local write (receive buffers, read targets) */
	XPORT_ACCESS_REMOTE_WRITE = 1 << 1,
	XPORT_ACCESS_REMOTE_READ = 1 << 2,
};

struct xport_mr {
	xport_t *xport; /* the provider that registered it */
	void *addr;
	size_t len;
	uint32_t lkey;
	uint32_t rkey;
};

enum xport_ev_type {
	XPORT_EV_CONNECT_REQUEST = 1, /* passive side: new conn (QP ready for post_recv), pdata */
	XPORT_EV_ESTABLISHED,         /* conn connected; active side gets the accept's pdata */
	XPORT_EV_REJECTED,            /* active side: peer rejected (pdata may hold a reason) */
	XPORT_EV_CONNECT_ERROR,       /* active or passive: could not connect; status says why */
	XPORT_EV_DISCONNECTED,        /* the connection is gone (peer closed, error, device removed) */
	XPORT_EV_COMPLETION,          /* a posted work request finished */
};

enum xport_op {
	XPORT_OP_SEND = 1,
	XPORT_OP_RECV,
	XPORT_OP_WRITE,
	XPORT_OP_WRITE_IMM, /* names a post only: its completion at the requester reports XPORT_OP_WRITE,
			     * as verbs does (IBV_WC_RDMA_WRITE) */
	XPORT_OP_READ,
	XPORT_OP_RECV_IMM, /* the receive side of a WRITE_WITH_IMM */
};

struct xport_event {
	enum xport_ev_type type;
	xport_conn_t *conn;
	int status; /* 0 or negative errno; completions: -EIO with wc_status set */
	/* connection events */
	uint8_t pdata_len;
	uint8_t pdata[XPORT_PDATA_MAX];
	/* completions */
	enum xport_op op;
	uint64_t wr_id;
	uint32_t byte_len;
	uint32_t imm;
	bool has_imm;
	int wc_status;          /* provider's status code when status != 0 (ibv_wc_status) */
	const char *status_str; /* static text for logs */
};

struct xport_attr {
	uint32_t connect_timeout_ms; /* address/route resolution */
	uint32_t max_send_wr;
	uint32_t max_recv_wr;
	/* rdma: the RC ACK timeout of every QP, as the exponent n of 4.096 us * 2^n (the time before
	 * the NIC sends a lost packet again); 0: rdma_cm's default (0.54 s for RoCE). */
	uint8_t ack_timeout;
	/* The other nodes' addresses (numeric hosts, every rail): a provider that caps the connections
	 * not past their CONNECT yet keeps room for these, so strangers cannot keep a real node out
	 * (tcp). create copies them; NULL and 0: none known. */
	const char *const *node_addrs;
	uint32_t n_node_addrs;
};

/* The path of a connected RDMA QP (xport_ops.path): what a QP of another process, on the same
 * device and port, needs to reach the same peer (proto/ring.h's AQ area). Over tcp (kind
 * XPORT_PATH_TCP) only the two addresses: another process's own connection between them takes
 * the same route. */
enum xport_path_kind { XPORT_PATH_RDMA, XPORT_PATH_TCP };
struct xport_path {
	enum xport_path_kind kind;
	int family;         /* XPORT_PATH_TCP: AF_INET or AF_INET6 */
	uint8_t local[16];  /* XPORT_PATH_TCP: our address and the peer's, in network order */
	uint8_t peer[16];
	char dev[32];      /* the device, NUL-terminated */
	uint8_t port;      /* its port number */
	uint8_t sgid_index;
	uint8_t path_mtu;  /* enum ibv_mtu */
	uint8_t hop_limit;
	uint8_t traffic_class;
	uint8_t ack_timeout; /* as struct xport_attr's */
	uint8_t dgid[16];  /* the peer's GID */
};

struct xport_ops {
	const char *name;
	/* 1 if this provider can serve the local address addr (rdma: an RDMA device has it), else 0. */
	int (*probe)(const char *addr);
	int (*create)(const struct xport_attr *attr, xport_t **out);
	void (*destroy)(xport_t *x);
	int (*event_fd)(xport_t *x);
	/* A bind that fails (-EADDRNOTAVAIL, -EADDRINUSE, -ENODEV) is returned, not logged: the caller
	 * knows which node and file line the address came from. */
	int (*listen)(xport_t *x, const char *addr, uint16_t port);
	/* Starts an asynchronous connect from src_addr to addr:port; ESTABLISHED/REJECTED/
	 * CONNECT_ERROR follows. */
	int (*connect)(xport_t *x, const char *src_addr, const char *addr, uint16_t port,
		       const void *pdata, size_t pdata_len, void *ctx, uint32_t index, xport_conn_t **out);
	/* Optional: readies an incoming request for accept (rdma: creates its CQ and QP). Called once
	 * the owner judged the request's private data, before it registers memory on the connection or
	 * posts receives: a request that is rejected never costs a QP. */
	int (*admit)(xport_conn_t *c);
	int (*accept)(xport_conn_t *c, const void *pdata, size_t pdata_len);
	int (*reject)(xport_conn_t *c, const void *pdata, size_t pdata_len);
	int (*disconnect)(xport_conn_t *c);
	void (*conn_destroy)(xport_conn_t *c);
	/* Registers memory on the connection's device and scope; valid for every conn of both. */
	int (*mr_reg)(xport_conn_t *c, void *addr, size_t len, unsigned access, xport_mr_t **out);
	void (*mr_dereg)(xport_mr_t *mr);
	int (*post_send)(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len, uint64_t wr_id);
	/* len 0 (buf and mr may be NULL): a receive only for the immediate of a WRITE_WITH_IMM. */
	int (*post_recv)(xport_conn_t *c, xport_mr_t *mr, void *buf, uint32_t len, uint64_t wr_id);
	int (*post_write)(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len, uint64_t raddr,
			  uint32_t rkey, uint64_t wr_id);
	int (*post_write_imm)(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len, uint64_t raddr,
			      uint32_t rkey, uint32_t imm, uint64_t wr_id);
	int (*post_read)(xport_conn_t *c, xport_mr_t *mr, void *buf, uint32_t len, uint64_t raddr, uint32_t rkey,
			 uint64_t wr_id);
	/* Fills up to max events; returns the count (0: nothing pending) or a negative errno. */
	int (*poll)(xport_t *x, struct xport_event *evs, int max);
	/* Optional, for busy polling: looks into every connection's completion queue instead of
	 * waiting for a notification to say which ones have something, and may leave everything else
	 * (connection events, notifications) to poll, which the owner calls whenever event_fd is
	 * readable. Meant to cost no system call. NULL: poll. */
	int (*poll_all)(xport_t *x, struct xport_event *evs, int max);
	/* The device serving the listening address: the RDMA device (rxe0, mlx5_0) or the network
	 * interface (tcp). 0, or -ENODEV before listen or when none is known. */
	int (*device)(xport_t *x, char *name, size_t len);
	/* Optional: the owner stops busy polling and will sleep on event_fd; notifications poll_all
	 * left unarmed are armed again. The owner calls poll_all once more afterwards. */
	void (*arm)(xport_t *x);
	/* Optional: the path of a connected conn's QP (struct xport_path); NULL: none. */
	int (*path)(xport_conn_t *c, struct xport_path *out);
	/* Optional: the other nodes' addresses changed (a reload), as xport_attr.node_addrs (copied).
	 * 0 or -ENOMEM (the old list is kept). NULL: the provider does not use them. */
	int (*set_node_addrs)(xport_t *x, const char *const *addrs, uint32_t n);
};

/* Providers. */
extern const struct xport_ops xport_rdma_ops;
extern const struct xport_ops xport_tcp_ops;

/* Provider by name ("rdma", "tcp"); NULL if unknown. */
const struct xport_ops *xport_ops_find(const char *name);

static inline int xport_create(const struct xport_ops *ops, const struct xport_attr *attr, xport_t **out)
{
	return ops->create(attr, out);
}
static inline void xport_destroy(xport_t *x)
{
	if (x)
		x->ops->destroy(x);
}
static inline const char *xport_name(const xport_t *x)
{
	return x->ops->name;
}
static inline int xport_event_fd(xport_t *x)
{
	return x->ops->event_fd(x);
}
static inline int xport_listen(xport_t *x, const char *addr, uint16_t port)
{
	return x->ops->listen(x, addr, port);
}
static inline int xport_connect(xport_t *x, const char *src, const char *addr, uint16_t port, const void *pdata,
				size_t len, void *ctx, uint32_t index, xport_conn_t **out)
{
	return x->ops->connect(x, src, addr, port, pdata, len, ctx, index, out);
}
static inline int xport_admit(xport_conn_t *c)
{
	return c->xport->ops->admit ? c->xport->ops->admit(c) : 0;
}
static inline int xport_accept(xport_conn_t *c, const void *pdata, size_t len)
{
	return c->xport->ops->accept(c, pdata, len);
}
static inline int xport_reject(xport_conn_t *c, const void *pdata, size_t len)
{
	return c->xport->ops->reject(c, pdata, len);
}
static inline int xport_disconnect(xport_conn_t *c)
{
	return c->xport->ops->disconnect(c);
}
static inline void xport_conn_destroy(xport_conn_t *c)
{
	if (c)
		c->xport->ops->conn_destroy(c);
}
static inline int xport_mr_reg(xport_conn_t *c, void *addr, size_t len, unsigned access, xport_mr_t **out)
{
	return c->xport->ops->mr_reg(c, addr, len, access, out);
}
static inline void xport_mr_dereg(xport_mr_t *mr)
{
	if (mr)
		mr->xport->ops->mr_dereg(mr);
}
static inline int xport_post_send(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len, uint64_t wr_id)
{
	return c->xport->ops->post_send(c, mr, buf, len, wr_id);
}
static inline int xport_post_recv(xport_conn_t *c, xport_mr_t *mr, void *buf, uint32_t len, uint64_t wr_id)
{
	return c->xport->ops->post_recv(c, mr, buf, len, wr_id);
}
static inline int xport_post_write(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len,
				   uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	return c->xport->ops->post_write(c, mr, buf, len, raddr, rkey, wr_id);
}
static inline int xport_post_write_imm(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len,
				       uint64_t raddr, uint32_t rkey, uint32_t imm, uint64_t wr_id)
{
	return c->xport->ops->post_write_imm(c, mr, buf, len, raddr, rkey, imm, wr_id);
}
static inline int xport_post_read(xport_conn_t *c, xport_mr_t *mr, void *buf, uint32_t len, uint64_t raddr,
				  uint32_t rkey, uint64_t wr_id)
{
	return c->xport->ops->post_read(c, mr, buf, len, raddr, rkey, wr_id);
}
static inline int xport_poll(xport_t *x, struct xport_event *evs, int max)
{
	return x->ops->poll(x, evs, max);
}
static inline int xport_device(xport_t *x, char *name, size_t len)
{
	return x->ops->device ? x->ops->device(x, name, len) : -ENODEV;
}
/* 0 and *out, or -EOPNOTSUPP for a provider without paths, or another negative errno. */
static inline int xport_path(xport_conn_t *c, struct xport_path *out)
{
	return c->xport->ops->path ? c->xport->ops->path(c, out) : -EOPNOTSUPP;
}

static inline int xport_set_node_addrs(xport_t *x, const char *const *addrs, uint32_t n)
{
	return x->ops->set_node_addrs ? x->ops->set_node_addrs(x, addrs, n) : 0;
}

static inline void xport_arm(xport_t *x)
{
	if (x->ops->arm)
		x->ops->arm(x);
}
static inline int xport_poll_all(xport_t *x, struct xport_event *evs, int max)
{
	return x->ops->poll_all ? x->ops->poll_all(x, evs, max) : x->ops->poll(x, evs, max);
}

#endif
