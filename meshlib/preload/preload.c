/*
 * libmesh_preload.so: unmodified TCP programs over the mesh (LD_PRELOAD).
 *
 * A TCP connect() to the address of a cluster node (meshd's node table, learnt once on first use)
 * becomes mesh_connect(node, port); a TCP listener on port P (any address or this node's) also
 * listens on the mesh's port P, and accept() returns channels as well as kernel connections.
 * Everything else goes to the kernel untouched; so does everything while the calling thread is
 * inside libmesh (its own sockets, polls and eventfds).
 *
 * Descriptor numbers stay real: a channel's number is a duplicate of mesh_channel_fd (an epoll
 * descriptor readable on any change of the channel), so the kernel's poll, select and epoll can
 * watch it; poll.c turns "changed" into POLLIN/POLLOUT by asking the channel. fdtab.c's table maps
 * the number to the channel.
 *
 * Environment: MESH_PRELOAD=off disables it, MESH_PRELOAD_PORTS=6379,11211 limits the ports,
 * MESH_PRELOAD_DEBUG=1 says on stderr what became a channel, MESH_SOCKET names meshd's socket.
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "preload.h"

#define PL_EXPORT __attribute__((visibility("default")))
#define PL_CONNECT_TIMEOUT_MS 10000u

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

/* Waits until the channel may do what `want` (POLLIN/POLLOUT) says; 0, or -EINTR. It first polls
 * the rings for the channel's spin budget, as libmesh's blocking calls do (and rsocket's, for its
 * polling_time): an answer that comes within it is taken without sleeping, so without waiting for
 * meshd to wake us through the fd, a hop that doubled a request-reply round trip. It yields between
 * looks, so a spinner never starves the meshd or the peer it waits for. Then it sleeps on the fd;
 * a thread that shares the channel with others re-checks every 50 ms there: another's
 * MESH_NONBLOCK call may have cleared the change it was waiting for. Alone it re-checks every
 * second: another thread may have started its call after this one counted them, and the Go
 * binding's stall (a writer clearing a reader's change while both ends of a two-way stream wait
 * for each other) would then last until the next change, which might never come. */
static int chan_wait(struct pl_fd *p, short want)
{
	struct pollfd pf = {.events = POLLIN};
	struct pl_spin sp;

	pl_spin_start(&sp, pl_chan_spin_us(p));
	while (pl_spin_on(&sp, -1)) {
		if (pl_chan_revents(p, false) & (want | POLLERR | POLLHUP))
			return 0;
		sched_yield();
	}
	pf.fd = mesh_channel_fd(p->ch);
	for (;;) {
		short ev = pl_chan_revents(p, true);

		if (ev & (want | POLLERR | POLLHUP))
			return 0;
		if (pl_real.poll(&pf, 1, atomic_load(&p->refs) > 2 ? 50 : 1000) < 0 && errno == EINTR)
			return -EINTR;
	}
}

/* A channel used by a forked child, or any call after the entry went bad. */
static bool chan_usable(struct pl_fd *p)
{
	if (p->owner == getpid())
		return true;
	pl_warn(2, "a mesh channel inherited through fork() belongs to the parent: ENOTCONN in the child");
	return false;
}

