/*
 * libmesh against a fake meshd that lives in the test process.
 *
 * The fake listens on a temporary unix SOCK_SEQPACKET socket. A thread answers one LISTEN or
 * CONNECT per fake_serve() with a CtlReply (optionally flawed: see enum fake_flaw) and, for a
 * channel, the four descriptors it made itself: a memfd with a valid control page, one end of a
 * socketpair as the lifeline, and two eventfds. The test then plays meshd on the ring through the
 * fake's own mapping: it moves tx_cons and rx_prod, writes bytes into RX, sets the state, writes
 * the wake eventfd when MESH_APP_WAITING is set, writes hostile indices, or closes the lifeline.
 * With `loopback` the same thread stays on as a daemon that copies every TX byte into RX and turns
 * MESH_APP_SHUT_WR into MESH_STATE_PEER_EOF.
 *
 * The tools (meshcat, meshecho) run as child processes against the same fake.
 *
 * Nothing outside the library's mapping may be touched: the data-path checks run under ASan and
 * valgrind too, and every failure path counts /proc/self/fd before and after.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "ring.h"
#include "unit_main.h"
#include "wire.h"

#define SMALL_RING 4096u
#define TEST_ALARM_S 120 /* a hang fails the case instead of stalling ctest */
#define PEER_NODE 3u
#define PEER_PORT 4242u
#define LOCAL_PORT 7000u
#define FAKE_CHANS 4

enum fake_flaw {
	FLAW_NONE,
	FLAW_MEMFD_SHORT,      /* the memfd is a page smaller than setup.memfd_size */
	FLAW_SETUP_MEMFD_SIZE, /* memfd_size (and the memfd) one page larger than 4096 + 2 * ring_size */
	FLAW_SETUP_RING_SIZE,  /* ring_size not a power of two */
	FLAW_BAD_MAGIC,
	FLAW_BAD_VERSION,
	FLAW_BAD_RX_OFF,     /* RX overlapping TX */
	FLAW_CTRL_RING_SIZE, /* the control page disagrees with the setup */
	FLAW_BAD_INDICES,    /* tx_cons ahead of tx_prod from the start */
	FLAW_KICK_PIPE,      /* the kick "eventfd" is a pipe */
	FLAW_LIFELINE_FILE,  /* the lifeline is not a socket */
	FLAW_UNSEALED,       /* the memfd can still shrink under the application's mapping */
	FLAW_THREE_FDS,
	FLAW_TWENTY_FDS, /* more than a reply's control buffer holds: MSG_CTRUNC */
	FLAW_NO_SETUP,   /* status 0 and four fds, but no setup */
	FLAW_FDS_WITH_STATUS,
	FLAW_GARBAGE,  /* undecodable reply, four fds with it */
	FLAW_NO_REPLY, /* reads the request, never answers */
	FLAW_HANGUP,   /* reads the request, closes the connection */
};

struct fake_chan {
	struct mesh_ring_ctrl *ctrl;
	uint8_t *tx, *rx;
	void *map;
	size_t map_len;
	uint64_t size;
	int lifeline; /* meshd's end; -1 once closed */
	int kick, wake;
};

struct fake {
	char dir[64];
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int lfd;
	int conn; /* the last accepted control connection, kept open */
	pthread_t thr;
	bool thr_started;
	int stopfd; /* ends the loopback daemon */
	/* how to answer */
	int status;
	enum fake_flaw flaw;
	uint32_t spin_us; /* the control page's spin hint */
	bool loopback;
	uint32_t channel_id;
	const char *error_text;
	bool name_node;   /* fill the reply's node, as meshd does */
	uint32_t node_id; /* its id then */
	/* what the client asked */
	bool got_req;
	CtlRequest req;
	int thr_err; /* line of a failure inside the thread */
	struct fake_chan ch[FAKE_CHANS];
	int nch;
	mesh_session_t *s;
};

/* ---- helpers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint8_t rng8(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (uint8_t)((rng_state * 2685821657736338717ull) >> 56);
}

static void fill_random(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = rng8();
}

static int fd_count(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* Reads (and so clears) an eventfd: its counter, 0 when it was not set. */
static uint64_t efd_take(int fd)
{
	uint64_t v = 0;

	if (read(fd, &v, sizeof(v)) != sizeof(v))
		return 0;
	return v;
}

static void efd_signal(int fd)
{
	uint64_t one = 1;

	if (write(fd, &one, sizeof(one)) != sizeof(one))
		abort();
}

static bool fd_readable(int fd, int timeout_ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};

	return poll(&p, 1, timeout_ms) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
}

static bool fd_hung_up(int fd, int timeout_ms)
{
	struct pollfd p = {.fd = fd, .events = 0};

	return poll(&p, 1, timeout_ms) > 0 && (p.revents & POLLHUP);
}

/* ---- meshd's side of a ring ---- */

static void fake_chan_close(struct fake_chan *ch)
{
	if (ch->map)
		munmap(ch->map, ch->map_len);
	ch->map = NULL;
	if (ch->lifeline >= 0)
		close(ch->lifeline);
	if (ch->kick >= 0)
		close(ch->kick);
	if (ch->wake >= 0)
		close(ch->wake);
	ch->lifeline = ch->kick = ch->wake = -1;
}

static void ring_wake(struct fake_chan *ch)
{
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&ch->ctrl->app_flags, memory_order_seq_cst) & MESH_APP_WAITING)
		efd_signal(ch->wake);
}

/* Copies between a flat buffer and the ring area at stream position pos, wrapping. */
static void ring_copy(uint8_t *area, uint64_t size, uint64_t pos, uint8_t *buf, size_t len, bool to_ring)
{
	while (len) {
		uint64_t off = pos & (size - 1);
		size_t n = len < size - off ? len : (size_t)(size - off);

		if (to_ring)
			memcpy(area + off, buf, n);
		else
			memcpy(buf, area + off, n);
		pos += n;
		buf += n;
		len -= n;
	}
}

/* RX room as meshd sees it. */
static uint64_t ring_rx_room(struct fake_chan *ch)
{
	uint64_t rx_cons = atomic_load_explicit(&ch->ctrl->rx_cons, memory_order_acquire);

	return ch->size - (atomic_load_explicit(&ch->ctrl->rx_prod, memory_order_relaxed) - rx_cons);
}

/* "Arrives" len bytes in RX (the caller checked the room), then wakes a waiter. */
static void ring_rx_put(struct fake_chan *ch, const void *data, size_t len)
{
	uint64_t rx_prod = atomic_load_explicit(&ch->ctrl->rx_prod, memory_order_relaxed);

	ring_copy(ch->rx, ch->size, rx_prod, (uint8_t *)data, len, true);
	atomic_store_explicit(&ch->ctrl->rx_prod, rx_prod + len, memory_order_release);
	ring_wake(ch);
}

/* Bytes the application published and meshd has not taken. */
static uint64_t ring_tx_pending(struct fake_chan *ch)
{
	return atomic_load_explicit(&ch->ctrl->tx_prod, memory_order_acquire) -
	       atomic_load_explicit(&ch->ctrl->tx_cons, memory_order_relaxed);
}

/* "Sends" len published TX bytes (copied to out unless NULL), then wakes a waiter. */
static void ring_tx_take(struct fake_chan *ch, void *out, size_t len)
{
	uint64_t tx_cons = atomic_load_explicit(&ch->ctrl->tx_cons, memory_order_relaxed);

	if (out)
		ring_copy(ch->tx, ch->size, tx_cons, out, len, false);
	atomic_store_explicit(&ch->ctrl->tx_cons, tx_cons + len, memory_order_release);
	ring_wake(ch);
}

static void ring_set_state(struct fake_chan *ch, uint32_t bits, int32_t error)
{
	atomic_store_explicit(&ch->ctrl->error, error, memory_order_relaxed);
	atomic_fetch_or_explicit(&ch->ctrl->state, bits, memory_order_release);
	ring_wake(ch);
}

static uint32_t ring_app_flags(struct fake_chan *ch)
{
	return atomic_load_explicit(&ch->ctrl->app_flags, memory_order_acquire);
}

/* The loopback daemon's step: TX bytes into RX as far as RX has room; SHUT_WR with TX drained
 * becomes PEER_EOF. */
static void ring_loop_pump(struct fake_chan *ch)
{
	struct mesh_ring_ctrl *k = ch->ctrl;
	uint64_t tx_cons = atomic_load_explicit(&k->tx_cons, memory_order_relaxed);
	uint64_t rx_prod = atomic_load_explicit(&k->rx_prod, memory_order_relaxed);
	uint64_t n = ring_tx_pending(ch), room = ring_rx_room(ch), done = 0;
	uint8_t buf[1024];

	if (n > room)
		n = room;
	while (done < n) {
		size_t m = n - done < sizeof(buf) ? (size_t)(n - done) : sizeof(buf);

		ring_copy(ch->tx, ch->size, tx_cons + done, buf, m, false);
		ring_copy(ch->rx, ch->size, rx_prod + done, buf, m, true);
		done += m;
	}
	atomic_store_explicit(&k->tx_cons, tx_cons + n, memory_order_release);
	atomic_store_explicit(&k->rx_prod, rx_prod + n, memory_order_release);
	if ((atomic_load_explicit(&k->app_flags, memory_order_acquire) & MESH_APP_SHUT_WR) &&
	    atomic_load_explicit(&k->tx_prod, memory_order_acquire) == tx_cons + n)
		atomic_fetch_or_explicit(&k->state, MESH_STATE_PEER_EOF, memory_order_release);
	ring_wake(ch);
}

/* ---- the fake meshd's control side ---- */

#define FAKE_FAIL(f)                                  \
	do {                                          \
		if (!(f)->thr_err)                    \
			(f)->thr_err = __LINE__;      \
	} while (0)

/* A channel as meshd makes it, with the flaw asked for; NULL fds[] entries stay -1. */
static int fake_chan_make(struct fake *f, uint64_t size, int fds[4])
{
	struct fake_chan *ch;
	uint64_t memfd_size = MESH_RING_CTRL_SIZE + 2 * size;
	int sp[2], memfd;

	if (f->nch == FAKE_CHANS)
		return -1;
	ch = &f->ch[f->nch++];
	ch->lifeline = ch->kick = ch->wake = -1;
	ch->size = size;
	if (f->flaw == FLAW_SETUP_MEMFD_SIZE)
		memfd_size += 4096;
	if (f->flaw == FLAW_MEMFD_SHORT)
		memfd_size -= 4096;
	memfd = memfd_create("fake-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (memfd < 0 || ftruncate(memfd, (off_t)memfd_size))
		return -1;
	if (f->flaw != FLAW_UNSEALED && fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
		return -1;
	ch->map_len = memfd_size;
	ch->map = mmap(NULL, ch->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (ch->map == MAP_FAILED) {
		ch->map = NULL;
		close(memfd);
		return -1;
	}
	ch->ctrl = ch->map;
	ch->tx = (uint8_t *)ch->map + MESH_RING_CTRL_SIZE;
	ch->rx = ch->tx + size;
	ch->ctrl->magic = f->flaw == FLAW_BAD_MAGIC ? 0xdeadbeefu : MESH_RING_MAGIC;
	ch->ctrl->version = f->flaw == FLAW_BAD_VERSION ? 2 : MESH_RING_VERSION;
	ch->ctrl->ring_size = f->flaw == FLAW_CTRL_RING_SIZE ? 2 * size : size;
	ch->ctrl->tx_off = MESH_RING_CTRL_SIZE;
	ch->ctrl->rx_off = f->flaw == FLAW_BAD_RX_OFF ? MESH_RING_CTRL_SIZE : MESH_RING_CTRL_SIZE + size;
	ch->ctrl->channel_id = f->channel_id;
	ch->ctrl->peer_node = PEER_NODE;
	ch->ctrl->local_port = LOCAL_PORT;
	ch->ctrl->peer_port = PEER_PORT;
	ch->ctrl->spin_us = f->spin_us;
	if (f->flaw == FLAW_BAD_INDICES)
		atomic_store(&ch->ctrl->tx_cons, 10);
	atomic_store(&ch->ctrl->state, MESH_STATE_OPEN);
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp)) {
		close(memfd);
		return -1;
	}
	ch->lifeline = sp[0];
	ch->kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	ch->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	fds[0] = memfd;
	fds[1] = sp[1];
	fds[2] = dup(ch->kick);
	fds[3] = dup(ch->wake);
	if (f->flaw == FLAW_KICK_PIPE) {
		int p[2];

		if (pipe2(p, O_CLOEXEC))
			return -1;
		close(fds[2]);
		close(p[0]);
		fds[2] = p[1];
	}
	if (f->flaw == FLAW_LIFELINE_FILE) {
		close(fds[1]);
		fds[1] = open("/dev/null", O_RDWR | O_CLOEXEC);
	}
	return 0;
}

/* Sends one reply, with nfds descriptors, and closes our copies of those descriptors. */
static int fake_send_reply(int conn, const void *buf, size_t len, int *fds, int nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 32)];
		struct cmsghdr align;
	} cbuf;
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t n;

	if (nfds) {
		struct cmsghdr *cm;

		memset(&cbuf, 0, sizeof(cbuf));
		msg.msg_control = cbuf.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
	}
	n = sendmsg(conn, &msg, MSG_NOSIGNAL);
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	return n == (ssize_t)len ? 0 : -1;
}

/* The answer meshd gives on conn: a status, or a channel of `size` bytes per direction. */
static void fake_answer(struct fake *f, int conn, bool with_channel, uint64_t size)
{
	ChannelSetup setup = CHANNEL_SETUP__INIT;
	NodeInfo node = NODE_INFO__INIT;
	CtlReply r = CTL_REPLY__INIT;
	uint8_t buf[1024];
	int fds[32], nfds = 0;
	size_t len;

	r.status = f->status;
	if (f->error_text)
		r.error = (char *)f->error_text;
	if (f->name_node) {
		node.id = f->node_id;
		r.node = &node;
	}
	if (f->flaw == FLAW_FDS_WITH_STATUS || (with_channel && !f->status)) {
		if (fake_chan_make(f, size, fds)) {
			FAKE_FAIL(f);
			return;
		}
		nfds = 4;
		setup.channel_id = f->channel_id;
		setup.peer_node = PEER_NODE;
		setup.local_port = LOCAL_PORT;
		setup.peer_port = PEER_PORT;
		setup.ring_size = size;
		setup.memfd_size = MESH_RING_CTRL_SIZE + 2 * size;
		setup.qps = 2;
		if (f->flaw == FLAW_SETUP_MEMFD_SIZE)
			setup.memfd_size += 4096;
		if (f->flaw == FLAW_SETUP_RING_SIZE) {
			setup.ring_size = 3000;
			setup.memfd_size = MESH_RING_CTRL_SIZE + 2 * 3000;
		}
		if (f->flaw != FLAW_NO_SETUP && f->flaw != FLAW_FDS_WITH_STATUS)
			r.setup = &setup;
		if (f->flaw == FLAW_THREE_FDS)
			close(fds[--nfds]);
		while (f->flaw == FLAW_TWENTY_FDS && nfds < 20) {
			fds[nfds] = dup(fds[0]);
			nfds++;
		}
	}
	if (f->flaw == FLAW_GARBAGE) {
		memset(buf, 0xff, 8);
		len = 8;
	} else {
		len = ctl_reply__pack(&r, buf);
	}
	if (fake_send_reply(conn, buf, len, fds, nfds))
		FAKE_FAIL(f);
}

