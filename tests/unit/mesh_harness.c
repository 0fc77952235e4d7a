/* Driving a mesh over the fake transport: see mesh_harness.h. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "channel.h"
#include "mesh_harness.h"
#include "util.h"

/* ---- fixture -------------------------------------------------------------------------------- */

void mt_open(struct mt *t)
{
	t->fx = fake_xport_new();
}

void mt_close(struct mt *t)
{
	/* Only reached with the mesh still set up when a test failed half-way. */
	if (t->inited)
		mesh_cleanup(&t->m);
	t->inited = false;
	fake_xport_free(t->fx);
	t->fx = NULL;
	if (t->fx1)
		fake_xport_free(t->fx1);
	t->fx1 = NULL;
}

int mt_setup(void **state)
{
	/* aligned_alloc: struct mt carries 64-byte-aligned members. */
	struct mt *t = aligned_alloc(64, (sizeof(*t) + 63) & ~(size_t)63);

	if (!t)
		return -1;
	memset(t, 0, sizeof(*t));
	mt_open(t);
	*state = t;
	return 0;
}

int mt_teardown(void **state)
{
	struct mt *t = *state;

	mt_close(t);
	free(t);
	return 0;
}

/* A cluster "test" of the given ids (ascending), node i at 10.0.0.i:7471; we are self_id. */
void mt_init(struct mt *t, uint16_t self_id, const uint16_t *ids, size_t n)
{
	const struct config_node *self = NULL;
	struct mesh_config *c = &t->cfg;

	assert_true(n <= sizeof(t->nodes) / sizeof(t->nodes[0]));
	snprintf(c->path, sizeof(c->path), "test.conf");
	snprintf(c->cluster_name, sizeof(c->cluster_name), "test");
	snprintf(c->transport, sizeof(c->transport), "fake");
	snprintf(c->log_level, sizeof(c->log_level), "debug");
	c->qps_per_link = t->qps ? t->qps : MT_QPS;
	c->keepalive_interval_ms = 100;
	c->keepalive_timeout_ms = 500;
	c->connect_timeout_ms = 200;
	c->handshake_timeout_ms = 2000;
	/* Long enough that "not re-dialled at once" holds even under valgrind (first delay >= 500). */
	c->backoff_initial_ms = 1000;
	c->backoff_max_ms = 4000;
	c->max_handshakes = 8;
	c->mailbox_size = 4096;
	c->max_channels_per_link = MESH_CHANNEL_SLOTS;
	c->max_ring_mib_per_link = 1u << 20;
	c->max_channels_per_uid = 1u << 20;
	c->max_ring_bytes_per_uid = 1ull << 50;
	snprintf(c->polling, sizeof(c->polling), "event");
	c->app_spin_us = 77; /* an odd value a test can recognise in the ring */
	snprintf(c->direct_receive, sizeof(c->direct_receive), "on");
	snprintf(c->numa, sizeof(c->numa), "auto");
	c->numa_mode = CONFIG_NUMA_AUTO;
	for (size_t i = 0; i < n; i++) {
		t->nodes[i].id = ids[i];
		t->nodes[i].port = 7471;
		snprintf(t->nodes[i].addr, sizeof(t->nodes[i].addr), "10.0.0.%u", ids[i]);
		t->nodes[i].n_rails = (uint8_t)(t->rails ? t->rails : 1);
		for (uint32_t r = 0; r < t->nodes[i].n_rails; r++)
			snprintf(t->nodes[i].rail[r], sizeof(t->nodes[i].rail[r]), "10.%u.0.%u", r, ids[i]);
		t->nodes[i].line = (int)i + 10;
		if (i)
			assert_true(ids[i] > ids[i - 1]);
		if (ids[i] == self_id)
			self = &t->nodes[i];
	}
	c->nodes = t->nodes;
	c->n_nodes = n;
	c->nodes_line = 9;
	assert_non_null(self);
	{
		xport_t *o = t->fx1 ? &t->fx1->base : &t->fx->base;
		xport_t *x[MESH_RAILS_MAX] = {&t->fx->base, o, o, o};

		assert_int_equal(mesh_init(&t->m, c, self, x, t->two_providers ? 2 : self->n_rails), 0);
		assert_int_equal(channel_layer_init(&t->m), 0);
	}
	t->inited = true;
	assert_int_equal(t->m.n_links, n - 1);
}

