/*
 * The mesh state machine over the fake transport: the test plays the peer (mesh_harness.h). It
 * answers connects with ESTABLISHED events carrying the acceptor's private data, delivers the peer's
 * messages into posted receive buffers, executes RDMA WRITE/READ against a buffer standing in for
 * the peer's mailbox, and checks what the mesh posted, registered, accepted, rejected and
 * disconnected.
 *
 * Events go through the fake's poll() and then mesh_handle_event() + mesh_reap(), as meshd's loop
 * does. Every test ends in mesh_cleanup() and checks that no connection or registration is left.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "link_internal.h" /* LINK_LEAVE_GRACE_MS */
#include "log.h"
#include "mesh_harness.h"
#include "unit_main.h"
#include "util.h"

#define QPS MT_QPS

/* ---- accept-side helpers -------------------------------------------------------------------- */

static struct mesh_cm_pdata request_pdata(struct mt *t, uint16_t src, uint8_t qp, uint64_t epoch)
{
	struct mesh_cm_pdata pd = {
		.kind = MESH_CM_CONNECT,
		.qp_index = qp,
		.qp_count = QPS,
		.cluster_hash = mesh_cluster_hash(t->cfg.cluster_name),
		.src_node = src,
		.dst_node = t->m.self->id,
		.link_epoch = epoch,
		.boot_epoch = 777,
	};

	return pd;
}

/* A CONNECT_REQUEST carrying raw private data on a new passive connection from from; returns its id. */
static unsigned request_from(struct mt *t, const char *from, const void *pdata, size_t len)
{
	struct fake_conn *fc = fake_conn_incoming(t->fx, from);
	struct xport_event ev = cm_event(XPORT_EV_CONNECT_REQUEST, &fc->base, pdata, len);
	unsigned id = fc->id; /* a rejected conn is gone after deliver() */

	deliver(t, &ev);
	return id;
}

static unsigned request_raw(struct mt *t, const void *pdata, size_t len)
{
	return request_from(t, "10.0.0.200", pdata, len);
}

/* From the address the claimed node has on the request's rail (mt_init: 10.R.0.ID), as a real node
 * binds its source. */
static unsigned request(struct mt *t, const struct mesh_cm_pdata *pd)
{
	uint8_t buf[XPORT_PDATA_MAX];
	int len = mesh_cm_pdata_encode(pd, buf, sizeof(buf));
	char from[32];

	assert_true(len > 0);
	snprintf(from, sizeof(from), "10.%u.0.%u:40000", pd->rail, pd->src_node);
	return request_from(t, from, buf, (size_t)len);
}

/* The connection was accepted with ACCEPT private data answering pd, and joined the peer's link. */
static void expect_accepted(struct mt *t, unsigned cid, const struct mesh_cm_pdata *req)
{
	const struct fake_cm_rec *a = t->fx->n_accepts ? &t->fx->accepts[t->fx->n_accepts - 1] : NULL;
	struct fake_conn *fc = fake_conn_by_id(t->fx, cid);
	struct mesh_cm_pdata pd;
	struct link *l = lk(t, req->src_node);

	if (!a || a->conn_id != cid)
		fail_msg("conn %u was not accepted (last reject: %zu)", cid, t->fx->n_rejects);
	assert_non_null(fc);
	assert_false(fc->rejected);
	pd = decode_pdata(a->pdata, a->pdata_len);
	assert_int_equal(pd.kind, MESH_CM_ACCEPT);
	assert_int_equal(pd.src_node, t->m.self->id);
	assert_int_equal(pd.dst_node, req->src_node);
	assert_int_equal(pd.qp_index, req->qp_index);
	assert_int_equal(pd.qp_count, QPS);
	assert_true(pd.link_epoch == req->link_epoch);
	assert_int_equal(pd.cluster_hash, mesh_cluster_hash("test"));
	assert_true(pd.boot_epoch == t->m.boot_epoch);
	assert_ptr_equal(fc->base.ctx, l);
	assert_int_equal(fc->base.index, req->qp_index);
	assert_ptr_equal(l->conns[req->qp_index], &fc->base);
	assert_true(l->epoch == req->link_epoch);
}

/* The connection was rejected with reason `reason` (0: none travels), counted, and destroyed. */
static void expect_rejected(struct mt *t, unsigned cid, uint64_t rejects_before, int reason)
{
	const struct fake_cm_rec *r = t->fx->n_rejects ? &t->fx->rejects[t->fx->n_rejects - 1] : NULL;
	struct mesh_cm_pdata pd;

	if (!r || r->conn_id != cid)
		fail_msg("conn %u was not rejected", cid);
	pd = decode_pdata(r->pdata, r->pdata_len);
	assert_int_equal(pd.kind, MESH_CM_REJECT);
	/* The wire reveals nothing of us: no node id, no cluster hash, no epochs ... */
	assert_int_equal(pd.src_node, 0);
	assert_int_equal(pd.dst_node, 0);
	assert_int_equal(pd.cluster_hash, 0);
	assert_int_equal(pd.link_epoch, 0);
	assert_int_equal(pd.boot_epoch, 0);
	/* ... and a generic reason unless the peer must act on it; the detail stays here. */
	if (t->m.last_reject_reason != reason)
		fail_msg("reject reason %d (%s), expected %d (%s)", t->m.last_reject_reason,
			 mesh_strerror(t->m.last_reject_reason), reason, mesh_strerror(reason));
	if (reason != -MESH_EBUSY && reason != -MESH_ESHUTDOWN && reason != -MESH_ESTALE && reason != -MESH_EDUPQP &&
	    reason != -MESH_EPROTOVER)
		reason = -MESH_EREFUSED;
	if (pd.reason != reason)
		fail_msg("reason %d (%s) on the wire, expected %d (%s)", pd.reason, mesh_strerror(pd.reason), reason,
			 mesh_strerror(reason));
	assert_int_equal(t->m.peer_rejects, rejects_before + 1);
	for (size_t i = 0; i < t->fx->n_accepts; i++)
		assert_int_not_equal(t->fx->accepts[i].conn_id, cid);
	/* Buried and destroyed by the reap after the batch. */
	assert_null(fake_conn_by_id(t->fx, cid));
}

/* ---- dial rule ------------------------------------------------------------------------------ */

static const uint16_t ids123[] = {1, 2, 3};

static void mesh_dials__ids__higher_dials_lower(void **state)
{
	(void)state;
	assert_true(mesh_dials(3, 1));
	assert_false(mesh_dials(1, 3));
	assert_true(mesh_dials(65535, 0));
	assert_false(mesh_dials(0, 65535));
	assert_false(mesh_dials(2, 2));
}

static void mesh_tick__middle_node__dials_lower_only_and_waits_for_higher(void **state)
{
	struct mt *t = *state;
	struct link *l1, *l3;

	mt_init(t, 2, ids123, 3);
	l1 = lk(t, 1);
	l3 = lk(t, 3);
	assert_true(l1->dialer);
	assert_false(l3->dialer);
	assert_null(mesh_link_find(&t->m, 2));
	/* mesh_init dials nobody: the first tick does. */
	assert_int_equal(t->fx->n_connects, 0);
	assert_int_equal(link_state(l1), LINK_STATE_DOWN_);
	assert_int_equal(link_state(l3), LINK_STATE_DOWN_);
	tick(t);
	assert_int_equal(t->fx->n_connects, QPS);
	for (size_t i = 0; i < t->fx->n_connects; i++) {
		assert_string_equal(t->fx->connects[i].addr, "10.0.0.1");
		assert_string_equal(t->fx->connects[i].src_addr, "10.0.0.2");
		assert_int_equal(t->fx->connects[i].port, 7471);
		assert_ptr_equal(t->fx->connects[i].ctx, l1);
		/* The attempt's own protection scope: not the link's, which earlier attempts shared. */
		assert_ptr_equal(l1->conns[i]->scope, l1->scope);
		assert_ptr_not_equal(l1->scope, l1);
	}
	assert_int_equal(l3->phase, LINK_IDLE);
	/* Node 3 dials us; however long we wait, we never dial it. */
	tick_at(t, util_now_ms() + 60 * 1000);
	tick_at(t, util_now_ms() + 120 * 1000);
	for (size_t i = 0; i < t->fx->n_connects; i++)
		assert_string_not_equal(t->fx->connects[i].addr, "10.0.0.3");
	assert_int_equal(l3->phase, LINK_IDLE);
	mt_finish(t);
}

/* ---- full handshake as dialler -------------------------------------------------------------- */

static void mesh_dial__connects__valid_connect_pdata_per_qp(void **state)
{
	struct mt *t = *state;
	struct link *l;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	assert_int_equal(t->fx->n_connects, QPS);
	assert_int_equal(t->m.handshakes, 1);
	assert_true(l->epoch >= t->m.boot_epoch);
	for (uint32_t i = 0; i < QPS; i++) {
		const struct fake_cm_rec *c = &t->fx->connects[i];
		struct mesh_cm_pdata pd = decode_pdata(c->pdata, c->pdata_len);

		assert_int_equal(c->pdata_len, sizeof(struct mesh_cm_wire));
		assert_int_equal(c->index, i);
		assert_ptr_equal(l->conns[i], &c->conn->base);
		assert_int_equal(pd.kind, MESH_CM_CONNECT);
		assert_int_equal(pd.src_node, 2);
		assert_int_equal(pd.dst_node, 1);
		assert_int_equal(pd.qp_index, i);
		assert_int_equal(pd.qp_count, QPS);
		assert_int_equal(pd.cluster_hash, mesh_cluster_hash("test"));
		assert_true(pd.link_epoch == l->epoch);
		assert_true(pd.boot_epoch == t->m.boot_epoch);
		assert_int_equal(pd.reason, 0);
	}
	/* A dial nobody answered yet is still DOWN. */
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_int_equal(l->phase, LINK_QPS);
	mt_finish(t);
}

static void mesh_handshake__dialler__up_then_keepalive_timeout_down(void **state)
{
	struct mt *t = *state;
	struct link *l;
	size_t from;
	unsigned c0, c1;
	const struct fake_reg *local, *mb;
	struct fake_post *hello_send, *p;
	Hello h;
	PeerMsg *m, msg = PEER_MSG__INIT;
	Keepalive ka = KEEPALIVE__INIT;
	uint64_t epoch, before, after;

	t->peer_feat_off = MESH_FEAT_KA_WRITE; /* keepalives as messages, as with an older peer */
	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	c0 = conn_id(l->conns[0]);
	c1 = conn_id(l->conns[1]);
	epoch = l->epoch;

	/* QP 0 established: memory registered, receives posted on QP 0, nothing sent yet; the mailbox
	 * (the one memory a peer may write) is not registered before our Hello. */
	establish_qp(t, l, 0);
	assert_int_equal(link_state(l), LINK_STATE_CONNECTING_);
	assert_int_equal(t->fx->n_regs, 1);
	local = fake_reg_find(t->fx, XPORT_ACCESS_LOCAL);
	assert_non_null(local);
	assert_null(fake_reg_find(t->fx, ACCESS_MAILBOX));
	assert_int_equal(fake_post_count(t->fx, 0, XPORT_OP_RECV, c0), LINK_RECV_BUFS);
	assert_int_equal(fake_post_count(t->fx, 0, XPORT_OP_RECV, c1), 0);
	for (size_t i = 0; i < LINK_RECV_BUFS; i++) {
		p = fake_post_find(t->fx, 0, XPORT_OP_RECV, c0, i);
		assert_int_equal(p->len, MESH_PEER_MSG_MAX);
		for (size_t j = 0; j < i; j++) {
			struct fake_post *q = fake_post_find(t->fx, 0, XPORT_OP_RECV, c0, j);

			assert_true(q->wr_id != p->wr_id);
			assert_ptr_not_equal(q->buf, p->buf);
		}
	}
	assert_int_equal(fake_post_count(t->fx, 0, XPORT_OP_SEND, 0), 0);

	/* QP 1 established: our Hello goes out on QP 0. */
	from = t->fx->n_posts;
	establish_qp(t, l, 1);
	assert_int_equal(link_qps_established(l), QPS);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_SEND, 0), 1);
	mb = fake_reg_find(t->fx, ACCESS_MAILBOX);
	assert_non_null(mb);
	assert_int_not_equal(local->rkey, mb->rkey);
	check_our_hello(t, l, from);
	hello_send = fake_post_find(t->fx, from, XPORT_OP_SEND, c0, 0);

	/* The peer's Hello: the receive is reposted, and every QP writes and reads back its token. */
	from = t->fx->n_posts;
	h = peer_hello(t, l);
	peer_send_hello(t, l, &h);
	assert_int_equal(l->phase, LINK_PROOF);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_RECV, c0), 1);
	assert_true(fake_post_find(t->fx, from, XPORT_OP_RECV, c0, 0)->wr_id ==
		    fake_post_find(t->fx, 0, XPORT_OP_RECV, c0, 0)->wr_id);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_WRITE, 0), QPS);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_READ, 0), QPS);
	assert_true(l->peer_mb_addr == (uintptr_t)t->peer_mb);
	assert_int_equal(l->peer_mb_rkey, PEER_RKEY);
	assert_int_equal(l->peer_mb_len, PEER_MB_LEN);
	assert_true(l->peer_boot_epoch == 4242);

	/* Our Hello's send completes; the proof runs; Ready goes out. */
	{
		struct xport_event ev = wc_event(l->conns[0], XPORT_OP_SEND, hello_send->wr_id, hello_send->len);

		deliver(t, &ev);
	}
	run_proof(t, l, from, -1);
	assert_int_equal(l->proofs_done, QPS);
	assert_int_equal(link_state(l), LINK_STATE_CONNECTING_);
	m = last_send(t, from, c0);
	assert_int_equal(m->body_case, PEER_MSG__BODY_READY);
	assert_true(m->ready->link_epoch == epoch);
	mesh_peer_msg_free(m);

	/* The peer's Ready: UP. */
	peer_send_ready(t, l, epoch);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	assert_string_equal(link_state_name(link_state(l)), "UP");
	assert_int_equal(l->ups, 1);
	assert_int_equal(mesh_links_up(&t->m), 1);
	assert_int_equal(t->m.handshakes, 0);
	assert_string_equal(l->last_error, "");
	assert_int_equal(l->rx_msgs, 2);

	/* UP: a keepalive goes out on the next tick, and a peer's keepalive is answered. */
	from = t->fx->n_posts;
	tick(t);
	m = last_send(t, from, c0);
	assert_int_equal(m->body_case, PEER_MSG__BODY_KEEPALIVE);
	assert_int_equal(m->keepalive->seq, 1);
	mesh_peer_msg_free(m);
	from = t->fx->n_posts;
	ka.seq = 99;
	ka.sent_us = 123456;
	msg.body_case = PEER_MSG__BODY_KEEPALIVE;
	msg.keepalive = &ka;
	peer_send(t, l, &msg);
	m = last_send(t, from, c0);
	assert_int_equal(m->body_case, PEER_MSG__BODY_KEEPALIVE_ACK);
	assert_int_equal(m->keepalive_ack->seq, 99);
	assert_int_equal(m->keepalive_ack->sent_us, 123456);
	mesh_peer_msg_free(m);
	assert_int_equal(link_state(l), LINK_STATE_UP_);

	/* Silence beyond keepalive_timeout_ms: DOWN, both QPs disconnected and destroyed, memory
	 * deregistered, and the re-dial waits for the backoff. */
	before = util_now_ms();
	tick_at(t, before + t->cfg.keepalive_timeout_ms + 1);
	after = util_now_ms();
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_int_equal(mesh_links_up(&t->m), 0);
	if (!strstr(l->last_error, mesh_strerror(-MESH_EKEEPALIVE)))
		fail_msg("last_error \"%s\" does not name the keepalive timeout", l->last_error);
	assert_true(fake_disconnected(t->fx, c0));
	assert_true(fake_disconnected(t->fx, c1));
	assert_null(fake_conn_by_id(t->fx, c0));
	assert_null(fake_conn_by_id(t->fx, c1));
	assert_int_equal(t->fx->live_conns, 0);
	assert_int_equal(t->fx->live_mrs, 0);
	assert_null(l->conns[0]);
	assert_null(l->conns[1]);
	assert_true(l->next_dial_ms >= before + t->cfg.backoff_initial_ms / 2);
	assert_true(l->next_dial_ms <= after + t->cfg.backoff_initial_ms);
	tick(t);
	assert_int_equal(t->fx->n_connects, QPS);
	tick_at(t, util_now_ms() + t->cfg.backoff_max_ms + 1);
	assert_int_equal(t->fx->n_connects, 2 * QPS);
	assert_true(l->epoch > epoch);
	assert_true(decode_pdata(t->fx->connects[2].pdata, t->fx->connects[2].pdata_len).link_epoch == l->epoch);
	mt_finish(t);
}

