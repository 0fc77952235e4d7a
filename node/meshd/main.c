/*
 * meshd: keeps this node's part of the full RC mesh and serves local clients.
 * One loop, one epoll: the transports' fds, a periodic timer, signals and the control socket;
 * with cluster.polling busy or adaptive the same loop also polls every completion queue and every
 * channel ring without waiting (see run()). The loop runs in a data-path thread per rail (device),
 * each pinned to its device's NUMA node (numa_topo.h) and sleeping on its own rail's transports;
 * rail 0's also serves everything else. The main thread sets up, waits for them and cleans up.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <stdatomic.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "admin.h"
#include "check.h"
#include "config.h"
#include "log.h"
#include "mesh.h"
#include "metrics_http.h"
#include "transport.h"
#include "util.h"

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

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: meshd --config FILE --node-id ID [--socket PATH]\n"
		"       meshd --check --config FILE [--node-id ID] [--socket PATH]\n"
		"       meshd --dump-config [--config FILE]\n"
		"\n"
		"Keeps this node's links of the cluster's full mesh of RC queue pairs: dials every\n"
		"peer with a lower id, accepts every peer with a higher id, proves each link's keys,\n"
		"watches it with keepalives and re-dials with backoff. Runs in the foreground and logs\n"
		"to stderr. SIGTERM or SIGINT disconnects cleanly.\n"
		"\n"
		"  -c, --config FILE    cluster configuration (libconfig), the same file on every node\n"
		"  -n, --node-id ID     this node's id in FILE (0..65535)\n"
		"  -s, --socket PATH    local control socket (default $%s, else %s)\n"
		"  -l, --log-level LVL  error|warn|info|debug (overrides cluster.log_level)\n"
		"      --check          check everything a start checks, without starting: the file,\n"
		"                       the key file; with --node-id, that the node is in the file, its\n"
		"                       addresses are this host's, its ports and socket are free and\n"
		"                       (rdma) a device serves each address. One line per problem;\n"
		"                       exit 0 when good, 1 otherwise\n"
		"      --dump-config    print every configuration key with default, range and help\n"
		"                       (with --config: and the values in force), then exit\n"
		"  -V, --version        print the version\n"
		"  -h, --help           this help\n"
		"\n"
		"Environment: MESH_LOG_TIME=1 stamps every line with the monotonic clock's seconds\n"
		"(for logs that no journal timestamps). When $JOURNAL_STREAM (systemd) names stderr,\n"
		"every line starts with its priority (<3> error ... <7> debug) instead.\n"
		"\n"
		"Exit status: 0 after a clean stop (or a good --check), 1 on a configuration or start-up\n"
		"error.\n",
		MESH_SOCKET_ENV, MESH_SOCKET_DEFAULT);
}

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

static int daemon_reload(void *ctx, const char *how, char *err, size_t errlen);

/* libsystemd's sd_notify(3), loaded only when $NOTIFY_SOCKET names a service manager's socket
 * (systemd's Type=notify sets it): linked, libsystemd mapped itself and six compression and crypto
 * libraries into every meshd, a run by hand or in a test included, which was a tenth of meshd's start
 * where 64 start at once (docs/design.md, "Formation"). Without the socket sd_notify does nothing. */
static const char *const sd_names[] = {"sd_notify", "sd_watchdog_enabled"};
enum { SD_NOTIFY, SD_WATCHDOG, SD_NSYMS };
static void *sd_sym[SD_NSYMS];

/* 0, or -ENOENT said (the manager would wait for READY=1 until its start timeout). */
static int notify_load(void)
{
	const char *sock = getenv("NOTIFY_SOCKET");
	char err[256];
	int ret;

	_Static_assert(ARRAY_SIZE(sd_names) == SD_NSYMS, "one name per symbol");
	if (!sock || !*sock)
		return 0;
	ret = util_dl_load(MESH_SYSTEMD_SONAME, sd_names, sd_sym, SD_NSYMS, err, sizeof(err));
	if (ret)
		log_error("NOTIFY_SOCKET is set (a service manager waits for READY=1) but %s (Debian's libsystemd0)",
			  err);
	return ret;
}

static void notify(const char *state)
{
	if (sd_sym[SD_NOTIFY])
		((__typeof__(sd_notify) *)sd_sym[SD_NOTIFY])(0, state);
}

/* STATUS= for systemctl status: links UP of all. No-op without $NOTIFY_SOCKET. */
static void notify_status(struct daemon *d, const char *extra)
{
	uint32_t up = mesh_links_up(&d->mesh);
	char state[128];

	d->status_up = up;
	snprintf(state, sizeof(state), "%sSTATUS=node %u: %u of %zu links UP", extra, d->mesh.self->id, up,
		 d->mesh.n_links);
	notify(state);
}

/* From the tick, which runs only after the batch's receives: a stalled loop stops feeding the
 * watchdog. */
static void notify_tick(struct daemon *d, uint64_t now)
{
	if (d->wd_every_ms && now - d->wd_last_ms >= d->wd_every_ms) {
		notify("WATCHDOG=1");
		d->wd_last_ms = now;
	}
	if (mesh_links_up(&d->mesh) != d->status_up)
		notify_status(d, "");
}

static int add_fd(int epfd, int fd, uint64_t tag)
{
	struct epoll_event ee = {.events = EPOLLIN, .data.u64 = tag | (uint32_t)fd};

	return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ee) ? -errno : 0;
}

/* Handles at most DRAIN_ROUNDS batches, so that a stream of completions never starves the timer
 * (keepalives) or the control socket; returns true when events may be left (come back at once:
 * completions already in a CQ raise no new readiness). all: look into every completion queue
 * (busy polling), not only the notified ones. *got counts the events handled. */
static bool drain_xport_n(struct daemon *d, xport_t *x, bool all, int *got)
{
	struct xport_event evs[EVENT_BATCH];
	int n;

	for (int round = 0; round < DRAIN_ROUNDS; round++) {
		n = all && round == 0 ? xport_poll_all(x, evs, EVENT_BATCH) : xport_poll(x, evs, EVENT_BATCH);
		for (int i = 0; i < n; i++)
			mesh_handle_event(&d->mesh, &evs[i]);
		mesh_reap(&d->mesh);
		if (n < 0)
			log_error("%s transport poll: %s", xport_name(x), mesh_strerror(n));
		else
			*got += n;
		if (n < EVENT_BATCH)
			return false;
	}
	return true;
}

/* Every address of every other node, for the providers (xport_attr.node_addrs): pointers into
 * d->cfg; *n set. NULL when out of memory. */
static const char **node_addrs_list(const struct daemon *d, const struct config_node *self, uint32_t *n)
{
	const char **a = calloc(d->cfg.n_nodes * CONFIG_RAILS_MAX, sizeof(*a));

	*n = 0;
	if (!a)
		return NULL;
	for (size_t i = 0; i < d->cfg.n_nodes; i++) {
		const struct config_node *nd = &d->cfg.nodes[i];

		if (nd == self)
			continue;
		for (uint32_t r = 0; r < MAX(1u, nd->n_rails); r++)
			a[(*n)++] = mesh_node_addr(nd, r);
	}
	return a;
}