static void fake_loopback(struct fake *f)
{
	struct fake_chan *ch = &f->ch[f->nch - 1];

	for (;;) {
		struct pollfd p[2] = {{.fd = ch->kick, .events = POLLIN}, {.fd = f->stopfd, .events = POLLIN}};

		if (poll(p, 2, -1) < 0 && errno != EINTR) {
			FAKE_FAIL(f);
			return;
		}
		if (p[1].revents)
			return;
		efd_take(ch->kick);
		ring_loop_pump(ch);
	}
}

/* The thread: one request on one new connection, answered; then the loopback daemon if asked. */
static void *fake_thread(void *arg)
{
	struct fake *f = arg;
	uint8_t buf[MESH_CTL_REQ_MAX];
	CtlRequest *req;
	ssize_t n;

	f->conn = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
	if (f->conn < 0) {
		FAKE_FAIL(f);
		return NULL;
	}
	n = recv(f->conn, buf, sizeof(buf), 0);
	req = n >= 0 ? ctl_request__unpack(NULL, (size_t)n, buf) : NULL;
	if (!req) {
		FAKE_FAIL(f);
		return NULL;
	}
	f->req = *req;
	f->req.base.unknown_fields = NULL;
	f->req.base.n_unknown_fields = 0;
	f->got_req = true;
	ctl_request__free_unpacked(req, NULL);
	if (f->flaw == FLAW_NO_REPLY)
		return NULL;
	if (f->flaw == FLAW_HANGUP) {
		close(f->conn);
		f->conn = -1;
		return NULL;
	}
	fake_answer(f, f->conn, f->req.op == CTL_OP__CTL_OP_CONNECT,
		    f->req.ring_size ? f->req.ring_size : MESH_RING_DEFAULT);
	if (f->loopback && !f->thr_err && f->nch)
		fake_loopback(f);
	return NULL;
}

static void fake_join(struct fake *f)
{
	if (!f->thr_started)
		return;
	efd_signal(f->stopfd);
	pthread_join(f->thr, NULL);
	efd_take(f->stopfd);
	f->thr_started = false;
	assert_int_equal(f->thr_err, 0);
}

/* Answers the next request (in a thread, since the library waits for the answer). */
static void fake_serve(struct fake *f)
{
	fake_join(f);
	if (f->conn >= 0)
		close(f->conn);
	f->conn = -1;
	f->got_req = false;
	assert_int_equal(pthread_create(&f->thr, NULL, fake_thread, f), 0);
	f->thr_started = true;
}

/* Drops the control connection and every channel of the fake. */
static void fake_drop(struct fake *f)
{
	fake_join(f);
	if (f->conn >= 0)
		close(f->conn);
	f->conn = -1;
	for (int i = 0; i < f->nch; i++)
		fake_chan_close(&f->ch[i]);
	f->nch = 0;
}

/* ---- fixture ---- */

static int fake_setup(void **state)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct fake *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	alarm(TEST_ALARM_S);
	f->conn = -1;
	f->channel_id = 17;
	snprintf(f->dir, sizeof(f->dir), "/tmp/meshlib-test-XXXXXX");
	if (!mkdtemp(f->dir))
		return -1;
	snprintf(f->path, sizeof(f->path), "%s/meshd.sock", f->dir);
	memcpy(sa.sun_path, f->path, strlen(f->path) + 1);
	f->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(f->lfd, 8))
		return -1;
	f->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (f->stopfd < 0 || mesh_open(f->path, &f->s))
		return -1;
	*state = f;
	return 0;
}

static int fake_teardown(void **state)
{
	struct fake *f = *state;

	/* After a failed assertion: stop the thread without asserting again. */
	if (f->thr_started) {
		efd_signal(f->stopfd);
		pthread_join(f->thr, NULL);
		f->thr_started = false;
	}
	fake_drop(f);
	mesh_session_close(f->s);
	close(f->stopfd);
	close(f->lfd);
	unlink(f->path);
	rmdir(f->dir);
	free(f);
	alarm(0);
	return 0;
}

static struct mesh_channel_opts small_opts(void)
{
	struct mesh_channel_opts o = {.mask = MESH_OPT_RING_SIZE, .ring_size = SMALL_RING};

	return o;
}

/* A channel with a 4 KiB ring whose meshd side is f->ch[f->nch - 1], driven by the test. */
static mesh_channel_t *open_small(struct fake *f)
{
	struct mesh_channel_opts o = small_opts();
	mesh_channel_t *c = NULL;

	fake_serve(f);
	assert_int_equal(mesh_connect(f->s, PEER_NODE, PEER_PORT, &o, &c), 0);
	fake_join(f);
	assert_non_null(c);
	assert_true(f->nch >= 1);
	return c;
}

/* ---- ring.h index math ---- */

static void meshlib_ring_index_math__size_valid__powers_of_two_4k_to_256m(void **state)
{
	(void)state;
	assert_true(mesh_ring_size_valid(4096));
	assert_true(mesh_ring_size_valid(1u << 20));
	assert_true(mesh_ring_size_valid(256u << 20));
	assert_false(mesh_ring_size_valid(0));
	assert_false(mesh_ring_size_valid(2048));
	assert_false(mesh_ring_size_valid(4095));
	assert_false(mesh_ring_size_valid(6144));
	assert_false(mesh_ring_size_valid(512u << 20));
	assert_false(mesh_ring_size_valid(UINT64_MAX));
	assert_false(mesh_ring_size_valid(1ull << 63));
}

static void meshlib_ring_index_math__in_window__inclusive_bounds(void **state)
{
	(void)state;
	assert_true(mesh_ring_in_window(5, 5, 9));
	assert_true(mesh_ring_in_window(9, 5, 9));
	assert_true(mesh_ring_in_window(7, 5, 9));
	assert_false(mesh_ring_in_window(4, 5, 9));
	assert_false(mesh_ring_in_window(10, 5, 9));
	assert_true(mesh_ring_in_window(UINT64_MAX, UINT64_MAX - 4096, UINT64_MAX));
	assert_false(mesh_ring_in_window(0, 1, UINT64_MAX));
	/* An empty window (lo > hi) holds nothing. */
	assert_false(mesh_ring_in_window(5, 6, 4));
}

static void meshlib_ring_index_math__contig__bytes_to_area_end(void **state)
{
	(void)state;
	assert_int_equal(mesh_ring_contig(0, 4096), 4096);
	assert_int_equal(mesh_ring_contig(1, 4096), 4095);
	assert_int_equal(mesh_ring_contig(4095, 4096), 1);
	assert_int_equal(mesh_ring_contig(4096, 4096), 4096);
	assert_int_equal(mesh_ring_contig(3 * 4096 + 100, 4096), 3996);
	assert_int_equal(mesh_ring_contig(UINT64_MAX, 1u << 20), 1);
	assert_int_equal(mesh_ring_contig((1ull << 40) + 5, 256u << 20), (256u << 20) - 5);
}

/* ---- sessions and arguments ---- */

static void meshlib_open__path_arg_env_or_default__bad_paths_rejected(void **state)
{
	struct fake *f = *state;
	mesh_session_t *s = NULL;
	mesh_channel_t *c = NULL;
	struct mesh_channel_opts o = small_opts();
	char longpath[200];

	assert_int_equal(mesh_open(NULL, NULL), -EINVAL);
	assert_int_equal(mesh_open("", &s), -EINVAL);
	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[sizeof(longpath) - 1] = '\0';
	assert_int_equal(mesh_open(longpath, &s), -ENAMETOOLONG);
	assert_null(s);
	mesh_session_close(NULL);

	/* No path: $MESH_SOCKET names the fake. */
	assert_int_equal(setenv(MESH_SOCKET_ENV, f->path, 1), 0);
	assert_int_equal(mesh_open(NULL, &s), 0);
	unsetenv(MESH_SOCKET_ENV);
	fake_serve(f);
	assert_int_equal(mesh_connect(s, PEER_NODE, PEER_PORT, &o, &c), 0);
	fake_join(f);
	assert_true(f->got_req);
	mesh_close(c);
	mesh_session_close(s);

	/* A path that names no socket: meshd is not there, and the session's error says so with the
	 * path (the errno alone, "No such file or directory", read as the peer node's). */
	assert_int_equal(mesh_open("/nonexistent/meshd.sock", &s), 0);
	assert_int_equal(mesh_connect(s, PEER_NODE, PEER_PORT, NULL, &c), -ENOENT);
	assert_string_equal(mesh_session_error(s), "meshd is not running at /nonexistent/meshd.sock (no such socket)");
	assert_int_equal(mesh_listen(s, 1, &(mesh_listener_t *){NULL}), -ENOENT);
	assert_string_equal(mesh_session_error(s), "meshd is not running at /nonexistent/meshd.sock (no such socket)");
	assert_int_equal(mesh_node_table(s, NULL, 0), -ENOENT);
	assert_non_null(strstr(mesh_session_error(s), "/nonexistent/meshd.sock"));
	mesh_session_close(s);
}