static void mesh_handshake__dialler_hello_before_last_qp__waits_then_proves(void **state)
{
	struct mt *t = *state;
	struct link *l;
	size_t from;
	Hello h;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	establish_qp(t, l, 0);
	/* The acceptor had both QPs before we saw the second: its Hello comes first. */
	h = peer_hello(t, l);
	from = t->fx->n_posts;
	peer_send_hello(t, l, &h);
	assert_int_equal(l->phase, LINK_QPS);
	assert_true(l->have_peer_hello);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_WRITE, 0), 0);
	establish_qp(t, l, 1);
	assert_int_equal(l->phase, LINK_PROOF);
	run_proof(t, l, from, -1);
	peer_send_ready(t, l, l->epoch);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	mt_finish(t);
}

static void mesh_handshake__peer_ready_during_proof__up_after_proof(void **state)
{
	struct mt *t = *state;
	struct link *l;
	size_t from;
	Hello h;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	establish_qp(t, l, 0);
	establish_qp(t, l, 1);
	from = t->fx->n_posts;
	h = peer_hello(t, l);
	peer_send_hello(t, l, &h);
	peer_send_ready(t, l, l->epoch); /* the peer proved faster */
	assert_int_equal(l->phase, LINK_PROOF);
	run_proof(t, l, from, -1);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	mt_finish(t);
}

/* ---- proof and Hello failures --------------------------------------------------------------- */

static void mesh_proof__read_returns_other_bytes__down_naming_proof(void **state)
{
	struct mt *t = *state;
	struct link *l;
	size_t from;
	unsigned c0, c1;
	Hello h;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	c0 = conn_id(l->conns[0]);
	c1 = conn_id(l->conns[1]);
	establish_qp(t, l, 0);
	establish_qp(t, l, 1);
	from = t->fx->n_posts;
	h = peer_hello(t, l);
	peer_send_hello(t, l, &h);
	run_proof(t, l, from, 0);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_int_equal(l->ups, 0);
	assert_non_null(strstr(l->last_error, "proof"));
	assert_non_null(strstr(l->last_error, "QP 0"));
	/* No Ready went out. */
	for (size_t i = 0; i < fake_post_count(t->fx, from, XPORT_OP_SEND, c0); i++) {
		struct fake_post *p = fake_post_find(t->fx, from, XPORT_OP_SEND, c0, i);
		PeerMsg *m;
		const char *why;

		assert_int_equal(mesh_peer_msg_decode(p->buf, p->len, &m, &why), 0);
		assert_int_not_equal(m->body_case, PEER_MSG__BODY_READY);
		mesh_peer_msg_free(m);
	}
	assert_true(fake_disconnected(t->fx, c0));
	assert_true(fake_disconnected(t->fx, c1));
	assert_int_equal(t->m.handshakes, 0);
	assert_int_equal(l->failures, 1);
	mt_finish(t);
}

static void mesh_proof__second_qp_fails__down(void **state)
{
	struct mt *t = *state;
	struct link *l;
	size_t from;
	Hello h;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	establish_qp(t, l, 0);
	establish_qp(t, l, 1);
	from = t->fx->n_posts;
	h = peer_hello(t, l);
	peer_send_hello(t, l, &h);
	run_proof(t, l, from, 1);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "QP 1"));
	assert_non_null(strstr(l->last_error, mesh_strerror(-MESH_EPROOF)));
	mt_finish(t);
}

/* Brings the dialler's link to HELLO (both QPs up, our Hello sent); returns the link. */
static struct link *dial_to_hello(struct mt *t)
{
	struct link *l;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	establish_qp(t, l, 0);
	establish_qp(t, l, 1);
	assert_int_equal(l->phase, LINK_HELLO);
	return l;
}

static void expect_down_after_hello(struct mt *t, struct link *l, Hello *h, const char *needle)
{
	size_t from = t->fx->n_posts;
	unsigned c0 = conn_id(l->conns[0]), c1 = conn_id(l->conns[1]);

	peer_send_hello(t, l, h);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_int_equal(l->phase, LINK_IDLE);
	if (!strstr(l->last_error, needle))
		fail_msg("last_error \"%s\" does not mention \"%s\"", l->last_error, needle);
	/* No proof was attempted against an unverified peer. */
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_WRITE, 0), 0);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_READ, 0), 0);
	assert_true(fake_disconnected(t->fx, c0));
	assert_true(fake_disconnected(t->fx, c1));
	assert_int_equal(t->m.handshakes, 0);
}

static void mesh_hello__wrong_cluster_hash__down(void **state)
{
	struct mt *t = *state;
	struct link *l = dial_to_hello(t);
	Hello h = peer_hello(t, l);

	h.cluster_hash = mesh_cluster_hash("other");
	expect_down_after_hello(t, l, &h, "does not match");
	mt_finish(t);
}

static void mesh_hello__wrong_epoch__down(void **state)
{
	struct mt *t = *state;
	struct link *l = dial_to_hello(t);
	Hello h = peer_hello(t, l);

	h.link_epoch = l->epoch - 1;
	expect_down_after_hello(t, l, &h, "does not match");
	mt_finish(t);
}

static void mesh_hello__wrong_node__down(void **state)
{
	struct mt *t = *state;
	struct link *l = dial_to_hello(t);
	Hello h = peer_hello(t, l);

	h.node_id = 3;
	expect_down_after_hello(t, l, &h, "from node 3");
	mt_finish(t);
}

static void mesh_hello__wrong_qp_count__down(void **state)
{
	struct mt *t = *state;
	struct link *l = dial_to_hello(t);
	Hello h = peer_hello(t, l);

	h.qp_count = 4;
	expect_down_after_hello(t, l, &h, mesh_strerror(-MESH_EQPCOUNT));
	mt_finish(t);
}

static void mesh_hello__node_id_out_of_range__down_undecodable(void **state)
{
	struct mt *t = *state;
	struct link *l = dial_to_hello(t);
	Hello h = peer_hello(t, l);

	h.node_id = 70000;
	expect_down_after_hello(t, l, &h, "node_id");
	mt_finish(t);
}

static void mesh_hello__twice__down(void **state)
{
	struct mt *t = *state;
	struct link *l = dial_to_hello(t);
	Hello h = peer_hello(t, l);

	peer_send_hello(t, l, &h);
	assert_int_equal(l->phase, LINK_PROOF);
	peer_send_hello(t, l, &h);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "second Hello"));
	mt_finish(t);
}

static void mesh_ready__before_hello__down(void **state)
{
	struct mt *t = *state;
	struct link *l = dial_to_hello(t);

	peer_send_ready(t, l, l->epoch);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "unexpected Ready"));
	mt_finish(t);
}

static void mesh_ready__wrong_epoch__down(void **state)
{
	struct mt *t = *state;
	struct link *l = dial_to_hello(t);
	Hello h = peer_hello(t, l);
	size_t from = t->fx->n_posts;

	peer_send_hello(t, l, &h);
	run_proof(t, l, from, -1);
	assert_int_equal(l->phase, LINK_READY_WAIT);
	peer_send_ready(t, l, l->epoch + 1);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "unexpected Ready"));
	mt_finish(t);
}

static void mesh_message__garbage__down_undecodable(void **state)
{
	struct mt *t = *state;
	struct link *l = dial_to_hello(t);
	struct fake_post *p = fake_post_find(t->fx, 0, XPORT_OP_RECV, conn_id(l->conns[0]), 0);
	struct xport_event ev;

	p->used = true;
	memset(p->buf, 0xff, 16);
	ev = wc_event(l->conns[0], XPORT_OP_RECV, p->wr_id, 16);
	deliver(t, &ev);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "undecodable"));
	mt_finish(t);
}

static void mesh_message__longer_than_buffer__down(void **state)
{
	struct mt *t = *state;
	struct link *l = dial_to_hello(t);
	struct fake_post *p = fake_post_find(t->fx, 0, XPORT_OP_RECV, conn_id(l->conns[0]), 0);
	struct xport_event ev = wc_event(l->conns[0], XPORT_OP_RECV, p->wr_id, MESH_PEER_MSG_MAX + 1);

	deliver(t, &ev);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, mesh_strerror(-MESH_EPEERMSG)));
	mt_finish(t);
}

/* A Goodbye takes an UP link DOWN with what its reason says: the peer stops, or it removed this
 * node from its configuration (a reload there: the channels then fail with that, not resume). */
static void mesh_goodbye__on_up_link__down_naming_its_reason(void **state)
{
	static const struct {
		int reason;
		const char *says;
	} cases[] = {{MESH_ESHUTDOWN, "goodbye"}, {MESH_EREMOVED, "removed this node"}};
	struct mt *t = *state;

	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		PeerMsg m = PEER_MSG__INIT;
		Goodbye g = GOODBYE__INIT;
		struct link *l;

		mt_init(t, 2, ids123, 3);
		l = lk(t, 1);
		tick(t);
		drive_to_up(t, l);
		g.reason = (uint32_t)cases[k].reason;
		m.body_case = PEER_MSG__BODY_GOODBYE;
		m.goodbye = &g;
		peer_send(t, l, &m);
		assert_int_equal(link_state(l), LINK_STATE_DOWN_);
		assert_non_null(strstr(l->last_error, cases[k].says));
		assert_non_null(strstr(l->last_error, mesh_strerror(-cases[k].reason)));
		mt_finish(t);
		mt_close(t);
		memset(t, 0, sizeof(*t));
		mt_open(t);
	}
}

static void mesh_stop__up_link__goodbye_sent(void **state)
{
	struct mt *t = *state;
	struct link *l;
	size_t from;
	PeerMsg *m;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	drive_to_up(t, l);
	from = t->fx->n_posts;
	mesh_stop(&t->m, MESH_ESHUTDOWN);
	m = last_send(t, from, conn_id(l->conns[0]));
	assert_int_equal(m->body_case, PEER_MSG__BODY_GOODBYE);
	assert_int_equal(m->goodbye->reason, MESH_ESHUTDOWN);
	mesh_peer_msg_free(m);
	/* Stopping: no more dials, and requests are refused. */
	tick_at(t, util_now_ms() + 60 * 1000);
	assert_int_equal(t->fx->n_connects, QPS);
	mt_finish(t);
}

/* ---- reload: mesh_reconfigure ---------------------------------------------------------------- */

/* The harness's configuration with the nodes of ids (copies of its own entries where an id was
 * there before) in nn: what main.c puts where m->cfg points before mesh_reconfigure. */
static const struct config_node *reconf_nodes(struct mt *t, struct config_node *nn, const uint16_t *ids, size_t n,
					      uint16_t self_id)
{
	const struct config_node *self = NULL;

	for (size_t i = 0; i < n; i++) {
		const struct config_node *was = config_node_find(&t->cfg, ids[i]);

		if (was) {
			nn[i] = *was;
		} else {
			memset(&nn[i], 0, sizeof(nn[i]));
			nn[i].id = ids[i];
			nn[i].port = 7471;
			nn[i].n_rails = 1;
			snprintf(nn[i].addr, sizeof(nn[i].addr), "10.0.0.%u", ids[i]);
			snprintf(nn[i].rail[0], sizeof(nn[i].rail[0]), "10.0.0.%u", ids[i]);
		}
		if (ids[i] == self_id)
			self = &nn[i];
	}
	t->cfg.nodes = nn;
	t->cfg.n_nodes = n;
	return self;
}

static void mesh_reconfigure__node_removed__goodbye_says_removed_then_closed_after_grace(void **state)
{
	static const uint16_t ids23[] = {2, 3};
	struct mt *t = *state;
	struct config_node nn[2];
	struct mesh_reconf rc;
	struct link *l1, *l3;
	unsigned c0;
	size_t from;
	PeerMsg *m;

	mt_init(t, 2, ids123, 3);
	l1 = lk(t, 1);
	l3 = lk(t, 3);
	tick(t);
	drive_to_up(t, l1);
	c0 = conn_id(l1->conns[0]);
	from = t->fx->n_posts;
	assert_int_equal(mesh_reconfigure(&t->m, reconf_nodes(t, nn, ids23, 2, 2), &rc), 0);
	assert_int_equal(rc.removed, 1);
	assert_int_equal(rc.added + rc.moved, 0);
	/* Out of the mesh at once (no request, dial or channel finds it), the peer told why. */
	assert_null(mesh_link_find(&t->m, 1));
	assert_int_equal(t->m.n_links, 1);
	assert_ptr_equal(t->m.links[0], l3);
	m = last_send(t, from, c0);
	assert_int_equal(m->body_case, PEER_MSG__BODY_GOODBYE);
	assert_int_equal(m->goodbye->reason, MESH_EREMOVED);
	mesh_peer_msg_free(m);
	/* Its QPs close once the Goodbye had its time, and no removed link is counted as a flap. */
	assert_false(fake_disconnected(t->fx, c0));
	/* The old configuration is freed after a reload (here: overwritten), and the leaving link's
	 * QPs still raise events that name its peer. */
	memset(&t->nodes[0], 0xa5, sizeof(t->nodes[0]));
	{
		struct xport_event ev = cm_event(XPORT_EV_DISCONNECTED, l1->conns[1], NULL, 0);

		ev.status = -ECONNRESET;
		deliver(t, &ev);
	}
	assert_int_equal(l1->peer->id, 1);
	assert_non_null(strstr(l1->last_error, "node 1") ? l1->last_error : strstr(l1->last_error, "QP 1"));
	tick_at(t, util_now_ms() + LINK_LEAVE_GRACE_MS + 1);
	assert_true(fake_disconnected(t->fx, c0));
	assert_int_equal(t->m.n_leaving, 0);
	assert_int_equal(t->m.link_flaps, 0);
	mt_finish(t);
}