static size_t iov_total(const struct iovec *iov, int n)
{
	size_t t = 0;

	for (int i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

/* Moves bytes between the channel and iov from (*i, *off) on without waiting, under p->lock and
 * inside libmesh: the count moved, or when nothing moved what mesh_send/mesh_recv said (0 at the
 * end of the stream, -EAGAIN, an error). Stops at the first short move: the ring is full (send) or
 * empty (receive) for now. */
static ssize_t iov_move(struct pl_fd *p, const struct iovec *iov, int niov, int *i, size_t *off, bool send)
{
	ssize_t r = 0;

	while (*i < niov) {
		uint8_t *b = (uint8_t *)iov[*i].iov_base + *off;
		size_t n = iov[*i].iov_len - *off;
		ssize_t g;

		if (!n) {
			(*i)++;
			*off = 0;
			continue;
		}
		g = send ? mesh_send(p->ch, b, n, MESH_NONBLOCK) : mesh_recv(p->ch, b, n, MESH_NONBLOCK);
		if (g <= 0)
			return r ? r : g;
		r += g;
		*off += (size_t)g;
		if ((size_t)g < n)
			break;
	}
	return r;
}

/* Receives into iov; MSG_PEEK, MSG_DONTWAIT, MSG_WAITALL understood. Returns bytes or -1/errno. */
static ssize_t chan_recv(struct pl_fd *p, const struct iovec *iov, int niov, int flags)
{
	bool nb = atomic_load(&p->nonblock) || (flags & MSG_DONTWAIT);
	size_t total = iov_total(iov, niov), done = 0;
	int i = 0;
	size_t off = 0;

	if (!chan_usable(p)) {
		errno = ENOTCONN;
		return -1;
	}
	atomic_store(&p->connecting, false);
	if (!total)
		return 0;
	if (p->rd_shut)
		return 0;
	for (;;) {
		ssize_t r;

		pthread_mutex_lock(&p->lock);
		pl_lib_enter();
		if (flags & MSG_PEEK) {
			const void *b;

			r = mesh_recv_peek(p->ch, &b, MESH_NONBLOCK);
			if (r > 0) {
				size_t n = (size_t)r, k = 0;

				for (int j = 0; j < niov && k < n; j++) {
					size_t c = iov[j].iov_len < n - k ? iov[j].iov_len : n - k;

					memcpy(iov[j].iov_base, (const uint8_t *)b + k, c);
					k += c;
				}
				r = (ssize_t)k;
			}
		} else {
			r = iov_move(p, iov, niov, &i, &off, false);
		}
		pl_lib_leave();
		pthread_mutex_unlock(&p->lock);
		if (r > 0) {
			done += (size_t)r;
			if ((flags & MSG_PEEK) || !(flags & MSG_WAITALL) || done == total || nb)
				return (ssize_t)done;
			continue;
		}
		if (r == 0)
			return (ssize_t)done; /* the end of the stream */
		if (r != -EAGAIN) {
			if (done)
				return (ssize_t)done;
			errno = pl_app_errno((int)r);
			return -1;
		}
		if (nb) {
			if (done)
				return (ssize_t)done;
			errno = EAGAIN;
			return -1;
		}
		if (chan_wait(p, POLLIN)) {
			if (done)
				return (ssize_t)done;
			errno = EINTR;
			return -1;
		}
	}
}

/* Sends iov; a blocking socket sends all of it (like the kernel's), a non-blocking one what fits. */
static ssize_t chan_send(struct pl_fd *p, const struct iovec *iov, int niov, int flags)
{
	bool nb = atomic_load(&p->nonblock) || (flags & MSG_DONTWAIT);
	size_t total = iov_total(iov, niov), done = 0, off = 0;
	int i = 0;

	if (!chan_usable(p)) {
		errno = ENOTCONN;
		return -1;
	}
	atomic_store(&p->connecting, false);
	if (!total)
		return 0;
	for (;;) {
		ssize_t r = 0;

		pthread_mutex_lock(&p->lock);
		pl_lib_enter();
		r = iov_move(p, iov, niov, &i, &off, true);
		pl_lib_leave();
		pthread_mutex_unlock(&p->lock);
		if (r > 0) {
			done += (size_t)r;
			if (done == total || nb)
				return (ssize_t)done;
			continue;
		}
		if (r != -EAGAIN) {
			if (done)
				return (ssize_t)done;
			if (r == -EPIPE && !(flags & MSG_NOSIGNAL))
				raise(SIGPIPE);
			errno = pl_app_errno((int)r);
			return -1;
		}
		if (nb) {
			if (done)
				return (ssize_t)done;
			errno = EAGAIN;
			return -1;
		}
		if (chan_wait(p, POLLOUT)) {
			if (done)
				return (ssize_t)done;
			errno = EINTR;
			return -1;
		}
	}
}

/* ---- socket calls ---- */

PL_EXPORT int socket(int domain, int type, int protocol)
{
	pl_ensure_init();
	return pl_real.socket(domain, type, protocol);
}

PL_EXPORT int connect(int fd, const struct sockaddr *sa, socklen_t len)
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

	if (pl_bypass() || !sa || fd < 0 || fd >= PL_FD_MAX)
		return pl_real.connect(fd, sa, len);
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

PL_EXPORT int listen(int fd, int backlog)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	mesh_listener_t *ls = NULL;
	struct pl_fd *p;
	uint8_t addr[16];
	uint16_t port;
	int family, sfamily, ret;

	if (pl_bypass())
		return pl_real.listen(fd, backlog);
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

PL_EXPORT int accept4(int fd, struct sockaddr *sa, socklen_t *sl, int flags)
{
	struct pl_fd *p;
	int ret;

	if (pl_bypass() || !(p = pl_get(fd)))
		return pl_real.accept4(fd, sa, sl, flags);
	if (p->kind != PL_LISTENER) {
		pl_put(p);
		errno = EINVAL;
		return -1;
	}
	for (;;) {
		mesh_channel_t *ch = NULL;
		struct pollfd pf[2];
		int fl;

		if (p->ls && p->owner == getpid()) {
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
		} else if (p->ls) {
			/* A forked child shares the listener's connection: whoever reads a channel owns it. */
			pl_lib_enter();
			ret = mesh_accept(p->ls, MESH_NONBLOCK, &ch);
			pl_lib_leave();
			if (!ret) {
				ret = accept_channel(p, ch, sa, sl, flags);
				pl_put(p);
				return ret;
			}
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

PL_EXPORT int accept(int fd, struct sockaddr *sa, socklen_t *sl)
{
	return accept4(fd, sa, sl, 0);
}

PL_EXPORT int close(int fd)
{
	struct pl_fd *p;

	if (pl_bypass() || fd < 0)
		return pl_real.close(fd);
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

PL_EXPORT int dup(int fd)
{
	int n;

	if (pl_bypass() || !pl_tracked(fd))
		return pl_real.dup(fd);
	n = pl_real.fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (n >= 0)
		dup_track(fd, n);
	return n;
}

PL_EXPORT int dup3(int oldfd, int newfd, int flags)
{
	int n;

	if (pl_bypass() || (!pl_tracked(oldfd) && !pl_tracked(newfd)))
		return pl_real.dup3(oldfd, newfd, flags);
	n = pl_real.dup3(oldfd, newfd, pl_tracked(oldfd) ? O_CLOEXEC : flags);
	if (n >= 0)
		dup_track(oldfd, n);
	return n;
}

PL_EXPORT int dup2(int oldfd, int newfd)
{
	int n;

	if (pl_bypass() || (!pl_tracked(oldfd) && !pl_tracked(newfd)))
		return pl_real.dup2(oldfd, newfd);
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

static int fcntl_common(int fd, int cmd, long arg)
{
	struct pl_fd *p;
	int ret;

	if (pl_bypass() || !(p = pl_get(fd)))
		return pl_real.fcntl(fd, cmd, arg);
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

PL_EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	long arg;

	va_start(ap, cmd);
	arg = va_arg(ap, long);
	va_end(ap);
	return fcntl_common(fd, cmd, arg);
}

PL_EXPORT int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	long arg;

	va_start(ap, cmd);
	arg = va_arg(ap, long);
	va_end(ap);
	return fcntl_common(fd, cmd, arg);
}

PL_EXPORT int ioctl(int fd, unsigned long req, ...)
{
	struct mesh_channel_status st;
	struct pl_fd *p;
	va_list ap;
	void *arg;
	int ret = 0;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (pl_bypass() || !(p = pl_get(fd)) )
		return pl_real.ioctl(fd, req, arg);
	if (p->kind != PL_CHANNEL) {
		pl_put(p);
		return pl_real.ioctl(fd, req, arg);
	}
	switch (req) {
	case FIONBIO:
		atomic_store(&p->nonblock, *(int *)arg != 0);
		break;
	case FIONREAD:
	case TIOCOUTQ:
		pthread_mutex_lock(&p->lock);
		pl_lib_enter();
		ret = mesh_channel_status(p->ch, 0, &st);
		pl_lib_leave();
		pthread_mutex_unlock(&p->lock);
		if (ret) {
			errno = pl_app_errno(ret);
			ret = -1;
			break;
		}
		if (req == FIONREAD) {
			*(int *)arg = st.rx_bytes > INT_MAX ? INT_MAX : (int)st.rx_bytes;
		} else {
			struct mesh_channel_info info;

			mesh_channel_info(p->ch, &info);
			*(int *)arg = (int)(info.ring_size - st.tx_free);
		}
		break;
	default:
		errno = ENOTTY;
		ret = -1;
	}
	pl_put(p);
	return ret;
}

PL_EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	struct pl_fd *p;
	int v = 0;

	if (pl_bypass() || !(p = pl_get(fd)))
		return pl_real.getsockopt(fd, level, name, val, len);
	if (p->kind != PL_CHANNEL) {
		pl_put(p);
		return pl_real.getsockopt(fd, level, name, val, len);
	}
	if (!val || !len) {
		pl_put(p);
		errno = EFAULT;
		return -1;
	}
	if (level == SOL_SOCKET && name == SO_ERROR) {
		short ev;

		atomic_store(&p->connecting, false);
		ev = pl_chan_revents(p, false);
		if (ev & POLLERR) {
			struct mesh_channel_status st;

			pthread_mutex_lock(&p->lock);
			pl_lib_enter();
			if (!mesh_channel_status(p->ch, 0, &st) && st.error && !(st.ready & MESH_READY_EOF))
				v = pl_app_errno(st.error);
			pl_lib_leave();
			pthread_mutex_unlock(&p->lock);
		}
	} else if (level == SOL_SOCKET && name == SO_TYPE) {
		v = SOCK_STREAM;
	} else if (level == SOL_SOCKET && name == SO_DOMAIN) {
		v = p->family;
	} else if (level == SOL_SOCKET && name == SO_PROTOCOL) {
		v = IPPROTO_TCP;
	} else if (level == SOL_SOCKET && (name == SO_RCVBUF || name == SO_SNDBUF)) {
		struct mesh_channel_info info;

		mesh_channel_info(p->ch, &info);
		v = info.ring_size > INT_MAX ? INT_MAX : (int)info.ring_size;
	} else {
		for (int i = 0; i < p->n_opts; i++)
			if (p->opts[i].level == level && p->opts[i].name == name)
				v = p->opts[i].value;
	}
	pl_put(p);
	if (*len >= sizeof(int)) {
		memcpy(val, &v, sizeof(int));
		*len = sizeof(int);
	} else {
		memset(val, 0, *len);
	}
	return 0;
}

PL_EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	struct pl_fd *p;
	int v = 0;

	if (pl_bypass() || !(p = pl_get(fd)))
		return pl_real.setsockopt(fd, level, name, val, len);
	if (p->kind != PL_CHANNEL) {
		pl_put(p);
		return pl_real.setsockopt(fd, level, name, val, len);
	}
	/* Accepted and remembered (TCP_NODELAY, SO_KEEPALIVE, buffer sizes...): a channel has no such knobs. */
	if (val && len >= sizeof(int))
		memcpy(&v, val, sizeof(int));
	pthread_mutex_lock(&p->lock);
	for (int i = 0; i <= p->n_opts && i < PL_OPTS_MAX; i++) {
		if (i == p->n_opts)
			p->n_opts++;
		else if (p->opts[i].level != level || p->opts[i].name != name)
			continue;
		p->opts[i].level = level;
		p->opts[i].name = name;
		p->opts[i].value = v;
		break;
	}
	pthread_mutex_unlock(&p->lock);
	pl_put(p);
	return 0;
}

static int sockname(int fd, struct sockaddr *sa, socklen_t *sl, bool peer)
{
	struct pl_fd *p = NULL;

	if (pl_bypass() || !(p = pl_get(fd)) || p->kind != PL_CHANNEL) {
		if (p)
			pl_put(p);
		return peer ? pl_real.getpeername(fd, sa, sl) : pl_real.getsockname(fd, sa, sl);
	}
	if (!sa || !sl) {
		pl_put(p);
		errno = EFAULT;
		return -1;
	}
	if (peer)
		pl_sa_copy_out(&p->peer, p->peer_len, sa, sl);
	else
		pl_sa_copy_out(&p->local, p->local_len, sa, sl);
	pl_put(p);
	return 0;
}

PL_EXPORT int getsockname(int fd, struct sockaddr *sa, socklen_t *sl)
{
	return sockname(fd, sa, sl, false);
}

PL_EXPORT int getpeername(int fd, struct sockaddr *sa, socklen_t *sl)
{
	return sockname(fd, sa, sl, true);
}

PL_EXPORT int shutdown(int fd, int how)
{
	struct pl_fd *p = NULL;
	int ret = 0;

	if (pl_bypass() || !(p = pl_get(fd)) || p->kind != PL_CHANNEL) {
		if (p)
			pl_put(p);
		return pl_real.shutdown(fd, how);
	}
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
		pl_put(p);
		errno = EINVAL;
		return -1;
	}
	if (!chan_usable(p)) {
		pl_put(p);
		errno = ENOTCONN;
		return -1;
	}
	pthread_mutex_lock(&p->lock);
	if (how != SHUT_WR)
		p->rd_shut = true;
	if (how != SHUT_RD) {
		pl_lib_enter();
		ret = mesh_shutdown(p->ch);
		pl_lib_leave();
	}
	pthread_mutex_unlock(&p->lock);
	pl_put(p);
	if (ret) {
		errno = pl_app_errno(ret);
		return -1;
	}
	return 0;
}

/* ---- data ---- */

#define CHAN_OR_REAL(fd, realcall)                                                  \
	struct pl_fd *p;                                                            \
	ssize_t ret;                                                                \
	if (pl_bypass() || !(p = pl_get(fd)))                                       \
		return realcall;                                                    \
	if (p->kind != PL_CHANNEL) {                                                \
		pl_put(p);                                                          \
		return realcall;                                                    \
	}

PL_EXPORT ssize_t read(int fd, void *buf, size_t len)
{
	struct iovec v = {.iov_base = buf, .iov_len = len};

	CHAN_OR_REAL(fd, pl_real.read(fd, buf, len));
	ret = chan_recv(p, &v, 1, 0);
	pl_put(p);
	return ret;
}

PL_EXPORT ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen)
{
	if (len > buflen)
		abort();
	return read(fd, buf, len);
}

PL_EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
	struct iovec v = {.iov_base = (void *)buf, .iov_len = len};

	CHAN_OR_REAL(fd, pl_real.write(fd, buf, len));
	ret = chan_send(p, &v, 1, 0);
	pl_put(p);
	return ret;
}

PL_EXPORT ssize_t readv(int fd, const struct iovec *iov, int n)
{
	CHAN_OR_REAL(fd, pl_real.readv(fd, iov, n));
	if (n < 0 || n > IOV_MAX) {
		pl_put(p);
		errno = EINVAL;
		return -1;
	}
	ret = chan_recv(p, iov, n, 0);
	pl_put(p);
	return ret;
}

PL_EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
	CHAN_OR_REAL(fd, pl_real.writev(fd, iov, n));
	if (n < 0 || n > IOV_MAX) {
		pl_put(p);
		errno = EINVAL;
		return -1;
	}
	ret = chan_send(p, iov, n, 0);
	pl_put(p);
	return ret;
}

