/*
 * What the socket calls mean on a mesh channel: reading and writing its stream (recv and send in
 * all their forms, sendfile straight into the send ring), the blocking wait of a call that cannot
 * go on yet (a spin for the channel's budget, then a sleep on its descriptor), and the ioctls,
 * options, names and shutdown a TCP program asks of its socket. The interposers (preload.c) hand
 * each call here with the reference pl_chan_get took on the descriptor's entry; every pl_chan_*
 * call drops it before it returns.
 */
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "preload.h"

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

/* Whether this process may use the channel (pl_chan_mine); another process uses it since a fork:
 * named once, and the call fails with ENOTCONN. */
static bool chan_usable(struct pl_fd *p)
{
	int user;

	if (pl_chan_mine(p))
		return true;
	user = pl_chan_user(p);
	if (user == PL_USER_CLOSED)
		pl_warn(2, "a mesh channel inherited through fork() was closed by the process that used it: "
			"ENOTCONN");
	else
		pl_warn(5, "a mesh channel inherited through fork() is used by process %d (one process at a time "
			"uses a channel, the first to use it after the fork): ENOTCONN here", user);
	return false;
}

/* A data call starts: ENOTCONN in a forked child; a non-blocking connect() counts as looked at. */
static bool chan_begin(struct pl_fd *p)
{
	if (!chan_usable(p)) {
		errno = ENOTCONN;
		return false;
	}
	atomic_store(&p->connecting, false);
	return true;
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

/* Whether a call goes on after a look that moved nothing (-EAGAIN): a blocking one waits for want
 * and looks again; a non-blocking one, or one interrupted in its wait, returns *ret: the bytes
 * moved before, else -1 with EAGAIN or EINTR. */
static bool chan_wait_more(struct pl_fd *p, bool nb, short want, size_t done, ssize_t *ret)
{
	if (!nb && !chan_wait(p, want))
		return true;
	*ret = done ? (ssize_t)done : -1;
	if (!done)
		errno = nb ? EAGAIN : EINTR;
	return false;
}

/* Receives into iov; MSG_PEEK, MSG_DONTWAIT, MSG_WAITALL understood. Returns bytes or -1/errno. */
static ssize_t chan_recv(struct pl_fd *p, const struct iovec *iov, int niov, int flags)
{
	bool nb = atomic_load(&p->nonblock) || (flags & MSG_DONTWAIT);
	size_t total = iov_total(iov, niov), done = 0;
	int i = 0;
	size_t off = 0;
	ssize_t ret;

	if (!chan_begin(p))
		return -1;
	if (!total || p->rd_shut)
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
		if (!chan_wait_more(p, nb, POLLIN, done, &ret))
			return ret;
	}
}

/* Sends iov; a blocking socket sends all of it (like the kernel's), a non-blocking one what fits. */
static ssize_t chan_send(struct pl_fd *p, const struct iovec *iov, int niov, int flags)
{
	bool nb = atomic_load(&p->nonblock) || (flags & MSG_DONTWAIT);
	size_t total = iov_total(iov, niov), done = 0, off = 0;
	int i = 0;
	ssize_t ret;

	if (!chan_begin(p))
		return -1;
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
		if (!chan_wait_more(p, nb, POLLOUT, done, &ret))
			return ret;
	}
}

ssize_t pl_chan_read(struct pl_fd *p, void *buf, size_t len)
{
	struct iovec v = {.iov_base = buf, .iov_len = len};
	ssize_t ret = chan_recv(p, &v, 1, 0);

	pl_put(p);
	return ret;
}

ssize_t pl_chan_write(struct pl_fd *p, const void *buf, size_t len)
{
	struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
	ssize_t ret = chan_send(p, &v, 1, 0);

	pl_put(p);
	return ret;
}

/* readv or writev: EINVAL for a vector count the kernel's would refuse. */
static ssize_t chan_vec(struct pl_fd *p, const struct iovec *iov, int n, bool send)
{
	ssize_t ret;

	if (n < 0 || n > IOV_MAX) {
		pl_put(p);
		errno = EINVAL;
		return -1;
	}
	ret = send ? chan_send(p, iov, n, 0) : chan_recv(p, iov, n, 0);
	pl_put(p);
	return ret;
}

ssize_t pl_chan_readv(struct pl_fd *p, const struct iovec *iov, int n)
{
	return chan_vec(p, iov, n, false);
}

ssize_t pl_chan_writev(struct pl_fd *p, const struct iovec *iov, int n)
{
	return chan_vec(p, iov, n, true);
}

ssize_t pl_chan_recvfrom(struct pl_fd *p, void *buf, size_t len, int flags, struct sockaddr *sa, socklen_t *sl)
{
	struct iovec v = {.iov_base = buf, .iov_len = len};
	ssize_t ret;

	ret = chan_recv(p, &v, 1, flags);
	if (ret >= 0)
		pl_sa_copy_out(&p->peer, p->peer_len, sa, sl);
	pl_put(p);
	return ret;
}

ssize_t pl_chan_sendto(struct pl_fd *p, const void *buf, size_t len, int flags)
{
	struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
	ssize_t ret;

	ret = chan_send(p, &v, 1, flags);
	pl_put(p);
	return ret;
}

ssize_t pl_chan_recvmsg(struct pl_fd *p, struct msghdr *m, int flags)
{
	ssize_t ret;

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

ssize_t pl_chan_sendmsg(struct pl_fd *p, const struct msghdr *m, int flags)
{
	ssize_t ret;

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
static ssize_t chan_sendfile(struct pl_fd *p, int in, off_t *offset, size_t count)
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

ssize_t pl_chan_sendfile(struct pl_fd *p, int in, off_t *offset, size_t count)
{
	ssize_t ret = chan_sendfile(p, in, offset, count);

	pl_put(p);
	return ret;
}

int pl_chan_ioctl(struct pl_fd *p, unsigned long req, void *arg)
{
	struct mesh_channel_status st;
	int ret = 0;

	switch (req) {
	case FIONBIO:
		atomic_store(&p->nonblock, *(int *)arg != 0);
		break;
	case FIONREAD:
	case TIOCOUTQ:
		if (!chan_usable(p)) {
			errno = ENOTCONN;
			ret = -1;
			break;
		}
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

int pl_chan_getsockopt(struct pl_fd *p, int level, int name, void *val, socklen_t *len)
{
	int v = 0;

	if (!val || !len) {
		pl_put(p);
		errno = EFAULT;
		return -1;
	}
	if (level == SOL_SOCKET && name == SO_ERROR) {
		short ev;

		atomic_store(&p->connecting, false);
		ev = pl_chan_revents(p, false);
		if ((ev & POLLERR) && pl_chan_user(p) != pl_pid()) {
			v = ENOTCONN; /* another process's since a fork */
		} else if (ev & POLLERR) {
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

int pl_chan_setsockopt(struct pl_fd *p, int level, int name, const void *val, socklen_t len)
{
	int v = 0;

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

int pl_chan_name(struct pl_fd *p, struct sockaddr *sa, socklen_t *sl, bool peer)
{
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

int pl_chan_shutdown(struct pl_fd *p, int how)
{
	int ret = 0;

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