/* mesh_cleanup, then nothing of the transport may be left. */
void mt_finish(struct mt *t)
{
	mesh_cleanup(&t->m);
	t->inited = false;
	mesh_cleanup(&t->m); /* twice is harmless */
	assert_int_equal(t->fx->live_conns, 0);
	assert_int_equal(t->fx->live_mrs, 0);
	assert_int_equal(t->fx->n_deregs, t->fx->n_regs);
	if (t->fx1) {
		assert_int_equal(t->fx1->live_conns, 0);
		assert_int_equal(t->fx1->live_mrs, 0);
	}
}

struct link *lk(struct mt *t, uint32_t peer)
{
	struct link *l = mesh_link_find(&t->m, peer);

	assert_non_null(l);
	assert_int_equal(l->peer->id, peer);
	return l;
}

unsigned conn_id(xport_conn_t *c)
{
	assert_non_null(c);
	return ((struct fake_conn *)c)->id;
}

/* ---- driving -------------------------------------------------------------------------------- */

void tick_at(struct mt *t, uint64_t now)
{
	mesh_tick(&t->m, now);
	mesh_reap(&t->m);
}

void tick(struct mt *t)
{
	tick_at(t, util_now_ms());
}

/* As meshd's drain loop: poll the transport, hand every event to the mesh (its fast path first
 * with t->fast), then reap. */
void deliver(struct mt *t, const struct xport_event *ev)
{
	struct xport_event evs[4];
	int n;

	fake_xport_push(t->fx, ev);
	n = xport_poll(&t->fx->base, evs, 4);
	assert_int_equal(n, 1);
	for (int i = 0; i < n; i++) {
		if (t->fast && mesh_fast_event(&t->m, 0, &evs[i]))
			t->fast_taken++;
		else
			mesh_handle_event(&t->m, &evs[i]);
	}
	mesh_reap(&t->m);
}

struct xport_event cm_event(enum xport_ev_type type, xport_conn_t *c, const void *pdata, size_t len)
{
	struct xport_event ev;

	memset(&ev, 0, sizeof(ev));
	ev.type = type;
	ev.conn = c;
	assert_true(len <= sizeof(ev.pdata));
	if (len)
		memcpy(ev.pdata, pdata, len);
	ev.pdata_len = (uint8_t)len;
	return ev;
}

struct xport_event wc_event(xport_conn_t *c, enum xport_op op, uint64_t wr_id, uint32_t byte_len)
{
	struct xport_event ev;

	memset(&ev, 0, sizeof(ev));
	ev.type = XPORT_EV_COMPLETION;
	ev.conn = c;
	ev.op = op;
	ev.wr_id = wr_id;
	ev.byte_len = byte_len;
	return ev;
}

struct mesh_cm_pdata decode_pdata(const uint8_t *pdata, size_t len)
{
	struct mesh_cm_pdata pd;

	assert_int_equal(mesh_cm_pdata_decode(pdata, len, &pd), 0);
	return pd;
}

/* The acceptor's answer to QP i of the link's current attempt. */
void establish_qp(struct mt *t, struct link *l, uint32_t i)
{
	struct mesh_cm_pdata pd = {
		.kind = MESH_CM_ACCEPT,
		.qp_index = (uint8_t)(i % t->cfg.qps_per_link),
		.qp_count = (uint8_t)t->cfg.qps_per_link,
		.rail = (uint8_t)(i / t->cfg.qps_per_link),
		.rail_count = (uint8_t)t->m.n_rails,
		.cluster_hash = mesh_cluster_hash(t->cfg.cluster_name),
		.src_node = l->peer->id,
		.dst_node = t->m.self->id,
		.link_epoch = l->epoch,
		.boot_epoch = t->peer_boot ? t->peer_boot : 4242,
	};
	uint8_t buf[XPORT_PDATA_MAX];
	int len;
	struct xport_event ev;

	if (l->dialer && i == 0)
		peer_accept_auth(t, l, i, 0, 0, &pd);
	len = mesh_cm_pdata_encode(&pd, buf, sizeof(buf));
	assert_true(len > 0);
	ev = cm_event(XPORT_EV_ESTABLISHED, l->conns[i], l->dialer ? buf : NULL, l->dialer ? (size_t)len : 0);
	deliver(t, &ev);
}

/* The last SEND posted on conn_id (since post index `from`), decoded. */
PeerMsg *last_send(struct mt *t, size_t from, unsigned cid)
{
	size_t n = fake_post_count(t->fx, from, XPORT_OP_SEND, cid);
	struct fake_post *p;
	PeerMsg *m = NULL;
	const char *why;

	assert_true(n > 0);
	p = fake_post_find(t->fx, from, XPORT_OP_SEND, cid, n - 1);
	assert_non_null(p);
	assert_int_equal(mesh_peer_msg_decode(p->sent, p->len, &m, &why), 0);
	return m;
}

