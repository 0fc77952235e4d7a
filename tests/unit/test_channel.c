/*
 * Channels in meshd (node/meshd/channel.c) over the fake transport. The test plays three parts:
 *
 * - the peer meshd: its ChannelOpen/Accept/Reject/Eof/Close/CloseAck arrive as SENDs on QP 0 of the
 *   link, its data and credits as RECV_IMM completions on the QP they came by; the writes we post
 *   land in memory the test owns (the peer's RX ring and credit word, checked against the keys it
 *   announced) when the test completes them;
 * - the application: the fake channel_ops.deliver keeps its own copies of the four descriptors, as
 *   SCM_RIGHTS would; the test maps the memfd, writes and reads the rings, publishes indices, kicks,
 *   shuts its write side and closes its lifeline as libmesh would;
 * - meshd's loop: transport events go through mesh_handle_event() + mesh_reap() (harness deliver()),
 *   kicks and lifelines as meshd's loop takes them (channel_on_kick_fast() + channel_pump_wanted(),
 *   channel_on_lifeline()) + mesh_reap().
 *
 * We are node 2 of {1, 2, 3}: the link to node 1 is UP (we dialled it), the link to node 3 is DOWN.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "channel.h"
#include "channel_internal.h"
#include "log.h"
#include "mesh_harness.h"
#include "unit_main.h"
#include "util.h"

#define SELF 2u
#define PEER 1u       /* link UP */
#define DOWN_NODE 3u  /* link DOWN: node 3 dials us and has not */
#define UNKNOWN_NODE 9u
#define RING MESH_RING_MIN /* 4 KiB rings: chunks of a quarter, 1 KiB */
#define CHUNK (RING / 4)
#define CLIENT_FD 1001 /* a connecting client: only a number to channel.c and to the fake deliver */
#define LISTEN_FD 1002
#define ROOT 0u     /* the uid of a client (SO_PEERCRED) */
#define ALICE 1000u
#define BOB 1001u
#define PEER_SLOT 7u /* the peer meshd's slot of a channel */
#define PEER_RX_RKEY 0x5eed0001u
#define PEER_CREDIT_RKEY 0x5eed0002u
#define PEER_DIRECT_RKEY 0x5eed0003u
#define PEER_HINT_RKEY 0x5eed0004u
#define ACCESS_RW (XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_WRITE)
#define MAX_APPS 64
#define MAX_CHANS 6
#define MAX_IDS (2 * MESH_CH_BUCKETS) /* channel ids and slots the harness tracks (channel_find__ tests a second bucket round) */

enum { FD_MEMFD, FD_LIFELINE, FD_KICK, FD_WAKE }; /* the order of channel_ops.deliver's fds[] */

static const uint16_t ids123[] = {1, 2, 3};

/* What the fake deliver got: a reply to a client and, with a channel, the application's copies of
 * its four descriptors and (once app_map() ran) the mapped ring. */
struct app {
	int client_fd;
	int status;
	char why[128];
	bool setup;
	uint32_t channel_id, qps;
	uint64_t ring_size;
	size_t map_len;
	uint16_t local_port, peer_port;
	int fds[4];
	uint8_t *map;
	struct mesh_ring_ctrl *ctrl;
	uint8_t *tx, *rx;
	uint64_t tx_prod, rx_cons; /* what this application published */
};

/* One channel as the test sees it. */
struct chan {
	uint32_t id;        /* meshd's channel id */
	uint32_t slot;      /* ours: what the peer's messages and immediates name */
	uint32_t peer_slot; /* the peer's: what ours name */
	uint16_t local_port;
	uint64_t size;
	struct app *app;
	/* what we announced: our RX ring and credit word (meshd's memory, written by the "peer") */
	uint8_t *our_rx;
	uint64_t *our_credit;
	uint32_t our_rx_rkey, our_credit_rkey;
	/* the peer's RX ring and credit word: the targets of our writes */
	uint8_t *peer_rx;
	uint64_t *peer_credit;
	/* the peer's direct pair, when it announces one (chan_direct): {pos, check} */
	uint64_t *peer_dir;
	/* our direct pair, from our Open or Accept */
	struct mesh_ring_direct *our_dir;
	uint32_t our_dir_rkey;
	/* the peer's pair hint, when it announces one (open_out_hinted), and ours from our Open */
	uint64_t *peer_hint, *our_hint;
};

struct ct {
	struct mt t; /* first: the harness's fixture */
	struct link *l;
	struct app apps[MAX_APPS];
	size_t n_apps;
	int deliver_err; /* armed: the next deliver fails with it (the client is gone) */
	uint32_t aq_caps;  /* what our application's offers say it takes (aq_on: today's libmesh's) */
	unsigned watch_add[MAX_IDS], watch_del[MAX_IDS];
	unsigned moved[MAX_IDS];   /* channel_ops.moved calls */
	uint32_t moved_from[MAX_IDS];
	struct chan chans[MAX_CHANS];
	size_t n_chans;
	/* immediates the peer sent to each of our slots (data, credit): what its Close counts */
	uint64_t peer_imms[MAX_IDS][2];
};

/* ---- the application's side: channel_ops ------------------------------------------------------ */

static int app_deliver(void *ctx, int fd, int status, const char *why, const struct channel *ch, const int fds[4])
{
	struct ct *c = ctx;
	struct app *a;

	/* A reply carries a channel exactly when it reports success, and then all four descriptors. */
	assert_true((status == 0) == (ch != NULL));
	assert_true((ch != NULL) == (fds != NULL));
	assert_true(status <= 0);
	if (c->deliver_err) {
		int err = c->deliver_err;

		c->deliver_err = 0;
		return err;
	}
	assert_true(c->n_apps < MAX_APPS);
	a = &c->apps[c->n_apps++];
	memset(a, 0, sizeof(*a));
	a->client_fd = fd;
	a->status = status;
	snprintf(a->why, sizeof(a->why), "%s", why ? why : "");
	for (int i = 0; i < 4; i++)
		a->fds[i] = -1;
	if (!ch)
		return 0;
	a->setup = true;
	a->channel_id = ch->id;
	a->qps = ch->qps;
	a->ring_size = ch->size;
	a->map_len = ch->map_len;
	a->local_port = ch->local_port;
	a->peer_port = ch->peer_port;
	/* SCM_RIGHTS gives the application descriptors of its own. */
	for (int i = 0; i < 4; i++) {
		assert_true(fds[i] >= 0);
		a->fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
		assert_true(a->fds[i] >= 0);
	}
	return 0;
}

static void app_watch(void *ctx, struct channel *ch, bool add)
{
	struct ct *c = ctx;

	assert_true(ch->id < MAX_IDS);
	if (add)
		c->watch_add[ch->id]++;
	else
		c->watch_del[ch->id]++;
}

static void app_moved(void *ctx, struct channel *ch, uint32_t from)
{
	struct ct *c = ctx;

	assert_true(ch->id < MAX_IDS);
	assert_int_not_equal(ch->rail, from);
	c->moved[ch->id]++;
	c->moved_from[ch->id] = from;
}

static bool fd_is(int fd, const char *what)
{
	char path[64], buf[256];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, buf, sizeof(buf) - 1);
	if (n < 0)
		return false;
	buf[n] = '\0';
	return strstr(buf, what) != NULL;
}

/* Maps the memfd as libmesh does and checks the control page meshd filled in. */
static void app_map(struct app *a)
{
	struct stat st;
	void *p;

	assert_true(a->setup);
	assert_int_equal(fstat(a->fds[FD_MEMFD], &st), 0);
	assert_true(S_ISREG(st.st_mode));
	assert_true((uint64_t)st.st_size == a->map_len);
	assert_true(a->map_len == MESH_RING_CTRL_SIZE + 2 * a->ring_size);
	p = mmap(NULL, a->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, a->fds[FD_MEMFD], 0);
	assert_true(p != MAP_FAILED);
	a->map = p;
	a->ctrl = p;
	assert_int_equal(a->ctrl->magic, MESH_RING_MAGIC);
	assert_int_equal(a->ctrl->version, MESH_RING_VERSION);
	assert_true(a->ctrl->ring_size == a->ring_size);
	assert_true(a->ctrl->tx_off == MESH_RING_CTRL_SIZE);
	assert_true(a->ctrl->rx_off == MESH_RING_CTRL_SIZE + a->ring_size);
	assert_int_equal(a->ctrl->channel_id, a->channel_id);
	assert_int_equal(a->ctrl->local_port, a->local_port);
	assert_int_equal(a->ctrl->peer_port, a->peer_port);
	a->tx = a->map + a->ctrl->tx_off;
	a->rx = a->map + a->ctrl->rx_off;
}

static void app_close(struct app *a)
{
	if (a->map)
		munmap(a->map, a->map_len);
	a->map = NULL;
	for (int i = 0; i < 4; i++) {
		if (a->fds[i] >= 0)
			close(a->fds[i]);
		a->fds[i] = -1;
	}
}

/* Byte `pos` of a stream; salt tells the directions apart. */
static uint8_t pat(uint64_t pos, uint8_t salt)
{
	return (uint8_t)(pos * 7u + (pos >> 8) + salt);
}

#define SALT_OUT 0xa5 /* our application's stream */
#define SALT_IN 0x5a  /* the peer's stream */

/* The application appends n bytes to TX and publishes tx_prod. */
static void app_write(struct chan *h, uint32_t n)
{
	struct app *a = h->app;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t p = a->tx_prod + i;

		a->tx[p & (a->ring_size - 1)] = pat(p, SALT_OUT);
	}
	a->tx_prod += n;
	atomic_store_explicit(&a->ctrl->tx_prod, a->tx_prod, memory_order_release);
}

/* The application reads n bytes (checking them) and publishes rx_cons. */
static void app_read(struct chan *h, uint64_t n)
{
	struct app *a = h->app;

	for (uint64_t i = 0; i < n; i++) {
		uint64_t p = a->rx_cons + i;

		if (a->rx[p & (a->ring_size - 1)] != pat(p, SALT_IN))
			fail_msg("RX byte %llu is 0x%02x, the peer sent 0x%02x", (unsigned long long)p,
				 a->rx[p & (a->ring_size - 1)], pat(p, SALT_IN));
	}
	a->rx_cons += n;
	atomic_store_explicit(&a->ctrl->rx_cons, a->rx_cons, memory_order_release);
}

static void app_shut_wr(struct chan *h)
{
	atomic_fetch_or_explicit(&h->app->ctrl->app_flags, MESH_APP_SHUT_WR, memory_order_release);
}

/* What meshd's loop does with a readable kick (main.c, run): the thread of the channel's rail
 * takes it under its rail's lock, then, under every lock, pumps what it left to the usual way. */
static void loop_kick(struct mesh *m, uint32_t id)
{
	struct channel *ch = channel_find(m, id);

	if (!ch)
		return;
	channel_on_kick_fast(m, id, ch->rail);
	channel_pump_wanted(m, ch->rail);
}

/* Writes the kick eventfd; meshd's loop then sees it readable. */
static void app_kick(struct ct *c, struct chan *h)
{
	uint64_t one = 1;

	assert_int_equal(write(h->app->fds[FD_KICK], &one, sizeof(one)), (ssize_t)sizeof(one));
	loop_kick(&c->t.m, h->id);
	mesh_reap(&c->t.m);
}

/* The application closes (or dies): its lifeline end goes, meshd's loop sees the hang-up. */
static void app_hangup(struct ct *c, struct chan *h)
{
	assert_true(h->app->fds[FD_LIFELINE] >= 0);
	close(h->app->fds[FD_LIFELINE]);
	h->app->fds[FD_LIFELINE] = -1;
	channel_on_lifeline(&c->t.m, h->id);
	mesh_reap(&c->t.m);
}

static uint32_t ring_state(const struct chan *h)
{
	return atomic_load_explicit(&h->app->ctrl->state, memory_order_acquire);
}

static int32_t ring_error(const struct chan *h)
{
	return atomic_load_explicit(&h->app->ctrl->error, memory_order_acquire);
}

static uint64_t ring_tx_cons(const struct chan *h)
{
	return atomic_load_explicit(&h->app->ctrl->tx_cons, memory_order_acquire);
}

static uint64_t ring_rx_prod(const struct chan *h)
{
	return atomic_load_explicit(&h->app->ctrl->rx_prod, memory_order_acquire);
}

/* ---- fixture -------------------------------------------------------------------------------- */

static int ct_setup(void **state)
{
	size_t len = (sizeof(struct ct) + 63) & ~(size_t)63;
	struct ct *c = aligned_alloc(64, len);

	if (!c)
		return -1;
	memset(c, 0, sizeof(*c));
	mt_open(&c->t);
	*state = c;
	return 0;
}

static int ct_teardown(void **state)
{
	struct ct *c = *state;

	for (size_t i = 0; i < c->n_apps; i++)
		app_close(&c->apps[i]);
	mt_close(&c->t);
	for (size_t i = 0; i < c->n_chans; i++) {
		free(c->chans[i].peer_rx);
		free(c->chans[i].peer_credit);
		free(c->chans[i].peer_dir);
		free(c->chans[i].peer_hint);
	}
	free(c);
	return 0;
}

/* Every SEND of ours still outstanding on QP 0 completes (the peer received it). */
static void complete_sends(struct ct *c)
{
	struct mt *t = &c->t;
	uint32_t qp = c->l->ctl_rail * t->cfg.qps_per_link; /* our control QP */
	unsigned cid = conn_id(c->l->conns[qp]);

	for (size_t i = 0; i < t->fx->n_posts; i++) {
		struct fake_post *p = &t->fx->posts[i];
		struct xport_event ev;

		if (p->op != XPORT_OP_SEND || p->conn_id != cid || p->used)
			continue;
		p->used = true;
		ev = wc_event(c->l->conns[qp], XPORT_OP_SEND, p->wr_id, p->len);
		deliver(t, &ev);
	}
}

/* Brings the link to node 1 UP over qps QPs, with the fake application attached. */
static void ct_init(struct ct *c, uint32_t qps)
{
	struct mt *t = &c->t;

	t->qps = qps;
	mt_init(t, SELF, ids123, 3);
	/* No keepalive timeout inside a test, however slow (valgrind): ticks serve channel timeouts. */
	t->cfg.keepalive_interval_ms = 3600u * 1000u;
	t->cfg.keepalive_timeout_ms = 7200u * 1000u;
	t->m.ch_ops = (struct channel_ops){.deliver = app_deliver, .watch = app_watch, .moved = app_moved, .ctx = c};
	tick(t);
	c->l = lk(t, PEER);
	drive_to_up(t, c->l);
	complete_sends(c);
	assert_int_equal(t->fx->live_mrs, 1 + (int)t->m.n_rails); /* the link's own (buffers again per rail) */
}

static struct channel *chn(struct ct *c, const struct chan *h)
{
	struct channel *ch = channel_find(&c->t.m, h->id);

	if (!ch)
		fail_msg("channel %u no longer exists", h->id);
	return ch;
}

static struct channel *link_channel_of(struct ct *c, uint32_t slot)
{
	return slot < c->l->ch_cap ? c->l->ch_slots[slot] : NULL;
}

static struct chan *chan_new(struct ct *c, uint64_t size, uint32_t peer_slot)
{
	struct chan *h;

	assert_true(c->n_chans < MAX_CHANS);
	h = &c->chans[c->n_chans++];
	memset(h, 0, sizeof(*h));
	h->size = size;
	h->peer_slot = peer_slot;
	h->peer_rx = calloc(1, size);
	h->peer_credit = aligned_alloc(64, MESH_CREDIT_AREA);
	assert_non_null(h->peer_rx);
	assert_non_null(h->peer_credit);
	memset(h->peer_credit, 0, MESH_CREDIT_AREA);
	return h;
}

/* ---- what we sent ----------------------------------------------------------------------------- */

/* The nth message of kind `body` we sent since post index `from`, decoded (free it), or NULL. */
static PeerMsg *sent_msg(struct ct *c, size_t from, PeerMsg__BodyCase body, size_t nth)
{
	struct fake_xport *fx = c->t.fx;

	for (size_t i = from; i < fx->n_posts; i++) {
		struct fake_post *p = &fx->posts[i];
		const char *why;
		PeerMsg *m;

		if (p->op != XPORT_OP_SEND)
			continue;
		assert_true(p->len <= FAKE_SEND_COPY);
		assert_int_equal(mesh_peer_msg_decode(p->sent, p->len, &m, &why), 0);
		if (m->body_case == body && nth-- == 0)
			return m;
		mesh_peer_msg_free(m);
	}
	return NULL;
}

static size_t sent_count(struct ct *c, size_t from, PeerMsg__BodyCase body)
{
	size_t n = 0;
	PeerMsg *m;

	while ((m = sent_msg(c, from, body, n))) {
		mesh_peer_msg_free(m);
		n++;
	}
	return n;
}

/* Our ChannelClose to channel h (the first since from): its reason. Fails if there is none. */
static int sent_close_reason(struct ct *c, const struct chan *h, size_t from)
{
	PeerMsg *m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_CLOSE, 0);
	int reason;

	if (!m)
		fail_msg("no ChannelClose was sent");
	assert_int_equal(m->channel_close->slot, h->peer_slot);
	reason = m->channel_close->reason;
	mesh_peer_msg_free(m);
	return reason;
}

static bool is_credit(const struct fake_post *p)
{
	return (p->imm & MESH_IMM_CREDIT) != 0;
}

/* The nth data (credit false) or credit WRITE_WITH_IMM of channel h posted since from, or NULL. */
static struct fake_post *write_post(struct ct *c, const struct chan *h, size_t from, bool credit, size_t nth)
{
	struct fake_xport *fx = c->t.fx;

	for (size_t i = from; i < fx->n_posts; i++) {
		struct fake_post *p = &fx->posts[i];

		if (p->op != XPORT_OP_WRITE_IMM || is_credit(p) != credit || MESH_IMM_SLOT(p->imm) != h->peer_slot)
			continue;
		if (nth-- == 0)
			return p;
	}
	return NULL;
}

static size_t write_count(struct ct *c, const struct chan *h, size_t from, bool credit)
{
	size_t n = 0;

	while (write_post(c, h, from, credit, n))
		n++;
	return n;
}

/* The peer's NIC executes a write we posted (data into its RX ring, a credit into its credit word,
 * both checked against what it announced), then our QP reports the completion. */
static void complete_write(struct ct *c, struct chan *h, struct fake_post *p)
{
	struct fake_conn *fc = fake_conn_by_id(c->t.fx, p->conn_id);
	struct xport_event ev;

	assert_non_null(p);
	assert_non_null(fc);
	assert_false(p->used);
	p->used = true;
	if (p->op == XPORT_OP_WRITE && h->peer_hint && p->raddr == (uintptr_t)h->peer_hint) {
		/* The pair hint: into the 16 bytes the peer announced for it. */
		assert_int_equal(p->rkey, PEER_HINT_RKEY);
		assert_int_equal(p->len, MESH_PAIR_HINT_LEN);
		memcpy(h->peer_hint, p->buf, MESH_PAIR_HINT_LEN);
	} else if (p->op == XPORT_OP_WRITE) {
		/* The direct pair: into the 16 bytes the peer announced, nothing else. */
		assert_non_null(h->peer_dir);
		assert_int_equal(p->rkey, PEER_DIRECT_RKEY);
		assert_true(p->raddr == (uintptr_t)h->peer_dir);
		assert_int_equal(p->len, MESH_RING_DIRECT_LEN);
		memcpy(h->peer_dir, p->buf, MESH_RING_DIRECT_LEN);
	} else if (is_credit(p)) {
		uint64_t *slot = h->peer_credit + 2 * (MESH_IMM_SEQ(p->imm) % MESH_CREDIT_SLOTS);

		/* Into the slot its immediate names. */
		assert_int_equal(p->op, XPORT_OP_WRITE_IMM);
		assert_int_equal(p->rkey, PEER_CREDIT_RKEY);
		assert_true(p->raddr == (uintptr_t)slot);
		assert_int_equal(p->len, MESH_CREDIT_LEN);
		memcpy(slot, p->buf, MESH_CREDIT_LEN);
	} else {
		uint64_t off = p->raddr - (uintptr_t)h->peer_rx;

		assert_int_equal(p->op, XPORT_OP_WRITE_IMM);
		assert_int_equal(p->rkey, PEER_RX_RKEY);
		assert_true(p->raddr >= (uintptr_t)h->peer_rx);
		assert_true(off + p->len <= h->size);
		memcpy(h->peer_rx + off, p->buf, p->len);
	}
	/* The requester of a WRITE_WITH_IMM reports WRITE, as verbs does. */
	ev = wc_event(&fc->base, XPORT_OP_WRITE, p->wr_id, 0);
	deliver(&c->t, &ev);
}

/* Completes every data write of channel h posted since from and not completed yet, in order. */
static void complete_data(struct ct *c, struct chan *h, size_t from)
{
	struct fake_post *p;

	for (size_t i = 0; (p = write_post(c, h, from, false, i)); i++)
		if (!p->used)
			complete_write(c, h, p);
}

/* ---- what the peer sends ---------------------------------------------------------------------- */

/* On the first QP of the rail that carries control; with several rails a well-behaved peer numbers
 * its control messages (the next one we expect) and acks all of ours. */
static void peer_msg(struct ct *c, PeerMsg *m)
{
	struct link *l = c->l;

	if (l->phase == LINK_UP && (l->features & MESH_FEAT_RAILS) && c->t.m.n_rails > 1) {
		if ((m->body_case >= PEER_MSG__BODY_CHANNEL_OPEN && m->body_case <= PEER_MSG__BODY_CHANNEL_RESUME) ||
		    m->body_case == PEER_MSG__BODY_RAIL_DOWN)
			m->seq = l->ctl_rcvd + 1;
		m->ack = l->ctl_seq;
	}
	peer_send_on(&c->t, l, l->ctl_rail * c->t.cfg.qps_per_link, m);
}

/* A WRITE_WITH_IMM of the peer reaches QP qp: a receive of ours there completes with the immediate. */
static void peer_imm(struct ct *c, uint32_t qp, uint32_t imm, uint32_t len)
{
	struct fake_post *r = take_recv(&c->t, c->l, qp);
	struct xport_event ev = wc_event(c->l->conns[qp], XPORT_OP_RECV_IMM, r->wr_id, len);

	if (MESH_IMM_SLOT(imm) < MAX_IDS)
		c->peer_imms[MESH_IMM_SLOT(imm)][(imm & MESH_IMM_CREDIT) != 0]++;
	ev.imm = imm;
	ev.has_imm = true;
	deliver(&c->t, &ev);
}

/* The peer sends bytes [pos, pos + len) of its stream as chunk seq over QP qp: they land in the RX
 * ring we announced, then the immediate arrives. */
static void peer_data(struct ct *c, const struct chan *h, uint32_t qp, uint16_t seq, uint64_t pos, uint32_t len)
{
	uint64_t off = pos & (h->size - 1);

	assert_true(off + len <= h->size);
	for (uint32_t i = 0; i < len; i++)
		h->our_rx[off + i] = pat(pos + i, SALT_IN);
	peer_imm(c, qp, MESH_IMM(0, h->slot, seq), len);
}

/* The peer's reader consumed up to cons and its meshd has placed up to placed: its credit write
 * number n (counted as meshd counts what arrives) lands in our credit slot n, then its immediate. */
static void peer_credit_placed(struct ct *c, const struct chan *h, uint64_t cons, uint64_t placed)
{
	struct channel *ch = channel_find(&c->t.m, h->id);
	uint16_t n = ch ? (uint16_t)ch->imm_credits_seen : 0;
	uint64_t *slot = h->our_credit + 2 * (n % MESH_CREDIT_SLOTS);

	__atomic_store_n(&slot[0], cons, __ATOMIC_RELEASE);
	__atomic_store_n(&slot[1], placed, __ATOMIC_RELEASE);
	peer_imm(c, 0, MESH_IMM(1, h->slot, n), MESH_CREDIT_LEN);
}

/* The same, placed as far as it said before, or the reader. */
static void peer_credit(struct ct *c, const struct chan *h, uint64_t cons)
{
	struct channel *ch = channel_find(&c->t.m, h->id);

	peer_credit_placed(c, h, cons, MAX(cons, ch ? ch->peer_placed : 0));
}

static void peer_open(struct ct *c, const struct chan *h, uint16_t src_port, uint16_t dst_port, uint32_t qps)
{
	PeerMsg m = PEER_MSG__INIT;
	ChannelOpen o = CHANNEL_OPEN__INIT;

	o.slot = h->peer_slot;
	o.src_port = src_port;
	o.dst_port = dst_port;
	o.ring_size = h->size;
	o.qps = qps;
	o.rx_addr = (uintptr_t)h->peer_rx;
	o.rx_rkey = PEER_RX_RKEY;
	o.credit_addr = (uintptr_t)h->peer_credit;
	o.credit_rkey = PEER_CREDIT_RKEY;
	if (h->peer_dir) {
		o.direct_addr = (uintptr_t)h->peer_dir;
		o.direct_rkey = PEER_DIRECT_RKEY;
	}
	if (h->peer_hint) {
		o.hint_addr = (uintptr_t)h->peer_hint;
		o.hint_rkey = PEER_HINT_RKEY;
	}
	m.body_case = PEER_MSG__BODY_CHANNEL_OPEN;
	m.channel_open = &o;
	peer_msg(c, &m);
}

static void peer_accept(struct ct *c, const struct chan *h)
{
	PeerMsg m = PEER_MSG__INIT;
	ChannelAccept a = CHANNEL_ACCEPT__INIT;

	a.slot = h->slot;
	a.peer_slot = h->peer_slot;
	a.rx_addr = (uintptr_t)h->peer_rx;
	a.rx_rkey = PEER_RX_RKEY;
	a.credit_addr = (uintptr_t)h->peer_credit;
	a.credit_rkey = PEER_CREDIT_RKEY;
	if (h->peer_dir) {
		a.direct_addr = (uintptr_t)h->peer_dir;
		a.direct_rkey = PEER_DIRECT_RKEY;
	}
	if (h->peer_hint) {
		a.hint_addr = (uintptr_t)h->peer_hint;
		a.hint_rkey = PEER_HINT_RKEY;
	}
	m.body_case = PEER_MSG__BODY_CHANNEL_ACCEPT;
	m.channel_accept = &a;
	peer_msg(c, &m);
}

static void peer_reject(struct ct *c, uint32_t slot, int reason)
{
	PeerMsg m = PEER_MSG__INIT;
	ChannelReject r = CHANNEL_REJECT__INIT;

	r.slot = slot;
	r.reason = reason;
	m.body_case = PEER_MSG__BODY_CHANNEL_REJECT;
	m.channel_reject = &r;
	peer_msg(c, &m);
}