PL_EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *sa, socklen_t *sl)
{
	struct iovec v = {.iov_base = buf, .iov_len = len};

	CHAN_OR_REAL(fd, pl_real.recvfrom(fd, buf, len, flags, sa, sl));
	ret = chan_recv(p, &v, 1, flags);
	if (ret >= 0)
		pl_sa_copy_out(&p->peer, p->peer_len, sa, sl);
	pl_put(p);
	return ret;
}

PL_EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	return recvfrom(fd, buf, len, flags, NULL, NULL);
}

PL_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags)
{
	if (len > buflen)
		abort();
	return recvfrom(fd, buf, len, flags, NULL, NULL);
}

PL_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags, struct sockaddr *sa,
				 socklen_t *sl)
{
	if (len > buflen)
		abort();
	return recvfrom(fd, buf, len, flags, sa, sl);
}

PL_EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *sa, socklen_t sl)
{
	struct iovec v = {.iov_base = (void *)buf, .iov_len = len};

	CHAN_OR_REAL(fd, pl_real.sendto(fd, buf, len, flags, sa, sl));
	ret = chan_send(p, &v, 1, flags);
	pl_put(p);
	return ret;
}

PL_EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	return sendto(fd, buf, len, flags, NULL, 0);
}

PL_EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	CHAN_OR_REAL(fd, pl_real.recvmsg(fd, m, flags));
	if (!m || m->msg_iovlen > IOV_MAX) {
		pl_put(p);
		errno = EINVAL;
		return -1;
	}
	ret = chan_recv(p, m->msg_iov, (int)m->msg_iovlen, flags);
	if (ret >= 0) {
		if (m->msg_name)
			pl_sa_copy_out(&p->peer, p->peer_len, m->msg_name, &m->msg_namelen);
		m->msg_controllen = 0; /* no ancillary data over a channel */
		m->msg_flags = 0;
	}
	pl_put(p);
	return ret;
}

