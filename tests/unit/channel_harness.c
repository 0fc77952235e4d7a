/* The fixture of the channel unit tests: see channel_harness.h. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "channel_harness.h"
#include "log.h"
#include "util.h"

static const uint16_t ids123[] = {1, 2, 3};

/* ---- the application's side: channel_ops ------------------------------------------------------ */

int app_deliver(void *ctx, int fd, int status, const char *why, const struct channel *ch, const int fds[4])
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

void app_watch(void *ctx, struct channel *ch, bool add)
{
	struct ct *c = ctx;

	assert_true(ch->id < MAX_IDS);
	if (add)
		c->watch_add[ch->id]++;
	else
		c->watch_del[ch->id]++;
}

void app_moved(void *ctx, struct channel *ch, uint32_t from)
{
	struct ct *c = ctx;

	assert_true(ch->id < MAX_IDS);
	assert_int_not_equal(ch->rail, from);
	c->moved[ch->id]++;
	c->moved_from[ch->id] = from;
}

void app_map(struct app *a)
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

void app_close(struct app *a)
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

uint8_t pat(uint64_t pos, uint8_t salt)
{
	return (uint8_t)(pos * 7u + (pos >> 8) + salt);
}

void app_write(struct chan *h, uint32_t n)
{
	struct app *a = h->app;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t p = a->tx_prod + i;

		a->tx[p & (a->ring_size - 1)] = pat(p, SALT_OUT);
	}
	a->tx_prod += n;
	atomic_store_explicit(&a->ctrl->tx_prod, a->tx_prod, memory_order_release);
}

void app_read(struct chan *h, uint64_t n)
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

void app_shut_wr(struct chan *h)
{
	atomic_fetch_or_explicit(&h->app->ctrl->app_flags, MESH_APP_SHUT_WR, memory_order_release);
}

void loop_kick(struct mesh *m, uint32_t id)
{
	struct channel *ch = channel_find(m, id);

	if (!ch)
		return;
	channel_on_kick_fast(m, id, ch->rail);
	channel_pump_wanted(m, ch->rail);
}

void app_kick(struct ct *c, struct chan *h)
{
	uint64_t one = 1;

	assert_int_equal(write(h->app->fds[FD_KICK], &one, sizeof(one)), (ssize_t)sizeof(one));
	loop_kick(&c->t.m, h->id);
	mesh_reap(&c->t.m);
}

void app_hangup(struct ct *c, struct chan *h)
{
	assert_true(h->app->fds[FD_LIFELINE] >= 0);
	close(h->app->fds[FD_LIFELINE]);
	h->app->fds[FD_LIFELINE] = -1;
	channel_on_lifeline(&c->t.m, h->id);
	mesh_reap(&c->t.m);
}

uint32_t ring_state(const struct chan *h)
{
	return atomic_load_explicit(&h->app->ctrl->state, memory_order_acquire);
}

int32_t ring_error(const struct chan *h)
{
	return atomic_load_explicit(&h->app->ctrl->error, memory_order_acquire);
}

uint64_t ring_tx_cons(const struct chan *h)
{
	return atomic_load_explicit(&h->app->ctrl->tx_cons, memory_order_acquire);
}

uint64_t ring_rx_prod(const struct chan *h)
{
	return atomic_load_explicit(&h->app->ctrl->rx_prod, memory_order_acquire);
}

/* ---- fixture -------------------------------------------------------------------------------- */

int ct_setup(void **state)
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

int ct_teardown(void **state)
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

void complete_sends(struct ct *c)
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

void ct_init_dialled(struct ct *c, uint32_t qps)
{
	struct mt *t = &c->t;

	t->qps = qps;
	mt_init(t, SELF, ids123, 3);
	/* No keepalive timeout inside a test, however slow (valgrind): ticks serve channel timeouts. */
	t->cfg.keepalive_interval_ms = 3600u * 1000u;
	t->cfg.keepalive_timeout_ms = 7200u * 1000u;
	t->m.chans->ch_ops =
		(struct channel_ops){.deliver = app_deliver, .watch = app_watch, .moved = app_moved, .ctx = c};
	tick(t);
	c->l = lk(t, PEER);
}

void ct_init(struct ct *c, uint32_t qps)
{
	struct mt *t = &c->t;

	ct_init_dialled(c, qps);
	drive_to_up(t, c->l);
	complete_sends(c);
	assert_int_equal(t->fx->live_mrs, 1 + (int)t->m.n_rails); /* the link's own (buffers again per rail) */
}

struct channel *chn(struct ct *c, const struct chan *h)
{
	struct channel *ch = channel_find(&c->t.m, h->id);

	if (!ch)
		fail_msg("channel %u no longer exists", h->id);
	return ch;
}