static void peer_eof(struct ct *c, const struct chan *h, uint64_t total)
{
	PeerMsg m = PEER_MSG__INIT;
	ChannelEof e = CHANNEL_EOF__INIT;

	e.slot = h->slot;
	e.total = total;
	m.body_case = PEER_MSG__BODY_CHANNEL_EOF;
	m.channel_eof = &e;
	peer_msg(c, &m);
}

/* The peer's Close counts the immediates it sent to channel h (peer_close_n: other counts). */
static void peer_close_n(struct ct *c, const struct chan *h, int reason, uint64_t chunks, uint64_t credits)
{
	PeerMsg m = PEER_MSG__INIT;
	ChannelClose cl = CHANNEL_CLOSE__INIT;

	cl.slot = h->slot;
	cl.reason = reason;
	cl.chunks = chunks;
	cl.credits = credits;
	m.body_case = PEER_MSG__BODY_CHANNEL_CLOSE;
	m.channel_close = &cl;
	peer_msg(c, &m);
}

static void peer_close(struct ct *c, const struct chan *h, int reason)
{
	assert_true(h->slot < MAX_IDS);
	peer_close_n(c, h, reason, c->peer_imms[h->slot][0], c->peer_imms[h->slot][1]);
}

static void peer_close_ack(struct ct *c, const struct chan *h)
{
	PeerMsg m = PEER_MSG__INIT;
	ChannelCloseAck a = CHANNEL_CLOSE_ACK__INIT;

	assert_true(h->slot < MAX_IDS);
	a.slot = h->slot;
	a.chunks = c->peer_imms[h->slot][0];
	a.credits = c->peer_imms[h->slot][1];
	m.body_case = PEER_MSG__BODY_CHANNEL_CLOSE_ACK;
	m.channel_close_ack = &a;
	peer_msg(c, &m);
}

static void peer_keepalive(struct ct *c, uint64_t seq)
{
	PeerMsg m = PEER_MSG__INIT;
	Keepalive k = KEEPALIVE__INIT;

	k.seq = seq;
	k.sent_us = 1000 + seq;
	m.body_case = PEER_MSG__BODY_KEEPALIVE;
	m.keepalive = &k;
	peer_msg(c, &m);
}

/* ---- opening channels ------------------------------------------------------------------------- */

/* channel_connect to node 1; notes what the ChannelOpen announced. The channel is OPENING. */
static struct chan *connect_out(struct ct *c, uint16_t port, uint64_t size, uint32_t qps, uint32_t peer_slot)
{
	size_t from = c->t.fx->n_posts;
	const char *why = NULL;
	struct chan *h = chan_new(c, size, peer_slot);
	PeerMsg *m;
	int ret = channel_connect(&c->t.m, PEER, port, size, qps, -1, -1, -1, CLIENT_FD, ROOT, &why);

	if (ret)
		fail_msg("channel_connect: %s (%s)", mesh_strerror(ret), why ? why : "?");
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_OPEN, 0);
	assert_non_null(m);
	h->slot = m->channel_open->slot;
	h->local_port = (uint16_t)m->channel_open->src_port;
	h->our_rx = (uint8_t *)(uintptr_t)m->channel_open->rx_addr;
	h->our_rx_rkey = m->channel_open->rx_rkey;
	h->our_credit = (uint64_t *)(uintptr_t)m->channel_open->credit_addr;
	h->our_credit_rkey = m->channel_open->credit_rkey;
	h->our_dir = (struct mesh_ring_direct *)(uintptr_t)m->channel_open->direct_addr;
	h->our_dir_rkey = m->channel_open->direct_rkey;
	h->our_hint = (uint64_t *)(uintptr_t)m->channel_open->hint_addr;
	mesh_peer_msg_free(m);
	assert_true(h->slot < c->l->ch_cap);
	assert_non_null(c->l->ch_slots[h->slot]);
	h->id = c->l->ch_slots[h->slot]->id;
	assert_true(h->slot < MAX_IDS);
	memset(c->peer_imms[h->slot], 0, sizeof(c->peer_imms[h->slot]));
	complete_sends(c);
	return h;
}

/* The peer accepts: the connecting client gets the channel, and maps it. */
static void accept_out(struct ct *c, struct chan *h)
{
	size_t n = c->n_apps;

	peer_accept(c, h);
	assert_int_equal(c->n_apps, n + 1);
	h->app = &c->apps[n];
	if (h->app->status)
		fail_msg("the client got %s (%s), not the channel", mesh_strerror(h->app->status), h->app->why);
	app_map(h->app);
	complete_sends(c);
}

static struct chan *open_out(struct ct *c, uint64_t size, uint32_t qps, uint32_t peer_slot)
{
	struct chan *h = connect_out(c, 5000, size, qps, peer_slot);

	accept_out(c, h);
	return h;
}

/* The peer opens a channel to our port, where LISTEN_FD listens: we deliver it and accept. */
static struct chan *open_in(struct ct *c, uint16_t src_port, uint16_t dst_port, uint64_t size, uint32_t qps,
			    uint32_t peer_slot)
{
	size_t from = c->t.fx->n_posts, n = c->n_apps;
	struct chan *h = chan_new(c, size, peer_slot);
	PeerMsg *m;

	peer_open(c, h, src_port, dst_port, qps);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_ACCEPT, 0);
	if (!m)
		fail_msg("no ChannelAccept (%zu rejects)", sent_count(c, from, PEER_MSG__BODY_CHANNEL_REJECT));
	assert_int_equal(m->channel_accept->slot, peer_slot);
	h->slot = m->channel_accept->peer_slot;
	h->local_port = dst_port;
	h->our_rx = (uint8_t *)(uintptr_t)m->channel_accept->rx_addr;
	h->our_rx_rkey = m->channel_accept->rx_rkey;
	h->our_credit = (uint64_t *)(uintptr_t)m->channel_accept->credit_addr;
	h->our_credit_rkey = m->channel_accept->credit_rkey;
	mesh_peer_msg_free(m);
	assert_true(h->slot < c->l->ch_cap);
	assert_non_null(c->l->ch_slots[h->slot]);
	h->id = c->l->ch_slots[h->slot]->id;
	assert_true(h->slot < MAX_IDS);
	memset(c->peer_imms[h->slot], 0, sizeof(c->peer_imms[h->slot]));
	assert_int_equal(c->n_apps, n + 1);
	h->app = &c->apps[n];
	assert_int_equal(h->app->status, 0);
	app_map(h->app);
	complete_sends(c);
	return h;
}

/* The channel's six registrations, the latest of each kind (access, length; the pair hint in and
 * the direct pair have the same, the hint is in the credit page). */
struct ch_regs {
	const struct fake_reg *tx, *rx, *cin, *cout, *dir, *hin;
};

static struct ch_regs find_regs(struct ct *c, uint64_t size)
{
	struct ch_regs r = {0};
	struct fake_xport *fx = c->t.fx;

	for (size_t i = 0; i < fx->n_regs; i++) {
		const struct fake_reg *g = &fx->regs[i];

		if (g->access == XPORT_ACCESS_LOCAL && g->len == size)
			r.tx = g;
		else if (g->access == ACCESS_RW && g->len == size)
			r.rx = g;
		else if (g->access == ACCESS_RW && g->len == MESH_CREDIT_AREA)
			r.cin = g;
		else if (g->access == XPORT_ACCESS_LOCAL && g->len == 2 * MESH_CREDIT_LEN + MESH_PAIR_HINT_LEN)
			r.cout = g;
		else if (g->access == ACCESS_RW && g->len == MESH_PAIR_HINT_LEN && r.cin &&
			 g->addr == (const uint8_t *)r.cin->addr + CH_HINT_IN * sizeof(uint64_t))
			r.hin = g;
		else if (g->access == ACCESS_RW && g->len == MESH_RING_DIRECT_LEN)
			r.dir = g;
	}
	assert_non_null(r.tx);
	assert_non_null(r.rx);
	assert_non_null(r.cin);
	assert_non_null(r.cout);
	assert_non_null(r.dir);
	assert_non_null(r.hin);
	return r;
}

/* Channel h broke with err: the ring says so, the link stays UP, nothing more is posted. */
static void expect_broken(struct ct *c, struct chan *h, int err)
{
	size_t from = c->t.fx->n_posts;

	if (!(ring_state(h) & MESH_STATE_ERROR))
		fail_msg("ring state 0x%x: no MESH_STATE_ERROR", ring_state(h));
	if (ring_error(h) != err)
		fail_msg("ring error %d (%s), expected %d (%s)", ring_error(h), mesh_strerror(ring_error(h)), err,
			 mesh_strerror(err));
	assert_string_equal(channel_state_name(chn(c, h)), "ERROR");
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	/* Whatever the application does now, no data and no credit moves. */
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_int_equal(write_count(c, h, from, true), 0);
}

/* ---- connect and accept ------------------------------------------------------------------------ */

static void channel_connect__up_link__open_carries_slot_ports_ring_and_keys(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;
	const ChannelOpen *o;
	struct ch_regs r;
	struct channel *ch;
	size_t from, regs;
	PeerMsg *m;

	ct_init(c, 3);
	from = c->t.fx->n_posts;
	regs = c->t.fx->n_regs;
	assert_int_equal(channel_connect(&c->t.m, PEER, 80, RING, 9, -1, -1, -1, CLIENT_FD, ROOT, &why), 0);
	/* TX (local), RX and the credit word in (remote write), the credit, direct and hint words out
	 * (local), the pair hint in (remote write), the direct pair of the control page (remote write). */
	assert_int_equal(c->t.fx->n_regs, regs + 6);
	r = find_regs(c, RING);
	for (size_t i = regs; i < regs + 6; i++)
		assert_int_equal(c->t.fx->regs[i].conn_id, conn_id(c->l->conns[0]));
	assert_int_equal(fake_post_count(c->t.fx, from, XPORT_OP_SEND, 0), 1);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_OPEN, 0);
	assert_non_null(m);
	o = m->channel_open;
	assert_true(o->slot < c->l->ch_cap);
	ch = c->l->ch_slots[o->slot];
	assert_non_null(ch);
	assert_int_equal(o->slot, ch->slot);
	assert_int_equal(o->dst_port, 80);
	assert_int_equal(o->src_port, ch->local_port);
	assert_true(o->src_port >= 49152);
	assert_true(o->ring_size == RING);
	assert_int_equal(o->qps, 3); /* 9 asked for, the link has 3 */
	assert_int_equal(ch->qps, 3);
	assert_true(o->rx_addr == (uintptr_t)r.rx->addr);
	assert_int_equal(o->rx_rkey, r.rx->rkey);
	assert_true(o->credit_addr == (uintptr_t)r.cin->addr);
	assert_int_equal(o->credit_rkey, r.cin->rkey);
	/* The direct pair: 16 bytes of the control page, nothing else of it. */
	assert_ptr_equal(r.dir->addr, (uint8_t *)ch->map + MESH_RING_DIRECT_OFF);
	assert_true(o->direct_addr == (uintptr_t)r.dir->addr);
	assert_int_equal(o->direct_rkey, r.dir->rkey);
	/* The pair hint: its 16 bytes of the credit page. */
	assert_ptr_equal(r.hin->addr, ch->credit + CH_HINT_IN);
	assert_true(o->hint_addr == (uintptr_t)r.hin->addr);
	assert_int_equal(o->hint_rkey, r.hin->rkey);
	/* The rings registered are the ones in the memfd: TX then RX after the control page. */
	assert_ptr_equal(r.tx->addr, ch->tx);
	assert_ptr_equal(r.rx->addr, ch->rx);
	assert_ptr_equal((uint8_t *)r.tx->addr, (uint8_t *)ch->map + MESH_RING_CTRL_SIZE);
	assert_ptr_equal((uint8_t *)r.rx->addr, (uint8_t *)ch->map + MESH_RING_CTRL_SIZE + RING);
	mesh_peer_msg_free(m);
	/* The client hears once the peer answers. */
	assert_int_equal(c->n_apps, 0);
	assert_int_equal(c->t.m.n_channels, 1);
	assert_string_equal(channel_state_name(ch), "OPENING");
	assert_int_equal(c->watch_add[ch->id], 1);
	mt_finish(&c->t);
}

static void channel_connect__qps_and_ring_unset__link_qps_and_default_ring(void **state)
{
	struct ct *c = *state;
	const uint32_t ask[] = {0, 1, 2, 4};
	const uint32_t want[] = {3, 1, 2, 3};
	uint32_t slots[4], ports[4];
	const char *why = NULL;

	ct_init(c, 3);
	for (int i = 0; i < 4; i++) {
		size_t from = c->t.fx->n_posts;
		PeerMsg *m;

		assert_int_equal(channel_connect(&c->t.m, PEER, 80, i ? RING : 0, ask[i], -1, -1, -1, CLIENT_FD, ROOT, &why), 0);
		m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_OPEN, 0);
		assert_non_null(m);
		assert_int_equal(m->channel_open->qps, want[i]);
		assert_true(m->channel_open->ring_size == (i ? RING : MESH_RING_DEFAULT));
		slots[i] = m->channel_open->slot;
		ports[i] = m->channel_open->src_port;
		for (int j = 0; j < i; j++) {
			assert_int_not_equal(slots[i], slots[j]);
			assert_int_not_equal(ports[i], ports[j]);
		}
		mesh_peer_msg_free(m);
	}
	assert_int_equal(c->t.m.n_channels, 4);
	mt_finish(&c->t);
}

static void channel_on_message__accept__open_and_delivered_with_four_fds(void **state)
{
	struct ct *c = *state;
	struct channel *ch;
	struct chan *h;
	struct app *a;
	int seals;

	ct_init(c, 2);
	h = connect_out(c, 80, RING, 2, PEER_SLOT);
	peer_accept(c, h);
	assert_int_equal(c->n_apps, 1);
	a = &c->apps[0];
	h->app = a;
	assert_int_equal(a->client_fd, CLIENT_FD);
	assert_int_equal(a->status, 0);
	assert_true(a->setup);
	assert_int_equal(a->channel_id, h->id);
	assert_true(a->ring_size == RING);
	assert_int_equal(a->qps, 2);
	assert_int_equal(a->peer_port, 80);
	assert_int_equal(a->local_port, h->local_port);
	/* Four distinct descriptors: a sealed memfd, the lifeline socket, the kick and wake eventfds. */
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < i; j++)
			assert_int_not_equal(a->fds[i], a->fds[j]);
	seals = fcntl(a->fds[FD_MEMFD], F_GET_SEALS);
	assert_true(seals >= 0);
	seals &= F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	assert_int_equal(seals, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	assert_true(fd_is(a->fds[FD_MEMFD], "memfd:"));
	assert_true(fd_is(a->fds[FD_LIFELINE], "socket:"));
	assert_true(fd_is(a->fds[FD_KICK], "eventfd"));
	assert_true(fd_is(a->fds[FD_WAKE], "eventfd"));
	app_map(a);
	assert_int_equal(a->ctrl->peer_node, PEER);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_int_equal(ring_error(h), 0);
	assert_true(ring_tx_cons(h) == 0);
	assert_true(ring_rx_prod(h) == 0);
	ch = chn(c, h);
	assert_string_equal(channel_state_name(ch), "OPEN");
	assert_true(ch->opener);
	assert_int_equal(ch->peer_slot, PEER_SLOT);
	/* meshd keeps no copy of what only the application needs. */
	assert_int_equal(ch->memfd, -1);
	assert_int_equal(ch->app_life_fd, -1);
	/* The RX ring we announced is the application's RX area: the peer's bytes show there. */
	peer_data(c, h, 0, 0, 0, 100);
	assert_true(ring_rx_prod(h) == 100);
	app_read(h, 100);
	mt_finish(&c->t);
}

/* Kicks and lifelines name their channel by id: found in its bucket, two ids of one bucket apart,
 * and no longer once freed. */
static void channel_find__ids_sharing_a_bucket__each_found_freed_one_gone(void **state)
{
	struct ct *c = *state;
	struct chan *h, *h2;
	struct channel *ch;

	ct_init(c, 2);
	h = connect_out(c, 80, RING, 2, PEER_SLOT);
	ch = channel_find(&c->t.m, h->id);
	c->t.m.next_channel_id = h->id + MESH_CH_BUCKETS - 1;
	h2 = connect_out(c, 81, RING, 2, PEER_SLOT + 1);
	assert_int_equal(h2->id, h->id + MESH_CH_BUCKETS);
	assert_non_null(ch);
	assert_int_equal(ch->id, h->id);
	assert_ptr_not_equal(channel_find(&c->t.m, h2->id), ch);
	assert_int_equal(channel_find(&c->t.m, h2->id)->id, h2->id);
	assert_null(channel_find(&c->t.m, h->id + 2 * MESH_CH_BUCKETS));
	assert_null(channel_find(&c->t.m, h->id + 1));
	peer_reject(c, h->slot, -ECONNREFUSED);
	assert_null(channel_find(&c->t.m, h->id));
	assert_non_null(channel_find(&c->t.m, h2->id));
	peer_reject(c, h2->slot, -ECONNREFUSED);
	assert_null(channel_find(&c->t.m, h2->id));
	assert_int_equal(c->t.m.n_channels, 0);
	mt_finish(&c->t);
}

static void channel_on_message__reject__reason_delivered_and_everything_freed(void **state)
{
	struct ct *c = *state;
	struct chan *h, *h2;
	uint32_t id, slot;
	size_t regs;

	ct_init(c, 2);
	regs = c->t.fx->n_regs;
	h = connect_out(c, 80, RING, 2, PEER_SLOT);
	id = h->id;
	slot = h->slot;
	assert_int_equal(c->t.fx->live_mrs, 2 + 6);
	peer_reject(c, slot, -ECONNREFUSED);
	assert_int_equal(c->n_apps, 1);
	assert_int_equal(c->apps[0].client_fd, CLIENT_FD);
	assert_int_equal(c->apps[0].status, -ECONNREFUSED);
	assert_false(c->apps[0].setup);
	/* Why, in words the errno's name does not already say (the application prints both). */
	if (strcmp(c->apps[0].why, "nobody listens on that port"))
		fail_msg("reply text \"%s\" is not \"nobody listens on that port\"", c->apps[0].why);
	/* Freed, and its registrations deregistered by the reap after the batch. */
	assert_null(channel_find(&c->t.m, id));
	assert_int_equal(c->t.m.n_channels, 0);
	assert_null(c->l->ch_slots[slot]);
	assert_int_equal(c->t.fx->live_mrs, 2);
	assert_int_equal(c->t.fx->n_deregs, 6);
	assert_int_equal(c->t.fx->n_regs, regs + 6);
	assert_true(c->watch_del[id] >= 1);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	/* The slot serves the next channel. */
	h2 = connect_out(c, 80, RING, 2, PEER_SLOT);
	assert_int_equal(h2->slot, slot);
	mt_finish(&c->t);
}

static void expect_connect_refused(struct ct *c, uint32_t node, int err)
{
	size_t regs = c->t.fx->n_regs, posts = c->t.fx->n_posts;
	const char *why = NULL;
	int ret = channel_connect(&c->t.m, node, 80, RING, 0, -1, -1, -1, CLIENT_FD, ROOT, &why);

	if (ret != err)
		fail_msg("channel_connect to node %u: %d (%s), expected %d (%s)", node, ret, mesh_strerror(ret), err,
			 mesh_strerror(err));
	assert_non_null(why);
	assert_int_equal(c->t.fx->n_regs, regs);
	assert_int_equal(c->t.fx->n_posts, posts);
	assert_int_equal(c->t.m.n_channels, 0);
	assert_int_equal(c->n_apps, 0);
}

static void channel_connect__unknown_node__eunknownnode(void **state)
{
	struct ct *c = *state;

	ct_init(c, 2);
	expect_connect_refused(c, UNKNOWN_NODE, -MESH_EUNKNOWNNODE);
	mt_finish(&c->t);
}

static void channel_connect__link_down__enetunreach(void **state)
{
	struct ct *c = *state;

	ct_init(c, 2);
	assert_int_equal(link_state(lk(&c->t, DOWN_NODE)), LINK_STATE_DOWN_);
	expect_connect_refused(c, DOWN_NODE, -ENETUNREACH);
	mt_finish(&c->t);
}

/* ---- channels to the local node ---- */

/* Delivers what the local channels queued, until nothing more comes (bounded: no livelock). */
static void local_settle(struct ct *c)
{
	for (int i = 0; channel_local_run(&c->t.m); i++)
		if (i > 1000)
			fail_msg("channels to the local node keep queueing work");
}

static void channel_connect__self_nobody_listens__refused_without_the_transport(void **state)
{
	struct ct *c = *state;
	size_t regs, posts;
	const char *why = NULL;

	ct_init(c, 2);
	regs = c->t.fx->n_regs;
	posts = c->t.fx->n_posts;
	assert_int_equal(channel_connect(&c->t.m, SELF, 80, RING, 0, -1, -1, -1, CLIENT_FD, ROOT, &why), 0);
	assert_int_equal(c->n_apps, 0); /* answered once the Open reached "the peer": after the batch */
	local_settle(c);
	assert_int_equal(c->n_apps, 1);
	assert_int_equal(c->apps[0].client_fd, CLIENT_FD);
	assert_int_equal(c->apps[0].status, -ECONNREFUSED);
	assert_int_equal(c->t.m.n_channels, 0);
	/* Nothing of it touched a link or a device. */
	assert_int_equal(c->t.fx->n_regs, regs);
	assert_int_equal(c->t.fx->n_posts, posts);
	mt_finish(&c->t);
}

/* Both ends delivered, bytes copied ring to ring with the receiver's credits, the EOF after the
 * last byte, and both channels freed once both applications are gone. */
static void channel_connect__self_listener__ring_to_ring_then_closed(void **state)
{
	struct ct *c = *state;
	struct app *op, *ac;
	size_t regs, posts;
	const char *why = NULL;
	uint64_t sent = 0, got = 0, total = 3 * RING + 1000;

	ct_init(c, 2);
	regs = c->t.fx->n_regs;
	posts = c->t.fx->n_posts;
	assert_int_equal(channel_listen(&c->t.m, 80, LISTEN_FD, ROOT, &why), 0);
	assert_int_equal(channel_connect(&c->t.m, SELF, 80, RING, 2, -1, -1, -1, CLIENT_FD, ROOT, &why), 0);
	local_settle(c);
	assert_int_equal(c->n_apps, 2);
	ac = c->apps[0].client_fd == LISTEN_FD ? &c->apps[0] : &c->apps[1];
	op = ac == &c->apps[0] ? &c->apps[1] : &c->apps[0];
	assert_int_equal(ac->client_fd, LISTEN_FD);
	assert_int_equal(op->client_fd, CLIENT_FD);
	assert_true(op->setup && ac->setup && op->status == 0 && ac->status == 0);
	assert_int_equal(op->peer_port, 80);
	assert_int_equal(ac->local_port, 80);
	assert_int_equal(ac->peer_port, op->local_port);
	assert_int_equal(c->t.m.n_channels, 2);
	app_map(op);
	app_map(ac);
	assert_int_equal(channel_find(&c->t.m, op->channel_id)->peer_node, SELF);
	/* Three rings and a bit: only the reader's credits let the writer go on. */
	while (got < total) {
		uint64_t room = RING - (op->tx_prod - atomic_load(&op->ctrl->tx_cons));
		uint64_t n = MIN(room, total - sent), avail;

		for (uint64_t i = 0; i < n; i++)
			op->tx[(sent + i) & (RING - 1)] = pat(sent + i, SALT_OUT);
		sent += n;
		op->tx_prod = sent;
		atomic_store(&op->ctrl->tx_prod, sent);
		loop_kick(&c->t.m, op->channel_id);
		local_settle(c);
		avail = atomic_load(&ac->ctrl->rx_prod) - got;
		if (!n && !avail)
			fail_msg("stuck: %llu sent, %llu received", (unsigned long long)sent, (unsigned long long)got);
		for (uint64_t i = 0; i < avail; i++)
			if (ac->rx[(got + i) & (RING - 1)] != pat(got + i, SALT_OUT))
				fail_msg("byte %llu differs", (unsigned long long)(got + i));
		got += avail;
		atomic_store(&ac->ctrl->rx_cons, got);
		loop_kick(&c->t.m, ac->channel_id);
		local_settle(c);
	}
	assert_true(sent == total && got == total);
	/* The opener shuts its side and goes: the acceptor sees the EOF after the last byte. */
	atomic_fetch_or(&op->ctrl->app_flags, MESH_APP_SHUT_WR);
	app_close(op);
	channel_on_lifeline(&c->t.m, op->channel_id);
	local_settle(c);
	assert_true(atomic_load(&ac->ctrl->state) & MESH_STATE_PEER_EOF);
	assert_int_equal(atomic_load(&ac->ctrl->rx_prod), total);
	assert_int_equal(atomic_load(&ac->ctrl->error), 0);
	app_close(ac);
	channel_on_lifeline(&c->t.m, ac->channel_id);
	local_settle(c);
	/* The close handshake ran through the queue alone, with no tick and nothing on the link. */
	assert_int_equal(c->t.m.n_channels, 0);
	assert_int_equal(c->t.fx->n_regs, regs);
	assert_int_equal(c->t.fx->n_posts, posts);
	mt_finish(&c->t);
}

static void channel_connect__registration_fails__refused_nothing_left(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;
	size_t posts;
	int ret;

	ct_init(c, 2);
	posts = c->t.fx->n_posts;
	/* TX and RX register, the credit word does not. */
	c->t.fx->fail_mr_reg = (struct fake_fail){.err = -EFAULT, .skip = 2};
	ret = channel_connect(&c->t.m, PEER, 80, RING, 2, -1, -1, -1, CLIENT_FD, ROOT, &why);
	assert_true(ret < 0);
	assert_non_null(why);
	if (!strstr(why, "registration"))
		fail_msg("why \"%s\" does not name the registration", why);
	mesh_reap(&c->t.m);
	assert_int_equal(c->t.m.n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 2);
	assert_int_equal(c->t.fx->n_posts, posts);
	assert_int_equal(c->n_apps, 0);
	/* The next connect works, in the same slot. */
	connect_out(c, 80, RING, 2, PEER_SLOT);
	assert_int_equal(c->chans[0].slot, 0);
	mt_finish(&c->t);
}

