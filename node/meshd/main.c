/*
 * meshd: keeps this node's part of the full RC mesh and serves local clients.
 * One loop, one epoll: the transport's fd, a periodic timer, signals and the control socket;
 * with cluster.polling busy or adaptive the same loop also polls every completion queue and every
 * channel ring without waiting (see run()). The loop runs in the data-path thread, pinned to the
 * NUMA node of the device (numa_topo.h); the main thread sets up, waits for it and cleans up.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "admin.h"
#include "config.h"
#include "log.h"
#include "mesh.h"
#include "transport.h"
#include "util.h"

enum { TAG_XPORT = 1, TAG_TIMER, TAG_SIGNAL, TAG_ADMIN_LISTEN, TAG_ADMIN_CLIENT, TAG_CH_KICK, TAG_CH_LIFE };
#define TAG(t) ((uint64_t)(t) << 32)
#define EVENT_BATCH 64
#define DRAIN_ROUNDS 16
#define STOP_GRACE_MS 300

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: meshd --config FILE --node-id ID [--socket PATH]\n"
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
		"      --dump-config    print every configuration key with default, range and help\n"
		"                       (with --config: and the values in force), then exit\n"
		"  -V, --version        print the version\n"
		"  -h, --help           this help\n"
		"\n"
		"Exit status: 0 after a clean stop, 1 on a configuration or start-up error.\n",
		MESH_SOCKET_ENV, MESH_SOCKET_DEFAULT);
}

enum poll_mode { POLL_EVENT, POLL_ADAPTIVE, POLL_BUSY };

struct daemon {
	struct mesh_config cfg;
	enum poll_mode poll_mode;
	uint64_t hot_until_us; /* adaptive: polling until then (poll_budget_us after the last work) */
	bool polled;           /* poll_once ran since the last sleep: re-arm and look again first */
	int run_status;        /* run()'s result, from the data-path thread */
	xport_t *xports[MESH_XPORT_INSTANCES]; /* per provider, one per rail (mesh.h) */
	size_t n_xports;
	bool more[MESH_XPORT_INSTANCES]; /* the transport may hold events we have not taken yet */
	struct mesh mesh;
	struct admin admin;
	int epfd, tfd, sfd;
};

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

static bool drain_xport(struct daemon *d, xport_t *x)
{
	int got = 0;

	return drain_xport_n(d, x, false, &got);
}

/* The providers of cluster.transport for this node's addresses, in order of preference: an
 * instance of each on every rail (address) of the node. */