struct fake_post *take_recv(struct mt *t, struct link *l, uint32_t qp)
{
	unsigned cid = conn_id(l->conns[qp]);
	struct fake_xport *fx = ((struct fake_conn *)l->conns[qp])->fx; /* t->fx or t->fx1 */
	struct fake_post *p = NULL;

	(void)t;
	/* One pass (finding the nth receive each time made a test of 2000 immediates take seconds). */
	for (size_t i = 0; i < fx->n_posts && !p; i++)
		if (fx->posts[i].op == XPORT_OP_RECV && fx->posts[i].conn_id == cid && !fx->posts[i].used)
			p = &fx->posts[i];
	assert_non_null(p);
	p->used = true;
	return p;
}

/* The peer sends msg: it lands in the oldest unused receive posted on QP 0. */
void peer_send_on(struct mt *t, struct link *l, uint32_t qp, const PeerMsg *msg)
{
	struct fake_post *p = take_recv(t, l, qp);
	struct xport_event ev;
	int len;

	len = mesh_peer_msg_encode(msg, p->buf, p->len);
	assert_true(len >= 0);
	ev = wc_event(l->conns[qp], XPORT_OP_RECV, p->wr_id, (uint32_t)len);
	deliver(t, &ev);
}

void peer_send(struct mt *t, struct link *l, const PeerMsg *msg)
{
	peer_send_on(t, l, 0, msg);
}

/* The Hello a well-behaved peer sends for the link's current attempt. */
Hello peer_hello(struct mt *t, struct link *l)
{
	Hello h = HELLO__INIT;

	h.node_id = l->peer->id;
	h.cluster_hash = mesh_cluster_hash(t->cfg.cluster_name);
	h.boot_epoch = t->peer_boot ? t->peer_boot : 4242;
	h.predecessor_epoch = t->peer_pred;
	h.link_epoch = l->epoch;
	h.features = MESH_FEAT_ALL & ~t->peer_feat_off;
	h.qp_count = t->cfg.qps_per_link;
	h.mailbox_addr = (uintptr_t)t->peer_mb;
	h.mailbox_len = PEER_MB_LEN;
	h.mailbox_rkey = PEER_RKEY;
	return h;
}

void peer_send_hello(struct mt *t, struct link *l, Hello *h)
{
	PeerMsg m = PEER_MSG__INIT;

	m.body_case = PEER_MSG__BODY_HELLO;
	m.hello = h;
	peer_send(t, l, &m);
}

void peer_send_ready(struct mt *t, struct link *l, uint64_t epoch)
{
	PeerMsg m = PEER_MSG__INIT;
	Ready r = READY__INIT;

	r.link_epoch = epoch;
	m.body_case = PEER_MSG__BODY_READY;
	m.ready = &r;
	peer_send(t, l, &m);
}

/* Checks the WRITE+READ pair of every QP (posted since `from`) and plays the remote side: the WRITE
 * stores into the peer mailbox, the READ returns what is there. With corrupt_qp >= 0 that QP's
 * READ returns other bytes, and the walk stops there (the link is gone). */
void run_proof(struct mt *t, struct link *l, size_t from, int corrupt_qp)
{
	for (uint32_t i = 0; i < t->cfg.qps_per_link; i++) {
		unsigned cid = conn_id(l->conns[i]);
		xport_conn_t *c = l->conns[i];
		struct fake_post *w = fake_post_find(t->fx, from, XPORT_OP_WRITE, cid, 0);
		struct fake_post *r = fake_post_find(t->fx, from, XPORT_OP_READ, cid, 0);
		uint8_t *slot = t->peer_mb + i * MESH_PROOF_LEN;
		struct xport_event ev;

		assert_non_null(w);
		assert_non_null(r);
		assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_WRITE, cid), 1);
		assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_READ, cid), 1);
		assert_true(w->raddr == (uintptr_t)slot);
		assert_true(r->raddr == (uintptr_t)slot);
		assert_int_equal(w->rkey, PEER_RKEY);
		assert_int_equal(r->rkey, PEER_RKEY);
		assert_int_equal(w->len, MESH_PROOF_LEN);
		assert_int_equal(r->len, MESH_PROOF_LEN);
		assert_ptr_not_equal(w->buf, r->buf);
		/* The token is bound to the sender: its first two bytes are our node id. */
		assert_int_equal(((uint8_t *)w->buf)[0], (uint8_t)(t->m.self->id >> 8));
		assert_int_equal(((uint8_t *)w->buf)[1], (uint8_t)t->m.self->id);

		memcpy(slot, w->buf, MESH_PROOF_LEN);
		ev = wc_event(c, XPORT_OP_WRITE, w->wr_id, 0);
		deliver(t, &ev);
		memcpy(r->buf, slot, MESH_PROOF_LEN);
		if ((int)i == corrupt_qp)
			((uint8_t *)r->buf)[MESH_PROOF_LEN - 1] ^= 0x01;
		ev = wc_event(c, XPORT_OP_READ, r->wr_id, MESH_PROOF_LEN);
		deliver(t, &ev);
		if ((int)i == corrupt_qp)
			return;
	}
}