static void channel_tick__no_answer__etimedout_then_closed_after_late_accept(void **state)
{
	struct ct *c = *state;
	uint64_t t0;
	size_t from;
	struct chan *h;

	ct_init(c, 2);
	h = connect_out(c, 80, RING, 2, PEER_SLOT);
	t0 = chn(c, h)->open_ms;
	tick_at(&c->t, t0 + c->t.cfg.handshake_timeout_ms);
	assert_int_equal(c->n_apps, 0);
	tick_at(&c->t, t0 + c->t.cfg.handshake_timeout_ms + 1);
	assert_int_equal(c->n_apps, 1);
	assert_int_equal(c->apps[0].client_fd, CLIENT_FD);
	assert_int_equal(c->apps[0].status, -ETIMEDOUT);
	/* The peer may still accept and then write into our ring: the channel and its memory stay. */
	assert_int_equal(c->t.m.n_channels, 1);
	assert_int_equal(c->t.fx->live_mrs, 2 + 6);
	assert_string_equal(channel_state_name(chn(c, h)), "OPENING");
	complete_sends(c);
	from = c->t.fx->n_posts;
	peer_accept(c, h);
	assert_int_equal(c->n_apps, 1); /* nobody hears twice */
	assert_int_equal(sent_close_reason(c, h, from), -ECONNRESET);
	assert_int_equal(fake_post_count(c->t.fx, from, XPORT_OP_WRITE_IMM, 0), 0);
	assert_int_equal(c->t.m.n_channels, 1);
	complete_sends(c);
	peer_close_ack(c, h);
	assert_int_equal(c->t.m.n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 2);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

static void channel_tick__timeout_then_reject__freed_without_second_reply(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = connect_out(c, 80, RING, 2, PEER_SLOT);
	tick_at(&c->t, chn(c, h)->open_ms + c->t.cfg.handshake_timeout_ms + 1);
	assert_int_equal(c->n_apps, 1);
	assert_int_equal(c->apps[0].status, -ETIMEDOUT);
	peer_reject(c, h->slot, -ECONNREFUSED);
	assert_int_equal(c->n_apps, 1);
	assert_int_equal(c->t.m.n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 2);
	mt_finish(&c->t);
}

/* ---- incoming channels ------------------------------------------------------------------------ */

static void channel_on_message__open_to_listener__delivered_and_accepted(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;
	struct ch_regs r;
	struct channel *ch;
	struct fake_post *p;
	struct chan *h;
	struct app *a;
	size_t from;

	ct_init(c, 3);
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ROOT, &why), 0);
	h = open_in(c, 50000, 7000, RING, 2, PEER_SLOT);
	r = find_regs(c, RING);
	/* The Accept named the ring and credit word the peer may write, with their keys. */
	assert_ptr_equal(h->our_rx, r.rx->addr);
	assert_int_equal(h->our_rx_rkey, r.rx->rkey);
	assert_ptr_equal(h->our_credit, r.cin->addr);
	assert_int_equal(h->our_credit_rkey, r.cin->rkey);
	a = h->app;
	assert_int_equal(a->client_fd, LISTEN_FD);
	assert_int_equal(a->channel_id, h->id);
	assert_true(a->ring_size == RING);
	assert_int_equal(a->qps, 2);
	assert_int_equal(a->local_port, 7000);
	assert_int_equal(a->peer_port, 50000);
	assert_int_equal(a->ctrl->peer_node, PEER);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	ch = chn(c, h);
	assert_false(ch->opener);
	assert_int_equal(ch->peer_slot, PEER_SLOT);
	assert_string_equal(channel_state_name(ch), "OPEN");
	/* It sends as the opener asked: over 2 QPs, into the opener's ring, naming the opener's slot. */
	from = c->t.fx->n_posts;
	app_write(h, 2 * CHUNK);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 2);
	for (size_t i = 0; i < 2; i++) {
		p = write_post(c, h, from, false, i);
		assert_int_equal(p->conn_id, conn_id(c->l->conns[i]));
		assert_true(p->raddr == (uintptr_t)h->peer_rx + i * CHUNK);
		assert_int_equal(p->imm, MESH_IMM(0, PEER_SLOT, i));
	}
	mt_finish(&c->t);
}

static void channel_on_message__open_without_listener__rejected_econnrefused(void **state)
{
	struct ct *c = *state;
	size_t from, regs;
	struct chan *h;
	PeerMsg *m;

	ct_init(c, 2);
	h = chan_new(c, RING, PEER_SLOT);
	from = c->t.fx->n_posts;
	regs = c->t.fx->n_regs;
	peer_open(c, h, 50000, 7001, 2);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_REJECT, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_reject->slot, PEER_SLOT);
	assert_int_equal(m->channel_reject->reason, -ECONNREFUSED);
	mesh_peer_msg_free(m);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_ACCEPT), 0);
	assert_int_equal(c->t.fx->n_regs, regs);
	assert_int_equal(c->t.m.n_channels, 0);
	assert_int_equal(c->n_apps, 0);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

static void channel_client_gone__listener__no_longer_accepts(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;
	size_t from;
	struct chan *h;
	PeerMsg *m;

	ct_init(c, 2);
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ROOT, &why), 0);
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD + 1, ROOT, &why), -EADDRINUSE);
	channel_client_gone(&c->t.m, LISTEN_FD);
	h = chan_new(c, RING, PEER_SLOT);
	from = c->t.fx->n_posts;
	peer_open(c, h, 50000, 7000, 2);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_REJECT, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_reject->reason, -ECONNREFUSED);
	mesh_peer_msg_free(m);
	assert_int_equal(c->n_apps, 0);
	assert_int_equal(c->t.m.n_channels, 0);
	/* The port is free for another client. */
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD + 1, ROOT, &why), 0);
	mt_finish(&c->t);
}

static void channel_on_message__listener_cannot_take_it__rejected_and_freed(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;
	size_t from;
	struct chan *h;
	PeerMsg *m;

	ct_init(c, 2);
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ROOT, &why), 0);
	h = chan_new(c, RING, PEER_SLOT);
	from = c->t.fx->n_posts;
	c->deliver_err = -EPIPE;
	peer_open(c, h, 50000, 7000, 2);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_REJECT, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_reject->slot, PEER_SLOT);
	assert_int_equal(m->channel_reject->reason, -ECONNREFUSED);
	mesh_peer_msg_free(m);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_ACCEPT), 0);
	assert_int_equal(c->t.m.n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 2);
	mt_finish(&c->t);
}

/* The reason of our first ChannelReject since from. */
static int sent_reject_reason(struct ct *c, size_t from)
{
	PeerMsg *m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_REJECT, 0);
	int reason;

	if (!m)
		fail_msg("no ChannelReject was sent");
	reason = m->channel_reject->reason;
	mesh_peer_msg_free(m);
	return reason;
}

/* A peer may have opened only so many channels, and so much ring memory, to us at once: one more is
 * refused with -EBUSY (meshd would pin whatever a peer asks for); room again once one closes. */
static void channel_on_message__open_beyond_the_peers_share__rejected_ebusy(void **state)
{
	struct ct *c = *state;
	const char *why;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	c->t.cfg.max_channels_per_link = 2;
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ROOT, &why), 0);
	open_in(c, 50000, 7000, RING, 2, PEER_SLOT);
	open_in(c, 50001, 7000, RING, 2, PEER_SLOT + 1);
	h = chan_new(c, RING, PEER_SLOT + 2);
	from = c->t.fx->n_posts;
	peer_open(c, h, 50002, 7000, 2);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_ACCEPT), 0);
	assert_int_equal(sent_reject_reason(c, from), -EBUSY);
	assert_int_equal(c->t.m.n_channels, 2);

	/* The memory share, 1 MiB: the two small channels take 16 KiB (both directions), one with
	 * 256 KiB rings 512 KiB more; a second such one would pass the share. */
	c->t.cfg.max_channels_per_link = 100;
	c->t.cfg.max_ring_mib_per_link = 1;
	open_in(c, 50003, 7000, 256u << 10, 2, PEER_SLOT + 3);
	h = chan_new(c, 256u << 10, PEER_SLOT + 4);
	from = c->t.fx->n_posts;
	peer_open(c, h, 50004, 7000, 2);
	assert_int_equal(sent_reject_reason(c, from), -EBUSY);
	assert_int_equal(c->t.m.n_channels, 3);
	mt_finish(&c->t);
}

/* Like TCP: a user other than root cannot take a well-known port before its service starts. */
static void channel_listen__port_below_1024_not_root__eacces(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;

	ct_init(c, 2);
	assert_int_equal(channel_listen(&c->t.m, 80, LISTEN_FD, ALICE, &why), -EACCES);
	assert_non_null(strstr(why, "below 1024"));
	assert_int_equal(channel_listen(&c->t.m, 1023, LISTEN_FD, ALICE, &why), -EACCES);
	assert_int_equal(channel_listen(&c->t.m, 1024, LISTEN_FD, ALICE, &why), 0);
	assert_int_equal(channel_listen(&c->t.m, 80, LISTEN_FD + 1, ROOT, &why), 0);
	mt_finish(&c->t);
}

static void channel_listen__port_held_by_another_user__eaddrinuse_naming_it(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;

	ct_init(c, 2);
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ALICE, &why), 0);
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD + 1, BOB, &why), -EADDRINUSE);
	assert_non_null(strstr(why, "another user"));
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD + 1, ROOT, &why), -EADDRINUSE);
	mt_finish(&c->t);
}

/* Every user has a share of channels and of pinned ring memory: one more is -EDQUOT for that user
 * alone, and a channel that closes gives its room back. */
static void channel_connect__beyond_the_users_quota__edquot(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;
	struct channel *ch;

	ct_init(c, 2);
	c->t.cfg.max_channels_per_uid = 2;
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), 0);
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), 0);
	for (ch = c->t.m.channels; ch; ch = ch->next)
		assert_int_equal(ch->owner_uid, ALICE);
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), -EDQUOT);
	assert_non_null(strstr(why, "max_channels_per_uid"));
	assert_int_equal(c->t.m.n_channels, 2);
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, BOB, &why), 0);

	/* Bytes: both directions count; 2 x 64 KiB fits 128 KiB, a third ring of 4 KiB does not. */
	c->t.cfg.max_channels_per_uid = 100;
	c->t.cfg.max_ring_bytes_per_uid = 2 * (2 * RING) + (2u * (64u << 10));
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, 64u << 10, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), 0);
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, 4096, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), -EDQUOT);
	assert_non_null(strstr(why, "max_ring_bytes_per_uid"));
	mt_finish(&c->t);
}

/* A user other than root holds at most half of the channels meshd's descriptors allow (four each,
 * after the reserve for links and control clients): under a low RLIMIT_NOFILE one user's channels
 * took every descriptor and no other user got one. Bob and root still open theirs. */
static void channel_connect__half_of_the_descriptor_budget__edquot_others_still_open(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;
	uint64_t reserve;
	int open = util_fds_open(), alice = 0;

	ct_init(c, 2);
	assert_true(open > 0);
	reserve = 32 + 2ull * c->t.m.n_links * c->t.cfg.qps_per_link * c->t.m.n_rails;
	/* Room for 40 channels besides what the test process holds: 20 for one user. */
	c->t.m.fd_limit = (uint64_t)open + reserve + 40 * 4;
	while (alice < 40 && !channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ALICE, &why))
		alice++;
	if (alice != (int)(((uint64_t)open + 40 * 4) / 4 / 2))
		fail_msg("Alice opened %d channels, expected half of the %llu the budget allows: %s", alice,
			 (unsigned long long)(((uint64_t)open + 40 * 4) / 4), why);
	assert_non_null(strstr(why, "half of the channels meshd's descriptors allow"));
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, BOB, &why), 0);
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ROOT, &why), 0);
	mt_finish(&c->t);
}

/* Inside one link a user other than root holds at most half of what the peer takes from this node
 * (max_channels_per_link, max_ring_mib_per_link): the rest stay for other users and root. */
static void channel_connect__half_of_the_links_share__edquot_others_still_open(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;

	ct_init(c, 2);
	c->t.cfg.max_channels_per_link = 4;
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), 0);
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), 0);
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), -EDQUOT);
	assert_non_null(strstr(why, "half of cluster.max_channels_per_link"));
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, BOB, &why), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ROOT, &why), 0);

	/* Bytes: half of 1 MiB is 512 KiB; Bob's 4 KiB ring and a 256 KiB one (both directions) pass it. */
	c->t.cfg.max_channels_per_link = 100;
	c->t.cfg.max_ring_mib_per_link = 1;
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, 256u << 10, 2, -1, -1, -1, CLIENT_FD, BOB, &why), -EDQUOT);
	assert_non_null(strstr(why, "half of cluster.max_ring_mib_per_link"));
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, 128u << 10, 2, -1, -1, -1, CLIENT_FD, BOB, &why), 0);
	mt_finish(&c->t);
}

/* Channels accepted on a port are its listener's: they count against that user's quota, and the
 * peer's connect hears -EDQUOT. */
static void channel_on_message__open_beyond_the_listeners_quota__rejected_edquot(void **state)
{
	struct ct *c = *state;
	const char *why;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	c->t.cfg.max_channels_per_uid = 1;
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ALICE, &why), 0);
	h = open_in(c, 50000, 7000, RING, 2, PEER_SLOT);
	assert_int_equal(channel_find(&c->t.m, h->id)->owner_uid, ALICE);
	h = chan_new(c, RING, PEER_SLOT + 1);
	from = c->t.fx->n_posts;
	peer_open(c, h, 50001, 7000, 2);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_ACCEPT), 0);
	assert_int_equal(sent_reject_reason(c, from), -EDQUOT);
	assert_int_equal(c->t.m.n_channels, 1);
	mt_finish(&c->t);
}

static void channel_on_message__open_with_more_qps_than_link__rejected_einval(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;
	size_t from;
	struct chan *h;
	PeerMsg *m;

	ct_init(c, 2);
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ROOT, &why), 0);
	h = chan_new(c, RING, PEER_SLOT);
	from = c->t.fx->n_posts;
	peer_open(c, h, 50000, 7000, 3);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_REJECT, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_reject->reason, -EINVAL);
	mesh_peer_msg_free(m);
	assert_int_equal(c->n_apps, 0);
	assert_int_equal(c->t.m.n_channels, 0);
	mt_finish(&c->t);
}

/* ---- the data path: sending -------------------------------------------------------------------- */

/* The data writes posted since from: striped round-robin from QP q0, consecutive sequence numbers
 * from seq0 and stream positions from pos0, each at most `chunk` bytes, never across the ring's
 * end, each to the peer's ring at pos & (size - 1) with its key, sourced from our TX ring at the
 * same offset. Returns the bytes they carry. */
static uint64_t check_data_posts(struct ct *c, struct chan *h, size_t from, uint32_t q0, uint16_t seq0, uint64_t pos0,
				 uint32_t chunk)
{
	struct channel *ch = chn(c, h);
	struct ch_regs r = find_regs(c, h->size);
	uint64_t pos = pos0;
	struct fake_post *p;

	for (size_t i = 0; (p = write_post(c, h, from, false, i)); i++) {
		uint64_t off = pos & (h->size - 1);
		uint32_t qp = ch->qp0 + (uint32_t)((q0 + i) % ch->qps);

		if (p->conn_id != conn_id(c->l->conns[qp]))
			fail_msg("chunk %zu went on conn %u, expected QP %u (conn %u)", i, p->conn_id, qp,
				 conn_id(c->l->conns[qp]));
		assert_true(p->len > 0);
		assert_true(p->len <= chunk);
		assert_true(p->len <= CH_CHUNK_MAX);
		assert_true(p->len <= h->size / 4);
		if (off + p->len > h->size)
			fail_msg("chunk %zu at offset %llu + %u crosses the ring end", i, (unsigned long long)off,
				 p->len);
		assert_true(p->raddr == (uintptr_t)h->peer_rx + off);
		assert_int_equal(p->rkey, PEER_RX_RKEY);
		assert_int_equal(p->imm, MESH_IMM(0, h->peer_slot, (uint16_t)(seq0 + i)));
		assert_ptr_equal(p->mr->addr, r.tx->addr);
		assert_ptr_equal(p->buf, (uint8_t *)r.tx->addr + off);
		for (size_t j = 0; j < i; j++)
			assert_true(write_post(c, h, from, false, j)->wr_id != p->wr_id);
		pos += p->len;
	}
	return pos - pos0;
}

/* The peer's ring holds our stream's bytes [lo, hi). */
static void check_peer_ring(const struct chan *h, uint64_t lo, uint64_t hi)
{
	for (uint64_t p = lo; p < hi; p++)
		if (h->peer_rx[p & (h->size - 1)] != pat(p, SALT_OUT))
			fail_msg("the peer's ring has 0x%02x for stream byte %llu, we wrote 0x%02x",
				 h->peer_rx[p & (h->size - 1)], (unsigned long long)p, pat(p, SALT_OUT));
}

static void channel_on_kick__app_wrote__chunks_striped_round_robin(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 3);
	h = open_out(c, RING, 3, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 3000);
	/* Published, not kicked: meshd does not look. */
	assert_int_equal(write_count(c, h, from, false), 0);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 3); /* 1024 + 1024 + 952 over QPs 0, 1, 2 */
	assert_true(check_data_posts(c, h, from, 0, 0, 0, CHUNK) == 3000);
	assert_int_equal(chn(c, h)->inflight, 3);
	complete_data(c, h, from);
	/* Written is not reusable yet: only what the peer's meshd says it placed (lost with the link,
	 * a written chunk is written again from this ring). */
	assert_true(ring_tx_cons(h) == 0);
	peer_credit_placed(c, h, 0, 3000);
	assert_true(ring_tx_cons(h) == 3000);
	check_peer_ring(h, 0, 3000);
	assert_true(chn(c, h)->tx_bytes == 3000);
	assert_true(chn(c, h)->tx_chunks == 3);

	/* Around the ring's end: 3000..4024, 4024..4096, then 4096.. at offset 0; QPs and seqs go on. */
	peer_credit(c, h, 3000);
	from = c->t.fx->n_posts;
	app_write(h, 2000);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 3);
	assert_true(check_data_posts(c, h, from, 0, 3, 3000, CHUNK) == 2000);
	assert_int_equal(write_post(c, h, from, false, 1)->len, RING - 4024);
	complete_data(c, h, from);
	peer_credit_placed(c, h, 3000, 5000);
	assert_true(ring_tx_cons(h) == 5000);
	check_peer_ring(h, 5000 - RING, 5000);
	mt_finish(&c->t);
}

/* A ring of four chunks or more: chunks of CH_CHUNK_MAX; a smaller one: of a quarter of it. */
static void channel_on_kick__large_ring__chunks_of_chunk_max(void **state)
{
	struct ct *c = *state;
	const uint64_t size = 8 * (uint64_t)CH_CHUNK_MAX;
	const uint32_t n = 3 * CH_CHUNK_MAX + 3392;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, size, 2, PEER_SLOT);
	assert_int_equal(chn(c, h)->chunk, CH_CHUNK_MAX);
	from = c->t.fx->n_posts;
	app_write(h, n);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 4);
	assert_true(check_data_posts(c, h, from, 0, 0, 0, CH_CHUNK_MAX) == n);
	for (size_t i = 0; i < 3; i++)
		assert_int_equal(write_post(c, h, from, false, i)->len, CH_CHUNK_MAX);
	complete_data(c, h, from);
	check_peer_ring(h, 0, n);
	mt_finish(&c->t);
}

static void channel_open__ring_under_four_chunks__chunk_of_a_quarter(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, 2 * (uint64_t)CH_CHUNK_MAX, 2, PEER_SLOT);
	assert_int_equal(chn(c, h)->chunk, CH_CHUNK_MAX / 2);
	mt_finish(&c->t);
}

static void channel_on_kick__peer_credit_exhausted__stops_exactly_at_credit(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, RING);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 4);
	complete_data(c, h, from);
	peer_credit_placed(c, h, 0, RING);
	assert_true(ring_tx_cons(h) == RING);
	/* A whole ring the reader has not consumed: the sender waits for it (once counted). */
	assert_true(chn(c, h)->credit_stalls == 1);

	/* The ring is free again, but the peer's reader has not consumed anything: nothing may go. */
	from = c->t.fx->n_posts;
	app_write(h, 1500);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_true(chn(c, h)->credit_stalls == 1);
	app_kick(c, h);
	tick(&c->t);
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_true(chn(c, h)->credit_stalls == 1);

	/* 1000 bytes of credit: exactly 1000 bytes go; a ring is still unconsumed: the same wait. */
	peer_credit(c, h, 1000);
	assert_int_equal(write_count(c, h, from, false), 1);
	assert_true(check_data_posts(c, h, from, 0, 4, RING, CHUNK) == 1000);
	assert_true(chn(c, h)->credit_stalls == 1);

	/* Everything credited: the rest. */
	peer_credit(c, h, RING);
	assert_true(check_data_posts(c, h, from, 0, 4, RING, CHUNK) == 1500);
	complete_data(c, h, from);
	peer_credit_placed(c, h, RING, RING + 1500);
	assert_true(ring_tx_cons(h) == RING + 1500);
	check_peer_ring(h, 1500, RING + 1500);
	mt_finish(&c->t);
}

static void channel_on_completion__out_of_order__tx_cons_over_completed_prefix(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 3);
	h = open_out(c, RING, 3, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 3000);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 3);
	/* The peer's meshd saw all of it placed (its immediates can beat our completions). */
	peer_credit_placed(c, h, 0, 3000);
	complete_write(c, h, write_post(c, h, from, false, 2));
	assert_true(ring_tx_cons(h) == 0);
	assert_int_equal(chn(c, h)->inflight, 2);
	complete_write(c, h, write_post(c, h, from, false, 0));
	assert_true(ring_tx_cons(h) == CHUNK);
	complete_write(c, h, write_post(c, h, from, false, 1));
	assert_true(ring_tx_cons(h) == 3000);
	assert_int_equal(chn(c, h)->inflight, 0);
	mt_finish(&c->t);
}

static void channel_on_imm__credit_beyond_sent__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 1000);
	app_kick(c, h);
	complete_data(c, h, from);
	from = c->t.fx->n_posts;
	peer_credit(c, h, 1001);
	assert_int_equal(sent_close_reason(c, h, from), -EPROTO);
	app_write(h, 100);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_on_imm__credit_going_back__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 2000);
	app_kick(c, h);
	complete_data(c, h, from);
	peer_credit(c, h, 1500);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	peer_credit(c, h, 1499);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

/* The peer's next credit write may land while we read the words of the last one: an RDMA WRITE's
 * bytes are placed in no promised order, so one pair of words could be read half old, half new
 * (seen in the VM under 12 streams, twice: "peer placed 52137984 bytes, outside [52139008,
 * 52140032]"). Each credit has its slot: the one the immediate names is whole, whatever the next
 * write is doing to its own; and a placed position behind its own reader is the peer's error. */
static void channel_on_imm__credit_slots__next_write_landing_is_not_read(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct channel *ch;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	ch = chn(c, h);
	from = c->t.fx->n_posts;
	app_write(h, 3000);
	app_kick(c, h);
	complete_data(c, h, from);
	/* Credit 0 whole in slot 0; credit 1 half landed in slot 1 (its reader, not yet its placed). */
	h->our_credit[0] = 1500;
	h->our_credit[1] = 1800;
	h->our_credit[2] = 2500;
	h->our_credit[3] = 0;
	peer_imm(c, 0, MESH_IMM(1, h->slot, 0), MESH_CREDIT_LEN);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_true(ch->peer_cons == 1500);
	assert_true(ch->peer_placed == 1800);
	/* Credit 1 lands whole, its immediate follows. */
	h->our_credit[3] = 2600;
	peer_imm(c, 0, MESH_IMM(1, h->slot, 1), MESH_CREDIT_LEN);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_true(ch->peer_cons == 2500);
	assert_true(ch->peer_placed == 2600);
	/* Placed behind its own reader: nobody's torn words, the peer's error. */
	peer_credit_placed(c, h, 2700, 2650);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

/* ---- the data path: receiving ------------------------------------------------------------------ */

static void channel_on_imm__chunks_out_of_order__rx_prod_when_contiguous(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 1, 2, 2 * CHUNK, 500);
	assert_true(ring_rx_prod(h) == 0);
	peer_data(c, h, 0, 0, 0, CHUNK);
	assert_true(ring_rx_prod(h) == CHUNK);
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	assert_true(ring_rx_prod(h) == 2 * CHUNK + 500);
	assert_true(chn(c, h)->rx_chunks == 3);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	app_read(h, 2 * CHUNK + 500);
	mt_finish(&c->t);
}

static void channel_on_imm__duplicate_pending_seq__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	expect_broken(c, h, -EPROTO);
	assert_true(ring_rx_prod(h) == 0);
	mt_finish(&c->t);
}

static void channel_on_imm__duplicate_delivered_seq__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 0, 0, 0, CHUNK);
	peer_data(c, h, 0, 0, 0, CHUNK);
	expect_broken(c, h, -EPROTO);
	assert_true(ring_rx_prod(h) == CHUNK);
	mt_finish(&c->t);
}

static void channel_on_imm__seq_outside_window__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	uint16_t w;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	w = (uint16_t)chn(c, h)->rx_window;
	peer_data(c, h, 1, (uint16_t)(w - 1), 0, 10); /* the last of the window: kept */
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	peer_imm(c, 1, MESH_IMM(0, h->slot, w), 10);
	expect_broken(c, h, -EPROTO);
	assert_true(ring_rx_prod(h) == 0);
	mt_finish(&c->t);
}

/* Each QP has its own CQ and meshd drains one after the other, while the sender's window of
 * CH_WINDOW chunks waits only for its NIC's acknowledgements: a receiver that has not yet looked at
 * QP 0's CQ sees QP 1's chunks far past rx_seq. Here 193 of QP 1's chunks (seqs 1, 3, ... 385: what
 * QP 0's 64 receives and the sender's window allow) before chunk 0. None may break the channel. */
static void channel_on_imm__one_qp_lags_past_the_senders_window__kept_in_order(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	const uint32_t len = 8, last = 385;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	assert_true(chn(c, h)->rx_window > last);
	for (uint32_t s = 1; s <= last; s += 2)
		peer_data(c, h, 1, (uint16_t)s, (uint64_t)s * len, len);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_true(ring_rx_prod(h) == 0);
	for (uint32_t s = 0; s <= last; s += 2) {
		peer_data(c, h, 0, (uint16_t)s, (uint64_t)s * len, len);
		assert_true(ring_rx_prod(h) == (uint64_t)(s + 2) * len);
	}
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_true(chn(c, h)->rx_chunks == last + 1);
	app_read(h, (uint64_t)(last + 1) * len);
	mt_finish(&c->t);
}