/* One provider instance, told the other nodes' addresses (they are copied by create). */
static int xports_create_one(struct daemon *d, const struct config_node *self, const struct xport_ops *ops,
			     struct xport_attr *xa)
{
	const char **addrs = node_addrs_list(d, self, &xa->n_node_addrs);
	int ret;

	if (!addrs)
		return -ENOMEM;
	xa->node_addrs = addrs;
	ret = xport_create(ops, xa, &d->xports[d->n_xports]);
	xa->node_addrs = NULL;
	xa->n_node_addrs = 0;
	free(addrs);
	return ret;
}

/* The providers of cluster.transport for this node's addresses, in order of preference: an
 * instance of each on every rail (address) of the node. Each knows the other nodes' addresses. */
static int xports_open(struct daemon *d, const struct config_node *self)
{
	const struct xport_ops *want[MESH_XPORTS_MAX];
	uint32_t rails = MAX(1u, self->n_rails);
	size_t n = 0;
	struct xport_attr xa = {
		.connect_timeout_ms = d->cfg.connect_timeout_ms,
		.max_send_wr = LINK_SQ_DEPTH,
		.max_recv_wr = MAX(LINK_RECV_BUFS, LINK_DATA_RECVS),
		.ack_timeout = mesh_ack_timeout(d->cfg.keepalive_timeout_ms),
	};
	int ret;

	if (!strcmp(d->cfg.transport, "auto")) {
		/* rdma where devices serve our addresses; tcp always, so peers without RDMA reach us. */
		uint32_t r = 0;

		while (r < rails && xport_rdma_ops.probe(mesh_node_addr(self, r)))
			r++;
		if (r == rails)
			want[n++] = &xport_rdma_ops;
		else
			log_info("transport auto: no RDMA device serves %s, using tcp", mesh_node_addr(self, r));
		want[n++] = &xport_tcp_ops;
	} else {
		want[n] = xport_ops_find(d->cfg.transport);
		if (!want[n]) {
			log_error("transport %s is not built in", d->cfg.transport);
			return -EINVAL;
		}
		n++;
	}
	for (size_t i = 0; i < n * rails; i++) {
		const struct xport_ops *ops = want[i / rails];
		const char *addr = mesh_node_addr(self, (uint32_t)(i % rails));

		ret = xports_create_one(d, self, ops, &xa);
		if (ret) {
			log_error("cannot start the %s transport: %s", ops->name, mesh_strerror(ret));
			return ret;
		}
		d->n_xports++;
		ret = xport_listen(d->xports[i], addr, self->port);
		if (ret) {
			char why[256];

			check_listen_why(ret, ops, addr, self->port, self->id, why, sizeof(why));
			log_error("%s:%d: node %u: cannot listen on %s port %u (%s, rail %zu): %s", d->cfg.path, self->line,
				  self->id, addr, self->port, ops->name, i % rails, why);
			return ret;
		}
	}
	return 0;
}

/* Learns the topology, the node of each provider's device and the home node (numa_topo.h). Never
 * fatal: whatever cannot be learnt leaves meshd unplaced, and meshctl node says why. */
static void numa_setup(struct daemon *d)
{
	struct mesh_numa *nu = &d->mesh.numa;
	int mode = config_node_numa(&d->cfg, d->mesh.self);
	char why[256];
	int ret, dev_node = -1;

	ret = numa_topo_load(&nu->topo, "/", why, sizeof(why));
	if (ret) {
		log_warn("NUMA topology unreadable (%s): running unplaced", why);
		memset(&nu->topo, 0, sizeof(nu->topo));
	}
	nu->usable = !ret && numa_usable(&nu->topo, numa_lib_ok(), &nu->why);
	if (ret)
		nu->why = "the NUMA topology in sysfs is unreadable";
	for (size_t i = 0; i < d->n_xports && nu->n_devs < ARRAY_SIZE(nu->devs); i++) {
		struct mesh_numa_dev *dv = &nu->devs[nu->n_devs];

		if (xport_device(d->xports[i], dv->name, sizeof(dv->name)))
			continue;
		dv->provider = xport_name(d->xports[i]);
		dv->rail = (uint32_t)(i % d->mesh.n_rails);
		dv->node = -1;
		if (!strcmp(dv->provider, "rdma")) {
			const struct numa_dev *td = numa_topo_dev(&nu->topo, dv->name);

			if (td) {
				dv->node = td->node;
				util_strlcpy(dv->netdev, td->netdev, sizeof(dv->netdev));
			}
		} else {
			dv->node = numa_netdev_node("/", dv->name);
		}
		/* The preferred provider's devices decide: they carry the data of every peer that has
		 * them. Rail 0's is home, where the thread runs and unhinted channels of rail 0 go. */
		if (i < d->mesh.n_rails)
			nu->rail_node[dv->rail] = dv->node;
		if (!nu->n_devs)
			dev_node = dv->node;
		nu->n_devs++;
	}
	nu->by_device = mode == CONFIG_NUMA_AUTO;
	if (nu->usable || mode == CONFIG_NUMA_OFF)
		nu->home = numa_home(&nu->topo, nu->usable, mode, dev_node, &nu->why);
	if (mode >= 0 && nu->home != mode && nu->usable)
		log_warn("numa = %d: this machine has no such node (nodes 0..%d): running unplaced", mode,
			 nu->topo.n_nodes - 1);
	if (nu->home >= 0)
		snprintf(why, sizeof(why), "data path and rings on node %d (%s)", nu->home, nu->why);
	else
		snprintf(why, sizeof(why), "unplaced: %s", nu->why);
	log_info("NUMA: %d node(s), device %s on node %d; %s", nu->topo.n_online, nu->n_devs ? nu->devs[0].name : "?",
		 dev_node, why);
}

/* The tick every period_ms, the first in a millisecond: 0 or -errno. */
static int timer_set(int fd, uint32_t period_ms)
{
	struct itimerspec its = {
		.it_interval = {.tv_sec = period_ms / 1000, .tv_nsec = (long)(period_ms % 1000) * 1000000L},
		.it_value = {.tv_sec = 0, .tv_nsec = 1000000L},
	};

	return timerfd_settime(fd, 0, &its, NULL) ? -errno : 0;
}

static int timer_start(uint32_t period_ms)
{
	int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);

	if (fd < 0)
		return -errno;
	if (timer_set(fd, period_ms)) {
		int ret = -errno;

		close(fd);
		return ret;
	}
	return fd;
}

