/*
 * meshd's local control socket: unix SOCK_SEQPACKET, one protobuf CtlRequest per datagram, one
 * CtlReply per request. Clients are hostile until checked: an oversized, undecodable or unknown
 * request gets an error reply and a log line naming the client (SO_PEERCRED), and meshd goes on
 * serving everyone else.
 */
#ifndef MESH_MESHD_ADMIN_H
#define MESH_MESHD_ADMIN_H

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/un.h>

#include "mesh.h"
#include "metrics.h"

/* Control connections: so many in all, of which ADMIN_CLIENTS_ROOT only root (or meshd's own user)
 * may take, and at most ADMIN_CLIENTS_PER_UID held by any other one uid (admin_slot_for): one
 * member of the group holding 64 connections locked root's meshctl and channels out. */
#define ADMIN_CLIENTS_MAX 256
#define ADMIN_CLIENTS_ROOT 16
#define ADMIN_CLIENTS_PER_UID 64
#define ADMIN_PAUSE_MS 100 /* out of descriptors: the listening socket rests this long */
/* Lines local clients may cause: so many per interval (admin_client_log_ok). */
#define ADMIN_LOG_BURST 20u
#define ADMIN_LOG_INTERVAL_MS 10000u
/* Bytes of metrics text per reply (MetricsPage): a datagram well within the default socket
 * buffers (net.core.wmem_default is 208 KiB). */
#define ADMIN_METRICS_PAGE 61440u
/* Bytes of LinkInfo, ChannelInfo or PortInfo items per reply: with the NodeInfo every reply carries
 * it stays well under a datagram the socket buffers take at once (net.core.wmem_default). */
#define ADMIN_LIST_PAGE 49152u

/* A request waits this long for the data path's lock before it is answered from the snapshot
 * (NODE, LINKS) or handed to the data path (the rest). */
#define ADMIN_LOCK_WAIT_MS 20
/* The data path publishes the snapshot from its tick at most this often while node or links was
 * asked within ADMIN_SNAP_WARM_MS, else every ADMIN_SNAP_COLD_MS: packing every link's LinkInfo
 * ten times a second for nobody was a tenth of the user time of 64 meshd forming their mesh. The
 * reply says how old its snapshot is. */
#define ADMIN_SNAP_EVERY_MS 100
#define ADMIN_SNAP_WARM_MS 10000
#define ADMIN_SNAP_COLD_MS 1000
/* The control thread runs at cluster.control_priority (SCHED_FIFO) while it uses at most
 * ADMIN_RT_BUDGET_US of CPU per ADMIN_RT_WINDOW_US; beyond, normal scheduling until the window
 * ends: a local client that floods the socket cannot take a CPU from the data path. */
#define ADMIN_RT_WINDOW_US 100000
#define ADMIN_RT_BUDGET_US 20000
/* The control thread faults in this much of its stack and of its malloc arena before its first
 * request, and meshd's allocator keeps what it frees (admin_open): a page fault waits for the
 * process's mmap lock, which the data path holds while rxe maps and unmaps the queues of QPs it
 * creates (sampled in the VM during a 64-node formation: the real-time control thread in
 * lock_mm_and_find_vma in 4 of 5 answers over 100 ms). A reply is at most a page of a list plus
 * its NodeInfo, well under either. */
#define ADMIN_WARM_STACK (256u << 10)
#define ADMIN_WARM_HEAP (1u << 20)

/* What `meshctl node` and `meshctl links` show, as the data path last saw it: packed NodeInfo and
 * one packed LinkInfo per link, in the mesh's order. */
struct admin_snap {
	uint64_t at_ms; /* when it was taken; 0: none yet */
	uint8_t *node;
	size_t node_len;
	uint8_t **links;
	size_t *link_len;
	size_t n_links;
};

/*
 * Threads: the control socket has its own thread (admin_open), so a request never waits behind
 * link work: the data path holds the mesh's lock for whole batches, and under a handshake storm
 * on a loaded machine a batch has taken seconds. The control thread answers with the mesh's lock
 * when it gets it within ADMIN_LOCK_WAIT_MS; otherwise NODE and LINKS come from the snapshot the
 * data path publishes from its tick (the reply says how old), and the other requests go to the
 * data path (queued[], one per client, read again once answered). Locks, always in this order:
 * the mesh's (the daemon's), then `lock` (client slots), then `snap_lock`.
 *
 * A client's descriptor is read only by the control thread, and closed only with the mesh's lock
 * held (channel_client_gone must forget it first): by the control thread when it has that lock,
 * otherwise by the data path for a slot the control thread marked gone (and stopped watching).
 */
