/*
 * The application's own sending half over meshd's tcp provider (proto/ring.h MESH_AQ_PATH_TCP):
 * a TCP connection of our own to the peer application stands where aq_verbs.c's RC QP stands, so a
 * message goes from one application's send() to the other's recv() with no meshd between them
 * (on the host a hop through meshd is a scheduler switch among four processes: design.md).
 *
 * We listen on our node's address on the channel's rail (any port) and publish the port and a
 * random token; meshd relays them over its authenticated link as it relays a QP. One connection
 * carries both halves, as a TCP program's one socket does: each message's answer then carries the
 * acknowledgement of the message, where a connection per direction costs a pure ACK segment per
 * message (measured on the loopback: 3.7 against 2.7 us per half round trip). The application
 * whose token is the greater connects, from its address to the peer's port, and opens with
 * MESH_AQ_TCP_MAGIC and the peer's token; the other accepts the connection that says its token.
 * Each says READY once it has the connection. Once meshd grants our half we send the grant's
 * position (8 bytes, little endian) and then the stream's bytes from there as they are published.
 * The peer's half is read straight into our RX area at each byte's offset, within our reader's
 * window: bytes below rx_cons are dropped (a resumed stream wrote them already), none goes beyond
 * rx_cons + ring (we stop reading; TCP holds the sender back). How far it read is published in
 * rx_seen, which meshd takes as it takes the immediates of aq_verbs.c.
 *
 * A stranger on the port gets AQT_PENDING slots at most and is closed as soon as it says anything
 * but the token; once the peer's connection is in, the listener goes. A connection that fails is a
 * QP that failed: we say IDLE and meshd sends from what the peer's reader has; so does a
 * revocation (its link or rail went), after which our direction is shut (shutdown SHUT_WR): what
 * TCP still delivers are the same bytes at the same offsets as meshd's resumed writes. The peer's
 * direction is read until its end.
 */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "aq_int.h"

#define AQT_PENDING 4 /* accepted connections that have not said the token yet */
#define AQT_HELLO_LEN (4 + MESH_AQ_TOKEN_LEN)
#define AQT_START_LEN 8
#define AQT_DROP_MAX (64u << 10) /* bytes below our reader dropped per call */

struct aqt_pend {
	int fd;
	uint32_t have;
	uint8_t buf[AQT_HELLO_LEN];
};

struct aq_tcp {
	int ep;  /* epoll over everything below that may need us: the fd the channel's waits watch */
	int lfd; /* listening until the peer's connection said the token */
	struct aqt_pend pend[AQT_PENDING];
	uint32_t pend_next; /* the slot a newcomer takes when all are busy: the oldest, in turn */
	uint8_t token[MESH_AQ_TOKEN_LEN];
	/* the connection, both halves */
	int fd;
	bool in_ep;      /* fd is in ep */
	uint32_t watch;  /* for these events */
	bool connecting; /* ours, connect in progress */
	bool wr_shut;    /* our direction is shut: our half went back to meshd */
	bool rd_done;    /* the peer's direction ended (or broke) */
	bool peer_known; /* the peer's port and token were looked at: we connected, or wait for it */
	/* the peer's half into our RX area */
	uint32_t rstart_have; /* bytes of its start position read */
	uint8_t rstart[AQT_START_LEN];
	uint64_t rpos; /* stream position of the next byte it sends */
	/* ours: what is still to go before the stream's bytes (the hello if we connected, the start) */
	uint32_t hdr_len, hdr_off;
	uint8_t hdr[AQT_HELLO_LEN + AQT_START_LEN];
};

static int aqt_watch(struct aq_tcp *t, int fd, int op, uint32_t events)
{
	struct epoll_event ev = {.events = events, .data.fd = fd};

	return epoll_ctl(t->ep, op, fd, &ev) ? -errno : 0;
}

static void aqt_close_fd(struct aq_tcp *t, int *fd)
{
	if (*fd < 0)
		return;
	epoll_ctl(t->ep, EPOLL_CTL_DEL, *fd, NULL); /* also gone with the close, unless a child shares it */
	close(*fd);
	*fd = -1;
}

