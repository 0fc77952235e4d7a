/*
 * libmesh internals: the objects behind the public handles and the helpers shared by the source
 * files of the library. Nothing here is installed or exported.
 */
#ifndef MESH_LIB_INTERNAL_H
#define MESH_LIB_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/un.h>
#include <time.h>

#include <mesh/mesh.h>

#include "ctl.pb-c.h"
#include "ring.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Descriptors that come with a ChannelSetup, in this order (proto/ctl.proto). */
enum {
	CTL_FD_MEMFD,
	CTL_FD_LIFELINE,
	CTL_FD_KICK,
	CTL_FD_WAKE,
	CTL_FDS_SETUP
};
/* Room for more descriptors than a reply may carry, so that extra ones are seen (and closed)
 * rather than silently dropped by the kernel. */
#define CTL_FDS_MAX 16

/* How long mesh_connect waits by default, and mesh_listen for meshd's immediate answer. */
#define MESH_CONNECT_TIMEOUT_MS 30000u

struct mesh_session {
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	/* Why the last connect/listen failed, "" when nobody said: meshd's text, or libmesh's when meshd
	 * could not be reached (its socket path in it). */
	char error[320];
};

struct mesh_listener {
	int fd; /* the control connection that carried LISTEN; one CtlReply per incoming channel */
	uint16_t port;
	uint32_t node; /* this node's id from the LISTEN answer, MESH_NODE_UNKNOWN when it had none */
};

struct mesh_channel {
	struct mesh_ring_ctrl *ctrl; /* the shared control page: every value meshd wrote is hostile */
	uint8_t *tx, *rx;            /* the ring areas, ring_size bytes each */
	void *map;
	size_t map_len;
	uint64_t size;

	/* Positions. Ours are the only truth (never read back from the page); meshd's are the last
	 * values that passed the window checks of proto/ring.h. */
	uint64_t tx_prod;   /* written into the TX area (published at once unless our QP posts, aq.c) */
	uint64_t tx_shown;  /* the page's tx_prod: the largest we published (tx_show) */
	uint64_t tx_cons;   /* last valid value of meshd's tx_cons */
	uint64_t rx_cons;   /* published */
	uint64_t rx_prod;   /* readable up to here: meshd's rx_prod or a direct pair, the larger */
	uint64_t rx_prod_d; /* last valid value of meshd's rx_prod (may lag rx_prod, ring.h) */
	uint64_t rx_kicked; /* rx_cons when meshd was last told about consumption */
	size_t reserved;    /* bytes handed out by the last mesh_send_reserve, 0 when none */
	size_t peeked;      /* bytes handed out by the last mesh_recv_peek, 0 when none */

	int lifeline; /* closing it closes the channel; POLLHUP: meshd is gone */
	int kick;     /* application -> meshd */
	int wake;     /* meshd -> application */
	int epfd;     /* mesh_channel_fd: epoll over wake and lifeline, -1 until asked for */

	int err;          /* sticky: -EPROTO once meshd broke the ring contract */
	bool meshd_gone;  /* the lifeline hung up */
	bool shut_wr;     /* mesh_shutdown was called */
	uint32_t spin_us; /* a blocking call polls this long before it sleeps (ring.h spin_us) */
	bool spin_env;    /* spin_us came from MESH_SPIN_US: nothing raises it, nothing adapts it */
	uint32_t wait_us; /* blocking waits' moving average (1/8 per wait), what spinning adapts to */
	bool answer_due;  /* we sent since a read last returned: its wait waits for an answer (chan_spin) */
	struct lib_aq *aq; /* our own QP for the sending half (aq.c), NULL when meshd posts it all */

	/* One reader thread and one writer thread at once (channel.c, "Threads"): every step and
	 * every field above is touched under lock, never a sleep. Of the threads that wait, one (the
	 * sleeper) polls the descriptors; the others wait on cond until it woke (wakes moved on) or
	 * gave the role up. MESH_APP_WAITING is set while waiters > 0 (or the fd was given out). */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint32_t waiters;
	bool sleeper;
	uint64_t wakes;

	struct mesh_channel_info info;
};

/* Publishes pos as our tx_prod, never backwards: meshd breaks a channel whose tx_prod moves back.
 * Our QP publishes each chain's end as it posts (aq.c), and may take the grant only after we
 * published more ourselves (meshd granted from where it was, we wrote on before we saw it). */
