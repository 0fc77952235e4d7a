/*
 * Descriptors becoming mesh channels and staying so: connect() to a cluster node's address and
 * port becomes mesh_connect (any failure: the kernel's connect, as if nothing happened), listen()
 * on a port of this node also listens on the mesh's, accept() takes channels as well as kernel
 * connections, and close, dup and fcntl keep the descriptor table (fdtab.c) and the epoll
 * registrations (poll.c) in step with the kernel's descriptors. A channel's number is a duplicate
 * of mesh_channel_fd, so the kernel's waits can watch it.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <string.h>
#include <unistd.h>

#include "preload.h"

#define PL_CONNECT_TIMEOUT_MS 10000u

/* fork(): every lock of the preload held across it, taken in the order the calls take them (the
 * node table's alone; an epoll registry's before the descriptor table's, before an entry's), so
 * that the child inherits none taken by a thread it lacks and no copy of a channel half changed. */
static void fork_prepare(void)
{
	pl_nodes_fork(PL_FORK_PREPARE);
	pl_epoll_fork(PL_FORK_PREPARE);
	pl_table_fork(PL_FORK_PREPARE);
}

static void fork_parent(void)
{
	pl_table_fork(PL_FORK_PARENT);
	pl_epoll_fork(PL_FORK_PARENT);
	pl_nodes_fork(PL_FORK_PARENT);
}

static void fork_child(void)
{
	pl_table_fork(PL_FORK_CHILD);
	pl_epoll_fork(PL_FORK_CHILD);
	pl_nodes_fork(PL_FORK_CHILD);
}

__attribute__((constructor)) static void fork_init(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* A TCP stream socket of the kernel (IPv4 or IPv6)? */
static bool is_tcp(int fd, int *family)
{
	int type = 0, proto = 0, dom = 0;
	socklen_t l = sizeof(int);

	if (pl_real.getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) || type != SOCK_STREAM)
		return false;
	l = sizeof(int);
	if (pl_real.getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &l) || (dom != AF_INET && dom != AF_INET6))
		return false;
	l = sizeof(int);
	if (pl_real.getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l) || proto != IPPROTO_TCP)
		return false;
	*family = dom;
	return true;
}

int pl_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	struct mesh_channel_opts opts = {.mask = MESH_OPT_TIMEOUT_MS, .timeout_ms = PL_CONNECT_TIMEOUT_MS};
	const struct pl_node *node;
	struct mesh_channel_info info;
	mesh_channel_t *ch = NULL;
	struct pl_fd *p, *old;
	uint8_t addr[16];
	uint16_t port;
	int family, sfamily, fl, cfd, ret;
	bool via_lo;

	p = pl_get(fd);
	if (p) {
		int kind = p->kind;

		pl_put(p);
		errno = kind == PL_CHANNEL ? EISCONN : EINVAL;
		return -1;
	}
	family = pl_sa_addr(sa, len, addr, &port);
	if (family < 0 || !pl_port_wanted(port) || !is_tcp(fd, &sfamily) || !pl_nodes_ready())
		return pl_real.connect(fd, sa, len);
	/* A loopback address that names no node is this host: a client beside its server (a server
	 * listening on every address listens through the mesh too; one bound to loopback only does
	 * not, so its clients are refused by the mesh and stay on kernel TCP). */
	node = pl_node_by_addr(family, addr);
	via_lo = !node && pl_addr_is_loopback(family, addr);
	if (via_lo)
		node = pl_node_self();
	if (!node)
		return pl_real.connect(fd, sa, len);
	pl_lib_enter();
	ret = mesh_connect(pl_session(), node->id, port, &opts, &ch);
	pl_lib_leave();
	if (ret) {
		if (ret != -ECONNREFUSED)
			pl_warn((unsigned)-ret + 100, "mesh_connect to node %u port %u: %s (%s); using kernel TCP",
				node->id, port, mesh_strerror(ret), mesh_session_error(pl_session()));
		else
			PL_DEBUG("node %u port %u: nobody listens through the mesh; kernel TCP", node->id, port);
		return pl_real.connect(fd, sa, len);
	}
	p = pl_new(PL_CHANNEL, sfamily);
	if (!p)
		goto err_close_ch;
	p->ch = ch;
	pl_lib_enter();
	mesh_channel_info(ch, &info);
	cfd = mesh_channel_fd(ch);
	pl_lib_leave();
	fl = pl_real.fcntl(fd, F_GETFL);
	atomic_init(&p->nonblock, fl >= 0 && (fl & O_NONBLOCK));
	fl = pl_real.fcntl(fd, F_GETFD);
	p->cloexec = fl >= 0 && (fl & FD_CLOEXEC);
	pl_sa_make(sfamily, pl_node_self(), info.local_port, &p->local, &p->local_len);
	pl_sa_make(sfamily, node, port, &p->peer, &p->peer_len);
	if (via_lo) {
		/* As the kernel would say: the address dialled, from the host's loopback. */
		struct pl_node lo = {.family = family};

		if (family == AF_INET)
			memcpy(lo.addr, (const uint8_t[4]){127, 0, 0, 1}, 4);
		else
			lo.addr[15] = 1;
		pl_sa_make(sfamily, &lo, info.local_port, &p->local, &p->local_len);
		lo.family = family;
		memcpy(lo.addr, addr, sizeof(lo.addr));
		pl_sa_make(sfamily, &lo, port, &p->peer, &p->peer_len);
	}
	/* The application's number now names the channel's descriptor (the kernel socket goes). */
	if (cfd < 0 || pl_real.dup3(cfd, fd, O_CLOEXEC) < 0) {
		pl_warn(3, "cannot put a channel at descriptor %d: %s; using kernel TCP", fd, strerror(errno));
		goto err_free;
	}
	pl_epoll_forget(fd);
	old = pl_table_set(fd, p);
	pl_put(old);
	pl_put(p); /* the table holds it */
	PL_DEBUG("fd %d: channel %u to node %u port %u", fd, info.channel_id, node->id, port);
	if (atomic_load(&p->nonblock)) {
		atomic_store(&p->connecting, true);
		errno = EINPROGRESS;
		return -1;
	}
	return 0;