static void meshlib_api__null_and_bad_arguments__einval(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct mesh_channel_info info;
	mesh_listener_t *l = NULL;
	const void *cbuf;
	void *buf;
	char b[8] = {0};

	assert_int_equal(mesh_listen(NULL, 1, &l), -EINVAL);
	assert_int_equal(mesh_listen(f->s, 1, NULL), -EINVAL);
	assert_int_equal(mesh_accept(NULL, 0, &c), -EINVAL);
	assert_int_equal(mesh_listener_fd(NULL), -EINVAL);
	mesh_listener_close(NULL);
	assert_int_equal(mesh_connect(NULL, 1, 1, NULL, &c), -EINVAL);
	assert_int_equal(mesh_connect(f->s, 1, 1, NULL, NULL), -EINVAL);

	assert_int_equal(mesh_send(NULL, b, 1, 0), -EINVAL);
	assert_int_equal(mesh_send(c, NULL, 1, 0), -EINVAL);
	assert_int_equal(mesh_send(c, b, 0, 0), -EINVAL);
	assert_int_equal(mesh_send(c, b, 1, 0x2), -EINVAL);
	assert_int_equal(mesh_recv(NULL, b, 1, 0), -EINVAL);
	assert_int_equal(mesh_recv(c, NULL, 1, 0), -EINVAL);
	assert_int_equal(mesh_recv(c, b, 0, 0), -EINVAL);
	assert_int_equal(mesh_recv(c, b, 1, ~MESH_NONBLOCK), -EINVAL);
	assert_int_equal(mesh_send_reserve(NULL, &buf, 0), -EINVAL);
	assert_int_equal(mesh_send_reserve(c, NULL, 0), -EINVAL);
	assert_int_equal(mesh_send_reserve(c, &buf, 0x10), -EINVAL);
	assert_int_equal(mesh_send_commit(NULL, 1), -EINVAL);
	assert_int_equal(mesh_send_commit(c, 1), -EINVAL); /* nothing reserved */
	assert_int_equal(mesh_recv_peek(NULL, &cbuf, 0), -EINVAL);
	assert_int_equal(mesh_recv_peek(c, NULL, 0), -EINVAL);
	assert_int_equal(mesh_recv_peek(c, &cbuf, 0x4), -EINVAL);
	assert_int_equal(mesh_recv_release(NULL, 1), -EINVAL);
	assert_int_equal(mesh_recv_release(c, 1), -EINVAL); /* nothing peeked */
	assert_int_equal(mesh_channel_fd(NULL), -EINVAL);
	assert_int_equal(mesh_channel_info(NULL, &info), -EINVAL);
	assert_int_equal(mesh_channel_info(c, NULL), -EINVAL);
	assert_int_equal(mesh_shutdown(NULL), -EINVAL);
	assert_int_equal(mesh_close(NULL), -EINVAL);
	/* None of that reached meshd. */
	assert_int_equal(ring_tx_pending(&f->ch[0]), 0);
	assert_int_equal(efd_take(f->ch[0].kick), 0);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_connect__bad_options__einval_nothing_sent(void **state)
{
	struct fake *f = *state;
	struct mesh_channel_opts o;
	mesh_channel_t *c = NULL;

	o = (struct mesh_channel_opts){.mask = MESH_OPT_RING_SIZE, .ring_size = 3000};
	assert_int_equal(mesh_connect(f->s, 1, 1, &o, &c), -EINVAL);
	o.ring_size = 2048;
	assert_int_equal(mesh_connect(f->s, 1, 1, &o, &c), -EINVAL);
	o.ring_size = 512u << 20;
	assert_int_equal(mesh_connect(f->s, 1, 1, &o, &c), -EINVAL);
	o = (struct mesh_channel_opts){.mask = MESH_OPT_QPS, .qps = 0};
	assert_int_equal(mesh_connect(f->s, 1, 1, &o, &c), -EINVAL);
	o.qps = 17;
	assert_int_equal(mesh_connect(f->s, 1, 1, &o, &c), -EINVAL);
	o = (struct mesh_channel_opts){.mask = MESH_OPT_NUMA_NODE, .numa_node = -1};
	assert_int_equal(mesh_connect(f->s, 1, 1, &o, &c), -EINVAL);
	o = (struct mesh_channel_opts){.mask = MESH_OPT_TIMEOUT_MS, .timeout_ms = 0};
	assert_int_equal(mesh_connect(f->s, 1, 1, &o, &c), -EINVAL);
	o = (struct mesh_channel_opts){.mask = 1u << 9};
	assert_int_equal(mesh_connect(f->s, 1, 1, &o, &c), -EINVAL);
	assert_int_equal(mesh_connect(f->s, MESH_NODE_ID_MAX + 1, 1, NULL, &c), -EINVAL);
	assert_null(c);
	/* meshd never saw a connection. */
	assert_false(fd_readable(f->lfd, 0));
}

static void meshlib_connect__options__request_fields_and_info_from_setup(void **state)
{
	struct fake *f = *state;
	struct mesh_channel_opts o = {
		.mask = MESH_OPT_RING_SIZE | MESH_OPT_QPS | MESH_OPT_NUMA_NODE | MESH_OPT_TIMEOUT_MS,
		.ring_size = 8192,
		.qps = 3,
		.numa_node = 1,
		.timeout_ms = 5000,
	};
	struct mesh_channel_info info;
	mesh_channel_t *c = NULL;

	fake_serve(f);
	assert_int_equal(mesh_connect(f->s, 513, 4242, &o, &c), 0);
	fake_join(f);
	assert_true(f->got_req);
	assert_int_equal(f->req.version, MESH_CTL_VERSION);
	assert_int_equal(f->req.op, CTL_OP__CTL_OP_CONNECT);
	assert_int_equal(f->req.node, 513);
	assert_int_equal(f->req.port, 4242);
	assert_int_equal(f->req.ring_size, 8192);
	assert_int_equal(f->req.qps, 3);
	assert_true(f->req.has_numa);
	assert_int_equal(f->req.numa_node, 1);

	memset(&info, 0xa5, sizeof(info));
	assert_int_equal(mesh_channel_info(c, &info), 0);
	assert_int_equal(info.channel_id, 17);
	assert_int_equal(info.peer_node, PEER_NODE);
	assert_int_equal(info.local_port, LOCAL_PORT);
	assert_int_equal(info.peer_port, PEER_PORT);
	assert_int_equal(info.qps, 2);
	assert_int_equal(info.ring_size, 8192);
	assert_int_equal(info.local_node, MESH_NODE_UNKNOWN); /* the fake named no node */
	assert_int_equal(info.reserved32, 0);
	for (size_t i = 0; i < sizeof(info.reserved) / sizeof(info.reserved[0]); i++)
		assert_int_equal(info.reserved[i], 0);
	/* The control connection is closed once the channel exists. */
	assert_true(fd_hung_up(f->conn, 1000));
	assert_int_equal(mesh_close(c), 0);
}

/* MESH_OPT_WAIT_LINK asks meshd to wait for the link as long as we wait for its answer (the
 * timeout, at most a day); without it meshd is asked for no wait. And the timeout's own text,
 * when meshd's answer does not come first, says what may be missing. */
static void meshlib_connect__wait_link__meshd_asked_to_wait_the_timeout(void **state)
{
	struct fake *f = *state;
	struct mesh_channel_opts o = {.mask = MESH_OPT_WAIT_LINK};
	mesh_connecting_t *p = NULL;
	mesh_channel_t *c = NULL;

	fake_serve(f);
	assert_int_equal(mesh_connect(f->s, PEER_NODE, PEER_PORT, &o, &c), 0);
	fake_join(f);
	assert_int_equal(f->req.link_wait_ms, 30000); /* the default timeout */
	assert_int_equal(mesh_close(c), 0);
	fake_drop(f);

	o = (struct mesh_channel_opts){.mask = MESH_OPT_WAIT_LINK | MESH_OPT_TIMEOUT_MS, .timeout_ms = UINT32_MAX};
	fake_serve(f);
	assert_int_equal(mesh_connect_start(f->s, PEER_NODE, PEER_PORT, &o, &p), 0);
	fake_join(f);
	assert_int_equal(f->req.link_wait_ms, MESH_CONNECT_WAIT_MAX_MS);
	mesh_connect_cancel(p);
	fake_drop(f);

	o = (struct mesh_channel_opts){.mask = MESH_OPT_TIMEOUT_MS, .timeout_ms = 5000};
	fake_serve(f);
	assert_int_equal(mesh_connect(f->s, PEER_NODE, PEER_PORT, &o, &c), 0);
	fake_join(f);
	assert_int_equal(f->req.link_wait_ms, 0);
	assert_int_equal(mesh_close(c), 0);
	fake_drop(f);

	o = (struct mesh_channel_opts){.mask = MESH_OPT_WAIT_LINK | MESH_OPT_TIMEOUT_MS, .timeout_ms = 100};
	f->flaw = FLAW_NO_REPLY;
	fake_serve(f);
	assert_int_equal(mesh_connect(f->s, PEER_NODE, PEER_PORT, &o, &c), -ETIMEDOUT);
	fake_join(f);
	assert_int_equal(f->req.link_wait_ms, 100);
	if (!strstr(mesh_session_error(f->s), "no answer within 100 ms: node 3 did not accept, or its link did not come UP"))
		fail_msg("session error \"%s\"", mesh_session_error(f->s));
}

static void meshlib_connect__no_options__defaults_left_to_meshd(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = NULL;

	fake_serve(f);
	assert_int_equal(mesh_connect(f->s, 0, 0, NULL, &c), 0);
	fake_join(f);
	assert_int_equal(f->req.node, 0);
	assert_int_equal(f->req.port, 0);
	assert_int_equal(f->req.ring_size, 0);
	assert_int_equal(f->req.qps, 0);
	assert_false(f->req.has_numa);
	assert_int_equal(f->ch[0].size, MESH_RING_DEFAULT);
	assert_int_equal(mesh_close(c), 0);
}

/* The connect fails with `expect` and leaves no descriptor behind, in us or (once the fake drops
 * its side) anywhere. */
static void connect_fails(struct fake *f, enum fake_flaw flaw, int status, int expect)
{
	struct mesh_channel_opts o = small_opts();
	mesh_channel_t *c = NULL;
	int before = fd_count();

	f->flaw = flaw;
	f->status = status;
	fake_serve(f);
	assert_int_equal(mesh_connect(f->s, PEER_NODE, PEER_PORT, &o, &c), expect);
	assert_null(c);
	fake_drop(f);
	assert_int_equal(fd_count(), before);
	f->flaw = FLAW_NONE;
	f->status = 0;
}

static void meshlib_connect__status_econnrefused__returned_no_fd_leaked(void **state)
{
	struct fake *f = *state;
	char text[600];

	connect_fails(*state, FLAW_NONE, -ECONNREFUSED, -ECONNREFUSED);
	/* A reply longer than the common case (a long error text). */
	memset(text, 'e', sizeof(text) - 1);
	text[sizeof(text) - 1] = '\0';
	f->error_text = text;
	connect_fails(*state, FLAW_NONE, -ECONNREFUSED, -ECONNREFUSED);
	connect_fails(*state, FLAW_FDS_WITH_STATUS, -ECONNREFUSED, -ECONNREFUSED);
	f->error_text = NULL;
	connect_fails(*state, FLAW_NONE, -MESH_EUNKNOWNNODE, -MESH_EUNKNOWNNODE);
	connect_fails(*state, FLAW_NONE, -ENETUNREACH, -ENETUNREACH);
}

static void meshlib_session_error__failed_connect__meshd_text_printable_and_cleared(void **state)
{
	struct fake *f = *state;
	char hostile[400];

	assert_string_equal(mesh_session_error(f->s), "");
	assert_string_equal(mesh_session_error(NULL), "");
	f->error_text = "the NUMA hint names no online node of this machine";
	connect_fails(f, FLAW_NONE, -EINVAL, -EINVAL);
	assert_string_equal(mesh_session_error(f->s), "the NUMA hint names no online node of this machine");
	/* Control characters (a terminal escape) are not passed on; a long text is cut, terminated. */
	memset(hostile, 'x', sizeof(hostile) - 1);
	hostile[sizeof(hostile) - 1] = 0;
	hostile[0] = '\033';
	hostile[1] = '\n';
	f->error_text = hostile;
	connect_fails(f, FLAW_NONE, -EINVAL, -EINVAL);
	assert_int_equal(mesh_session_error(f->s)[0], '?');
	assert_int_equal(mesh_session_error(f->s)[1], '?');
	assert_true(strlen(mesh_session_error(f->s)) < sizeof(hostile) - 1);
	for (const char *p = mesh_session_error(f->s); *p; p++)
		assert_true(*p >= 0x20 && *p < 0x7f);
	f->error_text = NULL;
	/* The next call starts clean. */
	connect_fails(f, FLAW_NONE, -ECONNREFUSED, -ECONNREFUSED);
	assert_string_equal(mesh_session_error(f->s), "");
}

static void meshlib_connect__status_with_fds_or_positive__fds_closed(void **state)
{
	connect_fails(*state, FLAW_FDS_WITH_STATUS, -ECONNREFUSED, -ECONNREFUSED);
	connect_fails(*state, FLAW_NONE, 5, -EPROTO);
}

static void meshlib_connect__memfd_size_wrong__eproto_no_fd_leaked(void **state)
{
	connect_fails(*state, FLAW_MEMFD_SHORT, 0, -EPROTO);
	connect_fails(*state, FLAW_SETUP_MEMFD_SIZE, 0, -EPROTO);
	connect_fails(*state, FLAW_SETUP_RING_SIZE, 0, -EPROTO);
}

static void meshlib_connect__bad_magic__eproto_no_fd_leaked(void **state)
{
	connect_fails(*state, FLAW_BAD_MAGIC, 0, -EPROTO);
}

static void meshlib_connect__inconsistent_control_page__eproto_no_fd_leaked(void **state)
{
	connect_fails(*state, FLAW_BAD_VERSION, 0, -EPROTO);
	connect_fails(*state, FLAW_BAD_RX_OFF, 0, -EPROTO);
	connect_fails(*state, FLAW_CTRL_RING_SIZE, 0, -EPROTO);
	connect_fails(*state, FLAW_BAD_INDICES, 0, -EPROTO);
}

static void meshlib_connect__wrong_descriptors__eproto_no_fd_leaked(void **state)
{
	connect_fails(*state, FLAW_THREE_FDS, 0, -EPROTO);
	connect_fails(*state, FLAW_TWENTY_FDS, 0, -EPROTO);
	connect_fails(*state, FLAW_NO_SETUP, 0, -EPROTO);
	connect_fails(*state, FLAW_KICK_PIPE, 0, -EPROTO);
	connect_fails(*state, FLAW_LIFELINE_FILE, 0, -EPROTO);
	connect_fails(*state, FLAW_UNSEALED, 0, -EPROTO);
}

static void meshlib_connect__garbage_reply__ebadmsg_no_fd_leaked(void **state)
{
	connect_fails(*state, FLAW_GARBAGE, 0, -EBADMSG);
}

static void meshlib_connect__meshd_hangs_up__econnreset(void **state)
{
	connect_fails(*state, FLAW_HANGUP, 0, -ECONNRESET);
}

static void meshlib_connect__no_reply__etimedout_after_timeout(void **state)
{
	struct fake *f = *state;
	struct mesh_channel_opts o = {.mask = MESH_OPT_TIMEOUT_MS, .timeout_ms = 200};
	mesh_channel_t *c = NULL;
	int before = fd_count();
	uint64_t t0 = now_ms(), dt;

	f->flaw = FLAW_NO_REPLY;
	fake_serve(f);
	assert_int_equal(mesh_connect(f->s, PEER_NODE, PEER_PORT, &o, &c), -ETIMEDOUT);
	dt = now_ms() - t0;
	assert_in_range(dt, 190, 10000);
	fake_join(f);
	assert_true(f->got_req);
	/* We gave up: meshd sees the control connection close. */
	assert_true(fd_hung_up(f->conn, 1000));
	fake_drop(f);
	assert_int_equal(fd_count(), before);
}

/* ---- connecting without waiting ---- */

/* start returns before meshd answered; the fd turns readable with the answer; finish gives the
 * channel, which works. */
static void meshlib_connect_start__answered__fd_readable_then_channel(void **state)
{
	struct fake *f = *state;
	struct mesh_channel_opts o = small_opts();
	mesh_connecting_t *p = NULL;
	mesh_channel_t *c = NULL;
	int before = fd_count();

	f->flaw = FLAW_NO_REPLY; /* the fake takes the request and keeps quiet: nothing to read yet */
	fake_serve(f);
	assert_int_equal(mesh_connect_start(f->s, PEER_NODE, PEER_PORT, &o, &p), 0);
	assert_non_null(p);
	fake_join(f);
	assert_true(f->got_req);
	assert_int_equal(f->req.op, CTL_OP__CTL_OP_CONNECT);
	assert_int_equal(f->req.node, PEER_NODE);
	assert_false(fd_readable(mesh_connect_fd(p), 50));
	assert_int_equal(mesh_connect_finish(p, &c), -EAGAIN);
	assert_null(c);
	/* Now meshd answers on the same connection. */
	f->flaw = FLAW_NONE;
	fake_answer(f, f->conn, true, SMALL_RING);
	assert_int_equal(f->thr_err, 0);
	assert_true(fd_readable(mesh_connect_fd(p), 2000));
	assert_int_equal(mesh_connect_finish(p, &c), 0);
	assert_non_null(c);
	assert_true(mesh_channel_fd(c) >= 0);
	assert_int_equal(mesh_close(c), 0);
	fake_drop(f);
	assert_int_equal(fd_count(), before);
}

/* A refusal comes back through finish, its text in the session; nothing is left open. */
static void meshlib_connect_start__refused__finish_says_why(void **state)
{
	struct fake *f = *state;
	mesh_connecting_t *p = NULL;
	mesh_channel_t *c = NULL;
	int before = fd_count();

	f->status = -ECONNREFUSED;
	f->error_text = "nobody listens on port 4242";
	fake_serve(f);
	assert_int_equal(mesh_connect_start(f->s, PEER_NODE, PEER_PORT, NULL, &p), 0);
	assert_true(fd_readable(mesh_connect_fd(p), 2000));
	assert_int_equal(mesh_connect_finish(p, &c), -ECONNREFUSED);
	assert_null(c);
	assert_string_equal(mesh_session_error(f->s), "nobody listens on port 4242");
	fake_drop(f);
	assert_int_equal(fd_count(), before);
}

/* No answer: -EAGAIN until the options' timeout, then -ETIMEDOUT and meshd sees the close. */
static void meshlib_connect_start__no_reply__eagain_then_etimedout(void **state)
{
	struct fake *f = *state;
	struct mesh_channel_opts o = {.mask = MESH_OPT_TIMEOUT_MS, .timeout_ms = 150};
	mesh_connecting_t *p = NULL;
	mesh_channel_t *c = NULL;
	int before = fd_count();

	f->flaw = FLAW_NO_REPLY;
	fake_serve(f);
	assert_int_equal(mesh_connect_start(f->s, PEER_NODE, PEER_PORT, &o, &p), 0);
	fake_join(f);
	assert_int_equal(mesh_connect_finish(p, &c), -EAGAIN);
	usleep(200 * 1000);
	assert_int_equal(mesh_connect_finish(p, &c), -ETIMEDOUT);
	assert_null(c);
	assert_true(fd_hung_up(f->conn, 1000));
	fake_drop(f);
	assert_int_equal(fd_count(), before);
}

/* Cancelled before the answer: meshd sees the control connection close, nothing leaks. */
static void meshlib_connect_cancel__pending__meshd_sees_close(void **state)
{
	struct fake *f = *state;
	mesh_connecting_t *p = NULL;
	int before = fd_count();

	f->flaw = FLAW_NO_REPLY;
	fake_serve(f);
	assert_int_equal(mesh_connect_start(f->s, PEER_NODE, PEER_PORT, NULL, &p), 0);
	fake_join(f);
	mesh_connect_cancel(p);
	mesh_connect_cancel(NULL);
	assert_true(fd_hung_up(f->conn, 1000));
	fake_drop(f);
	assert_int_equal(fd_count(), before);
	assert_int_equal(mesh_connect_start(NULL, 1, 1, NULL, &p), -EINVAL);
	assert_int_equal(mesh_connect_start(f->s, 1, 1, NULL, NULL), -EINVAL);
	assert_int_equal(mesh_connect_finish(NULL, NULL), -EINVAL);
	assert_int_equal(mesh_connect_fd(NULL), -EINVAL);
}

/* ---- listeners ---- */

static void meshlib_listen__channels_pushed__accepted_in_order(void **state)
{
	struct fake *f = *state;
	mesh_listener_t *l = NULL;
	mesh_channel_t *c1 = NULL, *c2 = NULL, *c3 = NULL;
	struct mesh_channel_info info;
	int lfd;

	fake_serve(f);
	assert_int_equal(mesh_listen(f->s, 7000, &l), 0);
	fake_join(f);
	assert_int_equal(f->req.version, MESH_CTL_VERSION);
	assert_int_equal(f->req.op, CTL_OP__CTL_OP_LISTEN);
	assert_int_equal(f->req.port, 7000);
	lfd = mesh_listener_fd(l);
	assert_true(lfd >= 0);
	assert_false(fd_readable(lfd, 0));
	assert_int_equal(mesh_accept(l, MESH_NONBLOCK, &c1), -EAGAIN);

	f->channel_id = 100;
	fake_answer(f, f->conn, true, SMALL_RING);
	f->channel_id = 101;
	fake_answer(f, f->conn, true, 8192);
	assert_true(fd_readable(lfd, 1000));
	assert_int_equal(mesh_accept(l, MESH_NONBLOCK, &c1), 0);
	assert_int_equal(mesh_accept(l, 0, &c2), 0);
	assert_int_equal(mesh_accept(l, MESH_NONBLOCK, &c3), -EAGAIN);
	assert_false(fd_readable(lfd, 0));
	assert_int_equal(mesh_channel_info(c1, &info), 0);
	assert_int_equal(info.channel_id, 100);
	assert_int_equal(info.ring_size, SMALL_RING);
	assert_int_equal(mesh_channel_info(c2, &info), 0);
	assert_int_equal(info.channel_id, 101);
	assert_int_equal(info.ring_size, 8192);

	/* A channel outlives its listener and the listener's session. */
	mesh_listener_close(l);
	assert_true(fd_hung_up(f->conn, 1000));
	assert_int_equal(mesh_send(c2, "x", 1, MESH_NONBLOCK), 1);
	assert_int_equal(ring_tx_pending(&f->ch[1]), 1);
	assert_int_equal(mesh_close(c1), 0);
	assert_int_equal(mesh_close(c2), 0);
}

static void meshlib_connect__reply_names_node__local_node_in_info(void **state)
{
	struct fake *f = *state;
	struct mesh_channel_opts o = small_opts();
	struct mesh_channel_info info;
	mesh_channel_t *c = NULL;

	f->name_node = true;
	f->node_id = MESH_NODE_ID_MAX;
	fake_serve(f);
	assert_int_equal(mesh_connect(f->s, PEER_NODE, PEER_PORT, &o, &c), 0);
	fake_join(f);
	assert_int_equal(mesh_channel_info(c, &info), 0);
	assert_int_equal(info.local_node, MESH_NODE_ID_MAX);
	assert_int_equal(info.peer_node, PEER_NODE);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_connect__reply_node_out_of_range__eproto_no_fd_leaked(void **state)
{
	struct fake *f = *state;

	f->name_node = true;
	f->node_id = MESH_NODE_ID_MAX + 1;
	connect_fails(f, FLAW_NONE, 0, -EPROTO);
}

static void meshlib_listener_info__node_and_port__from_listen_answer(void **state)
{
	struct fake *f = *state;
	struct mesh_listener_info li;
	struct mesh_channel_info info;
	mesh_listener_t *l = NULL;
	mesh_channel_t *c = NULL;

	f->name_node = true;
	f->node_id = 9;
	fake_serve(f);
	assert_int_equal(mesh_listen(f->s, 7001, &l), 0);
	fake_join(f);
	memset(&li, 0xa5, sizeof(li));
	assert_int_equal(mesh_listener_info(l, &li), 0);
	assert_int_equal(li.node, 9);
	assert_int_equal(li.port, 7001);
	assert_int_equal(li.reserved16, 0);
	for (size_t i = 0; i < sizeof(li.reserved) / sizeof(li.reserved[0]); i++)
		assert_int_equal(li.reserved[i], 0);
	assert_int_equal(mesh_listener_info(NULL, &li), -EINVAL);
	assert_int_equal(mesh_listener_info(l, NULL), -EINVAL);
	/* An accepted channel names the node too. */
	fake_answer(f, f->conn, true, SMALL_RING);
	assert_int_equal(mesh_accept(l, 0, &c), 0);
	assert_int_equal(mesh_channel_info(c, &info), 0);
	assert_int_equal(info.local_node, 9);
	assert_int_equal(mesh_close(c), 0);
	mesh_listener_close(l);
}

static void meshlib_listen__answer_names_node_out_of_range__eproto(void **state)
{
	struct fake *f = *state;
	mesh_listener_t *l = NULL;
	int before = fd_count();

	f->name_node = true;
	f->node_id = 70000;
	fake_serve(f);
	assert_int_equal(mesh_listen(f->s, 7002, &l), -EPROTO);
	assert_null(l);
	fake_drop(f);
	assert_int_equal(fd_count(), before);
}

static void meshlib_listen__port_taken__eaddrinuse(void **state)
{
	struct fake *f = *state;
	mesh_listener_t *l = NULL;
	int before = fd_count();

	f->status = -EADDRINUSE;
	fake_serve(f);
	assert_int_equal(mesh_listen(f->s, 7000, &l), -EADDRINUSE);
	assert_null(l);
	fake_drop(f);
	assert_int_equal(fd_count(), before);
}

static void meshlib_listen__answer_with_fds__eproto_no_fd_leaked(void **state)
{
	struct fake *f = *state;
	mesh_listener_t *l = NULL;
	int before = fd_count();

	/* LISTEN's answer carrying a channel is not the contract. */
	f->flaw = FLAW_FDS_WITH_STATUS;
	fake_serve(f);
	assert_int_equal(mesh_listen(f->s, 7000, &l), -EPROTO);
	assert_null(l);
	fake_drop(f);
	assert_int_equal(fd_count(), before);
}

static void meshlib_accept__bad_setup__eproto_listener_keeps_working(void **state)
{
	struct fake *f = *state;
	mesh_listener_t *l = NULL;
	mesh_channel_t *c = NULL;
	int before;

	fake_serve(f);
	assert_int_equal(mesh_listen(f->s, 7000, &l), 0);
	fake_join(f);
	before = fd_count();
	f->flaw = FLAW_BAD_MAGIC;
	fake_answer(f, f->conn, true, SMALL_RING);
	f->flaw = FLAW_TWENTY_FDS;
	fake_answer(f, f->conn, true, SMALL_RING);
	f->flaw = FLAW_NONE;
	fake_answer(f, f->conn, true, SMALL_RING);
	assert_int_equal(mesh_accept(l, 0, &c), -EPROTO);
	assert_int_equal(mesh_accept(l, 0, &c), -EPROTO);
	assert_null(c);
	assert_int_equal(mesh_accept(l, 0, &c), 0);
	assert_non_null(c);
	assert_int_equal(mesh_close(c), 0);
	/* The rejected channels' lifelines hung up, telling meshd. */
	assert_true(fd_hung_up(f->ch[0].lifeline, 0));
	assert_true(fd_hung_up(f->ch[1].lifeline, 0));
	for (int i = 0; i < f->nch; i++)
		fake_chan_close(&f->ch[i]);
	f->nch = 0;
	assert_int_equal(fd_count(), before);
	mesh_listener_close(l);
}

static void *push_later(void *arg)
{
	struct fake *f = arg;

	sleep_ms(50);
	fake_answer(f, f->conn, true, SMALL_RING);
	return NULL;
}

static void meshlib_accept__blocking__returns_when_channel_arrives(void **state)
{
	struct fake *f = *state;
	mesh_listener_t *l = NULL;
	mesh_channel_t *c = NULL;
	pthread_t t;

	fake_serve(f);
	assert_int_equal(mesh_listen(f->s, 7000, &l), 0);
	fake_join(f);
	assert_int_equal(pthread_create(&t, NULL, push_later, f), 0);
	assert_int_equal(mesh_accept(l, 0, &c), 0);
	pthread_join(t, NULL);
	assert_int_equal(f->thr_err, 0);
	assert_int_equal(mesh_close(c), 0);
	mesh_listener_close(l);
}

static void meshlib_accept__meshd_closes_listener__econnreset(void **state)
{
	struct fake *f = *state;
	mesh_listener_t *l = NULL;
	mesh_channel_t *c = NULL;

	fake_serve(f);
	assert_int_equal(mesh_listen(f->s, 7000, &l), 0);
	fake_join(f);
	close(f->conn);
	f->conn = -1;
	assert_true(fd_readable(mesh_listener_fd(l), 1000));
	assert_int_equal(mesh_accept(l, 0, &c), -ECONNRESET);
	assert_int_equal(mesh_accept(l, MESH_NONBLOCK, &c), -ECONNRESET);
	mesh_listener_close(l);
}

/* ---- send and receive, meshd played by the test ---- */

static void meshlib_send__ring_wraps__bytes_in_order_in_two_pieces(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	uint8_t in[3000], out[3000];

	fill_random(in, sizeof(in));
	assert_int_equal(mesh_send(c, in, sizeof(in), 0), 3000);
	assert_int_equal(atomic_load(&ch->ctrl->tx_prod), 3000);
	ring_tx_take(ch, out, 3000);
	assert_memory_equal(in, out, sizeof(in));
	/* 1096 bytes to the end of the area, 1904 from its start. */
	fill_random(in, sizeof(in));
	assert_int_equal(mesh_send(c, in, sizeof(in), MESH_NONBLOCK), 3000);
	assert_memory_equal(ch->tx + 3000, in, 1096);
	assert_memory_equal(ch->tx, in + 1096, 1904);
	assert_int_equal(atomic_load(&ch->ctrl->tx_prod), 6000);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_send__full_ring__partial_count_then_eagain(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	static uint8_t in[5000];

	fill_random(in, sizeof(in));
	assert_int_equal(mesh_send(c, in, sizeof(in), MESH_NONBLOCK), SMALL_RING);
	assert_int_equal(mesh_send(c, in, 1, MESH_NONBLOCK), -EAGAIN);
	ring_tx_take(ch, NULL, 100);
	assert_int_equal(mesh_send(c, in, 500, MESH_NONBLOCK), 100);
	assert_int_equal(mesh_send(c, in, 500, MESH_NONBLOCK), -EAGAIN);
	assert_int_equal(ring_tx_pending(ch), SMALL_RING);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_send__each_publish__kicks_meshd(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	void *buf;

	assert_int_equal(efd_take(ch->kick), 0);
	assert_int_equal(mesh_send(c, "abc", 3, 0), 3);
	assert_int_equal(efd_take(ch->kick), 1);
	assert_int_equal(mesh_send_reserve(c, &buf, 0), SMALL_RING - 3);
	assert_int_equal(efd_take(ch->kick), 0); /* nothing published yet */
	memcpy(buf, "de", 2);
	assert_int_equal(mesh_send_commit(c, 2), 0);
	assert_int_equal(efd_take(ch->kick), 1);
	assert_int_equal(atomic_load(&ch->ctrl->tx_prod), 5);
	assert_memory_equal(ch->tx, "abcde", 5);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_send__meshd_polling__no_kick_until_it_stops(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	static uint8_t in[3000], out[3000];

	/* meshd says it polls the ring: publishing costs no system call. */
	atomic_store(&ch->ctrl->daemon_flags, MESH_DAEMON_POLLING);
	assert_int_equal(mesh_send(c, "abc", 3, 0), 3);
	assert_int_equal(atomic_load(&ch->ctrl->tx_prod), 3);
	assert_int_equal(efd_take(ch->kick), 0);
	fill_random(in, sizeof(in));
	ring_rx_put(ch, in, sizeof(in));
	assert_int_equal(mesh_recv(c, out, sizeof(out), 0), (ssize_t)sizeof(in)); /* > half */
	assert_int_equal(efd_take(ch->kick), 0);
	assert_int_equal(atomic_load(&ch->ctrl->rx_cons), sizeof(in));
	/* meshd goes to sleep: the next publication kicks again. */
	atomic_store(&ch->ctrl->daemon_flags, 0);
	assert_int_equal(mesh_send(c, "d", 1, 0), 1);
	assert_int_equal(efd_take(ch->kick), 1);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_recv__empty_ring_nonblock__eagain(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	const void *p;
	char b[16];

	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -EAGAIN);
	assert_int_equal(mesh_recv_peek(c, &p, MESH_NONBLOCK), -EAGAIN);
	assert_int_equal(mesh_close(c), 0);
}

/* mesh_channel_status passes on the spin budget a waiter should use (preload's waits use it):
 * meshd's hint, MESH_SPIN_US over it, capped against a hostile page. */
static void meshlib_channel_status__spin_budget__hint_env_and_cap(void **state)
{
	struct fake *f = *state;
	struct mesh_channel_status st;
	mesh_channel_t *c;

	f->spin_us = 120;
	c = open_small(f);
	assert_int_equal(mesh_channel_status(c, 0, &st), 0);
	assert_int_equal(st.spin_us, 120);
	assert_int_equal(mesh_close(c), 0);

	setenv("MESH_SPIN_US", "7", 1);
	c = open_small(f);
	assert_int_equal(mesh_channel_status(c, 0, &st), 0);
	assert_int_equal(st.spin_us, 7);
	assert_int_equal(mesh_close(c), 0);
	unsetenv("MESH_SPIN_US");

	f->spin_us = UINT32_MAX;
	c = open_small(f);
	assert_int_equal(mesh_channel_status(c, MESH_STATUS_ARM, &st), 0);
	assert_int_equal(st.spin_us, MESH_SPIN_MAX_US);
	assert_int_equal(mesh_close(c), 0);
}

struct slow_feed {
	struct fake_chan *ch;
	int n;
};

/* One byte every 5 ms: each of the reader's blocking waits lasts at least that. */
static void *feed_slowly(void *arg)
{
	struct slow_feed *sf = arg;

	for (int i = 0; i < sf->n; i++) {
		sleep_ms(5);
		ring_rx_put(sf->ch, "x", 1);
	}
	return NULL;
}

/* A reader whose waits outlast four spin budgets stops spinning (its CPU would only slow whoever
 * makes the answer); MESH_SPIN_US, when set, is kept as it is. Waits can only grow on a loaded
 * machine: 5 ms against a threshold of 480 us. */
static void meshlib_recv__waits_longer_than_the_spin__sleeps_at_once(void **state)
{
	struct fake *f = *state;
	struct mesh_channel_status st;
	struct slow_feed sf = {.n = 24};
	mesh_channel_t *c;
	pthread_t t;
	char b[4];

	for (int env = 0; env < 2; env++) {
		if (env)
			setenv("MESH_SPIN_US", "120", 1);
		f->spin_us = 120;
		c = open_small(f);
		assert_int_equal(mesh_channel_status(c, 0, &st), 0);
		assert_int_equal(st.spin_us, 120);
		sf.ch = &f->ch[f->nch - 1];
		assert_int_equal(pthread_create(&t, NULL, feed_slowly, &sf), 0);
		for (int i = 0; i < sf.n; i++)
			assert_int_equal(mesh_recv(c, b, 1, 0), 1);
		pthread_join(t, NULL);
		assert_int_equal(mesh_channel_status(c, 0, &st), 0);
		assert_int_equal(st.spin_us, env ? 120 : 0);
		assert_int_equal(mesh_close(c), 0);
		unsetenv("MESH_SPIN_US");
	}
}

static void meshlib_recv__partial__returns_what_is_there(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	char b[100];

	ring_rx_put(ch, "0123456789", 10);
	assert_int_equal(mesh_recv(c, b, 4, 0), 4);
	assert_memory_equal(b, "0123", 4);
	assert_int_equal(mesh_recv(c, b, sizeof(b), 0), 6);
	assert_memory_equal(b, "456789", 6);
	assert_int_equal(atomic_load(&ch->ctrl->rx_cons), 10);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -EAGAIN);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_recv__wrapped_data__copied_in_order_peek_stops_at_end(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	static uint8_t in[4000], out[4000];
	const void *p;

	fill_random(in, sizeof(in));
	ring_rx_put(ch, in, 3000);
	assert_int_equal(mesh_recv(c, out, sizeof(out), 0), 3000);
	ring_rx_put(ch, in, 4000); /* positions 3000..6999: wraps at 4096 */
	assert_int_equal(mesh_recv_peek(c, &p, 0), 1096);
	assert_memory_equal(p, in, 1096);
	assert_int_equal(mesh_recv_release(c, 96), 0);
	assert_int_equal(mesh_recv(c, out, sizeof(out), 0), 3904);
	assert_memory_equal(out, in + 96, 3904);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_recv__quarter_consumed__kicks_catching_up_below_a_quarter_does_not(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	static uint8_t in[4000], out[4000];

	fill_random(in, sizeof(in));
	ring_rx_put(ch, in, 4000);
	assert_int_equal(mesh_recv(c, out, 1000, 0), 1000);
	assert_int_equal(efd_take(ch->kick), 0);
	assert_int_equal(mesh_recv(c, out, 23, 0), 23);
	assert_int_equal(efd_take(ch->kick), 0);
	assert_int_equal(mesh_recv(c, out, 1, 0), 1); /* 1024 = a quarter */
	assert_int_equal(efd_take(ch->kick), 1);
	assert_int_equal(mesh_recv(c, out, 100, 0), 100);
	assert_int_equal(efd_take(ch->kick), 0);
	assert_int_equal(mesh_recv(c, out, sizeof(out), 0), 2876); /* caught up, 2976 since the kick */
	assert_int_equal(efd_take(ch->kick), 1);
	assert_int_equal(atomic_load(&ch->ctrl->rx_cons), 4000);
	/* A small message read to the end: meshd would not credit less than a quarter, so no kick. */
	ring_rx_put(ch, in, 64);
	assert_int_equal(mesh_recv(c, out, sizeof(out), 0), 64);
	assert_int_equal(efd_take(ch->kick), 0);
	assert_int_equal(atomic_load(&ch->ctrl->rx_cons), 4064);
	assert_int_equal(mesh_close(c), 0);
}

/* A sender with room (less than three quarters of the ring arrived since the last kick) is credited
 * per half ring: the reader kicks meshd for that, not for a quarter (ring.h mesh_ring_credit_step). */
static void meshlib_recv__sender_with_room__kicks_per_half_ring(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	static uint8_t in[2048], out[2048];

	fill_random(in, sizeof(in));
	ring_rx_put(ch, in, 2048);
	assert_int_equal(mesh_recv(c, out, 1024, 0), 1024); /* a quarter */
	assert_int_equal(efd_take(ch->kick), 0);
	assert_int_equal(mesh_recv(c, out, sizeof(out), 0), 1024); /* half */
	assert_int_equal(efd_take(ch->kick), 1);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_recv__peer_eof__bytes_then_zero(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	const void *p;
	char b[16];

	ring_rx_put(ch, "last", 4);
	ring_set_state(ch, MESH_STATE_PEER_EOF, 0);
	assert_int_equal(mesh_recv(c, b, 2, 0), 2);
	assert_int_equal(mesh_recv_peek(c, &p, 0), 2);
	assert_memory_equal(p, "st", 2);
	assert_int_equal(mesh_recv_release(c, 2), 0);
	assert_int_equal(mesh_recv(c, b, sizeof(b), 0), 0);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), 0);
	assert_int_equal(mesh_recv_peek(c, &p, 0), 0);
	/* The peer's EOF does not stop our side from sending. */
	assert_int_equal(mesh_send(c, "x", 1, 0), 1);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_recv__error_state__bytes_first_then_error(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	void *buf;
	char b[16];

	ring_rx_put(ch, "0123456789", 10);
	ring_set_state(ch, MESH_STATE_ERROR, -ECONNRESET);
	assert_int_equal(mesh_send(c, "x", 1, 0), -ECONNRESET);
	assert_int_equal(mesh_send_reserve(c, &buf, 0), -ECONNRESET);
	assert_int_equal(mesh_recv(c, b, 6, 0), 6);
	assert_int_equal(mesh_recv(c, b, sizeof(b), 0), 4);
	assert_memory_equal(b, "6789", 4);
	assert_int_equal(mesh_recv(c, b, sizeof(b), 0), -ECONNRESET);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -ECONNRESET);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_recv__error_value_not_negative_errno__eproto(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	char b[16];

	ring_set_state(ch, MESH_STATE_ERROR, 0);
	assert_int_equal(mesh_recv(c, b, sizeof(b), 0), -EPROTO);
	atomic_store(&ch->ctrl->error, 104);
	assert_int_equal(mesh_send(c, b, 1, 0), -EPROTO);
	atomic_store(&ch->ctrl->error, INT32_MIN);
	assert_int_equal(mesh_send(c, b, 1, 0), -EPROTO);
	atomic_store(&ch->ctrl->error, -MESH_EKEEPALIVE);
	assert_int_equal(mesh_send(c, b, 1, 0), -MESH_EKEEPALIVE);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_reserve__free_space__contiguous_to_ring_end(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	static uint8_t in[4000];
	void *buf;

	assert_int_equal(mesh_send_reserve(c, &buf, 0), SMALL_RING);
	assert_int_equal(mesh_send(c, in, 4000, 0), 4000); /* drops the reservation */
	assert_int_equal(mesh_send_commit(c, 1), -EINVAL);
	assert_int_equal(mesh_send_reserve(c, &buf, MESH_NONBLOCK), 96);
	ring_tx_take(ch, NULL, 3000);
	/* 96 bytes to the end of the area, although 3096 are free. */
	assert_int_equal(mesh_send_reserve(c, &buf, 0), 96);
	memset(buf, 'z', 96);
	assert_int_equal(mesh_send_commit(c, 96), 0);
	assert_int_equal(mesh_send_reserve(c, &buf, 0), 3000);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_commit__zero_beyond_reserved_or_twice__einval(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	void *buf;

	assert_int_equal(mesh_send_reserve(c, &buf, 0), SMALL_RING);
	assert_int_equal(mesh_send_commit(c, 0), -EINVAL);
	assert_int_equal(mesh_send_commit(c, SMALL_RING + 1), -EINVAL);
	assert_int_equal(ring_tx_pending(ch), 0);
	memset(buf, 'q', 10);
	assert_int_equal(mesh_send_commit(c, 10), 0);
	assert_int_equal(mesh_send_commit(c, 1), -EINVAL); /* the rest of the reservation lapsed */
	assert_int_equal(ring_tx_pending(ch), 10);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_release__zero_beyond_peeked_or_twice__einval(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	const void *p;
	char b[8];

	ring_rx_put(ch, "abcdef", 6);
	assert_int_equal(mesh_recv_peek(c, &p, 0), 6);
	assert_int_equal(mesh_recv_release(c, 0), -EINVAL);
	assert_int_equal(mesh_recv_release(c, 7), -EINVAL);
	assert_int_equal(mesh_recv_release(c, 2), 0);
	assert_int_equal(mesh_recv_release(c, 1), -EINVAL);
	assert_int_equal(mesh_recv_peek(c, &p, 0), 4);
	assert_memory_equal(p, "cdef", 4);
	assert_int_equal(mesh_recv(c, b, 1, 0), 1); /* drops the peek */
	assert_int_equal(mesh_recv_release(c, 1), -EINVAL);
	assert_int_equal(atomic_load(&ch->ctrl->rx_cons), 3);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_shutdown__flag_and_kick__later_sends_epipe(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	void *buf;
	char b[8];

	assert_int_equal(mesh_send_reserve(c, &buf, 0), SMALL_RING);
	assert_int_equal(mesh_shutdown(c), 0);
	assert_true(ring_app_flags(ch) & MESH_APP_SHUT_WR);
	assert_int_equal(efd_take(ch->kick), 1);
	assert_int_equal(mesh_send_commit(c, 1), -EPIPE);
	assert_int_equal(mesh_send(c, "x", 1, 0), -EPIPE);
	assert_int_equal(mesh_send_reserve(c, &buf, MESH_NONBLOCK), -EPIPE);
	assert_int_equal(mesh_shutdown(c), 0);
	assert_int_equal(ring_tx_pending(ch), 0);
	/* Receiving goes on. */
	ring_rx_put(ch, "in", 2);
	assert_int_equal(mesh_recv(c, b, sizeof(b), 0), 2);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_close__open_channel__shut_wr_set_and_lifeline_hangs_up(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c;
	struct fake_chan *ch;
	int before = fd_count();

	c = open_small(f);
	ch = &f->ch[0];
	assert_int_equal(mesh_send(c, "bye", 3, 0), 3);
	assert_false(fd_hung_up(ch->lifeline, 0));
	assert_int_equal(mesh_close(c), 0);
	assert_true(ring_app_flags(ch) & MESH_APP_SHUT_WR);
	assert_true(fd_hung_up(ch->lifeline, 0));
	/* What was published stays for meshd to send. */
	assert_int_equal(ring_tx_pending(ch), 3);
	fake_drop(f);
	assert_int_equal(fd_count(), before);
}

/* ---- hostile indices ---- */

static void meshlib_send__tx_cons_beyond_tx_prod__eproto_sticky(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	static uint8_t before[SMALL_RING];
	void *buf;
	char b[8];

	assert_int_equal(mesh_send(c, "abc", 3, 0), 3);
	memcpy(before, ch->tx, sizeof(before));
	atomic_store(&ch->ctrl->tx_cons, 4);
	assert_int_equal(mesh_send(c, "defg", 4, 0), -EPROTO);
	/* Sticky, on every path, even once the index looks sane again. */
	atomic_store(&ch->ctrl->tx_cons, 0);
	assert_int_equal(mesh_send(c, "defg", 4, MESH_NONBLOCK), -EPROTO);
	assert_int_equal(mesh_send_reserve(c, &buf, 0), -EPROTO);
	assert_int_equal(mesh_recv(c, b, sizeof(b), 0), -EPROTO);
	assert_memory_equal(ch->tx, before, sizeof(before));
	assert_int_equal(atomic_load(&ch->ctrl->tx_prod), 3);
	atomic_store(&ch->ctrl->tx_cons, UINT64_MAX);
	assert_int_equal(mesh_send(c, "x", 1, 0), -EPROTO);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_send__tx_cons_backwards__eproto(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	static uint8_t in[SMALL_RING];

	assert_int_equal(mesh_send(c, in, 1000, 0), 1000);
	ring_tx_take(ch, NULL, 600);
	assert_int_equal(mesh_send(c, in, SMALL_RING, 0), 3696);
	atomic_store(&ch->ctrl->tx_cons, 500); /* it was 600 */
	assert_int_equal(mesh_send(c, in, 1, MESH_NONBLOCK), -EPROTO);
	assert_int_equal(atomic_load(&ch->ctrl->tx_prod), 4696);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_recv__rx_prod_beyond_window__eproto_nothing_copied(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	static uint8_t out[3 * SMALL_RING];
	const void *p = NULL;

	ring_rx_put(ch, "abc", 3);
	assert_int_equal(mesh_recv(c, out, 1, 0), 1);
	memset(out, 0x5a, sizeof(out));
	atomic_store(&ch->ctrl->rx_prod, 1 + SMALL_RING + 1); /* rx_cons + size + 1 */
	assert_int_equal(mesh_recv(c, out, sizeof(out), 0), -EPROTO);
	for (size_t i = 0; i < sizeof(out); i++)
		assert_int_equal(out[i], 0x5a);
	assert_int_equal(mesh_recv_peek(c, &p, 0), -EPROTO);
	assert_null(p);
	assert_int_equal(atomic_load(&ch->ctrl->rx_cons), 1);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_recv__rx_prod_huge_or_backwards__eproto(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c;
	struct fake_chan *ch;
	const void *p = NULL;
	char b[8];

	c = open_small(f);
	ch = &f->ch[0];
	atomic_store(&ch->ctrl->rx_prod, UINT64_MAX);
	assert_int_equal(mesh_recv_peek(c, &p, MESH_NONBLOCK), -EPROTO);
	assert_null(p);
	assert_int_equal(mesh_close(c), 0);

	c = open_small(f);
	ch = &f->ch[1];
	ring_rx_put(ch, "abcdef", 6);
	assert_int_equal(mesh_recv(c, b, 2, 0), 2);
	atomic_store(&ch->ctrl->rx_prod, 4); /* it was 6, and never goes back */
	assert_int_equal(mesh_recv(c, b, sizeof(b), 0), -EPROTO);
	assert_int_equal(mesh_close(c), 0);
}

/* ---- direct receive (ring.h: the peer's NIC writes a pair after the data it covers) ---- */

/* The peer's bytes land at pos, and then its pair {end, check} (check_ok false: read half landed). */
static void direct_put(struct fake_chan *ch, uint64_t pos, const void *data, size_t len, uint64_t end, bool check_ok)
{
	struct mesh_ring_direct *d = mesh_ring_direct(ch->ctrl);

	ring_copy(ch->rx, ch->size, pos, (uint8_t *)data, len, true);
	atomic_store_explicit(&d->pos, end, memory_order_release);
	atomic_store_explicit(&d->check, mesh_ring_direct_check(end) ^ (check_ok ? 0 : 1), memory_order_release);
}

static void meshlib_recv__valid_direct_pair__bytes_before_meshd_publishes(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	char b[16];

	direct_put(ch, 0, "hello", 5, 5, true);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), 5);
	assert_memory_equal(b, "hello", 5);
	assert_int_equal(atomic_load(&ch->ctrl->rx_cons), 5);
	/* meshd's rx_prod lags, then catches up: neither is going back. */
	atomic_store(&ch->ctrl->rx_prod, 3);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -EAGAIN);
	atomic_store(&ch->ctrl->rx_prod, 5);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -EAGAIN);
	/* meshd's own path goes on from there. */
	ring_rx_put(ch, " world", 6);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), 6);
	assert_memory_equal(b, " world", 6);
	/* meshd's rx_prod going back below its own last value is still its error. */
	atomic_store(&ch->ctrl->rx_prod, 10);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -EPROTO);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_recv__torn_stale_or_far_direct_pair__ignored(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	char b[16];

	/* Read while it landed: the check does not match. */
	direct_put(ch, 0, "abcd", 4, 4, false);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -EAGAIN);
	/* More than a ring ahead of the reader: not a position a sender may write. */
	direct_put(ch, 0, "abcd", 4, SMALL_RING + 1, true);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -EAGAIN);
	assert_int_equal(atomic_load(&ch->ctrl->rx_cons), 0);
	/* A valid one is taken; an older one after it (a resume writes again from meshd's own
	 * position) changes nothing. */
	direct_put(ch, 0, "abcd", 4, 4, true);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), 4);
	direct_put(ch, 2, "cd", 2, 2, true);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -EAGAIN);
	assert_int_equal(atomic_load(&ch->ctrl->rx_cons), 4);
	assert_int_equal(mesh_close(c), 0);
}

/* ---- waiting ---- */

/* Waits (bounded) until the application sleeps with MESH_APP_WAITING set. */
static bool wait_for_waiting(struct fake_chan *ch)
{
	for (int i = 0; i < 10000; i++) {
		if (ring_app_flags(ch) & MESH_APP_WAITING)
			return true;
		sleep_ms(1);
	}
	return false;
}

struct later {
	struct fake_chan *ch;
	bool saw_waiting;
	enum { LATER_DATA, LATER_SPACE, LATER_HANGUP, LATER_EOF } what;
};

static void *act_later(void *arg)
{
	struct later *l = arg;

	l->saw_waiting = wait_for_waiting(l->ch);
	sleep_ms(20); /* the application is in poll() by now, most likely */
	switch (l->what) {
	case LATER_DATA:
		ring_rx_put(l->ch, "wake", 4);
		break;
	case LATER_SPACE:
		ring_tx_take(l->ch, NULL, 1000);
		break;
	case LATER_EOF:
		ring_set_state(l->ch, MESH_STATE_PEER_EOF, 0);
		break;
	case LATER_HANGUP:
		close(l->ch->lifeline);
		l->ch->lifeline = -1;
		break;
	}
	return NULL;
}

static void meshlib_recv__blocking__sleeps_waiting_until_woken(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct later l = {.ch = &f->ch[0], .what = LATER_DATA};
	pthread_t t;
	char b[16];

	assert_int_equal(pthread_create(&t, NULL, act_later, &l), 0);
	assert_int_equal(mesh_recv(c, b, sizeof(b), 0), 4);
	pthread_join(t, NULL);
	assert_true(l.saw_waiting);
	assert_memory_equal(b, "wake", 4);
	assert_false(ring_app_flags(l.ch) & MESH_APP_WAITING);

	l.what = LATER_EOF;
	assert_int_equal(pthread_create(&t, NULL, act_later, &l), 0);
	assert_int_equal(mesh_recv(c, b, sizeof(b), 0), 0);
	pthread_join(t, NULL);
	assert_true(l.saw_waiting);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_send__blocking_full_ring__sleeps_until_space(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct later l = {.ch = &f->ch[0], .what = LATER_SPACE};
	static uint8_t in[2 * SMALL_RING];
	void *buf;
	pthread_t t;

	fill_random(in, sizeof(in));
	assert_int_equal(mesh_send(c, in, sizeof(in), 0), SMALL_RING);
	assert_int_equal(pthread_create(&t, NULL, act_later, &l), 0);
	assert_int_equal(mesh_send(c, in, sizeof(in), 0), 1000);
	pthread_join(t, NULL);
	assert_true(l.saw_waiting);
	assert_int_equal(pthread_create(&t, NULL, act_later, &l), 0);
	assert_int_equal(mesh_send_reserve(c, &buf, 0), 1000);
	pthread_join(t, NULL);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_recv__meshd_dies_while_blocked__meshd_gone(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct later l = {.ch = &f->ch[0], .what = LATER_HANGUP};
	pthread_t t;
	char b[16];

	assert_int_equal(pthread_create(&t, NULL, act_later, &l), 0);
	assert_int_equal(mesh_recv(c, b, sizeof(b), 0), -MESH_EMESHDGONE);
	pthread_join(t, NULL);
	assert_true(l.saw_waiting);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -MESH_EMESHDGONE);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_send__meshd_dies_while_blocked__meshd_gone(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct later l = {.ch = &f->ch[0], .what = LATER_HANGUP};
	static uint8_t in[SMALL_RING];
	pthread_t t;

	assert_int_equal(mesh_send(c, in, sizeof(in), 0), SMALL_RING);
	assert_int_equal(pthread_create(&t, NULL, act_later, &l), 0);
	assert_int_equal(mesh_send(c, in, 1, 0), -MESH_EMESHDGONE);
	pthread_join(t, NULL);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_recv__meshd_gone_nonblock__bytes_then_meshd_gone(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	char b[16];

	ring_rx_put(ch, "left", 4);
	close(ch->lifeline);
	ch->lifeline = -1;
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), 4);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -MESH_EMESHDGONE);
	assert_int_equal(mesh_recv(c, b, sizeof(b), 0), -MESH_EMESHDGONE);
	assert_int_equal(mesh_close(c), 0);
}

static void meshlib_channel_fd__wake_and_hangup__readable_waiting_kept(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	char b[16];
	int fd;

	fd = mesh_channel_fd(c);
	assert_true(fd >= 0);
	assert_int_equal(mesh_channel_fd(c), fd);
	assert_true(ring_app_flags(ch) & MESH_APP_WAITING);
	assert_false(fd_readable(fd, 0));

	ring_rx_put(ch, "ping", 4); /* wakes: the flag is set */
	assert_true(fd_readable(fd, 1000));
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), 4);
	/* Calling until -EAGAIN clears the fd. */
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -EAGAIN);
	assert_false(fd_readable(fd, 0));
	assert_true(ring_app_flags(ch) & MESH_APP_WAITING);

	/* A blocking call keeps the flag too. */
	ring_rx_put(ch, "pong", 4);
	assert_int_equal(mesh_recv(c, b, sizeof(b), 0), 4);
	assert_true(ring_app_flags(ch) & MESH_APP_WAITING);

	/* Space freed wakes it as well. */
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -EAGAIN);
	assert_int_equal(mesh_send(c, "abc", 3, 0), 3);
	assert_false(fd_readable(fd, 0));
	ring_tx_take(ch, NULL, 3);
	assert_true(fd_readable(fd, 1000));
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -EAGAIN);
	assert_false(fd_readable(fd, 0));

	/* meshd dies: the fd becomes readable and the calls say so. */
	close(ch->lifeline);
	ch->lifeline = -1;
	assert_true(fd_readable(fd, 1000));
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -MESH_EMESHDGONE);
	assert_int_equal(mesh_close(c), 0);
}