static void mesh_reconfigure__node_added__lower_id_dialled_and_up_link_untouched(void **state)
{
	static const uint16_t ids12[] = {1, 2}, ids012[] = {0, 1, 2};
	struct mt *t = *state;
	struct config_node nn[3];
	struct mesh_reconf rc;
	xport_conn_t *c0;
	struct link *l1, *l0;
	size_t connects;

	mt_init(t, 2, ids12, 2);
	l1 = lk(t, 1);
	tick(t);
	drive_to_up(t, l1);
	c0 = l1->conns[0];
	connects = t->fx->n_connects;
	assert_int_equal(mesh_reconfigure(&t->m, reconf_nodes(t, nn, ids012, 3, 2), &rc), 0);
	assert_int_equal(rc.added, 1);
	assert_int_equal(rc.removed + rc.moved, 0);
	l0 = lk(t, 0);
	assert_non_null(l0);
	assert_true(l0->dialer);
	assert_ptr_equal(t->m.links[0], l0); /* in id order */
	tick(t);
	assert_int_equal(t->fx->n_connects, connects + QPS);
	assert_string_equal(t->fx->connects[connects].addr, "10.0.0.0");
	/* The link that was there is the same link, on the same QPs, UP once. */
	assert_ptr_equal(lk(t, 1), l1);
	assert_int_equal(link_state(l1), LINK_STATE_UP_);
	assert_ptr_equal(l1->conns[0], c0);
	assert_int_equal(l1->ups, 1);
	assert_ptr_equal(l1->peer, &nn[1]);
	mt_finish(t);
}

static void mesh_reconfigure__node_moved__its_link_reforms_there_at_once(void **state)
{
	struct mt *t = *state;
	struct config_node nn[3];
	struct mesh_reconf rc;
	struct link *l1, *l3;
	size_t connects;

	mt_init(t, 2, ids123, 3);
	l1 = lk(t, 1);
	l3 = lk(t, 3);
	tick(t);
	drive_to_up(t, l1);
	reconf_nodes(t, nn, ids123, 3, 2);
	snprintf(nn[0].addr, sizeof(nn[0].addr), "10.0.9.1");
	snprintf(nn[0].rail[0], sizeof(nn[0].rail[0]), "10.0.9.1");
	connects = t->fx->n_connects;
	assert_int_equal(mesh_reconfigure(&t->m, &nn[1], &rc), 0);
	assert_int_equal(rc.moved, 1);
	assert_int_equal(rc.added + rc.removed, 0);
	assert_int_equal(link_state(l1), LINK_STATE_DOWN_);
	assert_non_null(strstr(l1->last_error, "moved"));
	/* Re-dialled at the new address by the next tick, without a failure's backoff. */
	tick(t);
	assert_int_equal(t->fx->n_connects, connects + QPS);
	assert_string_equal(t->fx->connects[connects].addr, "10.0.9.1");
	assert_ptr_equal(t->m.self, &nn[1]);
	assert_ptr_equal(l3->peer, &nn[2]);
	mt_finish(t);
}

/* ---- accept side ---------------------------------------------------------------------------- */

static const uint16_t ids0123[] = {0, 1, 2, 3};
#define EPOCH 1000000u

static void mesh_accept__valid_request__accepted_with_accept_pdata(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;
	struct link *l;
	unsigned c0, c1;
	size_t from;
	Hello h;

	mt_init(t, 1, ids0123, 4);
	l = lk(t, 2);
	assert_false(l->dialer);
	pd = request_pdata(t, 2, 0, EPOCH);
	c0 = request(t, &pd);
	expect_accepted(t, c0, &pd);
	/* Its registrations are the attempt's alone: another peer's connection, or another attempt's,
	 * cannot use their keys. */
	assert_ptr_equal(fake_conn_by_id(t->fx, c0)->base.scope, l->scope);
	assert_int_equal(link_state(l), LINK_STATE_CONNECTING_);
	assert_int_equal(t->m.handshakes, 1);
	assert_int_equal(t->m.peer_rejects, 0);
	/* Registered and receives posted before the accept, so the peer's first SEND finds a buffer;
	 * the mailbox not yet: it waits for our Hello. */
	assert_int_equal(t->fx->n_regs, 1);
	assert_null(fake_reg_find(t->fx, ACCESS_MAILBOX));
	assert_int_equal(fake_post_count(t->fx, 0, XPORT_OP_RECV, c0), LINK_RECV_BUFS);

	pd = request_pdata(t, 2, 1, EPOCH);
	c1 = request(t, &pd);
	expect_accepted(t, c1, &pd);
	assert_int_equal(t->fx->n_regs, 1);

	/* Established (no private data on the passive side): our Hello, then the rest as the dialler. */
	from = t->fx->n_posts;
	establish_qp(t, l, 1);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_SEND, 0), 0);
	establish_qp(t, l, 0);
	check_our_hello(t, l, from);
	from = t->fx->n_posts;
	h = peer_hello(t, l);
	peer_send_hello(t, l, &h);
	run_proof(t, l, from, -1);
	peer_send_ready(t, l, EPOCH);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	assert_int_equal(t->m.handshakes, 0);
	mt_finish(t);
}

/* A valid request from node 2 is still accepted after whatever was refused before. */
static void expect_still_accepting(struct mt *t, uint64_t epoch)
{
	struct mesh_cm_pdata pd = request_pdata(t, 2, 0, epoch);
	unsigned cid = request(t, &pd);

	expect_accepted(t, cid, &pd);
}

static void check_reject(struct mt *t, const struct mesh_cm_pdata *pd, int reason)
{
	uint64_t before = t->m.peer_rejects;
	unsigned cid = request(t, pd);

	expect_rejected(t, cid, before, reason);
}

/* The RC ACK timeout follows the keepalive timeout: an attempt gets at most an eighth of it, so a
 * packet lost a few times in a row (a failover's burst in the Soft-RoCE VM: six times) is repaired
 * before the keepalive judges the rail; rdma_cm's default (2^17: 0.54 s) is kept when it fits. */
static void mesh_ack_timeout__keepalive_timeouts__eighth_of_it_per_attempt(void **state)
{
	(void)state;
	assert_int_equal(mesh_ack_timeout(5000), 0);  /* the default config: 0.54 s fits in 625 ms */
	assert_int_equal(mesh_ack_timeout(3600000), 0);
	assert_int_equal(mesh_ack_timeout(4295), 0);  /* 4096 ns << 17 = 536.9 ms <= 4295 / 8 */
	assert_int_equal(mesh_ack_timeout(4294), 16); /* 268 ms */
	assert_int_equal(mesh_ack_timeout(2000), 15); /* the VM's rail tests: 134 ms, 8 attempts 1.07 s */
	assert_int_equal(mesh_ack_timeout(1000), 14); /* 67 ms */
	assert_int_equal(mesh_ack_timeout(50), MESH_ACK_TIMEOUT_MIN); /* never under 16.8 ms */
	for (uint32_t ka = 50; ka < 4295; ka += 7) {
		uint8_t n = mesh_ack_timeout(ka);

		assert_true(n >= MESH_ACK_TIMEOUT_MIN && n < MESH_ACK_TIMEOUT_DEFAULT);
		assert_true(n == MESH_ACK_TIMEOUT_MIN || (4096ull << n) * 8 <= (uint64_t)ka * 1000000);
		assert_true((4096ull << (n + 1)) * 8 > (uint64_t)ka * 1000000);
	}
}

/* A stranger chooses how often we refuse it: our log keeps a budget of lines per interval. */
static void log_ratelimit_ok__beyond_burst__refused_and_counted(void **state)
{
	struct log_ratelimit rl = {.interval_ms = 1000, .burst = 3};
	uint64_t dropped = 99;

	(void)state;
	for (int i = 0; i < 3; i++) {
		assert_true(log_ratelimit_ok(&rl, 5000 + (uint64_t)i, &dropped));
		assert_int_equal(dropped, 0);
	}
	for (int i = 0; i < 1000; i++)
		assert_false(log_ratelimit_ok(&rl, 5500, &dropped));
	assert_true(log_ratelimit_ok(&rl, 6000, &dropped));
	assert_int_equal(dropped, 1000);
	assert_true(log_ratelimit_ok(&rl, 6001, &dropped));
	assert_int_equal(dropped, 0);
}

static void mesh_accept__200_strangers__every_one_refused_and_counted(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;

	mt_init(t, 1, ids0123, 4);
	pd = request_pdata(t, 2, 0, EPOCH);
	pd.cluster_hash = mesh_cluster_hash("prod");
	for (int i = 0; i < 200; i++)
		check_reject(t, &pd, -MESH_ECLUSTER);
	assert_int_equal(t->m.peer_rejects, 200);
	assert_int_equal(t->m.reject_log.dropped, 200 - REJECT_LOG_BURST);
	expect_still_accepting(t, EPOCH);
	mt_finish(t);
}

static void mesh_accept__other_cluster__rejected_ecluster(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;

	mt_init(t, 1, ids0123, 4);
	pd = request_pdata(t, 2, 0, EPOCH);
	pd.cluster_hash = mesh_cluster_hash("prod");
	check_reject(t, &pd, -MESH_ECLUSTER);
	assert_int_equal(lk(t, 2)->phase, LINK_IDLE);
	expect_still_accepting(t, EPOCH);
	mt_finish(t);
}

static void mesh_accept__lower_id_dials_higher__rejected_edialrule(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;

	mt_init(t, 1, ids0123, 4);
	pd = request_pdata(t, 0, 0, EPOCH);
	check_reject(t, &pd, -MESH_EDIALRULE);
	assert_int_equal(lk(t, 0)->phase, LINK_IDLE);
	expect_still_accepting(t, EPOCH);
	mt_finish(t);
}

static void mesh_accept__unknown_node__rejected_eunknownnode(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;

	mt_init(t, 1, ids0123, 4);
	pd = request_pdata(t, 9, 0, EPOCH);
	check_reject(t, &pd, -MESH_EUNKNOWNNODE);
	/* A request meant for another node. */
	pd = request_pdata(t, 3, 0, EPOCH);
	pd.dst_node = 2;
	check_reject(t, &pd, -MESH_EUNKNOWNNODE);
	/* Ourselves. */
	pd = request_pdata(t, 1, 0, EPOCH);
	check_reject(t, &pd, -MESH_EUNKNOWNNODE);
	assert_int_equal(t->m.peer_rejects, 3);
	expect_still_accepting(t, EPOCH);
	mt_finish(t);
}

static void mesh_accept__wrong_qp_count__rejected_eqpcount(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;

	mt_init(t, 1, ids0123, 4);
	pd = request_pdata(t, 2, 0, EPOCH);
	pd.qp_count = QPS + 1;
	check_reject(t, &pd, -MESH_EQPCOUNT);
	expect_still_accepting(t, EPOCH);
	mt_finish(t);
}

/* A node is bound to its configured addresses: a stranger claiming node 2 from another address is
 * refused, whatever else it got right, and node 2 from its own address is still accepted. */
static void mesh_accept__claimed_node_from_other_address__rejected(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;
	uint8_t buf[XPORT_PDATA_MAX];
	uint64_t before;
	unsigned cid;
	int len;

	mt_init(t, 1, ids0123, 4);
	pd = request_pdata(t, 2, 0, EPOCH);
	len = mesh_cm_pdata_encode(&pd, buf, sizeof(buf));
	for (size_t i = 0; i < 3; i++) {
		static const char *const from[] = {"10.0.0.200:40000", "10.0.0.3:40000", "::ffff:10.0.0.9"};

		before = t->m.peer_rejects;
		cid = request_from(t, from[i], buf, (size_t)len);
		expect_rejected(t, cid, before, -MESH_EUNKNOWNNODE);
	}
	assert_int_equal(lk(t, 2)->phase, LINK_IDLE);
	/* IPv4-mapped is the same host. */
	cid = request_from(t, "::ffff:10.0.0.2", buf, (size_t)len);
	expect_accepted(t, cid, &pd);
	mt_finish(t);
}

static void mesh_accept__other_rail_count__rejected_eqpcount(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;

	mt_init(t, 1, ids0123, 4);
	/* A peer with two devices (rails) dials this one-rail node: its QPs of either rail. */
	pd = request_pdata(t, 2, 0, EPOCH);
	pd.rail_count = 2;
	check_reject(t, &pd, -MESH_EQPCOUNT);
	pd.rail = 1;
	check_reject(t, &pd, -MESH_EQPCOUNT);
	expect_still_accepting(t, EPOCH);
	mt_finish(t);
}

static void mesh_accept__bad_magic__rejected_ebadmagic(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;
	uint8_t buf[XPORT_PDATA_MAX];
	uint64_t before;
	unsigned cid;

	mt_init(t, 1, ids0123, 4);
	pd = request_pdata(t, 2, 0, EPOCH);
	assert_int_equal(mesh_cm_pdata_encode(&pd, buf, sizeof(buf)), sizeof(struct mesh_cm_wire));
	memcpy(buf, "RDMA", 4);
	before = t->m.peer_rejects;
	cid = request_raw(t, buf, sizeof(struct mesh_cm_wire));
	expect_rejected(t, cid, before, -MESH_EBADMAGIC);
	expect_still_accepting(t, EPOCH);
	mt_finish(t);
}

/* A peer of protocol 1 (40 bytes of private data) or 3 hears MESH_EPROTOVER, not "malformed". */
static void mesh_accept__other_version__rejected_eprotover(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;
	uint8_t buf[XPORT_PDATA_MAX];
	uint64_t before;
	unsigned cid;

	mt_init(t, 1, ids0123, 4);
	pd = request_pdata(t, 2, 0, EPOCH);
	assert_int_equal(mesh_cm_pdata_encode(&pd, buf, sizeof(buf)), sizeof(struct mesh_cm_wire));
	buf[4] = 3;
	before = t->m.peer_rejects;
	cid = request_raw(t, buf, sizeof(struct mesh_cm_wire));
	expect_rejected(t, cid, before, -MESH_EPROTOVER);
	buf[4] = 1;
	before = t->m.peer_rejects;
	cid = request_raw(t, buf, 40);
	expect_rejected(t, cid, before, -MESH_EPROTOVER);
	expect_still_accepting(t, EPOCH);
	mt_finish(t);
}

/* Truncated private data (and no private data at all, as a plain rdma_cm client sends) is refused
 * with the reason MESH_EPDATA, so the dialler can tell it from nobody listening. */
static void mesh_accept__truncated_pdata__rejected(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;
	uint8_t buf[XPORT_PDATA_MAX];
	uint64_t before;
	unsigned cid;

	mt_init(t, 1, ids0123, 4);
	pd = request_pdata(t, 2, 0, EPOCH);
	assert_int_equal(mesh_cm_pdata_encode(&pd, buf, sizeof(buf)), sizeof(struct mesh_cm_wire));
	before = t->m.peer_rejects;
	cid = request_raw(t, buf, sizeof(struct mesh_cm_wire) - 1);
	expect_rejected(t, cid, before, -MESH_EPDATA);
	before = t->m.peer_rejects;
	cid = request_raw(t, NULL, 0);
	expect_rejected(t, cid, before, -MESH_EPDATA);
	assert_int_equal(lk(t, 2)->phase, LINK_IDLE);
	expect_still_accepting(t, EPOCH);
	mt_finish(t);
}

