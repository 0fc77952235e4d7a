/*
 * The control connection to meshd: a unix SOCK_SEQPACKET socket carrying one CtlRequest out and
 * CtlReply datagrams back, some of them with descriptors (SCM_RIGHTS).
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "internal.h"
#include "wire.h"

void ctl_deadline(struct timespec *deadline, uint32_t timeout_ms)
{
	clock_gettime(CLOCK_MONOTONIC, deadline);
	deadline->tv_sec += timeout_ms / 1000;
	deadline->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (deadline->tv_nsec >= 1000000000L) {
		deadline->tv_sec++;
		deadline->tv_nsec -= 1000000000L;
	}
}

/* Milliseconds left until the deadline (rounded up, 0 once passed); -1 without a deadline. */
static int ctl_remaining_ms(const struct timespec *deadline)
{
	struct timespec now;
	int64_t ms;

	if (!deadline)
		return -1;
	clock_gettime(CLOCK_MONOTONIC, &now);
	ms = (int64_t)(deadline->tv_sec - now.tv_sec) * 1000 + (deadline->tv_nsec - now.tv_nsec + 999999L) / 1000000L;
	if (ms <= 0)
		return 0;
	return ms > INT_MAX ? INT_MAX : (int)ms;
}

int ctl_open(const char *path, const struct timespec *deadline)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int ms = ctl_remaining_ms(deadline);
	int fd, ret;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* A unix connect() waits for room in meshd's backlog for at most the send timeout: bound it by
	 * the caller's deadline, so a stuck meshd cannot hold us forever. The same bounds send(). */
	if (ms >= 0) {
		struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};

		if (ms == 0)
			tv.tv_usec = 1000;
		if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv))) {
			ret = -errno;
			goto err_close;
		}
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		ret = errno == EAGAIN ? -ETIMEDOUT : -errno;
		goto err_close;
	}
	return fd;

err_close:
	close(fd);
	return ret;
}

int ctl_send(int fd, const CtlRequest *req)
{
	uint8_t buf[MESH_CTL_REQ_MAX];
	size_t len = ctl_request__get_packed_size(req);
	ssize_t n;

	if (len > sizeof(buf))
		return -EMSGSIZE;
	ctl_request__pack(req, buf);
	do
		n = send(fd, buf, len, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	/* meshd may have answered before we asked and hung up: a connection it has no room for gets
	 * the reason (-EUSERS: admin.c, admin_refuse) as its only datagram. The caller's read finds it. */
	if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
		return 0;
	if (n < 0)
		return errno == EAGAIN ? -ETIMEDOUT : -errno;
	return n == (ssize_t)len ? 0 : -EPROTO;
}

int ctl_wait(int fd, const struct timespec *deadline, bool restart)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	int n;

	for (;;) {
		n = poll(&p, 1, ctl_remaining_ms(deadline));
		if (n > 0)
			return 0; /* readable, or hung up: ctl_recv tells which */
		if (n == 0)
			return -ETIMEDOUT;
		if (errno != EINTR || !restart)
			return -errno;
	}
}

void ctl_fds_close(int *fds, int nfds)
{
	for (int i = 0; i < nfds; i++) {
		if (fds[i] >= 0)
			close(fds[i]);
		fds[i] = -1;
	}
}

/* Takes every descriptor of every SCM_RIGHTS message, so that none is leaked whatever follows. */
static int ctl_take_fds(struct msghdr *msg, int fds[CTL_FDS_MAX])
{
	int nfds = 0;

	for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
		size_t n;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS || cm->cmsg_len < CMSG_LEN(0))
			continue;
		n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (nfds < CTL_FDS_MAX)
				fds[nfds++] = fd;
			else
				close(fd); /* cannot happen: the buffer holds CTL_FDS_MAX */
		}
	}
	return nfds;
}

/* recvmsg() returned 0: an empty datagram (a reply whose fields are all defaults packs to zero
 * bytes, e.g. LISTEN's success) or the end of the connection. Once meshd hung up, both mean that
 * nothing more will come. */
static bool ctl_hung_up(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};

	return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

int ctl_recv(int fd, CtlReply **out, int fds[CTL_FDS_MAX], int *nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * CTL_FDS_MAX)];
		struct cmsghdr align;
	} cbuf;
	struct iovec iov;
	struct msghdr msg = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = cbuf.buf,
		.msg_controllen = sizeof(cbuf.buf),
	};
	uint8_t small[64], *buf = small;
	ssize_t len, n;
	CtlReply *r;
	int ret, got;

	*nfds = 0;
	/* The length of the next reply, without taking it (no control buffer: no descriptor is
	 * installed by a peek). Most replies fit the stack buffer. */
	do
		len = recv(fd, NULL, 0, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
	while (len < 0 && errno == EINTR);
	if (len < 0)
		return -errno;
	if ((size_t)len > sizeof(small) && (size_t)len <= MESH_CTL_REPLY_MAX) {
		buf = malloc((size_t)len);
		if (!buf)
			return -ENOMEM;
	}
	/* A reply over the limit is still taken off the socket with its descriptors, then refused. */
	iov.iov_base = buf;
	iov.iov_len = buf == small ? sizeof(small) : (size_t)len;
	do
		n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		ret = -errno;
		goto err_free;
	}
	got = ctl_take_fds(&msg, fds);
	if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		if (msg.msg_flags & MSG_CTRUNC)
			lib_debug("control reply with more than %d descriptors", CTL_FDS_MAX);
		else
			lib_debug("control reply of %zd bytes, over the limit of %u", len, MESH_CTL_REPLY_MAX);
		ret = -EPROTO;
		goto err_close_fds;
	}
	if (n == 0 && ctl_hung_up(fd)) {
		ret = -ECONNRESET;
		goto err_close_fds;
	}
	r = ctl_reply__unpack(NULL, (size_t)n, buf);
	if (!r) {
		lib_debug("undecodable control reply of %zd bytes", n);
		ret = -EBADMSG;
		goto err_close_fds;
	}
	if (buf != small)
		free(buf);
	*out = r;
	*nfds = got;
	return 0;

err_close_fds:
	ctl_fds_close(fds, got);
err_free:
	if (buf != small)
		free(buf);
	return ret;
}

int ctl_request(int fd, const CtlRequest *req, const struct timespec *deadline, CtlReply **out,
		int fds[CTL_FDS_MAX], int *nfds)
{
	int ret;

	if (fd < 0)
		return fd;
	ret = ctl_send(fd, req);
	if (!ret)
		do {
			ret = ctl_wait(fd, deadline, true);
			if (!ret)
				ret = ctl_recv(fd, out, fds, nfds);
		} while (ret == -EAGAIN);
	if (ret) {
		close(fd);
		return ret;
	}
	return fd;
}