static int signals_open(void)
{
	sigset_t set;
	int fd;

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	if (sigprocmask(SIG_BLOCK, &set, NULL))
		return -errno;
	signal(SIGPIPE, SIG_IGN);
	fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/* Lets the Goodbye messages go out before the QPs are torn down, for at most STOP_GRACE_MS. Runs
 * when rail 0's thread is the only one left. */
static void stop_gracefully(struct daemon *d)
{
	uint64_t until = util_now_ms() + STOP_GRACE_MS;
	struct epoll_event ev;

	/* From here the loop sleeps on the transports: their notifications must be armed again, and
	 * every CQ looked into (a completion from before the arm raises none). */
	for (size_t i = 0; i < d->n_xports; i++)
		xport_arm(d->xports[i]);
	mesh_stop(&d->mesh);
	while (util_now_ms() < until) {
		bool busy = false;
		int got = 0;

		for (size_t i = 0; i < d->n_xports; i++)
			drain_xport_n(d, d->xports[i], true, &got);
		for (size_t i = 0; i < d->mesh.n_links; i++)
			busy |= d->mesh.links[i]->send_busy != 0;
		if (!busy)
			break;
		/* Any fd may wake us; only the transports matter now (the other rails' sleep in their
		 * own epoll: a short wait, not their readiness, paces this loop). */
		epoll_wait(d->epfd, &ev, 1, 20);
	}
}

/* Is transport instance i this thread's? Instances are provider-major, one per rail. */
static bool dp_owns(const struct dp *dp, size_t i)
{
	return i % dp->d->mesh.n_rails == dp->rail;
}

static bool ev_received(const struct xport_event *ev)
{
	return ev->op == XPORT_OP_RECV || ev->op == XPORT_OP_RECV_IMM;
}

/* Whether ev must wait for the usual way behind events already left to it: those of its work
 * queue (RC completes a queue's work in order, and the usual way's handling of the earlier one,
 * say a control message, may change what the later one means; a failed completion, whose opcode
 * says nothing, holds its whole QP) and anything after a connection event. Other events may be
 * taken first: RC orders nothing across QPs, nor a QP's sends against its receives, so nothing in
 * mesh.c or channel.c may rely on that order (a stripe's immediates, a control message on QP 0
 * and a chunk on QP 1, already come in any order). Before, everything polled after the first
 * deferred event waited: in the slow VM's batches of 20, each rail keepalive took up to 20 of a
 * stream's completions the usual way with it. */
static bool deferrable(const struct dp *dp, const struct xport_event *ev)
{
	for (int k = 0; k < dp->n_deferred; k++) {
		const struct xport_event *e = &dp->deferred[k];

		if (e->type != XPORT_EV_COMPLETION ||
		    (e->conn == ev->conn && (e->status || ev->status || ev_received(e) == ev_received(ev))))
			return true;
	}
	return false;
}

/* The fast path's drain of transport i (mesh_fast_event), under the rail's lock alone: what it
 * cannot take goes to dp->deferred (with what must follow it, deferrable), and no more is polled
 * until the usual way has handled them. Returns true when events may be left. */
static bool drain_fast(struct dp *dp, size_t i, bool all, int *got)
{
	struct daemon *d = dp->d;
	struct mesh_numa_thread *t = &d->mesh.numa.threads[dp->rail];
	struct xport_event evs[EVENT_BATCH];

	for (int round = 0; round < DRAIN_ROUNDS; round++) {
		int n;

		if (dp->n_deferred)
			return true; /* after the usual way's turn (the next round of the loop) */
		n = all && round == 0 ? xport_poll_all(d->xports[i], evs, EVENT_BATCH)
				      : xport_poll(d->xports[i], evs, EVENT_BATCH);
		if (n < 0) {
			log_error("%s transport poll: %s", xport_name(d->xports[i]), mesh_strerror(n));
			return false;
		}
		*got += n;
		for (int k = 0; k < n; k++) {
			if (!deferrable(dp, &evs[k]) && mesh_fast_event(&d->mesh, dp->rail, &evs[k]))
				t->fast_events++;
			else
				dp->deferred[dp->n_deferred++] = evs[k];
		}
		if (n < EVENT_BATCH)
			return dp->n_deferred > 0;
	}
	return true;
}

/* One look at everything of this rail without waiting (the polling part of the loop): every
 * completion queue and every ring, under the rail's lock alone. Returns true when anything moved. */
static bool poll_once(struct dp *dp)
{
	struct daemon *d = dp->d;
	int got = 0, moved;

	for (size_t i = 0; i < d->n_xports; i++)
		if (dp_owns(dp, i))
			d->more[i] = drain_fast(dp, i, true, &got);
	moved = channel_poll_fast(&d->mesh, dp->rail);
	dp->ring_moves += (uint64_t)moved;
	dp->polled = true;
	return got + moved > 0;
}

/* Channel data this thread moved so far: completions and immediates its fast path took, kicks,
 * rings found moved. Only these keep adaptive polling going: a keepalive, the tick or a control
 * message is not followed by more of its kind within microseconds, and polling after each (200 us
 * of yields) grew an idle meshd's CPU with its peers (32 idle meshd over tcp: 0.12 -> 0.08
 * CPU-seconds per second without it). */
static uint64_t dp_data_moves(const struct dp *dp)
{
	const struct mesh_numa_thread *t = &dp->d->mesh.numa.threads[dp->rail];

	return t->fast_events + t->kicks + dp->ring_moves;
}

/* Polling modes (cluster.polling): event sleeps in epoll_wait whenever nothing is pending; busy
 * never sleeps; adaptive polls for poll_budget_us after the last work, then sleeps. While polling,
 * the rings carry MESH_DAEMON_POLLING so applications do not kick; before sleeping the flag is
 * cleared and everything looked at once more (proto/ring.h). */
static bool stay_hot(struct dp *dp, bool worked)
{
	uint64_t now;

	if (dp->d->poll_mode == POLL_EVENT)
		return false;
	if (dp->d->poll_mode == POLL_BUSY)
		return true;
	/* Cold and nothing moved: stays cold without reading the clock (a system call where the
	 * clock source is an emulated HPET, once per wake-up of an idle meshd). */
	if (!worked && !dp->hot_until_us)
		return false;
	now = util_now_us();
	if (worked)
		dp->hot_until_us = now + dp->d->cfg.poll_budget_us;
	if (now < dp->hot_until_us)
		return true;
	dp->hot_until_us = 0;
	return false;
}

/* Under the rail's lock: whether this thread must take every lock now (events left to the usual
 * way, channels left to the usual pump, channels to the local node with work queued). */
static bool slow_wanted(struct dp *dp)
{
	struct mesh *m = &dp->d->mesh;

	m->rail_deferring[dp->rail] = dp->n_deferred > 0;
	return dp->n_deferred || m->rail_slow[dp->rail] || channel_local_pending(m);
}

/* `meshctl drain` (admin.c): meshd stops once no channel is left, or DRAIN_GRACE_MS after the
 * deadline (channel_tick failed what was left with MESH_EDRAINING at the deadline: their Closes go
 * out meanwhile). */
#define DRAIN_GRACE_MS 500
static void drain_check(struct daemon *d, uint64_t now, bool *running)
{
	struct mesh *m = &d->mesh;

	if (!m->draining || !*running)
		return;
	if (!m->n_channels)
		log_info("drained: no channel left, stopping");
	else if (now >= m->drain_deadline_ms + DRAIN_GRACE_MS)
		log_info("drain deadline passed with %u channel(s) left (failed with \"%s\"): stopping", m->n_channels,
			 mesh_strerror(-MESH_EDRAINING));
	else
		return;
	*running = false;
}

/* Everything but the fast path, under every lock: the events the fast path left, in order, then
 * the other descriptors of this batch (evs: timer, signals, control socket's work, kicks,
 * lifelines, metrics), the tick, the channels left to the usual pump and the channels to the local
 * node. Clears *running on a stop. */
static void slow_path(struct dp *dp, const struct epoll_event *evs, int n, bool *running)
{
	struct daemon *d = dp->d;
	struct mesh *m = &d->mesh;
	bool tick = false;

	mesh_lock_all(&d->locks);
	m->numa.threads[dp->rail].slow_sections++;
	/* Every rail's: a rail's thread may hold events it polled and left here while it waits for
	 * these locks, and the tick below must not judge a link before reading them (a keepalive
	 * among them: a busy rail's thread lost a link so, with both peers alive). */
	for (uint32_t r = 0; r < m->n_rails; r++) {
		struct dp *o = &d->dp[r];

		m->numa.threads[r].deferred_events += (uint64_t)o->n_deferred;
		for (int k = 0; k < o->n_deferred; k++)
			mesh_handle_event(m, &o->deferred[k]);
		o->n_deferred = 0;
		m->rail_deferring[r] = false;
	}
	mesh_reap(m);
	for (int i = 0; i < n; i++) {
		uint32_t tag = (uint32_t)(evs[i].data.u64 >> 32);
		int fd = (int)(uint32_t)evs[i].data.u64;

		switch (tag) {
		case TAG_TIMER: {
			uint64_t exp;

			if (read(fd, &exp, sizeof(exp)) < 0 && errno != EAGAIN)
				log_warn("timerfd read: %m");
			tick = true; /* after the receives of this batch, below */
			break;
		}
		case TAG_SIGNAL: {
			struct signalfd_siginfo si = {0};

			if (read(fd, &si, sizeof(si)) == sizeof(si) && si.ssi_signo == SIGHUP) {
				char err[512];

				daemon_reload(d, "SIGHUP", err, sizeof(err));
			} else if (si.ssi_signo) {
				log_info("signal %s: stopping", strsignal((int)si.ssi_signo));
				*running = false;
			}
			break;
		}
		case TAG_STOP:
			*running = false;
			break;
		case TAG_ADMIN_WORK:
			admin_work(&d->admin);
			break;
		case TAG_CH_LIFE:
			channel_on_lifeline(m, (uint32_t)fd);
			break;
		case TAG_METRICS:
			metrics_http_run(d->metrics);
			break;
		}
	}
	/* Timers judge liveness only after everything that arrived has been read: a meshd that was
	 * not scheduled for a while (paused, or a loaded machine) finds its peers' keepalives in
	 * this batch, and must not declare a merely delayed link dead. */
	if (tick) {
		uint64_t now, dropped;
		bool late;
		int got = 0;

		/* The timer must not judge before everything that arrived was read. A thread stopped
		 * while it polled (SIGSTOP, a long preemption) had left its CQs unarmed, so what
		 * arrived meanwhile raised no readiness: the loop's poll_once looked into every CQ
		 * just before this (a polling thread; a cold one sleeps armed, and its notified
		 * CQs were taken), so only what it left (a drain cut short) is taken here. Looking
		 * into every CQ again cost an idle meshd with 63 peers a tenth of its CPU under
		 * emulation (126 CQs ten times a second, rxe's poll_cq taking a lock each). And an
		 * every-CQ look must not be taken here: it leaves the transport polling (no
		 * re-arming), which polling = event never undoes (every CQ stayed unarmed after the
		 * first tick and a channel over rdma moved one message per tick, 50 ms), nor a cold
		 * thread that goes to sleep without its last look. */
		for (size_t i = 0; i < d->n_xports; i++)
			if (dp_owns(dp, i) && (d->poll_mode == POLL_EVENT || d->more[i]))
				d->more[i] = drain_xport_n(d, d->xports[i], false, &got);
		/* A tick far later than its period: the loop (or the machine) stalled, and a peer may
		 * have taken our links DOWN meanwhile; said, so that such a DOWN is explained. */
		now = util_now_ms();
		late = d->tick_last_ms && now - d->tick_last_ms > SLOW_WARN_MS;
		if (late && log_ratelimit_ok(&d->late_rl, now, &dropped))
			log_warn("the tick came %llu ms after the last one (period %u ms): this loop or the machine stalled "
				 "(%llu such lines not logged before this one)", (unsigned long long)(now - d->tick_last_ms),
				 d->tick_period_ms, (unsigned long long)dropped);
		d->tick_last_ms = now;
		/* And what arrived during the stall may not be read yet: a thread stopped between a
		 * look into its transports and their re-arming (or while it polled) raised no readiness
		 * for it, so this batch holds the timer alone, and the peers' keepalives sit unread
		 * (a meshd paused past its own keepalive timeout took three live links DOWN so, in
		 * mesh_test's mixed cluster in the VM). Such a tick judges no link or rail by its
		 * keepalives (everything else of the tick runs: skipping it all slowed a formation
		 * storm, where ticks come late): the loop takes a full look first (polled: it looks
		 * again before it sleeps; the other rails' threads look on their own), and the next
		 * tick, a period later, judges. Once only: a loop late at every tick still judges at
		 * every other one. */
		m->tick_no_liveness = late && !d->tick_deferred;
		d->tick_deferred = m->tick_no_liveness;
		if (m->tick_no_liveness)
			dp->polled = true;
		mesh_tick(m, now);
		m->tick_no_liveness = false;
		mesh_reap(m);
		drain_check(d, now, running);
		admin_snapshot(&d->admin, util_now_ms());
		metrics_http_run(d->metrics); /* its connection timeouts */
		notify_tick(d, util_now_ms());
	}
	channel_pump_wanted(m, dp->rail);
	/* What this batch told channels to the local node reaches them now, outside any handler. */
	channel_local_run(m);
	/* What the handlers released goes after the batch (no event above may still name it). */
	mesh_reap(m);
	mesh_unlock_all(&d->locks);
}

/* The rail's lock for its fast path. Whoever waits to take every lock (the control plane, the
 * control socket) goes first: a mutex does not queue, and a busy rail's thread that unlocks and
 * locks again at once kept it from them for seconds. */
static void rail_lock(struct dp *dp)
{
	struct mesh_locks *k = &dp->d->locks;

	if (atomic_load_explicit(&k->all_waiting, memory_order_acquire)) {
		pthread_mutex_lock(&k->ctl);
		pthread_mutex_unlock(&k->ctl);
	}
	pthread_mutex_lock(&k->rail[dp->rail]);
}

static int run(struct dp *dp)
{
	struct daemon *d = dp->d;
	struct mesh *m = &d->mesh;
	pthread_mutex_t *lock = &d->locks.rail[dp->rail];
	struct epoll_event evs[32];
	bool running = true, hot = d->poll_mode == POLL_BUSY;

	rail_lock(dp);
	if (hot)
		channel_set_polling(m, dp->rail, true);
	pthread_mutex_unlock(lock);
	while (running) {
		bool more = false, slow, worked, drained[MESH_XPORT_INSTANCES] = {false};
		uint64_t moves;
		int n, got = 0;

		rail_lock(dp);
		for (size_t i = 0; i < d->n_xports; i++)
			more |= dp_owns(dp, i) && d->more[i];
		more |= channel_local_pending(m);
		if (!hot && !more && dp->polled) {
			/* About to sleep: applications kick again from now on; what they published before
			 * they could see the cleared flag is found by this last look. */
			channel_set_polling(m, dp->rail, false);
			for (size_t i = 0; i < d->n_xports; i++)
				if (dp_owns(dp, i))
					xport_arm(d->xports[i]);
			moves = dp_data_moves(dp);
			if (poll_once(dp)) {
				hot = stay_hot(dp, dp_data_moves(dp) != moves);
				if (hot)
					channel_set_polling(m, dp->rail, true);
				slow = slow_wanted(dp);
				pthread_mutex_unlock(lock);
				if (slow)
					slow_path(dp, NULL, 0, &running);
				continue;
			}
			dp->polled = false; /* that look found nothing: now sleep */
			/* That look polled every CQ, which leaves the transport polling (a notification
			 * would not re-arm its CQ): sleep armed, as the cold rounds below rely on. */
			for (size_t i = 0; i < d->n_xports; i++)
				if (dp_owns(dp, i))
					xport_arm(d->xports[i]);
		}
		pthread_mutex_unlock(lock);
		if (hot && !more && ++dp->hot_rounds % HOT_EPOLL_EVERY)
			n = 0;
		else
			n = epoll_wait(dp->epfd, evs, (int)ARRAY_SIZE(evs), more || hot ? 0 : -1);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			log_error("epoll_wait: %m");
			return -errno;
		}
		slow = false;
		rail_lock(dp);
		m->numa.threads[dp->rail].wakes++;
		moves = dp_data_moves(dp);
		for (int i = 0; i < n; i++) {
			uint32_t tag = (uint32_t)(evs[i].data.u64 >> 32);
			int fd = (int)(uint32_t)evs[i].data.u64;

			if (tag == TAG_CH_KICK) {
				/* One of this rail's channels: its application published and meshd slept. */
				if (channel_on_kick_fast(m, (uint32_t)fd, dp->rail)) {
					m->numa.threads[dp->rail].kicks++;
					got++;
				}
			} else if (tag != TAG_XPORT) {
				slow = true; /* the control plane's, below */
			} else if ((size_t)fd < d->n_xports) {
				d->more[fd] = drain_fast(dp, (size_t)fd, false, &got);
				drained[fd] = true;
			}
		}
		/* A transport cut short by DRAIN_ROUNDS continues now, after the others had their turn. */
		for (size_t i = 0; i < d->n_xports; i++)
			if (dp_owns(dp, i) && d->more[i] && !drained[i])
				d->more[i] = drain_fast(dp, i, false, &got);
		worked = n > 0;
		if (d->poll_mode != POLL_EVENT) {
			/* Polling, or channel data just moved: look into everything. A cold thread that a
			 * keepalive's completion or the timer woke took what notified it and sleeps again,
			 * armed: a look into every CQ there, and the last look before sleeping that it
			 * entails, cost an idle meshd two polls of each of its 126 CQs per wake-up. */
			if (hot || dp_data_moves(dp) != moves)
				worked = poll_once(dp) || worked;
			hot = stay_hot(dp, dp_data_moves(dp) != moves);
			if (hot && !m->polling[dp->rail])
				channel_set_polling(m, dp->rail, true);
		}
		slow |= slow_wanted(dp);
		pthread_mutex_unlock(lock);
		if (slow)
			slow_path(dp, evs, n, &running);
		/* Nothing to do this round: let whoever we wait for (an application, rxe's softirq,
		 * the peer meshd on the same machine) have the CPU. */
		if (hot && !worked)
			sched_yield();
	}
	return 0;
}