static void mesh_accept__accept_kind_in_request__rejected(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;

	mt_init(t, 1, ids0123, 4);
	pd = request_pdata(t, 2, 0, EPOCH);
	pd.kind = MESH_CM_ACCEPT;
	check_reject(t, &pd, -MESH_EPDATA);
	expect_still_accepting(t, EPOCH);
	mt_finish(t);
}

static void mesh_accept__stale_epoch__rejected_estale(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;
	unsigned cid;

	mt_init(t, 1, ids0123, 4);
	expect_still_accepting(t, EPOCH);
	pd = request_pdata(t, 2, 1, EPOCH - 1);
	check_reject(t, &pd, -MESH_ESTALE);
	/* The current attempt is untouched: its QP 1 still joins. */
	assert_true(lk(t, 2)->epoch == EPOCH);
	assert_int_equal(lk(t, 2)->phase, LINK_QPS);
	pd = request_pdata(t, 2, 1, EPOCH);
	cid = request(t, &pd);
	expect_accepted(t, cid, &pd);
	mt_finish(t);
}

/* ---- meshctl ping (link_ping.c) ---- */

/* What ping_ops.report was told, in order. */
static struct ping_result ping_got[32];
static size_t ping_n;
static int ping_fail_report; /* non-zero: the client "cannot take" results */

static int ping_record(void *ctx, int fd, const struct ping_result *res)
{
	(void)ctx;
	(void)fd;
	if (ping_n < sizeof(ping_got) / sizeof(ping_got[0]))
		ping_got[ping_n++] = *res;
	return ping_fail_report;
}

static void ping_ack(struct mt *t, struct link *l, uint64_t seq, uint64_t sent_us)
{
	KeepaliveAck a = KEEPALIVE_ACK__INIT;
	PeerMsg msg = PEER_MSG__INIT;

	a.seq = seq;
	a.sent_us = sent_us;
	msg.body_case = PEER_MSG__BODY_KEEPALIVE_ACK;
	msg.keepalive_ack = &a;
	peer_send(t, l, &msg);
}

/* A probe is a tagged Keepalive on the rail's first QP; the peer's echo is timed on our own clock
 * (not its sent_us), reported once; an echo of another ping, a repeat or a made-up number is
 * nothing; an unanswered probe is lost at its timeout; then done, and the entry is free again.
 * Probes never count as keepalives (their RTT histogram, their acks). */
static void mesh_ping__probe_echoed__timed_once_then_lost_then_done(void **state)
{
	struct ping_request rq = {.peer = 1, .rail = -1, .count = 2, .interval_ms = 1000, .timeout_ms = 50, .uid = 1000};
	struct mt *t = *state;
	struct link *l;
	uint64_t t0, us0, seq, acked;
	uint32_t rails = 0;
	const char *why = NULL;
	size_t from;
	PeerMsg *m;

	ping_n = 0;
	ping_fail_report = 0;
	mt_init(t, 2, ids123, 3);
	t->m.pings.ops.report = ping_record;
	l = lk(t, 1);
	tick(t);
	drive_to_up(t, l);
	acked = l->metrics.ka_acked[0];
	assert_int_equal(ping_start(&t->m, 7, &rq, &rails, &why), 0);
	assert_int_equal(rails, 1);
	t0 = util_now_ms();
	us0 = util_now_us();
	from = t->fx->n_posts;
	ping_tick(&t->m, t0);
	m = last_send(t, from, conn_id(l->conns[0]));
	assert_int_equal(m->body_case, PEER_MSG__BODY_KEEPALIVE);
	seq = m->keepalive->seq;
	mesh_peer_msg_free(m);
	assert_true(seq & MESH_PING_TAG);
	assert_int_equal(MESH_PING_SEQ_N(seq), 1);
	/* Another ping's echo, a number never sent: nothing. */
	ping_ack(t, l, MESH_PING_SEQ(MESH_PING_SEQ_ID(seq) + 1, 1), 0);
	ping_ack(t, l, MESH_PING_SEQ(MESH_PING_SEQ_ID(seq), 9), 0);
	assert_int_equal(ping_n, 0);
	/* The echo, with a sent_us from long ago: the time is ours, from the post. */
	ping_ack(t, l, seq, 1);
	assert_int_equal(ping_n, 1);
	assert_int_equal(ping_got[0].status, 0);
	assert_int_equal(ping_got[0].seq, 1);
	assert_int_equal(ping_got[0].rail, 0);
	assert_false(ping_got[0].done);
	assert_true(ping_got[0].rtt_us <= util_now_us() - us0);
	ping_ack(t, l, seq, 1); /* a repeat */
	assert_int_equal(ping_n, 1);
	for (uint32_t k = 0; k <= METRICS_RTT_BUCKETS; k++)
		assert_int_equal(l->metrics.rtt[0].n[k], 0);
	assert_true(l->metrics.ka_acked[0] == acked);
	/* The second round at the interval, unanswered: lost at its timeout, then done. */
	from = t->fx->n_posts;
	ping_tick(&t->m, t0 + 999);
	assert_int_equal(t->fx->n_posts, from);
	ping_tick(&t->m, t0 + 1000);
	m = last_send(t, from, conn_id(l->conns[0]));
	assert_int_equal(MESH_PING_SEQ_N(m->keepalive->seq), 2);
	mesh_peer_msg_free(m);
	ping_tick(&t->m, t0 + 1049);
	assert_int_equal(ping_n, 1);
	ping_tick(&t->m, t0 + 1050);
	assert_int_equal(ping_n, 3);
	assert_int_equal(ping_got[1].status, -ETIMEDOUT);
	assert_int_equal(ping_got[1].seq, 2);
	assert_true(ping_got[2].done);
	for (uint32_t i = 0; i < MESH_PING_MAX; i++)
		assert_int_equal(t->m.pings.p[i].fd, -1);
	mt_finish(t);
}

/* ping_start refuses what it cannot do, each with its own error and words: this node, an unknown
 * node, a link not UP, a rail out of range, a peer without keepalives; and its bounds: one ping per
 * connection, MESH_PING_PER_UID of a user, MESH_PING_MAX in all; a client gone frees its entry. */
static void ping_start__refusals_and_bounds__said(void **state)
{
	struct ping_request rq = {.peer = 1, .rail = -1, .count = 5, .interval_ms = 1000, .timeout_ms = 2000, .uid = 1000};
	struct mt *t = *state;
	struct link *l;
	uint32_t rails;
	const char *why;
	static const struct {
		uint32_t peer;
		int rail;
		int err;
		const char *words;
	} refused[] = {
		{2, -1, -EINVAL, "node 2 is this node"},
		{9, -1, -EHOSTUNREACH, "node 9 is not in the configuration"},
		{3, -1, -ENETUNREACH, "the link to node 3 is DOWN"},
		{1, 1, -EINVAL, "rail 1: this node has 1 rail (rail 0)"},
	};

	ping_n = 0;
	ping_fail_report = 0;
	mt_init(t, 2, ids123, 3);
	t->m.pings.ops.report = ping_record;
	l = lk(t, 1);
	tick(t);
	drive_to_up(t, l);
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		struct ping_request q = rq;

		q.peer = refused[i].peer;
		q.rail = refused[i].rail;
		why = NULL;
		assert_int_equal(ping_start(&t->m, 7, &q, &rails, &why), refused[i].err);
		if (!why || !strstr(why, refused[i].words))
			fail_msg("case %zu: \"%s\" does not say \"%s\"", i, why ? why : "", refused[i].words);
	}
	assert_int_equal(ping_start(&t->m, 7, &rq, &rails, &why), 0);
	assert_int_equal(ping_start(&t->m, 7, &rq, &rails, &why), -EBUSY);
	assert_non_null(strstr(why, "on this connection already"));
	assert_int_equal(ping_start(&t->m, 8, &rq, &rails, &why), 0);
	assert_int_equal(ping_start(&t->m, 9, &rq, &rails, &why), -EBUSY);
	assert_non_null(strstr(why, "uid 1000 runs 2 pings already"));
	rq.privileged = true;
	for (int fd = 9; fd < 9 + (int)MESH_PING_MAX - 2; fd++)
		assert_int_equal(ping_start(&t->m, fd, &rq, &rails, &why), 0);
	assert_int_equal(ping_start(&t->m, 100, &rq, &rails, &why), -EBUSY);
	assert_non_null(strstr(why, "8 pings run already"));
	ping_client_gone(&t->m, 8);
	assert_int_equal(ping_start(&t->m, 100, &rq, &rails, &why), 0);
	/* A client that cannot take a result loses its ping: here the probes' timeouts. */
	ping_tick(&t->m, util_now_ms());
	ping_fail_report = -EAGAIN;
	ping_tick(&t->m, util_now_ms() + rq.timeout_ms);
	for (uint32_t i = 0; i < MESH_PING_MAX; i++)
		assert_int_equal(t->m.pings.p[i].fd, -1);
	ping_fail_report = 0;
	mt_finish(t);
}

/* A peer that did not agree keepalives (an older meshd of long ago) answers no probe: refused. */
static void ping_start__peer_without_keepalives__eopnotsupp(void **state)
{
	struct ping_request rq = {.peer = 1, .rail = -1, .count = 5, .interval_ms = 1000, .timeout_ms = 2000};
	struct mt *t = *state;
	struct link *l;
	uint32_t rails;
	const char *why = NULL;

	t->peer_feat_off = MESH_FEAT_KEEPALIVE;
	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	drive_to_up(t, l);
	assert_int_equal(ping_start(&t->m, 7, &rq, &rails, &why), -EOPNOTSUPP);
	assert_non_null(strstr(why, "answers no probes"));
	mt_finish(t);
}

/* Keepalives by WRITE (MESH_FEAT_KA_WRITE): rail 0's keepalive is one RDMA WRITE into the peer's
 * mailbox word, no message, every interval (one not completed by the next is a miss); the latest
 * one's completion is the round trip; the peer's word changing in our mailbox is its sign of
 * life, and the timeout runs from the last change. */
static void mesh_keepalive__by_write__word_is_life_completion_is_rtt(void **state)
{
	struct mt *t = *state;
	struct link *l;
	unsigned c0;
	size_t from;
	struct fake_post *p, *q;
	struct xport_event ev;
	uint64_t t0, us0, seen, word = 0;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	drive_to_up(t, l);
	assert_true(l->features & MESH_FEAT_KA_WRITE);
	c0 = conn_id(l->conns[0]);
	t0 = util_now_ms();
	us0 = util_now_us();
	from = t->fx->n_posts;
	tick_at(t, t0);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_SEND, c0), 0);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_WRITE, c0), 1);
	p = fake_post_find(t->fx, from, XPORT_OP_WRITE, c0, 0);
	assert_true(p->raddr == (uintptr_t)t->peer_mb + MESH_KA_OFF);
	assert_int_equal(p->rkey, PEER_RKEY);
	assert_int_equal(p->len, MESH_KA_LEN);
	assert_true(l->metrics.ka_sent[0] == l->ka_seq);
	/* Not completed by the next interval (its ack may queue behind the peer's traffic): the next
	 * write goes all the same, the first counts as a miss. */
	from = t->fx->n_posts;
	us0 = util_now_us();
	tick_at(t, t0 + t->cfg.keepalive_interval_ms + 1);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_WRITE, c0), 1);
	assert_int_equal(l->metrics.ka_misses[0], 1);
	q = fake_post_find(t->fx, from, XPORT_OP_WRITE, c0, 0);
	/* The first one's completion: acknowledged, no round trip (not the latest); the second's: both,
	 * the round trip a sample of rail 0's histogram too. */
	l->rtt_us = UINT64_MAX;
	ev = wc_event(l->conns[0], XPORT_OP_WRITE, p->wr_id, 0);
	deliver(t, &ev);
	assert_true(l->metrics.ka_acked[0] == l->metrics.ka_sent[0] - 1);
	assert_true(l->rtt_us == UINT64_MAX);
	for (uint32_t k = 0; k <= METRICS_RTT_BUCKETS; k++)
		assert_int_equal(l->metrics.rtt[0].n[k], 0);
	ev = wc_event(l->conns[0], XPORT_OP_WRITE, q->wr_id, 0);
	deliver(t, &ev);
	assert_true(l->metrics.ka_acked[0] == l->metrics.ka_sent[0]);
	assert_true(l->rtt_us <= util_now_us() - us0); /* from the post to the completion */
	assert_int_equal(l->metrics.rtt[0].n[metrics_rtt_bucket(l->rtt_us)], 1);
	assert_true(l->metrics.rtt[0].sum_us == l->rtt_us);
	from = t->fx->n_posts;
	tick_at(t, t0 + 2 * t->cfg.keepalive_interval_ms + 2);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_WRITE, c0), 1);
	assert_int_equal(l->metrics.ka_misses[0], 1);
	/* The peer's word: each change is life, silence past the timeout from the last change is not. */
	seen = t0 + t->cfg.keepalive_timeout_ms / 2;
	word = 1;
	memcpy(l->mailbox + MESH_KA_OFF, &word, sizeof(word));
	tick_at(t, seen);
	assert_true(l->last_rx_ms == seen);
	tick_at(t, seen + t->cfg.keepalive_timeout_ms - 1); /* unchanged, but not silent for long enough */
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	tick_at(t, seen + t->cfg.keepalive_timeout_ms + 1);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, mesh_strerror(-MESH_EKEEPALIVE)));
	mt_finish(t);
}

/* An older peer (no MESH_FEAT_KA_WRITE) gets keepalive messages on rail 0, and so does one whose
 * mailbox has no room for the word. */
static void mesh_keepalive__older_peer_or_small_mailbox__messages(void **state)
{
	struct mt *t = *state;
	struct link *l;
	unsigned c0;
	size_t from;
	PeerMsg *m;

	t->peer_feat_off = MESH_FEAT_KA_WRITE;
	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	drive_to_up(t, l);
	assert_false(l->features & MESH_FEAT_KA_WRITE);
	c0 = conn_id(l->conns[0]);
	from = t->fx->n_posts;
	tick_at(t, util_now_ms() + t->cfg.keepalive_interval_ms + 1);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_WRITE, c0), 0);
	m = last_send(t, from, c0);
	assert_int_equal(m->body_case, PEER_MSG__BODY_KEEPALIVE);
	mesh_peer_msg_free(m);
	mt_finish(t);
}

/* A peer that did not announce keepalives never sends them: the link must not time out on silence. */
static void mesh_keepalive__not_agreed__no_timeout_no_keepalive(void **state)
{
	struct mt *t = *state;
	struct link *l;
	size_t from;
	Hello h;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	for (uint32_t i = 0; i < QPS; i++)
		establish_qp(t, l, i);
	from = t->fx->n_posts;
	h = peer_hello(t, l);
	h.features = 0;
	peer_send_hello(t, l, &h);
	run_proof(t, l, from, -1);
	peer_send_ready(t, l, l->epoch);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	assert_true(l->features == 0);
	from = t->fx->n_posts;
	tick_at(t, util_now_ms() + 10ull * t->cfg.keepalive_timeout_ms);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_SEND, 0), 0);
	mt_finish(t);
}