/* The window covers the worst case of the QP count: at most 8192 (16 QPs), under half of the
 * 16-bit sequence space, so an old chunk is never taken for a new one. */
static void channel_rx_window__every_qp_count__covers_lag_and_below_half_seq_space(void **state)
{
	(void)state;
	for (uint32_t q = 1; q <= MESH_QPS_PER_LINK_MAX; q++) {
		uint32_t w = channel_rx_window(q);

		assert_true(w >= CH_WINDOW + q * (LINK_DATA_RECVS + 1));
		assert_true(w <= 32768);
		assert_int_equal(w & (w - 1), 0);
	}
}

static void channel_on_imm__zero_length__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_imm(c, 0, MESH_IMM(0, h->slot, 0), 0);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_on_imm__longer_than_ring__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_imm(c, 1, MESH_IMM(0, h->slot, 0), RING + 1);
	expect_broken(c, h, -EPROTO);
	assert_true(ring_rx_prod(h) == 0);
	mt_finish(&c->t);
}

static void channel_on_imm__beyond_reader_credit__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	for (uint16_t s = 0; s < 4; s++)
		peer_data(c, h, s % 2, s, s * CHUNK, CHUNK);
	assert_true(ring_rx_prod(h) == RING);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	/* The reader consumed nothing: a fifth chunk overruns it. */
	peer_imm(c, 0, MESH_IMM(0, h->slot, 4), CHUNK);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

/* ring.h: libmesh's window is rx_cons <= rx_prod <= rx_cons + ring_size; meshd must not publish the
 * chunk that broke it. */
static void channel_on_imm__beyond_reader_credit__rx_prod_stays_in_window(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	for (uint16_t s = 0; s < 4; s++)
		peer_data(c, h, s % 2, s, s * CHUNK, CHUNK);
	peer_imm(c, 0, MESH_IMM(0, h->slot, 4), CHUNK);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	if (ring_rx_prod(h) > h->app->rx_cons + RING)
		fail_msg("meshd published rx_prod %llu with rx_cons %llu and a ring of %u",
			 (unsigned long long)ring_rx_prod(h), (unsigned long long)h->app->rx_cons, RING);
	mt_finish(&c->t);
}

static void channel_on_kick__stream_quarter_consumed__one_credit_then_next_after_completion(void **state)
{
	struct ct *c = *state;
	struct fake_post *p;
	struct ch_regs r;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	r = find_regs(c, RING);
	for (uint16_t s = 0; s < 3; s++)
		peer_data(c, h, s % 2, s, s * CHUNK, CHUNK);
	assert_true(ring_rx_prod(h) == 3 * CHUNK);
	from = c->t.fx->n_posts;
	/* Three quarters of the ring arrived uncredited (a stream: its sender is short of room): a
	 * quarter read is worth a credit (ring.h mesh_ring_credit_step). Less than a quarter: none. */
	app_read(h, 1000);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, true), 0);
	/* A quarter. */
	app_read(h, CHUNK - 1000);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, true), 1);
	p = write_post(c, h, from, true, 0);
	assert_int_equal(p->conn_id, conn_id(c->l->conns[0]));
	assert_int_equal(p->len, MESH_CREDIT_LEN);
	assert_true(p->raddr == (uintptr_t)h->peer_credit);
	assert_int_equal(p->rkey, PEER_CREDIT_RKEY);
	assert_int_equal(p->imm, MESH_IMM(1, PEER_SLOT, 0));
	assert_ptr_equal(p->mr->addr, r.cout->addr);
	assert_true(((const uint64_t *)p->buf)[0] == CHUNK);
	assert_true(((const uint64_t *)p->buf)[1] == 3 * CHUNK); /* placed */
	assert_int_equal(write_count(c, h, from, false), 0);
	/* Everything read, but a credit is in flight: the next waits for its completion. */
	app_read(h, 2 * CHUNK);
	app_kick(c, h);
	tick(&c->t);
	assert_int_equal(write_count(c, h, from, true), 1);
	complete_write(c, h, p);
	assert_true(h->peer_credit[0] == CHUNK);
	assert_int_equal(write_count(c, h, from, true), 2);
	p = write_post(c, h, from, true, 1);
	assert_int_equal(p->imm, MESH_IMM(1, PEER_SLOT, 1)); /* the next slot */
	assert_true(*(const uint64_t *)p->buf == 3 * CHUNK);
	complete_write(c, h, p);
	assert_true(h->peer_credit[2] == 3 * CHUNK);
	assert_true(h->peer_credit[0] == CHUNK);
	/* Nothing new consumed: nothing more. */
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, true), 2);
	assert_int_equal(chn(c, h)->inflight, 0);
	mt_finish(&c->t);
}

/* A sender with room (less than three quarters of the ring arrived uncredited: requests and
 * answers, an echo) is credited per half ring, not per quarter (ring.h mesh_ring_credit_step). */
static void channel_on_kick__sender_with_room__credit_per_half_ring(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 0, 0, 0, CHUNK);
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	from = c->t.fx->n_posts;
	app_read(h, CHUNK);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, true), 0); /* a quarter: not yet */
	app_read(h, CHUNK);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, true), 1);
	assert_true(((const uint64_t *)write_post(c, h, from, true, 0)->buf)[0] == 2 * CHUNK);
	mt_finish(&c->t);
}

static void channel_on_kick__caught_up_below_a_quarter__no_credit(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 0, 0, 0, 64);
	from = c->t.fx->n_posts;
	/* A small message read to the end: the sender has most of the ring, a credit would be a
	 * write per message for nothing. */
	app_read(h, 64);
	app_kick(c, h);
	tick(&c->t);
	assert_int_equal(write_count(c, h, from, true), 0);
	mt_finish(&c->t);
}

/* ---- polling (main.c's hot loop) ------------------------------------------------------------------ */

static void channel_poll__published_without_kick__posted_and_counted(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	/* Nothing moved: nothing to do, and no pump. */
	assert_int_equal(channel_poll(&c->t.m, 0), 0);
	/* A polling meshd finds what the application published without a kick. */
	app_write(h, 100);
	assert_int_equal(channel_poll(&c->t.m, 0), 1);
	mesh_reap(&c->t.m);
	assert_int_equal(write_count(c, h, from, false), 1);
	assert_int_equal(write_post(c, h, from, false, 0)->len, 100);
	/* Seen once: the next look finds nothing new. */
	assert_int_equal(channel_poll(&c->t.m, 0), 0);
	/* A shutdown is a publication too. */
	atomic_fetch_or(&h->app->ctrl->app_flags, MESH_APP_SHUT_WR);
	assert_int_equal(channel_poll(&c->t.m, 0), 1);
	assert_true(chn(c, h)->app_shut);
	mt_finish(&c->t);
}

/* A polling meshd counts a read only once it is worth a credit (what the application kicks for
 * while meshd sleeps): every smaller one counted kept an adaptive meshd polling through a whole
 * stream of two applications that post their own writes. */
static void channel_poll__reads_below_a_credit_step__not_a_move(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	for (uint16_t s = 0; s < 4; s++)
		peer_data(c, h, s % 2, s, s * CHUNK, CHUNK);
	from = c->t.fx->n_posts;
	app_read(h, 1000);
	assert_int_equal(channel_poll(&c->t.m, 0), 0);
	app_read(h, CHUNK - 1000); /* a quarter, and a whole ring arrived: worth a credit */
	assert_int_equal(channel_poll(&c->t.m, 0), 1);
	assert_int_equal(write_count(c, h, from, true), 1);
	/* Taken: the next look finds nothing new. */
	assert_int_equal(channel_poll(&c->t.m, 0), 0);
	mt_finish(&c->t);
}

/* ---- the fast path (mesh.h, struct mesh_locks) ---------------------------------------------- */

/* A channel whose application shut its side, which the fast path marked for the usual pump: its
 * EOF (a control message) goes only when that pump runs, once. */
static void eof_left_to_the_usual_pump(struct ct *c, struct chan *h, size_t from)
{
	assert_true(c->t.m.rail_slow[0] && chn(c, h)->slow_wanted);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 0);
	channel_pump_wanted(&c->t.m, 0);
	mesh_reap(&c->t.m);
	assert_false(c->t.m.rail_slow[0] || chn(c, h)->slow_wanted);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 1);
}

/* A channel that only moves data: its rail's thread pumps it and takes its completions and
 * immediates under the rail's lock alone (deliver() offers every event to mesh_fast_event first),
 * with what the usual way gives. */
static void mesh_fast_event__open_channel_stream__taken_as_the_usual_way_would(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	uint64_t taken;

	ct_init(c, 3);
	h = open_out(c, RING, 3, PEER_SLOT);
	c->t.fast = true;
	from = c->t.fx->n_posts;
	app_write(h, 3000);
	assert_int_equal(channel_poll_fast(&c->t.m, 0), 1);
	assert_false(c->t.m.rail_slow[0]);
	assert_int_equal(write_count(c, h, from, false), 3);
	assert_true(check_data_posts(c, h, from, 0, 0, 0, CHUNK) == 3000);
	taken = c->t.fast_taken;
	complete_data(c, h, from);
	assert_int_equal(c->t.fast_taken - taken, 3);
	assert_int_equal(chn(c, h)->inflight, 0);
	peer_credit_placed(c, h, 0, 3000); /* an immediate on the rail's first QP */
	assert_int_equal(c->t.fast_taken - taken, 4);
	assert_true(ring_tx_cons(h) == 3000);
	check_peer_ring(h, 0, 3000);
	peer_data(c, h, 1, 0, 0, 700); /* an immediate on a data QP */
	assert_int_equal(c->t.fast_taken - taken, 5);
	assert_true(ring_rx_prod(h) == 700);
	assert_false(c->t.m.rail_slow[0]);
	assert_true(c->l->metrics.tx_bytes == 3000 && c->l->metrics.tx_chunks == 3 && c->l->metrics.rx_bytes == 700);
	mt_finish(&c->t);
}

/* What is more than moving data goes the usual way, as it did: a control message, a channel whose
 * application shut its side (its EOF is a control message: the fast pump marks it, the usual pump
 * sends it), a failed completion (the link fails). */
static void mesh_fast_event__control_shutdown_or_failure__left_to_the_usual_way(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct xport_event ev;
	size_t from;
	uint64_t taken;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	c->t.fast = true;
	taken = c->t.fast_taken;
	peer_eof(c, h, 0);
	assert_int_equal(c->t.fast_taken, taken);
	assert_true(chn(c, h)->eof_known);
	assert_true(ring_state(h) & MESH_STATE_PEER_EOF);

	from = c->t.fx->n_posts;
	app_shut_wr(h);
	assert_int_equal(channel_poll_fast(&c->t.m, 0), 1);
	eof_left_to_the_usual_pump(c, h, from);

	ev = wc_event(c->l->conns[1], XPORT_OP_WRITE, ((uint64_t)WR_CH_DATA << 32) | (chn(c, h)->slot << 16), 0);
	ev.status = -EIO;
	deliver(&c->t, &ev);
	assert_int_equal(c->t.fast_taken, taken);
	assert_int_not_equal(c->l->phase, LINK_UP);
	mt_finish(&c->t);
}

/* Whether the channel's kick eventfd holds a kick meshd has not read. */
static bool kick_pending(struct ct *c, struct chan *h)
{
	struct pollfd p = {.fd = chn(c, h)->kick_fd, .events = POLLIN};

	return poll(&p, 1, 0) == 1;
}

/* A kick reaches the thread of the channel's rail (channel_ops.watch), which takes it under its
 * rail's lock alone: a channel that only moves data is pumped at once; one whose application shut
 * its side is marked for the usual pump (its EOF is a control message); another rail's thread (the
 * channel moved meanwhile) leaves it unread for the set it is in now; an unknown id is nothing. */
static void channel_on_kick_fast__own_rail_pumps__shut_to_usual_way__other_rail_untouched(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	uint64_t one = 1;

	ct_init(c, 3);
	h = open_out(c, RING, 3, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 3000);
	assert_int_equal(write(h->app->fds[FD_KICK], &one, sizeof(one)), (ssize_t)sizeof(one));
	assert_false(channel_on_kick_fast(&c->t.m, h->id, 1));
	assert_true(kick_pending(c, h));
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_true(channel_on_kick_fast(&c->t.m, h->id, 0));
	assert_false(kick_pending(c, h));
	assert_false(c->t.m.rail_slow[0] || chn(c, h)->slow_wanted);
	assert_int_equal(write_count(c, h, from, false), 3);
	assert_true(check_data_posts(c, h, from, 0, 0, 0, CHUNK) == 3000);
	assert_false(channel_on_kick_fast(&c->t.m, h->id + 1000, 0));

	from = c->t.fx->n_posts;
	app_shut_wr(h);
	assert_int_equal(write(h->app->fds[FD_KICK], &one, sizeof(one)), (ssize_t)sizeof(one));
	assert_true(channel_on_kick_fast(&c->t.m, h->id, 0));
	eof_left_to_the_usual_pump(c, h, from);
	mt_finish(&c->t);
}

static void channel_set_polling__on_and_off__every_ring_flag_and_new_channels(void **state)
{
	struct ct *c = *state;
	struct chan *a, *b;

	ct_init(c, 2);
	a = open_out(c, RING, 2, PEER_SLOT);
	assert_int_equal(atomic_load(&a->app->ctrl->daemon_flags), 0);
	channel_set_polling(&c->t.m, 0, true);
	assert_true(c->t.m.polling[0]);
	assert_int_equal(atomic_load(&a->app->ctrl->daemon_flags), MESH_DAEMON_POLLING);
	/* A channel born while meshd polls says so from the start. */
	b = open_out(c, RING, 2, PEER_SLOT + 1);
	assert_int_equal(atomic_load(&b->app->ctrl->daemon_flags), MESH_DAEMON_POLLING);
	channel_set_polling(&c->t.m, 0, false);
	assert_int_equal(atomic_load(&a->app->ctrl->daemon_flags), 0);
	assert_int_equal(atomic_load(&b->app->ctrl->daemon_flags), 0);
	/* The spin hint comes from the configuration. */
	assert_int_equal(a->app->ctrl->spin_us, 77);
	mt_finish(&c->t);
}

/* ---- a hostile application ---------------------------------------------------------------------- */

static void channel_on_kick__tx_prod_beyond_ring__error_others_unaffected(void **state)
{
	struct ct *c = *state;
	struct chan *bad, *good;
	struct fake_post *p;
	size_t from;

	ct_init(c, 2);
	bad = open_out(c, RING, 2, PEER_SLOT);
	good = open_out(c, RING, 2, PEER_SLOT + 1);
	from = c->t.fx->n_posts;
	atomic_store_explicit(&bad->app->ctrl->tx_prod, RING + 1, memory_order_release);
	app_kick(c, bad);
	assert_int_equal(fake_post_count(c->t.fx, from, XPORT_OP_WRITE_IMM, 0), 0);
	assert_int_equal(sent_close_reason(c, bad, from), -EPROTO);
	expect_broken(c, bad, -EPROTO);
	/* The other channel on the same link goes on. */
	from = c->t.fx->n_posts;
	app_write(good, 100);
	app_kick(c, good);
	assert_int_equal(write_count(c, good, from, false), 1);
	p = write_post(c, good, from, false, 0);
	assert_int_equal(p->imm, MESH_IMM(0, PEER_SLOT + 1, 0));
	complete_write(c, good, p);
	peer_credit_placed(c, good, 0, 100);
	assert_true(ring_tx_cons(good) == 100);
	assert_int_equal(ring_state(good), MESH_STATE_OPEN);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

static void channel_on_kick__tx_prod_going_back__error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 100);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 1);
	from = c->t.fx->n_posts;
	atomic_store_explicit(&h->app->ctrl->tx_prod, 50, memory_order_release);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_on_kick__rx_cons_beyond_rx_prod__error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 0, 0, 0, CHUNK);
	from = c->t.fx->n_posts;
	atomic_store_explicit(&h->app->ctrl->rx_cons, CHUNK + 1, memory_order_release);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, true), 0);
	expect_broken(c, h, -EPROTO);
	assert_int_equal(sent_close_reason(c, h, from), -EPROTO);
	mt_finish(&c->t);
}

/* ---- EOF and close ------------------------------------------------------------------------------ */

static void channel_on_kick__shut_wr__eof_once_all_bytes_posted(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	PeerMsg *m;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, RING);
	app_kick(c, h);
	complete_data(c, h, from);
	peer_credit_placed(c, h, 0, RING);
	/* 1000 more and the write side shut, but no credit for them yet: no EOF. */
	from = c->t.fx->n_posts;
	app_write(h, 1000);
	app_shut_wr(h);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 0);
	assert_string_equal(channel_state_name(chn(c, h)), "HALF_CLOSED");
	/* Bytes published after SHUT_WR are not part of the stream. */
	atomic_store_explicit(&h->app->ctrl->tx_prod, RING + 1500, memory_order_release);
	peer_credit(c, h, RING);
	assert_true(check_data_posts(c, h, from, 0, 4, RING, CHUNK) == 1000);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 1);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_EOF, 0);
	assert_int_equal(m->channel_eof->slot, PEER_SLOT);
	assert_true(m->channel_eof->total == RING + 1000);
	mesh_peer_msg_free(m);
	complete_data(c, h, from);
	complete_sends(c);
	app_kick(c, h);
	tick(&c->t);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 1);
	assert_int_equal(ring_state(h) & MESH_STATE_ERROR, 0);
	mt_finish(&c->t);
}

static void channel_on_message__peer_eof__flag_once_all_bytes_arrived(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 0, 0, 0, CHUNK);
	/* The EOF overtook the second chunk (on another QP). */
	peer_eof(c, h, 2 * CHUNK);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_string_equal(channel_state_name(chn(c, h)), "HALF_CLOSED");
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	assert_true(ring_rx_prod(h) == 2 * CHUNK);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN | MESH_STATE_PEER_EOF);
	app_read(h, 2 * CHUNK);
	mt_finish(&c->t);
}

static void channel_on_message__eof_below_received__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 0, 0, 0, CHUNK);
	peer_eof(c, h, CHUNK - 1);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_on_imm__data_after_eof__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 0, 0, 0, CHUNK);
	peer_eof(c, h, CHUNK);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN | MESH_STATE_PEER_EOF);
	peer_data(c, h, 1, 1, CHUNK, 10);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_on_lifeline__after_shut_wr__close_0_when_idle_freed_on_ack(void **state)
{
	struct ct *c = *state;
	size_t from, regs;
	uint32_t id;
	struct chan *h;

	ct_init(c, 2);
	regs = c->t.fx->n_regs;
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	from = c->t.fx->n_posts;
	app_write(h, 2 * CHUNK);
	app_shut_wr(h);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 2);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 1);
	app_hangup(c, h);
	/* Two writes in flight: no Close yet. */
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE), 0);
	complete_write(c, h, write_post(c, h, from, false, 0));
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE), 0);
	complete_write(c, h, write_post(c, h, from, false, 1));
	assert_int_equal(sent_close_reason(c, h, from), 0);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE), 1);
	check_peer_ring(h, 0, 2 * CHUNK);
	/* The peer may still write until it acknowledges: everything stays registered. */
	assert_int_equal(c->t.m.n_channels, 1);
	assert_int_equal(c->t.fx->live_mrs, 2 + 6);
	complete_sends(c);
	peer_close_ack(c, h);
	assert_null(channel_find(&c->t.m, id));
	assert_int_equal(c->t.m.n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 2);
	assert_int_equal(c->t.fx->n_deregs, c->t.fx->n_regs - regs);
	assert_int_equal(c->t.fx->live_conns, (int)c->t.cfg.qps_per_link);
	assert_true(c->watch_del[id] >= 1);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

static void channel_on_lifeline__without_shut_wr__close_econnreset(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_hangup(c, h);
	assert_int_equal(sent_close_reason(c, h, from), -ECONNRESET);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 0);
	assert_int_equal(c->t.m.n_channels, 1);
	complete_sends(c);
	peer_close_ack(c, h);
	assert_int_equal(c->t.m.n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 2);
	mt_finish(&c->t);
}

static void channel_on_message__peer_close__ack_once_our_writes_completed(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	PeerMsg *m;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 2 * CHUNK);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 2);
	peer_credit_placed(c, h, 0, 2 * CHUNK);
	peer_eof(c, h, 0);
	peer_close(c, h, 0);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE_ACK), 0);
	complete_write(c, h, write_post(c, h, from, false, 1));
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE_ACK), 0);
	complete_write(c, h, write_post(c, h, from, false, 0));
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE_ACK), 1);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_CLOSE_ACK, 0);
	assert_int_equal(m->channel_close_ack->slot, PEER_SLOT);
	mesh_peer_msg_free(m);
	/* Answered, not closed a second time by us; the application sees the end of the stream. */
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE), 0);
	assert_true(ring_tx_cons(h) == 2 * CHUNK);
	assert_true(ring_state(h) & MESH_STATE_PEER_EOF);
	assert_int_equal(c->t.m.n_channels, 1);
	app_hangup(c, h);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE), 0);
	assert_int_equal(c->t.m.n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 2);
	mt_finish(&c->t);
}

/* Close and CloseAck ride QP 0, the peer's data and credits other QPs: the peer's Close may be seen
 * before its last chunk. The slot stays ours until every immediate the Close counted has landed;
 * before, the late chunk landed on the next channel that took the slot, as that channel's data. */
static void channel_on_message__close_overtakes_data__slot_kept_until_counted_chunks_land(void **state)
{
	struct ct *c = *state;
	struct chan *h, *h2;
	uint32_t id;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	peer_eof(c, h, CHUNK);
	peer_close_n(c, h, 0, 1, 0); /* one chunk sent, still in our CQ of QP 1 */
	complete_sends(c);
	app_hangup(c, h);
	assert_non_null(channel_find(&c->t.m, id));
	assert_int_equal(c->t.m.n_channels, 1);
	/* A new channel cannot take the slot meanwhile. */
	h2 = open_out(c, RING, 2, PEER_SLOT + 1);
	assert_int_not_equal(h2->slot, h->slot);
	peer_data(c, h, 1, 0, 0, CHUNK);
	assert_null(channel_find(&c->t.m, id));
	assert_int_equal(c->t.m.n_channels, 1);
	assert_true(ring_rx_prod(h2) == 0);
	assert_int_equal(ring_state(h2), MESH_STATE_OPEN);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

/* The same for the CloseAck that answers our Close: it counts the peer's credit write, which is
 * seen after it. */
static void channel_on_message__close_ack_overtakes_credit__freed_once_it_lands(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	uint32_t id;
	size_t from;
	PeerMsg m = PEER_MSG__INIT;
	ChannelCloseAck a = CHANNEL_CLOSE_ACK__INIT;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	from = c->t.fx->n_posts;
	app_shut_wr(h);
	app_hangup(c, h);
	assert_int_equal(sent_close_reason(c, h, from), 0);
	complete_sends(c);
	a.slot = h->slot;
	a.chunks = 0;
	a.credits = 1;
	m.body_case = PEER_MSG__BODY_CHANNEL_CLOSE_ACK;
	m.channel_close_ack = &a;
	peer_msg(c, &m);
	assert_non_null(channel_find(&c->t.m, id));
	peer_credit(c, h, 0);
	assert_null(channel_find(&c->t.m, id));
	assert_int_equal(c->t.fx->live_mrs, 2);
	mt_finish(&c->t);
}

/* More immediates than the peer's Close counted: the peer broke the protocol; that channel breaks
 * (-EPROTO), the link goes on. */
static void channel_on_imm__more_than_close_counted__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_close_n(c, h, 0, 0, 0);
	complete_sends(c);
	peer_data(c, h, 1, 0, 0, CHUNK);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(h), -EPROTO);
	assert_string_equal(chn(c, h)->why, "peer wrote after its close: 1 chunks and 0 credits, it counted 0 and 0");
	assert_true(ring_rx_prod(h) == 0);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

/* ---- resuming across a lost link (cluster.resume_timeout_ms) ----------------------------------- */

#define RESUME_MS 30000u

/* The link's QP 1 dies: the link goes DOWN (the QPs and what was in flight on them are gone). */
static void link_lost(struct ct *c)
{
	/* With several rails, QP 1 of every rail, the last rail first: a link stays UP on any rail. */
	for (uint32_t r = c->t.m.n_rails; r-- > 0 && link_state(c->l) == LINK_STATE_UP_;) {
		struct xport_event ev = cm_event(XPORT_EV_DISCONNECTED, c->l->conns[r * c->t.cfg.qps_per_link + 1], NULL, 0);

		ev.status = -ECONNRESET;
		deliver(&c->t, &ev);
	}
	assert_int_equal(link_state(c->l), LINK_STATE_DOWN_);
}

/* We re-dial (after the backoff, `after_ms` from now) and the link comes UP again. */
static void link_back(struct ct *c, uint64_t after_ms)
{
	tick_at(&c->t, util_now_ms() + after_ms);
	assert_int_equal(c->l->phase, LINK_QPS);
	drive_to_up(&c->t, c->l);
}

/* The registration whose remote key is rkey. */
static const struct fake_reg *reg_of_rkey(const struct ct *c, uint32_t rkey)
{
	for (size_t i = 0; i < c->t.fx->n_regs; i++)
		if (c->t.fx->regs[i].rkey == rkey)
			return &c->t.fx->regs[i];
	fail_msg("no registration has rkey 0x%x", rkey);
	return NULL;
}

/* Our ChannelResume to channel h (the first since from), decoded; free it. */
static PeerMsg *sent_resume(struct ct *c, const struct chan *h, size_t from)
{
	PeerMsg *m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_RESUME, 0);

	if (!m)
		fail_msg("no ChannelResume was sent");
	assert_int_equal(m->channel_resume->slot, h->peer_slot);
	assert_int_equal(m->channel_resume->peer_slot, h->slot);
	return m;
}

static void peer_resume_on(struct ct *c, const struct chan *h, uint64_t rx_bytes, uint16_t rx_seq, uint64_t rx_cons,
			   bool eof_known, uint32_t rail)
{
	PeerMsg m = PEER_MSG__INIT;
	ChannelResume r = CHANNEL_RESUME__INIT;

	r.rail = rail;
	r.slot = h->slot;
	r.peer_slot = h->peer_slot;
	r.rx_bytes = rx_bytes;
	r.rx_seq = rx_seq;
	r.rx_cons = rx_cons;
	r.eof_known = eof_known;
	r.rx_addr = (uintptr_t)h->peer_rx;
	r.rx_rkey = PEER_RX_RKEY;
	r.credit_addr = (uintptr_t)h->peer_credit;
	r.credit_rkey = PEER_CREDIT_RKEY;
	if (h->peer_dir) {
		r.direct_addr = (uintptr_t)h->peer_dir;
		r.direct_rkey = PEER_DIRECT_RKEY;
	}
	if (h->peer_hint) {
		r.hint_addr = (uintptr_t)h->peer_hint;
		r.hint_rkey = PEER_HINT_RKEY;
	}
	m.body_case = PEER_MSG__BODY_CHANNEL_RESUME;
	m.channel_resume = &r;
	peer_msg(c, &m);
	/* What the peer's receiving half forgot is written again: its immediates count afresh. */
	memset(c->peer_imms[h->slot], 0, sizeof(c->peer_imms[h->slot]));
}

