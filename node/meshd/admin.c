#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <libgen.h>
#include <malloc.h>
#include <sched.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "admin.h"
#include "log.h"
#include "util.h"

static int mkdir_parent(const char *path)
{
	char tmp[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char *dir;

	util_strlcpy(tmp, path, sizeof(tmp));
	dir = dirname(tmp);
	if (mkdir(dir, 0755) && errno != EEXIST)
		return -errno;
	return 0;
}

/* Who may connect: the file's mode and group are the policy (connect(2) needs write permission on
 * the socket file). The socket is created 0600 (umask) and opened to the group only once it is
 * theirs, so there is no moment when others may connect. */
static void admin_set_access(const char *path, const char *group)
{
	struct group gr, *res = NULL;
	char buf[4096], *end;
	unsigned long gid;

	if (!group[0]) {
		log_info("%s: mode 0600 (cluster.socket_group is \"\"): only uid %u may use it", path, (unsigned)geteuid());
		return;
	}
	gid = strtoul(group, &end, 10);
	if (*end || end == group) {
		if (getgrnam_r(group, &gr, buf, sizeof(buf), &res) || !res) {
			log_warn("%s: group %s does not exist: only uid %u may use the control socket (mode 0600); create "
				 "the group (systemd-sysusers, groupadd) or set cluster.socket_group",
				 path, group, (unsigned)geteuid());
			return;
		}
		gid = res->gr_gid;
	}
	if (chown(path, (uid_t)-1, (gid_t)gid)) {
		log_warn("%s: cannot give it to group %s (gid %lu): %m; only uid %u may use it (mode 0600)", path, group,
			 gid, (unsigned)geteuid());
		return;
	}
	if (chmod(path, 0660)) {
		log_warn("%s: chmod 0660: %m; only uid %u may use it", path, (unsigned)geteuid());
		return;
	}
	log_info("%s: mode 0660, group %s (gid %lu): applications in that group may use it", path, group, gid);
}

/* The control thread's epoll tags (tag << 32 | fd). */
enum { ADMIN_EV_LISTEN = 1, ADMIN_EV_CLIENT, ADMIN_EV_STOP };
#define ADMIN_TAG(t) ((uint64_t)(t) << 32)

static int admin_watch_fd(int epfd, int fd, uint64_t tag)
{
	struct epoll_event ee = {.events = EPOLLIN, .data.u64 = tag | (uint32_t)fd};

	return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ee) ? -errno : 0;
}

static int admin_listen(struct admin *a, const char *path);
static void *admin_main(void *arg);
static int admin_ping_report(void *ctx, int fd, const struct ping_result *res);

int admin_open(struct admin *a, const char *path, int epfd, uint64_t tag_work, struct mesh *m,
	       struct mesh_locks *locks)
{
	int ret;

	memset(a, 0, sizeof(*a));
	a->lfd = a->ctl_epfd = a->stop_fd = a->work_fd = -1;
	a->epfd = epfd;
	a->mesh = m;
	a->locks = locks;
	m->pings.ops.report = admin_ping_report;
	m->pings.ops.ctx = a;
	util_mutex_init_pi(&a->lock);
	util_mutex_init_pi(&a->snap_lock);
	util_mutex_init_pi(&a->log_lock);
	a->client_log.burst = ADMIN_LOG_BURST;
	a->client_log.interval_ms = ADMIN_LOG_INTERVAL_MS;
	for (int i = 0; i < ADMIN_CLIENTS_MAX; i++)
		a->clients[i] = -1;
	a->ctl_epfd = epoll_create1(EPOLL_CLOEXEC);
	a->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	a->work_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (a->ctl_epfd < 0 || a->stop_fd < 0 || a->work_fd < 0 ||
	    (ret = admin_watch_fd(a->ctl_epfd, a->stop_fd, ADMIN_TAG(ADMIN_EV_STOP))) ||
	    (ret = admin_watch_fd(epfd, a->work_fd, tag_work))) {
		ret = -errno;
		log_error("control socket: cannot set up its thread's descriptors: %m");
		return ret;
	}
	/* The thread starts now and warms its pages (ADMIN_WARM_*) while the socket is set up; it
	 * serves once admin_start hands it the listening socket. Freed memory stays mapped (up to
	 * 8 MiB atop each arena) and blocks up to 4 MiB come from the arenas, not from an mmap of
	 * their own each time: what it warmed stays warm, and the data path's repeated allocations
	 * (the snapshot's) stop faulting pages in again. A no-op under the sanitizers' allocators. */
	mallopt(M_MMAP_THRESHOLD, 4 << 20);
	mallopt(M_TRIM_THRESHOLD, 8 << 20);
	if (sem_init(&a->warmed, 0, 0)) {
		ret = -errno;
		log_error("control socket: sem_init: %m");
		return ret;
	}
	a->warm_sem = true;
	ret = -pthread_create(&a->thread, NULL, admin_main, a);
	if (ret) {
		log_error("cannot start the control socket's thread: %s", strerror(-ret));
		return ret;
	}
	pthread_setname_np(a->thread, "ctl");
	a->started = true;
	ret = admin_listen(a, path);
	if (ret)
		admin_stop(a);
	return ret;
}

/* admin_open's socket: bound and listening once the control thread is warm; admin_start has the
 * thread watch it. */
static int admin_listen(struct admin *a, const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct mesh *m = a->mesh;
	bool bound;
	int fd, ret;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		log_error("socket path %s is longer than %zu bytes", path, sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	util_strlcpy(sa.sun_path, path, sizeof(sa.sun_path));
	ret = mkdir_parent(path);
	if (ret) {
		log_error("cannot create the directory of %s: %s", path, strerror(-ret));
		return ret;
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		ret = -errno;
		log_error("socket(AF_UNIX, SOCK_SEQPACKET): %m");
		return ret;
	}
	/* A socket file nobody answers on is left over from a killed meshd: replace it. One that
	 * answers belongs to a running meshd: refuse, never steal it. */
	if (!access(path, F_OK)) {
		int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

		if (probe >= 0 && !connect(probe, (struct sockaddr *)&sa, sizeof(sa))) {
			close(probe);
			close(fd);
			log_error("%s: another meshd is serving this socket", path);
			return -EADDRINUSE;
		}
		if (probe >= 0)
			close(probe);
		unlink(path);
	}
	{
		mode_t old = umask(0177);

		ret = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) ? -errno : 0;
		umask(old);
	}
	/* Its group and mode before it listens: the group's name may take a while to look up (NSS),
	 * and a client that connects meanwhile would wait for it. */
	bound = !ret;
	if (bound)
		admin_set_access(path, m->cfg->socket_group);
	/* A client that connects from now on waits for its answer, not for the warm-up. */
	while (!ret && sem_wait(&a->warmed) && errno == EINTR)
		;
	if (ret || listen(fd, 64)) {
		ret = ret ? ret : -errno;
		log_error("cannot listen on %s: %s", path, strerror(-ret));
		close(fd);
		if (bound)
			unlink(path);
		return ret;
	}
	a->lfd = fd;
	util_strlcpy(a->path, path, sizeof(a->path));
	return 0;
}

static void admin_metrics_forget(struct admin *a, int slot)
{
	free(a->metrics_text[slot]);
	a->metrics_text[slot] = NULL;
	a->metrics_len[slot] = 0;
}

/* Closes a client's connection and frees its slot; the mesh's lock is held (its listeners go, a
 * connect it waits for is abandoned, before its descriptor number can be reused). */
static void admin_drop(struct admin *a, int slot)
{
	int fd;

	pthread_mutex_lock(&a->lock);
	fd = a->clients[slot];
	pthread_mutex_unlock(&a->lock);
	if (fd < 0)
		return;
	admin_metrics_forget(a, slot);
	channel_client_gone(a->mesh, fd);
	ping_client_gone(a->mesh, fd);
	pthread_mutex_lock(&a->lock);
	epoll_ctl(a->ctl_epfd, EPOLL_CTL_DEL, fd, NULL);
	close(fd);
	a->clients[slot] = -1;
	a->gone[slot] = false;
	if (a->queued[slot]) {
		mesh_ctl_req_free(a->queued[slot]);
		a->queued[slot] = NULL;
	}
	pthread_mutex_unlock(&a->lock);
}