err_free:
	p->ch = NULL;
	pl_put(p);
err_close_ch:
	pl_lib_enter();
	mesh_close(ch);
	pl_lib_leave();
	return pl_real.connect(fd, sa, len);
}

int pl_listen(int fd, int backlog)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	mesh_listener_t *ls = NULL;
	struct pl_fd *p;
	uint8_t addr[16];
	uint16_t port;
	int family, sfamily, ret;

	ret = pl_real.listen(fd, backlog);
	if (ret || fd >= PL_FD_MAX || pl_tracked(fd) || !is_tcp(fd, &sfamily))
		return ret;
	if (pl_real.getsockname(fd, (struct sockaddr *)&ss, &sl))
		return ret;
	family = pl_sa_addr((struct sockaddr *)&ss, sl, addr, &port);
	if (family < 0 || !pl_port_wanted(port) || !pl_nodes_ready())
		return ret;
	{
		static const uint8_t any[16];
		const struct pl_node *n = pl_node_by_addr(family, addr);

		if (memcmp(addr, any, family == AF_INET ? 4 : 16) && !(n && n->self))
			return ret; /* bound to an address that is not this node's (loopback...) */
	}
	pl_lib_enter();
	ret = mesh_listen(pl_session(), port, &ls);
	pl_lib_leave();
	if (ret) {
		pl_warn((unsigned)-ret + 200, "mesh_listen on port %u: %s (%s); listening on kernel TCP only", port,
			mesh_strerror(ret), mesh_session_error(pl_session()));
		return 0;
	}
	p = pl_new(PL_LISTENER, sfamily);
	if (!p) {
		pl_lib_enter();
		mesh_listener_close(ls);
		pl_lib_leave();
		return 0;
	}
	p->ls = ls;
	p->lfd = mesh_listener_fd(ls);
	pl_put(pl_table_set(fd, p));
	pl_put(p);
	pl_epoll_forget(fd); /* registrations made before listen() are re-made with the listener's fd */
	PL_DEBUG("fd %d: listening on port %u through the mesh too", fd, port);
	return 0;
}

/* A channel accepted on listener p, installed at a new descriptor. */
static int accept_channel(struct pl_fd *l, mesh_channel_t *ch, struct sockaddr *sa, socklen_t *sl, int flags)
{
	struct mesh_channel_info info;
	struct pl_fd *p;
	int cfd, nfd;

	p = pl_new(PL_CHANNEL, l->family);
	if (!p) {
		pl_lib_enter();
		mesh_close(ch);
		pl_lib_leave();
		errno = ENOMEM;
		return -1;
	}
	p->ch = ch;
	pl_lib_enter();
	mesh_channel_info(ch, &info);
	cfd = mesh_channel_fd(ch);
	pl_lib_leave();
	nfd = cfd < 0 ? -1 : pl_real.fcntl(cfd, F_DUPFD_CLOEXEC, 0);
	if (nfd < 0 || nfd >= PL_FD_MAX) {
		int e = nfd < 0 ? errno : EMFILE;

		if (nfd >= 0)
			pl_real.close(nfd);
		pl_put(p);
		errno = e;
		return -1;
	}
	atomic_init(&p->nonblock, flags & SOCK_NONBLOCK);
	p->cloexec = flags & SOCK_CLOEXEC;
	pl_sa_make(l->family, pl_node_self(), info.local_port, &p->local, &p->local_len);
	pl_sa_make(l->family, pl_node_by_id(info.peer_node), info.peer_port, &p->peer, &p->peer_len);
	pl_sa_copy_out(&p->peer, p->peer_len, sa, sl);
	pl_epoll_forget(nfd);
	pl_put(pl_table_set(nfd, p));
	pl_put(p);
	PL_DEBUG("fd %d: accepted channel %u from node %u port %u", nfd, info.channel_id, info.peer_node,
	      info.peer_port);
	return nfd;
}

