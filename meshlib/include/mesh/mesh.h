/*
 * libmesh: the public interface of rdmamesh (the only installed header).
 *
 * Errors: every function returns 0 or a count on success and a negative errno value on failure
 * (-ENOENT, -ECONNRESET, ...). Failures specific to the mesh use the reserved range below;
 * mesh_strerror() names every code, errno values included.
 *
 * Channels: a channel is a reliable, ordered byte stream between two applications on two nodes
 * (like a TCP connection), identified by (node id, port). The bytes move by RDMA from the sender's
 * shared-memory ring into the receiver's, through the local meshd of each side; libmesh copies
 * (mesh_send/mesh_recv) or hands out the ring itself (reserve/commit, peek/release).
 *
 * Threads: a channel may be used by one reader thread (mesh_recv, mesh_recv_peek/release) and one
 * writer thread (mesh_send, mesh_send_reserve/commit, mesh_shutdown) at once, blocking or not, as
 * a socket may (since 0.5; before, one thread at a time). Calls on one channel are serialized
 * inside libmesh except while they wait, so two readers (or two writers) are safe too, but which
 * bytes each gets is theirs to sort out, and a peek or reservation is the one thread's until it
 * is released or committed. mesh_channel_status, mesh_channel_fd and mesh_channel_info may come
 * from either thread; mesh_close only once no other call on the channel is under way. Two threads
 * that wait for the channel fd in an event loop rather than in blocking calls use MESH_STATUS_EDGE
 * (below). A listener is used by one thread at a time; a session by any number (its
 * mesh_session_error text is shared).
 */
#ifndef MESH_MESH_H
#define MESH_MESH_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MESH_BUILDING_LIB)
#define MESH_EXPORT __attribute__((visibility("default")))
#else
#define MESH_EXPORT
#endif

#define MESH_VERSION_MAJOR 0
#define MESH_VERSION_MINOR 5

/* Default path of meshd's local control socket; the MESH_SOCKET environment variable overrides it. */
#define MESH_SOCKET_DEFAULT "/run/meshd/meshd.sock"
#define MESH_SOCKET_ENV "MESH_SOCKET"
#define MESH_RAILS_MAX 4u /* devices (rails, nodes.addr + nodes.rails) a node may have */

/* Mesh-specific error codes, returned negated like errno values. */
enum mesh_errno {
	MESH_ERRNO_BASE = 2000,
	MESH_EPROTOVER = 2001,    /* peer speaks another protocol version */
	MESH_ECLUSTER = 2002,     /* peer belongs to another cluster */
	MESH_EDIALRULE = 2003,    /* a lower node id dialled a higher one */
	MESH_EUNKNOWNNODE = 2004, /* node id not in the configuration */
	MESH_ESTALE = 2005,       /* connection attempt older than the current link epoch */
	MESH_EBUSY = 2006,        /* busy: too many handshakes in flight, or the link is UP and alive; try later */
	MESH_EQPCOUNT = 2007,     /* peers disagree on qps_per_link */
	MESH_EBADMAGIC = 2008,    /* private data or message is not from a mesh peer */
	MESH_EPROOF = 2009,       /* the peer's mailbox key failed the write/read proof */
	MESH_EKEEPALIVE = 2010,   /* no message from the peer within the keepalive timeout */
	MESH_ECONFIG = 2011,      /* invalid configuration */
	MESH_EPEERMSG = 2012,     /* malformed or unexpected message from a peer */
	MESH_EHANDSHAKE = 2013,   /* handshake did not complete in time */
	MESH_ESHUTDOWN = 2014,    /* peer is shutting down */
	MESH_EDUPQP = 2015,       /* the same QP index was connected twice */
	MESH_EPDATA = 2016,       /* connect private data missing, truncated or of the wrong kind */
	MESH_EPEERRESTART = 2017, /* the peer's meshd restarted while the link was down: the channel is gone there */
	MESH_ERESUMETIMEO = 2018, /* the link stayed DOWN longer than cluster.resume_timeout_ms */
	MESH_EAUTH = 2019,        /* the peer did not prove the cluster key (cluster.key_file) */
	MESH_EREFUSED = 2020,     /* the peer refused the connection; its log says why */
	MESH_EREMOVED = 2021,     /* the peer node was removed from the cluster's configuration (a reload) */
	MESH_EDRAINING = 2022,    /* the node is draining for maintenance (meshctl drain): no new channels */
	MESH_ERESTARTING = 2023,  /* the peer's meshd is restarting: its channels wait for the new one */
	MESH_EMESHDGONE = 2024,   /* the local meshd is gone and did not come back with the channel */
	MESH_ERRNO_LAST = 2025
};

/* Name of an error: mesh_strerror(-MESH_ECLUSTER) or mesh_strerror(-ENOENT). Never NULL. */
MESH_EXPORT const char *mesh_strerror(int err);