static void peer_resume(struct ct *c, const struct chan *h, uint64_t rx_bytes, uint16_t rx_seq, uint64_t rx_cons,
			bool eof_known)
{
	struct channel *ch = channel_find(&c->t.m, h->id);

	peer_resume_on(c, h, rx_bytes, rx_seq, rx_cons, eof_known, ch ? ch->rail : 0);
}

static void ct_init_resume(struct ct *c, uint32_t qps)
{
	ct_init(c, qps);
	c->t.cfg.resume_timeout_ms = RESUME_MS;
}

/* Both directions in flight when the link goes: each side tells the other where its receiving
 * half stands, and each sender writes again from there, at the same ring offsets and sequence
 * numbers; nothing is lost or duplicated, the application saw only a pause. */
/* Live registrations in scope that a peer may write or read. */
static size_t remote_regs_in(const struct ct *c, const void *scope)
{
	size_t n = 0;

	for (size_t i = 0; i < c->t.fx->n_regs; i++) {
		const struct fake_reg *r = &c->t.fx->regs[i];

		n += !r->gone && r->scope == scope && (r->access & (XPORT_ACCESS_REMOTE_WRITE | XPORT_ACCESS_REMOTE_READ));
	}
	return n;
}

/* The link's next attempt reaches nothing of it before it proved itself (with a key, the proof
 * comes before our Hello; without one, all of its QPs connected): its QPs have a protection scope
 * of their own, no memory a peer may write or read is registered in it until our Hello (the
 * mailbox), and a resuming channel's rings only once the link is UP (its ChannelResume carries
 * the new keys). Before, every attempt shared the link's scope, and a stranger's QP admitted into
 * it could reach the rings of channels waiting to resume. */
static void channel_link_down__next_attempt__reaches_nothing_until_up(void **state)
{
	struct ct *c = *state;
	const void *old;
	struct chan *h;
	size_t from;
	PeerMsg *m;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	old = c->l->scope;
	assert_true(remote_regs_in(c, old) >= 2); /* the mailbox, the channel's rings */
	link_lost(c);
	tick_at(&c->t, util_now_ms() + 5000);
	assert_int_equal(c->l->phase, LINK_QPS);
	assert_ptr_not_equal(c->l->scope, old);
	for (uint32_t i = 0; i < mesh_link_qps(&c->t.m); i++)
		assert_ptr_equal(c->l->conns[i]->scope, c->l->scope);
	establish_qp(&c->t, c->l, 0);
	assert_int_equal(remote_regs_in(c, c->l->scope), 0);
	from = c->t.fx->n_posts;
	drive_to_up(&c->t, c->l);
	m = sent_resume(c, h, from);
	assert_ptr_equal(reg_of_rkey(c, m->channel_resume->rx_rkey)->scope, c->l->scope);
	assert_ptr_equal(reg_of_rkey(c, m->channel_resume->credit_rkey)->scope, c->l->scope);
	mesh_peer_msg_free(m);
	mt_finish(&c->t);
}

static void channel_link_down__open_channel__resumes_and_rewrites_what_was_not_placed(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	PeerMsg *m;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 3000); /* chunks 0, 1, 2: 1024 + 1024 + 952 */
	app_kick(c, h);
	complete_write(c, h, write_post(c, h, from, false, 0));
	complete_write(c, h, write_post(c, h, from, false, 1));
	peer_credit_placed(c, h, 0, CHUNK); /* its meshd saw chunk 0 only */
	assert_true(ring_tx_cons(h) == CHUNK);
	/* The peer's chunks 0 and 2 arrived; 1 was lost with the link. */
	peer_data(c, h, 0, 0, 0, CHUNK);
	peer_data(c, h, 0, 2, 2 * CHUNK, 500);
	assert_true(ring_rx_prod(h) == CHUNK);

	link_lost(c);
	assert_string_equal(channel_state_name(chn(c, h)), "RESUMING");
	assert_int_equal(ring_state(h), MESH_STATE_OPEN); /* the application sees a pause, no error */
	assert_int_equal(c->t.m.n_channels, 1);
	from = c->t.fx->n_posts;
	app_write(h, 500);
	app_kick(c, h);
	tick(&c->t);
	assert_int_equal(write_count(c, h, from, false), 0);

	link_back(c, 5000);
	m = sent_resume(c, h, from);
	assert_true(m->channel_resume->rx_bytes == CHUNK);
	assert_int_equal(m->channel_resume->rx_seq, 1);
	assert_true(m->channel_resume->rx_cons == 0);
	assert_false(m->channel_resume->eof_known);
	assert_true(m->channel_resume->rx_addr == (uintptr_t)h->our_rx);
	/* Registered again in the link's new attempt (a protection scope of its own, whose QPs could
	 * not reach the old registrations): new keys, of a registration through its QP. */
	assert_int_not_equal(m->channel_resume->rx_rkey, h->our_rx_rkey);
	assert_int_equal(reg_of_rkey(c, m->channel_resume->rx_rkey)->conn_id, conn_id(c->l->conns[0]));
	assert_true(m->channel_resume->credit_addr == (uintptr_t)h->our_credit);
	mesh_peer_msg_free(m);
	/* Nothing goes before the peer said where it stands. */
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_string_equal(channel_state_name(chn(c, h)), "RESUMING");
	complete_sends(c);

	from = c->t.fx->n_posts;
	peer_resume(c, h, CHUNK, 1, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	/* From byte 1024, chunk 1, on QP 0 again (striping starts afresh): 1024 + 1024 + 428. */
	assert_true(check_data_posts(c, h, from, 0, 1, CHUNK, CHUNK) == 2476);
	complete_data(c, h, from);
	check_peer_ring(h, 0, 3500);
	assert_true(chn(c, h)->rewritten_bytes == 3000 - CHUNK);
	assert_true(chn(c, h)->resumes == 1);
	assert_true(c->t.m.channel_resumes == 1);
	assert_true(c->t.m.link_flaps == 1);

	/* Our receiving half: the peer writes again from byte 1024, chunk 1; chunk 2 comes again too. */
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	peer_data(c, h, 0, 2, 2 * CHUNK, 500);
	assert_true(ring_rx_prod(h) == 2 * CHUNK + 500);
	app_read(h, 2 * CHUNK + 500);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	mt_finish(&c->t);
}

/* ---- rail failover ---------------------------------------------------------------------------- */

/* Two rails of 2 QPs each (QPs 0-1 rail 0, 2-3 rail 1), resuming on. */
static void ct_init_rails(struct ct *c)
{
	c->t.rails = 2;
	ct_init_resume(c, 2);
	assert_int_equal(c->l->rails_up, 3u);
	assert_true(c->l->features & MESH_FEAT_RAILS);
}

/* QP qp of the link reports a disconnect: its rail is lost, the link stays UP on the other. */
static void rail_lost(struct ct *c, uint32_t qp)
{
	struct xport_event ev = cm_event(XPORT_EV_DISCONNECTED, c->l->conns[qp], NULL, 0);

	ev.status = -ECONNRESET;
	deliver(&c->t, &ev);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
}

/* Every SEND since from went on QP qp. */
static void sends_only_on(struct ct *c, size_t from, uint32_t qp)
{
	unsigned cid = conn_id(c->l->conns[qp]);

	for (size_t i = from; i < c->t.fx->n_posts; i++)
		if (c->t.fx->posts[i].op == XPORT_OP_SEND && c->t.fx->posts[i].conn_id != cid)
			fail_msg("post %zu: a SEND on conn %u, expected QP %u (conn %u)", i, c->t.fx->posts[i].conn_id, qp, cid);
}

/* Rail 0 (control and the channel's QPs) fails under an open channel: the link stays UP, RailDown and
 * the channel's resume go on rail 1, the rings are registered again on rail 1's device (new keys),
 * and the chunks rail 0 lost are written again on rail 1's QPs at the same offsets, nothing else. */
static void channel_rail_down__opener__moves_to_other_rail_and_rewrites_what_was_not_placed(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct channel *ch;
	size_t from;
	PeerMsg *m;

	ct_init_rails(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	ch = chn(c, h);
	assert_int_equal(ch->rail, 0);
	from = c->t.fx->n_posts;
	app_write(h, 3000);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 3);
	complete_write(c, h, write_post(c, h, from, false, 0));
	peer_credit_placed(c, h, 0, CHUNK); /* the peer's meshd saw chunk 0; 1 and 2 die with rail 0 */

	from = c->t.fx->n_posts;
	rail_lost(c, 1);
	assert_int_equal(c->l->rails_up, 2u);
	assert_int_equal(c->l->ctl_rail, 1);
	assert_null(c->l->conns[0]);
	assert_int_equal(ch->rail, 1);
	assert_int_equal(ch->qp0, 2);
	assert_string_equal(channel_state_name(ch), "RESUMING");
	assert_int_equal(ring_state(h), MESH_STATE_OPEN); /* a pause, no error */
	sends_only_on(c, from, 2);
	m = sent_msg(c, from, PEER_MSG__BODY_RAIL_DOWN, 0);
	assert_non_null(m);
	assert_int_equal(m->rail_down->rail, 0);
	mesh_peer_msg_free(m);
	m = sent_resume(c, h, from);
	assert_int_equal(m->channel_resume->rail, 1);
	assert_true(m->channel_resume->rx_addr == (uintptr_t)h->our_rx);
	/* The same ring, registered again on rail 1's device: the new key, made with rail 1's QP. */
	assert_int_not_equal(m->channel_resume->rx_rkey, h->our_rx_rkey);
	assert_int_equal(m->channel_resume->rx_rkey, find_regs(c, RING).rx->rkey);
	assert_int_equal(find_regs(c, RING).rx->conn_id, conn_id(c->l->conns[2]));
	assert_int_equal(m->channel_resume->credit_rkey, find_regs(c, RING).cin->rkey);
	mesh_peer_msg_free(m);
	assert_int_equal(write_count(c, h, from, false), 0); /* nothing before the peer's resume */
	complete_sends(c);

	from = c->t.fx->n_posts;
	peer_resume_on(c, h, CHUNK, 1, 0, false, 1);
	assert_string_equal(channel_state_name(ch), "OPEN");
	assert_true(check_data_posts(c, h, from, 0, 1, CHUNK, CHUNK) == 3000 - CHUNK); /* on QPs 2, 3 */
	complete_data(c, h, from);
	check_peer_ring(h, 0, 3000);
	assert_true(ch->rail_moves == 1);
	/* Its kick moved to rail 1's thread with it (channel_ops.moved), and it is on rail 1's list
	 * alone: rail 1's thread polls and flags it, rail 0's no longer. */
	assert_int_equal(c->moved[ch->id], 1);
	assert_int_equal(c->moved_from[ch->id], 0);
	assert_null(c->t.m.rail_channels[0]);
	assert_ptr_equal(c->t.m.rail_channels[1], ch);
	assert_null(ch->rail_next);
	channel_set_polling(&c->t.m, 0, true);
	assert_int_equal(atomic_load(&h->app->ctrl->daemon_flags), 0);
	channel_set_polling(&c->t.m, 1, true);
	assert_int_equal(atomic_load(&h->app->ctrl->daemon_flags), MESH_DAEMON_POLLING);
	channel_set_polling(&c->t.m, 1, false);
	channel_set_polling(&c->t.m, 0, false);
	assert_true(ch->rewritten_bytes == 3000 - CHUNK);
	assert_true(c->t.m.rail_failovers == 1);
	assert_true(c->t.m.link_flaps == 0);
	mt_finish(&c->t);
}

/* The acceptor of a channel on a lost rail does not pick a rail: it waits for the opener's resume,
 * moves where that says, and answers with its own resume carrying the keys of the new rail. */
static void channel_rail_down__acceptor__follows_the_openers_rail(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct channel *ch;
	size_t from;
	PeerMsg *m;

	const char *why;

	ct_init_rails(c);
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ROOT, &why), 0);
	h = open_in(c, 50000, 7000, RING, 2, PEER_SLOT);
	ch = chn(c, h);
	from = c->t.fx->n_posts;
	app_write(h, 2000);
	app_kick(c, h);
	complete_write(c, h, write_post(c, h, from, false, 0));

	from = c->t.fx->n_posts;
	rail_lost(c, 0);
	assert_string_equal(channel_state_name(ch), "RESUMING");
	assert_int_equal(ch->rail, 0); /* not moved yet */
	assert_null(sent_msg(c, from, PEER_MSG__BODY_CHANNEL_RESUME, 0));
	complete_sends(c);

	from = c->t.fx->n_posts;
	peer_resume_on(c, h, CHUNK, 1, 0, false, 1);
	assert_int_equal(ch->rail, 1);
	m = sent_resume(c, h, from);
	assert_int_equal(m->channel_resume->rail, 1);
	assert_int_equal(m->channel_resume->rx_rkey, find_regs(c, RING).rx->rkey);
	assert_int_equal(find_regs(c, RING).rx->conn_id, conn_id(c->l->conns[2]));
	mesh_peer_msg_free(m);
	assert_string_equal(channel_state_name(ch), "OPEN");
	assert_true(check_data_posts(c, h, from, 0, 1, CHUNK, CHUNK) == 2000 - CHUNK);
	complete_data(c, h, from);
	check_peer_ring(h, 0, 2000);
	mt_finish(&c->t);
}

/* A rail lost during a resume (the link came back, our resume went, the peer's did not yet): the
 * channel moves, resumes again with the new rail, and ignores the peer's resume for the old one. */
static void channel_rail_down__during_a_resume__resumes_again_on_the_new_rail(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct channel *ch;
	size_t from;
	PeerMsg *m;

	ct_init_rails(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	ch = chn(c, h);
	from = c->t.fx->n_posts;
	app_write(h, 1500);
	app_kick(c, h);
	link_lost(c);
	link_back(c, 5000);
	assert_int_equal(c->l->rails_up, 3u);
	m = sent_resume(c, h, from);
	assert_int_equal(m->channel_resume->rail, 0);
	mesh_peer_msg_free(m);
	complete_sends(c);

	from = c->t.fx->n_posts;
	rail_lost(c, 0);
	/* Control moved to rail 1 with what the peer had not acked (our first resume, sent again), then
	 * the channel's new resume. */
	sends_only_on(c, from, 2);
	m = sent_resume(c, h, from);
	assert_int_equal(m->channel_resume->rail, 0);
	mesh_peer_msg_free(m);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_RESUME, 1);
	assert_non_null(m);
	assert_int_equal(m->channel_resume->rail, 1);
	mesh_peer_msg_free(m);
	complete_sends(c);
	/* The peer's resume of rail 0, sent before it heard: ignored, the channel still waits. */
	from = c->t.fx->n_posts;
	peer_resume_on(c, h, 0, 0, 0, false, 0);
	assert_string_equal(channel_state_name(ch), "RESUMING");
	assert_int_equal(write_count(c, h, from, false), 0);
	peer_resume_on(c, h, 0, 0, 0, false, 1);
	assert_string_equal(channel_state_name(ch), "OPEN");
	assert_true(check_data_posts(c, h, from, 0, 0, 0, CHUNK) == 1500);
	complete_data(c, h, from);
	check_peer_ring(h, 0, 1500);
	assert_true(ch->resumes == 1); /* the one interrupted by the rail's loss never completed */
	assert_true(ch->rail_moves == 1);
	mt_finish(&c->t);
}

/* A close under way when the channel's rail fails: the peer's CloseAck counts writes of ours whose
 * immediates died with the rail; the slot is freed all the same (nothing can land on it any more). */
static void channel_rail_down__close_under_way__freed_on_the_ack(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init_rails(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 1000);
	app_kick(c, h);
	complete_data(c, h, from);
	app_shut_wr(h);
	app_hangup(c, h);
	assert_true(chn(c, h)->close_sent);
	rail_lost(c, 1);
	assert_int_equal(c->t.m.n_channels, 1);
	complete_sends(c);
	/* The peer counted 3 chunks and a credit it never saw (they died with rail 0). */
	c->peer_imms[h->slot][0] = 3;
	c->peer_imms[h->slot][1] = 1;
	peer_close_ack(c, h);
	assert_int_equal(c->t.m.n_channels, 0);
	mt_finish(&c->t);
}

/* The link comes back to another meshd process (a restart: another boot epoch): the channel's state
 * is gone there, so it fails at once with its own error, and leaves the link. */
static void channel_link_up__peer_restarted__epeerrestart_at_once(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	uint32_t id;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	link_lost(c);
	assert_string_equal(channel_state_name(chn(c, h)), "RESUMING");
	c->t.peer_boot = 9999;
	from = c->t.fx->n_posts;
	link_back(c, 5000);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_RESUME), 0);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(h), -MESH_EPEERRESTART);
	assert_null(link_channel_of(c, h->slot));
	app_hangup(c, h);
	assert_null(channel_find(&c->t.m, id));
	mt_finish(&c->t);
}

/* ---- a restart with the channels kept (channel_store.c) ---- */

/* The service manager's descriptor store, faked: what meshd keeps, by name, as duplicates. */
#define STORE_MAX 32
static struct {
	char name[STORE_MAX][256];
	int fd[STORE_MAX];
	size_t n;
} fstore;

static int fstore_keep(void *ctx, const char *name, const int *fds, size_t n)
{
	(void)ctx;
	assert_int_equal(n, 1);
	assert_true(fstore.n < STORE_MAX);
	assert_true(strlen(name) <= 255 && !strchr(name, ':')); /* a valid FDNAME */
	snprintf(fstore.name[fstore.n], sizeof(fstore.name[0]), "%s", name);
	fstore.fd[fstore.n] = dup(fds[0]);
	assert_true(fstore.fd[fstore.n] >= 0);
	fstore.n++;
	return 0;
}

static void fstore_drop(void *ctx, const char *name)
{
	(void)ctx;
	for (size_t i = 0; i < fstore.n;) {
		if (strcmp(fstore.name[i], name)) {
			i++;
			continue;
		}
		close(fstore.fd[i]);
		fstore.n--;
		fstore.fd[i] = fstore.fd[fstore.n];
		memcpy(fstore.name[i], fstore.name[fstore.n], sizeof(fstore.name[0]));
	}
}

static size_t fstore_count(const char *prefix)
{
	size_t n = 0;

	for (size_t i = 0; i < fstore.n; i++)
		n += !strncmp(fstore.name[i], prefix, strlen(prefix));
	return n;
}

static void fstore_on(struct ct *c)
{
	memset(&fstore, 0, sizeof(fstore));
	c->t.m.store.keep = fstore_keep;
	c->t.m.store.drop = fstore_drop;
}

static void fstore_close(void)
{
	for (size_t i = 0; i < fstore.n; i++)
		close(fstore.fd[i]);
	fstore.n = 0;
}

/* meshd stops with its channels kept (a handover: its link goes, nothing is written to the rings,
 * the process's exit frees the channels), and the next meshd is given the store plus `extra`
 * entries (names and descriptors it takes over): here the same mesh. Returns what
 * channel_store_restore says. */
static int restart_kept(struct ct *c, const char *const *extra, const int *extra_fds, size_t n_extra)
{
	struct mesh *m = &c->t.m;
	int fds[STORE_MAX + 8];
	char *names[STORE_MAX + 8];
	size_t n = 0;
	int ret;

	m->store.handover = true;
	link_lost(c);
	while (m->channels)
		channel_free(m->channels);
	m->store.handover = false;
	m->store.n_kept = 0;
	for (size_t i = 0; i < fstore.n; i++) {
		names[n] = fstore.name[i];
		fds[n++] = dup(fstore.fd[i]); /* the manager passes copies and keeps its own */
	}
	for (size_t i = 0; i < n_extra; i++) {
		names[n] = (char *)extra[i];
		fds[n++] = extra_fds[i];
	}
	ret = channel_store_restore(m, fds, names, n);
	return ret;
}

/* An open channel keeps its four descriptors in the store under names that carry its record,
 * and takes them out when it is freed. */
static void channel_store__open_channel__kept_with_its_record_dropped_when_freed(void **state)
{
	struct ct *c = *state;
	char want[128];
	struct chan *h;

	ct_init_resume(c, 2);
	fstore_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	assert_true(chn(c, h)->kept);
	assert_int_equal(fstore.n, 4);
	snprintf(want, sizeof(want), "mc1.%u.ring.%u.%u.%u.", h->id, PEER, h->slot, PEER_SLOT);
	assert_int_equal(fstore_count(want), 1);
	for (const char *k = "kick\0wake\0life\0"; *k; k += strlen(k) + 1) {
		snprintf(want, sizeof(want), "mc1.%u.%s", h->id, k);
		assert_int_equal(fstore_count(want), 1);
	}
	app_hangup(c, h);
	complete_sends(c);
	peer_close_ack(c, h);
	assert_null(channel_find(&c->t.m, h->id));
	assert_int_equal(fstore.n, 0);
	fstore_close();
	mt_finish(&c->t);
}

/* meshd restarts with the channel kept: its application's lifeline never hangs up, the next meshd
 * restores the channel RESUMING in its slot with its positions read off the ring, and the peer's
 * resume rewrites what it lacks: nothing lost, the application saw a pause. */
static void channel_store_restore__kept_channel__resumes_where_its_ring_stands(void **state)
{
	struct ct *c = *state;
	const char *epoch = "mc1.epoch.555";
	int efd = eventfd(0, EFD_CLOEXEC);
	struct pollfd pl;
	struct channel *ch;
	struct chan *h;
	size_t from;

	ct_init_resume(c, 2);
	fstore_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	app_write(h, 3000);
	app_kick(c, h);
	assert_int_equal(restart_kept(c, &epoch, &efd, 1), 1);
	pl = (struct pollfd){.fd = h->app->fds[FD_LIFELINE], .events = POLLIN};
	assert_int_equal(poll(&pl, 1, 0), 0); /* its lifeline's other end lived on in the store */
	assert_int_equal(c->t.m.predecessor_epoch, 555);
	assert_int_equal(fstore_count("mc1.epoch.555"), 0);
	assert_int_equal(fstore_count("mc1.epoch."), 1); /* this meshd's own, for the next one */
	ch = chn(c, h);
	assert_true(ch->kept && ch->resuming);
	assert_int_equal(ch->slot, h->slot);
	assert_int_equal(ch->peer_slot, PEER_SLOT);
	assert_int_equal(ch->tx_sent, 3000);
	assert_ptr_equal(link_channel_of(c, h->slot), ch);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	from = c->t.fx->n_posts;
	link_back(c, 5000);
	mesh_peer_msg_free(sent_resume(c, h, from));
	complete_sends(c);
	from = c->t.fx->n_posts;
	peer_resume(c, h, 1000, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_true(write_count(c, h, from, false) > 0);
	complete_data(c, h, from);
	check_peer_ring(h, 1000, 3000);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	app_hangup(c, h);
	fstore_close();
	mt_finish(&c->t);
}

/* The store is the manager's, its names meshd's own, but nothing in it is taken on trust: a name
 * that is no channel's, a record that does not parse or names a node not in the configuration, a
 * ring without its other descriptors, a ring of another size than its record: each fails (dropped
 * from the store, its descriptors closed) and the good channel beside them is restored. */
static void channel_store_restore__bad_entries__each_fails_alone_the_good_one_restored(void **state)
{
	struct ct *c = *state;
	const char *names[] = {
		"junk",
		"mc1.77.ring.9.3.3.1.1.0.1.2.0.4096.4242", "mc1.77.kick", "mc1.77.wake", "mc1.77.life",
		"mc1.78.ring.1.4.4.1.1.0.1.2.0.4096",
		"mc1.79.ring.1.5.5.1.1.0.1.2.0.4096.4242",
		"mc1.80.ring.1.6.6.1.1.0.1.2.0.8192.4242", "mc1.80.kick", "mc1.80.wake", "mc1.80.life",
		"mc1.81.life",
	};
	int fds[ARRAY_SIZE(names)];
	ino_t ino[ARRAY_SIZE(names)];
	struct chan *h;
	struct stat st;

	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		/* Each a file of its own (memfds: an inode each), so that a descriptor number reused
		 * after it was closed is told from one left open. A ring of 4 KiB where the record of
		 * channel 80 says 8 KiB. */
		fds[i] = memfd_create("entry", MFD_CLOEXEC);
		assert_true(fds[i] >= 0);
		assert_int_equal(ftruncate(fds[i], MESH_RING_CTRL_SIZE + 2 * 4096), 0);
		assert_int_equal(fstat(fds[i], &st), 0);
		ino[i] = st.st_ino;
	}
	ct_init_resume(c, 2);
	fstore_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	assert_int_equal(restart_kept(c, names, fds, ARRAY_SIZE(names)), 1);
	assert_true(chn(c, h)->resuming);
	for (uint32_t id = 77; id <= 81; id++)
		assert_null(channel_find(&c->t.m, id));
	for (size_t i = 0; i < ARRAY_SIZE(names); i++)
		if (!fstat(fds[i], &st) && st.st_ino == ino[i])
			fail_msg("the descriptor of \"%s\" was left open", names[i]);
	assert_int_equal(fstore.n, 5); /* the good channel's four and this meshd's epoch */
	app_hangup(c, h);
	fstore_close();
	mt_finish(&c->t);
}

/* The peer's meshd restarted with its channels kept (its Hello names ours as its predecessor):
 * our channel resumes with the new incarnation, not MESH_EPEERRESTART. */