/* meshctl's time in state counts from when the link went DOWN, not from the last re-dial. */
static void mesh_link_state__redials_while_down__time_in_state_kept(void **state)
{
	struct mt *t = *state;
	struct xport_event ev;
	struct link *l;
	uint64_t since;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	since = l->shown_ms;
	assert_int_equal(l->shown, LINK_STATE_DOWN_);
	for (int i = 0; i < 3; i++) {
		tick_at(t, util_now_ms() + 60 * 1000);
		assert_int_equal(l->phase, LINK_QPS);
		ev = cm_event(XPORT_EV_CONNECT_ERROR, l->conns[0], NULL, 0);
		ev.status = -ETIMEDOUT;
		deliver(t, &ev);
		assert_int_equal(link_state(l), LINK_STATE_DOWN_);
		assert_true(l->shown_ms == since);
	}
	/* The peer answers: CONNECTING from now on. */
	tick_at(t, util_now_ms() + 60 * 1000);
	usleep(2000);
	establish_qp(t, l, 0);
	assert_int_equal(l->shown, LINK_STATE_CONNECTING_);
	assert_true(l->shown_ms > since);
	mt_finish(t);
}

/* A late QP of an attempt that already failed must not start an orphan attempt. */
static void mesh_accept__late_qp_of_failed_attempt__rejected_estale(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;
	struct xport_event ev;
	struct link *l;

	mt_init(t, 1, ids0123, 4);
	l = lk(t, 2);
	pd = request_pdata(t, 2, 0, EPOCH);
	expect_accepted(t, request(t, &pd), &pd);
	assert_int_equal(t->m.handshakes, 1);
	ev = cm_event(XPORT_EV_DISCONNECTED, l->conns[0], NULL, 0);
	ev.status = -ECONNRESET;
	deliver(t, &ev);
	assert_int_equal(l->phase, LINK_IDLE);
	assert_int_equal(t->m.handshakes, 0);
	pd = request_pdata(t, 2, 1, EPOCH);
	check_reject(t, &pd, -MESH_ESTALE);
	assert_int_equal(l->phase, LINK_IDLE);
	assert_int_equal(t->m.handshakes, 0);
	/* A new attempt of the peer (newer epoch) is welcome. */
	expect_still_accepting(t, EPOCH + 1);
	mt_finish(t);
}

static void mesh_accept__same_qp_twice__rejected_edupqp(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;
	struct link *l;
	unsigned first, cid;

	mt_init(t, 1, ids0123, 4);
	l = lk(t, 2);
	pd = request_pdata(t, 2, 0, EPOCH);
	first = request(t, &pd);
	expect_accepted(t, first, &pd);
	check_reject(t, &pd, -MESH_EDUPQP);
	/* The first QP 0 stays in place and QP 1 joins. */
	assert_int_equal(conn_id(l->conns[0]), first);
	assert_false(fake_disconnected(t->fx, first));
	pd = request_pdata(t, 2, 1, EPOCH);
	cid = request(t, &pd);
	expect_accepted(t, cid, &pd);
	assert_int_equal(l->phase, LINK_QPS);
	mt_finish(t);
}

static void mesh_accept__same_epoch_after_qps_connected__rejected_edupqp(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;
	struct link *l;

	mt_init(t, 1, ids0123, 4);
	l = lk(t, 2);
	for (uint8_t i = 0; i < QPS; i++) {
		pd = request_pdata(t, 2, i, EPOCH);
		expect_accepted(t, request(t, &pd), &pd);
	}
	establish_qp(t, l, 0);
	establish_qp(t, l, 1);
	assert_int_equal(l->phase, LINK_HELLO);
	pd = request_pdata(t, 2, 1, EPOCH);
	check_reject(t, &pd, -MESH_EDUPQP);
	assert_int_equal(l->phase, LINK_HELLO);
	mt_finish(t);
}

static void mesh_accept__higher_epoch__replaces_current_attempt(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;
	struct link *l;
	unsigned old0, new0, new1;

	mt_init(t, 1, ids0123, 4);
	l = lk(t, 2);
	pd = request_pdata(t, 2, 0, EPOCH);
	old0 = request(t, &pd);
	expect_accepted(t, old0, &pd);
	assert_int_equal(t->fx->live_mrs, 1); /* the buffers; the mailbox waits for our Hello */

	pd = request_pdata(t, 2, 0, EPOCH + 5);
	new0 = request(t, &pd);
	expect_accepted(t, new0, &pd);
	/* The old attempt's QP is disconnected and destroyed, its memory deregistered. */
	assert_true(fake_disconnected(t->fx, old0));
	assert_null(fake_conn_by_id(t->fx, old0));
	assert_int_equal(t->fx->live_mrs, 1);
	assert_int_equal(t->fx->n_regs, 2);
	assert_int_equal(t->m.handshakes, 1);
	assert_int_equal(t->m.peer_rejects, 0);
	assert_non_null(strstr(l->last_error, "re-dialled"));
	/* The old epoch is stale now; the new one completes. */
	pd = request_pdata(t, 2, 1, EPOCH);
	check_reject(t, &pd, -MESH_ESTALE);
	pd = request_pdata(t, 2, 1, EPOCH + 5);
	new1 = request(t, &pd);
	expect_accepted(t, new1, &pd);
	assert_int_equal(conn_id(l->conns[0]), new0);
	assert_int_equal(conn_id(l->conns[1]), new1);
	mt_finish(t);
}

static void mesh_accept__higher_epoch_on_up_link__replaces_it(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;
	struct link *l;

	mt_init(t, 1, ids0123, 4);
	l = lk(t, 2);
	for (uint8_t i = 0; i < QPS; i++) {
		pd = request_pdata(t, 2, i, EPOCH);
		expect_accepted(t, request(t, &pd), &pd);
	}
	drive_to_up(t, l);
	/* The peer restarted and dials again. */
	pd = request_pdata(t, 2, 0, EPOCH + 1);
	expect_accepted(t, request(t, &pd), &pd);
	assert_int_equal(link_state(l), LINK_STATE_CONNECTING_);
	assert_int_equal(l->ups, 1);
	assert_int_equal(t->m.handshakes, 1);
	mt_finish(t);
}

static void mesh_accept__stopping__rejected_eshutdown(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;

	mt_init(t, 1, ids0123, 4);
	mesh_stop(&t->m, MESH_ESHUTDOWN);
	pd = request_pdata(t, 2, 0, EPOCH);
	check_reject(t, &pd, -MESH_ESHUTDOWN);
	mt_finish(t);
}

/* ---- admission ------------------------------------------------------------------------------ */

static size_t connects_to(struct mt *t, const char *addr)
{
	size_t n = 0;

	for (size_t i = 0; i < t->fx->n_connects; i++)
		n += !strcmp(t->fx->connects[i].addr, addr);
	return n;
}

/* A dial of ours in its handshake. */
static bool our_attempt(const struct link *l)
{
	return l->dialer && l->phase != LINK_IDLE && l->phase != LINK_UP;
}

/* Our dials in their handshake now (and the mesh counts them alike). */
static uint32_t dials_in_flight(struct mt *t)
{
	uint32_t n = 0;

	for (size_t i = 0; i < t->m.n_links; i++)
		n += our_attempt(t->m.links[i]);
	assert_int_equal(n, t->m.adm.dials);
	return n;
}

/* The first link, in peer order, with a dial of ours in flight; NULL when none. */
static struct link *any_dialling(struct mt *t)
{
	for (size_t i = 0; i < t->m.n_links; i++)
		if (our_attempt(t->m.links[i]))
			return t->m.links[i];
	return NULL;
}

/* The one link of ours in its handshake (NULL when none; two fail the test). */
static struct link *dialling(struct mt *t)
{
	assert_true(dials_in_flight(t) <= 1);
	return any_dialling(t);
}

static struct link *first_dialling(struct mt *t)
{
	struct link *l = any_dialling(t);

	if (!l)
		fail_msg("no dial in flight");
	return l;
}

static void mesh_tick__max_handshakes_1__one_dial_at_a_time_round_the_peers(void **state)
{
	static const uint16_t ids[] = {1, 2, 3, 4};
	struct mt *t = *state;
	struct xport_event ev;
	struct link *a, *b, *c;
	char addr[32];

	mt_init(t, 4, ids, 4);
	t->cfg.max_handshakes = 1; /* the mesh reads its config through the pointer */
	tick(t);
	assert_int_equal(t->fx->n_connects, QPS);
	assert_int_equal(t->m.handshakes, 1);
	/* Nodes start their dials at different peers (here node 4 % 3 links: the second, node 2), so
	 * that a starting cluster does not dial its lowest node all at once. */
	a = dialling(t);
	assert_ptr_equal(a, lk(t, 2));
	tick(t);
	tick(t);
	assert_int_equal(t->fx->n_connects, QPS);

	/* The first attempt fails: the next peer is dialled at once, not on the next tick. */
	ev = cm_event(XPORT_EV_CONNECT_ERROR, a->conns[0], NULL, 0);
	ev.status = -ECONNREFUSED;
	deliver(t, &ev);
	assert_int_equal(link_state(a), LINK_STATE_DOWN_);
	assert_int_equal(t->fx->n_connects, 2 * QPS);
	b = dialling(t);
	assert_non_null(b);
	assert_ptr_not_equal(b, a);
	snprintf(addr, sizeof(addr), "10.0.0.%u", b->peer->id);
	assert_int_equal(connects_to(t, addr), QPS);
	tick(t);
	assert_int_equal(t->fx->n_connects, 2 * QPS);

	/* The second completes: the third peer is dialled at once. */
	drive_to_up(t, b);
	c = dialling(t);
	assert_non_null(c);
	assert_true(c != a && c != b);
	assert_int_equal(t->m.handshakes, 1);
	assert_int_equal(t->fx->n_connects, 3 * QPS);
	mt_finish(t);
}

/* ---- adaptive admission of our dials --------------------------------------------------------- */

static const uint16_t ids1to10[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};

static void mesh_admit__start__four_dials_then_one_more_per_link_up(void **state)
{
	struct mt *t = *state;

	mt_init(t, 10, ids1to10, 10);
	t->cfg.max_handshakes = 8;
	tick(t);
	/* Nine peers to dial, room for eight, but a starting node does not know how fast its
	 * handshakes go: four at first. */
	assert_int_equal(dials_in_flight(t), 4);
	assert_int_equal(t->fx->n_connects, 4 * QPS);
	tick(t);
	assert_int_equal(dials_in_flight(t), 4);
	/* Each attempt that comes UP widens the window by one (slow start) and frees its own place:
	 * two more dials at once, no tick needed. */
	drive_to_up(t, first_dialling(t));
	assert_true(t->m.adm.window > 4.9 && t->m.adm.window < 5.1);
	assert_int_equal(dials_in_flight(t), 5);
	assert_true(t->m.adm.srtt_ms < 1000);
	drive_to_up(t, first_dialling(t));
	assert_int_equal(dials_in_flight(t), 6);
	/* cluster.max_handshakes bounds it however many come UP. */
	while (mesh_links_up(&t->m) < 9) {
		drive_to_up(t, first_dialling(t));
		assert_true(t->m.adm.window <= 8.0);
		assert_true(t->m.handshakes <= 8);
	}
	assert_int_equal(dials_in_flight(t), 0);
	assert_int_equal(t->m.adm.cuts, 0);
	mt_finish(t);
}

static void mesh_admit__handshake_timeouts__window_halved_once_per_burst(void **state)
{
	struct mt *t = *state;
	uint64_t t0;

	mt_init(t, 10, ids1to10, 10);
	t->cfg.max_handshakes = 8;
	tick(t);
	drive_to_up(t, first_dialling(t));
	drive_to_up(t, first_dialling(t));
	drive_to_up(t, first_dialling(t));
	drive_to_up(t, first_dialling(t)); /* window 8: the rest in flight */
	assert_int_equal(dials_in_flight(t), 5);
	assert_true(t->m.adm.window > 7.9);
	/* Every attempt in flight times out in the same tick: one signal, the window halves once. */
	t0 = util_now_ms();
	tick_at(t, t0 + t->cfg.handshake_timeout_ms + 1);
	assert_int_equal(dials_in_flight(t), 0);
	assert_int_equal(t->m.adm.cuts, 1);
	assert_true(t->m.adm.window > 3.9 && t->m.adm.window < 4.1);
	assert_true(t->m.adm.ssthresh > 3.9 && t->m.adm.ssthresh < 4.1);
	/* After the backoff they are dialled again, four at a time now. */
	tick_at(t, t0 + t->cfg.handshake_timeout_ms + t->cfg.backoff_max_ms + 1);
	assert_int_equal(dials_in_flight(t), 4);
	/* Above ssthresh the window grows by 1/window per attempt UP, not by one. */
	drive_to_up(t, first_dialling(t));
	assert_true(t->m.adm.window > 4.2 && t->m.adm.window < 4.3);
	mt_finish(t);
}

/* The peer refuses QP 0 of l's attempt with a mesh reason. */
static void reject_qp0(struct mt *t, struct link *l, int reason)
{
	struct mesh_cm_pdata pd = {.kind = MESH_CM_REJECT, .reason = reason};
	uint8_t buf[XPORT_PDATA_MAX];
	struct xport_event ev;
	int len = mesh_cm_pdata_encode(&pd, buf, sizeof(buf));

	ev = cm_event(XPORT_EV_REJECTED, l->conns[0], buf, (size_t)len);
	ev.status = -ECONNREFUSED;
	deliver(t, &ev);
}

static void mesh_admit__peer_busy__window_halved(void **state)
{
	struct mt *t = *state;
	struct link *l;

	mt_init(t, 10, ids1to10, 10);
	tick(t);
	assert_int_equal(dials_in_flight(t), 4);
	l = first_dialling(t);
	reject_qp0(t, l, -MESH_EBUSY);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_int_equal(t->m.adm.cuts, 1);
	assert_true(t->m.adm.window > 1.9 && t->m.adm.window < 2.1);
	/* The three still in flight exceed the new window: nobody else is dialled until they end. */
	assert_int_equal(dials_in_flight(t), 3);
	tick(t);
	assert_int_equal(dials_in_flight(t), 3);
	/* A refusal that is not about room (another cluster, nobody listening) is no congestion. */
	t->m.adm.last_cut_ms = 0; /* whatever the gap, this is not a cut */
	reject_qp0(t, first_dialling(t), -MESH_ECLUSTER);
	assert_int_equal(t->m.adm.cuts, 1);
	mt_finish(t);
}

static void mesh_admit__slow_attempts__no_answer_deadline_follows_them(void **state)
{
	struct mt *t = *state;
	struct link *l;
	uint64_t t0;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	/* Attempts have been taking 3 s with little spread: a dial with no QP answered after twice the
	 * resolve timeout (400 ms here) is still waited for; after what they take it is given up. */
	t->cfg.handshake_timeout_ms = 60000;
	t->m.adm.srtt_ms = 3000;
	t->m.adm.rttvar_ms = 100;
	tick(t);
	assert_int_equal(l->phase, LINK_QPS);
	t0 = util_now_ms();
	tick_at(t, t0 + 2 * t->cfg.connect_timeout_ms + 1);
	assert_int_equal(l->phase, LINK_QPS);
	tick_at(t, t0 + 3000 + 4 * 100 + 1);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "no answer"));
	mt_finish(t);
}