/* A writer that waits for room on the channel fd, the supported way (mesh.h, libmesh(3)): it polls
 * for POLLIN ("changed"), asks mesh_channel_status with MESH_STATUS_ARM whether MESH_READY_SEND, and
 * writes when told. The fd is an epoll set: it never reports POLLOUT, full ring or not, so a wait
 * for POLLOUT alone would sleep until its timeout. */
static void meshlib_channel_fd__writer_waits_for_room__pollin_then_ready_send_never_pollout(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	static char fill[SMALL_RING], got[SMALL_RING];
	struct mesh_channel_status st;
	struct pollfd p;
	size_t sent = 0;
	int fd = mesh_channel_fd(c);

	assert_true(fd >= 0);
	for (size_t i = 0; i < sizeof(fill); i++)
		fill[i] = (char)(i * 7 + 1);
	/* Room: the status says so at once; the fd itself says nothing of it. */
	assert_int_equal(mesh_channel_status(c, MESH_STATUS_ARM, &st), 0);
	assert_true(st.ready & MESH_READY_SEND);
	p = (struct pollfd){.fd = fd, .events = POLLOUT};
	assert_int_equal(poll(&p, 1, 0), 0);
	/* Fill the ring, the writer's loop: write while MESH_READY_SEND. */
	while (mesh_channel_status(c, MESH_STATUS_ARM, &st) == 0 && (st.ready & MESH_READY_SEND)) {
		ssize_t n = mesh_send(c, fill + sent, sizeof(fill) - sent, MESH_NONBLOCK);

		assert_true(n > 0);
		sent += (size_t)n;
	}
	assert_int_equal(sent, SMALL_RING);
	assert_int_equal(st.tx_free, 0);
	p = (struct pollfd){.fd = fd, .events = POLLIN | POLLOUT};
	assert_int_equal(poll(&p, 1, 0), 0);
	/* meshd sends 1000 bytes: the fd turns readable (POLLIN), never POLLOUT, and the status has the room. */
	ring_tx_take(ch, got, 1000);
	assert_memory_equal(got, fill, 1000);
	p = (struct pollfd){.fd = fd, .events = POLLIN | POLLOUT};
	assert_int_equal(poll(&p, 1, 5000), 1);
	assert_int_equal(p.revents, POLLIN);
	assert_int_equal(mesh_channel_status(c, MESH_STATUS_ARM, &st), 0);
	assert_true(st.ready & MESH_READY_SEND);
	assert_int_equal(st.tx_free, 1000);
	assert_int_equal(mesh_send(c, fill, 1000, MESH_NONBLOCK), 1000);
	/* Full again, and armed: nothing until meshd moves. */
	assert_int_equal(mesh_channel_status(c, MESH_STATUS_ARM, &st), 0);
	assert_false(st.ready & MESH_READY_SEND);
	assert_false(fd_readable(fd, 0));
	assert_int_equal(mesh_close(c), 0);
}