static void channel_link_up__peer_restarted_with_channels_kept__resumes(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	app_write(h, 2000);
	app_kick(c, h);
	link_lost(c);
	c->t.peer_boot = 9999;
	c->t.peer_pred = 4242; /* the harness's first peer meshd */
	from = c->t.fx->n_posts;
	link_back(c, 5000);
	mesh_peer_msg_free(sent_resume(c, h, from));
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(chn(c, h)->peer_boot, 9999);
	complete_sends(c);
	from = c->t.fx->n_posts;
	peer_resume(c, h, 500, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	complete_data(c, h, from);
	check_peer_ring(h, 500, 2000);
	app_hangup(c, h);
	mt_finish(&c->t);
}

/* The link stays DOWN past resume_timeout_ms: the channel fails with the timeout's own error. */
static void channel_tick__down_past_resume_timeout__eresumetimeo(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	uint32_t id;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	link_lost(c);
	tick_at(&c->t, util_now_ms() + RESUME_MS - 1000);
	assert_string_equal(channel_state_name(chn(c, h)), "RESUMING");
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	tick_at(&c->t, util_now_ms() + RESUME_MS + 1000);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(h), -MESH_ERESUMETIMEO);
	assert_non_null(strstr(chn(c, h)->why, "cluster.resume_timeout_ms"));
	app_hangup(c, h);
	assert_null(channel_find(&c->t.m, id));
	mt_finish(&c->t);
}

/* A peer that resumes at an offset we never sent breaks that channel (-EPROTO, told with a Close);
 * the link and the other channel go on. */
static void channel_on_message__resume_beyond_sent__eproto_others_resume(void **state)
{
	struct ct *c = *state;
	struct chan *bad, *good;
	size_t from;

	ct_init_resume(c, 2);
	bad = open_out(c, RING, 2, PEER_SLOT);
	good = open_out(c, RING, 2, PEER_SLOT + 1);
	app_write(bad, 100);
	app_kick(c, bad);
	link_lost(c);
	link_back(c, 5000);
	complete_sends(c);
	from = c->t.fx->n_posts;
	peer_resume(c, bad, 101, 1, 0, false);
	assert_true(ring_state(bad) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(bad), -EPROTO);
	assert_non_null(strstr(chn(c, bad)->why, "outside what was sent"));
	assert_int_equal(sent_close_reason(c, bad, from), -EPROTO);
	peer_resume(c, good, 0, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, good)), "OPEN");
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

/* A resume naming a slot we do not have: the peer's channel is refused with a Close. */
static void channel_on_message__resume_unknown_slot__refused_with_close(void **state)
{
	struct ct *c = *state;
	struct chan h = {.slot = 9, .peer_slot = 3, .size = RING};
	size_t from;
	PeerMsg *m;
	uint8_t ring[16];
	uint64_t credit[2 * MESH_CREDIT_SLOTS];

	ct_init_resume(c, 2);
	h.peer_rx = ring;
	h.peer_credit = credit;
	from = c->t.fx->n_posts;
	peer_resume(c, &h, 0, 0, 0, false);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_CLOSE, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_close->slot, 3);
	assert_int_equal(m->channel_close->reason, -ECONNRESET);
	mesh_peer_msg_free(m);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

/* The link goes again while a resume is half done (ours sent, the peer's not yet): the next UP
 * resumes it once. */
static void channel_link_down__during_resume__resumes_on_next_up(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	link_lost(c);
	link_back(c, 5000);
	complete_sends(c);
	link_lost(c);
	assert_string_equal(channel_state_name(chn(c, h)), "RESUMING");
	from = c->t.fx->n_posts;
	link_back(c, 10000);
	mesh_peer_msg_free(sent_resume(c, h, from));
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_true(chn(c, h)->resumes == 1);
	assert_true(c->t.m.link_flaps == 2);
	mt_finish(&c->t);
}

/* The application shuts down and closes while the channel waits: after the resume its last bytes,
 * the EOF and the Close still go, in that order. */
static void channel_on_lifeline__while_resuming__bytes_eof_close_after_resume(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	uint32_t id;
	PeerMsg *m;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	link_lost(c);
	app_write(h, 700);
	app_shut_wr(h);
	app_hangup(c, h);
	assert_non_null(channel_find(&c->t.m, id));
	link_back(c, 5000);
	complete_sends(c);
	from = c->t.fx->n_posts;
	peer_resume(c, h, 0, 0, 0, false);
	assert_int_equal(write_count(c, h, from, false), 1);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 1);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_EOF, 0);
	assert_true(m->channel_eof->total == 700);
	mesh_peer_msg_free(m);
	complete_data(c, h, from);
	assert_int_equal(sent_close_reason(c, h, from), 0);
	complete_sends(c);
	peer_close_ack(c, h);
	assert_null(channel_find(&c->t.m, id));
	mt_finish(&c->t);
}

/* The peer's first credit after its resume can overtake the resume (another rail's QP): its reader's
 * position never goes back for it, and nothing the application was given back is taken away. */
static void channel_on_message__credit_overtakes_resume__positions_never_go_back(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	app_write(h, 2 * CHUNK);
	app_kick(c, h);
	complete_data(c, h, 0);
	peer_credit_placed(c, h, 0, 2 * CHUNK);
	assert_true(ring_tx_cons(h) == 2 * CHUNK);
	link_lost(c);
	link_back(c, 5000);
	complete_sends(c);
	peer_credit_placed(c, h, CHUNK, 2 * CHUNK); /* its reader went on meanwhile */
	peer_resume(c, h, 2 * CHUNK, 2, 0, false);  /* says where it stood when it sent this */
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_true(chn(c, h)->peer_cons == CHUNK);
	assert_true(ring_tx_cons(h) == 2 * CHUNK);
	mt_finish(&c->t);
}

/* Our resume is refused (the peer timed the channel out meanwhile): its Close ends the wait, the
 * close completes at once, and the slot is free when the application closes. */
static void channel_on_message__close_while_resuming__acked_and_freed(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	uint32_t id;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	link_lost(c);
	link_back(c, 5000);
	complete_sends(c);
	from = c->t.fx->n_posts;
	peer_close_n(c, h, -ECONNRESET, 0, 0);
	assert_int_equal(ring_error(h), -ECONNRESET);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE_ACK), 1);
	complete_sends(c);
	app_hangup(c, h);
	assert_null(channel_find(&c->t.m, id));
	mt_finish(&c->t);
}

/* A resumable channel open when the peer's Goodbye with reason comes: the link goes DOWN and the
 * channel ends at once with want_err for its application, waiting for nothing. */
static void goodbye_ends_channel(struct ct *c, uint32_t reason, int want_err)
{
	struct chan *h;
	PeerMsg m = PEER_MSG__INIT;
	Goodbye g = GOODBYE__INIT;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	g.reason = reason;
	m.body_case = PEER_MSG__BODY_GOODBYE;
	m.goodbye = &g;
	peer_msg(c, &m);
	assert_int_equal(link_state(c->l), LINK_STATE_DOWN_);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(h), want_err);
	assert_false(chn(c, h)->resuming);
	app_hangup(c, h);
	mt_finish(&c->t);
}

/* A Goodbye (the peer meshd stops) leaves nothing to wait for: channels break at once. */
static void channel_link_down__goodbye__econnreset_at_once(void **state)
{
	goodbye_ends_channel(*state, MESH_ESHUTDOWN, -ECONNRESET);
}

/* The peer removed this node from its configuration (a reload there): even a resumable channel
 * ends at once, and its application hears the removal, not a reset. */
static void channel_goodbye__peer_removed_us__eremoved_to_the_app_no_resume(void **state)
{
	goodbye_ends_channel(*state, MESH_EREMOVED, -MESH_EREMOVED);
}

/* A QP refuses the data write (its connection died; the link's own event may come later in the
 * batch): the application hears the reset a lost link means, not the provider's errno. */
/* Resuming off: a QP that refuses a data write ends the channel as a lost link would. */
static void channel_post_data__qp_refuses_resuming_off__econnreset_to_the_app(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	c->t.fx->fail_post_write.err = -ENOTCONN;
	app_write(h, 1000);
	app_kick(c, h);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(h), -ECONNRESET);
	assert_string_equal(channel_state_name(chn(c, h)), "ERROR");
	app_hangup(c, h);
	mt_finish(&c->t);
}

/* Resuming on: a refused data write is a connection going down whose event comes later (a blip
 * the channel lives through). The channel stays OPEN and posts nothing more; when the link goes
 * DOWN and comes back, it resumes and every byte arrives once. */
static void channel_post_data__qp_refuses__channel_resumes_after_the_links_event(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	c->t.fx->fail_post_write.err = -ENOTCONN;
	app_write(h, 3000);
	app_kick(c, h);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_int_equal(write_count(c, h, from, false), 0);
	/* Later kicks and ticks post nothing on the refusing QPs, and nothing breaks. */
	app_write(h, 500);
	app_kick(c, h);
	tick(&c->t);
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_false(ring_state(h) & MESH_STATE_ERROR);

	link_lost(c);
	assert_string_equal(channel_state_name(chn(c, h)), "RESUMING");
	link_back(c, 5000);
	complete_sends(c);
	from = c->t.fx->n_posts;
	peer_resume(c, h, 0, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_true(check_data_posts(c, h, from, 0, 0, 0, CHUNK) == 3500);
	complete_data(c, h, from);
	check_peer_ring(h, 0, 3500);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	app_hangup(c, h);
	mt_finish(&c->t);
}

/* Resuming on, but the refusing QP's link never goes down: the channel does not wait forever. */
static void channel_tick__qp_refused_and_link_stays_up__econnreset_naming_it(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init_resume(c, 2);
	c->l->features &= ~MESH_FEAT_KEEPALIVE; /* the link's own timeout stays out of it */
	h = open_out(c, RING, 2, PEER_SLOT);
	c->t.fx->fail_post_write.err = -ENOTCONN;
	app_write(h, 1000);
	app_kick(c, h);
	tick_at(&c->t, util_now_ms() + c->t.cfg.keepalive_timeout_ms);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	tick_at(&c->t, util_now_ms() + 2 * (uint64_t)c->t.cfg.keepalive_timeout_ms + 1000);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(h), -ECONNRESET);
	assert_non_null(strstr(chn(c, h)->why, "refused a write"));
	app_hangup(c, h);
	mt_finish(&c->t);
}

static void channel_link_down__open_channel__econnreset_freed_when_app_closes(void **state)
{
	struct ct *c = *state;
	struct xport_event ev;
	struct chan *h;
	uint32_t id;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	app_write(h, 1000);
	app_kick(c, h);
	ev = cm_event(XPORT_EV_DISCONNECTED, c->l->conns[1], NULL, 0);
	ev.status = -ECONNRESET;
	deliver(&c->t, &ev);
	assert_int_equal(link_state(c->l), LINK_STATE_DOWN_);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(h), -ECONNRESET);
	assert_string_equal(channel_state_name(chn(c, h)), "ERROR");
	/* The application still maps the ring: the channel waits for it, and its kicks move nothing. */
	app_write(h, 100);
	app_kick(c, h);
	tick(&c->t);
	assert_int_equal(c->t.m.n_channels, 1);
	assert_int_equal(ring_error(h), -ECONNRESET);
	app_hangup(c, h);
	assert_null(channel_find(&c->t.m, id));
	assert_int_equal(c->t.m.n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 0);
	assert_int_equal(c->t.fx->live_conns, 0);
	assert_true(c->watch_del[id] >= 1);
	mt_finish(&c->t);
}

/* ---- application-posted writes (cluster.app_send, ring.h AQ area) ------------------------------ */

#define AQ_QPN 0x1234u
#define AQ_PSN 0x777u

/* cluster.app_send on, and a provider with paths: channels opened from now on are offered. */
static void aq_on(struct ct *c)
{
	c->t.fx->path_ok = true;
	strcpy(c->t.cfg.app_send, "on");
	c->aq_caps = MESH_AQ_CAP_IMM_POS | MESH_AQ_CAP_TAKE;
}

/* The peer's ChannelAppQp about its application's QP of the given round. */
static void peer_app_qp_round(struct ct *c, const struct chan *h, uint32_t state, uint64_t pos, uint32_t round)
{
	PeerMsg m = PEER_MSG__INIT;
	ChannelAppQp a = CHANNEL_APP_QP__INIT;

	a.slot = h->slot;
	a.state = state;
	a.pos = pos;
	a.round = round;
	if (state == 1) {
		a.qpn = 0x4321;
		a.psn = 0x99;
		a.rx_addr = 0x10000;
		a.rx_rkey = 0x55;
		a.dir_addr = 0x20000;
		a.dir_rkey = 0x66;
		a.caps = MESH_AQ_CAP_IMM_POS | 0x40; /* and a bit nobody knows yet: relayed as it is */
	}
	m.body_case = PEER_MSG__BODY_CHANNEL_APP_QP;
	m.channel_app_qp = &a;
	peer_msg(c, &m);
}

static void peer_app_qp(struct ct *c, const struct chan *h, uint32_t state, uint64_t pos)
{
	peer_app_qp_round(c, h, state, pos, 0);
}

/* Our application's QP: its keys, then the state, then the kick (as libmesh's aq.c does). */
static void app_aq_say(struct ct *c, struct chan *h, uint32_t state, uint32_t qpn)
{
	struct mesh_ring_aq *q = mesh_ring_aq(h->app->ctrl);

	q->qpn = qpn;
	q->psn = AQ_PSN;
	q->rx_addr = 0x30000;
	q->rx_rkey = 0x77;
	q->dir_addr = 0x40000;
	q->dir_rkey = 0x88;
	q->caps = c->aq_caps;
	atomic_store_explicit(&q->app_state, state, memory_order_release);
	app_kick(c, h);
}

/* Our application takes the grant meshd offered (MESH_AQ_CAP_TAKE), and kicks, as aq.c does. */
static bool app_take(struct ct *c, struct chan *h)
{
	uint32_t v = MESH_AQ_APP;
	bool took = atomic_compare_exchange_strong(&mesh_ring_aq(h->app->ctrl)->grant, &v, MESH_AQ_TAKEN);

	app_kick(c, h);
	return took;
}

static uint32_t sent_aq_state(struct ct *c, size_t from, size_t nth, uint64_t *pos)
{
	PeerMsg *m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_APP_QP, nth);
	uint32_t st;

	if (!m)
		return 0;
	st = m->channel_app_qp->state;
	if (pos)
		*pos = m->channel_app_qp->pos;
	mesh_peer_msg_free(m);
	return st;
}

/* Both applications offered and connected their QPs: meshd grants ours the sending half. */
static void aq_granted(struct ct *c, struct chan *h)
{
	size_t from = c->t.fx->n_posts;
	struct mesh_ring_aq *q = mesh_ring_aq(h->app->ctrl);
	uint64_t pos = 99;

	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN);
	peer_app_qp(c, h, 1, 0);
	assert_int_equal(atomic_load(&q->peer_state), MESH_AQ_PEER_INFO);
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN);
	peer_app_qp(c, h, 2, 0);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 1);
	assert_int_equal(sent_aq_state(c, from, 1, NULL), 2);
	/* Offered: the peer hears once our application took it. */
	assert_int_equal(sent_aq_state(c, from, 2, NULL), 0);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_APP);
	assert_int_equal(atomic_load(&q->grant_pos), h->app->tx_prod);
	assert_true(app_take(c, h));
	assert_int_equal(sent_aq_state(c, from, 2, &pos), 3);
	assert_int_equal(pos, h->app->tx_prod);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_TAKEN);
	complete_sends(c);
}

/* Both applications offered and connected their QPs; the peer's posts its half from 0. */
static void aq_peer_sending(struct ct *c, struct chan *h)
{
	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN);
	peer_app_qp(c, h, 1, 0);
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN);
	peer_app_qp(c, h, 2, 0);
	peer_app_qp(c, h, 3, 0);
	assert_true(chn(c, h)->aq_peer_sends);
}

static void channel_app_send__offer_relayed_and_granted__meshd_posts_none_and_takes_credits(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct mesh_ring_aq *q;
	PeerMsg *m;
	size_t from;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	/* The offer: the rail's path, read off meshd's own QP. */
	assert_int_equal(q->path_valid, 1);
	assert_string_equal(q->dev, "fake0");
	assert_int_equal(q->port, 1);
	assert_int_equal(q->dgid[0], 0xab);
	from = c->t.fx->n_posts;
	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_APP_QP, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_app_qp->slot, PEER_SLOT);
	assert_int_equal(m->channel_app_qp->qpn, AQ_QPN);
	assert_int_equal(m->channel_app_qp->psn, AQ_PSN);
	assert_int_equal(m->channel_app_qp->rx_rkey, 0x77);
	assert_int_equal(m->channel_app_qp->dir_rkey, 0x88);
	assert_int_equal(m->channel_app_qp->caps, MESH_AQ_CAP_IMM_POS);
	mesh_peer_msg_free(m);
	/* The peer's offer lands in our application's page. */
	peer_app_qp(c, h, 1, 0);
	assert_int_equal(q->peer_caps, MESH_AQ_CAP_IMM_POS | 0x40);
	assert_int_equal(q->peer_qpn, 0x4321);
	assert_int_equal(q->peer_psn, 0x99);
	assert_int_equal(q->peer_rx_rkey, 0x55);
	assert_int_equal(q->peer_dir_addr, 0x20000);
	/* Not granted before both are ready. */
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	from = c->t.fx->n_posts;
	peer_app_qp(c, h, 2, 0);
	assert_int_equal(atomic_load(&q->peer_state), MESH_AQ_PEER_READY);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_APP);
	assert_true(app_take(c, h));
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 3);
	complete_sends(c);
	/* Our application posts: meshd writes nothing of its bytes, yet counts them and takes the
	 * peer's credit for them. */
	from = c->t.fx->n_posts;
	app_write(h, 1000);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	peer_credit(c, h, 1000);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(chn(c, h)->tx_bytes, 1000);
	assert_int_equal(ring_tx_cons(h), 1000);
	assert_string_equal(chn(c, h)->aq_granted ? "app" : "meshd", "app");
	mt_finish(&c->t);
}

/* Both applications offered and connected their QPs: meshd offers ours the grant, not taken yet. */
static void aq_grant_offered(struct ct *c, struct chan *h)
{
	struct mesh_ring_aq *q = mesh_ring_aq(h->app->ctrl);

	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN);
	peer_app_qp(c, h, 1, 0);
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN);
	peer_app_qp(c, h, 2, 0);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_APP);
	assert_int_equal(atomic_load(&q->grant_pos), h->app->tx_prod);
	complete_sends(c);
}

/* The race the grant's compare-and-swap closes (ring.h MESH_AQ_CAP_TAKE): our application published
 * bytes after meshd stored the grant but looked for it just before, and makes no more calls (a
 * program that writes and then waits on something else: the Go binding's test of deadlines hung
 * so). meshd withdraws the grant and posts the bytes itself, then grants again from after them. */
static void channel_app_send__published_before_the_grant_was_taken__meshd_withdraws_and_posts_them(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	uint64_t pos = 0;
	size_t from;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_grant_offered(c, h);
	from = c->t.fx->n_posts;
	app_write(h, 100);
	app_kick(c, h); /* libmesh kicks for bytes it publishes without a grant in sight */
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	assert_int_equal(chn(c, h)->aq_withdrawn, 1);
	assert_int_equal(chn(c, h)->aq_grants, 0);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 0); /* the peer heard of no grant */
	assert_int_equal(write_count(c, h, from, false), 1);
	/* Our application looks only now: the grant is not there to take. */
	assert_false(app_take(c, h));
	complete_data(c, h, from);
	assert_int_equal(chn(c, h)->tx_done, 100);
	/* Once they completed, the grant comes again, from after them. */
	from = c->t.fx->n_posts;
	app_kick(c, h);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_APP);
	assert_int_equal(atomic_load(&q->grant_pos), 100);
	assert_true(app_take(c, h));
	assert_int_equal(sent_aq_state(c, from, 0, &pos), 3);
	assert_int_equal(pos, 100);
	assert_int_equal(chn(c, h)->aq_grants, 1);
	complete_sends(c);
	/* And it is the application's: meshd posts nothing of what comes now, and counts it. */
	from = c->t.fx->n_posts;
	app_write(h, 50);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	peer_credit(c, h, 150);
	assert_int_equal(chn(c, h)->tx_bytes, 150);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* The application says IDLE (a shutdown, a failed QP) without having taken the grant: nothing of it
 * went, so no hand-back: meshd posts what it published. */
static void channel_app_send__idle_before_taking_the_grant__withdrawn_no_hand_back(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_grant_offered(c, h);
	from = c->t.fx->n_posts;
	app_write(h, 50);
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 0); /* neither SENDING nor HANDBACK */
	assert_int_equal(write_count(c, h, from, false), 1);
	assert_false(chn(c, h)->aq_granted);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* An older libmesh (no MESH_AQ_CAP_TAKE) gets the grant as before: its own at once, the peer told
 * first. */
static void channel_app_send__application_without_take__granted_at_once(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	aq_on(c);
	c->aq_caps = MESH_AQ_CAP_IMM_POS;
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN);
	peer_app_qp(c, h, 1, 0);
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN);
	from = c->t.fx->n_posts;
	peer_app_qp(c, h, 2, 0);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 3);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_APP);
	assert_int_equal(chn(c, h)->aq_grants, 1);
	complete_sends(c);
	from = c->t.fx->n_posts;
	app_write(h, 100);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_int_equal(chn(c, h)->aq_withdrawn, 0);
	mt_finish(&c->t);
}

/* Only TAKEN may replace an offered grant: anything else the application writes there breaks its
 * own channel, named. */
static void channel_app_send__application_writes_over_the_grant__channel_broken_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	aq_grant_offered(c, h);
	atomic_store(&mesh_ring_aq(h->app->ctrl)->grant, 7);
	app_kick(c, h);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_app_send__granted__tx_space_ends_at_the_readers_credit(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	aq_granted(c, h);
	app_write(h, 3000);
	app_kick(c, h);
	/* Placed all, read 1000: the application may not write past 1000 + a ring (it posts into the
	 * peer's ring itself, where only the reader's position bounds it). */
	peer_credit_placed(c, h, 1000, 3000);
	assert_int_equal(ring_tx_cons(h), 1000);
	mt_finish(&c->t);
}

/* Bytes the application posted on its own QP are no move for a polling meshd: it takes them at its
 * next pump, as it does when it sleeps (libmesh does not kick for them). */
static void channel_poll__granted_applications_writes__not_a_move(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	aq_granted(c, h);
	app_write(h, 3000);
	assert_int_equal(channel_poll(&c->t.m, 0), 0);
	/* The next pump takes them all the same: the reader's credit is within them. */
	peer_credit_placed(c, h, 1000, 3000);
	assert_int_equal(ring_tx_cons(h), 1000);
	assert_true(chn(c, h)->tx_bytes == 3000);
	mt_finish(&c->t);
}

static void channel_app_send__hostile_qp_words__channel_broken_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h, *h2;

	ct_init(c, 2);
	aq_on(c);
	/* a QP number beyond 24 bits */
	h = open_out(c, RING, 2, PEER_SLOT);
	app_aq_say(c, h, MESH_AQ_OFFER, 1u << 24);
	expect_broken(c, h, -EPROTO);
	/* a state that goes back */
	h2 = open_out(c, RING, 2, PEER_SLOT + 1);
	app_aq_say(c, h2, MESH_AQ_OFFER, AQ_QPN);
	app_aq_say(c, h2, MESH_AQ_READY, AQ_QPN);
	app_aq_say(c, h2, MESH_AQ_OFFER, AQ_QPN);
	expect_broken(c, h2, -EPROTO);
	/* a state beyond IDLE: the first channel is broken already; a third one */
	h = open_out(c, RING, 2, PEER_SLOT + 2);
	app_aq_say(c, h, 7, AQ_QPN);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_app_send__peer_sends_from_an_unfit_position__channel_broken(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	/* SENDING before its application said READY */
	peer_app_qp(c, h, 3, 0);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_app_send__hand_back__peer_says_placed_meshd_posts_from_there(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_granted(c, h);
	app_write(h, 3000);
	app_kick(c, h);
	/* The application's QP failed after 1000 of its 3000 bytes arrived: it says IDLE. */
	from = c->t.fx->n_posts;
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 4); /* HANDBACK */
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_REVOKED);
	assert_int_equal(write_count(c, h, from, false), 0); /* nothing before the peer says where */
	complete_sends(c);
	/* The peer read the pair: 1000 arrived. meshd writes the rest from the application's TX. */
	from = c->t.fx->n_posts;
	peer_app_qp(c, h, 5, 1000);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_true(write_count(c, h, from, false) > 0);
	complete_data(c, h, from);
	/* Bytes 1000..3000 are in the peer's ring now, written by meshd from the application's TX. */
	check_peer_ring(h, 1000, 3000);
	assert_int_equal(chn(c, h)->rewritten_bytes, 2000);
	assert_false(chn(c, h)->aq_granted);
	mt_finish(&c->t);
}

/* The application said IDLE (a shutdown hands its half back) and the link went before the peer's
 * PLACED came: the resume's rewind takes the PLACED's place, and meshd posts the rest (it waited on
 * a grant nobody held: a stream's last bytes hung in the VM's resilience test, the sender's meshd
 * still saying "writer app"). */
