/*
 * A TCP echo server and client of plain sockets, for the preload test (tests/integration/
 * preload_test.py runs them under LD_PRELOAD=libmesh_preload.so). Nothing here knows the mesh.
 *
 *   preload_echo server PORT COUNT        non-blocking, epoll edge-triggered, COUNT connections
 *   preload_echo bserver PORT COUNT       blocking, one connection after the other
 *   preload_echo client HOST PORT MODE BYTES [CHUNK]
 *        MODE block: blocking connect, writev/readv on a dup of the socket, FIONREAD, options;
 *        MODE epoll|poll|select: non-blocking connect (EINPROGRESS, writable, SO_ERROR 0), then
 *        the stream through that wait call. Either way the client sends BYTES of a pattern, reads
 *        the echo back and checks it, shuts its side and expects EOF.
 *   preload_echo duplex HOST PORT BYTES
 *        blocking, two threads on one socket at once: one writes BYTES of the pattern in chunks of
 *        varying size, the other reads the echo back and checks it (a reader and a writer sharing
 *        a channel: one's wait must never take the other's wake-up); then shut, EOF, exit 0.
 *   preload_echo rtt HOST PORT COUNT SIZE
 *        for the benchmark (tests/bench/preload_bench.py): blocking, TCP_NODELAY, COUNT round trips
 *        of SIZE bytes against an echo server; prints "rtt_us AVG" (the mean round trip).
 *   preload_echo bulk HOST PORT BYTES
 *        for the benchmark: BYTES of the pattern through an echo server in blocking write/read
 *        pairs of 64 KiB, the echo checked; only socket, connect, read, write, shutdown and close,
 *        which every preload library serves (rsocket's has no dup, FIONREAD or SO_TYPE, which
 *        "client ... block" checks); prints "bulk_mb_s RATE" (both directions counted).
 * Exit status 0 when every check held; each failure is named on stderr.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static int failures;

#define CHECK(cond, ...)                                                  \
	do {                                                              \
		if (!(cond)) {                                            \
			fprintf(stderr, "preload_echo: FAIL: " __VA_ARGS__); \
			fprintf(stderr, " (%s)\n", strerror(errno));      \
			failures++;                                       \
		}                                                         \
	} while (0)

static uint8_t pattern(uint64_t i)
{
	return (uint8_t)(i * 131 + (i >> 9));
}

static int listen_on(int port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 64)) {
		perror("preload_echo: listen");
		exit(2);
	}
	return fd;
}

/* ---- servers ---- */

static int bserver(int port, int count)
{
	int lfd = listen_on(port);
	static char buf[1 << 16];

	for (int i = 0; i < count; i++) {
		struct sockaddr_in peer;
		socklen_t pl = sizeof(peer);
		int fd = accept(lfd, (struct sockaddr *)&peer, &pl);
		ssize_t n;

		if (fd < 0) {
			perror("preload_echo: accept");
			return 2;
		}
		CHECK(pl == sizeof(peer) && peer.sin_family == AF_INET, "accept gives an IPv4 peer address");
		while ((n = read(fd, buf, sizeof(buf))) > 0) {
			for (ssize_t off = 0; off < n;) {
				ssize_t w = write(fd, buf + off, (size_t)(n - off));

				if (w <= 0) {
					CHECK(0, "blocking write of the echo");
					break;
				}
				off += w;
			}
		}
		CHECK(n == 0, "the server reads EOF after the client shut its side");
		close(fd);
	}
	close(lfd);
	return failures ? 1 : 0;
}

struct conn {
	int fd;
	char buf[1 << 16];
	size_t len; /* unsent echo */
	bool eof;
};

static void conn_close(int ep, struct conn *c, int *done)
{
	epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	free(c);
	(*done)++;
}

/* Moves what it can; returns true when the connection is finished. */
static bool conn_run(struct conn *c)
{
	for (;;) {
		while (c->len) {
			ssize_t w = send(c->fd, c->buf, c->len, MSG_NOSIGNAL);

			if (w < 0 && errno == EAGAIN)
				return false;
			if (w <= 0)
				return true;
			memmove(c->buf, c->buf + w, c->len - (size_t)w);
			c->len -= (size_t)w;
		}
		if (c->eof) {
			shutdown(c->fd, SHUT_WR);
			return true;
		}
		ssize_t r = recv(c->fd, c->buf, sizeof(c->buf), 0);

		if (r < 0 && errno == EAGAIN)
			return false;
		if (r <= 0) {
			c->eof = true;
			continue;
		}
		c->len = (size_t)r;
	}
}