static void admin_snap_free(struct admin_snap *sn)
{
	free(sn->node);
	for (size_t i = 0; i < sn->n_links; i++)
		free(sn->links[i]);
	free(sn->links);
	free(sn->link_len);
	memset(sn, 0, sizeof(*sn));
}

static void admin_wake(struct admin *a)
{
	uint64_t one = 1;

	if (write(a->work_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn("control socket: cannot wake the data path: %m");
}

/* The control thread, without the mesh's lock: the client hung up, or its reply could not go. With
 * the lock free now it is dropped at once, otherwise the data path drops it (admin_work); either
 * way the control thread no longer watches it. */
static void admin_client_gone(struct admin *a, int slot)
{
	if (!mesh_trylock_all(a->locks)) {
		admin_drop(a, slot);
		mesh_unlock_all(a->locks);
		return;
	}
	pthread_mutex_lock(&a->lock);
	if (a->clients[slot] >= 0 && !a->gone[slot]) {
		a->gone[slot] = true;
		epoll_ctl(a->ctl_epfd, EPOLL_CTL_DEL, a->clients[slot], NULL);
	}
	pthread_mutex_unlock(&a->lock);
	admin_wake(a);
}

void admin_close(struct admin *a)
{
	for (int i = 0; i < ADMIN_CLIENTS_MAX; i++)
		if (a->clients[i] >= 0)
			admin_drop(a, i);
	if (a->lfd >= 0) {
		close(a->lfd);
		unlink(a->path);
		a->lfd = -1;
	}
	admin_snap_free(&a->snap);
	if (a->work_fd >= 0) {
		if (a->epfd >= 0)
			epoll_ctl(a->epfd, EPOLL_CTL_DEL, a->work_fd, NULL);
		close(a->work_fd);
	}
	if (a->stop_fd >= 0)
		close(a->stop_fd);
	if (a->ctl_epfd >= 0)
		close(a->ctl_epfd);
	a->work_fd = a->stop_fd = a->ctl_epfd = -1;
	if (a->warm_sem)
		sem_destroy(&a->warmed);
	a->warm_sem = false;
}

/* Control thread, under a->lock. */
/* Whether a line a local client caused (a bad request, a refused connect, a full table) may be
 * written: a member of the group sending bad requests as fast as it could wrote 268,060 lines
 * (35.6 MB) in 5 s. At most ADMIN_LOG_BURST such lines per ADMIN_LOG_INTERVAL_MS; the next one
 * allowed is preceded by the count of those left out. meshctl node's ctl_errors counts them all. */
static bool admin_client_log_ok(struct admin *a)
{
	uint64_t dropped = 0;
	bool ok;

	pthread_mutex_lock(&a->log_lock);
	ok = log_ratelimit_ok(&a->client_log, util_now_ms(), &dropped);
	pthread_mutex_unlock(&a->log_lock);
	if (ok && dropped)
		log_warn("local clients: %llu lines about their requests were not logged (at most %u in %u s)",
			 (unsigned long long)dropped, ADMIN_LOG_BURST, ADMIN_LOG_INTERVAL_MS / 1000);
	return ok;
}

/* A free slot of the client table for a connection of uid, or -1 with why it may not have one
 * (ADMIN_CLIENTS_ROOT, ADMIN_CLIENTS_PER_UID). */
static int admin_slot_for(struct admin *a, uint32_t uid, char *why, size_t len)
{
	bool privileged = uid == 0 || uid == (uint32_t)geteuid();
	uint32_t used = 0, mine = 0;
	int slot = -1;

	for (int s = 0; s < ADMIN_CLIENTS_MAX; s++) {
		if (a->clients[s] < 0) {
			slot = slot < 0 ? s : slot;
			continue;
		}
		used++;
		mine += a->client_uid[s] == uid;
	}
	if (slot < 0)
		snprintf(why, len, "all %d of meshd's control connections are taken", ADMIN_CLIENTS_MAX);
	else if (!privileged && used >= ADMIN_CLIENTS_MAX - ADMIN_CLIENTS_ROOT)
		snprintf(why, len, "%u control connections are open; the last %d are kept for root", used,
			 ADMIN_CLIENTS_ROOT);
	else if (!privileged && mine >= ADMIN_CLIENTS_PER_UID)
		snprintf(why, len, "uid %u holds %u control connections, the most one user may", uid, mine);
	else
		return slot;
	return -1;
}

static int admin_send_reply(int fd, const CtlReply *r);

/* Tells a client it has no slot (its first read gets the error, as an answer to its request) and
 * closes it. */
static void admin_refuse(struct admin *a, int fd, const struct ucred *cred, const char *why)
{
	CtlReply r = CTL_REPLY__INIT;

	if (admin_client_log_ok(a))
		log_warn("local client pid %d uid %u: refused: %s", cred->pid, cred->uid, why);
	r.status = -EUSERS;
	r.error = (char *)why;
	admin_send_reply(fd, &r);
	close(fd);
}

static void admin_on_listen(struct admin *a)
{
	int fd, slot;

	while ((fd = accept4(a->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
		struct ucred cred;
		socklen_t cl = sizeof(cred);
		char why[128];

		/* The kernel's word, not the client's: ports, channels and quotas belong to this uid. */
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl)) {
			log_warn("local client: SO_PEERCRED: %m; refusing it");
			close(fd);
			continue;
		}
		slot = admin_slot_for(a, cred.uid, why, sizeof(why));
		if (slot < 0) {
			admin_refuse(a, fd, &cred, why);
			continue;
		}
		if (admin_watch_fd(a->ctl_epfd, fd, ADMIN_TAG(ADMIN_EV_CLIENT))) {
			log_error("epoll_ctl: %m");
			close(fd);
			continue;
		}
		a->client_uid[slot] = cred.uid; /* (the caller holds a->lock) */
		a->client_pid[slot] = cred.pid;
		a->clients[slot] = fd;
	}
	if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
		if (!(a->pauses++ % 100))
			log_warn("accept on %s: %m; not accepting for %d ms (%llu times so far)", a->path, ADMIN_PAUSE_MS,
				 (unsigned long long)a->pauses);
		epoll_ctl(a->ctl_epfd, EPOLL_CTL_DEL, a->lfd, NULL);
		a->paused_until_ms = util_now_ms() + ADMIN_PAUSE_MS;
	} else if (errno != EAGAIN && errno != EWOULDBLOCK) {
		log_warn("accept on %s: %m", a->path);
	}
}

/* Control thread, under a->lock: how long epoll may sleep; watches a paused listening socket again. */
static int admin_pause_check(struct admin *a, uint64_t now)
{
	if (!a->paused_until_ms || a->lfd < 0)
		return -1;
	if (now < a->paused_until_ms)
		return (int)(a->paused_until_ms - now);
	a->paused_until_ms = 0;
	if (admin_watch_fd(a->ctl_epfd, a->lfd, ADMIN_TAG(ADMIN_EV_LISTEN)))
		log_error("control socket %s: cannot watch it again: %m", a->path);
	return -1;
}

static void fill_node(struct mesh *m, NodeInfo *n, char *version)
{
	n->id = m->self->id;
	n->cluster = (char *)m->cfg->cluster_name;
	n->cluster_hash = m->cluster_hash;
	n->addr = (char *)m->self->addr;
	n->port = m->self->port;
	n->transport = m->xport_names;
	n->boot_epoch = m->boot_epoch;
	n->uptime_ms = util_now_ms() - m->start_ms;
	n->peers = (uint32_t)m->n_links;
	n->links_up = mesh_links_up(m);
	n->qps_per_link = m->cfg->qps_per_link;
	n->config_path = (char *)m->cfg->path;
	n->config_generation = m->conf.generation;
	n->config_loaded_us = m->conf.loaded_us;
	n->config_reloads = m->conf.reloads;
	n->config_refused = m->conf.refused;
	n->config_error = (char *)m->conf.error;
	n->log_level = (char *)log_level_name(log_current_level);
	n->draining = m->draining;
	n->drain_left_ms = m->draining && m->drain_deadline_ms > util_now_ms() ? m->drain_deadline_ms - util_now_ms() : 0;
	n->channels = m->n_channels;
	n->fd_store = m->store.keep != NULL;
	n->channels_kept = m->store.n_kept;
	n->predecessor_epoch = m->predecessor_epoch;
	n->pid = (uint32_t)getpid();
	n->version = version;
	n->peer_rejects = m->peer_rejects;
	n->link_flaps = m->link_flaps;
	n->channel_resumes = m->channel_resumes;
	n->rail_failovers = m->rail_failovers;
	n->handshakes = m->handshakes;
	n->dial_window = mesh_dial_window(m);
	n->handshake_ms = m->adm.srtt_ms;
	n->admission_cuts = m->adm.cuts;
}

/* Storage for the NUMA part of NodeInfo and its version, on the caller's stack. */
struct numa_show {
	char version[16];
	NumaDevice devs[MESH_XPORT_INSTANCES], *dptrs[MESH_XPORT_INSTANCES];
	char dcpus[MESH_XPORT_INSTANCES][512];
	DataPathThread th[MESH_RAILS_MAX], *tptr[MESH_RAILS_MAX];
	char tcpus[MESH_RAILS_MAX][512];
};

static void fill_numa(struct mesh *m, NodeInfo *n, struct numa_show *b)
{
	const struct mesh_numa *nu = &m->numa;
	cpu_set_t set;

	n->numa = (char *)(m->self->numa[0] ? m->self->numa : m->cfg->numa);
	n->numa_usable = nu->usable;
	n->numa_nodes = (uint32_t)nu->topo.n_online;
	n->numa_home = nu->home;
	n->numa_why = (char *)(nu->why ? nu->why : "");
	for (size_t i = 0; i < nu->n_devs; i++) {
		NumaDevice *d = &b->devs[i];
		int node = nu->devs[i].node;

		numa_device__init(d);
		d->name = (char *)nu->devs[i].name;
		d->provider = (char *)nu->devs[i].provider;
		d->netdev = (char *)nu->devs[i].netdev;
		d->rail = nu->devs[i].rail;
		d->address = (char *)mesh_node_addr(m->self, nu->devs[i].rail);
		d->numa_node = node;
		d->cpus = node >= 0 ? numa_cpulist_format(&nu->topo.cpus[node], b->dcpus[i], sizeof(b->dcpus[i])) : "";
		b->dptrs[i] = d;
	}
	n->n_devices = nu->n_devs;
	n->devices = b->dptrs;
	for (size_t r = 0; r < nu->n_threads; r++) {
		DataPathThread *th = &b->th[r];

		if (!nu->threads[r].tid)
			continue; /* not started (unit tests drive the loop themselves) */
		data_path_thread__init(th);
		th->name = (char *)nu->threads[r].name;
		th->tid = nu->threads[r].tid;
		th->devices = (char *)nu->threads[r].devices;
		th->numa_node = nu->threads[r].node;
		th->rail = (uint32_t)r;
		th->polling = (char *)m->cfg->polling;
		th->poll_budget_us = m->cfg->poll_budget_us;
		th->fast_events = nu->threads[r].fast_events;
		th->deferred_events = nu->threads[r].deferred_events;
		th->slow_sections = nu->threads[r].slow_sections;
		th->kicks = nu->threads[r].kicks;
		/* Asked of the kernel, not remembered: what the thread really may run on. */
		if (!sched_getaffinity((pid_t)th->tid, sizeof(set), &set))
			th->cpus = numa_cpulist_format(&set, b->tcpus[r], sizeof(b->tcpus[r]));
		else
			th->cpus = "";
		b->tptr[n->n_threads++] = th;
	}
	n->threads = b->tptr;
}

/* The whole NodeInfo of this node, its strings in b. */
static void fill_node_show(struct mesh *m, NodeInfo *n, struct numa_show *b)
{
	snprintf(b->version, sizeof(b->version), "%d.%d", MESH_VERSION_MAJOR, MESH_VERSION_MINOR);
	fill_node(m, n, b->version);
	fill_numa(m, n, b);
}

/* What the control socket itself counts, at the moment of the reply. */
static void fill_ctl_counters(struct admin *a, NodeInfo *n)
{
	n->ctl_errors = atomic_load(&a->errors);
	n->snapshot_replies = atomic_load(&a->snapshot_replies);
	n->queued_replies = atomic_load(&a->queued_replies);
	n->ctl_priority = atomic_load(&a->rt_now);
	n->ctl_demotions = atomic_load(&a->rt_demotions);
	n->ctl_tid = atomic_load(&a->tid);
}

static void fill_link(struct mesh *m, struct link *l, LinkInfo *li, MailboxInfo *mb)
{
	enum link_state s = link_state(l);

	li->peer = l->peer->id;
	li->peer_addr = (char *)l->peer->addr;
	li->peer_port = l->peer->port;
	li->state = s == LINK_STATE_UP_ ? LINK_STATE__LINK_STATE_UP
		    : s == LINK_STATE_CONNECTING_ ? LINK_STATE__LINK_STATE_CONNECTING
						   : LINK_STATE__LINK_STATE_DOWN;
	li->dialer = l->dialer;
	li->qps = link_qps_established(l);
	li->qps_configured = mesh_link_qps(m); /* on every rail */
	li->rails = m->n_rails;
	if (l->phase == LINK_UP) {
		li->rails_up = (uint32_t)__builtin_popcount(l->rails_up);
	} else {
		for (uint32_t r = 0; r < m->n_rails; r++) {
			uint64_t rail_qps = ((1ull << m->cfg->qps_per_link) - 1) << (r * m->cfg->qps_per_link);

			li->rails_up += (l->est_mask & rail_qps) == rail_qps;
		}
	}
	li->rail_failovers = l->rail_failovers;
	li->rail_error = l->rail_last_error;
	li->ctl_rail = l->ctl_rail;
	li->epoch = l->epoch;
	li->rtt_us = l->rtt_us;
	if (l->phase >= LINK_PROOF) {
		mb->addr = l->peer_mb_addr;
		mb->len = l->peer_mb_len;
		mb->rkey = l->peer_mb_rkey;
	}
	li->mailbox = mb;
	li->transport = (char *)link_transport(l);
	li->state_ms = util_now_ms() - l->shown_ms;
	li->ups = l->ups;
	li->attempts = l->failures;
	li->last_error = l->last_error;
	li->down_error = l->down_error;
	li->peer_boot_epoch = l->peer_boot_epoch;
	li->tx_msgs = l->tx_msgs;
	li->rx_msgs = l->rx_msgs;
}

/* One reply on a client's connection: 0, or a negative errno (the caller drops the client: one
 * that does not read its replies loses its connection, never meshd's time). */
static int admin_send_reply(int fd, const CtlReply *r)
{
	size_t n = ctl_reply__get_packed_size(r);
	uint8_t *buf;
	ssize_t sent;

	if (n > MESH_CTL_REPLY_MAX) {
		CtlReply e = CTL_REPLY__INIT;

		log_warn("reply of %zu bytes exceeds %u: answering with an error", n, MESH_CTL_REPLY_MAX);
		e.status = -EMSGSIZE;
		e.error = "reply too large for one message";
		return admin_send_reply(fd, &e);
	}
	buf = malloc(n ? n : 1);
	if (!buf)
		return -ENOMEM;
	ctl_reply__pack(r, buf);
	sent = send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
	free(buf);
	if (sent < 0) {
		int ret = -errno;

		log_warn("reply of %zu bytes to local client: %m; dropping it", n);
		return ret;
	}
	return 0;
}

static int admin_reply_error(struct admin *a, int slot, int fd, int status, const char *why)
{
	CtlReply r = CTL_REPLY__INIT;

	if (admin_client_log_ok(a))
		log_warn("local client pid %d uid %u: bad request: %s", a->client_pid[slot], a->client_uid[slot], why);
	atomic_fetch_add(&a->errors, 1);
	r.status = status;
	r.error = (char *)why;
	return admin_send_reply(fd, &r);
}

static void fill_channel(struct mesh *m, const struct channel *ch, ChannelInfo *ci)
{
	ci->id = ch->id;
	ci->local_node = m->self->id;
	ci->local_port = ch->local_port;
	ci->peer_node = ch->peer_node; /* never what the application's shared page says */
	ci->peer_port = ch->peer_port;
	ci->owner_uid = ch->owner_uid;
	ci->opener = ch->opener;
	ci->state = (char *)channel_state_name(ch);
	ci->qps = ch->qps;
	ci->ring_size = ch->size;
	ci->tx_bytes = ch->tx_bytes;
	ci->rx_bytes = ch->rx_bytes_total;
	ci->tx_chunks = ch->tx_chunks;
	ci->rx_chunks = ch->rx_chunks;
	ci->in_flight = ch->inflight;
	ci->credit_stalls = ch->credit_stalls;
	ci->resumes = ch->resumes;
	ci->rewritten_bytes = ch->rewritten_bytes;
	ci->rail_moves = ch->rail_moves;
	ci->tx_pending = ch->app_tx_prod - ch->tx_sent;
	/* The application may have read ahead of rx_bytes (a direct pair): nothing unread then. */
	ci->rx_unread = ch->rx_bytes > ch->app_rx_cons ? ch->rx_bytes - ch->app_rx_cons : 0;
	ci->direct_writes = ch->direct_writes;
	ci->direct_paused = channel_pairs_paused(ch);
	ci->pair_hints = ch->hint_writes;
	ci->writer = !ch->aq_granted ? "meshd" : ch->aq_untaken ? "offered" : "app";
	ci->peer_app_writes = ch->aq_peer_sends;
	ci->app_grants = ch->aq_grants;
	ci->app_withdrawn = ch->aq_withdrawn;
	ci->error = (char *)ch->why;
	ci->numa_want = ch->numa_want;
	ci->rail = ch->rail;
	ci->device = "";
	for (size_t i = 0; ch->link && !ch->local && i < m->numa.n_devs; i++)
		if (m->numa.devs[i].rail == ch->rail && !strcmp(m->numa.devs[i].provider, link_transport(ch->link)))
			ci->device = (char *)m->numa.devs[i].name;
	if (ch->ctrl) {
		const void *pages[3] = {ch->ctrl, ch->tx, ch->rx};

		ci->numa_node = numa_pages_node(pages, 3);
	} else {
		ci->numa_node = -1;
	}
}

/* The slot of a client's descriptor, gone or not, or -1; under a->lock. */
static int admin_slot_locked(const struct admin *a, int fd)
{
	for (int i = 0; i < ADMIN_CLIENTS_MAX; i++)
		if (a->clients[i] == fd)
			return i;
	return -1;
}

/* The slot of a client that is still there, or -1. */
static int admin_slot_of(struct admin *a, int fd)
{
	int slot;

	pthread_mutex_lock(&a->lock);
	slot = admin_slot_locked(a, fd);
	if (slot >= 0 && a->gone[slot])
		slot = -1;
	pthread_mutex_unlock(&a->lock);
	return slot;
}

/* channel_ops.deliver: a reply to a LISTEN'ing or CONNECT'ing client, with the channel's four
 * descriptors when ch is set. Returns 0 or a negative errno (then the client has nothing). */
static int admin_deliver(void *ctx, int fd, int status, const char *why, const struct channel *ch, const int fds[4])
{
	struct admin *a = ctx;
	CtlReply r = CTL_REPLY__INIT;
	ChannelSetup setup = CHANNEL_SETUP__INIT;
	NodeInfo node = NODE_INFO__INIT;
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} cbuf;
	struct msghdr mh = {0};
	struct iovec iov;
	uint8_t *buf;
	size_t n;
	ssize_t sent;
	int slot = admin_slot_of(a, fd);

	if (slot < 0)
		return -ENOTCONN;
	r.status = status;
	r.error = (char *)(why ? why : "");
	/* Never an empty datagram: on SEQPACKET it would read like the end of the connection. */
	node.id = a->mesh->self->id;
	node.cluster = (char *)a->mesh->cfg->cluster_name;
	r.node = &node;
	if (ch) {
		setup.channel_id = ch->id;
		setup.peer_node = ch->link ? ch->link->peer->id : 0;
		setup.local_port = ch->local_port;
		setup.peer_port = ch->peer_port;
		setup.ring_size = ch->size;
		setup.memfd_size = ch->map_len;
		setup.qps = ch->qps;
		r.setup = &setup;
	}
	n = ctl_reply__get_packed_size(&r);
	buf = malloc(n ? n : 1);
	if (!buf)
		return -ENOMEM;
	ctl_reply__pack(&r, buf);
	iov.iov_base = buf;
	iov.iov_len = n;
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	if (ch && fds) {
		struct cmsghdr *cm;

		memset(&cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf.buf;
		mh.msg_controllen = sizeof(cbuf.buf);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(4 * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, 4 * sizeof(int));
	}
	sent = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	free(buf);
	if (sent < 0) {
		int ret = -errno;

		log_warn("local client fd %d: cannot deliver a channel reply: %m", fd);
		return ret;
	}
	return 0;
}

/* The epoll set a channel's kick goes to: its rail's thread's. */
static int admin_kick_epfd(const struct admin *a, uint32_t rail)
{
	return rail < a->n_kick_epfd ? a->kick_epfd[rail] : a->epfd;
}

/* A channel's kick descriptor into the epoll set of its rail's thread. */
static void admin_watch_kick(struct admin *a, struct channel *ch)
{
	struct epoll_event ee = {.events = EPOLLIN, .data.u64 = a->tag_kick | ch->id};

	if (epoll_ctl(admin_kick_epfd(a, ch->rail), EPOLL_CTL_ADD, ch->kick_fd, &ee))
		log_warn("channel %u: epoll add kick (rail %u): %m", ch->id, ch->rail);
}

/* channel_ops.watch: the kick descriptor of a channel in its rail's thread's epoll set, the
 * lifeline in the data path's (a close takes every lock anyway). */
static void admin_watch(void *ctx, struct channel *ch, bool add)
{
	struct admin *a = ctx;
	struct epoll_event ee = {.events = EPOLLIN, .data.u64 = a->tag_life | ch->id};

	if (!add) {
		if (ch->kick_fd >= 0)
			epoll_ctl(admin_kick_epfd(a, ch->rail), EPOLL_CTL_DEL, ch->kick_fd, NULL);
		if (ch->life_fd >= 0)
			epoll_ctl(a->epfd, EPOLL_CTL_DEL, ch->life_fd, NULL);
		return;
	}
	admin_watch_kick(a, ch);
	if (epoll_ctl(a->epfd, EPOLL_CTL_ADD, ch->life_fd, &ee))
		log_warn("channel %u: epoll add lifeline: %m", ch->id);
}

/* channel_ops.moved: the kick follows the channel to its new rail's thread. A kick not yet read
 * is reported by the new set at once (level-triggered). */
static void admin_moved(void *ctx, struct channel *ch, uint32_t from)
{
	struct admin *a = ctx;
	int old = admin_kick_epfd(a, from);

	if (old == admin_kick_epfd(a, ch->rail) || ch->kick_fd < 0)
		return;
	epoll_ctl(old, EPOLL_CTL_DEL, ch->kick_fd, NULL);
	admin_watch_kick(a, ch);
}

/* A listening client's connection the last meshd kept (channel_store.c): a client again, its user
 * from the connection (SO_PEERCRED), listening on port as it asked the last meshd. Takes fd (closed
 * on failure). */
static int admin_adopt(void *ctx, int fd, uint16_t port)
{
	struct admin *a = ctx;
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	const char *why = NULL;
	char full[128];
	int slot, ret;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) || fcntl(fd, F_SETFL, O_NONBLOCK)) {
		ret = -errno;
		close(fd);
		return ret;
	}
	pthread_mutex_lock(&a->lock);
	slot = admin_slot_for(a, cred.uid, full, sizeof(full));
	ret = slot < 0 ? -EMFILE : admin_watch_fd(a->ctl_epfd, fd, ADMIN_TAG(ADMIN_EV_CLIENT));
	if (!ret) {
		a->client_uid[slot] = cred.uid;
		a->client_pid[slot] = cred.pid;
		a->clients[slot] = fd;
	}
	pthread_mutex_unlock(&a->lock);
	if (ret) {
		close(fd);
		return ret;
	}
	ret = channel_listen(a->mesh, port, fd, cred.uid, &why);
	if (ret) {
		log_warn("port %u: %s", port, why);
		admin_drop(a, slot);
	}
	return ret;
}