static void mesh_accept__max_handshakes_reached__rejected_ebusy(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;

	mt_init(t, 1, ids0123, 4);
	t->cfg.max_handshakes = 1;
	expect_still_accepting(t, EPOCH);
	pd = request_pdata(t, 3, 0, EPOCH);
	check_reject(t, &pd, -MESH_EBUSY);
	assert_int_equal(lk(t, 3)->phase, LINK_IDLE);
	/* The link already in its handshake keeps accepting its own QPs. */
	pd = request_pdata(t, 2, 1, EPOCH);
	expect_accepted(t, request(t, &pd), &pd);
	mt_finish(t);
}

/* ---- failures reported by the transport ----------------------------------------------------- */

static void mesh_event__rejected__down_naming_reason(void **state)
{
	struct mt *t = *state;
	struct link *l;
	struct mesh_cm_pdata pd = {
		.kind = MESH_CM_REJECT, .src_node = 1, .dst_node = 2, .reason = -MESH_ECLUSTER,
	};
	uint8_t buf[XPORT_PDATA_MAX];
	int len;
	struct xport_event ev;
	unsigned c0, c1;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	c0 = conn_id(l->conns[0]);
	c1 = conn_id(l->conns[1]);
	len = mesh_cm_pdata_encode(&pd, buf, sizeof(buf));
	ev = cm_event(XPORT_EV_REJECTED, l->conns[0], buf, (size_t)len);
	ev.status = -ECONNREFUSED;
	deliver(t, &ev);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "rejected"));
	assert_non_null(strstr(l->last_error, mesh_strerror(-MESH_ECLUSTER)));
	assert_true(fake_disconnected(t->fx, c0));
	assert_true(fake_disconnected(t->fx, c1));
	assert_int_equal(l->failures, 1);
	assert_int_equal(t->m.handshakes, 0);

	/* A reject without mesh private data: a plain rdma_cm peer or nobody listening. */
	tick_at(t, util_now_ms() + t->cfg.backoff_max_ms + 1);
	assert_int_equal(l->phase, LINK_QPS);
	ev = cm_event(XPORT_EV_REJECTED, l->conns[1], NULL, 0);
	ev.status = -ECONNREFUSED;
	deliver(t, &ev);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "no mesh reason"));
	assert_non_null(strstr(l->last_error, "QP 1"));
	assert_int_equal(l->failures, 2);
	mt_finish(t);
}

static void mesh_event__connect_error__down_naming_cause(void **state)
{
	struct mt *t = *state;
	struct link *l;
	struct xport_event ev;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	ev = cm_event(XPORT_EV_CONNECT_ERROR, l->conns[1], NULL, 0);
	ev.status = -ETIMEDOUT;
	ev.status_str = "route resolution timed out";
	deliver(t, &ev);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "route resolution timed out"));
	assert_non_null(strstr(l->last_error, strerror(ETIMEDOUT)));
	assert_non_null(strstr(l->last_error, "10.0.0.1"));
	assert_int_equal(t->fx->live_conns, 0);
	mt_finish(t);
}

static void mesh_event__disconnected_on_up_link__down(void **state)
{
	struct mt *t = *state;
	struct link *l;
	struct xport_event ev;
	unsigned c0;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	drive_to_up(t, l);
	c0 = conn_id(l->conns[0]);
	ev = cm_event(XPORT_EV_DISCONNECTED, l->conns[1], NULL, 0);
	ev.status = -ECONNRESET;
	deliver(t, &ev);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "QP 1 disconnected"));
	assert_non_null(strstr(l->last_error, strerror(ECONNRESET)));
	assert_true(fake_disconnected(t->fx, c0));
	assert_int_equal(l->ups, 1);
	assert_int_equal(mesh_links_up(&t->m), 0);
	/* A failure after UP starts the backoff from the first step again. */
	assert_int_equal(l->failures, 1);
	mt_finish(t);
}

static void mesh_event__failed_completion__down(void **state)
{
	struct mt *t = *state;
	struct link *l = dial_to_hello(t);
	struct fake_post *p = fake_post_find(t->fx, 0, XPORT_OP_RECV, conn_id(l->conns[0]), 0);
	struct xport_event ev = wc_event(l->conns[0], XPORT_OP_RECV, p->wr_id, 0);

	ev.status = -EIO;
	ev.wc_status = 5;
	ev.status_str = "WR flushed";
	deliver(t, &ev);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "WR flushed"));
	mt_finish(t);
}

static void mesh_event__unknown_wr_id__down(void **state)
{
	struct mt *t = *state;
	struct link *l = dial_to_hello(t);
	struct xport_event ev = wc_event(l->conns[1], XPORT_OP_SEND, 0x7700000001ull, 0);

	deliver(t, &ev);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "unknown wr_id"));
	mt_finish(t);
}

static void mesh_event__detached_conn__ignored(void **state)
{
	struct mt *t = *state;
	struct link *l;
	struct xport_event evs[5];
	char err[LINK_ERR_MAX];
	size_t posts;
	uint32_t failures;
	uint64_t next_dial;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	/* One batch: QP 0 fails, then events for both (now detached) QPs follow before the reap. */
	evs[0] = cm_event(XPORT_EV_CONNECT_ERROR, l->conns[0], NULL, 0);
	evs[0].status = -EHOSTUNREACH;
	evs[1] = cm_event(XPORT_EV_CONNECT_ERROR, l->conns[1], NULL, 0);
	evs[1].status = -ETIMEDOUT;
	evs[2] = cm_event(XPORT_EV_ESTABLISHED, l->conns[1], NULL, 0);
	evs[3] = wc_event(l->conns[0], XPORT_OP_RECV, 1ull << 32, 10);
	evs[4] = cm_event(XPORT_EV_DISCONNECTED, l->conns[0], NULL, 0);
	mesh_handle_event(&t->m, &evs[0]);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_null(evs[1].conn->ctx);
	assert_null(evs[0].conn->ctx);
	snprintf(err, sizeof(err), "%s", l->last_error);
	posts = t->fx->n_posts;
	failures = l->failures;
	next_dial = l->next_dial_ms;
	for (int i = 1; i < 5; i++)
		mesh_handle_event(&t->m, &evs[i]);
	assert_string_equal(l->last_error, err);
	assert_int_equal(l->failures, failures);
	assert_true(l->next_dial_ms == next_dial);
	assert_int_equal(l->phase, LINK_IDLE);
	assert_int_equal(link_qps_established(l), 0);
	assert_int_equal(t->fx->n_posts, posts);
	assert_int_equal(t->fx->n_regs, 0);
	assert_int_equal(t->m.handshakes, 0);
	assert_int_equal(t->fx->live_conns, 2); /* destroyed only by the reap */
	mesh_reap(&t->m);
	assert_int_equal(t->fx->live_conns, 0);
	mt_finish(t);
}

static void mesh_tick__handshake_timeout__down(void **state)
{
	struct mt *t = *state;
	struct link *l;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	establish_qp(t, l, 0);
	tick_at(t, util_now_ms() + t->cfg.handshake_timeout_ms / 2);
	assert_int_equal(l->phase, LINK_QPS);
	tick_at(t, util_now_ms() + t->cfg.handshake_timeout_ms + 1);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, mesh_strerror(-MESH_EHANDSHAKE)));
	assert_non_null(strstr(l->last_error, "QPS"));
	assert_int_equal(t->fx->live_conns, 0);
	mt_finish(t);
}

static void mesh_dial__backoff__grows_to_max(void **state)
{
	struct mt *t = *state;
	struct link *l;
	uint64_t prev_lo = 0;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	for (uint32_t n = 0; n < 6; n++) {
		struct xport_event ev;
		uint64_t before, after, backoff = t->cfg.backoff_initial_ms << n;

		tick_at(t, util_now_ms() + 2 * t->cfg.backoff_max_ms);
		assert_int_equal(l->phase, LINK_QPS);
		ev = cm_event(XPORT_EV_CONNECT_ERROR, l->conns[0], NULL, 0);
		ev.status = -ETIMEDOUT;
		before = util_now_ms();
		deliver(t, &ev);
		after = util_now_ms();
		if (backoff > t->cfg.backoff_max_ms)
			backoff = t->cfg.backoff_max_ms;
		if (l->next_dial_ms < before + backoff / 2 || l->next_dial_ms > after + backoff)
			fail_msg("failure %u: re-dial at +%lld ms, expected %llu..%llu", n + 1,
				 (long long)(l->next_dial_ms - before), (unsigned long long)backoff / 2,
				 (unsigned long long)backoff);
		assert_true(backoff / 2 >= prev_lo);
		prev_lo = backoff / 2;
		assert_int_equal(l->failures, n + 1);
	}
	mt_finish(t);
}

/* ---- transport calls that fail ------------------------------------------------------------- */

static void mesh_dial__first_connect_fails__down_and_rescheduled(void **state)
{
	struct mt *t = *state;
	struct link *l;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	t->fx->fail_connect.err = -ENETUNREACH;
	tick(t);
	assert_int_equal(t->fx->n_connects, 0);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "cannot dial 10.0.0.1:7471"));
	assert_non_null(strstr(l->last_error, strerror(ENETUNREACH)));
	assert_int_equal(t->m.handshakes, 0);
	assert_int_equal(l->failures, 1);
	assert_true(l->next_dial_ms > util_now_ms());
	mt_finish(t);
}

static void mesh_dial__second_connect_fails__first_released(void **state)
{
	struct mt *t = *state;
	struct link *l;
	unsigned c0;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	t->fx->fail_connect.err = -ENETUNREACH;
	t->fx->fail_connect.skip = 1;
	tick(t);
	assert_int_equal(t->fx->n_connects, 1);
	c0 = t->fx->connects[0].conn_id;
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_true(fake_disconnected(t->fx, c0));
	assert_null(fake_conn_by_id(t->fx, c0));
	assert_null(l->conns[0]);
	assert_null(l->conns[1]);
	assert_int_equal(t->fx->live_conns, 0);
	assert_int_equal(t->m.handshakes, 0);
	mt_finish(t);
}

static void mesh_establish__first_registration_fails__down_nothing_leaked(void **state)
{
	struct mt *t = *state;
	struct link *l;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	t->fx->fail_mr_reg.err = -ENOMEM;
	establish_qp(t, l, 0);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "cannot register"));
	assert_int_equal(t->fx->n_regs, 0);
	assert_int_equal(t->fx->live_mrs, 0);
	assert_int_equal(t->fx->live_conns, 0);
	mt_finish(t);
}

static void mesh_establish__mailbox_registration_fails__local_released(void **state)
{
	struct mt *t = *state;
	struct link *l;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	t->fx->fail_mr_reg.err = -ENOMEM;
	t->fx->fail_mr_reg.skip = 1;
	/* The mailbox is registered for our Hello, once every QP is connected (no key here). */
	for (uint32_t i = 0; i < mesh_link_qps(&t->m); i++)
		establish_qp(t, l, i);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "cannot register the mailbox"));
	assert_int_equal(t->fx->n_regs, 1);
	assert_int_equal(t->fx->n_deregs, 1);
	assert_int_equal(t->fx->live_mrs, 0);
	assert_int_equal(t->fx->live_conns, 0);
	mt_finish(t);
}

static void mesh_accept__accept_fails__down_nothing_leaked(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;
	unsigned cid;

	mt_init(t, 1, ids0123, 4);
	t->fx->fail_accept.err = -EIO;
	pd = request_pdata(t, 2, 0, EPOCH);
	cid = request(t, &pd);
	assert_int_equal(t->fx->n_accepts, 0);
	assert_int_equal(link_state(lk(t, 2)), LINK_STATE_DOWN_);
	assert_non_null(strstr(lk(t, 2)->last_error, "cannot accept QP 0"));
	assert_null(fake_conn_by_id(t->fx, cid));
	assert_int_equal(t->fx->live_mrs, 0);
	assert_int_equal(t->m.handshakes, 0);
	expect_still_accepting(t, EPOCH + 1);
	mt_finish(t);
}

static void mesh_establish__hello_send_fails__down(void **state)
{
	struct mt *t = *state;
	struct link *l;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	establish_qp(t, l, 0);
	t->fx->fail_post_send.err = -ENOMEM;
	establish_qp(t, l, 1);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "send Hello"));
	assert_int_equal(t->fx->live_mrs, 0);
	mt_finish(t);
}

static void mesh_establish__bad_accept_pdata__down(void **state)
{
	struct mt *t = *state;
	struct link *l;
	struct mesh_cm_pdata pd;
	uint8_t buf[XPORT_PDATA_MAX];
	struct xport_event ev;
	int len;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	pd = request_pdata(t, 1, 0, l->epoch);
	pd.kind = MESH_CM_ACCEPT;
	pd.src_node = 3; /* answered by the wrong node */
	len = mesh_cm_pdata_encode(&pd, buf, sizeof(buf));
	ev = cm_event(XPORT_EV_ESTABLISHED, l->conns[0], buf, (size_t)len);
	deliver(t, &ev);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "bad accept private data"));
	assert_non_null(strstr(l->last_error, mesh_strerror(-MESH_EPEERMSG)));

	/* An accept from another cluster. */
	tick_at(t, util_now_ms() + t->cfg.backoff_max_ms + 1);
	pd = request_pdata(t, 1, 1, l->epoch);
	pd.kind = MESH_CM_ACCEPT;
	pd.cluster_hash ^= 1;
	len = mesh_cm_pdata_encode(&pd, buf, sizeof(buf));
	ev = cm_event(XPORT_EV_ESTABLISHED, l->conns[1], buf, (size_t)len);
	deliver(t, &ev);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, mesh_strerror(-MESH_ECLUSTER)));
	mt_finish(t);
}

#define T(f) cmocka_unit_test_setup_teardown(f, mt_setup, mt_teardown)

/* ---- rails: failover, sequenced control, rejoin ------------------------------------------------ */

static const uint16_t ids12[] = {1, 2};

/* We are node 2 (the dialler) with two rails of QPS QPs each: QPs 0-1 rail 0, 2-3 rail 1. */
static struct link *rails_up(struct mt *t)
{
	struct link *l;

	t->rails = 2;
	mt_init(t, 2, ids12, 2);
	l = lk(t, 1);
	tick(t);
	drive_to_up(t, l);
	assert_int_equal(l->rails_up, 3u);
	assert_int_equal(l->ctl_rail, 0);
	return l;
}

static void qp_lost(struct mt *t, struct link *l, uint32_t qp)
{
	struct xport_event ev = cm_event(XPORT_EV_DISCONNECTED, l->conns[qp], NULL, 0);

	ev.status = -ECONNRESET;
	deliver(t, &ev);
}

/* The nth SEND on conn cid since from, decoded (free it). */
static PeerMsg *send_on(struct mt *t, size_t from, unsigned cid, size_t nth)
{
	struct fake_post *p = fake_post_find(t->fx, from, XPORT_OP_SEND, cid, nth);
	PeerMsg *m = NULL;
	const char *why;

	if (!p)
		fail_msg("no SEND %zu on conn %u", nth, cid);
	assert_int_equal(mesh_peer_msg_decode(p->sent, p->len, &m, &why), 0);
	return m;
}