/* Our address on the rail (port 0: any) or the peer's, from the page meshd wrote. */
static int aqt_addr(const struct mesh_ring_aq *a, const uint8_t addr[16], uint16_t port,
		    struct sockaddr_storage *ss, socklen_t *len)
{
	memset(ss, 0, sizeof(*ss));
	if (a->tcp_family == AF_INET) {
		struct sockaddr_in *s4 = (struct sockaddr_in *)ss;

		s4->sin_family = AF_INET;
		s4->sin_port = htons(port);
		memcpy(&s4->sin_addr, addr, 4);
		*len = sizeof(*s4);
		return 0;
	}
	if (a->tcp_family == AF_INET6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;

		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons(port);
		memcpy(&s6->sin6_addr, addr, 16);
		*len = sizeof(*s6);
		return 0;
	}
	return -EAFNOSUPPORT;
}

/* The program's own descriptors come first: ours (two per channel, where a QP of our own costs
 * one) stop at three quarters of RLIMIT_NOFILE, and meshd sends for channels beyond. Descriptors
 * are numbered lowest first, so fd's number is about how many are open. */
static int aqt_fd_check(int fd)
{
	struct rlimit rl;

	if (fd < 0 || getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY ||
	    (rlim_t)fd < rl.rlim_cur - rl.rlim_cur / 4)
		return fd;
	close(fd);
	return -EMFILE;
}

static int aqt_socket(int family)
{
	int one = 1;
	int fd = aqt_fd_check(socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));

	if (fd < 0)
		return fd == -1 ? -errno : fd;
	/* A message is one segment at once, as meshd's own connections send it. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

static int aqt_listen(mesh_channel_t *c, struct lib_aq *q)
{
	struct mesh_ring_aq *a = mesh_ring_aq(c->ctrl);
	struct aq_tcp *t;
	struct sockaddr_storage ss;
	socklen_t len;
	int ret;

	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->ep = t->lfd = t->fd = -1;
	for (int i = 0; i < AQT_PENDING; i++)
		t->pend[i].fd = -1;
	q->tcp = t;
	ret = aqt_addr(a, a->tcp_local, 0, &ss, &len);
	if (ret)
		return ret;
	if (getrandom(t->token, sizeof(t->token), 0) != sizeof(t->token))
		return -EIO; /* a guessable token would let a stranger in: no offer */
	t->ep = epoll_create1(EPOLL_CLOEXEC);
	if (t->ep < 0)
		return -errno;
	t->ep = aqt_fd_check(t->ep);
	if (t->ep < 0)
		return t->ep;
	t->lfd = aqt_socket(ss.ss_family);
	if (t->lfd < 0)
		return t->lfd;
	if (bind(t->lfd, (struct sockaddr *)&ss, len) || listen(t->lfd, AQT_PENDING))
		return -errno;
	len = sizeof(ss);
	if (getsockname(t->lfd, (struct sockaddr *)&ss, &len))
		return -errno;
	ret = aqt_watch(t, t->lfd, EPOLL_CTL_ADD, EPOLLIN);
	if (ret)
		return ret;
	a->tcp_port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
						   : ((struct sockaddr_in6 *)&ss)->sin6_port);
	memcpy(a->tcp_token, t->token, sizeof(t->token));
	a->caps = MESH_AQ_CAP_TAKE;
	aq_say(c, MESH_AQ_OFFER);
	return 0;
}

static void aqt_destroy(struct lib_aq *q)
{
	struct aq_tcp *t = q->tcp;

	if (!t)
		return;
	for (int i = 0; i < AQT_PENDING; i++)
		if (t->pend[i].fd >= 0)
			close(t->pend[i].fd);
	if (t->lfd >= 0)
		close(t->lfd);
	if (t->fd >= 0)
		close(t->fd);
	if (t->ep >= 0)
		close(t->ep);
	free(t);
	q->tcp = NULL;
}

/* Listening for the peer's connection, offered to meshd with our port and token. */
static int aqt_open(mesh_channel_t *c, struct lib_aq *q)
{
	int ret = aqt_listen(c, q);

	if (ret)
		lib_debug("channel %u: cannot listen for the peer's own connection (%s): meshd sends our bytes",
			  c->info.channel_id, strerror(-ret));
	return ret;
}

static int aqt_fd(const struct lib_aq *q)
{
	return q->tcp->ep;
}

/* ---- the peer's connection ---- */