static inline void tx_show(mesh_channel_t *c, uint64_t pos)
{
	if (pos <= c->tx_shown)
		return;
	c->tx_shown = pos;
	atomic_store_explicit(&c->ctrl->tx_prod, pos, memory_order_release);
}

/* ---- debug.c ---- */

/* With MESH_DEBUG=1: one line on stderr naming a contract violation by meshd. Error paths only. */
void lib_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- ctl.c: the control connection to meshd ---- */

/* A deadline on CLOCK_MONOTONIC, timeout_ms from now. */
void ctl_deadline(struct timespec *deadline, uint32_t timeout_ms);
/* Connects a SOCK_SEQPACKET socket to path; returns the fd or a negative errno. */
int ctl_open(const char *path, const struct timespec *deadline);
/* Sends one request; 0 or a negative errno. */
int ctl_send(int fd, const CtlRequest *req);
/* Waits until fd is readable or hung up: 0, -ETIMEDOUT at the deadline (NULL: no deadline),
 * -EINTR when a signal came and !restart, or another -errno. */
int ctl_wait(int fd, const struct timespec *deadline, bool restart);
/* Receives one reply without waiting. On success *out is the decoded reply (free it with
 * ctl_reply__free_unpacked) and fds[0..*nfds) the descriptors that came with it, owned by the
 * caller. On failure nothing is returned and every received descriptor is closed: -EAGAIN (nothing
 * queued), -ECONNRESET (meshd closed the connection), -EPROTO (truncated reply or descriptors),
 * -EBADMSG (undecodable), -ENOMEM or another -errno. */
int ctl_recv(int fd, CtlReply **out, int fds[CTL_FDS_MAX], int *nfds);
/* One request on a fresh control connection fd (from ctl_open; a negative errno is passed through)
 * and its first reply, by the deadline (a signal does not cut the wait): the connection (>= 0, the
 * caller's to close) with *out and the reply's descriptors, or a negative errno with nothing left
 * open. */
int ctl_request(int fd, const CtlRequest *req, const struct timespec *deadline, CtlReply **out,
		int fds[CTL_FDS_MAX], int *nfds);
void ctl_fds_close(int *fds, int nfds);

/* ---- channel.c ---- */

/* Builds a channel from a successful reply's setup and its descriptors, which it takes over (they
 * are closed on failure too); local_node is the node the reply named (or MESH_NODE_UNKNOWN).
 * -EPROTO when anything meshd sent is inconsistent. */
int chan_create(const ChannelSetup *setup, uint32_t local_node, int fds[CTL_FDS_SETUP], mesh_channel_t **out);

/* ---- aq.c: application-posted writes (ring.h AQ area; the paths behind it: aq_int.h) ---- */

/* Offers a QP of our own when meshd's control page has a path for it (and MESH_APP_SEND is not
 * off); on any failure c->aq stays NULL and meshd posts everything, as before. */
void aq_open(mesh_channel_t *c);
/* Connects, polls completions, follows meshd's grant, posts what is published: every step of a
 * call that reads or writes the ring calls it first. */
void aq_progress(mesh_channel_t *c);
/* aq_progress for a send step: over tcp without a look for the peer's bytes, a system call per
 * message that the receive steps make anyway (a send that waits looks before it sleeps:
 * aq_wait_fd). */
void aq_progress_send(mesh_channel_t *c);
/* The stream position the peer application's immediates said arrived (0: none). */
uint64_t aq_rx_seen(const mesh_channel_t *c);
/* Whether our QP posts the sending half now: aq_progress then posts and publishes what
 * tx_publish added. */
bool aq_owned(const mesh_channel_t *c);
/* The TX position we may overwrite up to, given meshd's tx_cons. */
uint64_t aq_reusable(const mesh_channel_t *c, uint64_t tx_cons);
/* The completion channel's fd, for an epoll set made before our QP is connected (-1: none). */
int aq_fd(const mesh_channel_t *c);
/* Whether our QP is connected: the peer's bytes come without any meshd (a longer spin pays). */
bool aq_connected(const mesh_channel_t *c);
/* Whether a look at our own path is a system call anyway (a TCP connection). */
bool aq_look_is_syscall(const mesh_channel_t *c);
/* Before sleeping: arms the CQ and returns its completion channel's fd (-1: none to wait on). */
int aq_wait_fd(mesh_channel_t *c);
/* After the fd was readable: takes its events. */
void aq_event(mesh_channel_t *c);
/* At shutdown: our posted writes out (within a bound), the half handed back to meshd. */
void aq_release(mesh_channel_t *c);
void aq_close(mesh_channel_t *c);

#endif
