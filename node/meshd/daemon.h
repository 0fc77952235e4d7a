/*
 * What meshd's own files share (main.c, loop.c, reload.c, notify.c): the daemon and its data-path
 * threads. meshd_core (mesh.h, admin.h...) knows nothing of them.
 */
#ifndef MESH_MESHD_DAEMON_H
#define MESH_MESHD_DAEMON_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "admin.h"
#include "auth.h"
#include "config.h"
#include "log.h"
#include "mesh.h"
#include "metrics_http.h"
#include "transport.h"

enum { TAG_XPORT = 1, TAG_TIMER, TAG_SIGNAL, TAG_ADMIN_WORK, TAG_CH_KICK, TAG_CH_LIFE, TAG_STOP,
       TAG_METRICS };
#define TAG(t) ((uint64_t)(t) << 32)
#define EVENT_BATCH 64
#define DRAIN_ROUNDS 16
/* While polling, the loop's epoll_wait (a system call) runs on one round in this many: every
 * round looks into the CQs and rings without one, and the rest (timer, control socket, connection
 * events, lifelines, kicks of a ring that just stopped being polled) can wait a few rounds. */
#define HOT_EPOLL_EVERY 16
#define STOP_GRACE_MS 300
#define SLOW_WARN_MS 500 /* a tick this late is said: the loop or the machine stalled */

/* cluster.polling */
enum poll_mode { POLL_EVENT, POLL_ADAPTIVE, POLL_BUSY };

struct daemon;

/* A data-path thread: one per rail (device), pinned to its device's NUMA node. Rail 0's also
 * serves the control plane (timer, signals, control socket, channels' lifelines). Each moves its
 * rail's channel data, and takes its rail's channels' kicks, under its rail's lock alone, and takes
 * every lock for the rest (mesh.h, struct mesh_locks): two rails carry two streams at once. */
struct dp {
	struct daemon *d;
	uint32_t rail;
	int epfd;              /* rail 0: the daemon's; others: their transports, stop_fd, kicks */
	int stop_fd;           /* rails > 0: rail 0 writes it when meshd stops */
	uint64_t hot_until_us; /* adaptive: polling until then (poll_budget_us after the last data moved); 0 cold */
	uint64_t ring_moves;   /* rings an application had moved, found by poll_once (dp_data_moves) */
	bool polled;           /* poll_once ran since the last sleep: re-arm and look again first */
	uint32_t hot_rounds;   /* rounds while polling, for HOT_EPOLL_EVERY */
	int status;            /* run()'s result */
	pthread_t thread;
	/* Events of its transports the fast path left to the usual way, in order: those it could not
	 * take, every later one of their work queues, everything after a connection event (deferrable). */
	struct xport_event deferred[EVENT_BATCH * MESH_XPORTS_MAX];
	int n_deferred;
};

struct daemon {
	struct mesh_config cfg;
	enum poll_mode poll_mode;
	struct mesh_locks locks; /* the mesh, its transports and channels (mesh.h) */
	struct dp dp[MESH_RAILS_MAX];
	xport_t *xports[MESH_XPORT_INSTANCES]; /* per provider, one per rail (mesh.h) */
	size_t n_xports;
	bool more[MESH_XPORT_INSTANCES]; /* the transport may hold events we have not taken yet */
	struct mesh mesh;
	struct admin admin;
	/* cluster.metrics_listen, served from rail 0's loop: one of two slots, so that a reload opens
	 * the new address before it gives up the old one (libmicrohttpd keeps a pointer to its slot). */
	struct metrics_http metrics_slot[2];
	struct metrics_http *metrics;
	/* What a reload needs (daemon_reload): the file, this node, a --log-level that overrides the file's. */
	const char *cfg_path;
	uint32_t self_id;
	const char *level_override;
	int epfd, tfd, sfd;
	/* systemd (Type=notify): WATCHDOG=1 every half of WatchdogSec from the tick, so a loop that
	 * stalls gets meshd restarted; STATUS= when the count of links UP changes. */
	uint64_t wd_every_ms, wd_last_ms;
	uint32_t status_up;
	uint64_t tick_last_ms; /* the last tick: a late one is said (a stalled loop or machine) */
	bool tick_deferred;    /* the last tick was late and judged no keepalives (slow_path) */
	uint32_t tick_period_ms;
	struct log_ratelimit late_rl; /* a loaded machine's late ticks: a few lines a minute */
};

/* daemon.c (below main.c, loop.c and reload.c) */
const char **node_addrs_list(const struct daemon *d, const struct config_node *self, uint32_t *n);
int timer_set(int fd, uint32_t period_ms);
int add_fd(int epfd, int fd, uint64_t tag);

/* loop.c */
int run(struct dp *dp);
int run_data_path(struct daemon *d);
int dp_open(struct daemon *d);
void dp_close(struct daemon *d);

/* reload.c */
int load_keys(const struct mesh_config *cfg, const char *cfg_path, struct auth_keys *keys, char *err,
		     size_t errlen);
int daemon_reload(void *ctx, const char *how, char *err, size_t errlen);

/* notify.c */
int notify_load(void);
void notify(const char *state);
void notify_status(struct daemon *d, const char *extra);
void notify_tick(struct daemon *d, uint64_t now);
uint64_t notify_watchdog_every_ms(void);
void notify_store_take(struct mesh *m);

#endif