static bool aqt_token_ok(const struct aq_tcp *t, const uint8_t *hello)
{
	uint8_t diff = 0;
	uint32_t magic;

	memcpy(&magic, hello, 4);
	for (int i = 0; i < MESH_AQ_TOKEN_LEN; i++)
		diff |= hello[4 + i] ^ t->token[i];
	return ntohl(magic) == MESH_AQ_TCP_MAGIC && !diff;
}

/* Takes what waits on the listener (a stranger's connections push out the oldest unproven one),
 * and reads the hellos: the one with our token becomes the peer's connection. */
static void aqt_accept(mesh_channel_t *c)
{
	struct aq_tcp *t = c->aq->tcp;

	for (int n = 0; n < AQT_PENDING && t->lfd >= 0; n++) {
		int fd = accept4(t->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct aqt_pend *p = NULL;

		if (fd < 0)
			break;
		for (int i = 0; i < AQT_PENDING && !p; i++)
			if (t->pend[i].fd < 0)
				p = &t->pend[i];
		if (!p)
			p = &t->pend[t->pend_next++ % AQT_PENDING];
		if (aqt_fd_check(fd) < 0) {
			/* The peer's sender fails on it and gives its half back to its meshd. */
			lib_debug("channel %u: a connection to our port refused: descriptors short", c->info.channel_id);
			continue;
		}
		if (p->fd >= 0) {
			lib_debug("channel %u: more connections than the peer's on our port: one unproven closed",
				  c->info.channel_id);
			aqt_close_fd(t, &p->fd);
		}
		p->fd = fd;
		p->have = 0;
		if (aqt_watch(t, fd, EPOLL_CTL_ADD, EPOLLIN))
			aqt_close_fd(t, &p->fd);
	}
	for (int i = 0; i < AQT_PENDING && t->fd < 0; i++) {
		struct aqt_pend *p = &t->pend[i];
		ssize_t r;

		if (p->fd < 0)
			continue;
		r = recv(p->fd, p->buf + p->have, AQT_HELLO_LEN - p->have, MSG_DONTWAIT);
		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (r > 0)
			p->have += (uint32_t)r;
		if (r <= 0 || (p->have == AQT_HELLO_LEN && !aqt_token_ok(t, p->buf))) {
			if (r != 0 || p->have)
				lib_debug("channel %u: a connection to our port did not say our token: closed",
					  c->info.channel_id);
			aqt_close_fd(t, &p->fd);
			continue;
		}
		if (p->have < AQT_HELLO_LEN)
			continue;
		t->fd = p->fd;
		t->in_ep = true; /* as a pending one */
		t->watch = EPOLLIN;
		p->fd = -1;
		/* The peer is in: nobody else may try. */
		aqt_close_fd(t, &t->lfd);
		for (int j = 0; j < AQT_PENDING; j++)
			aqt_close_fd(t, &t->pend[j].fd);
	}
}

/* The connection goes once neither half needs it. */
static void aqt_maybe_close(struct aq_tcp *t)
{
	if (t->rd_done && t->wr_shut) {
		aqt_close_fd(t, &t->fd);
		t->in_ep = false;
		t->watch = 0;
	}
}

static void aqt_rx_done(mesh_channel_t *c, const char *why)
{
	struct aq_tcp *t = c->aq->tcp;

	if (why)
		lib_debug("channel %u: the peer's half on our own connection: %s", c->info.channel_id, why);
	t->rd_done = true;
	if (why)
		c->aq->failed = true; /* broken, not ended: our direction is gone with it */
	aqt_maybe_close(t);
}

/* Reads the peer's bytes into our RX area, within our reader's window. */
static void aqt_read(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;
	struct aq_tcp *t = q->tcp;

	if (t->fd < 0 || t->connecting)
		return;
	while (!t->rd_done && t->rstart_have < AQT_START_LEN) {
		ssize_t r = recv(t->fd, t->rstart + t->rstart_have, AQT_START_LEN - t->rstart_have, MSG_DONTWAIT);

		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (r <= 0) {
			aqt_rx_done(c, r ? strerror(errno) : NULL);
			return;
		}
		t->rstart_have += (uint32_t)r;
		if (t->rstart_have == AQT_START_LEN) {
			uint64_t v;

			memcpy(&v, t->rstart, sizeof(v));
			t->rpos = le64toh(v);
			if (t->rpos > c->rx_cons + c->size) {
				aqt_rx_done(c, "it starts beyond our reader's window");
				return;
			}
		}
	}
	while (!t->rd_done) {
		uint64_t pos = t->rpos, room, off, len;
		ssize_t r;

		if (pos < c->rx_cons) {
			/* Bytes our reader has had (a resume sent them again meanwhile): dropped. */
			uint64_t drop = c->rx_cons - pos;

			r = recv(t->fd, NULL, drop < AQT_DROP_MAX ? drop : AQT_DROP_MAX, MSG_DONTWAIT | MSG_TRUNC);
			if (r > 0) {
				t->rpos += (uint64_t)r;
				continue;
			}
		} else {
			room = c->rx_cons + c->size - pos;
			if (!room)
				return; /* our reader makes room; TCP holds the peer back meanwhile */
			/* Up to the ring's end, by recv: a reader that polls pays for every look, and
			 * readv's vector (copied in, checked) costed a third of what recv does. */
			off = pos & (c->size - 1);
			len = c->size - off < room ? c->size - off : room;
			r = recv(t->fd, c->rx + off, len, MSG_DONTWAIT);
			if (r > 0) {
				t->rpos += (uint64_t)r;
				if (t->rpos > q->rx_seen) {
					q->rx_seen = t->rpos;
					atomic_store_explicit(&mesh_ring_aq(c->ctrl)->rx_seen, q->rx_seen,
							      memory_order_release);
				}
				if ((uint64_t)r < len)
					return; /* drained */
				continue;
			}
		}
		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		aqt_rx_done(c, r ? strerror(errno) : NULL);
	}
}

/* ---- our connection ---- */

static void aqt_fail(mesh_channel_t *c, const char *what, int err)
{
	struct lib_aq *q = c->aq;

	lib_debug("channel %u: our own connection: %s: %s; meshd sends our bytes", c->info.channel_id, what,
		  strerror(err));
	q->failed = true;
}

/* The peer's port and token are in our page. The greater token connects (from our address to the
 * peer's port); the other side waits for that connection on its port. */
static void aqt_connect(mesh_channel_t *c)
{
	struct mesh_ring_aq *a = mesh_ring_aq(c->ctrl);
	struct lib_aq *q = c->aq;
	struct aq_tcp *t = q->tcp;
	struct sockaddr_storage src, dst;
	socklen_t slen, dlen;
	uint32_t port = a->peer_tcp_port, magic = htonl(MESH_AQ_TCP_MAGIC);
	uint8_t any = 0;
	int cmp, fd;

	for (int i = 0; i < MESH_AQ_TOKEN_LEN; i++)
		any |= a->peer_tcp_token[i];
	cmp = memcmp(t->token, a->peer_tcp_token, MESH_AQ_TOKEN_LEN);
	if (!port || port > 65535 || !any || !cmp) {
		lib_debug("channel %u: meshd's peer port %u or token is not valid", c->info.channel_id, port);
		q->failed = true;
		return;
	}
	t->peer_known = true;
	if (cmp < 0)
		return; /* the peer connects */
	aqt_close_fd(t, &t->lfd); /* nobody is to connect to us: strangers are refused from now */
	for (int j = 0; j < AQT_PENDING; j++)
		aqt_close_fd(t, &t->pend[j].fd);
	if (aqt_addr(a, a->tcp_local, 0, &src, &slen) || aqt_addr(a, a->tcp_peer, (uint16_t)port, &dst, &dlen)) {
		aqt_fail(c, "address", EAFNOSUPPORT);
		return;
	}
	fd = aqt_socket(dst.ss_family);
	if (fd < 0) {
		aqt_fail(c, "socket", -fd);
		return;
	}
	t->fd = fd;
	if (bind(fd, (struct sockaddr *)&src, slen)) {
		aqt_fail(c, "bind", errno);
		return;
	}
	if (connect(fd, (struct sockaddr *)&dst, dlen) && errno != EINPROGRESS) {
		aqt_fail(c, "connect", errno);
		return;
	}
	t->connecting = true;
	memcpy(t->hdr, &magic, 4);
	memcpy(t->hdr + 4, a->peer_tcp_token, MESH_AQ_TOKEN_LEN);
	t->hdr_len = AQT_HELLO_LEN;
	t->hdr_off = 0;
}

static void aqt_connecting(mesh_channel_t *c)
{
	struct aq_tcp *t = c->aq->tcp;
	struct pollfd p = {.fd = t->fd, .events = POLLOUT};
	int err = 0;
	socklen_t len = sizeof(err);

	if (poll(&p, 1, 0) <= 0)
		return;
	if (getsockopt(t->fd, SOL_SOCKET, SO_ERROR, &err, &len) || err) {
		aqt_fail(c, "connect", err ? err : errno);
		return;
	}
	t->connecting = false;
}

/* Sends what is due: the header's rest, then (granted) the published bytes from posted. */
static void aqt_flush(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;
	struct aq_tcp *t = q->tcp;

	while (t->fd >= 0 && !t->connecting && !t->wr_shut && !q->failed) {
		struct iovec iov[3];
		struct msghdr mh = {.msg_iov = iov};
		uint64_t pos = q->posted, left = q->owned ? c->tx_prod - pos : 0;
		ssize_t r;

		if (t->hdr_off < t->hdr_len)
			iov[mh.msg_iovlen++] =
				(struct iovec){.iov_base = t->hdr + t->hdr_off, .iov_len = t->hdr_len - t->hdr_off};
		if (left) {
			uint64_t off = pos & (c->size - 1), first = mesh_ring_contig(pos, c->size);

			if (first > left)
				first = left;
			iov[mh.msg_iovlen++] = (struct iovec){.iov_base = c->tx + off, .iov_len = first};
			if (first < left)
				iov[mh.msg_iovlen++] = (struct iovec){.iov_base = c->tx, .iov_len = left - first};
			/* Published first: the peer may read and credit the bytes before send() returns,
			 * and meshd credits only what it knows was published. */
			tx_show(c, c->tx_prod);
		}
		if (!mh.msg_iovlen)
			return;
		r = mh.msg_iovlen == 1 ? send(t->fd, iov[0].iov_base, iov[0].iov_len, MSG_DONTWAIT | MSG_NOSIGNAL)
				       : sendmsg(t->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				aqt_fail(c, "send", errno);
			return; /* full: the wait watches it for room (aqt_wait_fd) */
		}
		if (t->hdr_off < t->hdr_len) {
			uint32_t h = t->hdr_len - t->hdr_off;

			if ((uint64_t)r < h) {
				t->hdr_off += (uint32_t)r;
				continue;
			}
			t->hdr_off = t->hdr_len;
			r -= h;
		}
		q->posted += (uint64_t)r;
	}
}

/* The ep's interest in the connection, as what we wait for changed: the peer's bytes while our
 * ring has room for them, room on the connection while something of ours waits to go.
 * Level-triggered: what is watched stays readable until it is taken, so nothing is watched that
 * we would not take. */
static void aqt_interest(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;
	struct aq_tcp *t = q->tcp;
	uint32_t w = 0;

	if (t->fd < 0)
		return;
	if (!t->connecting && !t->rd_done && (t->rstart_have < AQT_START_LEN || t->rpos < c->rx_cons + c->size))
		w |= EPOLLIN;
	if (!t->wr_shut && !q->failed &&
	    (t->connecting || t->hdr_off < t->hdr_len || (q->owned && q->posted < c->tx_prod)))
		w |= EPOLLOUT;
	if ((w != t->watch || !t->in_ep) && !aqt_watch(t, t->fd, t->in_ep ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, w)) {
		t->in_ep = true;
		t->watch = w;
	}
}

/* Our half goes back to meshd: nothing more of ours is sent (our direction is shut), while the
 * peer's direction is read until its end. A connection that broke or never came goes at once. */
static void aqt_stop(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;
	struct aq_tcp *t = q->tcp;

	q->owned = false;
	q->failed = true;
	q->connected = false;
	if (t->wr_shut)
		return;
	t->wr_shut = true;
	/* No connection of the peer's is wanted any more: its half goes back to its meshd too. */
	aqt_close_fd(t, &t->lfd);
	for (int i = 0; i < AQT_PENDING; i++)
		aqt_close_fd(t, &t->pend[i].fd);
	if (t->fd >= 0 && !t->connecting && !t->rd_done && t->hdr_off == t->hdr_len &&
	    !shutdown(t->fd, SHUT_WR)) {
		aqt_maybe_close(t);
		return;
	}
	t->rd_done = true; /* a connection half made is no use to the peer's half either */
	aqt_maybe_close(t);
}

/* look_in: also take the peer's bytes (not for a send step: aq_progress_send). */
static void aqt_progress(mesh_channel_t *c, bool look_in)
{
	struct mesh_ring_aq *a = mesh_ring_aq(c->ctrl);
	struct lib_aq *q = c->aq;
	struct aq_tcp *t = q->tcp;
	uint64_t from;
	uint32_t v;

	if (!aq_mine(q)) {
		/* A forked child: the connection is its parent's (a shutdown would end the parent's
		 * halves). It hands the half back (its parent, if it still sends, is revoked with it) and
		 * reads nothing of the parent's. */
		if (q->state != MESH_AQ_IDLE) {
			q->failed = true;
			aq_give_back(c);
		}
		return;
	}
	/* Also once our half is meshd's: the peer's bytes may still come until it hears. The peer's
	 * connection is taken by a send step too, so that a program that only sends does not keep
	 * its port open (that costs calls only until the peer is in). */
	aqt_accept(c);
	if (look_in)
		aqt_read(c);
	if (q->state == MESH_AQ_IDLE) {
		aqt_interest(c);
		return;
	}
	if (q->state == MESH_AQ_OFFER && t->fd < 0 && !t->peer_known && !q->failed &&
	    atomic_load_explicit(&a->peer_state, memory_order_acquire) >= MESH_AQ_PEER_INFO)
		aqt_connect(c);
	if (t->connecting && !q->failed)
		aqt_connecting(c);
	if (aq_grant_take(c, &v, &from)) {
		uint64_t le = htole64(from);

		memcpy(t->hdr + t->hdr_len, &le, sizeof(le));
		t->hdr_len += AQT_START_LEN;
		lib_debug("channel %u: we send our bytes from %" PRIu64 " on our own connection (round %u)",
			  c->info.channel_id, from, q->round);
	} else if (v == MESH_AQ_REVOKED && !q->failed) {
		aqt_stop(c);
	}
	aqt_flush(c);
	if (q->state == MESH_AQ_OFFER && !q->failed && t->fd >= 0 && !t->connecting && t->hdr_off == t->hdr_len) {
		q->connected = true;
		aq_say(c, MESH_AQ_READY);
	}
	if (q->failed) {
		aqt_stop(c);
		aq_give_back(c);
	}
	aqt_interest(c);
}

static void aqt_step(mesh_channel_t *c)
{
	aqt_progress(c, true);
}

static int aqt_send_step(mesh_channel_t *c)
{
	aqt_progress(c, false);
	return 0;
}

static int aqt_wait_fd(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;

	if (!aq_mine(q))
		return -1;
	/* What came is taken first (a send step does not look): the sleep then watches the peer's
	 * half only while our ring has room, and never wakes for bytes it already could take. */
	aqt_accept(c);
	aqt_read(c);
	aqt_interest(c);
	return q->tcp->ep;
}

/* A TCP connection's readiness is its own: no events to take, as a completion channel has. */
static void aqt_event(mesh_channel_t *c)
{
	(void)c;
}

static void aqt_release(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;
	struct aq_tcp *t = q->tcp;
	uint64_t until = aq_now_ms() + AQ_RELEASE_MS;

	if (q->state == MESH_AQ_IDLE || !aq_mine(q))
		return;
	/* A clean shutdown: the rest sent, within a bound (a peer that reads nothing holds it back),
	 * then the half is meshd's, which sends the EOF after whatever the peer's reader lacks. */
	aqt_flush(c);
	while (q->owned && !q->failed && t->fd >= 0 && q->posted != c->tx_prod) {
		uint64_t now = aq_now_ms();
		struct pollfd p = {.fd = t->fd, .events = POLLOUT};

		if (now >= until)
			break;
		if (poll(&p, 1, (int)(until - now)) < 0 && errno != EINTR)
			break;
		aqt_flush(c);
	}
	aqt_stop(c);
	aq_give_back(c);
}

const struct aq_ops aq_tcp_ops = {
	.name = "tcp",
	.look_is_syscall = true,
	.open = aqt_open,
	.destroy = aqt_destroy,
	.progress = aqt_step,
	.progress_send = aqt_send_step,
	.fd = aqt_fd,
	.wait_fd = aqt_wait_fd,
	.event = aqt_event,
	.release = aqt_release,
};