static void *data_path_main(void *arg)
{
	struct dp *dp = arg;
	struct mesh_numa *nu = &dp->d->mesh.numa;
	int node = mesh_rail_node(&dp->d->mesh, dp->rail, -1);

	nu->threads[dp->rail].tid = (uint32_t)gettid();
	if (node >= 0 && CPU_COUNT(&nu->topo.cpus[node])) {
		int ret = pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), &nu->topo.cpus[node]);

		if (ret)
			log_warn("cannot pin the data-path thread of rail %u to node %d: %s", dp->rail, node,
				 strerror(ret));
	}
	dp->status = run(dp);
	if (dp->rail == 0) {
		/* The others stop first (the control socket's thread too): then the goodbyes go out with
		 * nobody else on the mesh. */
		admin_stop(&dp->d->admin);
		for (uint32_t r = 1; r < dp->d->mesh.n_rails; r++) {
			uint64_t one = 1;

			if (write(dp->d->dp[r].stop_fd, &one, sizeof(one)) < 0)
				log_warn("cannot stop the data-path thread of rail %u: %m", r);
			pthread_join(dp->d->dp[r].thread, NULL);
		}
		stop_gracefully(dp->d);
	}
	return NULL;
}

/* Starts a data-path thread per rail, named after its device ("dp-rxe0": the kernel keeps 15
 * characters), and waits for them. */
