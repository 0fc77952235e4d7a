/*
 * meshd: keeps this node's part of the full RC mesh and serves local clients.
 * One loop, one epoll: the transports' fds, a periodic timer, signals and the control socket;
 * with cluster.polling busy or adaptive the same loop also polls every completion queue and every
 * channel ring without waiting (see run()). The loop runs in a data-path thread per rail (device),
 * each pinned to its device's NUMA node (numa_topo.h) and sleeping on its own rail's transports;
 * rail 0's also serves everything else. The main thread sets up, waits for them and cleans up.
 * This file: arguments, set-up and tear-down; the loop is loop.c, reload reload.c, sd_notify
 * notify.c, `meshd --check` check.c (daemon.h).
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
#include "channel.h"
#include "check.h"
#include "daemon.h"
#include "config.h"
#include "log.h"
#include "mesh.h"
#include "metrics_http.h"
#include "transport.h"
#include "util.h"

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

/* What the command line asks for. */
struct args {
	const char *cfg_path, *sock, *level;
	long node_id;
	bool dump, check;
};

/* Reads the command line into a: -1 to go on, else the exit status (--help, --version, a usage
 * error said). */
static int parse_args(int argc, char **argv, struct args *a)
{
	static const struct option opts[] = {
		{"config", required_argument, NULL, 'c'},   {"node-id", required_argument, NULL, 'n'},
		{"socket", required_argument, NULL, 's'},   {"log-level", required_argument, NULL, 'l'},
		{"dump-config", no_argument, NULL, 'D'},    {"version", no_argument, NULL, 'V'},
		{"check", no_argument, NULL, 'C'},
		{"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
	};
	int c;

	a->sock = getenv(MESH_SOCKET_ENV);
	if (!a->sock || !*a->sock)
		a->sock = MESH_SOCKET_DEFAULT;
	a->node_id = -1;
	while ((c = getopt_long(argc, argv, "c:n:s:l:Vh", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			a->cfg_path = optarg;
			break;
		case 'n': {
			char *end;

			errno = 0;
			a->node_id = strtol(optarg, &end, 10);
			if (errno || *end || end == optarg || a->node_id < 0 || a->node_id > 65535) {
				fprintf(stderr, "meshd: --node-id %s: expected a number 0..65535\n", optarg);
				return 1;
			}
			break;
		}
		case 's':
			a->sock = optarg;
			break;
		case 'l':
			a->level = optarg;
			break;
		case 'D':
			a->dump = true;
			break;
		case 'C':
			a->check = true;
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
	if (a->level && log_level_parse(a->level) < 0) {
		fprintf(stderr, "meshd: --log-level %s: expected error, warn, info or debug\n", a->level);
		return 1;
	}
	if (a->check && a->dump) {
		fprintf(stderr, "meshd: --check and --dump-config do not go together\n");
		return 1;
	}
	if (a->check && !a->cfg_path) {
		fprintf(stderr, "meshd: --check needs --config FILE (try --help)\n");
		return 1;
	}
	if (!a->check && !a->dump && (!a->cfg_path || a->node_id < 0)) {
		fprintf(stderr, "meshd: --config and --node-id are required (try --help)\n");
		return 1;
	}
	return -1;
}

/* The configuration, this node in it, the log's prefix and level, sd_notify and the cluster key:
 * 0, or 1 (said; nothing is left to release but the configuration, which the caller frees). With
 * --dump-config, the dump and 2 (exit 0). */
static int daemon_load(struct daemon *d, const struct args *a, const struct config_node **self,
		       struct auth_keys *keys)
{
	const char *log_time;
	char err[512], prefix[32];

	if (config_load(a->cfg_path, &d->cfg, err, sizeof(err))) {
		log_error("%s", err);
		return 1;
	}
	if (a->dump) {
		config_dump(stdout, &d->cfg);
		return 2;
	}
	*self = config_node_find(&d->cfg, (uint32_t)a->node_id);
	if (!*self) {
		log_error("%s:%d: node id %ld is not in nodes (%zu nodes, ids %u..%u)", a->cfg_path, d->cfg.nodes_line,
			  a->node_id, d->cfg.n_nodes, d->cfg.nodes[0].id, d->cfg.nodes[d->cfg.n_nodes - 1].id);
		return 1;
	}
	snprintf(prefix, sizeof(prefix), "meshd[%u]", (*self)->id);
	log_set_prefix(prefix);
	log_time = getenv("MESH_LOG_TIME");
	log_set_timestamps(log_time && *log_time && strcmp(log_time, "0"));
	log_set_level((enum log_level)log_level_parse(a->level ? a->level : d->cfg.log_level));
	if (notify_load())
		return 1;
	if (load_keys(&d->cfg, a->cfg_path, keys, err, sizeof(err))) {
		log_error("%s", err);
		return 1;
	}
	d->cfg_path = a->cfg_path;
	d->self_id = (*self)->id;
	d->level_override = a->level;
	if (!keys->n)
		log_warn("no cluster.key_file: any host that reaches %s port %u can join cluster \"%s\" as any node "
			 "(`meshctl keygen` makes a key)",
			 (*self)->addr, (*self)->port, d->cfg.cluster_name);
	d->poll_mode = !strcmp(d->cfg.polling, "busy")    ? POLL_BUSY
		       : !strcmp(d->cfg.polling, "event") ? POLL_EVENT
							  : POLL_ADAPTIVE;
	return 0;
}

/* The loop's own descriptors in rail 0's epoll: signals, the tick's timer (a quarter of the
 * keepalive interval, at most 100 ms, so an idle meshd wakes rarely) and the transports of rail 0
 * (the other rails' threads sleep in their own: run_data_path). 0, or -1 said (what was opened is
 * closed by events_close). */
static int events_open(struct daemon *d)
{
	int ret = 0;

	d->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (d->epfd < 0) {
		log_error("epoll_create1: %m");
		return -1;
	}
	d->sfd = signals_open();
	if (d->sfd < 0) {
		log_error("signalfd: %s", strerror(-d->sfd));
		return -1;
	}
	d->tick_period_ms = MAX(5u, MIN(100u, d->cfg.keepalive_interval_ms / 4));
	d->late_rl.interval_ms = 60000;
	d->late_rl.burst = 3;
	d->tfd = timer_start(d->tick_period_ms);
	if (d->tfd < 0) {
		log_error("timerfd: %s", strerror(-d->tfd));
		return -1;
	}
	/* The transports' tag carries their index where other tags carry an fd. */
	for (size_t i = 0; i < d->n_xports && !ret; i++) {
		struct epoll_event ee = {.events = EPOLLIN, .data.u64 = TAG(TAG_XPORT) | i};

		if (i % d->mesh.n_rails == 0 && epoll_ctl(d->epfd, EPOLL_CTL_ADD, xport_event_fd(d->xports[i]), &ee))
			ret = -errno;
	}
	if (!ret)
		ret = add_fd(d->epfd, d->tfd, TAG(TAG_TIMER));
	if (!ret)
		ret = add_fd(d->epfd, d->sfd, TAG(TAG_SIGNAL));
	if (ret) {
		log_error("epoll_ctl: %s", strerror(-ret));
		return -1;
	}
	return 0;
}

static void events_close(struct daemon *d)
{
	if (d->tfd >= 0)
		close(d->tfd);
	if (d->sfd >= 0)
		close(d->sfd);
	if (d->epfd >= 0)
		close(d->epfd);
}

/* The control socket (its own thread, admin.h) and the metrics endpoint, both served from here on:
 * 0, or -1 said. */
static int serve_open(struct daemon *d, const struct config_node *self, const char *sock)
{
	int rail_epfd[MESH_RAILS_MAX];
	int ret = admin_open(&d->admin, sock, d->epfd, TAG(TAG_ADMIN_WORK), &d->mesh, &d->locks);

	if (ret)
		return -1;
	d->admin.reload = daemon_reload;
	d->admin.reload_ctx = d;
	for (uint32_t r = 0; r < d->mesh.n_rails; r++)
		rail_epfd[r] = d->dp[r].epfd;
	admin_bind_channels(&d->admin, TAG(TAG_CH_KICK), TAG(TAG_CH_LIFE), rail_epfd, d->mesh.n_rails);
	/* A listener like the others: READY=1 (in main) only once it serves. */
	if (metrics_http_open(d->metrics, config_node_metrics_listen(&d->cfg, self), &d->admin))
		return -1;
	if (d->metrics->fd >= 0) {
		ret = add_fd(d->epfd, d->metrics->fd, TAG(TAG_METRICS));
		if (ret) {
			log_error("epoll_ctl (metrics endpoint): %s", strerror(-ret));
			return -1;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct args a = {0};
	struct daemon d = {.epfd = -1, .tfd = -1, .sfd = -1, .metrics_slot = {{.fd = -1}, {.fd = -1}}};
	const struct config_node *self = NULL;
	struct auth_keys keys = {0};
	uint64_t fd_limit;
	int ret, status = 1;

	/* A bad configuration is an error the journal must see as one (journalctl -p err). */
	log_set_prefix("meshd");
	log_journal_detect();
	ret = parse_args(argc, argv, &a);
	if (ret >= 0)
		return ret;
	if (a.check)
		return check_run(a.cfg_path, a.node_id, a.sock, stdout, stderr) ? 1 : 0;
	if (a.dump && !a.cfg_path) {
		config_dump(stdout, NULL);
		return 0;
	}
	mesh_locks_init(&d.locks);
	d.metrics = &d.metrics_slot[0];
	ret = daemon_load(&d, &a, &self, &keys);
	if (ret) {
		status = ret == 2 ? 0 : 1;
		goto out_xport;
	}
	fd_limit = fd_limit_raise();
	if (xports_open(&d, self))
		goto out_xport;
	ret = mesh_init(&d.mesh, &d.cfg, self, d.xports, d.n_xports);
	if (ret) {
		log_error("cannot set up the links: %s", mesh_strerror(ret));
		goto out_xport;
	}
	d.mesh.fd_limit = fd_limit;
	ret = channel_layer_init(&d.mesh); /* channels ride the links */
	if (ret) {
		log_error("cannot set up the channels: %s", mesh_strerror(ret));
		goto out_mesh;
	}
	d.locks.n_rails = d.mesh.n_rails;
	d.mesh.keys = keys;
	explicit_bzero(&keys, sizeof(keys));
	d.mesh.conf.generation = 1;
	d.mesh.conf.loaded_us = util_wall_us();
	if (events_open(&d))
		goto out_events;
	/* Before the control socket listens: a client that connects is answered by a thread that is
	 * already there, not queued behind start-up (sysfs, libnuma; on a loaded machine whose root is
	 * a network file system, seconds). */
	numa_setup(&d);
	if (dp_open(&d))
		goto out_dp;
	if (serve_open(&d, self, a.sock))
		goto out_serve;
	/* The channels a last meshd kept (their kicks and lifelines join the loop: after dp_open and
	 * the channel ops of serve_open), before the first link forms. */
	notify_store_take(&d.mesh);
	log_info("node %u of cluster \"%s\" listening on %s port %u (%s, %u QPs per link, %zu peers), control socket %s",
		 self->id, d.cfg.cluster_name, self->addr, self->port, d.mesh.xport_names, d.cfg.qps_per_link, d.mesh.n_links,
		 a.sock);
	/* The control socket's own thread (admin.h): requests never wait behind link work. Its first
	 * snapshot is taken here, alone on the mesh: the data path's first batch (a whole cluster's
	 * connection requests at once) has held the lock for seconds before its first tick. */
	admin_snapshot(&d.admin, util_now_ms());
	if (!admin_start(&d.admin)) {
		d.wd_every_ms = notify_watchdog_every_ms();
		d.wd_last_ms = util_now_ms();
		/* The listeners and the control socket are up and served: applications may connect. */
		notify_status(&d, "READY=1\n");
		if (!run_data_path(&d))
			status = 0;
	}
	notify("STOPPING=1\nSTATUS=stopping");
	admin_stop(&d.admin);
out_serve:
	metrics_http_close(d.metrics);
	admin_close(&d.admin);
out_dp:
	dp_close(&d);
out_events:
	events_close(&d);
out_mesh:
	mesh_cleanup(&d.mesh);
out_xport:
	for (size_t i = 0; i < d.n_xports; i++)
		xport_destroy(d.xports[i]);
	explicit_bzero(&keys, sizeof(keys));
	config_free(&d.cfg);
	mesh_locks_destroy(&d.locks);
	if (!status && !a.dump)
		log_info("stopped");
	return status;
}