void admin_bind_channels(struct admin *a, uint64_t tag_kick, uint64_t tag_life, const int *rail_epfd,
			 uint32_t n_rails)
{
	a->tag_kick = tag_kick;
	a->tag_life = tag_life;
	a->n_kick_epfd = MIN(n_rails, (uint32_t)MESH_RAILS_MAX);
	for (uint32_t r = 0; r < a->n_kick_epfd; r++)
		a->kick_epfd[r] = rail_epfd[r];
	a->mesh->ch_ops.deliver = admin_deliver;
	a->mesh->ch_ops.watch = admin_watch;
	a->mesh->ch_ops.moved = admin_moved;
	a->mesh->ch_ops.adopt = admin_adopt;
	a->mesh->ch_ops.ctx = a;
}

static void admin_channel_request(struct admin *a, int slot, int fd, const CtlRequest *req)
{
	const char *why = NULL;
	int ret;

	if (req->op == CTL_OP__CTL_OP_LISTEN) {
		ret = channel_listen(a->mesh, (uint16_t)req->port, fd, a->client_uid[slot], &why);
		admin_deliver(a, fd, ret, why, NULL, NULL);
		return;
	}
	if (req->has_numa && req->numa_node < 0) {
		ret = -EINVAL;
		why = "the NUMA hint is negative";
	} else {
		/* The caller's node is only a preference: a value naming no node simply matches no device. */
		int caller = req->has_caller_node && req->caller_node < NUMA_NODES_MAX ? (int)req->caller_node : -1;

		struct channel_connect_args ca = {
			.node = req->node,
			.port = (uint16_t)req->port,
			.ring_size = req->ring_size,
			.qps = req->qps,
			.numa_hint = req->has_numa ? req->numa_node : -1,
			.caller_node = caller,
			.rail = req->has_rail ? (int)MIN(req->rail, (uint32_t)INT32_MAX) : -1,
			.client_fd = fd,
			.uid = a->client_uid[slot],
		};

		/* link_wait_ms is bounded by the decoder (a day); the waits by the client slots. */
		ret = channel_connect_wait(a->mesh, &ca, req->link_wait_ms, &why);
	}
	if (ret) {
		if (admin_client_log_ok(a))
			log_info("local client pid %d uid %u: connect to node %u port %u: %s (%s)", a->client_pid[slot],
			 a->client_uid[slot], req->node, req->port, why ? why : "", mesh_strerror(ret));
		admin_deliver(a, fd, ret, why, NULL, NULL);
	}
}