/* What meshd published while the application had not asked for the fd yet found MESH_APP_WAITING
 * clear and woke no one: the fd must be readable as soon as it is asked for. A consumer that first
 * asked once it had sent and read everything waited 10 s for an EOF that had come (the sanitizer
 * build's install_consumers, about one run in 20). */
static void meshlib_channel_fd__published_before_asked__readable_at_once(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	static char fill[SMALL_RING];
	char b[16];
	int fd;

	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -EAGAIN);
	assert_false(ring_app_flags(ch) & MESH_APP_WAITING);
	ring_rx_put(ch, "last", 4); /* nobody waits: no wake */
	ring_set_state(ch, MESH_STATE_PEER_EOF, 0);
	fd = mesh_channel_fd(c);
	assert_true(fd >= 0);
	assert_true(fd_readable(fd, 0));
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), 4);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), 0);
	assert_int_equal(mesh_close(c), 0);

	/* Space freed the same way. */
	c = open_small(f);
	ch = &f->ch[f->nch - 1];
	assert_int_equal(mesh_send(c, fill, sizeof(fill), MESH_NONBLOCK), (ssize_t)sizeof(fill));
	assert_int_equal(mesh_send(c, "x", 1, MESH_NONBLOCK), -EAGAIN);
	ring_tx_take(ch, NULL, 8); /* nobody waits: no wake */
	fd = mesh_channel_fd(c);
	assert_true(fd_readable(fd, 0));
	assert_int_equal(mesh_send(c, "x", 1, MESH_NONBLOCK), 1);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), -EAGAIN); /* clears it */
	assert_false(fd_readable(fd, 0));
	assert_int_equal(mesh_close(c), 0);
}