/* The acceptor's answer to QP i of a rail's join (gen), as establish_qp for an attempt. */
static void establish_join(struct mt *t, struct link *l, uint32_t i, uint16_t gen)
{
	struct mesh_cm_pdata pd = {
		.kind = MESH_CM_ACCEPT,
		.qp_index = (uint8_t)(i % QPS),
		.qp_count = QPS,
		.rail = (uint8_t)(i / QPS),
		.rail_count = 2,
		.flags = MESH_CM_F_RAIL_JOIN,
		.rail_gen = gen,
		.cluster_hash = mesh_cluster_hash(t->cfg.cluster_name),
		.src_node = l->peer->id,
		.dst_node = t->m.self->id,
		.link_epoch = l->epoch,
		.boot_epoch = 4242,
	};
	uint8_t buf[XPORT_PDATA_MAX];
	int len = mesh_cm_pdata_encode(&pd, buf, sizeof(buf));
	struct xport_event ev = cm_event(XPORT_EV_ESTABLISHED, l->conns[i], buf, (size_t)len);

	deliver(t, &ev);
}

static void peer_rail_msg(struct mt *t, struct link *l, uint32_t qp, PeerMsg__BodyCase k, uint32_t rail, uint32_t gen)
{
	PeerMsg m = PEER_MSG__INIT;
	RailDown d = RAIL_DOWN__INIT;
	RailUp u = RAIL_UP__INIT;

	m.body_case = k;
	if (k == PEER_MSG__BODY_RAIL_DOWN) {
		d.rail = rail;
		d.gen = gen;
		d.reason = -ECONNRESET;
		m.rail_down = &d;
		m.seq = l->ctl_rcvd + 1;
	} else {
		u.rail = rail;
		u.gen = gen;
		u.link_epoch = l->epoch;
		m.rail_up = &u;
	}
	peer_send_on(t, l, qp, &m);
}

/* Ticks at now with rail 0 of the link having just heard the peer (its keepalive timeout is not
 * what these tests are about). */
static void tick_rail0_alive(struct mt *t, struct link *l, uint64_t now)
{
	l->last_rx_ms = l->rail_rx_ms[0] = now;
	tick_at(t, now);
}

/* Rail 1 fails under an UP link: the link stays UP on rail 0, the peer hears RailDown (sequenced) on
 * rail 0, keepalives skip rail 1, and after the backoff the dialler dials rail 1 again (a join of
 * the link's epoch, gen 1), which is UP once both sides sent RailUp on it. A late RailDown about
 * the rail's last incarnation is ignored; one about this one takes it down again. */
static void mesh_rail__rail_lost__link_stays_up_raildown_then_rejoin(void **state)
{
	struct mt *t = *state;
	struct link *l;
	unsigned c0, c2, c3;
	size_t from, nconn;
	struct mesh_cm_pdata pd;
	PeerMsg *m;

	t->peer_feat_off = MESH_FEAT_KA_WRITE; /* rail 0's keepalives as messages, counted below */
	l = rails_up(t);
	c0 = conn_id(l->conns[0]);
	c2 = conn_id(l->conns[2]);
	c3 = conn_id(l->conns[3]);
	from = t->fx->n_posts;

	qp_lost(t, l, 3);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	assert_int_equal(l->rails_up, 1u);
	assert_null(l->conns[2]);
	assert_null(l->conns[3]);
	assert_true(fake_disconnected(t->fx, c2) && fake_disconnected(t->fx, c3));
	assert_true(l->rail_failovers == 1 && t->m.rail_failovers == 1 && t->m.link_flaps == 0);
	assert_non_null(strstr(l->rail_last_error, "rail 1: QP 3 disconnected"));
	m = send_on(t, from, c0, 0);
	assert_int_equal(m->body_case, PEER_MSG__BODY_RAIL_DOWN);
	assert_int_equal(m->rail_down->rail, 1);
	assert_int_equal(m->rail_down->gen, 0);
	assert_true(m->seq == 1);
	mesh_peer_msg_free(m);

	/* Keepalives on rail 0 only; no re-dial before the backoff. */
	nconn = t->fx->n_connects;
	from = t->fx->n_posts;
	tick_at(t, util_now_ms() + 200);
	assert_int_equal(t->fx->n_connects, nconn);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_SEND, c0), 1);
	tick_rail0_alive(t, l, l->rail_next_dial_ms[1]); /* rail 0 hears the peer meanwhile */
	assert_int_equal(t->fx->n_connects, nconn + QPS);
	for (uint32_t i = 0; i < QPS; i++) {
		const struct fake_cm_rec *r = &t->fx->connects[nconn + i];

		pd = decode_pdata(r->pdata, r->pdata_len);
		assert_true(pd.flags & MESH_CM_F_RAIL_JOIN);
		assert_int_equal(pd.rail, 1);
		assert_int_equal(pd.qp_index, i);
		assert_int_equal(pd.rail_gen, 1);
		assert_true(pd.link_epoch == l->epoch);
		assert_string_equal(r->addr, "10.1.0.1");
	}
	assert_int_equal(l->rails_joining, 2u);
	from = t->fx->n_posts;
	establish_join(t, l, 2, 1);
	establish_join(t, l, 3, 1);
	m = send_on(t, from, conn_id(l->conns[2]), 0);
	assert_int_equal(m->body_case, PEER_MSG__BODY_RAIL_UP);
	assert_int_equal(m->rail_up->rail, 1);
	assert_int_equal(m->rail_up->gen, 1);
	assert_true(m->rail_up->link_epoch == l->epoch);
	assert_true(m->seq == 0); /* a rail's own message: not sequenced */
	mesh_peer_msg_free(m);
	assert_int_equal(l->rails_up, 1u);
	peer_rail_msg(t, l, 2, PEER_MSG__BODY_RAIL_UP, 1, 1);
	assert_int_equal(l->rails_up, 3u);
	assert_int_equal(l->rails_joining, 0u);

	/* The peer's RailDown of gen 0 (crossed ours): not about this incarnation. */
	peer_rail_msg(t, l, 0, PEER_MSG__BODY_RAIL_DOWN, 1, 0);
	assert_int_equal(l->rails_up, 3u);
	peer_rail_msg(t, l, 0, PEER_MSG__BODY_RAIL_DOWN, 1, 1);
	assert_int_equal(l->rails_up, 1u);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	assert_true(l->rail_failovers == 2);
	mt_finish(t);
}

/* The dialler's join of a lost rail that gets no answer (its connection requests lost to a cable
 * still cut, which the transport would retry only seconds later) is dropped after a second, not
 * handshake_timeout_ms, and dialled again at once after the backoff with a newer gen; each failure
 * doubles the time the next join may take, up to handshake_timeout_ms. */
static void mesh_rail__join_unanswered__dropped_after_a_second_then_dialled_again(void **state)
{
	struct mt *t = *state;
	struct link *l = rails_up(t);
	struct mesh_cm_pdata pd;
	size_t nconn;
	uint64_t t0;

	qp_lost(t, l, 3);
	assert_int_equal(l->rails_up, 1u);
	nconn = t->fx->n_connects;
	tick_rail0_alive(t, l, l->rail_next_dial_ms[1]);
	assert_int_equal(t->fx->n_connects, nconn + QPS);
	assert_int_equal(l->rails_joining, 2u);
	t0 = l->rail_attempt_ms[1];
	tick_rail0_alive(t, l, t0 + 1000);
	assert_int_equal(l->rails_joining, 2u);
	tick_rail0_alive(t, l, t0 + 1001);
	assert_int_equal(l->rails_joining, 0u);
	assert_int_equal(l->rails_up, 1u);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	assert_non_null(strstr(l->rail_error[1], "not UP"));
	assert_null(l->conns[2]);
	assert_null(l->conns[3]);

	tick_rail0_alive(t, l, l->rail_next_dial_ms[1]);
	assert_int_equal(t->fx->n_connects, nconn + 2 * QPS);
	pd = decode_pdata(t->fx->connects[nconn + QPS].pdata, t->fx->connects[nconn + QPS].pdata_len);
	assert_int_equal(pd.rail_gen, 2);
	t0 = l->rail_attempt_ms[1];
	tick_rail0_alive(t, l, t0 + 1001);
	assert_int_equal(l->rails_joining, 2u); /* the second may take 2 s (the harness's handshake timeout) */
	tick_rail0_alive(t, l, t0 + t->cfg.handshake_timeout_ms + 1);
	assert_int_equal(l->rails_joining, 0u);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	mt_finish(t);
}

/* A link that was UP goes DOWN with its cables cut, and its dialler dials again while they are
 * still cut: the requests of the rail mended last are lost, and the CM would send them again only
 * after 4.3 s. The attempt is given up after a second though rail 0's QPs answered, the next may take
 * two, and none more than four (LINK_REDIAL_MAX_MS), however long the resolve timeout makes a
 * first formation's wait (here 10 s). */
static void mesh_redial__qps_unanswered__given_up_after_a_second_then_two(void **state)
{
	struct mt *t = *state;
	struct link *l = rails_up(t);
	size_t nconn;
	uint64_t t0;

	t->cfg.connect_timeout_ms = 5000;
	t->cfg.handshake_timeout_ms = 60000;
	tick_at(t, util_now_ms() + t->cfg.keepalive_timeout_ms + 100);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	nconn = t->fx->n_connects;
	tick_at(t, l->next_dial_ms);
	assert_int_equal(t->fx->n_connects, nconn + 2 * QPS);
	assert_int_equal(l->phase, LINK_QPS);
	establish_qp(t, l, 0);
	establish_qp(t, l, 1);
	t0 = l->attempt_ms;
	tick_at(t, t0 + 1000);
	assert_int_equal(l->phase, LINK_QPS);
	tick_at(t, t0 + 1001);
	assert_int_equal(l->phase, LINK_IDLE);
	assert_non_null(strstr(l->last_error, "not every QP answered"));
	assert_non_null(strstr(l->down_error, "keepalive")); /* why it went DOWN stays shown */

	tick_at(t, l->next_dial_ms);
	assert_int_equal(l->phase, LINK_QPS);
	t0 = l->attempt_ms;
	tick_at(t, t0 + 1001);
	assert_int_equal(l->phase, LINK_QPS);
	tick_at(t, t0 + 2001);
	assert_int_equal(l->phase, LINK_IDLE);
	assert_non_null(strstr(l->last_error, "no answer"));

	for (int k = 0; k < 3; k++) {
		tick_at(t, l->next_dial_ms);
		assert_int_equal(l->phase, LINK_QPS);
		t0 = l->attempt_ms;
		tick_at(t, t0 + 3999);
		assert_int_equal(l->phase, LINK_QPS);
		tick_at(t, t0 + 4001);
		assert_int_equal(l->phase, LINK_IDLE);
	}
	/* Once a re-dial is answered, the link is UP again and the next DOWN starts from a second. */
	tick_at(t, l->next_dial_ms);
	drive_to_up(t, l);
	assert_int_equal(l->failures, 0);
	mt_finish(t);
}

static void send_eof(struct link *l, uint32_t slot)
{
	PeerMsg m = PEER_MSG__INIT;
	ChannelEof e = CHANNEL_EOF__INIT;

	e.slot = slot;
	e.total = 100;
	m.body_case = PEER_MSG__BODY_CHANNEL_EOF;
	m.channel_eof = &e;
	assert_int_equal(mesh_link_send(l, &m), 0);
}

/* The control rail fails: control moves to rail 1, the messages the peer had not acked go again
 * there first, in order, then the RailDown; what the peer had acked does not. */
static void mesh_rail__control_rail_lost__unacked_sent_again_in_order_on_next_rail(void **state)
{
	struct mt *t = *state;
	struct link *l = rails_up(t);
	unsigned c2 = conn_id(l->conns[2]);
	PeerMsg ack = PEER_MSG__INIT, *m;
	LinkAck a = LINK_ACK__INIT;
	size_t from;

	send_eof(l, 11);
	send_eof(l, 12);
	send_eof(l, 13);
	assert_true(l->ctl_seq == 3);
	ack.body_case = PEER_MSG__BODY_LINK_ACK;
	ack.link_ack = &a;
	ack.ack = 1;
	peer_send_on(t, l, 2, &ack); /* acks may come on any rail */
	assert_true(l->ctl_acked == 1);

	from = t->fx->n_posts;
	qp_lost(t, l, 1);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	assert_int_equal(l->ctl_rail, 1);
	assert_int_equal(fake_post_count(t->fx, from, XPORT_OP_SEND, c2), 3);
	for (size_t i = 0; i < 2; i++) {
		m = send_on(t, from, c2, i);
		assert_int_equal(m->body_case, PEER_MSG__BODY_CHANNEL_EOF);
		assert_int_equal(m->channel_eof->slot, 12 + i);
		assert_true(m->seq == 2 + i);
		mesh_peer_msg_free(m);
	}
	m = send_on(t, from, c2, 2);
	assert_int_equal(m->body_case, PEER_MSG__BODY_RAIL_DOWN);
	assert_true(m->seq == 4);
	mesh_peer_msg_free(m);
	/* New messages follow on rail 1. */
	send_eof(l, 14);
	m = send_on(t, from, c2, 3);
	assert_true(m->seq == 5);
	mesh_peer_msg_free(m);
	/* Losing rail 1 as well is losing the link. */
	qp_lost(t, l, 3);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_true(t->m.link_flaps == 1);
	assert_true(l->ctl_seq == 0 && l->send_unacked == 0);
	mt_finish(t);
}

static void peer_eof_seq(struct mt *t, struct link *l, uint32_t qp, uint64_t seq)
{
	PeerMsg m = PEER_MSG__INIT;
	ChannelEof e = CHANNEL_EOF__INIT;

	e.slot = 9;
	m.body_case = PEER_MSG__BODY_CHANNEL_EOF;
	m.channel_eof = &e;
	m.seq = seq;
	peer_send_on(t, l, qp, &m);
}

/* The peer's control messages: a repeat (sent again after its control failover) is dropped, on any
 * rail; a gap, a sequenced kind without a number or an ack beyond what we sent breaks the link. */
static void mesh_rail__peer_sequence__repeat_dropped_gap_and_bad_ack_fail(void **state)
{
	struct mt *t = *state;
	struct link *l = rails_up(t);
	PeerMsg m = PEER_MSG__INIT;
	LinkAck a = LINK_ACK__INIT;

	peer_eof_seq(t, l, 0, 1);
	assert_true(l->ctl_rcvd == 1);
	peer_eof_seq(t, l, 2, 1);
	peer_eof_seq(t, l, 0, 1);
	assert_true(l->ctl_rcvd == 1);
	peer_eof_seq(t, l, 2, 2);
	assert_true(l->ctl_rcvd == 2);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	peer_eof_seq(t, l, 0, 4);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "sequence number 4, expected 3"));
	mt_finish(t);

	mt_close(t);
	mt_open(t);
	l = rails_up(t);
	peer_eof_seq(t, l, 0, 0);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	mt_finish(t);

	mt_close(t);
	mt_open(t);
	l = rails_up(t);
	m.body_case = PEER_MSG__BODY_LINK_ACK;
	m.link_ack = &a;
	m.ack = 1; /* we sent nothing sequenced yet */
	peer_send(t, l, &m);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_non_null(strstr(l->last_error, "ack 1"));
	mt_finish(t);
}