static int xports_open(struct daemon *d, const struct config_node *self)
{
	const struct xport_ops *want[MESH_XPORTS_MAX];
	uint32_t rails = MAX(1u, self->n_rails);
	size_t n = 0;
	struct xport_attr xa = {
		.connect_timeout_ms = d->cfg.connect_timeout_ms,
		.max_send_wr = LINK_SQ_DEPTH,
		.max_recv_wr = MAX(LINK_RECV_BUFS, LINK_DATA_RECVS),
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

		ret = xport_create(ops, &xa, &d->xports[d->n_xports]);
		if (ret) {
			log_error("cannot start the %s transport: %s", ops->name, mesh_strerror(ret));
			return ret;
		}
		d->n_xports++;
		ret = xport_listen(d->xports[i], addr, self->port);
		if (ret) {
			log_error("cannot listen on %s port %u (%s, rail %zu): %s", addr, self->port, ops->name, i % rails,
				  mesh_strerror(ret));
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

static int timer_start(uint32_t period_ms)
{
	struct itimerspec its = {
		.it_interval = {.tv_sec = period_ms / 1000, .tv_nsec = (long)(period_ms % 1000) * 1000000L},
		.it_value = {.tv_sec = 0, .tv_nsec = 1000000L},
	};
	int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);

	if (fd < 0)
		return -errno;
	if (timerfd_settime(fd, 0, &its, NULL)) {
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

/* Lets the Goodbye messages go out before the QPs are torn down, for at most STOP_GRACE_MS. */
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
			busy |= d->mesh.links[i].send_busy != 0;
		if (!busy)
			break;
		/* Any fd may wake us; only the transport matters now. */
		epoll_wait(d->epfd, &ev, 1, 20);
	}
}

/* One look at everything without waiting (the polling part of the loop): every completion queue
 * and every ring. Returns true when anything moved. */
static bool poll_once(struct daemon *d)
{
	int got = 0;

	for (size_t i = 0; i < d->n_xports; i++)
		d->more[i] = drain_xport_n(d, d->xports[i], true, &got);
	got += channel_poll(&d->mesh);
	mesh_reap(&d->mesh);
	d->polled = true;
	return got > 0;
}

/* Polling modes (cluster.polling): event sleeps in epoll_wait whenever nothing is pending; busy
 * never sleeps; adaptive polls for poll_budget_us after the last work, then sleeps. While polling,
 * the rings carry MESH_DAEMON_POLLING so applications do not kick; before sleeping the flag is
 * cleared and everything looked at once more (proto/ring.h). */
static bool stay_hot(struct daemon *d, bool worked)
{
	uint64_t now;

	if (d->poll_mode == POLL_EVENT)
		return false;
	if (d->poll_mode == POLL_BUSY)
		return true;
	now = util_now_us();
	if (worked)
		d->hot_until_us = now + d->cfg.poll_budget_us;
	return now < d->hot_until_us;
}

static int run(struct daemon *d)
{
	struct epoll_event evs[32];
	bool running = true, hot = d->poll_mode == POLL_BUSY;

	if (hot)
		channel_set_polling(&d->mesh, true);
	while (running) {
		bool more = false, drained[MESH_XPORT_INSTANCES] = {false};
		int n;

		for (size_t i = 0; i < d->n_xports; i++)
			more |= d->more[i];
		if (!hot && !more && d->polled) {
			/* About to sleep: applications kick again from now on; what they published before
			 * they could see the cleared flag is found by this last look. */
			channel_set_polling(&d->mesh, false);
			for (size_t i = 0; i < d->n_xports; i++)
				xport_arm(d->xports[i]);
			if (poll_once(d)) {
				hot = stay_hot(d, true);
				if (hot)
					channel_set_polling(&d->mesh, true);
				continue;
			}
			d->polled = false; /* that look found nothing: now sleep */
		}
		n = epoll_wait(d->epfd, evs, (int)ARRAY_SIZE(evs), more || hot ? 0 : -1);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			log_error("epoll_wait: %m");
			return -errno;
		}
		for (int i = 0; i < n; i++) {
			uint32_t tag = (uint32_t)(evs[i].data.u64 >> 32);
			int fd = (int)(uint32_t)evs[i].data.u64;

			switch (tag) {
			case TAG_XPORT:
				if ((size_t)fd < d->n_xports) {
					d->more[fd] = drain_xport(d, d->xports[fd]);
					drained[fd] = true;
				}
				break;
			case TAG_TIMER: {
				uint64_t exp;

				if (read(fd, &exp, sizeof(exp)) < 0 && errno != EAGAIN)
					log_warn("timerfd read: %m");
				mesh_tick(&d->mesh, util_now_ms());
				mesh_reap(&d->mesh);
				break;
			}
			case TAG_SIGNAL: {
				struct signalfd_siginfo si;

				if (read(fd, &si, sizeof(si)) == sizeof(si)) {
					log_info("signal %s: stopping", strsignal((int)si.ssi_signo));
					running = false;
				}
				break;
			}
			case TAG_ADMIN_LISTEN:
				admin_on_listen(&d->admin);
				break;
			case TAG_ADMIN_CLIENT:
				admin_on_client(&d->admin, fd);
				break;
			case TAG_CH_KICK:
				channel_on_kick(&d->mesh, (uint32_t)fd);
				break;
			case TAG_CH_LIFE:
				channel_on_lifeline(&d->mesh, (uint32_t)fd);
				break;
			}
		}
		/* A transport cut short by DRAIN_ROUNDS continues now, after the others had their turn. */
		for (size_t i = 0; i < d->n_xports; i++)
			if (d->more[i] && !drained[i])
				d->more[i] = drain_xport(d, d->xports[i]);
		/* What the handlers released goes after the batch (no event above may still name it). */
		mesh_reap(&d->mesh);
		if (d->poll_mode != POLL_EVENT) {
			bool worked = poll_once(d) || n > 0;

			hot = stay_hot(d, worked);
			if (hot && !d->mesh.polling)
				channel_set_polling(&d->mesh, true);
			/* Nothing to do this round: let whoever we wait for (an application, rxe's
			 * softirq, the peer meshd on the same machine) have the CPU. */
			if (hot && !worked)
				sched_yield();
		}
	}
	stop_gracefully(d);
	return 0;
}

/* The data-path thread: the loop above, pinned to the home node's CPUs. One device serves this
 * node's address (rdma_cm binds it), so one thread serves it; the main thread only waits. */
static void *data_path_main(void *arg)
{
	struct daemon *d = arg;
	struct mesh_numa *nu = &d->mesh.numa;

	nu->tid = (uint32_t)gettid();
	if (nu->home >= 0 && CPU_COUNT(&nu->topo.cpus[nu->home])) {
		int ret = pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), &nu->topo.cpus[nu->home]);

		if (ret)
			log_warn("cannot pin the data-path thread to node %d: %s", nu->home, strerror(ret));
	}
	d->run_status = run(d);
	return NULL;
}