int admin_metrics_render(struct admin *a, struct metrics_buf *b)
{
	struct metrics_extra x = {
		.ctl_errors = atomic_load(&a->errors), .http_scrapes = a->http_scrapes, .http_renders = a->http_renders};

	return metrics_render(a->mesh, &x, b);
}

/* One page of the metrics text: at offset 0 rendered afresh for this client, later offsets from
 * the same text, so the pages fit together. */
static void admin_metrics_page(struct admin *a, int slot, const CtlRequest *req, CtlReply *r, MetricsPage *page)
{
	uint64_t off = req->offset;

	if (!off) {
		struct metrics_buf b = {0};

		admin_metrics_forget(a, slot);
		if (admin_metrics_render(a, &b)) {
			metrics_buf_free(&b);
			r->status = -ENOMEM;
			r->error = "out of memory rendering the metrics";
			return;
		}
		a->metrics_text[slot] = metrics_buf_take(&b, &a->metrics_len[slot]);
	} else if (!a->metrics_text[slot] || off >= a->metrics_len[slot]) {
		/* The client's own mistake: nothing of meshd's state is involved, nothing logged. */
		r->status = -EINVAL;
		r->error = a->metrics_text[slot] ? "metrics offset beyond the text"
						 : "no metrics text on this connection: ask for offset 0 first";
		return;
	}
	page->offset = off;
	page->total = a->metrics_len[slot];
	page->text.data = (uint8_t *)a->metrics_text[slot] + off;
	page->text.len = MIN(a->metrics_len[slot] - off, (uint64_t)ADMIN_METRICS_PAGE);
	r->metrics = page;
}