/* Which of the two edge-triggered registrations (1: the reader's, 2: the writer's) epoll reports now. */
static unsigned et_events(int ep)
{
	struct epoll_event evs[4];
	unsigned got = 0;
	int n = epoll_wait(ep, evs, 4, 0);

	for (int i = 0; i < n; i++)
		got |= evs[i].data.u32;
	return got;
}

/* The Go binding's two waiters: a reader and a writer sleep on duplicates of the channel fd in one
 * edge-triggered poller. A writer that finds no space must not clear the fd (as a MESH_NONBLOCK call
 * returning -EAGAIN does): that took the reader's change, both ends of a two-way stream slept
 * until their deadlines (CI, TestConcurrentReadWrite). With MESH_STATUS_EDGE nothing is cleared and
 * every change is an edge for both, cleared or not. */
static void meshlib_channel_status__edge_two_waiters__writer_leaves_reader_its_wake(void **state)
{
	struct fake *f = *state;
	mesh_channel_t *c = open_small(f);
	struct fake_chan *ch = &f->ch[0];
	struct mesh_channel_status st;
	static char fill[SMALL_RING];
	char b[16];
	int fd, ep, rd, wr;

	fd = mesh_channel_fd(c);
	assert_true(fd >= 0);
	ep = epoll_create1(EPOLL_CLOEXEC);
	rd = dup(fd);
	wr = dup(fd);
	assert_true(ep >= 0 && rd >= 0 && wr >= 0);
	assert_int_equal(epoll_ctl(ep, EPOLL_CTL_ADD, rd, &(struct epoll_event){.events = EPOLLIN | EPOLLET, .data.u32 = 1}), 0);
	assert_int_equal(epoll_ctl(ep, EPOLL_CTL_ADD, wr, &(struct epoll_event){.events = EPOLLIN | EPOLLET, .data.u32 = 2}), 0);
	assert_int_equal(mesh_send(c, fill, sizeof(fill), MESH_NONBLOCK), (ssize_t)sizeof(fill)); /* TX full */
	et_events(ep);

	/* Bytes arrive; the writer looks before the poller ran: not ready, and nothing cleared. */
	ring_rx_put(ch, "ping", 4);
	assert_int_equal(mesh_channel_status(c, MESH_STATUS_EDGE, &st), 0);
	assert_false(st.ready & MESH_READY_SEND);
	assert_true(st.ready & MESH_READY_RECV);
	assert_int_equal(et_events(ep), 1 | 2); /* the reader's edge is there */
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), 4);

	/* A MESH_NONBLOCK call that waits clears the fd: the reader's next change is lost that way,
	 * which is why the waiters above never make one. */
	ring_rx_put(ch, "pong", 4);
	assert_int_equal(mesh_send(c, "x", 1, MESH_NONBLOCK), -EAGAIN);
	assert_int_equal(et_events(ep), 0);
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), 4);

	/* With the fd left readable every later change is a new edge for both: space freed, bytes. */
	ring_rx_put(ch, "x", 1);
	assert_int_equal(et_events(ep), 1 | 2);
	assert_int_equal(mesh_channel_status(c, MESH_STATUS_EDGE, &st), 0);
	ring_tx_take(ch, NULL, 100);
	assert_int_equal(et_events(ep), 1 | 2);
	assert_int_equal(mesh_channel_status(c, MESH_STATUS_EDGE, &st), 0);
	assert_true(st.ready & MESH_READY_SEND);
	assert_int_equal(st.tx_free, 100);
	ring_rx_put(ch, "y", 1);
	assert_int_equal(et_events(ep), 1 | 2);

	/* ARM and EDGE contradict each other. */
	assert_int_equal(mesh_channel_status(c, MESH_STATUS_ARM | MESH_STATUS_EDGE, &st), -EINVAL);

	/* meshd dies: an edge, and EDGE's look finds it (a look without flags makes no system call). */
	assert_int_equal(mesh_recv(c, b, sizeof(b), MESH_NONBLOCK), 2);
	ring_tx_take(ch, NULL, SMALL_RING - 100); /* nothing left to send, nothing to read */
	et_events(ep);
	close(ch->lifeline);
	ch->lifeline = -1;
	assert_true(et_events(ep) & 1);
	assert_int_equal(mesh_channel_status(c, 0, &st), 0);
	assert_false(st.ready & MESH_READY_ERROR);
	assert_int_equal(mesh_channel_status(c, MESH_STATUS_EDGE, &st), 0);
	assert_true(st.ready & MESH_READY_ERROR);
	assert_int_equal(st.error, -MESH_EMESHDGONE);
	close(rd);
	close(wr);
	close(ep);
	assert_int_equal(mesh_close(c), 0);
}