/* A rail silent past the keepalive timeout fails alone, whichever it is (here rail 0, control). */
static void mesh_rail__rail_silent__only_it_fails(void **state)
{
	struct mt *t = *state;
	struct link *l = rails_up(t);
	PeerMsg ka = PEER_MSG__INIT;
	Keepalive k = KEEPALIVE__INIT;
	uint64_t t0 = util_now_ms();

	ka.body_case = PEER_MSG__BODY_KEEPALIVE;
	ka.keepalive = &k;
	/* Rail 1 hears the peer; rail 0 hears nothing. */
	l->rail_rx_ms[1] = t0 + 400;
	l->last_rx_ms = t0 + 400;
	tick_at(t, t0 + t->cfg.keepalive_timeout_ms + 100);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	assert_int_equal(l->rails_up, 2u);
	assert_int_equal(l->ctl_rail, 1);
	assert_non_null(strstr(l->rail_last_error, "rail 0"));
	assert_non_null(strstr(l->rail_last_error, "keepalive"));
	peer_send_on(t, l, 2, &ka);
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	mt_finish(t);
}

static unsigned request_to(struct mt *t, struct fake_xport *fx, const struct mesh_cm_pdata *pd)
{
	uint8_t buf[XPORT_PDATA_MAX];
	int len = mesh_cm_pdata_encode(pd, buf, sizeof(buf));
	char from[32];
	struct fake_conn *fc;
	struct xport_event ev;
	unsigned id;

	assert_true(len > 0);
	snprintf(from, sizeof(from), "10.%u.0.%u", pd->rail, pd->src_node);
	fc = fake_conn_incoming(fx, from);
	ev = cm_event(XPORT_EV_CONNECT_REQUEST, &fc->base, buf, (size_t)len);
	id = fc->id;
	deliver(t, &ev);
	return id;
}

/* We accept (node 1, node 2 dials): a join for a rail that is still UP here is refused (the peer's
 * RailDown has not arrived); once it is down, the join's QPs are taken and the rail comes back. */
static void mesh_rail__acceptor__join_refused_while_rail_up_taken_after(void **state)
{
	struct mt *t = *state;
	struct mesh_cm_pdata pd;
	struct link *l;
	unsigned id;
	uint64_t epoch = 5000;

	t->rails = 2;
	t->fx1 = fake_xport_new(); /* rail 1's instance: the rail of a request is the instance it came to */
	mt_init(t, 1, ids12, 2);
	l = lk(t, 2);
	for (uint32_t i = 0; i < 2 * QPS; i++) {
		pd = request_pdata(t, 2, (uint8_t)(i % QPS), epoch);
		pd.rail = (uint8_t)(i / QPS);
		pd.rail_count = 2;
		pd.boot_epoch = 4242;
		request_to(t, pd.rail ? t->fx1 : t->fx, &pd);
	}
	drive_to_up(t, l);
	assert_int_equal(l->rails_up, 3u);

	pd = request_pdata(t, 2, 0, epoch);
	pd.rail = 1;
	pd.rail_count = 2;
	pd.boot_epoch = 4242;
	pd.flags = MESH_CM_F_RAIL_JOIN;
	pd.rail_gen = 1;
	id = request_to(t, t->fx1, &pd);
	assert_true(fake_conn_by_id(t->fx1, id) == NULL || fake_conn_by_id(t->fx1, id)->rejected);
	assert_int_equal(l->rails_up, 3u);

	qp_lost(t, l, 2);
	assert_int_equal(l->rails_up, 1u);
	/* A join of another epoch, or of another peer process, is refused. */
	pd.link_epoch = epoch + 1;
	request_to(t, t->fx1, &pd);
	assert_int_equal(l->rails_joining, 0u);
	pd.link_epoch = epoch;
	pd.boot_epoch = 4243;
	request_to(t, t->fx1, &pd);
	assert_int_equal(l->rails_joining, 0u);
	pd.boot_epoch = 4242;
	for (uint32_t i = 0; i < QPS; i++) {
		pd.qp_index = (uint8_t)i;
		request_to(t, t->fx1, &pd);
		assert_non_null(l->conns[QPS + i]);
	}
	assert_int_equal(l->rails_joining, 2u);
	for (uint32_t i = 0; i < QPS; i++) {
		struct xport_event ev = cm_event(XPORT_EV_ESTABLISHED, l->conns[QPS + i], NULL, 0);

		deliver(t, &ev);
	}
	peer_rail_msg(t, l, QPS, PEER_MSG__BODY_RAIL_UP, 1, 1);
	assert_int_equal(l->rails_up, 3u);
	mt_finish(t);
}

/* ---- the locks (struct mesh_locks) ---------------------------------------------------------- */

struct held {
	pthread_mutex_t *m;
	int hold_fd[2]; /* the holder locks, says so on [1] of done_fd, waits for a byte on hold_fd[0] */
	int done_fd[2];
};

static void *hold_lock(void *arg)
{
	struct held *h = arg;
	char c = 0;

	pthread_mutex_lock(h->m);
	assert_int_equal(write(h->done_fd[1], &c, 1), 1);
	assert_int_equal(read(h->hold_fd[0], &c, 1), 1);
	pthread_mutex_unlock(h->m);
	return NULL;
}

/* Whether m, held by another thread, refuses an unlock from this one: a mutex with priority
 * inheritance knows its owner (the kernel must, to lend it the waiter's priority) and says EPERM;
 * glibc's plain mutex would let this thread unlock it. */
static bool knows_its_owner(pthread_mutex_t *m)
{
	struct held h = {.m = m};
	pthread_t t;
	char c = 0;
	int ret;

	assert_int_equal(pipe(h.hold_fd), 0);
	assert_int_equal(pipe(h.done_fd), 0);
	assert_int_equal(pthread_create(&t, NULL, hold_lock, &h), 0);
	assert_int_equal(read(h.done_fd[0], &c, 1), 1);
	ret = pthread_mutex_unlock(m);
	assert_int_equal(write(h.hold_fd[1], &c, 1), 1);
	assert_int_equal(pthread_join(t, NULL), 0);
	for (int i = 0; i < 2; i++) {
		close(h.hold_fd[i]);
		close(h.done_fd[i]);
	}
	return ret == EPERM;
}

/* The control-socket thread runs at SCHED_FIFO and waits for these locks (mesh_lock_all_by),
 * which normal threads hold: each one lends the waiter's priority to its holder. */
static void mesh_locks_init__every_lock__priority_inheritance(void **state)
{
	struct mesh_locks k;
	pthread_mutex_t plain = PTHREAD_MUTEX_INITIALIZER, pi;
	struct timespec by;

	(void)state;
	assert_false(knows_its_owner(&plain)); /* the check itself tells the two kinds apart */
	assert_int_equal(util_mutex_init_pi(&pi), 0);
	assert_true(knows_its_owner(&pi));
	pthread_mutex_destroy(&pi);
	mesh_locks_init(&k);
	k.n_rails = MESH_RAILS_MAX;
	assert_true(knows_its_owner(&k.ctl));
	for (uint32_t r = 0; r < MESH_RAILS_MAX; r++)
		assert_true(knows_its_owner(&k.rail[r]));
	/* the control socket's timed wait works on them (CLOCK_MONOTONIC: FUTEX_LOCK_PI2) */
	clock_gettime(CLOCK_MONOTONIC, &by);
	by.tv_sec += 5;
	assert_int_equal(mesh_lock_all_by(&k, &by), 0);
	mesh_unlock_all(&k);
	mesh_locks_destroy(&k);
}

/* Transport "auto" (two providers): an attempt nobody answered tries the other provider next, but a
 * link that was UP re-dials its own provider for LINK_XP_STICKY_MS after it went DOWN (its peer
 * meshd restarting refuses connections), and only then alternates. */
static void link_refused(struct mt *t, struct link *l)
{
	struct xport_event ev;

	tick_at(t, util_now_ms() + 60 * 1000);
	assert_int_equal(l->phase, LINK_QPS);
	ev = cm_event(XPORT_EV_CONNECT_ERROR, l->conns[0], NULL, 0);
	ev.status = -ECONNREFUSED;
	deliver(t, &ev);
	assert_int_equal(l->phase, LINK_IDLE);
}

static void mesh_auto__refused_after_up__own_provider_first_then_the_other(void **state)
{
	struct mt *t = *state;
	struct xport_event ev;
	struct link *l;

	t->fx1 = fake_xport_new();
	t->two_providers = true;
	mt_init(t, 2, ids12, 2);
	assert_int_equal(t->m.n_xports, 2);
	l = lk(t, 1);
	/* never UP: each unanswered attempt tries the other provider */
	assert_int_equal(l->xp, 0);
	link_refused(t, l);
	assert_int_equal(l->xp, 1);
	link_refused(t, l);
	assert_int_equal(l->xp, 0);
	/* UP over provider 0, then DOWN */
	tick_at(t, util_now_ms() + 60 * 1000);
	drive_to_up(t, l);
	assert_int_equal(l->phase, LINK_UP);
	ev = cm_event(XPORT_EV_DISCONNECTED, l->conns[0], NULL, 0);
	deliver(t, &ev);
	assert_int_equal(l->phase, LINK_IDLE);
	/* refused again and again within LINK_XP_STICKY_MS: provider 0 each time */
	for (int i = 0; i < 5; i++) {
		link_refused(t, l);
		assert_int_equal(l->xp, 0);
	}
	/* past it: the other provider, and then alternating as before */
	l->down_ms -= LINK_XP_STICKY_MS;
	link_refused(t, l);
	assert_int_equal(l->xp, 1);
	link_refused(t, l);
	assert_int_equal(l->xp, 0);
	mt_finish(t);
}

static const struct CMUnitTest tests[] = {
	cmocka_unit_test(mesh_locks_init__every_lock__priority_inheritance),
	T(mesh_auto__refused_after_up__own_provider_first_then_the_other),
	T(mesh_rail__rail_lost__link_stays_up_raildown_then_rejoin),
	T(mesh_rail__join_unanswered__dropped_after_a_second_then_dialled_again),
	T(mesh_redial__qps_unanswered__given_up_after_a_second_then_two),
	T(mesh_rail__control_rail_lost__unacked_sent_again_in_order_on_next_rail),
	T(mesh_rail__peer_sequence__repeat_dropped_gap_and_bad_ack_fail),
	T(mesh_rail__rail_silent__only_it_fails),
	T(mesh_rail__acceptor__join_refused_while_rail_up_taken_after),
	T(mesh_dials__ids__higher_dials_lower),
	T(mesh_tick__middle_node__dials_lower_only_and_waits_for_higher),
	T(mesh_dial__connects__valid_connect_pdata_per_qp),
	T(mesh_handshake__dialler__up_then_keepalive_timeout_down),
	T(mesh_handshake__dialler_hello_before_last_qp__waits_then_proves),
	T(mesh_handshake__peer_ready_during_proof__up_after_proof),
	T(mesh_proof__read_returns_other_bytes__down_naming_proof),
	T(mesh_proof__second_qp_fails__down),
	T(mesh_hello__wrong_cluster_hash__down),
	T(mesh_hello__wrong_epoch__down),
	T(mesh_hello__wrong_node__down),
	T(mesh_hello__wrong_qp_count__down),
	T(mesh_hello__node_id_out_of_range__down_undecodable),
	T(mesh_hello__twice__down),
	T(mesh_ready__before_hello__down),
	T(mesh_ready__wrong_epoch__down),
	T(mesh_message__garbage__down_undecodable),
	T(mesh_message__longer_than_buffer__down),
	T(mesh_goodbye__on_up_link__down_naming_its_reason),
	T(mesh_stop__up_link__goodbye_sent),
	T(mesh_reconfigure__node_removed__goodbye_says_removed_then_closed_after_grace),
	T(mesh_reconfigure__node_added__lower_id_dialled_and_up_link_untouched),
	T(mesh_reconfigure__node_moved__its_link_reforms_there_at_once),
	T(mesh_accept__valid_request__accepted_with_accept_pdata),
	cmocka_unit_test(log_ratelimit_ok__beyond_burst__refused_and_counted),
	cmocka_unit_test(mesh_ack_timeout__keepalive_timeouts__eighth_of_it_per_attempt),
	T(mesh_accept__200_strangers__every_one_refused_and_counted),
	T(mesh_accept__other_cluster__rejected_ecluster),
	T(mesh_accept__lower_id_dials_higher__rejected_edialrule),
	T(mesh_accept__unknown_node__rejected_eunknownnode),
	T(mesh_accept__wrong_qp_count__rejected_eqpcount),
	T(mesh_accept__other_rail_count__rejected_eqpcount),
	T(mesh_accept__claimed_node_from_other_address__rejected),
	T(mesh_accept__bad_magic__rejected_ebadmagic),
	T(mesh_accept__other_version__rejected_eprotover),
	T(mesh_accept__truncated_pdata__rejected),
	T(mesh_accept__accept_kind_in_request__rejected),
	T(mesh_accept__stale_epoch__rejected_estale),
	T(mesh_keepalive__not_agreed__no_timeout_no_keepalive),
	T(mesh_keepalive__by_write__word_is_life_completion_is_rtt),
	T(mesh_ping__probe_echoed__timed_once_then_lost_then_done),
	T(ping_start__refusals_and_bounds__said),
	T(ping_start__peer_without_keepalives__eopnotsupp),
	T(mesh_keepalive__older_peer_or_small_mailbox__messages),
	T(mesh_link_state__redials_while_down__time_in_state_kept),
	T(mesh_accept__late_qp_of_failed_attempt__rejected_estale),
	T(mesh_accept__same_qp_twice__rejected_edupqp),
	T(mesh_accept__same_epoch_after_qps_connected__rejected_edupqp),
	T(mesh_accept__higher_epoch__replaces_current_attempt),
	T(mesh_accept__higher_epoch_on_up_link__replaces_it),
	T(mesh_accept__stopping__rejected_eshutdown),
	T(mesh_tick__max_handshakes_1__one_dial_at_a_time_round_the_peers),
	T(mesh_admit__start__four_dials_then_one_more_per_link_up),
	T(mesh_admit__handshake_timeouts__window_halved_once_per_burst),
	T(mesh_admit__peer_busy__window_halved),
	T(mesh_admit__slow_attempts__no_answer_deadline_follows_them),
	T(mesh_accept__max_handshakes_reached__rejected_ebusy),
	T(mesh_event__rejected__down_naming_reason),
	T(mesh_event__connect_error__down_naming_cause),
	T(mesh_event__disconnected_on_up_link__down),
	T(mesh_event__failed_completion__down),
	T(mesh_event__unknown_wr_id__down),
	T(mesh_event__detached_conn__ignored),
	T(mesh_tick__handshake_timeout__down),
	T(mesh_dial__backoff__grows_to_max),
	T(mesh_dial__first_connect_fails__down_and_rescheduled),
	T(mesh_dial__second_connect_fails__first_released),
	T(mesh_establish__first_registration_fails__down_nothing_leaked),
	T(mesh_establish__mailbox_registration_fails__local_released),
	T(mesh_accept__accept_fails__down_nothing_leaked),
	T(mesh_establish__hello_send_fails__down),
	T(mesh_establish__bad_accept_pdata__down),
};

static int group_setup(void **state)
{
	(void)state;
	/* Every message is formatted: a bad format argument shows under valgrind/ASan. */
	log_set_level(getenv("MESH_TEST_QUIET") ? LOG_LVL_ERROR : LOG_LVL_DEBUG);
	return 0;
}

UNIT_MAIN("mesh", tests, group_setup, NULL)