/* Our Hello, posted on QP 0 since `from` once every QP of the attempt is established. */
void check_our_hello(struct mt *t, struct link *l, size_t from)
{
	const struct fake_reg *mb = fake_reg_find(t->fx, ACCESS_MAILBOX);
	PeerMsg *m = last_send(t, from, conn_id(l->conns[0]));

	assert_non_null(mb);
	assert_int_equal(m->body_case, PEER_MSG__BODY_HELLO);
	assert_int_equal(m->hello->node_id, t->m.self->id);
	assert_int_equal(m->hello->cluster_hash, mesh_cluster_hash("test"));
	assert_true(m->hello->boot_epoch == t->m.boot_epoch);
	assert_true(m->hello->link_epoch == l->epoch);
	assert_true(m->hello->features == MESH_FEAT_ALL);
	assert_int_equal(m->hello->qp_count, t->cfg.qps_per_link);
	assert_true(m->hello->mailbox_addr == (uintptr_t)mb->addr);
	assert_true(m->hello->mailbox_addr == (uintptr_t)l->mailbox);
	assert_int_equal(m->hello->mailbox_len, t->cfg.mailbox_size);
	assert_true(mb->len >= t->cfg.mailbox_size);
	assert_int_equal(m->hello->mailbox_rkey, mb->rkey);
	mesh_peer_msg_free(m);
	/* Only QP 0 carries messages. */
	for (uint32_t i = 1; i < t->cfg.qps_per_link; i++)
		assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_SEND, conn_id(l->conns[i])), 0);
}

/* From "every QP connecting" to UP: establish, exchange Hellos, prove, exchange Ready. */
/* The nth SEND on conn cid since from (any instance), decoded, or NULL. */
static PeerMsg *nth_send(struct mt *t, size_t from, unsigned cid, size_t nth)
{
	struct fake_post *p = fake_post_find(t->fx, from, XPORT_OP_SEND, cid, nth);
	PeerMsg *m = NULL;
	const char *why;

	if (!p && t->fx1)
		p = fake_post_find(t->fx1, from, XPORT_OP_SEND, cid, nth);
	if (!p)
		return NULL;
	assert_int_equal(mesh_peer_msg_decode(p->sent, p->len, &m, &why), 0);
	return m;
}

/* Our newest private data on connection c in recs (connects or accepts of either instance), decoded. */
static struct mesh_cm_pdata our_pdata(struct mt *t, bool accepts, xport_conn_t *c)
{
	unsigned cid = conn_id(c);
	struct fake_xport *fxs[] = {t->fx, t->fx1};

	for (size_t f = 0; f < 2; f++) {
		struct fake_xport *fx = fxs[f];

		if (!fx)
			continue;
		for (size_t i = accepts ? fx->n_accepts : fx->n_connects; i-- > 0;) {
			struct fake_cm_rec *r = accepts ? &fx->accepts[i] : &fx->connects[i];

			if (r->conn_id == cid)
				return decode_pdata(r->pdata, r->pdata_len);
		}
	}
	fail_msg("no %s of ours on conn %u", accepts ? "accept" : "connect", cid);
	return (struct mesh_cm_pdata){0};
}

static struct auth_transcript peer_transcript(struct mt *t, struct link *l, bool dialler_proves, uint32_t rail,
					      uint32_t gen, const uint8_t *nonce_dialler, const uint8_t *nonce_acceptor)
{
	return (struct auth_transcript){
		.cluster = t->cfg.cluster_name,
		.dialler_proves = dialler_proves,
		.dialler = l->dialer ? t->m.self->id : l->peer->id,
		.acceptor = l->dialer ? l->peer->id : t->m.self->id,
		.link_epoch = l->epoch,
		.rail = rail,
		.gen = gen,
		.nonce_dialler = nonce_dialler,
		.nonce_acceptor = nonce_acceptor,
	};
}