/* Answers a decoded request with the mesh's lock held: 0, or the failed reply's error (the caller
 * drops the client). req stays the caller's. */
/* Only root or meshd's own user may change the node (reload, drain): 0, or the refusal sent. */
static int admin_privileged(struct admin *a, int slot, int fd, const char *what, bool *refused)
{
	CtlReply r = CTL_REPLY__INIT;
	uint32_t uid = a->client_uid[slot];
	char why[96];

	*refused = uid && uid != (uint32_t)geteuid();
	if (!*refused)
		return 0;
	if (admin_client_log_ok(a))
		log_warn("local client pid %d uid %u: %s refused: only root or uid %u may", a->client_pid[slot], uid, what,
			 (unsigned)geteuid());
	atomic_fetch_add(&a->errors, 1);
	snprintf(why, sizeof(why), "only root (or meshd's own user) may %s", what);
	r.status = -EPERM;
	r.error = why;
	return admin_send_reply(fd, &r);
}

/* `meshctl drain`: no new channels; meshd stops once none is left or at the deadline (main.c). The
 * reply's node says how many are left and how long until the deadline. */
static int admin_drain(struct admin *a, int slot, int fd, const CtlRequest *req)
{
	CtlReply r = CTL_REPLY__INIT;
	NodeInfo node = NODE_INFO__INIT;
	struct numa_show numa;
	uint32_t ms = req->drain_ms ? req->drain_ms : MESH_DRAIN_DEFAULT_MS;
	struct mesh *m = a->mesh;
	bool refused;
	int ret = admin_privileged(a, slot, fd, "drain the node", &refused);

	if (refused)
		return ret;
	log_info("local client pid %d uid %u: drain: no new channels; stopping once none of %u is left, at the latest in "
		 "%u ms", a->client_pid[slot], a->client_uid[slot], m->n_channels, ms);
	m->draining = true;
	m->drain_deadline_ms = util_now_ms() + ms;
	fill_node_show(m, &node, &numa);
	fill_ctl_counters(a, &node);
	r.node = &node;
	return admin_send_reply(fd, &r);
}

/* A reply of a ping's stream (CTL_OP_PING), named by the node as every reply is. */
static int admin_ping_send(struct admin *a, int fd, PingReply *p)
{
	CtlReply r = CTL_REPLY__INIT;
	NodeInfo node = NODE_INFO__INIT;

	node.id = a->mesh->self->id;
	node.cluster = (char *)a->mesh->cfg->cluster_name;
	r.node = &node;
	r.ping = p;
	return admin_send_reply(fd, &r);
}