static int run_data_path(struct daemon *d)
{
	struct mesh_numa *nu = &d->mesh.numa;
	uint32_t rails = d->mesh.n_rails, started = 1;
	int ret = 0;

	for (uint32_t r = 0; r < rails; r++) {
		struct mesh_numa_thread *t = &nu->threads[r];

		memcpy(t->name, "dp-", 3);
		util_strlcpy(t->name + 3, "meshd", sizeof(t->name) - 3);
		t->devices[0] = 0;
		for (size_t i = 0; i < nu->n_devs; i++) {
			if (nu->devs[i].rail != r)
				continue;
			if (t->devices[0])
				strncat(t->devices, ",", sizeof(t->devices) - strlen(t->devices) - 1);
			else
				util_strlcpy(t->name + 3, nu->devs[i].name, sizeof(t->name) - 3);
			strncat(t->devices, nu->devs[i].name, sizeof(t->devices) - strlen(t->devices) - 1);
		}
		t->node = mesh_rail_node(&d->mesh, r, -1);
	}
	nu->n_threads = rails;
	/* Rails 1.. first: rail 0's thread stops them when it ends, so it starts only when they all run. */
	for (started = 1; started < rails && !ret; started++) {
		ret = -pthread_create(&d->dp[started].thread, NULL, data_path_main, &d->dp[started]);
		if (!ret)
			pthread_setname_np(d->dp[started].thread, nu->threads[started].name);
	}
	if (!ret) {
		ret = -pthread_create(&d->dp[0].thread, NULL, data_path_main, &d->dp[0]);
		if (!ret)
			pthread_setname_np(d->dp[0].thread, nu->threads[0].name);
	} else {
		started--; /* the one that failed */
	}
	if (ret) {
		log_error("cannot start the data-path threads: %s", strerror(-ret));
		for (uint32_t r = 1; r < started; r++) {
			uint64_t one = 1;

			if (write(d->dp[r].stop_fd, &one, sizeof(one)) < 0)
				log_warn("cannot stop the data-path thread of rail %u: %m", r);
			pthread_join(d->dp[r].thread, NULL);
		}
	} else {
		pthread_join(d->dp[0].thread, NULL); /* rail 0 joins the others */
	}
	return ret ? ret : d->dp[0].status;
}