struct admin {
	int lfd;
	int epfd;     /* the data path's (rail 0): channels' kick and lifeline descriptors, work_fd */
	int ctl_epfd; /* the control thread's: the listening socket, the clients, stop_fd */
	int stop_fd;  /* eventfd: the control thread returns */
	int work_fd;  /* eventfd in epfd: queued requests or gone clients for the data path */
	uint64_t tag_kick, tag_life; /* epoll tags of channels in epfd: tag | channel id */
	/* Each rail's thread's epoll set (rail 0's is epfd): a channel's kick goes to its rail's. */
	int kick_epfd[MESH_RAILS_MAX];
	uint32_t n_kick_epfd;
	pthread_t thread;
	bool started;  /* the thread runs (from admin_open on): admin_stop joins it */
	sem_t warmed;  /* posted by the thread once warm: the socket listens only then */
	bool warm_sem;
	struct mesh_locks *locks; /* the daemon's (mesh.h): "the mesh's lock" below is all of them */
	pthread_mutex_t lock; /* clients[], client_uid[], client_pid[], queued[], gone[], the pause */
	struct mesh *mesh;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int clients[ADMIN_CLIENTS_MAX];
	uint32_t client_uid[ADMIN_CLIENTS_MAX]; /* SO_PEERCRED at accept: whose channels and ports */
	int client_pid[ADMIN_CLIENTS_MAX];
	CtlRequest *queued[ADMIN_CLIENTS_MAX]; /* a request for the data path; its client is not read */
	bool gone[ADMIN_CLIENTS_MAX];          /* hung up or dropped: the data path closes it */
	_Atomic uint64_t errors;
	_Atomic uint64_t snapshot_replies; /* answered from the snapshot: the data path was busy */
	_Atomic uint64_t snap_asked_ms;    /* node or links last asked (ADMIN_SNAP_WARM_MS) */
	_Atomic uint64_t queued_replies;   /* handed to the data path for the same reason */
	/* The control thread's scheduling (control_priority): only that thread writes these. */
	uint32_t rt_want;            /* configured SCHED_FIFO priority; 0 after it was refused */
	_Atomic uint32_t rt_now;     /* in force now: rt_want, or 0 while over its budget */
	_Atomic uint32_t tid;
	_Atomic uint64_t rt_demotions;
	uint64_t rt_win_us, rt_win_cpu_us; /* the budget's window: its start, and the thread's CPU then */
	/* Out of descriptors the listening socket stays readable: it leaves the epoll set until then
	 * (the control thread puts it back) instead of waking the loop without end. 0: watched. */
	uint64_t paused_until_ms;
	uint64_t pauses;
	uint64_t http_scrapes; /* requests the HTTP endpoint (metrics_http.h) answered with the text */
	uint64_t http_renders; /* texts it rendered for them */
	/* Per client: the metrics text rendered at its request for offset 0, kept while it pages
	 * through it (CTL_OBJECT_METRICS), freed after the last page or with the client. Mesh lock. */
	char *metrics_text[ADMIN_CLIENTS_MAX];
	size_t metrics_len[ADMIN_CLIENTS_MAX];
	/* `meshctl reload` (root or meshd's user): main.c's daemon_reload, called with the mesh's lock;
	 * 0 or a negative errno with err saying why nothing was changed. */
	int (*reload)(void *ctx, const char *how, char *err, size_t errlen);
	void *reload_ctx;
	pthread_mutex_t snap_lock;
	struct admin_snap snap; /* written by the data path only, under snap_lock */
	/* The lines local clients cause (admin_client_log_ok): both threads write them. */
	pthread_mutex_t log_lock;
	struct log_ratelimit client_log;
};

/* Starts the control thread (signals blocked as in the caller), which warms its pages
 * (ADMIN_WARM_*), and binds path (creating its directory, replacing a stale socket, refusing a
 * live one), listening once the thread is warm; the work eventfd goes into epfd (the data path's)
 * with tag_work. The socket is mode 0660 with group cluster.socket_group, so applications run in
 * that group; without the group (or with ""), 0600: meshd's user only. locks are those the data
 * path holds while it works on m (mesh_lock_all). On failure the thread is stopped. */
int admin_open(struct admin *a, const char *path, int epfd, uint64_t tag_work, struct mesh *m,
	       struct mesh_locks *locks);
/* The control thread serves the socket from now on (connections made since admin_open waited in
 * its backlog); admin_stop stops and joins the thread. */
int admin_start(struct admin *a);
void admin_stop(struct admin *a);
/* After admin_stop (or without a start): every client dropped, the socket file removed. */
void admin_close(struct admin *a);
/* Makes the admin socket the channels' way to applications (channel_ops) and to meshd's epoll:
 * lifelines to epfd, kicks to rail_epfd[the channel's rail] (n_rails of them, rail 0's = epfd). */
void admin_bind_channels(struct admin *a, uint64_t tag_kick, uint64_t tag_life, const int *rail_epfd,
			 uint32_t n_rails);
/* The data path, with the mesh's lock, on work_fd: answers queued requests, closes gone clients. */
void admin_work(struct admin *a);
/* The data path, with the mesh's lock, from its tick: publishes the snapshot (at most every
 * ADMIN_SNAP_EVERY_MS). */
void admin_snapshot(struct admin *a, uint64_t now_ms);
/* The node's metrics text (metrics.h) with what the control socket counts: the one renderer of
 * both the HTTP endpoint and `meshctl metrics`. 0 or -ENOMEM. */
int admin_metrics_render(struct admin *a, struct metrics_buf *b);

#endif