/* The version of the libmesh the program runs with, "MAJOR.MINOR" (since 0.5): MESH_VERSION_MAJOR and
 * MESH_VERSION_MINOR are the one it was compiled against. A newer libmesh of the same major version
 * runs a program built against an older one (libmesh.so.0, symbol versions MESH_0.N). */
MESH_EXPORT const char *mesh_version(void);

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct mesh_session mesh_session_t;
typedef struct mesh_listener mesh_listener_t;
typedef struct mesh_channel mesh_channel_t;
typedef struct mesh_connecting mesh_connecting_t;

/* Flags of calls that may wait. */
#define MESH_NONBLOCK 0x1 /* return -EAGAIN instead of waiting */

/* Options of mesh_connect. Set the bit of every field you fill in `mask`; the others take their
 * defaults, so the struct can grow without breaking callers (zero it, then fill). */
#define MESH_OPT_RING_SIZE (1u << 0)
#define MESH_OPT_QPS (1u << 1)
#define MESH_OPT_NUMA_NODE (1u << 2)
#define MESH_OPT_TIMEOUT_MS (1u << 3)
#define MESH_OPT_RAIL (1u << 4)
/* No field (since 0.5): when the link to the node is not UP yet (meshd starting, the peer not up,
 * a link re-forming), wait for it within timeout_ms, as TCP's connect(2) waits for a host that does
 * not answer yet, instead of failing with -ENETUNREACH at once. At the end of the timeout without
 * the link: -ETIMEDOUT (mesh_session_error says the link did not come UP). meshd does the waiting,
 * so mesh_connect_start/finish get it too; a meshd older than 0.5 ignores it and answers
 * -ENETUNREACH at once. A libmesh older than 0.5 refuses the bit (-EINVAL). */
#define MESH_OPT_WAIT_LINK (1u << 5)

struct mesh_channel_opts {
	uint32_t mask;
	uint32_t qps;        /* QPs of the link to stripe over, 1..16; default all of the link's */
	uint64_t ring_size;  /* bytes per direction, power of two, 4 KiB..256 MiB; default 1 MiB */
	int32_t numa_node;   /* NUMA node of this side's rings and registered memory; default: the node of
			      * the channel's device (cluster.numa). With several devices it also picks
			      * the device on that node. A node this machine lacks: -EINVAL; where meshd
			      * cannot place (one node, no libnuma): ignored */
	uint32_t timeout_ms; /* how long mesh_connect waits for the peer (and the link, MESH_OPT_WAIT_LINK);
			      * default 30000 */
	uint32_t rail;       /* the device (rail) to use: 0 is nodes.addr's, i is nodes.rails[i-1]'s;
			      * default: the one on numa_node, else on the calling thread's node, else 0.
			      * A rail the cluster lacks: -EINVAL */
	uint32_t reserved32;
	uint64_t reserved[5];
};

struct mesh_channel_info {
	uint32_t channel_id;
	uint32_t peer_node;
	uint16_t local_port;
	uint16_t peer_port;
	uint32_t qps;
	uint64_t ring_size;
	uint32_t local_node; /* this node's id as meshd named it with the channel, MESH_NODE_UNKNOWN when it
			      * did not (since 0.3: took 8 of the reserved bytes, offsets unchanged) */
	uint32_t reserved32;
	uint64_t reserved[5];
};

#define MESH_NODE_UNKNOWN 0xffffffffu

struct mesh_listener_info {
	uint32_t node; /* this node's id as meshd named it in its LISTEN answer, or MESH_NODE_UNKNOWN */
	uint16_t port;
	uint16_t reserved16;
	uint64_t reserved[3];
};

/* A session names the local meshd: socket_path, else $MESH_SOCKET, else MESH_SOCKET_DEFAULT. It
 * does not connect yet; every listen/connect opens its own connection. */
MESH_EXPORT int mesh_open(const char *socket_path, mesh_session_t **out);
MESH_EXPORT void mesh_session_close(mesh_session_t *s);
/* Why the last mesh_connect, mesh_listen or mesh_node_table of this session failed, in words that
 * say more than the errno's name and may stand in for it: meshd's own ("the NUMA hint names no online
 * node of this machine", "nobody listens on that port"), or, when meshd could not be reached,
 * libmesh's with the socket path ("meshd is not running at /run/meshd/meshd.sock (no such socket)",
 * "no permission for PATH: join group rdmamesh (the socket is root:rdmamesh 0660)"); "" when there
 * are none. Valid until the next call on the session; a session used by several threads at once has
 * one such text for all of them. */
MESH_EXPORT const char *mesh_session_error(const mesh_session_t *s);

