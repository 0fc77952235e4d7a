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
 * This file holds the interposers only, each a dispatch line as in rdma-core's librspreload: a
 * descriptor of ours goes to what the call means on a channel (chan.c) or on a descriptor becoming
 * one (sock.c), a wait over ours to poll.c, anything else to libc.
 *
 * Environment: MESH_PRELOAD=off disables it, MESH_PRELOAD_PORTS=6379,11211 limits the ports,
 * MESH_PRELOAD_DEBUG=1 says on stderr what became a channel, MESH_SOCKET names meshd's socket.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <unistd.h>

#include "preload.h"

#define PL_EXPORT __attribute__((visibility("default")))

/* ---- socket calls ---- */

PL_EXPORT int socket(int domain, int type, int protocol)
{
	pl_ensure_init();
	return pl_real.socket(domain, type, protocol);
}

PL_EXPORT int connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	return pl_bypass() || !sa || fd < 0 || fd >= PL_FD_MAX ? pl_real.connect(fd, sa, len) : pl_connect(fd, sa, len);
}

PL_EXPORT int listen(int fd, int backlog)
{
	return pl_bypass() ? pl_real.listen(fd, backlog) : pl_listen(fd, backlog);
}

PL_EXPORT int accept4(int fd, struct sockaddr *sa, socklen_t *sl, int flags)
{
	struct pl_fd *p = pl_lookup(fd);

	return p ? pl_accept(p, fd, sa, sl, flags) : pl_real.accept4(fd, sa, sl, flags);
}

PL_EXPORT int accept(int fd, struct sockaddr *sa, socklen_t *sl)
{
	return accept4(fd, sa, sl, 0);
}

PL_EXPORT int close(int fd)
{
	return pl_bypass() || fd < 0 ? pl_real.close(fd) : pl_close(fd);
}

PL_EXPORT int dup(int fd)
{
	return pl_bypass() || !pl_tracked(fd) ? pl_real.dup(fd) : pl_dup(fd);
}

PL_EXPORT int dup3(int oldfd, int newfd, int flags)
{
	return pl_bypass() || (!pl_tracked(oldfd) && !pl_tracked(newfd)) ? pl_real.dup3(oldfd, newfd, flags)
									    : pl_dup3(oldfd, newfd, flags);
}

PL_EXPORT int dup2(int oldfd, int newfd)
{
	return pl_bypass() || (!pl_tracked(oldfd) && !pl_tracked(newfd)) ? pl_real.dup2(oldfd, newfd)
									    : pl_dup2(oldfd, newfd);
}

static int fcntl_any(int fd, int cmd, long arg)
{
	struct pl_fd *p = pl_lookup(fd);

	return p ? pl_fcntl(p, fd, cmd, arg) : pl_real.fcntl(fd, cmd, arg);
}

PL_EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	long arg;

	va_start(ap, cmd);
	arg = va_arg(ap, long);
	va_end(ap);
	return fcntl_any(fd, cmd, arg);
}

PL_EXPORT int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	long arg;

	va_start(ap, cmd);
	arg = va_arg(ap, long);
	va_end(ap);
	return fcntl_any(fd, cmd, arg);
}

PL_EXPORT int ioctl(int fd, unsigned long req, ...)
{
	struct pl_fd *p;
	va_list ap;
	void *arg;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	p = pl_chan_get(fd);
	return p ? pl_chan_ioctl(p, req, arg) : pl_real.ioctl(fd, req, arg);
}

PL_EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	struct pl_fd *p = pl_chan_get(fd);

	return p ? pl_chan_getsockopt(p, level, name, val, len) : pl_real.getsockopt(fd, level, name, val, len);
}

PL_EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	struct pl_fd *p = pl_chan_get(fd);

	return p ? pl_chan_setsockopt(p, level, name, val, len) : pl_real.setsockopt(fd, level, name, val, len);
}

PL_EXPORT int getsockname(int fd, struct sockaddr *sa, socklen_t *sl)
{
	struct pl_fd *p = pl_chan_get(fd);

	return p ? pl_chan_name(p, sa, sl, false) : pl_real.getsockname(fd, sa, sl);
}

PL_EXPORT int getpeername(int fd, struct sockaddr *sa, socklen_t *sl)
{
	struct pl_fd *p = pl_chan_get(fd);

	return p ? pl_chan_name(p, sa, sl, true) : pl_real.getpeername(fd, sa, sl);
}

PL_EXPORT int shutdown(int fd, int how)
{
	struct pl_fd *p = pl_chan_get(fd);

	return p ? pl_chan_shutdown(p, how) : pl_real.shutdown(fd, how);
}

/* ---- data ---- */

PL_EXPORT ssize_t read(int fd, void *buf, size_t len)
{
	struct pl_fd *p = pl_chan_get(fd);

	return p ? pl_chan_read(p, buf, len) : pl_real.read(fd, buf, len);
}