static void channel_app_send__hand_back_then_link_lost__resume_rewinds_meshd_posts_the_rest(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	aq_granted(c, h);
	app_write(h, 3000);
	app_kick(c, h);
	from = c->t.fx->n_posts;
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 4); /* HANDBACK, lost with the link */
	link_lost(c);
	link_back(c, 5000);
	mesh_peer_msg_free(sent_resume(c, h, from));
	complete_sends(c);
	/* The peer's reader has 1000 of the 3000: meshd writes the rest itself. */
	from = c->t.fx->n_posts;
	peer_resume(c, h, 1000, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_false(chn(c, h)->aq_granted);
	assert_true(write_count(c, h, from, false) > 0);
	complete_data(c, h, from);
	check_peer_ring(h, 1000, 3000);
	/* A PLACED that comes late after all is stale: ignored. */
	peer_app_qp(c, h, 5, 1000);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

static void channel_app_send__peer_application_writes__rx_follows_its_pair_within_the_credit(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_direct *d;
	struct chan *h;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	aq_peer_sending(c, h); /* its application posts from 0 */
	d = mesh_ring_direct(h->app->ctrl);
	/* Its application's pair at 500: meshd's rx_bytes and counters follow at the next pump. */
	atomic_store(&d->pos, 500);
	atomic_store(&d->check, mesh_ring_direct_check(500));
	app_kick(c, h);
	assert_int_equal(chn(c, h)->rx_bytes, 500);
	assert_int_equal(chn(c, h)->rx_bytes_total, 500);
	assert_int_equal(ring_rx_prod(h), 500);
	/* A pair past the reader's credit (a ring beyond what it consumed) is ignored, as is a torn one. */
	atomic_store(&d->pos, RING + 1);
	atomic_store(&d->check, mesh_ring_direct_check(RING + 1));
	app_kick(c, h);
	assert_int_equal(chn(c, h)->rx_bytes, 500);
	atomic_store(&d->pos, 700);
	atomic_store(&d->check, mesh_ring_direct_check(701));
	app_kick(c, h);
	assert_int_equal(chn(c, h)->rx_bytes, 500);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* A lost link revokes our application's QP; once the channel resumed and the application said
 * IDLE, meshd offers it a new one (round 1) and grants the half again when both new QPs are
 * ready. Messages of the peer's old QP that come late change nothing. */
static void channel_app_send__resume_revoked_the_qp__new_round_offered_and_granted_again(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	size_t from;
	PeerMsg *m;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_granted(c, h);
	assert_int_equal(chn(c, h)->aq_grants, 1);
	app_write(h, 3000);
	app_kick(c, h);

	link_lost(c);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_REVOKED);
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	assert_int_equal(atomic_load(&q->round), 0); /* not before the resume is done */
	from = c->t.fx->n_posts;
	link_back(c, 5000);
	mesh_peer_msg_free(sent_resume(c, h, from));
	complete_sends(c);
	assert_int_equal(atomic_load(&q->round), 0);
	/* The peer's reader has 1000 of the 3000 our application published: meshd writes the rest. */
	from = c->t.fx->n_posts;
	peer_resume(c, h, 1000, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_true(write_count(c, h, from, false) > 0);
	complete_data(c, h, from);
	check_peer_ring(h, 1000, 3000);
	/* The new round: the page as for a first offer, the round changed last. */
	assert_int_equal(atomic_load(&q->round), 1);
	assert_int_equal(q->path_valid, 1);
	assert_string_equal(q->dev, "fake0");
	assert_int_equal(atomic_load(&q->app_state), MESH_AQ_NONE);
	assert_int_equal(atomic_load(&q->peer_state), MESH_AQ_PEER_NONE);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	/* Late words of the peer's old QP: ignored, not a breach. */
	peer_app_qp_round(c, h, 3, 1000, 0);
	peer_app_qp_round(c, h, 1, 0, 0);
	assert_int_equal(atomic_load(&q->peer_state), MESH_AQ_PEER_NONE);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	/* The peer's meshd renewed first: its new offer and READY wait for our application's. */
	peer_app_qp_round(c, h, 1, 0, 1);
	peer_app_qp_round(c, h, 2, 0, 1);
	assert_int_equal(atomic_load(&q->peer_state), MESH_AQ_PEER_READY);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	from = c->t.fx->n_posts;
	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN + 1);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_APP_QP, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_app_qp->state, 1);
	assert_int_equal(m->channel_app_qp->round, 1);
	assert_int_equal(m->channel_app_qp->qpn, AQ_QPN + 1);
	mesh_peer_msg_free(m);
	complete_sends(c);
	from = c->t.fx->n_posts;
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN + 1);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 2);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_APP);
	assert_int_equal(atomic_load(&q->grant_pos), 3000);
	assert_true(app_take(c, h));
	assert_int_equal(sent_aq_state(c, from, 1, NULL), 3); /* SENDING: granted again */
	assert_int_equal(chn(c, h)->aq_grants, 2);
	complete_sends(c);
	/* The peer's application posts its half again too, from its new QP. */
	peer_app_qp_round(c, h, 3, 0, 1);
	assert_true(chn(c, h)->aq_peer_sends);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* The link goes before the grant (both QPs offered, ours connected): our application is told to
 * stop all the same, and once it is IDLE and the channel resumed it gets a new round. */
static void channel_app_send__resume_before_the_grant__application_stopped_and_offered_anew(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN);
	peer_app_qp(c, h, 1, 0);
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	link_lost(c);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_REVOKED);
	link_back(c, 5000);
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	assert_int_equal(atomic_load(&q->round), 0); /* its QP is not stopped yet */
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	assert_int_equal(atomic_load(&q->round), 1);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	assert_int_equal(atomic_load(&q->app_state), MESH_AQ_NONE);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* The receiving side of a stream whose peer application posts: the link goes, both resume, the
 * peer's application gives its writes back only after the resume (its HANDBACK), then both meshd
 * renew in either order: the peer's new SENDING makes rx follow its application again. */
static void channel_app_send__peer_renews_after_a_hand_back__its_writes_followed_again(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	size_t from;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_peer_sending(c, h);
	complete_sends(c);
	assert_true(chn(c, h)->aq_peer_sends);
	atomic_store(&q->rx_seen, 500);
	app_kick(c, h);
	assert_int_equal(chn(c, h)->rx_bytes, 500);

	link_lost(c);
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	link_back(c, 5000);
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	complete_sends(c);
	assert_int_equal(atomic_load(&q->round), 1);
	/* Its application said IDLE after the resume: its hand-back, our answer. */
	from = c->t.fx->n_posts;
	peer_app_qp_round(c, h, 4, 0, 0);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 5);
	complete_sends(c);
	/* Its meshd renewed: offer and READY of its round 1; ours offers and is ready too. */
	peer_app_qp_round(c, h, 1, 0, 1);
	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN + 1);
	assert_int_equal(atomic_load(&q->peer_state), MESH_AQ_PEER_INFO);
	peer_app_qp_round(c, h, 2, 0, 1);
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN + 1);
	complete_sends(c);
	/* Its bytes 500..700 came by its meshd's immediates before its grant. */
	peer_data(c, h, 0, 0, 500, 200);
	peer_app_qp_round(c, h, 3, 700, 1);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_true(chn(c, h)->aq_peer_sends);
	atomic_store(&q->rx_seen, 900);
	app_kick(c, h);
	assert_int_equal(chn(c, h)->rx_bytes, 900);
	mt_finish(&c->t);
}

/* Two resumes close together (a rail's failover, then the whole link): the second revokes a round
 * that the application had not answered yet (its new QP still being made, app_state NONE). It
 * answers all the same (its QP offered, then stopped: IDLE), and that IDLE must bring the next
 * round; a channel that waited for an answer it already had would stay meshd-posted for good (the
 * VM's resilience test saw app_grants stop at 2 after its second outage). */
static void channel_app_send__second_resume_before_the_application_answered__next_round_offered(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	size_t from;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_granted(c, h);
	link_lost(c);
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	link_back(c, 5000);
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	complete_sends(c);
	assert_int_equal(atomic_load(&q->round), 1);
	assert_int_equal(atomic_load(&q->app_state), MESH_AQ_NONE);
	/* The link goes again before the application offers its round-1 QP. */
	link_lost(c);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_REVOKED);
	link_back(c, 9000);
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	complete_sends(c);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_int_equal(atomic_load(&q->round), 1); /* its answer is still to come */
	/* The application, late: its round-1 QP offered (not relayed: it stops at once, and the peer's
	 * application would connect to it), then stopped for the revocation. */
	from = c->t.fx->n_posts;
	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN + 1);
	assert_null(sent_msg(c, from, PEER_MSG__BODY_CHANNEL_APP_QP, 0));
	complete_sends(c);
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN + 1);
	complete_sends(c);
	assert_int_equal(atomic_load(&q->round), 2);
	assert_int_equal(atomic_load(&q->app_state), MESH_AQ_NONE);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* The same in the first round: the link goes while the application is still making its first QP
 * (nothing offered yet); it stops that QP when it sees the revocation, and its IDLE brings round 1. */
static void channel_app_send__resume_before_the_first_offer__application_offered_anew(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	link_lost(c);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_REVOKED);
	link_back(c, 5000);
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	complete_sends(c);
	assert_int_equal(atomic_load(&q->round), 0);
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	complete_sends(c);
	assert_int_equal(atomic_load(&q->round), 1);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* A resume with an application that never took the offer (an older libmesh): no new round. */
static void channel_app_send__offer_not_taken__no_new_round_after_a_resume(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	link_lost(c);
	link_back(c, 5000);
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_int_equal(atomic_load(&mesh_ring_aq(h->app->ctrl)->round), 0);
	assert_false(chn(c, h)->aq_renew);
	mt_finish(&c->t);
}

/* The peer's application carries positions in its immediates (MESH_AQ_CAP_IMM_POS): no pair
 * lands, and our application publishes what its CQ said in rx_seen, which meshd takes as it would
 * a pair, within the reader's credit; the reader may consume up to it. */
static void channel_app_send__peer_writes_by_immediate__rx_follows_the_applications_rx_seen(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_peer_sending(c, h);
	atomic_store(&q->rx_seen, 700);
	app_kick(c, h);
	assert_int_equal(chn(c, h)->rx_bytes, 700);
	assert_int_equal(ring_rx_prod(h), 700);
	/* Past the reader's credit: ignored. */
	atomic_store(&q->rx_seen, RING + 1);
	app_kick(c, h);
	assert_int_equal(chn(c, h)->rx_bytes, 700);
	/* The link goes; our application's CQ still had completions up to 900, which it polls after
	 * meshd took 700 for its resume: reading to 900 is within what it was told, not a breach. */
	link_lost(c);
	atomic_store(&q->rx_seen, 900);
	h->app->rx_cons = 900;
	atomic_store(&h->app->ctrl->rx_cons, 900);
	app_kick(c, h);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(chn(c, h)->rx_bytes, 700); /* the resume asks for the rest again */
	mt_finish(&c->t);
}

static void channel_app_send__provider_without_paths__nothing_offered(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	strcpy(c->t.cfg.app_send, "on"); /* but the provider has no paths */
	h = open_out(c, RING, 2, PEER_SLOT);
	assert_int_equal(mesh_ring_aq(h->app->ctrl)->path_valid, 0);
	assert_false(chn(c, h)->aq_offered);
	mt_finish(&c->t);
}

/* Over the tcp provider the page gets the rail's two addresses, and the applications' ports and
 * tokens are relayed where QP numbers and keys would be; a grant follows as over rdma. */
static void channel_app_send__tcp_path__port_and_token_relayed_and_granted(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct mesh_ring_aq *q;
	PeerMsg m = PEER_MSG__INIT, *s;
	ChannelAppQp a = CHANNEL_APP_QP__INIT;
	uint8_t token[MESH_AQ_TOKEN_LEN], ptoken[MESH_AQ_TOKEN_LEN];
	size_t from;

	ct_init(c, 2);
	aq_on(c);
	c->t.fx->path_tcp = true;
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	assert_int_equal(q->path_valid, MESH_AQ_PATH_TCP);
	assert_int_equal(q->port, 0); /* an older libmesh takes no offer */
	assert_int_equal(q->tcp_family, AF_INET);
	assert_int_equal(q->tcp_local[3], 1);
	assert_int_equal(q->tcp_peer[3], 2);
	/* our application listens on 40000 */
	memset(token, 0x5a, sizeof(token));
	q->tcp_port = 40000;
	memcpy(q->tcp_token, token, sizeof(token));
	from = c->t.fx->n_posts;
	atomic_store_explicit(&q->app_state, MESH_AQ_OFFER, memory_order_release);
	app_kick(c, h);
	s = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_APP_QP, 0);
	assert_non_null(s);
	assert_int_equal(s->channel_app_qp->state, 1);
	assert_int_equal(s->channel_app_qp->tcp_port, 40000);
	assert_int_equal(s->channel_app_qp->tcp_token.len, MESH_AQ_TOKEN_LEN);
	assert_memory_equal(s->channel_app_qp->tcp_token.data, token, sizeof(token));
	assert_int_equal(s->channel_app_qp->qpn, 0);
	mesh_peer_msg_free(s);
	/* the peer's application listens on 40001 */
	memset(ptoken, 0xa5, sizeof(ptoken));
	a.slot = h->slot;
	a.state = 1;
	a.tcp_port = 40001;
	a.tcp_token.data = ptoken;
	a.tcp_token.len = sizeof(ptoken);
	m.body_case = PEER_MSG__BODY_CHANNEL_APP_QP;
	m.channel_app_qp = &a;
	peer_msg(c, &m);
	assert_int_equal(atomic_load(&q->peer_state), MESH_AQ_PEER_INFO);
	assert_int_equal(q->peer_tcp_port, 40001);
	assert_memory_equal(q->peer_tcp_token, ptoken, sizeof(ptoken));
	atomic_store_explicit(&q->app_state, MESH_AQ_READY, memory_order_release);
	app_kick(c, h);
	peer_app_qp(c, h, 2, 0);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_APP);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* A peer's meshd that does not relay tcp offers (no MESH_FEAT_APPTCP): nothing is offered. */
static void channel_app_send__tcp_path_peer_without_the_feature__nothing_offered(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	aq_on(c);
	c->t.fx->path_tcp = true;
	c->l->features &= ~MESH_FEAT_APPTCP;
	h = open_out(c, RING, 2, PEER_SLOT);
	assert_int_equal(mesh_ring_aq(h->app->ctrl)->path_valid, 0);
	assert_false(chn(c, h)->aq_offered);
	mt_finish(&c->t);
}

/* Our application's tcp offer is hostile: a port of 0, or a token of zeros, breaks its channel. */
static void channel_app_send__tcp_offer_without_port_or_token__channel_broken_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct mesh_ring_aq *q;

	ct_init(c, 2);
	aq_on(c);
	c->t.fx->path_tcp = true;
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	memset(q->tcp_token, 1, MESH_AQ_TOKEN_LEN);
	q->tcp_port = 0;
	atomic_store_explicit(&q->app_state, MESH_AQ_OFFER, memory_order_release);
	app_kick(c, h);
	expect_broken(c, h, -EPROTO);
	h = open_out(c, RING, 2, PEER_SLOT + 1);
	q = mesh_ring_aq(h->app->ctrl);
	q->tcp_port = 40000;
	atomic_store_explicit(&q->app_state, MESH_AQ_OFFER, memory_order_release);
	app_kick(c, h);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_link_down__opening_channel__client_told_econnreset(void **state)
{
	struct ct *c = *state;
	struct xport_event ev;

	ct_init(c, 2);
	connect_out(c, 80, RING, 2, PEER_SLOT);
	ev = cm_event(XPORT_EV_DISCONNECTED, c->l->conns[0], NULL, 0);
	ev.status = -ECONNRESET;
	deliver(&c->t, &ev);
	assert_int_equal(c->n_apps, 1);
	assert_int_equal(c->apps[0].client_fd, CLIENT_FD);
	assert_int_equal(c->apps[0].status, -ECONNRESET);
	assert_int_equal(c->t.m.n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 0);
	mt_finish(&c->t);
}

/* ---- ordering across QPs and full send queues ----------------------------------------------------- */

/* The acceptor writes as soon as its application has the channel: its chunk 1 goes on QP 1 while
 * its Accept and chunk 0 go on QP 0, and our completions of different QPs come from different CQs
 * in any order. A chunk that overtakes the Accept must not be lost. */
static void channel_on_imm__data_before_accept__kept_until_accept(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = connect_out(c, 80, RING, 2, PEER_SLOT);
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	accept_out(c, h);
	peer_data(c, h, 0, 0, 0, CHUNK);
	if (ring_rx_prod(h) != 2 * CHUNK)
		fail_msg("rx_prod %llu after chunks 0 and 1 of %u bytes: the chunk that overtook the Accept was lost",
			 (unsigned long long)ring_rx_prod(h), CHUNK);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	app_read(h, 2 * CHUNK);
	mt_finish(&c->t);
}

/* Every send buffer of the link busy: the peer has not completed 16 KeepaliveAcks of ours. */
static void fill_send_slots(struct ct *c)
{
	complete_sends(c);
	for (uint64_t i = 0; i < 16; i++)
		peer_keepalive(c, i + 1);
	assert_int_equal(c->l->send_busy, 0xffffu);
}

static void channel_on_lifeline__send_buffers_busy__close_sent_once_one_frees(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	fill_send_slots(c);
	from = c->t.fx->n_posts;
	app_hangup(c, h);
	complete_sends(c);
	tick(&c->t);
	if (!sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE))
		fail_msg("no ChannelClose reached the peer: it will never acknowledge, the channel never goes");
	assert_int_equal(sent_close_reason(c, h, from), -ECONNRESET);
	complete_sends(c);
	peer_close_ack(c, h);
	assert_int_equal(c->t.m.n_channels, 0);
	mt_finish(&c->t);
}

static void channel_on_kick__send_buffers_busy__eof_sent_once_one_frees(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	fill_send_slots(c);
	from = c->t.fx->n_posts;
	app_write(h, 100);
	app_shut_wr(h);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 1);
	complete_data(c, h, from);
	complete_sends(c);
	tick(&c->t);
	if (!sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF))
		fail_msg("no ChannelEof reached the peer: its reader never sees the end of the stream");
	mt_finish(&c->t);
}

/* After the peer's Close (and our CloseAck) its ring is gone: bytes the application publishes now
 * can never be delivered, and it must hear so rather than wait for tx_cons forever. */
static void channel_on_kick__write_after_peer_close__application_told(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_eof(c, h, 0);
	from = c->t.fx->n_posts;
	peer_close(c, h, 0);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE_ACK), 1);
	app_write(h, 100);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	if (!(ring_state(h) & MESH_STATE_ERROR) || ring_error(h) >= 0)
		fail_msg("state 0x%x error %d after 100 bytes that can never be sent: the writer waits forever",
			 ring_state(h), ring_error(h));
	mt_finish(&c->t);
}

/* ---- direct receive ------------------------------------------------------------------------- */

/* 64 zeroed bytes, aligned: the peer's words our writes land in. */
static uint64_t *peer_words(void)
{
	uint64_t *w = aligned_alloc(64, 64);

	assert_non_null(w);
	memset(w, 0, 64);
	return w;
}

/* An outgoing channel whose peer announces a direct pair in its Accept, and a pair hint with hint. */
static struct chan *open_out_paired(struct ct *c, uint32_t qps, bool hint)
{
	struct chan *h = connect_out(c, 5000, RING, qps, PEER_SLOT);

	h->peer_dir = peer_words();
	if (hint)
		h->peer_hint = peer_words();
	accept_out(c, h);
	return h;
}

static struct chan *open_out_direct(struct ct *c, uint32_t qps)
{
	return open_out_paired(c, qps, false);
}

/* The nth plain WRITE to raddr posted since from, or NULL. */
static struct fake_post *plain_write(struct ct *c, const void *raddr, size_t from, size_t nth)
{
	for (size_t i = from; raddr && i < c->t.fx->n_posts; i++) {
		struct fake_post *p = &c->t.fx->posts[i];

		if (p->op != XPORT_OP_WRITE || p->raddr != (uintptr_t)raddr)
			continue;
		if (nth-- == 0)
			return p;
	}
	return NULL;
}

/* The {value, check} of a plain WRITE p of len bytes (a direct pair, a pair hint): its value. */
static uint64_t checked_word(const struct fake_post *p, uint32_t len)
{
	const uint64_t *w = p->buf;

	assert_int_equal(p->len, len);
	assert_true(w[1] == mesh_ring_direct_check(w[0]));
	return w[0];
}

/* The nth write of a direct pair to channel h's peer posted since from, or NULL. */
static struct fake_post *direct_post(struct ct *c, const struct chan *h, size_t from, size_t nth)
{
	return plain_write(c, h->peer_dir, from, nth);
}

/* The pair p carries: pos, with its check. */
static uint64_t direct_pos(const struct fake_post *p)
{
	return checked_word(p, MESH_RING_DIRECT_LEN);
}

/* The peer's NIC lands {pos, check} in our direct pair (check_ok false: a pair read half landed). */
static void peer_direct(const struct chan *h, uint64_t pos, bool check_ok)
{
	uint64_t check = mesh_ring_direct_check(pos);

	atomic_store_explicit(&h->our_dir->pos, pos, memory_order_release);
	atomic_store_explicit(&h->our_dir->check, check_ok ? check : check ^ 1, memory_order_release);
}

/* The peer's bytes [pos, pos + len) land in our RX ring, their immediate not polled yet. */
static void peer_bytes(const struct chan *h, uint64_t pos, uint32_t len)
{
	for (uint32_t i = 0; i < len; i++)
		h->our_rx[(pos + i) & (h->size - 1)] = pat(pos + i, SALT_IN);
}

static void channel_on_kick__peer_has_direct_pair__pair_after_the_data_on_its_qp_one_at_a_time(void **state)
{
	struct ct *c = *state;
	struct fake_post *d, *p;
	struct ch_regs r;
	struct chan *h;
	size_t from;

	ct_init(c, 1);
	h = open_out_direct(c, 1);
	r = find_regs(c, RING);
	from = c->t.fx->n_posts;
	app_write(h, 100);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 1);
	d = write_post(c, h, from, false, 0);
	p = direct_post(c, h, from, 0);
	assert_non_null(p);
	/* After the data, on the same QP (posts are recorded in order), from our registered out words. */
	assert_true(p > d);
	assert_int_equal(p->conn_id, d->conn_id);
	assert_ptr_equal(p->mr->addr, r.cout->addr);
	assert_ptr_equal(p->buf, (const uint8_t *)r.cout->addr + MESH_CREDIT_LEN);
	assert_true(direct_pos(p) == 100);
	assert_int_equal(chn(c, h)->inflight, 2);
	/* While it is in flight the next bytes go, their pair waits: its source must not change. */
	app_write(h, 50);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 2);
	assert_null(direct_post(c, h, from, 1));
	assert_true(direct_pos(p) == 100);
	complete_write(c, h, p);
	assert_true(h->peer_dir[0] == 100 && h->peer_dir[1] == mesh_ring_direct_check(100));
	p = direct_post(c, h, from, 1);
	assert_non_null(p);
	assert_true(direct_pos(p) == 150);
	complete_data(c, h, from);
	complete_write(c, h, p);
	assert_int_equal(chn(c, h)->inflight, 0);
	assert_true(chn(c, h)->direct_writes == 2);
	/* Nothing new: no pair. A completed stream needs none either. */
	app_kick(c, h);
	tick(&c->t);
	assert_null(direct_post(c, h, from, 2));
	check_peer_ring(h, 0, 150);
	mt_finish(&c->t);
}

/* A QP that refuses the direct pair (its connection went down; the link's event comes later): the
 * channel is not broken for it, the data still counts, and the next pair goes out when it can. */
static void channel_on_kick__direct_pair_refused__channel_kept_next_pair_later(void **state)
{
	struct ct *c = *state;
	struct fake_post *p;
	struct chan *h;
	size_t from;

	ct_init(c, 1);
	h = open_out_direct(c, 1);
	from = c->t.fx->n_posts;
	c->t.fx->fail_post_plain_write.err = -ENOTCONN;
	app_write(h, 100);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 1);
	assert_null(direct_post(c, h, from, 0));
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_true(chn(c, h)->direct_writes == 0);
	assert_int_equal(chn(c, h)->inflight, 1);
	/* More bytes: their pair covers everything so far. */
	app_write(h, 50);
	app_kick(c, h);
	p = direct_post(c, h, from, 0);
	assert_non_null(p);
	assert_true(direct_pos(p) == 100 || direct_pos(p) == 150);
	complete_data(c, h, from);
	complete_write(c, h, p);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	check_peer_ring(h, 0, 150);
	app_hangup(c, h);
	mt_finish(&c->t);
}

static void channel_on_kick__striped_over_two_qps__pair_covers_only_what_is_ordered_or_done(void **state)
{
	struct ct *c = *state;
	struct fake_post *p;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out_direct(c, 2);
	from = c->t.fx->n_posts;
	app_write(h, 2 * CHUNK);
	app_kick(c, h);
	assert_true(check_data_posts(c, h, from, 0, 0, 0, CHUNK) == 2 * CHUNK);
	/* Chunk 0 on QP 0 is neither done nor ahead of a pair on QP 1: nothing can be vouched for. */
	assert_null(direct_post(c, h, from, 0));
	complete_write(c, h, write_post(c, h, from, false, 0));
	/* Chunk 0 done, chunk 1 on QP 1: a pair behind it there covers both. */
	p = direct_post(c, h, from, 0);
	assert_non_null(p);
	assert_int_equal(p->conn_id, conn_id(c->l->conns[1]));
	assert_true(p > write_post(c, h, from, false, 1));
	assert_true(direct_pos(p) == 2 * CHUNK);
	/* A peer without a pair (an older meshd) gets none: the other tests' peers. */
	mt_finish(&c->t);
}