/* ---- loopback: the fake daemon copies TX into RX ---- */

#define LOOP_TOTAL ((1u << 20) + 12345u)

static mesh_channel_t *open_loopback(struct fake *f)
{
	struct mesh_channel_opts o = small_opts();
	mesh_channel_t *c = NULL;

	f->loopback = true;
	fake_serve(f); /* the thread stays on as the daemon until fake_join */
	assert_int_equal(mesh_connect(f->s, PEER_NODE, PEER_PORT, &o, &c), 0);
	return c;
}

static void meshlib_send_recv__loopback_odd_sizes_over_1mib__round_trip_intact(void **state)
{
	struct fake *f = *state;
	uint8_t *in = malloc(LOOP_TOTAL), *out = malloc(LOOP_TOTAL);
	size_t sent = 0, got = 0, i = 0;
	mesh_channel_t *c;
	ssize_t n;

	assert_non_null(in);
	assert_non_null(out);
	fill_random(in, LOOP_TOTAL);
	c = open_loopback(f);
	while (got < LOOP_TOTAL) {
		/* Odd sizes up to a little more than the ring; at most 2 rings minus one in flight, so a
		 * blocking send always finds the daemon able to move bytes. */
		size_t msg = 1 + (i++ * 7919u) % 5003u;
		size_t room = 2 * SMALL_RING - 1 - (sent - got);

		if (msg > room)
			msg = room;
		if (msg > LOOP_TOTAL - sent)
			msg = LOOP_TOTAL - sent;
		if (msg) {
			n = mesh_send(c, in + sent, msg, 0);
			assert_true(n > 0 && (size_t)n <= msg);
			sent += (size_t)n;
		}
		n = mesh_recv(c, out + got, 1 + (i * 104729u) % 3001u, (i & 1) ? MESH_NONBLOCK : 0);
		if (n == -EAGAIN)
			continue;
		assert_true(n > 0);
		got += (size_t)n;
	}
	assert_memory_equal(in, out, LOOP_TOTAL);
	/* Shut down: the loopback turns it into our own EOF, after every byte. */
	assert_int_equal(mesh_send(c, "end", 3, 0), 3);
	assert_int_equal(mesh_shutdown(c), 0);
	assert_int_equal(mesh_recv(c, out, 3, 0), 3);
	assert_memory_equal(out, "end", 3);
	assert_int_equal(mesh_recv(c, out, 16, 0), 0);
	assert_int_equal(mesh_close(c), 0);
	fake_join(f);
	free(in);
	free(out);
}

/* One reader thread and one writer thread on one channel (mesh.h: allowed since 0.5), as with a
 * socket: every call blocking, through a 4 KiB ring so that both sleep often, each waiting for the
 * other's side of the loopback. A lost wake-up (one thread clearing the flag or the wake the other
 * sleeps on) would stall them: the main thread gives them a minute and names the side that stuck. */
#define DUPLEX_TOTAL (4u << 20)

struct duplex {
	mesh_channel_t *c;
	const uint8_t *in;
	uint8_t *out;
	size_t moved;
	ssize_t err; /* the first failure, 0 none */
	bool done;
};

static void *duplex_writer(void *arg)
{
	struct duplex *d = arg;

	for (size_t i = 0; d->moved < DUPLEX_TOTAL; i++) {
		size_t msg = 1 + (i * 7919u) % 6007u;
		ssize_t n;

		if (msg > DUPLEX_TOTAL - d->moved)
			msg = DUPLEX_TOTAL - d->moved;
		if (i % 3 == 2) {
			void *buf;

			n = mesh_send_reserve(d->c, &buf, 0);
			if (n > 0) {
				n = n < (ssize_t)msg ? n : (ssize_t)msg;
				memcpy(buf, d->in + d->moved, (size_t)n);
				if (mesh_send_commit(d->c, (size_t)n))
					n = -EIO;
			}
		} else {
			n = mesh_send(d->c, d->in + d->moved, msg, 0);
		}
		if (n <= 0) {
			d->err = n ? n : -EIO;
			break;
		}
		d->moved += (size_t)n;
	}
	if (!d->err)
		d->err = mesh_shutdown(d->c);
	__atomic_store_n(&d->done, true, __ATOMIC_RELEASE);
	return NULL;
}

static void *duplex_reader(void *arg)
{
	struct duplex *d = arg;

	for (size_t i = 0;; i++) {
		ssize_t n;

		if (i % 2) {
			const void *buf;

			n = mesh_recv_peek(d->c, &buf, 0);
			if (n > 0 && d->moved + (size_t)n <= DUPLEX_TOTAL) {
				memcpy(d->out + d->moved, buf, (size_t)n);
				if (mesh_recv_release(d->c, (size_t)n))
					n = -EIO;
			}
		} else {
			size_t want = 1 + (i * 104729u) % 5003u;

			if (want > DUPLEX_TOTAL - d->moved)
				want = DUPLEX_TOTAL - d->moved + 1; /* room for the EOF's 0 */
			n = mesh_recv(d->c, d->out + d->moved, want, 0);
		}
		if (n == 0)
			break;
		if (n < 0 || d->moved + (size_t)n > DUPLEX_TOTAL) {
			d->err = n < 0 ? n : -EPROTO;
			break;
		}
		d->moved += (size_t)n;
	}
	__atomic_store_n(&d->done, true, __ATOMIC_RELEASE);
	return NULL;
}

static void duplex_run(struct fake *f, uint32_t spin_us)
{
	uint8_t *in = malloc(DUPLEX_TOTAL), *out = malloc(DUPLEX_TOTAL);
	struct duplex w = {0}, r = {0};
	pthread_t tw, tr;
	uint64_t t0;

	assert_non_null(in);
	assert_non_null(out);
	fill_random(in, DUPLEX_TOTAL);
	f->spin_us = spin_us;
	w.c = r.c = open_loopback(f);
	w.in = in;
	r.out = out;
	assert_int_equal(pthread_create(&tr, NULL, duplex_reader, &r), 0);
	assert_int_equal(pthread_create(&tw, NULL, duplex_writer, &w), 0);
	t0 = now_ms();
	while (!(__atomic_load_n(&w.done, __ATOMIC_ACQUIRE) && __atomic_load_n(&r.done, __ATOMIC_ACQUIRE))) {
		if (now_ms() - t0 > 60000)
			fail_msg("stalled after a minute: writer %s at %zu, reader %s at %zu of %u bytes (a lost wake-up)",
				 w.done ? "done" : "waiting", w.moved, r.done ? "done" : "waiting", r.moved, DUPLEX_TOTAL);
		sleep_ms(10);
	}
	pthread_join(tw, NULL);
	pthread_join(tr, NULL);
	assert_int_equal(w.err, 0);
	assert_int_equal(r.err, 0);
	assert_int_equal(w.moved, DUPLEX_TOTAL);
	assert_int_equal(r.moved, DUPLEX_TOTAL);
	assert_memory_equal(in, out, DUPLEX_TOTAL);
	assert_int_equal(mesh_close(w.c), 0);
	fake_join(f);
	free(in);
	free(out);
}

/* Both sleep at once, at every turn (no spin budget). */
static void meshlib_send_recv__reader_and_writer_threads__loopback_intact_no_stall(void **state)
{
	duplex_run(*state, 0);
}

/* The same with a spin budget: each polls its ring (under the channel's lock, a look at a time)
 * before it sleeps. */
static void meshlib_send_recv__reader_and_writer_threads_spinning__loopback_intact_no_stall(void **state)
{
	duplex_run(*state, 50);
}

static void meshlib_reserve_peek__loopback_zero_copy__round_trip_intact(void **state)
{
	struct fake *f = *state;
	uint8_t *in = malloc(LOOP_TOTAL), *out = malloc(LOOP_TOTAL);
	size_t sent = 0, got = 0, i = 0;
	mesh_channel_t *c;
	const void *p;
	void *buf;
	ssize_t n;

	assert_non_null(in);
	assert_non_null(out);
	fill_random(in, LOOP_TOTAL);
	c = open_loopback(f);
	while (got < LOOP_TOTAL) {
		size_t msg = 1 + (i++ * 6007u) % 2999u;

		if (sent < LOOP_TOTAL && sent - got < 2 * SMALL_RING - 1) {
			n = mesh_send_reserve(c, &buf, 0);
			assert_true(n > 0);
			if (msg > (size_t)n)
				msg = (size_t)n;
			if (msg > LOOP_TOTAL - sent)
				msg = LOOP_TOTAL - sent;
			if (msg > 2 * SMALL_RING - 1 - (sent - got))
				msg = 2 * SMALL_RING - 1 - (sent - got);
			memcpy(buf, in + sent, msg);
			assert_int_equal(mesh_send_commit(c, msg), 0);
			sent += msg;
		}
		n = mesh_recv_peek(c, &p, 0);
		assert_true(n > 0);
		if ((size_t)n > 1 + (i * 31u) % 1500u)
			n = (ssize_t)(1 + (i * 31u) % 1500u);
		memcpy(out + got, p, (size_t)n);
		assert_int_equal(mesh_recv_release(c, (size_t)n), 0);
		got += (size_t)n;
	}
	assert_memory_equal(in, out, LOOP_TOTAL);
	assert_int_equal(mesh_close(c), 0);
	fake_join(f);
	free(in);
	free(out);
}

/* ---- the tools, as child processes ---- */

/* Runs a tool with stdin from in_path and stdout to out_path; returns the child's pid. */
static pid_t tool_start(const char *const argv[], const char *in_path, const char *out_path)
{
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		int in = open(in_path, O_RDONLY), out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

		if (in < 0 || out < 0 || dup2(in, 0) < 0 || dup2(out, 1) < 0)
			_exit(127);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid;
}