/* The data-path threads' state; rails 1.. get their own epoll set with their transports, a stop
 * eventfd and (admin_bind_channels) their channels' kicks. Before the control socket serves: a
 * channel's kick goes to its rail's set from the first. */
static int dp_open(struct daemon *d)
{
	int ret = 0;

	for (uint32_t r = 0; r < MESH_RAILS_MAX; r++) {
		d->dp[r].d = d;
		d->dp[r].rail = r;
		d->dp[r].epfd = r ? -1 : d->epfd;
		d->dp[r].stop_fd = -1;
	}
	for (uint32_t r = 1; r < d->mesh.n_rails && !ret; r++) {
		struct dp *dp = &d->dp[r];

		dp->epfd = epoll_create1(EPOLL_CLOEXEC);
		dp->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (dp->epfd < 0 || dp->stop_fd < 0 || add_fd(dp->epfd, dp->stop_fd, TAG(TAG_STOP)))
			ret = -errno;
		for (size_t i = 0; i < d->n_xports && !ret; i++) {
			struct epoll_event ee = {.events = EPOLLIN, .data.u64 = TAG(TAG_XPORT) | i};

			if (dp_owns(dp, i) && epoll_ctl(dp->epfd, EPOLL_CTL_ADD, xport_event_fd(d->xports[i]), &ee))
				ret = -errno;
		}
	}
	if (ret)
		log_error("cannot set up the data-path threads' epoll: %s", strerror(-ret));
	return ret;
}

static void dp_close(struct daemon *d)
{
	for (uint32_t r = 1; r < MESH_RAILS_MAX; r++) {
		if (d->dp[r].epfd >= 0)
			close(d->dp[r].epfd);
		if (d->dp[r].stop_fd >= 0)
			close(d->dp[r].stop_fd);
		d->dp[r].epfd = d->dp[r].stop_fd = -1;
	}
}

/* cluster.key_file, relative to the configuration file's directory; "" loads nothing. */
/* 0 (the keys, or none without key_file), or an error written into err. */
static int load_keys(const struct mesh_config *cfg, const char *cfg_path, struct auth_keys *keys, char *err,
		     size_t errlen)
{
	char path[PATH_MAX];
	int ret;

	memset(keys, 0, sizeof(*keys));
	if (!cfg->key_file[0])
		return 0;
	if (check_key_path(cfg, cfg_path, path, sizeof(path))) {
		snprintf(err, errlen, "cluster.key_file %s: the path is too long", cfg->key_file);
		return -ENAMETOOLONG;
	}
	ret = auth_load_keys(path, keys, err, errlen);
	if (!ret)
		log_info("cluster key from %s (%u key%s)", path, keys->n, keys->n > 1 ? "s: current and next" : "");
	return ret;
}

/* Takes a reload's outcome into what `meshctl node` and the metrics show, and tells systemd. */
static void reload_done(struct daemon *d, int ret, const char *err)
{
	struct mesh_conf_state *c = &d->mesh.conf;

	if (ret) {
		c->refused++;
		util_strlcpy(c->error, err, sizeof(c->error));
	} else {
		c->reloads++;
		c->generation++;
		c->loaded_us = util_wall_us();
		c->error[0] = '\0';
	}
	notify_status(d, "READY=1\n");
}

/* The providers' lists of the other nodes' addresses (xport_attr.node_addrs), after a reload. */
static void xports_node_addrs(struct daemon *d, const struct config_node *self)
{
	uint32_t n;
	const char **addrs = node_addrs_list(d, self, &n);

	for (size_t i = 0; addrs && i < d->n_xports; i++)
		if (xport_set_node_addrs(d->xports[i], addrs, n))
			addrs = NULL;
	if (!addrs)
		log_warn("reload: no memory for the nodes' addresses: the transports keep the old list");
	free(addrs);
}

/* The new metrics address in the other slot, before the old one is given up; 0, or err said. */
static int reload_metrics_open(struct daemon *d, const char *listen, struct metrics_http **out, char *err,
			       size_t errlen)
{
	struct metrics_http *o = &d->metrics_slot[d->metrics == &d->metrics_slot[0]];
	int ret;

	memset(o, 0, sizeof(*o));
	o->fd = -1;
	ret = metrics_http_open(o, listen, &d->admin);
	if (!ret && o->fd >= 0 && (ret = add_fd(d->epfd, o->fd, TAG(TAG_METRICS))))
		metrics_http_close(o);
	if (ret)
		snprintf(err, errlen, "metrics_listen \"%s\": cannot serve there (%s)", listen, mesh_strerror(ret));
	*out = o;
	return ret;
}

/*
 * Reads the configuration file again and applies what changed, with every lock held: from SIGHUP
 * or `meshctl reload` (how says which). A file that does not load, a key only a start applies that
 * changed (config_reload_check), a key file that does not load or a metrics address that cannot be
 * served refuses the whole reload: meshd keeps what it had and err says why. Otherwise the links
 * follow the nodes (mesh_reconfigure: only those added, removed or moved are touched), new keys
 * serve the next handshakes (links already proven stay), and limits, timeouts, the log level and
 * the metrics address apply from now on. 0 or a negative errno.
 */