static int server(int port, int count)
{
	struct epoll_event ev = {.events = EPOLLIN}, evs[64];
	int lfd = listen_on(port), ep = epoll_create1(EPOLL_CLOEXEC), done = 0;

	fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK);
	ev.data.ptr = NULL;
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev)) {
		perror("preload_echo: epoll");
		return 2;
	}
	while (done < count) {
		int n = epoll_wait(ep, evs, 64, 30000);

		if (n == 0) {
			CHECK(0, "server: 30 s without an event (%d of %d connections done)", done, count);
			return 1;
		}
		for (int i = 0; i < n; i++) {
			struct conn *c = evs[i].data.ptr;

			if (!c) {
				int fd;

				while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
					struct epoll_event cev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET};

					c = calloc(1, sizeof(*c));
					if (!c)
						return 2;
					c->fd = fd;
					cev.data.ptr = c;
					CHECK(!epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev), "epoll_ctl ADD of an accepted socket");
				}
				CHECK(errno == EAGAIN, "accept4 ends with EAGAIN");
				continue;
			}
			if (conn_run(c))
				conn_close(ep, c, &done);
		}
	}
	close(ep);
	close(lfd);
	return failures ? 1 : 0;
}

/* ---- client ---- */

struct stream {
	uint64_t total, sent, got;
	size_t chunk;
	uint8_t *buf;
	bool shut, eof;
};

/* Sends and receives what can move now; 0 while going, 1 done, -1 failed. */
static int stream_step(int fd, struct stream *s)
{
	if (s->sent < s->total) {
		size_t n = s->total - s->sent < s->chunk ? (size_t)(s->total - s->sent) : s->chunk;
		ssize_t w;

		for (size_t i = 0; i < n; i++)
			s->buf[i] = pattern(s->sent + i);
		w = send(fd, s->buf, n, MSG_NOSIGNAL);
		if (w > 0)
			s->sent += (uint64_t)w;
		else if (errno != EAGAIN)
			return -1;
	} else if (!s->shut) {
		CHECK(!shutdown(fd, SHUT_WR), "shutdown(SHUT_WR)");
		s->shut = true;
	}
	for (;;) {
		ssize_t r = recv(fd, s->buf, s->chunk, 0);

		if (r < 0)
			return errno == EAGAIN ? 0 : -1;
		if (r == 0) {
			s->eof = true;
			return s->got == s->total ? 1 : -1;
		}
		for (ssize_t i = 0; i < r; i++)
			if (s->buf[i] != pattern(s->got + (uint64_t)i)) {
				fprintf(stderr, "preload_echo: FAIL: echo differs at byte %llu\n",
					(unsigned long long)(s->got + (uint64_t)i));
				return -1;
			}
		s->got += (uint64_t)r;
	}
}

static short want_events(const struct stream *s)
{
	return (short)(POLLIN | (s->sent < s->total || !s->shut ? POLLOUT : 0));
}

/* Waits for fd with the named call; returns its revents as poll bits. */
static short wait_fd(const char *mode, int ep, int fd, short events, int ms)
{
	if (!strcmp(mode, "poll")) {
		struct pollfd p = {.fd = fd, .events = events};

		return poll(&p, 1, ms) > 0 ? p.revents : 0;
	}
	if (!strcmp(mode, "select")) {
		fd_set r, w;
		struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
		short rev = 0;

		FD_ZERO(&r);
		FD_ZERO(&w);
		if (events & POLLIN)
			FD_SET(fd, &r);
		if (events & POLLOUT)
			FD_SET(fd, &w);
		if (select(fd + 1, &r, &w, NULL, &tv) <= 0)
			return 0;
		if (FD_ISSET(fd, &r))
			rev |= POLLIN;
		if (FD_ISSET(fd, &w))
			rev |= POLLOUT;
		return rev;
	}
	{
		/* epoll, level-triggered, re-armed with what is wanted now */
		struct epoll_event ev = {.events = (uint32_t)events, .data.fd = fd};

		if (epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev))
			return POLLERR;
		return epoll_wait(ep, &ev, 1, ms) > 0 ? (short)ev.events : 0;
	}
}