struct channel *link_channel_of(struct ct *c, uint32_t slot)
{
	return slot < c->l->ch_cap ? c->l->ch_slots[slot] : NULL;
}

struct chan *chan_new(struct ct *c, uint64_t size, uint32_t peer_slot)
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

PeerMsg *sent_msg(struct ct *c, size_t from, PeerMsg__BodyCase body, size_t nth)
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

size_t sent_count(struct ct *c, size_t from, PeerMsg__BodyCase body)
{
	size_t n = 0;
	PeerMsg *m;

	while ((m = sent_msg(c, from, body, n))) {
		mesh_peer_msg_free(m);
		n++;
	}
	return n;
}

int sent_close_reason(struct ct *c, const struct chan *h, size_t from)
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

int sent_reject_reason(struct ct *c, size_t from)
{
	PeerMsg *m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_REJECT, 0);
	int reason;

	if (!m)
		fail_msg("no ChannelReject was sent");
	reason = m->channel_reject->reason;
	mesh_peer_msg_free(m);
	return reason;
}

bool is_credit(const struct fake_post *p)
{
	return (p->imm & MESH_IMM_CREDIT) != 0;
}

struct fake_post *write_post(struct ct *c, const struct chan *h, size_t from, bool credit, size_t nth)
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

size_t write_count(struct ct *c, const struct chan *h, size_t from, bool credit)
{
	size_t n = 0;

	while (write_post(c, h, from, credit, n))
		n++;
	return n;
}

void complete_write(struct ct *c, struct chan *h, struct fake_post *p)
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

void complete_data(struct ct *c, struct chan *h, size_t from)
{
	struct fake_post *p;

	for (size_t i = 0; (p = write_post(c, h, from, false, i)); i++)
		if (!p->used)
			complete_write(c, h, p);
}

/* ---- what the peer sends ---------------------------------------------------------------------- */

void peer_msg(struct ct *c, PeerMsg *m)
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

void peer_imm(struct ct *c, uint32_t qp, uint32_t imm, uint32_t len)
{
	struct fake_post *r = take_recv(&c->t, c->l, qp);
	struct xport_event ev = wc_event(c->l->conns[qp], XPORT_OP_RECV_IMM, r->wr_id, len);

	if (MESH_IMM_SLOT(imm) < MAX_IDS)
		c->peer_imms[MESH_IMM_SLOT(imm)][(imm & MESH_IMM_CREDIT) != 0]++;
	ev.imm = imm;
	ev.has_imm = true;
	deliver(&c->t, &ev);
}

void peer_data(struct ct *c, const struct chan *h, uint32_t qp, uint16_t seq, uint64_t pos, uint32_t len)
{
	uint64_t off = pos & (h->size - 1);

	assert_true(off + len <= h->size);
	for (uint32_t i = 0; i < len; i++)
		h->our_rx[off + i] = pat(pos + i, SALT_IN);
	peer_imm(c, qp, MESH_IMM(0, h->slot, seq), len);
}

void peer_credit_placed(struct ct *c, const struct chan *h, uint64_t cons, uint64_t placed)
{
	struct channel *ch = channel_find(&c->t.m, h->id);
	uint16_t n = ch ? (uint16_t)ch->imm_credits_seen : 0;
	uint64_t *slot = h->our_credit + 2 * (n % MESH_CREDIT_SLOTS);

	__atomic_store_n(&slot[0], cons, __ATOMIC_RELEASE);
	__atomic_store_n(&slot[1], placed, __ATOMIC_RELEASE);
	peer_imm(c, 0, MESH_IMM(1, h->slot, n), MESH_CREDIT_LEN);
}

void peer_credit(struct ct *c, const struct chan *h, uint64_t cons)
{
	struct channel *ch = channel_find(&c->t.m, h->id);

	peer_credit_placed(c, h, cons, MAX(cons, ch ? ch->peer_placed : 0));
}

void peer_open(struct ct *c, const struct chan *h, uint16_t src_port, uint16_t dst_port, uint32_t qps)
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

void peer_accept(struct ct *c, const struct chan *h)
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

void peer_reject(struct ct *c, uint32_t slot, int reason)
{
	PeerMsg m = PEER_MSG__INIT;
	ChannelReject r = CHANNEL_REJECT__INIT;

	r.slot = slot;
	r.reason = reason;
	m.body_case = PEER_MSG__BODY_CHANNEL_REJECT;
	m.channel_reject = &r;
	peer_msg(c, &m);
}

void peer_eof(struct ct *c, const struct chan *h, uint64_t total)
{
	PeerMsg m = PEER_MSG__INIT;
	ChannelEof e = CHANNEL_EOF__INIT;

	e.slot = h->slot;
	e.total = total;
	m.body_case = PEER_MSG__BODY_CHANNEL_EOF;
	m.channel_eof = &e;
	peer_msg(c, &m);
}