static int run_data_path(struct daemon *d)
{
	struct mesh_numa *nu = &d->mesh.numa;
	pthread_t t;
	int ret;

	/* The kernel keeps 15 characters of a thread's name. */
	memcpy(nu->thread, "dp-", 3);
	util_strlcpy(nu->thread + 3, nu->n_devs ? nu->devs[0].name : "meshd", sizeof(nu->thread) - 3);
	ret = pthread_create(&t, NULL, data_path_main, d);
	if (ret) {
		log_error("cannot start the data-path thread: %s", strerror(ret));
		return -ret;
	}
	pthread_setname_np(t, nu->thread);
	pthread_join(t, NULL);
	return d->run_status;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"config", required_argument, NULL, 'c'},   {"node-id", required_argument, NULL, 'n'},
		{"socket", required_argument, NULL, 's'},   {"log-level", required_argument, NULL, 'l'},
		{"dump-config", no_argument, NULL, 'D'},    {"version", no_argument, NULL, 'V'},
		{"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
	};
	const char *cfg_path = NULL, *sock = getenv(MESH_SOCKET_ENV), *level = NULL;
	long node_id = -1;
	bool dump = false;
	struct daemon d = {.epfd = -1, .tfd = -1, .sfd = -1};
	const struct config_node *self;
	char err[512], prefix[32];
	int c, ret, status = 1;

	if (!sock || !*sock)
		sock = MESH_SOCKET_DEFAULT;
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
		fprintf(stderr, "meshd: %s\n", err);
		return 1;
	}
	if (dump) {
		config_dump(stdout, &d.cfg);
		config_free(&d.cfg);
		return 0;
	}
	self = config_node_find(&d.cfg, (uint32_t)node_id);
	if (!self) {
		fprintf(stderr, "meshd: %s:%d: node id %ld is not in nodes (%zu nodes, ids %u..%u)\n", cfg_path,
			d.cfg.nodes_line, node_id, d.cfg.n_nodes, d.cfg.nodes[0].id, d.cfg.nodes[d.cfg.n_nodes - 1].id);
		config_free(&d.cfg);
		return 1;
	}
	snprintf(prefix, sizeof(prefix), "meshd[%u]", self->id);
	log_set_prefix(prefix);
	log_set_level((enum log_level)log_level_parse(level ? level : d.cfg.log_level));

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
	d.tfd = timer_start(MAX(5u, MIN(100u, d.cfg.keepalive_interval_ms / 4)));
	if (d.tfd < 0) {
		log_error("timerfd: %s", strerror(-d.tfd));
		goto out_signals;
	}
	/* The transports' tag carries their index where other tags carry an fd. */
	ret = 0;
	for (size_t i = 0; i < d.n_xports && !ret; i++) {
		struct epoll_event ee = {.events = EPOLLIN, .data.u64 = TAG(TAG_XPORT) | i};

		if (epoll_ctl(d.epfd, EPOLL_CTL_ADD, xport_event_fd(d.xports[i]), &ee))
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
	ret = admin_open(&d.admin, sock, d.epfd, TAG(TAG_ADMIN_LISTEN), TAG(TAG_ADMIN_CLIENT), &d.mesh);
	if (ret)
		goto out_timer;
	admin_bind_channels(&d.admin, TAG(TAG_CH_KICK), TAG(TAG_CH_LIFE));
	log_info("node %u of cluster \"%s\" listening on %s port %u (%s, %u QPs per link, %zu peers), control socket %s",
		 self->id, d.cfg.cluster_name, self->addr, self->port, d.mesh.xport_names, d.cfg.qps_per_link, d.mesh.n_links,
		 sock);
	numa_setup(&d);
	if (!run_data_path(&d))
		status = 0;
	admin_close(&d.admin);
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
	if (!status)
		log_info("stopped");
	return status;
}