static int daemon_reload(void *ctx, const char *how, char *err, size_t errlen)
{
	struct daemon *d = ctx;
	struct mesh_config nc = {0}, old;
	const struct config_node *self;
	struct metrics_http *mh = NULL;
	struct auth_keys keys = {0};
	struct mesh_reconf rc;
	const char *listen;
	char why[448];
	int ret;

	notify("RELOADING=1\nSTATUS=reloading the configuration");
	log_info("reloading %s (%s)", d->cfg_path, how);
	ret = config_load(d->cfg_path, &nc, err, errlen);
	if (!ret && (ret = config_reload_check(&d->cfg, &nc, d->self_id, why, sizeof(why))))
		snprintf(err, errlen, "%s: %s", d->cfg_path, why);
	if (!ret)
		ret = load_keys(&nc, d->cfg_path, &keys, err, errlen);
	self = ret ? NULL : config_node_find(&nc, d->self_id);
	listen = self ? config_node_metrics_listen(&nc, self) : "";
	if (!ret && strcmp(listen, config_node_metrics_listen(&d->cfg, d->mesh.self)))
		ret = reload_metrics_open(d, listen, &mh, err, errlen);
	if (ret) {
		log_error("reload refused, nothing was changed: %s", err);
		config_free(&nc);
		explicit_bzero(&keys, sizeof(keys));
		reload_done(d, ret, err);
		return ret;
	}
	old = d->cfg;
	d->cfg = nc; /* where m->cfg points */
	self = config_node_find(&d->cfg, d->self_id);
	mesh_reconfigure(&d->mesh, self, &rc);
	xports_node_addrs(d, self);
	explicit_bzero(&d->mesh.keys, sizeof(d->mesh.keys));
	d->mesh.keys = keys;
	explicit_bzero(&keys, sizeof(keys));
	if (!d->level_override)
		log_set_level((enum log_level)log_level_parse(d->cfg.log_level));
	if (d->cfg.keepalive_interval_ms != old.keepalive_interval_ms) {
		d->tick_period_ms = MAX(5u, MIN(100u, d->cfg.keepalive_interval_ms / 4));
		timer_set(d->tfd, d->tick_period_ms);
	}
	if (mh) {
		if (d->metrics->fd >= 0)
			epoll_ctl(d->epfd, EPOLL_CTL_DEL, d->metrics->fd, NULL);
		metrics_http_close(d->metrics);
		d->metrics = mh;
		log_info("metrics: %s%s", listen[0] ? "serving at " : "no longer served", listen);
	}
	config_free(&old);
	reload_done(d, 0, "");
	log_info("configuration reloaded (generation %llu): %u node(s) added, %u removed, %u moved; %zu peers",
		 (unsigned long long)d->mesh.conf.generation, rc.added, rc.removed, rc.moved, d->mesh.n_links);
	return 0;
}

/* meshd holds descriptors for every channel (the ring's memfd, the application's lifeline, kick
 * and wake), every QP or tcp connection and every control client. systemd's soft default of 1024
 * ran out at 332 channels of one user: then nobody got in, not root's meshctl, not a peer
 * rejoining ("Too many open files"). The soft limit goes up to the hard one at start, as systemd's
 * own daemons do (the unit raises the hard one: LimitNOFILE=), never past the kernel's nr_open. */
#define FD_LIMIT_CAP (1u << 20)
#define FD_LIMIT_WANT 65536u