PL_EXPORT ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen)
{
	if (len > buflen)
		abort();
	return read(fd, buf, len);
}

PL_EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
	struct pl_fd *p = pl_chan_get(fd);

	return p ? pl_chan_write(p, buf, len) : pl_real.write(fd, buf, len);
}

PL_EXPORT ssize_t readv(int fd, const struct iovec *iov, int n)
{
	struct pl_fd *p = pl_chan_get(fd);

	return p ? pl_chan_readv(p, iov, n) : pl_real.readv(fd, iov, n);
}

PL_EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
	struct pl_fd *p = pl_chan_get(fd);

	return p ? pl_chan_writev(p, iov, n) : pl_real.writev(fd, iov, n);
}

PL_EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *sa, socklen_t *sl)
{
	struct pl_fd *p = pl_chan_get(fd);

	return p ? pl_chan_recvfrom(p, buf, len, flags, sa, sl) : pl_real.recvfrom(fd, buf, len, flags, sa, sl);
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
	struct pl_fd *p = pl_chan_get(fd);

	return p ? pl_chan_sendto(p, buf, len, flags) : pl_real.sendto(fd, buf, len, flags, sa, sl);
}

PL_EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	return sendto(fd, buf, len, flags, NULL, 0);
}

PL_EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	struct pl_fd *p = pl_chan_get(fd);

	return p ? pl_chan_recvmsg(p, m, flags) : pl_real.recvmsg(fd, m, flags);
}

PL_EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	struct pl_fd *p = pl_chan_get(fd);

	return p ? pl_chan_sendmsg(p, m, flags) : pl_real.sendmsg(fd, m, flags);
}

/* sendfile from a channel into something else: through a buffer, by the calls above. */
static ssize_t sendfile_from_chan(int out, int in, off_t *offset, size_t count)
{
	uint8_t buf[65536];
	ssize_t r;

	if (offset) {
		errno = ESPIPE;
		return -1;
	}
	r = read(in, buf, count < sizeof(buf) ? count : sizeof(buf));
	if (r <= 0)
		return r;
	return write(out, buf, (size_t)r);
}

PL_EXPORT ssize_t sendfile(int out, int in, off_t *offset, size_t count)
{
	struct pl_fd *p;

	if (pl_bypass())
		return pl_real.sendfile(out, in, offset, count);
	if (pl_tracked(in))
		return sendfile_from_chan(out, in, offset, count);
	p = pl_chan_get(out);
	return p ? pl_chan_sendfile(p, in, offset, count) : pl_real.sendfile(out, in, offset, count);
}

PL_EXPORT ssize_t sendfile64(int out, int in, off_t *offset, size_t count)
{
	return sendfile(out, in, offset, count);
}

/* ---- waits ---- */

PL_EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	return pl_bypass() || !fds || !pl_poll_tracked(fds, n) ? pl_real.poll(fds, n, timeout)
							       : pl_poll(fds, n, timeout, NULL);
}

PL_EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen)
{
	if (fdslen / sizeof(*fds) < n)
		abort();
	return poll(fds, n, timeout);
}

PL_EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask)
{
	return pl_bypass() || !fds || !pl_poll_tracked(fds, n) ? pl_real.ppoll(fds, n, ts, mask)
							       : pl_poll(fds, n, pl_ts_ms(ts), mask);
}

PL_EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask,
			  size_t fdslen)
{
	if (fdslen / sizeof(*fds) < n)
		abort();
	return ppoll(fds, n, ts, mask);
}

PL_EXPORT int select(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, struct timeval *tv)
{
	return pl_bypass() || !pl_select_tracked(nfds, rd, wr, ex) ? pl_real.select(nfds, rd, wr, ex, tv)
								   : pl_select(nfds, rd, wr, ex, pl_tv_ms(tv), NULL);
}

PL_EXPORT int pselect(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, const struct timespec *ts, const sigset_t *mask)
{
	return pl_bypass() || !pl_select_tracked(nfds, rd, wr, ex) ? pl_real.pselect(nfds, rd, wr, ex, ts, mask)
								   : pl_select(nfds, rd, wr, ex, pl_ts_ms(ts), mask);
}

PL_EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	struct pl_fd *p = pl_lookup(fd);

	return p ? pl_epoll_ctl(p, epfd, op, fd, ev) : pl_real.epoll_ctl(epfd, op, fd, ev);
}

PL_EXPORT int epoll_wait(int epfd, struct epoll_event *out, int max, int timeout)
{
	return pl_bypass() ? pl_real.epoll_wait(epfd, out, max, timeout) : pl_epoll_wait(epfd, out, max, timeout, NULL);
}

PL_EXPORT int epoll_pwait(int epfd, struct epoll_event *out, int max, int timeout, const sigset_t *mask)
{
	return pl_bypass() ? pl_real.epoll_pwait(epfd, out, max, timeout, mask)
			   : pl_epoll_wait(epfd, out, max, timeout, mask);
}