PL_EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	CHAN_OR_REAL(fd, pl_real.sendmsg(fd, m, flags));
	if (!m || m->msg_iovlen > IOV_MAX) {
		pl_put(p);
		errno = EINVAL;
		return -1;
	}
	if (m->msg_controllen) {
		pl_put(p);
		pl_warn(4, "sendmsg with ancillary data (descriptors, credentials) on a mesh channel: EOPNOTSUPP");
		errno = EOPNOTSUPP;
		return -1;
	}
	ret = chan_send(p, m->msg_iov, (int)m->msg_iovlen, flags);
	pl_put(p);
	return ret;
}

/* sendfile into a channel: the file is read straight into the send ring (no copy in between). */
static ssize_t sendfile_chan(struct pl_fd *p, int in, off_t *offset, size_t count)
{
	bool nb = atomic_load(&p->nonblock);
	off_t pos = offset ? *offset : 0;
	size_t done = 0;

	if (!chan_usable(p)) {
		errno = ENOTCONN;
		return -1;
	}
	while (done < count) {
		ssize_t r, g;
		void *buf;

		pthread_mutex_lock(&p->lock);
		pl_lib_enter();
		r = mesh_send_reserve(p->ch, &buf, MESH_NONBLOCK);
		pl_lib_leave();
		if (r > 0) {
			size_t want = count - done < (size_t)r ? count - done : (size_t)r;

			g = offset ? pl_real.pread(in, buf, want, pos) : pl_real.read(in, buf, want);
			if (g > 0) {
				pl_lib_enter();
				r = mesh_send_commit(p->ch, (size_t)g);
				pl_lib_leave();
			}
			pthread_mutex_unlock(&p->lock);
			if (g <= 0) {
				if (g < 0 && !done)
					return -1;
				break; /* the end of the file */
			}
			if (r) {
				if (done)
					break;
				errno = pl_app_errno((int)r);
				return -1;
			}
			done += (size_t)g;
			pos += g;
			continue;
		}
		pthread_mutex_unlock(&p->lock);
		if (r != -EAGAIN) {
			if (done)
				break;
			if (r == -EPIPE)
				raise(SIGPIPE);
			errno = pl_app_errno((int)r);
			return -1;
		}
		if (nb || done) {
			if (done)
				break;
			errno = EAGAIN;
			return -1;
		}
		if (chan_wait(p, POLLOUT)) {
			errno = EINTR;
			return -1;
		}
	}
	if (offset)
		*offset = pos;
	return (ssize_t)done;
}

PL_EXPORT ssize_t sendfile(int out, int in, off_t *offset, size_t count)
{
	struct pl_fd *p;
	ssize_t ret;

	if (pl_bypass())
		return pl_real.sendfile(out, in, offset, count);
	if (pl_tracked(in)) {
		/* From a channel into something else: through a buffer. */
		uint8_t buf[65536];
		ssize_t r, w;

		if (offset) {
			errno = ESPIPE;
			return -1;
		}
		r = read(in, buf, count < sizeof(buf) ? count : sizeof(buf));
		if (r <= 0)
			return r;
		w = write(out, buf, (size_t)r);
		return w;
	}
	if (!(p = pl_get(out)))
		return pl_real.sendfile(out, in, offset, count);
	if (p->kind != PL_CHANNEL) {
		pl_put(p);
		return pl_real.sendfile(out, in, offset, count);
	}
	ret = sendfile_chan(p, in, offset, count);
	pl_put(p);
	return ret;
}

PL_EXPORT ssize_t sendfile64(int out, int in, off_t *offset, size_t count)
{
	return sendfile(out, in, offset, count);
}