/* Accepts channels to `port` of this node until mesh_listener_close. -EADDRINUSE if taken. */
MESH_EXPORT int mesh_listen(mesh_session_t *s, uint16_t port, mesh_listener_t **out);
/* The next incoming channel; with MESH_NONBLOCK -EAGAIN when none is waiting. */
MESH_EXPORT int mesh_accept(mesh_listener_t *l, int flags, mesh_channel_t **out);
/* Readable (poll/epoll) when mesh_accept would not wait. */
MESH_EXPORT int mesh_listener_fd(const mesh_listener_t *l);
/* The listener's port and this node's id (since 0.3). */
MESH_EXPORT int mesh_listener_info(const mesh_listener_t *l, struct mesh_listener_info *info);
MESH_EXPORT void mesh_listener_close(mesh_listener_t *l);

/* The cluster's nodes as the local meshd knows them (since 0.4): this node first (MESH_NODE_SELF),
 * then every peer with its configured address (rail 0, nodes.addr). Fills at most max entries and
 * returns how many nodes there are (which may be more), or a negative errno (no meshd: -ENOENT or
 * -ECONNREFUSED). Waits at most 30 s. */
#define MESH_NODE_SELF 0x1u
struct mesh_node_addr {
	uint32_t node;
	uint32_t flags;  /* MESH_NODE_SELF */
	char addr[64];   /* numeric address or name as the configuration gives it, NUL-terminated */
	uint64_t reserved[2];
};
MESH_EXPORT int mesh_node_table(mesh_session_t *s, struct mesh_node_addr *nodes, size_t max);

/* Opens a channel to (node, port); returns once the peer accepted. node may be this node's own id:
 * the channel is the same, ring to ring inside meshd, with no link (meshd 0.4 and later). Errors:
 * -MESH_EUNKNOWNNODE (not in the cluster), -ENETUNREACH (the link to that node is not UP; with
 * MESH_OPT_WAIT_LINK meshd waits for it instead), -ECONNREFUSED (nobody listens on the port),
 * -ETIMEDOUT, -EINVAL (options), -ENOENT/-ECONNREFUSED on the socket path (no meshd). */
MESH_EXPORT int mesh_connect(mesh_session_t *s, uint32_t node, uint16_t port, const struct mesh_channel_opts *opts,
			     mesh_channel_t **out);

/* mesh_connect without waiting (since 0.4), for event loops: mesh_connect_start sends the request and
 * returns at once (argument errors and a missing meshd as mesh_connect); mesh_connect_fd is readable
 * (poll, epoll) once meshd answered or went away; mesh_connect_finish then returns 0 and the channel,
 * or what mesh_connect would have returned; before that -EAGAIN, and -ETIMEDOUT once the timeout of
 * the options passed (the caller bounds its own wait: nothing wakes it at the deadline). Except after
 * -EAGAIN, finish has freed the pending connect; mesh_connect_cancel frees it unfinished (meshd sees
 * its control connection close and closes the channel if it comes). Its errors go to the session's
 * mesh_session_error(), so s must outlive it. */
MESH_EXPORT int mesh_connect_start(mesh_session_t *s, uint32_t node, uint16_t port,
				   const struct mesh_channel_opts *opts, mesh_connecting_t **out);
MESH_EXPORT int mesh_connect_fd(const mesh_connecting_t *p);
MESH_EXPORT int mesh_connect_finish(mesh_connecting_t *p, mesh_channel_t **out);
MESH_EXPORT void mesh_connect_cancel(mesh_connecting_t *p);

/* Copies up to len bytes in or out; returns the count (> 0), 0 from mesh_recv at EOF, or a negative
 * errno: -EAGAIN (MESH_NONBLOCK and nothing possible now), -EPIPE (send after mesh_shutdown),
 * -ECONNRESET (the peer or the link failed), -EPROTO (the ring was corrupted), -MESH_EMESHDGONE (the
 * local meshd is gone and no next meshd took the channel over), or the mesh's error the channel
 * failed with (MESH_EPEERRESTART, MESH_ERESUMETIMEO...). Partial counts like
 * write(2)/read(2): a blocking call returns as soon as some bytes moved. */
MESH_EXPORT ssize_t mesh_send(mesh_channel_t *c, const void *buf, size_t len, int flags);
MESH_EXPORT ssize_t mesh_recv(mesh_channel_t *c, void *buf, size_t len, int flags);

/* Zero-copy send: *buf gets free space in the TX ring (contiguous, the return value in bytes, at
 * least 1); write into it, then commit how many bytes to send (<= what reserve returned). */
MESH_EXPORT ssize_t mesh_send_reserve(mesh_channel_t *c, void **buf, int flags);
MESH_EXPORT int mesh_send_commit(mesh_channel_t *c, size_t len);
/* Zero-copy receive: *buf gets the next contiguous received bytes (the return value; 0 at EOF);
 * they stay valid until released. */