/* ping_ops.report: one result to the client of fd, if it is still there. */
static int admin_ping_report(void *ctx, int fd, const struct ping_result *res)
{
	struct admin *a = ctx;
	PingReply p = PING_REPLY__INIT;

	if (admin_slot_of(a, fd) < 0)
		return -ENOTCONN;
	p.done = res->done;
	if (!res->done) {
		p.rail = res->rail;
		p.seq = res->seq;
		p.status = res->status;
		p.rtt_us = res->rtt_us;
		p.error = (char *)ping_status_text(res->status);
	}
	return admin_ping_send(a, fd, &p);
}

/* `meshctl ping`: bounded for everyone (wire.c: count, interval, timeout; ping.h: pings at once),
 * and the interval of ping(8) for users other than root and meshd's. The first reply says what is
 * probed; the link layer reports the rest (admin_ping_report). */
static int admin_ping(struct admin *a, int slot, int fd, const CtlRequest *req)
{
	uint32_t uid = a->client_uid[slot];
	struct ping_request rq = {
		.peer = req->node,
		.rail = req->has_rail ? (int)req->rail : -1,
		.count = req->count,
		.interval_ms = req->interval_ms ? req->interval_ms : MESH_PING_INTERVAL_DEFAULT_MS,
		.timeout_ms = req->timeout_ms ? req->timeout_ms : MESH_PING_TIMEOUT_DEFAULT_MS,
		.uid = uid,
		.privileged = !uid || uid == (uint32_t)geteuid(),
	};
	PingReply p = PING_REPLY__INIT;
	struct link *l = mesh_link_find(a->mesh, req->node);
	const char *why = NULL;
	char buf[128];
	uint32_t rails;
	int ret;

	if (!rq.privileged && rq.interval_ms < MESH_PING_INTERVAL_USER_MS) {
		snprintf(buf, sizeof(buf), "interval %u ms: below %u ms only root (or meshd's own user) may ping", rq.interval_ms,
			 MESH_PING_INTERVAL_USER_MS);
		return admin_reply_error(a, slot, fd, -EPERM, buf);
	}
	ret = ping_start(a->mesh, fd, &rq, &rails, &why);
	if (ret) {
		/* A fair question (a node DOWN, every ping taken): answered, not counted as a bad request. */
		CtlReply r = CTL_REPLY__INIT;

		r.status = ret;
		r.error = (char *)why;
		return admin_send_reply(fd, &r);
	}
	p.rails = rails;
	p.transport = (char *)link_transport(l);
	p.peer_addr = (char *)l->peer->addr;
	ret = admin_ping_send(a, fd, &p);
	if (ret) {
		ping_client_gone(a->mesh, fd);
		return ret;
	}
	ping_tick(a->mesh, util_now_ms()); /* its first round now */
	return 0;
}

/* `meshctl reload`: root's or meshd's own user's alone (a reload may close links and channels of
 * every user); the reply carries the node as it is afterwards, and why nothing changed if so. */
static int admin_reload(struct admin *a, int slot, int fd)
{
	CtlReply r = CTL_REPLY__INIT;
	NodeInfo node = NODE_INFO__INIT;
	struct numa_show numa;
	char err[512] = "";
	uint32_t uid = a->client_uid[slot];
	bool refused;
	int ret = admin_privileged(a, slot, fd, "reload the configuration", &refused);

	if (refused)
		return ret;
	log_info("local client pid %d uid %u asks for a reload", a->client_pid[slot], uid);
	ret = a->reload ? a->reload(a->reload_ctx, "meshctl reload", err, sizeof(err)) : -EOPNOTSUPP;
	fill_node_show(a->mesh, &node, &numa);
	fill_ctl_counters(a, &node);
	r.node = &node;
	r.status = ret;
	r.error = ret ? (err[0] ? err : (char *)mesh_strerror(ret)) : (char *)"";
	return admin_send_reply(fd, &r);
}

/* The pages of the lists: the items of a reply, from the request's offset while they fit
 * ADMIN_LIST_PAGE bytes (CtlReply.total: a reply must fit one datagram, and a cluster may have any
 * number of links). The arrays are the caller's to free (struct admin_page), also on -ENOMEM. */
struct admin_page {
	LinkInfo *lis, **lptrs;
	MailboxInfo *mbs;
	ChannelInfo *cis, **cptrs;
	PortInfo *pis, **pptrs;
};

static int admin_page_links(struct admin *a, const CtlRequest *req, CtlReply *r, struct admin_page *pg)
{
	size_t nl = a->mesh->n_links, bytes = 0;

	r->total = (uint32_t)nl;
	pg->lis = calloc(nl, sizeof(*pg->lis));
	pg->lptrs = calloc(nl, sizeof(*pg->lptrs));
	pg->mbs = calloc(nl, sizeof(*pg->mbs));
	if (!pg->lis || !pg->lptrs || !pg->mbs)
		return -ENOMEM;
	for (uint64_t i = req->offset; i < nl; i++) {
		LinkInfo *li = &pg->lis[r->n_links];

		link_info__init(li);
		mailbox_info__init(&pg->mbs[r->n_links]);
		fill_link(a->mesh, a->mesh->links[i], li, &pg->mbs[r->n_links]);
		bytes += link_info__get_packed_size(li) + 4;
		if (r->n_links && bytes > ADMIN_LIST_PAGE)
			break;
		pg->lptrs[r->n_links++] = li;
	}
	r->links = pg->lptrs;
	return 0;
}

static int admin_page_channels(struct admin *a, const CtlRequest *req, CtlReply *r, struct admin_page *pg)
{
	uint64_t skip = req->offset;
	size_t bytes = 0;

	r->total = a->mesh->n_channels;
	pg->cis = calloc(a->mesh->n_channels, sizeof(*pg->cis));
	pg->cptrs = calloc(a->mesh->n_channels, sizeof(*pg->cptrs));
	if (!pg->cis || !pg->cptrs)
		return -ENOMEM;
	for (struct channel *ch = a->mesh->channels; ch && r->n_channels < a->mesh->n_channels; ch = ch->next) {
		ChannelInfo *ci = &pg->cis[r->n_channels];

		if (skip) {
			skip--;
			continue;
		}
		channel_info__init(ci);
		fill_channel(a->mesh, ch, ci);
		bytes += channel_info__get_packed_size(ci) + 4;
		if (r->n_channels && bytes > ADMIN_LIST_PAGE)
			break;
		pg->cptrs[r->n_channels++] = ci;
	}
	r->channels = pg->cptrs;
	return 0;
}

static int admin_page_ports(struct admin *a, const CtlRequest *req, CtlReply *r, struct admin_page *pg)
{
	uint64_t skip = req->offset;
	size_t np = 0, bytes = 0;

	for (const struct listener *li = a->mesh->listeners; li; li = li->next)
		np++;
	r->total = (uint32_t)np;
	pg->pis = calloc(np ? np : 1, sizeof(*pg->pis));
	pg->pptrs = calloc(np ? np : 1, sizeof(*pg->pptrs));
	if (!pg->pis || !pg->pptrs)
		return -ENOMEM;
	for (const struct listener *li = a->mesh->listeners; li; li = li->next) {
		PortInfo *pi = &pg->pis[r->n_ports];
		int cs = admin_slot_of(a, li->fd); /* its own fd: only the pid, set at accept */

		if (skip) {
			skip--;
			continue;
		}
		port_info__init(pi);
		pi->port = li->port;
		pi->owner_uid = li->uid;
		pi->owner_pid = cs >= 0 ? a->client_pid[cs] : 0;
		for (const struct channel *ch = a->mesh->channels; ch; ch = ch->next)
			pi->channels += !ch->opener && ch->local_port == li->port;
		bytes += port_info__get_packed_size(pi) + 4;
		if (r->n_ports && bytes > ADMIN_LIST_PAGE)
			break;
		pg->pptrs[r->n_ports++] = pi;
	}
	r->ports = pg->pptrs;
	return 0;
}