static int tool_wait(pid_t pid)
{
	int st;

	assert_int_equal(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void write_file(const char *path, const void *data, size_t len)
{
	FILE *fp = fopen(path, "wb");

	assert_non_null(fp);
	assert_int_equal(fwrite(data, 1, len, fp), len);
	assert_int_equal(fclose(fp), 0);
}

static uint8_t *read_file(const char *path, size_t *len)
{
	FILE *fp = fopen(path, "rb");
	uint8_t *buf;
	long n;

	assert_non_null(fp);
	fseek(fp, 0, SEEK_END);
	n = ftell(fp);
	fseek(fp, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
	fclose(fp);
	*len = (size_t)n;
	return buf;
}

/* Plays the peer behind meshd on each channel: feeds in[] into RX as room allows, then EOF;
 * collects TX into out[]; until every application closed its channel (lifeline hang-up). */
struct peer_job {
	struct fake_chan *ch;
	const uint8_t *in;
	size_t in_len, fed;
	uint8_t *out;
	size_t out_cap, out_len;
	bool eof_sent, closed;
};

static void peer_run(struct peer_job *jobs, int n)
{
	uint64_t deadline = now_ms() + 60000;
	int open = n;

	while (open && now_ms() < deadline) {
		struct pollfd p[2 * FAKE_CHANS];

		for (int i = 0; i < n; i++) {
			p[2 * i] = (struct pollfd){.fd = jobs[i].closed ? -1 : jobs[i].ch->kick, .events = POLLIN};
			p[2 * i + 1] = (struct pollfd){.fd = jobs[i].closed ? -1 : jobs[i].ch->lifeline, .events = 0};
		}
		poll(p, (nfds_t)(2 * n), 100);
		for (int i = 0; i < n; i++) {
			struct peer_job *j = &jobs[i];
			uint64_t room, pend;

			if (j->closed)
				continue;
			efd_take(j->ch->kick);
			room = ring_rx_room(j->ch);
			if (j->fed < j->in_len && room) {
				size_t m = j->in_len - j->fed < room ? j->in_len - j->fed : (size_t)room;

				ring_rx_put(j->ch, j->in + j->fed, m);
				j->fed += m;
			}
			if (j->fed == j->in_len && !j->eof_sent) {
				ring_set_state(j->ch, MESH_STATE_PEER_EOF, 0);
				j->eof_sent = true;
			}
			pend = ring_tx_pending(j->ch);
			if (pend) {
				assert_true(j->out_len + pend <= j->out_cap);
				ring_tx_take(j->ch, j->out + j->out_len, (size_t)pend);
				j->out_len += (size_t)pend;
			}
			if (p[2 * i + 1].revents & POLLHUP) {
				j->closed = true;
				open--;
			}
		}
	}
	assert_int_equal(open, 0);
}

#define TOOL_BYTES (300u * 1000u + 7u)

static void meshlib_meshcat__connect_loopback__stdin_comes_back_exit_0(void **state)
{
	struct fake *f = *state;
	char in_path[128], out_path[128];
	uint8_t *in = malloc(TOOL_BYTES), *out;
	size_t out_len;
	pid_t pid;

	assert_non_null(in);
	fill_random(in, TOOL_BYTES);
	snprintf(in_path, sizeof(in_path), "%s/in", f->dir);
	snprintf(out_path, sizeof(out_path), "%s/out", f->dir);
	write_file(in_path, in, TOOL_BYTES);
	f->loopback = true;
	fake_serve(f);
	pid = tool_start((const char *const[]){MESHCAT_PATH, "-s", f->path, "-r", "4K", "-q", "2", "3", "4242", NULL},
			 in_path, out_path);
	assert_int_equal(tool_wait(pid), 0);
	fake_join(f);
	assert_int_equal(f->req.node, 3);
	assert_int_equal(f->req.port, 4242);
	assert_int_equal(f->req.ring_size, 4096);
	assert_int_equal(f->req.qps, 2);
	out = read_file(out_path, &out_len);
	assert_int_equal(out_len, TOOL_BYTES);
	assert_memory_equal(in, out, TOOL_BYTES);
	unlink(in_path);
	unlink(out_path);
	free(in);
	free(out);
}

static void meshlib_meshcat__listen__channel_to_stdout_exit_0(void **state)
{
	struct fake *f = *state;
	char in_path[128], out_path[128];
	uint8_t *in = malloc(TOOL_BYTES), *out;
	struct peer_job job = {0};
	size_t out_len;
	pid_t pid;

	assert_non_null(in);
	fill_random(in, TOOL_BYTES);
	snprintf(in_path, sizeof(in_path), "%s/in", f->dir);
	snprintf(out_path, sizeof(out_path), "%s/out", f->dir);
	write_file(in_path, "", 0);
	fake_serve(f);
	pid = tool_start((const char *const[]){MESHCAT_PATH, "-s", f->path, "-l", "5000", NULL}, in_path, out_path);
	fake_join(f);
	assert_int_equal(f->req.op, CTL_OP__CTL_OP_LISTEN);
	assert_int_equal(f->req.port, 5000);
	fake_answer(f, f->conn, true, SMALL_RING);
	job = (struct peer_job){.ch = &f->ch[0], .in = in, .in_len = TOOL_BYTES};
	peer_run(&job, 1);
	assert_int_equal(tool_wait(pid), 0);
	assert_int_equal(job.out_len, 0);
	out = read_file(out_path, &out_len);
	assert_int_equal(out_len, TOOL_BYTES);
	assert_memory_equal(in, out, TOOL_BYTES);
	unlink(in_path);
	unlink(out_path);
	free(in);
	free(out);
}

static void meshlib_meshcat__no_meshd_or_bad_usage__exit_2_or_1(void **state)
{
	struct fake *f = *state;
	char in_path[128], out_path[128];

	snprintf(in_path, sizeof(in_path), "%s/in", f->dir);
	snprintf(out_path, sizeof(out_path), "%s/out", f->dir);
	write_file(in_path, "x", 1);
	assert_int_equal(tool_wait(tool_start((const char *const[]){MESHCAT_PATH, "-s", "/nonexistent/sock", "1", "2",
								   NULL},
					      in_path, out_path)),
			 2);
	assert_int_equal(tool_wait(tool_start((const char *const[]){MESHCAT_PATH, "-r", "3000", "1", "2", NULL},
					      in_path, out_path)),
			 1);
	assert_int_equal(tool_wait(tool_start((const char *const[]){MESHCAT_PATH, "--help", NULL}, in_path, out_path)),
			 0);
	unlink(in_path);
	unlink(out_path);
}

static void meshlib_meshecho__two_channels_at_once__echoed_then_closed_exit_0(void **state)
{
	struct fake *f = *state;
	char in_path[128], out_path[128];
	uint8_t *in = malloc(2 * TOOL_BYTES), *out = malloc(2 * TOOL_BYTES);
	struct peer_job jobs[2];
	pid_t pid;

	assert_non_null(in);
	assert_non_null(out);
	fill_random(in, 2 * TOOL_BYTES);
	snprintf(in_path, sizeof(in_path), "%s/in", f->dir);
	snprintf(out_path, sizeof(out_path), "%s/out", f->dir);
	write_file(in_path, "", 0);
	fake_serve(f);
	pid = tool_start((const char *const[]){MESHECHO_PATH, "-s", f->path, "-l", "7", "-n", "2", NULL}, in_path,
			 out_path);
	fake_join(f);
	assert_int_equal(f->req.op, CTL_OP__CTL_OP_LISTEN);
	assert_int_equal(f->req.port, 7);
	fake_answer(f, f->conn, true, SMALL_RING);
	fake_answer(f, f->conn, true, 8192);
	jobs[0] = (struct peer_job){.ch = &f->ch[0], .in = in, .in_len = TOOL_BYTES, .out = out, .out_cap = TOOL_BYTES};
	jobs[1] = (struct peer_job){.ch = &f->ch[1],
				    .in = in + TOOL_BYTES,
				    .in_len = TOOL_BYTES,
				    .out = out + TOOL_BYTES,
				    .out_cap = TOOL_BYTES};
	peer_run(jobs, 2);
	assert_int_equal(tool_wait(pid), 0);
	assert_int_equal(jobs[0].out_len, TOOL_BYTES);
	assert_int_equal(jobs[1].out_len, TOOL_BYTES);
	assert_memory_equal(in, out, 2 * TOOL_BYTES);
	/* Each channel was shut after its last byte. */
	assert_true(ring_app_flags(&f->ch[0]) & MESH_APP_SHUT_WR);
	assert_true(ring_app_flags(&f->ch[1]) & MESH_APP_SHUT_WR);
	unlink(in_path);
	unlink(out_path);
	free(in);
	free(out);
}

#define T(name) cmocka_unit_test_setup_teardown(name, fake_setup, fake_teardown)

static const struct CMUnitTest tests[] = {
	T(meshlib_ring_index_math__size_valid__powers_of_two_4k_to_256m),
	T(meshlib_ring_index_math__in_window__inclusive_bounds),
	T(meshlib_ring_index_math__contig__bytes_to_area_end),
	T(meshlib_open__path_arg_env_or_default__bad_paths_rejected),
	T(meshlib_api__null_and_bad_arguments__einval),
	T(meshlib_connect__bad_options__einval_nothing_sent),
	T(meshlib_connect__options__request_fields_and_info_from_setup),
	T(meshlib_connect__wait_link__meshd_asked_to_wait_the_timeout),
	T(meshlib_connect__no_options__defaults_left_to_meshd),
	T(meshlib_connect__reply_names_node__local_node_in_info),
	T(meshlib_connect__reply_node_out_of_range__eproto_no_fd_leaked),
	T(meshlib_listener_info__node_and_port__from_listen_answer),
	T(meshlib_listen__answer_names_node_out_of_range__eproto),
	T(meshlib_connect__status_econnrefused__returned_no_fd_leaked),
	T(meshlib_session_error__failed_connect__meshd_text_printable_and_cleared),
	T(meshlib_connect__status_with_fds_or_positive__fds_closed),
	T(meshlib_connect__memfd_size_wrong__eproto_no_fd_leaked),
	T(meshlib_connect__bad_magic__eproto_no_fd_leaked),
	T(meshlib_connect__inconsistent_control_page__eproto_no_fd_leaked),
	T(meshlib_connect__wrong_descriptors__eproto_no_fd_leaked),
	T(meshlib_connect__garbage_reply__ebadmsg_no_fd_leaked),
	T(meshlib_connect__meshd_hangs_up__econnreset),
	T(meshlib_connect__no_reply__etimedout_after_timeout),
	T(meshlib_connect_start__answered__fd_readable_then_channel),
	T(meshlib_connect_start__refused__finish_says_why),
	T(meshlib_connect_start__no_reply__eagain_then_etimedout),
	T(meshlib_connect_cancel__pending__meshd_sees_close),
	T(meshlib_listen__channels_pushed__accepted_in_order),
	T(meshlib_listen__port_taken__eaddrinuse),
	T(meshlib_listen__answer_with_fds__eproto_no_fd_leaked),
	T(meshlib_accept__bad_setup__eproto_listener_keeps_working),
	T(meshlib_accept__blocking__returns_when_channel_arrives),
	T(meshlib_accept__meshd_closes_listener__econnreset),
	T(meshlib_send__ring_wraps__bytes_in_order_in_two_pieces),
	T(meshlib_send__full_ring__partial_count_then_eagain),
	T(meshlib_send__each_publish__kicks_meshd),
	T(meshlib_send__meshd_polling__no_kick_until_it_stops),
	T(meshlib_recv__empty_ring_nonblock__eagain),
	T(meshlib_channel_status__spin_budget__hint_env_and_cap),
	T(meshlib_recv__waits_longer_than_the_spin__sleeps_at_once),
	T(meshlib_recv__partial__returns_what_is_there),
	T(meshlib_recv__wrapped_data__copied_in_order_peek_stops_at_end),
	T(meshlib_recv__quarter_consumed__kicks_catching_up_below_a_quarter_does_not),
	T(meshlib_recv__sender_with_room__kicks_per_half_ring),
	T(meshlib_recv__peer_eof__bytes_then_zero),
	T(meshlib_recv__error_state__bytes_first_then_error),
	T(meshlib_recv__error_value_not_negative_errno__eproto),
	T(meshlib_reserve__free_space__contiguous_to_ring_end),
	T(meshlib_commit__zero_beyond_reserved_or_twice__einval),
	T(meshlib_release__zero_beyond_peeked_or_twice__einval),
	T(meshlib_shutdown__flag_and_kick__later_sends_epipe),
	T(meshlib_close__open_channel__shut_wr_set_and_lifeline_hangs_up),
	T(meshlib_send__tx_cons_beyond_tx_prod__eproto_sticky),
	T(meshlib_send__tx_cons_backwards__eproto),
	T(meshlib_recv__rx_prod_beyond_window__eproto_nothing_copied),
	T(meshlib_recv__rx_prod_huge_or_backwards__eproto),
	T(meshlib_recv__valid_direct_pair__bytes_before_meshd_publishes),
	T(meshlib_recv__torn_stale_or_far_direct_pair__ignored),
	T(meshlib_recv__blocking__sleeps_waiting_until_woken),
	T(meshlib_send__blocking_full_ring__sleeps_until_space),
	T(meshlib_recv__meshd_dies_while_blocked__meshd_gone),
	T(meshlib_send__meshd_dies_while_blocked__meshd_gone),
	T(meshlib_recv__meshd_gone_nonblock__bytes_then_meshd_gone),
	T(meshlib_channel_fd__wake_and_hangup__readable_waiting_kept),
	T(meshlib_channel_fd__writer_waits_for_room__pollin_then_ready_send_never_pollout),
	T(meshlib_channel_fd__published_before_asked__readable_at_once),
	T(meshlib_channel_status__edge_two_waiters__writer_leaves_reader_its_wake),
	T(meshlib_send_recv__loopback_odd_sizes_over_1mib__round_trip_intact),
	T(meshlib_reserve_peek__loopback_zero_copy__round_trip_intact),
	T(meshlib_send_recv__reader_and_writer_threads__loopback_intact_no_stall),
	T(meshlib_send_recv__reader_and_writer_threads_spinning__loopback_intact_no_stall),
	T(meshlib_meshcat__connect_loopback__stdin_comes_back_exit_0),
	T(meshlib_meshcat__listen__channel_to_stdout_exit_0),
	T(meshlib_meshcat__no_meshd_or_bad_usage__exit_2_or_1),
	T(meshlib_meshecho__two_channels_at_once__echoed_then_closed_exit_0),
};

UNIT_MAIN("meshlib", tests, NULL, NULL)