void peer_accept_auth(struct mt *t, struct link *l, uint32_t i, uint32_t rail, uint32_t gen, struct mesh_cm_pdata *pd)
{
	struct mesh_cm_pdata ours = our_pdata(t, false, l->conns[i]);
	struct auth_transcript tr;

	assert_int_equal(util_random(t->peer_nonce, sizeof(t->peer_nonce)), 0);
	memcpy(pd->nonce, t->peer_nonce, sizeof(pd->nonce));
	if (!t->peer_keys.n)
		return;
	memcpy(t->our_nonce, ours.nonce, sizeof(t->our_nonce));
	tr = peer_transcript(t, l, false, rail, gen, t->our_nonce, t->peer_nonce);
	assert_int_equal(auth_prove(&t->peer_keys, &tr, pd->mac), 0);
	pd->flags |= MESH_CM_F_PROOF;
}

void peer_auth(struct mt *t, struct link *l, uint32_t qp, uint32_t rail, uint32_t gen, size_t from, bool check_ours)
{
	unsigned cid = conn_id(l->conns[qp]);
	uint8_t mac[AUTH_MAC_LEN];
	struct auth_transcript tr;
	PeerMsg msg = PEER_MSG__INIT, *m;
	AuthProof p = AUTH_PROOF__INIT;
	struct mesh_cm_pdata ours;

	if (l->dialer) {
		/* The peer proved itself in its accept (peer_accept_auth); ours is the first thing we send. */
		ours = our_pdata(t, false, l->conns[qp]);
		m = nth_send(t, from, cid, 0);
		if (!m || m->body_case != PEER_MSG__BODY_AUTH_PROOF)
			fail_msg("no AuthProof first on QP %u", qp);
		tr = peer_transcript(t, l, true, rail, gen, ours.nonce, t->peer_nonce);
		if (check_ours)
			assert_true(auth_verify(&t->peer_keys, &tr, m->auth_proof->mac.data, m->auth_proof->mac.len));
		mesh_peer_msg_free(m);
		return;
	}
	/* We accepted: our nonce and proof went in the accept of qp, over the nonce of the request
	 * (t->peer_nonce); nothing goes out on qp before the peer's proof, which the peer sends now. */
	ours = our_pdata(t, true, l->conns[qp]);
	assert_true(ours.flags & MESH_CM_F_PROOF);
	tr = peer_transcript(t, l, false, rail, gen, t->peer_nonce, ours.nonce);
	if (check_ours)
		assert_true(auth_verify(&t->peer_keys, &tr, ours.mac, sizeof(ours.mac)));
	m = nth_send(t, from, cid, 0);
	if (m)
		fail_msg("we sent %d on QP %u before the peer's proof", m->body_case, qp);
	tr.dialler_proves = true;
	assert_int_equal(auth_prove(&t->peer_keys, &tr, mac), 0);
	p.mac.data = mac;
	p.mac.len = sizeof(mac);
	msg.body_case = PEER_MSG__BODY_AUTH_PROOF;
	msg.auth_proof = &p;
	peer_send_on(t, l, qp, &msg);
}

void drive_to_up(struct mt *t, struct link *l)
{
	size_t from = t->fx->n_posts;
	Hello h;
	PeerMsg *m;

	for (uint32_t i = 0; i < mesh_link_qps(&t->m); i++)
		establish_qp(t, l, i);
	if (t->m.keys.n) {
		/* The dialler has the acceptor's proof from its accept and goes on to its Hello at once;
		 * the acceptor waits for the dialler's proof. */
		assert_int_equal(l->phase, l->dialer ? LINK_HELLO : LINK_AUTH);
		peer_auth(t, l, 0, 0, 0, from, true);
	}
	assert_int_equal(l->phase, LINK_HELLO);
	check_our_hello(t, l, from);
	from = t->fx->n_posts;
	h = peer_hello(t, l);
	peer_send_hello(t, l, &h);
	assert_int_equal(l->phase, LINK_PROOF);
	run_proof(t, l, from, -1);
	assert_int_equal(l->phase, LINK_READY_WAIT);
	m = last_send(t, from, conn_id(l->conns[0]));
	assert_int_equal(m->body_case, PEER_MSG__BODY_READY);
	assert_true(m->ready->link_epoch == l->epoch);
	mesh_peer_msg_free(m);
	peer_send_ready(t, l, l->epoch);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
}