static int admin_handle(struct admin *a, int slot, int fd, const CtlRequest *req)
{
	CtlReply r = CTL_REPLY__INIT;
	NodeInfo node = NODE_INFO__INIT;
	struct admin_page pg = {0};
	struct numa_show numa;
	MetricsPage page = METRICS_PAGE__INIT;
	int ret = 0;

	switch (req->op) {
	case CTL_OP__CTL_OP_LISTEN:
	case CTL_OP__CTL_OP_CONNECT:
		admin_channel_request(a, slot, fd, req);
		return 0;
	case CTL_OP__CTL_OP_RELOAD:
		return admin_reload(a, slot, fd);
	case CTL_OP__CTL_OP_DRAIN:
		return admin_drain(a, slot, fd, req);
	case CTL_OP__CTL_OP_PING:
		return admin_ping(a, slot, fd, req);
	default:
		break;
	}
	fill_node_show(a->mesh, &node, &numa);
	fill_ctl_counters(a, &node);
	r.node = &node;
	if (req->object == CTL_OBJECT__CTL_OBJECT_LINKS && a->mesh->n_links)
		ret = admin_page_links(a, req, &r, &pg);
	else if (req->object == CTL_OBJECT__CTL_OBJECT_CHANNELS && a->mesh->n_channels)
		ret = admin_page_channels(a, req, &r, &pg);
	else if (req->object == CTL_OBJECT__CTL_OBJECT_PORTS)
		ret = admin_page_ports(a, req, &r, &pg);
	else if (req->object == CTL_OBJECT__CTL_OBJECT_METRICS)
		admin_metrics_page(a, slot, req, &r, &page);
	if (ret) {
		ret = admin_reply_error(a, slot, fd, ret, "out of memory");
		goto out;
	}
	ret = admin_send_reply(fd, &r);
	/* The last page went out: the text is done with. */
	if (!ret && r.metrics && page.offset + page.text.len >= page.total)
		admin_metrics_forget(a, slot);
out:
	free(pg.lis);
	free(pg.lptrs);
	free(pg.mbs);
	free(pg.cis);
	free(pg.cptrs);
	free(pg.pis);
	free(pg.pptrs);
	return ret;
}

/* ---- the snapshot: NODE and LINKS while the data path is busy ---- */

void admin_snapshot(struct admin *a, uint64_t now)
{
	struct mesh *m = a->mesh;
	struct admin_snap sn = {0}, old;
	NodeInfo node = NODE_INFO__INIT;
	struct numa_show numa;
	/* (asked may be a little after now: the control thread's clock was read later.) */
	uint64_t asked = atomic_load(&a->snap_asked_ms);
	uint64_t every = asked && asked + ADMIN_SNAP_WARM_MS > now ? ADMIN_SNAP_EVERY_MS : ADMIN_SNAP_COLD_MS;

	/* Only the data path writes the snapshot: it reads its own at_ms without the lock. */
	if (a->snap.at_ms && now - a->snap.at_ms < every)
		return;
	fill_node_show(m, &node, &numa);
	sn.node_len = node_info__get_packed_size(&node);
	sn.node = malloc(sn.node_len ? sn.node_len : 1);
	sn.links = calloc(m->n_links ? m->n_links : 1, sizeof(*sn.links));
	sn.link_len = calloc(m->n_links ? m->n_links : 1, sizeof(*sn.link_len));
	if (!sn.node || !sn.links || !sn.link_len)
		goto fail;
	node_info__pack(&node, sn.node);
	for (size_t i = 0; i < m->n_links; i++) {
		LinkInfo li = LINK_INFO__INIT;
		MailboxInfo mb = MAILBOX_INFO__INIT;

		fill_link(m, m->links[i], &li, &mb);
		sn.link_len[i] = link_info__get_packed_size(&li);
		sn.links[i] = malloc(sn.link_len[i] ? sn.link_len[i] : 1);
		if (!sn.links[i])
			goto fail;
		link_info__pack(&li, sn.links[i]);
		sn.n_links = i + 1;
	}
	sn.at_ms = now;
	pthread_mutex_lock(&a->snap_lock);
	old = a->snap;
	a->snap = sn;
	pthread_mutex_unlock(&a->snap_lock);
	sn = old;
fail:
	/* The old snapshot, or the new one that could not be completed (the old stays). */
	admin_snap_free(&sn);
}

/* Control thread: NODE or LINKS from the snapshot, marked with its age. 1 when there is none yet
 * (the caller queues the request), else 0 or the failed reply's error. */
static int admin_snapshot_reply(struct admin *a, int fd, const CtlRequest *req)
{
	CtlReply r = CTL_REPLY__INIT;
	NodeInfo *node;
	LinkInfo **lptrs = NULL;
	uint64_t age;
	int ret;

	pthread_mutex_lock(&a->snap_lock);
	if (!a->snap.at_ms || !(node = node_info__unpack(NULL, a->snap.node_len, a->snap.node))) {
		pthread_mutex_unlock(&a->snap_lock);
		return 1;
	}
	age = util_now_ms() - a->snap.at_ms;
	atomic_fetch_add(&a->snapshot_replies, 1); /* this one counts (the control thread's only) */
	fill_ctl_counters(a, node);
	node->uptime_ms += age;
	node->from_snapshot = true;
	node->snapshot_age_ms = age;
	r.node = node;
	if (req->object == CTL_OBJECT__CTL_OBJECT_LINKS && a->snap.n_links) {
		size_t nl = a->snap.n_links, bytes = 0;

		r.total = (uint32_t)nl;
		lptrs = calloc(nl, sizeof(*lptrs));
		for (uint64_t i = req->offset; lptrs && i < nl; i++) {
			LinkInfo *li = link_info__unpack(NULL, a->snap.link_len[i], a->snap.links[i]);

			if (!li)
				break;
			li->state_ms += age;
			bytes += a->snap.link_len[i] + 4;
			if (r.n_links && bytes > ADMIN_LIST_PAGE) {
				link_info__free_unpacked(li, NULL);
				break;
			}
			lptrs[r.n_links++] = li;
		}
		r.links = lptrs;
	}
	pthread_mutex_unlock(&a->snap_lock);
	ret = admin_send_reply(fd, &r);
	for (size_t i = 0; i < r.n_links; i++)
		link_info__free_unpacked(lptrs[i], NULL);
	free(lptrs);
	node_info__free_unpacked(node, NULL);
	return ret;
}

/* ---- the control thread ---- */

/* The mesh's lock within ADMIN_LOCK_WAIT_MS, or false. */
static bool admin_lock_mesh(struct admin *a)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_nsec += ADMIN_LOCK_WAIT_MS * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return !mesh_lock_all_by(a->locks, &ts);
}

/* NODE or LINKS shown: what the snapshot can answer. */
static bool admin_shows_snapshot(const CtlRequest *req)
{
	return req->op == CTL_OP__CTL_OP_SHOW &&
	       (req->object == CTL_OBJECT__CTL_OBJECT_NODE || req->object == CTL_OBJECT__CTL_OBJECT_LINKS);
}

/* Hands a request to the data path; the client is not read until it is answered. */
static void admin_queue(struct admin *a, int slot, int fd, CtlRequest *req)
{
	struct epoll_event ee = {.events = 0, .data.u64 = ADMIN_TAG(ADMIN_EV_CLIENT) | (uint32_t)fd};

	pthread_mutex_lock(&a->lock);
	a->queued[slot] = req;
	epoll_ctl(a->ctl_epfd, EPOLL_CTL_MOD, fd, &ee);
	pthread_mutex_unlock(&a->lock);
	atomic_fetch_add(&a->queued_replies, 1);
	admin_wake(a);
}