static int client(const char *host, int port, const char *mode, uint64_t bytes, size_t chunk)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)}, got;
	struct stream s = {.total = bytes, .chunk = chunk};
	bool block = !strcmp(mode, "block");
	socklen_t gl = sizeof(got);
	int fd, ep = -1, v;
	socklen_t vl = sizeof(v);

	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
		fprintf(stderr, "preload_echo: %s is not an IPv4 address\n", host);
		return 2;
	}
	s.buf = malloc(chunk);
	fd = socket(AF_INET, SOCK_STREAM | (block ? 0 : SOCK_NONBLOCK), 0);
	if (!s.buf || fd < 0)
		return 2;
	if (block) {
		CHECK(!connect(fd, (struct sockaddr *)&sa, sizeof(sa)), "blocking connect to %s:%d", host, port);
	} else {
		int r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));

		CHECK(r == 0 || errno == EINPROGRESS, "non-blocking connect: 0 or EINPROGRESS");
		if (!strcmp(mode, "epoll")) {
			struct epoll_event ev = {.events = EPOLLOUT, .data.fd = fd};

			ep = epoll_create1(EPOLL_CLOEXEC);
			CHECK(!epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev), "epoll_ctl ADD");
		}
		CHECK(wait_fd(mode, ep, fd, POLLOUT, 10000) & POLLOUT, "%s: the connecting socket becomes writable", mode);
		CHECK(!getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &vl) && v == 0, "SO_ERROR is 0 after the connect (%d)", v);
		CHECK(fcntl(fd, F_GETFL) & O_NONBLOCK, "F_GETFL shows O_NONBLOCK");
	}
	CHECK(!getpeername(fd, (struct sockaddr *)&got, &gl) && got.sin_addr.s_addr == sa.sin_addr.s_addr &&
		      got.sin_port == sa.sin_port, "getpeername names %s:%d", host, port);
	gl = sizeof(got);
	CHECK(!getsockname(fd, (struct sockaddr *)&got, &gl) && got.sin_family == AF_INET && got.sin_port,
	      "getsockname gives an IPv4 address and a port");
	v = 1;
	CHECK(!setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof(v)), "setsockopt TCP_NODELAY");
	vl = sizeof(v);
	CHECK(!getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &vl) && v == SOCK_STREAM, "getsockopt SO_TYPE is SOCK_STREAM");
	if (block) {
		/* A dup of the socket is the same connection; writev/readv in pieces; FIONREAD. */
		int d = dup(fd);
		uint8_t probe[3] = {pattern(0), pattern(1), pattern(2)};
		struct iovec iv[2] = {{probe, 1}, {probe + 1, 2}};
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int avail = 0;

		CHECK(d >= 0 && writev(d, iv, 2) == 3, "writev of 3 bytes on a dup of the socket");
		CHECK(poll(&p, 1, 10000) == 1 && (p.revents & POLLIN), "poll shows the echo readable");
		CHECK(!ioctl(fd, FIONREAD, &avail) && avail >= 1, "FIONREAD counts the echo (%d)", avail);
		{
			uint8_t back[3] = {0};
			size_t have = 0;

			while (have < 3) {
				struct iovec rv[2] = {{back + have, 1}, {back + have + 1, 2 - have}};
				ssize_t r = have < 2 ? readv(fd, rv, 2) : read(fd, back + have, 1);

				if (r <= 0)
					break;
				have += (size_t)r;
			}
			CHECK(have == 3 && !memcmp(back, probe, 3), "readv gives the 3 bytes back");
		}
		s.sent = s.got = 3;
		close(d);
		/* Blocking: a chunk out whole, its echo back whole, and so on; then EOF both ways. */
		while (s.sent < s.total) {
			size_t n = s.total - s.sent < s.chunk ? (size_t)(s.total - s.sent) : s.chunk;
			size_t have = 0;

			for (size_t i = 0; i < n; i++)
				s.buf[i] = pattern(s.sent + i);
			if (write(fd, s.buf, n) != (ssize_t)n) {
				CHECK(0, "blocking write of %zu bytes", n);
				break;
			}
			s.sent += n;
			while (have < n) {
				ssize_t r = recv(fd, s.buf + have, n - have, 0);

				if (r <= 0)
					break;
				have += (size_t)r;
			}
			for (size_t i = 0; i < have; i++)
				if (s.buf[i] != pattern(s.got + i)) {
					CHECK(0, "echo differs at byte %llu", (unsigned long long)(s.got + i));
					have = 0;
					break;
				}
			if (have < n)
				break;
			s.got += n;
		}
		CHECK(!shutdown(fd, SHUT_WR), "shutdown(SHUT_WR)");
		{
			char c;

			s.eof = read(fd, &c, 1) == 0;
		}
		CHECK(s.eof && s.got == s.total, "blocking: the echo of %llu bytes came back whole (%llu)",
		      (unsigned long long)s.total, (unsigned long long)s.got);
	} else {
		int idle = 0;

		while (!s.eof) {
			short rev = wait_fd(mode, ep, fd, want_events(&s), 1000);
			int r;

			if (!rev && ++idle > 20) {
				CHECK(0, "%s: 20 s without an event (sent %llu, got %llu)", mode,
				      (unsigned long long)s.sent, (unsigned long long)s.got);
				break;
			}
			if (rev)
				idle = 0;
			r = stream_step(fd, &s);
			if (r < 0) {
				CHECK(0, "%s: the stream failed (sent %llu, got %llu)", mode, (unsigned long long)s.sent,
				      (unsigned long long)s.got);
				break;
			}
			if (r > 0)
				break;
		}
		CHECK(s.eof && s.got == s.total, "%s: the echo of %llu bytes came back whole (%llu)", mode,
		      (unsigned long long)s.total, (unsigned long long)s.got);
	}
	CHECK(!close(fd), "close");
	if (ep >= 0)
		close(ep);
	free(s.buf);
	if (!failures)
		printf("client %s: %llu bytes echoed\n", mode, (unsigned long long)s.total);
	return failures ? 1 : 0;
}