static void channel_on_kick__app_read_past_rx_prod__accepted_up_to_a_valid_direct_pair(void **state)
{
	struct ct *c = *state;
	struct fake_post *p;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	assert_non_null(h->our_dir);
	assert_int_not_equal(h->our_dir_rkey, 0);
	/* The peer's NIC placed chunks 0 and 1 and then the pair; their immediates are not polled yet. */
	peer_bytes(h, 0, 2 * CHUNK);
	peer_direct(h, 2 * CHUNK, true);
	from = c->t.fx->n_posts;
	app_read(h, 2 * CHUNK);
	app_kick(c, h);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	/* No credit: what we credit is also what we say we placed, and we have placed nothing. */
	assert_int_equal(write_count(c, h, from, true), 0);
	assert_true(ring_rx_prod(h) == 0);
	/* The immediates: placed now, and the reader's half ring is credited once all of it is. */
	peer_imm(c, 0, MESH_IMM(0, h->slot, 0), CHUNK);
	assert_true(ring_rx_prod(h) == CHUNK);
	assert_int_equal(write_count(c, h, from, true), 0);
	peer_imm(c, 1, MESH_IMM(0, h->slot, 1), CHUNK);
	assert_true(ring_rx_prod(h) == 2 * CHUNK);
	assert_int_equal(write_count(c, h, from, true), 1);
	p = write_post(c, h, from, true, 0);
	assert_true(((const uint64_t *)p->buf)[0] == 2 * CHUNK);
	assert_true(((const uint64_t *)p->buf)[1] == 2 * CHUNK);
	/* A pair whose check does not match (read while it landed) proves nothing: reading past what
	 * is placed is then the application's error. */
	peer_bytes(h, 2 * CHUNK, 500);
	peer_direct(h, 2 * CHUNK + 500, false);
	app_read(h, 500);
	app_kick(c, h);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

/* What the application read up to a valid pair stays read when meshd catches the next pair
 * landing (its check does not match for a moment): a channel of the VM's all-to-all test broke so,
 * its reader having moved by nothing. Reading past the torn pair is still an error. */
static void channel_on_kick__pair_torn_after_the_app_read_by_it__not_an_error(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_bytes(h, 0, CHUNK);
	peer_direct(h, CHUNK, true);
	app_read(h, CHUNK);
	app_kick(c, h);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	peer_bytes(h, CHUNK, 500);
	peer_direct(h, CHUNK + 500, false);
	app_kick(c, h);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_true(chn(c, h)->app_rx_cons == CHUNK);
	app_read(h, 500);
	app_kick(c, h);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_connect__direct_receive_off__no_key_for_the_page(void **state)
{
	struct ct *c = *state;
	size_t regs;
	struct chan *h;

	ct_init(c, 1);
	snprintf(c->t.cfg.direct_receive, sizeof(c->t.cfg.direct_receive), "off");
	regs = c->t.fx->n_regs;
	h = connect_out(c, 80, RING, 1, PEER_SLOT);
	assert_int_equal(c->t.fx->n_regs, regs + 5); /* no registration of the direct pair */
	assert_int_equal(h->our_dir_rkey, 0);
	for (size_t i = regs; i < c->t.fx->n_regs; i++)
		assert_ptr_not_equal(c->t.fx->regs[i].addr, (uint8_t *)chn(c, h)->map + MESH_RING_DIRECT_OFF);
	mt_finish(&c->t);
}

static void channel_on_kick__direct_pair_beyond_a_ring__not_taken(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 1);
	h = open_out(c, RING, 1, PEER_SLOT);
	peer_bytes(h, 0, 100);
	peer_direct(h, 100 + RING, true);
	app_read(h, 100);
	app_kick(c, h);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

/* The application read ahead of what meshd placed (a direct pair) when the link went: the resume
 * names meshd's own position, reader included (ChannelResume.rx_cons never passes rx_bytes), and
 * the bytes the peer writes again land where the application already read them. */
static void channel_link_down__app_ahead_of_placed__resume_names_the_placed_position(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	PeerMsg *m;

	ct_init_resume(c, 2); /* link_lost cuts QP 1 */
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_bytes(h, 0, 2 * CHUNK + 200);
	peer_direct(h, 2 * CHUNK + 200, true);
	app_read(h, 2 * CHUNK + 200);
	app_kick(c, h);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	from = c->t.fx->n_posts;
	link_lost(c);
	link_back(c, 5000);
	m = sent_resume(c, h, from);
	assert_true(m->channel_resume->rx_bytes == 0);
	assert_true(m->channel_resume->rx_cons == 0);
	assert_true(m->channel_resume->direct_addr == (uintptr_t)h->our_dir);
	assert_int_not_equal(m->channel_resume->direct_rkey, h->our_dir_rkey); /* the new attempt's */
	assert_int_equal(reg_of_rkey(c, m->channel_resume->direct_rkey)->conn_id, conn_id(c->l->conns[0]));
	mesh_peer_msg_free(m);
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	from = c->t.fx->n_posts;
	peer_data(c, h, 0, 0, 0, CHUNK);
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	peer_data(c, h, 0, 2, 2 * CHUNK, 200);
	assert_true(ring_rx_prod(h) == 2 * CHUNK + 200);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_int_equal(write_count(c, h, from, true), 1); /* the reader's half ring, now placed */
	peer_bytes(h, 2 * CHUNK + 200, 100);
	peer_imm(c, 1, MESH_IMM(0, h->slot, 3), 100);
	app_read(h, 100);
	app_kick(c, h);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	mt_finish(&c->t);
}

/* ---- pairs on demand (wire.h MESH_PAIR_HINT_*) ---------------------------------------------------- */

static struct chan *open_out_hinted(struct ct *c, uint32_t qps)
{
	return open_out_paired(c, qps, true);
}

/* The nth write of a pair hint to channel h's peer posted since from, or NULL. */
static struct fake_post *hint_post(struct ct *c, const struct chan *h, size_t from, size_t nth)
{
	return plain_write(c, h->peer_hint, from, nth);
}

/* The hint p carries, with its check. */
static uint64_t hint_value(const struct fake_post *p)
{
	return checked_word(p, MESH_PAIR_HINT_LEN);
}

/* The peer's 64 B chunk seq at pos: through_pair, its pair lands after it and our reader reads it
 * before its immediate is polled; else the immediate comes first and the reader reads after it. */
static void peer_small(struct ct *c, struct chan *h, uint16_t seq, uint64_t pos, bool through_pair)
{
	if (through_pair) {
		peer_bytes(h, pos, 64);
		peer_direct(h, pos + 64, true);
		app_read(h, 64);
		app_kick(c, h);
		peer_imm(c, 0, MESH_IMM(0, h->slot, seq), 64);
	} else {
		peer_data(c, h, 0, seq, pos, 64);
		app_read(h, 64);
		app_kick(c, h);
	}
}

/* A reader that sleeps until meshd wakes it never reads through the peer's pairs: after
 * CH_PAIRS_IDLE_MAX such chunks in a row we ask the peer for none (a plain WRITE on QP 0 from our
 * registered out words), say nothing more while that stands, and ask for them again once both
 * CH_PAIRS_RETRY_CHUNKS chunks and CH_PAIRS_RETRY_MS have passed, neither alone. */
static void channel_on_imm__reader_sleeps_through_the_pairs__peer_asked_for_none_then_again(void **state)
{
	struct ct *c = *state;
	struct fake_post *p;
	struct ch_regs r;
	struct chan *h;
	uint16_t seq = 0;
	size_t from;

	ct_init(c, 1);
	h = open_out_hinted(c, 1);
	r = find_regs(c, RING);
	from = c->t.fx->n_posts;
	for (; seq < CH_PAIRS_IDLE_MAX - 1; seq++)
		peer_small(c, h, seq, seq * 64u, false);
	assert_null(hint_post(c, h, from, 0));
	peer_small(c, h, seq, seq * 64u, false);
	seq++;
	p = hint_post(c, h, from, 0);
	assert_non_null(p);
	assert_true(hint_value(p) == MESH_PAIR_HINT_OFF);
	assert_int_equal(p->conn_id, conn_id(c->l->conns[0]));
	assert_ptr_equal(p->mr->addr, r.cout->addr);
	assert_ptr_equal(p->buf, (const uint8_t *)r.cout->addr + 2 * MESH_CREDIT_LEN);
	complete_write(c, h, p);
	assert_true(h->peer_hint[0] == MESH_PAIR_HINT_OFF);
	assert_true(chn(c, h)->hint_writes == 1);
	/* The second has passed (the clock moved back instead), not the chunks: nothing said. */
	chn(c, h)->pairs_off_ms -= CH_PAIRS_RETRY_MS;
	for (uint32_t i = 0; i < CH_PAIRS_RETRY_CHUNKS - 1; i++, seq++)
		peer_small(c, h, seq, seq * 64u, false);
	assert_null(hint_post(c, h, from, 1));
	/* Both: the next chunk asks for pairs again. */
	peer_small(c, h, seq, seq * 64u, false);
	seq++;
	p = hint_post(c, h, from, 1);
	assert_non_null(p);
	assert_true(hint_value(p) == MESH_PAIR_HINT_ON);
	complete_write(c, h, p);
	assert_true(h->peer_hint[0] == MESH_PAIR_HINT_ON);
	/* Still asleep: off again, and this time the chunks pass within the second (it started a
	 * minute from now: this test's own pace must not matter): nothing said. */
	for (uint32_t i = 0; i < CH_PAIRS_IDLE_MAX; i++, seq++)
		peer_small(c, h, seq, seq * 64u, false);
	p = hint_post(c, h, from, 2);
	assert_non_null(p);
	assert_true(hint_value(p) == MESH_PAIR_HINT_OFF);
	complete_write(c, h, p);
	chn(c, h)->pairs_off_ms += 60000;
	for (uint32_t i = 0; i < CH_PAIRS_RETRY_CHUNKS + 10; i++, seq++)
		peer_small(c, h, seq, seq * 64u, false);
	assert_null(hint_post(c, h, from, 3));
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_true(ring_rx_prod(h) == (uint64_t)seq * 64u);
	mt_finish(&c->t);
}

/* A reader that polls and reads through the pairs keeps them: one chunk read so in
 * CH_PAIRS_IDLE_MAX starts the count again. */
static void channel_on_imm__reader_reads_through_pairs__no_hint(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	uint16_t seq = 0;
	size_t from;

	ct_init(c, 1);
	h = open_out_hinted(c, 1);
	from = c->t.fx->n_posts;
	for (int round = 0; round < 3; round++) {
		for (uint32_t i = 0; i < CH_PAIRS_IDLE_MAX - 1; i++, seq++)
			peer_small(c, h, seq, seq * 64u, false);
		peer_small(c, h, seq, seq * 64u, true);
		seq++;
	}
	assert_null(hint_post(c, h, from, 0));
	assert_true(chn(c, h)->pairs_wanted);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	mt_finish(&c->t);
}

/* The sending side: while the peer's meshd asks for no pairs (a whole hint in our hint words) the
 * data goes alone; a torn or foreign hint, or one asking for pairs, brings them back. */
static void channel_on_kick__peer_asked_for_no_pairs__data_alone_until_asked_again(void **state)
{
	struct ct *c = *state;
	struct fake_post *p;
	struct chan *h;
	size_t from;

	ct_init(c, 1);
	h = open_out_direct(c, 1);
	assert_non_null(h->our_hint);
	assert_ptr_equal(h->our_hint, chn(c, h)->credit + CH_HINT_IN);
	h->our_hint[0] = MESH_PAIR_HINT_OFF;
	h->our_hint[1] = mesh_ring_direct_check(MESH_PAIR_HINT_OFF);
	from = c->t.fx->n_posts;
	app_write(h, 100);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 1);
	complete_data(c, h, from);
	assert_null(direct_post(c, h, from, 0));
	assert_true(chn(c, h)->direct_writes == 0);
	/* Torn (its check does not match): not a hint, the pairs go. */
	h->our_hint[1] ^= 1;
	app_write(h, 50);
	app_kick(c, h);
	p = direct_post(c, h, from, 0);
	assert_non_null(p);
	assert_true(direct_pos(p) == 150);
	complete_data(c, h, from);
	complete_write(c, h, p);
	/* Off again, then asked for: */
	h->our_hint[1] ^= 1;
	app_write(h, 50);
	app_kick(c, h);
	complete_data(c, h, from);
	assert_null(direct_post(c, h, from, 1));
	h->our_hint[0] = MESH_PAIR_HINT_ON;
	h->our_hint[1] = mesh_ring_direct_check(MESH_PAIR_HINT_ON);
	app_write(h, 50);
	app_kick(c, h);
	p = direct_post(c, h, from, 1);
	assert_non_null(p);
	assert_true(direct_pos(p) == 250);
	complete_data(c, h, from);
	complete_write(c, h, p);
	check_peer_ring(h, 0, 250);
	mt_finish(&c->t);
}

/* The hint that asked for no pairs may have died with the link: after the resume it is written
 * again, to the hint words the peer's ChannelResume names. */
static void channel_link_down__pairs_unwanted__hint_written_again_after_the_resume(void **state)
{
	struct ct *c = *state;
	struct fake_post *p;
	struct chan *h;
	uint16_t seq = 0;
	size_t from;
	PeerMsg *m;

	ct_init_resume(c, 2);
	h = open_out_hinted(c, 2);
	from = c->t.fx->n_posts;
	for (; seq < CH_PAIRS_IDLE_MAX; seq++)
		peer_small(c, h, seq, seq * 64u, false);
	p = hint_post(c, h, from, 0);
	assert_non_null(p);
	assert_true(hint_value(p) == MESH_PAIR_HINT_OFF);
	from = c->t.fx->n_posts;
	link_lost(c);
	link_back(c, 5000);
	m = sent_resume(c, h, from);
	assert_true(m->channel_resume->hint_addr == (uintptr_t)h->our_hint);
	assert_int_not_equal(m->channel_resume->hint_rkey, 0);
	mesh_peer_msg_free(m);
	complete_sends(c);
	assert_null(hint_post(c, h, from, 0));
	peer_resume(c, h, 0, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	p = hint_post(c, h, from, 0);
	assert_non_null(p);
	assert_true(hint_value(p) == MESH_PAIR_HINT_OFF);
	mt_finish(&c->t);
}

/* ---- connects while the link's send slots are all in flight ------------------------------------ */

/* Connects from client fds 2000.. until one sends no ChannelOpen (every send slot of the link in
 * flight, none completed): returns that connect's result; *n_sent: how many Opens went. */
static int connect_until_no_slot(struct ct *c, size_t *n_sent, uint32_t *pending_slot)
{
	const char *why = NULL;

	for (int i = 0; i < 64; i++) {
		size_t from = c->t.fx->n_posts;
		int ret = channel_connect(&c->t.m, PEER, 5000, RING, 1, -1, -1, -1, 2000 + i, ROOT, &why);
		PeerMsg *m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_OPEN, 0);

		if (m) {
			mesh_peer_msg_free(m);
			continue;
		}
		*n_sent = (size_t)i;
		for (uint32_t s = 0; s < c->l->ch_cap; s++)
			if (c->l->ch_slots[s] && c->l->ch_slots[s]->reply_fd == 2000 + i)
				*pending_slot = s;
		return ret;
	}
	fail_msg("64 connects all sent their Open: the send slots never ran out");
	return -1;
}

static void channel_connect__send_slots_all_in_flight__open_waits_for_one(void **state)
{
	struct ct *c = *state;
	uint32_t slot = UINT32_MAX;
	struct channel *ch;
	size_t sent = 0, from;
	PeerMsg *m;

	ct_init(c, 2);
	/* The burst's last connect is not refused (-EAGAIN was the answer): it waits. */
	assert_int_equal(connect_until_no_slot(c, &sent, &slot), 0);
	assert_true(sent >= 8);
	assert_true(slot < c->l->ch_cap);
	ch = c->l->ch_slots[slot];
	assert_true(ch->open_pending);
	assert_string_equal(channel_state_name(ch), "OPENING");
	assert_int_equal(c->n_apps, 0);
	/* A forged answer for a channel the peer never heard of changes nothing. */
	{
		struct chan *fake = chan_new(c, RING, PEER_SLOT);

		fake->slot = slot;
		peer_accept(c, fake);
		assert_true(ch->open_pending);
		assert_int_equal(c->n_apps, 0);
		assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	}
	/* The peer takes the Opens: a slot frees, the pump on the tick sends the waiting one. */
	from = c->t.fx->n_posts;
	complete_sends(c);
	tick(&c->t);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_OPEN, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_open->slot, slot);
	mesh_peer_msg_free(m);
	assert_false(ch->open_pending);
	mt_finish(&c->t);
}

static void channel_connect__open_waiting_for_a_slot__client_gone_or_timeout_frees_it_unsent(void **state)
{
	struct ct *c = *state;
	uint32_t slot = UINT32_MAX, slot2 = UINT32_MAX;
	size_t sent = 0, from;
	int fd;

	ct_init(c, 2);
	assert_int_equal(connect_until_no_slot(c, &sent, &slot), 0);
	fd = c->l->ch_slots[slot]->reply_fd;
	/* The client gives up: the channel goes, and no Open for it ever leaves. */
	channel_client_gone(&c->t.m, fd);
	mesh_reap(&c->t.m);
	assert_null(c->l->ch_slots[slot]);
	/* Another waits past the handshake timeout: its client hears -ETIMEDOUT, nothing is sent. */
	assert_int_equal(channel_connect(&c->t.m, PEER, 5000, RING, 1, -1, -1, -1, 3000, ROOT, &(const char *){NULL}), 0);
	for (uint32_t s = 0; s < c->l->ch_cap; s++)
		if (c->l->ch_slots[s] && c->l->ch_slots[s]->reply_fd == 3000)
			slot2 = s;
	assert_true(slot2 < c->l->ch_cap);
	assert_true(c->l->ch_slots[slot2]->open_pending);
	from = c->t.fx->n_posts;
	tick_at(&c->t, c->l->ch_slots[slot2]->open_ms + c->t.cfg.handshake_timeout_ms + 1);
	mesh_reap(&c->t.m);
	assert_null(c->l->ch_slots[slot2]);
	{
		size_t k = 0;

		while (k < c->n_apps && c->apps[k].client_fd != 3000)
			k++;
		assert_true(k < c->n_apps); /* (the Opens that went time out too, and wait for answers) */
		assert_int_equal(c->apps[k].status, -ETIMEDOUT);
	}
	assert_null(sent_msg(c, from, PEER_MSG__BODY_CHANNEL_OPEN, 0));
	mt_finish(&c->t);
}

#define T(f) cmocka_unit_test_setup_teardown(f, ct_setup, ct_teardown)

static const struct CMUnitTest tests[] = {
	T(channel_connect__send_slots_all_in_flight__open_waits_for_one),
	T(channel_connect__open_waiting_for_a_slot__client_gone_or_timeout_frees_it_unsent),
	T(channel_on_kick__peer_has_direct_pair__pair_after_the_data_on_its_qp_one_at_a_time),
	T(channel_on_kick__direct_pair_refused__channel_kept_next_pair_later),
	T(channel_on_kick__striped_over_two_qps__pair_covers_only_what_is_ordered_or_done),
	T(channel_on_kick__app_read_past_rx_prod__accepted_up_to_a_valid_direct_pair),
	T(channel_on_kick__direct_pair_beyond_a_ring__not_taken),
	T(channel_on_kick__pair_torn_after_the_app_read_by_it__not_an_error),
	T(channel_on_imm__reader_sleeps_through_the_pairs__peer_asked_for_none_then_again),
	T(channel_on_imm__reader_reads_through_pairs__no_hint),
	T(channel_on_kick__peer_asked_for_no_pairs__data_alone_until_asked_again),
	T(channel_link_down__pairs_unwanted__hint_written_again_after_the_resume),
	T(channel_connect__direct_receive_off__no_key_for_the_page),
	T(channel_link_down__app_ahead_of_placed__resume_names_the_placed_position),
	T(channel_connect__up_link__open_carries_slot_ports_ring_and_keys),
	T(channel_connect__qps_and_ring_unset__link_qps_and_default_ring),
	T(channel_on_message__accept__open_and_delivered_with_four_fds),
	T(channel_find__ids_sharing_a_bucket__each_found_freed_one_gone),
	T(channel_on_message__reject__reason_delivered_and_everything_freed),
	T(channel_connect__unknown_node__eunknownnode),
	T(channel_connect__link_down__enetunreach),
	T(channel_connect__self_nobody_listens__refused_without_the_transport),
	T(channel_connect__self_listener__ring_to_ring_then_closed),
	T(channel_connect__registration_fails__refused_nothing_left),
	T(channel_tick__no_answer__etimedout_then_closed_after_late_accept),
	T(channel_tick__timeout_then_reject__freed_without_second_reply),
	T(channel_on_message__open_to_listener__delivered_and_accepted),
	T(channel_on_message__open_without_listener__rejected_econnrefused),
	T(channel_client_gone__listener__no_longer_accepts),
	T(channel_on_message__listener_cannot_take_it__rejected_and_freed),
	T(channel_listen__port_below_1024_not_root__eacces),
	T(channel_listen__port_held_by_another_user__eaddrinuse_naming_it),
	T(channel_connect__beyond_the_users_quota__edquot),
	T(channel_connect__half_of_the_descriptor_budget__edquot_others_still_open),
	T(channel_connect__half_of_the_links_share__edquot_others_still_open),
	T(channel_on_message__open_beyond_the_listeners_quota__rejected_edquot),
	T(channel_on_message__open_with_more_qps_than_link__rejected_einval),
	T(channel_on_message__open_beyond_the_peers_share__rejected_ebusy),
	T(channel_on_kick__app_wrote__chunks_striped_round_robin),
	T(channel_on_kick_fast__own_rail_pumps__shut_to_usual_way__other_rail_untouched),
	T(channel_on_kick__large_ring__chunks_of_chunk_max),
	T(channel_open__ring_under_four_chunks__chunk_of_a_quarter),
	T(channel_on_kick__peer_credit_exhausted__stops_exactly_at_credit),
	T(channel_on_completion__out_of_order__tx_cons_over_completed_prefix),
	T(channel_on_imm__credit_beyond_sent__channel_error_eproto),
	T(channel_on_imm__credit_going_back__channel_error_eproto),
	T(channel_on_imm__credit_slots__next_write_landing_is_not_read),
	T(channel_on_imm__chunks_out_of_order__rx_prod_when_contiguous),
	T(channel_on_imm__duplicate_pending_seq__channel_error_eproto),
	T(channel_on_imm__duplicate_delivered_seq__channel_error_eproto),
	T(channel_on_imm__seq_outside_window__channel_error_eproto),
	T(channel_on_imm__one_qp_lags_past_the_senders_window__kept_in_order),
	T(channel_on_message__close_overtakes_data__slot_kept_until_counted_chunks_land),
	T(channel_on_message__close_ack_overtakes_credit__freed_once_it_lands),
	T(channel_on_imm__more_than_close_counted__channel_error_eproto),
	T(channel_link_down__open_channel__resumes_and_rewrites_what_was_not_placed),
	T(channel_link_down__next_attempt__reaches_nothing_until_up),
	T(channel_rail_down__opener__moves_to_other_rail_and_rewrites_what_was_not_placed),
	T(channel_rail_down__acceptor__follows_the_openers_rail),
	T(channel_rail_down__during_a_resume__resumes_again_on_the_new_rail),
	T(channel_rail_down__close_under_way__freed_on_the_ack),
	T(channel_link_up__peer_restarted__epeerrestart_at_once),
	T(channel_store__open_channel__kept_with_its_record_dropped_when_freed),
	T(channel_store_restore__kept_channel__resumes_where_its_ring_stands),
	T(channel_store_restore__bad_entries__each_fails_alone_the_good_one_restored),
	T(channel_link_up__peer_restarted_with_channels_kept__resumes),
	T(channel_tick__down_past_resume_timeout__eresumetimeo),
	T(channel_on_message__resume_beyond_sent__eproto_others_resume),
	T(channel_on_message__resume_unknown_slot__refused_with_close),
	T(channel_link_down__during_resume__resumes_on_next_up),
	T(channel_on_lifeline__while_resuming__bytes_eof_close_after_resume),
	T(channel_link_down__goodbye__econnreset_at_once),
	T(channel_on_message__close_while_resuming__acked_and_freed),
	T(channel_on_message__credit_overtakes_resume__positions_never_go_back),
	cmocka_unit_test(channel_rx_window__every_qp_count__covers_lag_and_below_half_seq_space),
	T(channel_on_imm__zero_length__channel_error_eproto),
	T(channel_on_imm__longer_than_ring__channel_error_eproto),
	T(channel_on_imm__beyond_reader_credit__channel_error_eproto),
	T(channel_on_imm__beyond_reader_credit__rx_prod_stays_in_window),
	T(channel_on_kick__stream_quarter_consumed__one_credit_then_next_after_completion),
	T(channel_on_kick__sender_with_room__credit_per_half_ring),
	T(channel_on_kick__caught_up_below_a_quarter__no_credit),
	T(channel_poll__published_without_kick__posted_and_counted),
	T(channel_poll__reads_below_a_credit_step__not_a_move),
	T(mesh_fast_event__open_channel_stream__taken_as_the_usual_way_would),
	T(mesh_fast_event__control_shutdown_or_failure__left_to_the_usual_way),
	T(channel_set_polling__on_and_off__every_ring_flag_and_new_channels),
	T(channel_on_kick__tx_prod_beyond_ring__error_others_unaffected),
	T(channel_on_kick__tx_prod_going_back__error_eproto),
	T(channel_on_kick__rx_cons_beyond_rx_prod__error_eproto),
	T(channel_on_kick__shut_wr__eof_once_all_bytes_posted),
	T(channel_on_message__peer_eof__flag_once_all_bytes_arrived),
	T(channel_on_message__eof_below_received__channel_error_eproto),
	T(channel_on_imm__data_after_eof__channel_error_eproto),
	T(channel_on_lifeline__after_shut_wr__close_0_when_idle_freed_on_ack),
	T(channel_on_lifeline__without_shut_wr__close_econnreset),
	T(channel_on_message__peer_close__ack_once_our_writes_completed),
	T(channel_goodbye__peer_removed_us__eremoved_to_the_app_no_resume),
	T(channel_post_data__qp_refuses_resuming_off__econnreset_to_the_app),
	T(channel_post_data__qp_refuses__channel_resumes_after_the_links_event),
	T(channel_tick__qp_refused_and_link_stays_up__econnreset_naming_it),
	T(channel_link_down__open_channel__econnreset_freed_when_app_closes),
	T(channel_app_send__offer_relayed_and_granted__meshd_posts_none_and_takes_credits),
	T(channel_app_send__granted__tx_space_ends_at_the_readers_credit),
	T(channel_app_send__published_before_the_grant_was_taken__meshd_withdraws_and_posts_them),
	T(channel_app_send__idle_before_taking_the_grant__withdrawn_no_hand_back),
	T(channel_app_send__application_without_take__granted_at_once),
	T(channel_app_send__application_writes_over_the_grant__channel_broken_eproto),
	T(channel_poll__granted_applications_writes__not_a_move),
	T(channel_app_send__hostile_qp_words__channel_broken_eproto),
	T(channel_app_send__peer_sends_from_an_unfit_position__channel_broken),
	T(channel_app_send__hand_back__peer_says_placed_meshd_posts_from_there),
	T(channel_app_send__hand_back_then_link_lost__resume_rewinds_meshd_posts_the_rest),
	T(channel_app_send__peer_application_writes__rx_follows_its_pair_within_the_credit),
	T(channel_app_send__resume_revoked_the_qp__new_round_offered_and_granted_again),
	T(channel_app_send__resume_before_the_grant__application_stopped_and_offered_anew),
	T(channel_app_send__peer_renews_after_a_hand_back__its_writes_followed_again),
	T(channel_app_send__second_resume_before_the_application_answered__next_round_offered),
	T(channel_app_send__resume_before_the_first_offer__application_offered_anew),
	T(channel_app_send__offer_not_taken__no_new_round_after_a_resume),
	T(channel_app_send__peer_writes_by_immediate__rx_follows_the_applications_rx_seen),
	T(channel_app_send__provider_without_paths__nothing_offered),
	T(channel_app_send__tcp_path__port_and_token_relayed_and_granted),
	T(channel_app_send__tcp_path_peer_without_the_feature__nothing_offered),
	T(channel_app_send__tcp_offer_without_port_or_token__channel_broken_eproto),
	T(channel_link_down__opening_channel__client_told_econnreset),
	T(channel_on_imm__data_before_accept__kept_until_accept),
	T(channel_on_lifeline__send_buffers_busy__close_sent_once_one_frees),
	T(channel_on_kick__send_buffers_busy__eof_sent_once_one_frees),
	T(channel_on_kick__write_after_peer_close__application_told),
};

static int group_setup(void **state)
{
	(void)state;
	/* Every message is formatted: a bad format argument shows under valgrind/ASan. */
	log_set_level(getenv("MESH_TEST_QUIET") ? LOG_LVL_ERROR : LOG_LVL_DEBUG);
	return 0;
}

UNIT_MAIN("channel", tests, group_setup, NULL)