static uint64_t fd_limit_raise(void)
{
	struct rlimit rl;
	rlim_t was;

	if (getrlimit(RLIMIT_NOFILE, &rl)) {
		log_warn("getrlimit(RLIMIT_NOFILE): %m");
		return 0;
	}
	was = rl.rlim_cur;
	if (rl.rlim_cur < rl.rlim_max && rl.rlim_cur < FD_LIMIT_CAP) {
		rl.rlim_cur = rl.rlim_max < FD_LIMIT_CAP ? rl.rlim_max : FD_LIMIT_CAP;
		while (setrlimit(RLIMIT_NOFILE, &rl) && errno == EPERM && rl.rlim_cur > was * 2)
			rl.rlim_cur /= 2; /* above fs.nr_open */
		if (getrlimit(RLIMIT_NOFILE, &rl))
			rl.rlim_cur = was;
	}
	if (rl.rlim_cur < FD_LIMIT_WANT)
		log_warn("descriptors: at most %llu (RLIMIT_NOFILE; the hard limit is %llu): each channel takes four and "
			 "each QP or connection one; raise it (systemd: LimitNOFILE=, the unit sets %u)",
			 (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max, FD_LIMIT_WANT);
	else if (rl.rlim_cur != was)
		log_info("descriptors: at most %llu (RLIMIT_NOFILE raised from %llu)", (unsigned long long)rl.rlim_cur,
			 (unsigned long long)was);
	return rl.rlim_cur == RLIM_INFINITY ? 0 : (uint64_t)rl.rlim_cur;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"config", required_argument, NULL, 'c'},   {"node-id", required_argument, NULL, 'n'},
		{"socket", required_argument, NULL, 's'},   {"log-level", required_argument, NULL, 'l'},
		{"dump-config", no_argument, NULL, 'D'},    {"version", no_argument, NULL, 'V'},
		{"check", no_argument, NULL, 'C'},
		{"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
	};
	const char *cfg_path = NULL, *sock = getenv(MESH_SOCKET_ENV), *level = NULL, *log_time;
	long node_id = -1;
	bool dump = false, check = false;
	struct daemon d = {.epfd = -1, .tfd = -1, .sfd = -1, .metrics_slot = {{.fd = -1}, {.fd = -1}}};
	const struct config_node *self;
	struct auth_keys keys;
	int rail_epfd[MESH_RAILS_MAX];
	char err[512], prefix[32];
	int c, ret, status = 1;
	uint64_t fd_limit;

	if (!sock || !*sock)
		sock = MESH_SOCKET_DEFAULT;
	/* A bad configuration is an error the journal must see as one (journalctl -p err). */
	log_set_prefix("meshd");
	log_journal_detect();
	mesh_locks_init(&d.locks);
	while ((c = getopt_long(argc, argv, "c:n:s:l:Vh", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			cfg_path = optarg;
			break;
		case 'n': {
			char *end;

			errno = 0;
			node_id = strtol(optarg, &end, 10);
			if (errno || *end || end == optarg || node_id < 0 || node_id > 65535) {
				fprintf(stderr, "meshd: --node-id %s: expected a number 0..65535\n", optarg);
				return 1;
			}
			break;
		}
		case 's':
			sock = optarg;
			break;
		case 'l':
			level = optarg;
			break;
		case 'D':
			dump = true;
			break;
		case 'C':
			check = true;
			break;
		case 'V':
			printf("meshd %d.%d\n", MESH_VERSION_MAJOR, MESH_VERSION_MINOR);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "meshd: unexpected argument '%s' (try --help)\n", argv[optind]);
		return 1;
	}
	if (level && log_level_parse(level) < 0) {
		fprintf(stderr, "meshd: --log-level %s: expected error, warn, info or debug\n", level);
		return 1;
	}
	if (check && dump) {
		fprintf(stderr, "meshd: --check and --dump-config do not go together\n");
		return 1;
	}
	if (check) {
		if (!cfg_path) {
			fprintf(stderr, "meshd: --check needs --config FILE (try --help)\n");
			return 1;
		}
		return check_run(cfg_path, node_id, sock, stdout, stderr) ? 1 : 0;
	}
	if (dump && !cfg_path) {
		config_dump(stdout, NULL);
		return 0;
	}
	if (!cfg_path || (node_id < 0 && !dump)) {
		fprintf(stderr, "meshd: --config and --node-id are required (try --help)\n");
		return 1;
	}
	ret = config_load(cfg_path, &d.cfg, err, sizeof(err));
	if (ret) {
		log_error("%s", err);
		return 1;
	}
	if (dump) {
		config_dump(stdout, &d.cfg);
		config_free(&d.cfg);
		return 0;
	}
	self = config_node_find(&d.cfg, (uint32_t)node_id);
	if (!self) {
		log_error("%s:%d: node id %ld is not in nodes (%zu nodes, ids %u..%u)", cfg_path, d.cfg.nodes_line,
			  node_id, d.cfg.n_nodes, d.cfg.nodes[0].id, d.cfg.nodes[d.cfg.n_nodes - 1].id);
		config_free(&d.cfg);
		return 1;
	}
	snprintf(prefix, sizeof(prefix), "meshd[%u]", self->id);
	log_set_prefix(prefix);
	log_time = getenv("MESH_LOG_TIME");
	log_set_timestamps(log_time && *log_time && strcmp(log_time, "0"));
	log_set_level((enum log_level)log_level_parse(level ? level : d.cfg.log_level));
	if (notify_load())
		goto out_xport;
	if (load_keys(&d.cfg, cfg_path, &keys, err, sizeof(err))) {
		log_error("%s", err);
		goto out_xport;
	}
	d.cfg_path = cfg_path;
	d.self_id = self->id;
	d.level_override = level;
	fd_limit = fd_limit_raise();
	if (!keys.n)
		log_warn("no cluster.key_file: any host that reaches %s port %u can join cluster \"%s\" as any node "
			 "(`meshctl keygen` makes a key)",
			 self->addr, self->port, d.cfg.cluster_name);

	d.poll_mode = !strcmp(d.cfg.polling, "busy")	    ? POLL_BUSY
		      : !strcmp(d.cfg.polling, "event") ? POLL_EVENT
							: POLL_ADAPTIVE;
	ret = xports_open(&d, self);
	if (ret)
		goto out_xport;
	ret = mesh_init(&d.mesh, &d.cfg, self, d.xports, d.n_xports);
	if (ret) {
		log_error("cannot set up the links: %s", mesh_strerror(ret));
		goto out_xport;
	}
	d.mesh.upper = &channel_upper; /* channels ride the links */
	d.mesh.fd_limit = fd_limit;
	d.locks.n_rails = d.mesh.n_rails;
	d.mesh.keys = keys;
	explicit_bzero(&keys, sizeof(keys));
	d.mesh.conf.generation = 1;
	d.mesh.conf.loaded_us = util_wall_us();
	d.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (d.epfd < 0) {
		log_error("epoll_create1: %m");
		goto out_mesh;
	}
	d.sfd = signals_open();
	if (d.sfd < 0) {
		log_error("signalfd: %s", strerror(-d.sfd));
		goto out_epoll;
	}
	/* The tick paces keepalives, timeouts and re-dials: a quarter of the keepalive interval,
	 * at most 100 ms, so an idle meshd wakes rarely. */
	d.tick_period_ms = MAX(5u, MIN(100u, d.cfg.keepalive_interval_ms / 4));
	d.late_rl.interval_ms = 60000;
	d.late_rl.burst = 3;
	d.tfd = timer_start(d.tick_period_ms);
	if (d.tfd < 0) {
		log_error("timerfd: %s", strerror(-d.tfd));
		goto out_signals;
	}
	/* The transports' tag carries their index where other tags carry an fd. */
	ret = 0;
	for (size_t i = 0; i < d.n_xports && !ret; i++) {
		struct epoll_event ee = {.events = EPOLLIN, .data.u64 = TAG(TAG_XPORT) | i};

		/* Rail 0's thread sleeps here; the other rails' threads in their own (run_data_path). */
		if (i % d.mesh.n_rails == 0 && epoll_ctl(d.epfd, EPOLL_CTL_ADD, xport_event_fd(d.xports[i]), &ee))
			ret = -errno;
	}
	if (!ret)
		ret = add_fd(d.epfd, d.tfd, TAG(TAG_TIMER));
	if (!ret)
		ret = add_fd(d.epfd, d.sfd, TAG(TAG_SIGNAL));
	if (ret) {
		log_error("epoll_ctl: %s", strerror(-ret));
		goto out_timer;
	}
	/* Before the control socket listens: a client that connects is answered by a thread that is
	 * already there, not queued behind start-up (sysfs, libnuma; on a loaded machine whose root is
	 * a network file system, seconds). */
	numa_setup(&d);
	if (dp_open(&d))
		goto out_dp;
	ret = admin_open(&d.admin, sock, d.epfd, TAG(TAG_ADMIN_WORK), &d.mesh, &d.locks);
	if (ret)
		goto out_admin;
	d.admin.reload = daemon_reload;
	d.admin.reload_ctx = &d;
	for (uint32_t r = 0; r < d.mesh.n_rails; r++)
		rail_epfd[r] = d.dp[r].epfd;
	admin_bind_channels(&d.admin, TAG(TAG_CH_KICK), TAG(TAG_CH_LIFE), rail_epfd, d.mesh.n_rails);
	/* A listener like the others: READY=1 (below) only once it serves. */
	d.metrics = &d.metrics_slot[0];
	if (metrics_http_open(d.metrics, config_node_metrics_listen(&d.cfg, self), &d.admin))
		goto out_metrics;
	if (d.metrics->fd >= 0) {
		ret = add_fd(d.epfd, d.metrics->fd, TAG(TAG_METRICS));
		if (ret) {
			log_error("epoll_ctl (metrics endpoint): %s", strerror(-ret));
			goto out_metrics;
		}
	}
	log_info("node %u of cluster \"%s\" listening on %s port %u (%s, %u QPs per link, %zu peers), control socket %s",
		 self->id, d.cfg.cluster_name, self->addr, self->port, d.mesh.xport_names, d.cfg.qps_per_link, d.mesh.n_links,
		 sock);
	/* The control socket's own thread (admin.h): requests never wait behind link work. Its first
	 * snapshot is taken here, alone on the mesh: the data path's first batch (a whole cluster's
	 * connection requests at once) has held the lock for seconds before its first tick. */
	admin_snapshot(&d.admin, util_now_ms());
	if (!admin_start(&d.admin)) {
		uint64_t usec = 0;

		/* Half the interval systemd allows, as sd_watchdog_enabled(3) advises. */
		if (sd_sym[SD_WATCHDOG] && ((__typeof__(sd_watchdog_enabled) *)sd_sym[SD_WATCHDOG])(0, &usec) > 0)
			d.wd_every_ms = MAX(1u, usec / 2000);
		d.wd_last_ms = util_now_ms();
		/* The listeners and the control socket are up and served: applications may connect. */
		notify_status(&d, "READY=1\n");
		if (!run_data_path(&d))
			status = 0;
	}
	notify("STOPPING=1\nSTATUS=stopping");
	admin_stop(&d.admin);
out_metrics:
	metrics_http_close(d.metrics);
out_admin:
	admin_close(&d.admin);
out_dp:
	dp_close(&d);
out_timer:
	close(d.tfd);
out_signals:
	close(d.sfd);
out_epoll:
	close(d.epfd);
out_mesh:
	mesh_cleanup(&d.mesh);
out_xport:
	for (size_t i = 0; i < d.n_xports; i++)
		xport_destroy(d.xports[i]);
	config_free(&d.cfg);
	mesh_locks_destroy(&d.locks);
	if (!status)
		log_info("stopped");
	return status;
}