/* ---- the benchmark's clients (plain blocking calls only, which every preload library serves) ---- */

/* A blocking TCP connection to host:port for client `who`: 0 and *fd, or the exit status (2: not an
 * IPv4 address, 1: the connect failed), said on stderr. */
static int dial(const char *who, const char *host, int port, int *fd)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};

	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
		fprintf(stderr, "preload_echo: %s: %s is not an IPv4 address\n", who, host);
		return 2;
	}
	*fd = socket(AF_INET, SOCK_STREAM, 0);
	if (*fd < 0 || connect(*fd, (struct sockaddr *)&sa, sizeof(sa))) {
		fprintf(stderr, "preload_echo: %s: connect to %s:%d: %s\n", who, host, port, strerror(errno));
		return 1;
	}
	return 0;
}

/* Writes all len bytes, then reads len bytes back; false (said on stderr) on an error or EOF. */
static bool exchange(const char *who, int fd, const uint8_t *out, uint8_t *in, size_t len)
{
	for (size_t off = 0; off < len;) {
		ssize_t w = write(fd, out + off, len - off);

		if (w <= 0) {
			fprintf(stderr, "preload_echo: %s: write: %s\n", who, w ? strerror(errno) : "0 bytes");
			return false;
		}
		off += (size_t)w;
	}
	for (size_t got = 0; got < len;) {
		ssize_t n = read(fd, in + got, len - got);

		if (n <= 0) {
			fprintf(stderr, "preload_echo: %s: read: %s\n", who, n ? strerror(errno) : "EOF");
			return false;
		}
		got += (size_t)n;
	}
	return true;
}

static double us_since(const struct timespec *t0)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (double)(t1.tv_sec - t0->tv_sec) * 1e6 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e3;
}

/* Shuts our side, reads the server out to its EOF, closes. */
static void hang_up(int fd, uint8_t *buf, size_t len)
{
	shutdown(fd, SHUT_WR);
	while (read(fd, buf, len) > 0)
		;
	close(fd);
}

static int rtt(const char *host, int port, long count, size_t size)
{
	uint8_t *buf = calloc(1, size ? size : 1);
	struct timespec t0;
	int fd, one = 1, ret;

	if (!buf || count < 1 || !size) {
		fprintf(stderr, "preload_echo: rtt: bad arguments\n");
		free(buf);
		return 2;
	}
	if ((ret = dial("rtt", host, port, &fd))) {
		free(buf);
		return ret;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < count; i++) {
		if (!exchange("rtt", fd, buf, buf, size)) {
			free(buf);
			return 1;
		}
	}
	printf("rtt_us %.1f\n", us_since(&t0) / (double)count);
	hang_up(fd, buf, size);
	free(buf);
	return 0;
}