int pl_accept(struct pl_fd *p, int fd, struct sockaddr *sa, socklen_t *sl, int flags)
{
	int ret;

	if (p->kind != PL_LISTENER) {
		pl_put(p);
		errno = EINVAL;
		return -1;
	}
	for (;;) {
		mesh_channel_t *ch = NULL;
		struct pollfd pf[2];
		int fl;

		/* A listener's connection to meshd is shared by the threads of this process and by
		 * forked processes: whoever reads a channel's datagram has the channel, and the others
		 * find nothing (-EAGAIN) and go on to the kernel's socket, as a kernel accept does. */
		if (p->ls) {
			pthread_mutex_lock(&p->lock);
			pl_lib_enter();
			ret = mesh_accept(p->ls, MESH_NONBLOCK, &ch);
			pl_lib_leave();
			pthread_mutex_unlock(&p->lock);
			if (!ret) {
				ret = accept_channel(p, ch, sa, sl, flags);
				pl_put(p);
				return ret;
			}
			if (ret != -EAGAIN)
				pl_warn((unsigned)-ret + 300, "mesh_accept on descriptor %d: %s", fd, mesh_strerror(ret));
		}
		fl = pl_real.fcntl(fd, F_GETFL);
		if (fl >= 0 && (fl & O_NONBLOCK)) {
			ret = pl_real.accept4(fd, sa, sl, flags);
			pl_put(p);
			return ret;
		}
		pf[0] = (struct pollfd){.fd = fd, .events = POLLIN};
		pf[1] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
		if (pl_real.poll(pf, p->ls ? 2 : 1, -1) < 0) {
			if (errno == EINTR) {
				pl_put(p);
				return -1;
			}
		}
		if (pf[0].revents) {
			ret = pl_real.accept4(fd, sa, sl, flags);
			pl_put(p);
			return ret;
		}
	}
}

int pl_close(int fd)
{
	struct pl_fd *p;

	pl_epoll_forget(fd);
	if (fd < PL_FD_MAX && pl_tracked(fd)) {
		p = pl_table_set(fd, NULL);
		pl_put(p);
	}
	return pl_real.close(fd);
}

/* After a successful dup of old to new: new shares old's entry. */
static void dup_track(int oldfd, int newfd)
{
	struct pl_fd *p = pl_get(oldfd);

	pl_epoll_forget(newfd);
	if (newfd >= PL_FD_MAX) {
		pl_put(p);
		return;
	}
	pl_put(pl_table_set(newfd, p));
	pl_put(p);
}

int pl_dup(int fd)
{
	int n;

	n = pl_real.fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (n >= 0)
		dup_track(fd, n);
	return n;
}

int pl_dup3(int oldfd, int newfd, int flags)
{
	int n;

	n = pl_real.dup3(oldfd, newfd, pl_tracked(oldfd) ? O_CLOEXEC : flags);
	if (n >= 0)
		dup_track(oldfd, n);
	return n;
}

int pl_dup2(int oldfd, int newfd)
{
	int n;

	if (oldfd == newfd)
		return pl_real.dup2(oldfd, newfd);
	n = pl_real.dup3(oldfd, newfd, pl_tracked(oldfd) ? O_CLOEXEC : 0);
	if (n >= 0)
		dup_track(oldfd, n);
	return n;
}

static int fcntl_chan(struct pl_fd *p, int fd, int cmd, long arg)
{
	int n;

	switch (cmd) {
	case F_GETFL:
		return O_RDWR | (atomic_load(&p->nonblock) ? O_NONBLOCK : 0);
	case F_SETFL:
		atomic_store(&p->nonblock, (arg & O_NONBLOCK) != 0);
		return 0;
	case F_GETFD:
		return p->cloexec ? FD_CLOEXEC : 0;
	case F_SETFD:
		/* A channel never survives exec: the real descriptor stays close-on-exec. */
		p->cloexec = arg & FD_CLOEXEC;
		return 0;
	case F_DUPFD:
	case F_DUPFD_CLOEXEC:
		n = pl_real.fcntl(fd, F_DUPFD_CLOEXEC, arg);
		if (n >= 0)
			dup_track(fd, n);
		return n;
	default:
		errno = EINVAL;
		return -1;
	}
}

int pl_fcntl(struct pl_fd *p, int fd, int cmd, long arg)
{
	int ret;

	if (p->kind == PL_CHANNEL) {
		ret = fcntl_chan(p, fd, cmd, arg);
	} else if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) {
		ret = pl_real.fcntl(fd, cmd, arg);
		if (ret >= 0)
			dup_track(fd, ret);
	} else {
		ret = pl_real.fcntl(fd, cmd, arg);
	}
	pl_put(p);
	return ret;
}