void peer_close_n(struct ct *c, const struct chan *h, int reason, uint64_t chunks, uint64_t credits)
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

void peer_close(struct ct *c, const struct chan *h, int reason)
{
	assert_true(h->slot < MAX_IDS);
	peer_close_n(c, h, reason, c->peer_imms[h->slot][0], c->peer_imms[h->slot][1]);
}

void peer_close_ack(struct ct *c, const struct chan *h)
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

void peer_keepalive(struct ct *c, uint64_t seq)
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

struct chan *connect_out(struct ct *c, uint16_t port, uint64_t size, uint32_t qps, uint32_t peer_slot)
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

void accept_out(struct ct *c, struct chan *h)
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

struct chan *open_out(struct ct *c, uint64_t size, uint32_t qps, uint32_t peer_slot)
{
	struct chan *h = connect_out(c, 5000, size, qps, peer_slot);

	accept_out(c, h);
	return h;
}

struct chan *open_in(struct ct *c, uint16_t src_port, uint16_t dst_port, uint64_t size, uint32_t qps,
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

struct ch_regs find_regs(struct ct *c, uint64_t size)
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

void expect_broken(struct ct *c, struct chan *h, int err)
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

/* ---- what we wrote, checked ---------------------------------------------------------------------- */

uint64_t check_data_posts(struct ct *c, struct chan *h, size_t from, uint32_t q0, uint16_t seq0, uint64_t pos0,
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

void check_peer_ring(const struct chan *h, uint64_t lo, uint64_t hi)
{
	for (uint64_t p = lo; p < hi; p++)
		if (h->peer_rx[p & (h->size - 1)] != pat(p, SALT_OUT))
			fail_msg("the peer's ring has 0x%02x for stream byte %llu, we wrote 0x%02x",
				 h->peer_rx[p & (h->size - 1)], (unsigned long long)p, pat(p, SALT_OUT));
}

/* ---- resuming across a lost link (cluster.resume_timeout_ms) ----------------------------------- */

void link_lost(struct ct *c)
{
	/* With several rails, QP 1 of every rail, the last rail first: a link stays UP on any rail. */
	for (uint32_t r = c->t.m.n_rails; r-- > 0 && link_state(c->l) == LINK_STATE_UP_;) {
		struct xport_event ev = cm_event(XPORT_EV_DISCONNECTED, c->l->conns[r * c->t.cfg.qps_per_link + 1], NULL, 0);

		ev.status = -ECONNRESET;
		deliver(&c->t, &ev);
	}
	assert_int_equal(link_state(c->l), LINK_STATE_DOWN_);
}

void link_back(struct ct *c, uint64_t after_ms)
{
	tick_at(&c->t, util_now_ms() + after_ms);
	assert_int_equal(c->l->phase, LINK_QPS);
	drive_to_up(&c->t, c->l);
}

const struct fake_reg *reg_of_rkey(const struct ct *c, uint32_t rkey)
{
	for (size_t i = 0; i < c->t.fx->n_regs; i++)
		if (c->t.fx->regs[i].rkey == rkey)
			return &c->t.fx->regs[i];
	fail_msg("no registration has rkey 0x%x", rkey);
	return NULL;
}

PeerMsg *sent_resume(struct ct *c, const struct chan *h, size_t from)
{
	PeerMsg *m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_RESUME, 0);

	if (!m)
		fail_msg("no ChannelResume was sent");
	assert_int_equal(m->channel_resume->slot, h->peer_slot);
	assert_int_equal(m->channel_resume->peer_slot, h->slot);
	return m;
}

void peer_resume_on(struct ct *c, const struct chan *h, uint64_t rx_bytes, uint16_t rx_seq, uint64_t rx_cons,
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

void peer_resume(struct ct *c, const struct chan *h, uint64_t rx_bytes, uint16_t rx_seq, uint64_t rx_cons,
		 bool eof_known)
{
	struct channel *ch = channel_find(&c->t.m, h->id);

	peer_resume_on(c, h, rx_bytes, rx_seq, rx_cons, eof_known, ch ? ch->rail : 0);
}

void ct_init_resume(struct ct *c, uint32_t qps)
{
	ct_init(c, qps);
	c->t.cfg.resume_timeout_ms = RESUME_MS;
}

int ct_group_setup(void **state)
{
	(void)state;
	/* Every message is formatted: a bad format argument shows under valgrind/ASan. */
	log_set_level(getenv("MESH_TEST_QUIET") ? LOG_LVL_ERROR : LOG_LVL_DEBUG);
	return 0;
}