static int bulk(const char *host, int port, uint64_t bytes)
{
	static uint8_t out[1 << 16], in[1 << 16];
	struct timespec t0;
	uint64_t sent = 0;
	int fd, ret;

	if (!bytes) {
		fprintf(stderr, "preload_echo: bulk: bad arguments\n");
		return 2;
	}
	if ((ret = dial("bulk", host, port, &fd)))
		return ret;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (sent < bytes) {
		size_t len = bytes - sent < sizeof(out) ? (size_t)(bytes - sent) : sizeof(out);

		for (size_t i = 0; i < len; i++)
			out[i] = pattern(sent + i);
		if (!exchange("bulk", fd, out, in, len))
			return 1;
		if (memcmp(in, out, len)) {
			fprintf(stderr, "preload_echo: bulk: the echo differs near byte %llu\n", (unsigned long long)sent);
			return 1;
		}
		sent += len;
	}
	printf("bulk_mb_s %.1f\n", 2.0 * (double)bytes / us_since(&t0));
	hang_up(fd, in, sizeof(in));
	return 0;
}

struct duplex {
	int fd;
	uint64_t bytes;
	uint64_t moved; /* written (writer) or read and checked (reader) */
	const char *err;
};

static void *duplex_writer(void *arg)
{
	struct duplex *d = arg;
	static uint8_t buf[100000];

	while (d->moved < d->bytes) {
		size_t n = 1 + (size_t)((d->moved * 2654435761u) % sizeof(buf));

		if (n > d->bytes - d->moved)
			n = (size_t)(d->bytes - d->moved);
		for (size_t i = 0; i < n; i++)
			buf[i] = pattern(d->moved + i);
		for (size_t off = 0; off < n;) {
			ssize_t w = write(d->fd, buf + off, n - off);

			if (w <= 0) {
				d->err = "write";
				return NULL;
			}
			off += (size_t)w;
		}
		d->moved += n;
	}
	if (shutdown(d->fd, SHUT_WR))
		d->err = "shutdown";
	return NULL;
}

static int duplex(const char *host, int port, uint64_t bytes)
{
	struct duplex w = {.bytes = bytes}, r = {.bytes = bytes};
	static uint8_t buf[7000];
	pthread_t t;
	ssize_t n;
	int ret = dial("duplex", host, port, &w.fd);

	if (ret)
		return ret;
	r.fd = w.fd;
	if ((errno = pthread_create(&t, NULL, duplex_writer, &w))) {
		perror("preload_echo: duplex: pthread_create");
		return 2;
	}
	while ((n = read(r.fd, buf, sizeof(buf))) > 0 && !r.err) {
		for (ssize_t i = 0; i < n; i++)
			if (buf[i] != pattern(r.moved + (uint64_t)i))
				r.err = "the echo differs from what was written";
		r.moved += (uint64_t)n;
	}
	if (n < 0)
		r.err = "read";
	pthread_join(t, NULL);
	CHECK(!w.err, "duplex writer: %s after %llu of %llu bytes", w.err ? w.err : "", (unsigned long long)w.moved,
	      (unsigned long long)bytes);
	CHECK(!r.err && r.moved == bytes, "duplex reader: %s, %llu of %llu bytes echoed before EOF", r.err ? r.err : "EOF",
	      (unsigned long long)r.moved, (unsigned long long)bytes);
	close(w.fd);
	if (!failures)
		printf("duplex: %llu bytes written and read back at once on one socket\n", (unsigned long long)bytes);
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "duplex"))
		return duplex(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 10));
	if (argc == 5 && !strcmp(argv[1], "bulk"))
		return bulk(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 10));
	if (argc == 6 && !strcmp(argv[1], "rtt"))
		return rtt(argv[2], atoi(argv[3]), atol(argv[4]), strtoul(argv[5], NULL, 10));
	if (argc == 4 && !strcmp(argv[1], "server"))
		return server(atoi(argv[2]), atoi(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "bserver"))
		return bserver(atoi(argv[2]), atoi(argv[3]));
	if ((argc == 6 || argc == 7) && !strcmp(argv[1], "client"))
		return client(argv[2], atoi(argv[3]), argv[4], strtoull(argv[5], NULL, 10),
			      argc == 7 ? strtoul(argv[6], NULL, 10) : 65536);
	fprintf(stderr, "usage: preload_echo server|bserver PORT COUNT | client HOST PORT block|epoll|poll|select BYTES [CHUNK]\n"
			"       preload_echo rtt HOST PORT COUNT SIZE | bulk HOST PORT BYTES | duplex HOST PORT BYTES\n");
	return 2;
}