MESH_EXPORT ssize_t mesh_recv_peek(mesh_channel_t *c, const void **buf, int flags);
MESH_EXPORT int mesh_recv_release(mesh_channel_t *c, size_t len);

/* Readable (poll/epoll) when the channel may have changed: bytes arrived, space freed, EOF, error, or
 * meshd went away. Level-triggered: call the channel with MESH_NONBLOCK until -EAGAIN, which clears
 * it; for one waiter at a time (two waiters on one fd: MESH_STATUS_EDGE below). Owned by the
 * channel: do not read or close it. It is an epoll set and never reports POLLOUT (a wait for
 * POLLOUT alone sleeps until its timeout): a writer waits for POLLIN and asks mesh_channel_status
 * (MESH_STATUS_ARM) for MESH_READY_SEND, which says whether mesh_send would wait, as POLLOUT on a
 * socket does. (Programs under the preload, libmesh(3), get POLLOUT on their channel sockets.) */
MESH_EXPORT int mesh_channel_fd(mesh_channel_t *c);
MESH_EXPORT int mesh_channel_info(const mesh_channel_t *c, struct mesh_channel_info *info);
/* What the channel can do now (since 0.4), for event loops that wait in poll/epoll on mesh_channel_fd
 * and need POLLIN/POLLOUT rather than "something changed". */
#define MESH_READY_RECV 0x1u  /* mesh_recv would not wait: bytes, the end of the stream, or an error */
#define MESH_READY_SEND 0x2u  /* mesh_send would not wait: free space, or an error */
#define MESH_READY_EOF 0x4u   /* the peer shut its side and every byte was read: mesh_recv returns 0 */
#define MESH_READY_ERROR 0x8u /* the channel failed (or meshd is gone): calls return the error */
#define MESH_READY_SHUT 0x10u /* this side was shut (mesh_shutdown) */
/* With MESH_STATUS_ARM, mesh_channel_status first clears the channel fd (as a MESH_NONBLOCK call
 * that returns -EAGAIN does) and checks whether meshd is still there: when nothing you want is
 * ready, the fd becomes readable on the next change and you may sleep on it. Without, it only looks
 * (no system call). */
#define MESH_STATUS_ARM 0x1
/* With MESH_STATUS_EDGE (since 0.5), for waiters that sleep on the fd edge-triggered (EPOLLET, as
 * Go's poller does) and may be two at once, a reader and a writer: it checks whether meshd is still
 * there, as ARM does, but leaves the fd as it is. An edge-triggered wait is woken by every change
 * whether the fd was cleared or not, and a clear takes the change another waiter sleeps for: a
 * writer that found no space and cleared the fd (a MESH_NONBLOCK call returning -EAGAIN does) would
 * leave a reader asleep beside the bytes it waits for. Such waiters call mesh_recv and mesh_send
 * (MESH_NONBLOCK) only when this says they would not wait, and never clear the fd. */
#define MESH_STATUS_EDGE 0x2

struct mesh_channel_status {
	uint32_t ready;    /* MESH_READY_* */
	int32_t error;     /* with MESH_READY_ERROR: the error the next call returns (negative errno) */
	uint64_t rx_bytes; /* received and not read yet */
	uint64_t tx_free;  /* free space in the send ring */
	/* How long a waiter should poll the channel (this call without MESH_STATUS_ARM, no system
	 * call) before it sleeps on the fd, in microseconds: meshd's cluster.app_spin_us, or
	 * MESH_SPIN_US, as libmesh's own blocking calls do. Zero from a libmesh older than the field
	 * (it was reserved). */
	uint32_t spin_us;
	uint32_t reserved32;
	uint64_t reserved[2];
};
MESH_EXPORT int mesh_channel_status(mesh_channel_t *c, int flags, struct mesh_channel_status *st);

/* Shuts the write side: the peer reads EOF after the last byte sent. */
MESH_EXPORT int mesh_shutdown(mesh_channel_t *c);
/* Closes the channel. Bytes already sent still reach the peer, which then reads EOF. */
MESH_EXPORT int mesh_close(mesh_channel_t *c);
/* Closes this process's copy of a channel that another process uses (since 0.5): a parent's copy
 * after fork() when the child serves the connection, or a child's when the parent does. Nothing is
 * said to meshd or the peer, nothing of the channel is shut and nothing of its control page is
 * written: this copy's mapping and descriptors go. One process at a time uses a channel (the
 * other's copy of the ring indices is stale); the one that goes on with it calls mesh_close at its
 * end, and meshd hears of the close when the last copy goes. */
MESH_EXPORT int mesh_channel_detach(mesh_channel_t *c);

#ifdef __cplusplus
}
#endif
#endif