static void admin_on_client(struct admin *a, int fd)
{
	uint8_t buf[MESH_CTL_REQ_MAX + 1];
	CtlRequest *req;
	const char *why;
	ssize_t n;
	bool busy;
	int slot, ret;

	pthread_mutex_lock(&a->lock);
	slot = admin_slot_locked(a, fd);
	busy = slot >= 0 && (a->gone[slot] || a->queued[slot]);
	pthread_mutex_unlock(&a->lock);
	if (slot < 0)
		return;
	if (busy) {
		/* Only a hang-up is reported while the data path has its request. */
		admin_client_gone(a, slot);
		return;
	}
	/* MSG_TRUNC returns the real length of an oversized datagram. */
	n = recv(fd, buf, sizeof(buf), MSG_TRUNC | MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return;
	if (n <= 0) {
		admin_client_gone(a, slot);
		return;
	}
	if ((size_t)n > MESH_CTL_REQ_MAX) {
		if (admin_reply_error(a, slot, fd, -EMSGSIZE, "request longer than 4096 bytes"))
			admin_client_gone(a, slot);
		return;
	}
	ret = mesh_ctl_req_decode(buf, (size_t)n, &req, &why);
	if (ret) {
		if (admin_reply_error(a, slot, fd, ret, why))
			admin_client_gone(a, slot);
		return;
	}
	if (admin_shows_snapshot(req))
		atomic_store(&a->snap_asked_ms, util_now_ms()); /* keep the snapshot fresh for the next */
	if (admin_lock_mesh(a)) {
		ret = admin_handle(a, slot, fd, req);
		mesh_ctl_req_free(req);
		if (ret)
			admin_drop(a, slot);
		mesh_unlock_all(a->locks);
		return;
	}
	/* The data path is busy (link work under a handshake storm): what it last published. */
	if (admin_shows_snapshot(req) && !req->live) {
		ret = admin_snapshot_reply(a, fd, req);
		if (ret <= 0) {
			mesh_ctl_req_free(req);
			if (ret)
				admin_client_gone(a, slot);
			return;
		}
	}
	admin_queue(a, slot, fd, req);
}

/* ---- the control thread's priority ---- */

static int admin_sched(uint32_t prio)
{
	struct sched_param sp = {.sched_priority = (int)prio};

	return pthread_setschedparam(pthread_self(), prio ? SCHED_FIFO : SCHED_OTHER, &sp);
}

static uint64_t thread_cpu_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* At the thread's start: the configured priority, or a warning saying what would permit it. */
static void admin_rt_start(struct admin *a)
{
	uint32_t want = a->mesh->cfg->control_priority;
	int ret;

	atomic_store(&a->tid, (uint32_t)gettid());
	if (!want)
		return;
	ret = admin_sched(want);
	if (ret) {
		log_warn("control socket: its thread cannot run at SCHED_FIFO priority %u (%s): it needs "
			 "CAP_SYS_NICE or RLIMIT_RTPRIO >= %u (systemd: LimitRTPRIO=); normal scheduling, so "
			 "meshctl may wait for a CPU while the data path is busy",
			 want, strerror(ret), want);
		return;
	}
	a->rt_want = want;
	atomic_store(&a->rt_now, want);
	a->rt_win_us = util_now_us();
	a->rt_win_cpu_us = thread_cpu_us();
}

/* After each batch: over budget in this window, normal scheduling until it ends; a new window
 * restores the priority. Returns the milliseconds to the window's end while demoted (the thread
 * must wake to restore it), else -1. */
static int admin_rt_budget(struct admin *a)
{
	uint64_t now, cpu;

	if (!a->rt_want)
		return -1;
	now = util_now_us();
	cpu = thread_cpu_us();
	if (now - a->rt_win_us >= ADMIN_RT_WINDOW_US) {
		if (!atomic_load(&a->rt_now) && !admin_sched(a->rt_want))
			atomic_store(&a->rt_now, a->rt_want);
		a->rt_win_us = now;
		a->rt_win_cpu_us = cpu;
	} else if (atomic_load(&a->rt_now) && cpu - a->rt_win_cpu_us > ADMIN_RT_BUDGET_US &&
		   !admin_sched(0)) {
		atomic_store(&a->rt_now, 0);
		if (!atomic_fetch_add(&a->rt_demotions, 1))
			log_warn("control socket: its thread used over %u ms of CPU in %u ms (a flood of "
				 "requests?): normal scheduling until the window ends (counted in meshctl "
				 "node's ctl_demotions; logged once)",
				 ADMIN_RT_BUDGET_US / 1000, ADMIN_RT_WINDOW_US / 1000);
	}
	if (atomic_load(&a->rt_now))
		return -1;
	return (int)((a->rt_win_us + ADMIN_RT_WINDOW_US - now) / 1000) + 1;
}

/* At the thread's start: the pages answering will touch, faulted in now (ADMIN_WARM_*). The
 * arena keeps the freed block (admin_open's mallopt); the stack keeps its pages. */
static void admin_warm(void)
{
	char stack[ADMIN_WARM_STACK];
	void *heap = malloc(ADMIN_WARM_HEAP);

	explicit_bzero(stack, sizeof(stack));
	if (heap) {
		explicit_bzero(heap, ADMIN_WARM_HEAP);
		free(heap);
	}
}

static void *admin_main(void *arg)
{
	struct admin *a = arg;
	struct epoll_event evs[16];

	/* First, before the socket listens (admin_open waits for it), and at normal priority: 64
	 * meshd starting at once need not fault pages in at SCHED_FIFO. */
	admin_warm();
	sem_post(&a->warmed);
	admin_rt_start(a);
	for (;;) {
		int n, timeout, rt;

		pthread_mutex_lock(&a->lock);
		timeout = admin_pause_check(a, util_now_ms());
		pthread_mutex_unlock(&a->lock);
		rt = admin_rt_budget(a);
		if (rt >= 0 && (timeout < 0 || rt < timeout))
			timeout = rt;
		n = epoll_wait(a->ctl_epfd, evs, (int)ARRAY_SIZE(evs), timeout);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			log_error("control socket: epoll_wait: %m");
			return NULL;
		}
		for (int i = 0; i < n; i++) {
			uint32_t tag = (uint32_t)(evs[i].data.u64 >> 32);
			int fd = (int)(uint32_t)evs[i].data.u64;

			switch (tag) {
			case ADMIN_EV_STOP:
				return NULL;
			case ADMIN_EV_LISTEN:
				pthread_mutex_lock(&a->lock);
				admin_on_listen(a);
				pthread_mutex_unlock(&a->lock);
				break;
			case ADMIN_EV_CLIENT:
				admin_on_client(a, fd);
				break;
			}
		}
	}
}

int admin_start(struct admin *a)
{
	int ret = admin_watch_fd(a->ctl_epfd, a->lfd, ADMIN_TAG(ADMIN_EV_LISTEN));

	if (ret)
		log_error("control socket: epoll_ctl: %s", strerror(-ret));
	return ret;
}

void admin_stop(struct admin *a)
{
	uint64_t one = 1;

	if (!a->started)
		return;
	if (write(a->stop_fd, &one, sizeof(one)) < 0)
		log_warn("cannot stop the control socket's thread: %m");
	pthread_join(a->thread, NULL);
	a->started = false;
}

/* ---- the data path's part ---- */

void admin_work(struct admin *a)
{
	uint64_t v;

	if (read(a->work_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_warn("control socket: work eventfd: %m");
	for (int slot = 0; slot < ADMIN_CLIENTS_MAX; slot++) {
		struct epoll_event ee = {.events = EPOLLIN};
		CtlRequest *req;
		bool gone;
		int fd, ret;

		pthread_mutex_lock(&a->lock);
		fd = a->clients[slot];
		req = a->queued[slot]; /* stays set while we answer: the control thread leaves the client alone */
		gone = a->gone[slot];
		pthread_mutex_unlock(&a->lock);
		if (fd < 0 || (!req && !gone))
			continue;
		ret = gone ? 0 : admin_handle(a, slot, fd, req);
		pthread_mutex_lock(&a->lock);
		a->queued[slot] = NULL;
		gone |= a->gone[slot];
		if (!ret && !gone) {
			ee.data.u64 = ADMIN_TAG(ADMIN_EV_CLIENT) | (uint32_t)fd;
			if (epoll_ctl(a->ctl_epfd, EPOLL_CTL_MOD, fd, &ee))
				gone = true;
		}
		pthread_mutex_unlock(&a->lock);
		mesh_ctl_req_free(req);
		if (ret || gone)
			admin_drop(a, slot);
	}
}
