/*
 * meshd's control socket (admin.h): the socket and who may connect, the control thread (reading
 * requests, answering them with the mesh's lock or from the snapshot or handing them to the data
 * path, its real-time priority and budget), the dispatch of a request to its handler, and the data
 * path's part. The client table (slots, replies, a client
 * dropped) is admin_client.c's, what is shown admin_show.c's, channels handed to applications
 * admin_channel.c's, the operator's actions admin_ops.c's; calls go from here to them only.
 */
#include <errno.h>
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
#include "admin_int.h"
#include "channel.h"
#include "log.h"
#include "util.h"

/* ---- the socket ---- */

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

static int admin_listen(struct admin *a, const char *path);
static void *admin_main(void *arg);

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

/* ---- the clients ---- */

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

/* ---- replies, and a request's dispatch ---- */

/* Answers a decoded request with the mesh's lock held: 0, or the failed reply's error (the caller
 * drops the client). req stays the caller's. */
static int admin_handle(struct admin *a, int slot, int fd, const CtlRequest *req)
{
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
		return admin_show(a, slot, fd, req);
	}
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
