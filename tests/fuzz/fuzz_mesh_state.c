/*
 * Fuzz target, stateful: meshd's link state machine and channels (node/meshd/mesh.c, channel.c)
 * over the fake transport of the unit tests, driven by a sequence of events read from the input.
 * Node 2 of a cluster {1, 2, 3} (it dials node 1, node 3 dials it). The first byte sets up:
 *   bit 0  a cluster key (links prove it before the Hello: the acceptor in its accept, the dialler
 *          with AuthProof; the fuzzed peer makes valid proofs too, with the same key)
 *   bit 1  the link to node 1 is first driven UP by a well-behaved peer (unit-test harness)
 *   bit 2  two rails (sequenced control, rail failover and rail joins)
 *   bit 3  a listener on port 7000 (so the peer's ChannelOpens find someone)
 *   bit 4  the transport has QP paths, so channels are offered application-posted writes
 *          (cluster.app_send, on by default: the peer's ChannelAppQp and the application's AQ
 *          words are then live)
 * then every event is one byte (its kind) and its arguments:
 *   tick (time passes), a connection request (from a node's address, private data built from
 *   fields or raw bytes), a connection event (ESTABLISHED with private data, REJECTED,
 *   CONNECT_ERROR, DISCONNECTED) on a live connection, a peer message into a posted receive (built
 *   from fields: every body, with seq/ack; or raw bytes), a completion of a posted work request
 *   (success or error), an immediate of the data path, a local client's connect, listen or leaving,
 *   or an application writing the AQ words of its ring page (any state, QP number and keys).
 *
 * Whatever the order, meshd must not crash, leak, or break its invariants: handshakes in flight
 * within max_handshakes, a link UP only with every rail's bookkeeping in range; at the end
 * mesh_cleanup leaves no connection and no registration behind (the harness checks). Hostile
 * input is expected to fail links and channels, never the daemon.
 *
 * Run it for hours with tests/fuzz/run.sh SECONDS (libFuzzer, clang); ctest replays its corpus.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <mesh/mesh.h>

#include "channel.h"
#include "fake_xport.h"
#include "fuzz.h"
#include "log.h"
#include "mesh.h"
#include "mesh_harness.h"
#include "util.h"
#include "wire.h"

#define MAX_EVENTS 64

struct in {
	const uint8_t *p;
	size_t n;
};

static uint64_t take(struct in *in, size_t bytes)
{
	uint64_t v = 0;

	for (size_t i = 0; i < bytes; i++) {
		v = v << 8 | (in->n ? *in->p : 0);
		if (in->n) {
			in->p++;
			in->n--;
		}
	}
	return v;
}

#define U8(in) ((uint8_t)take(in, 1))
#define U16(in) ((uint16_t)take(in, 2))
#define U32(in) ((uint32_t)take(in, 4))
#define U64(in) take(in, 8)

static int fuzz_deliver(void *ctx, int fd, int status, const char *why, const struct channel *ch, const int fds[4])
{
	(void)ctx, (void)fd, (void)why, (void)fds;
	/* A reply carries a channel exactly when it reports success. */
	FUZZ_CHECK((status == 0) == (ch != NULL));
	return 0;
}

static void fuzz_watch(void *ctx, struct channel *ch, bool add)
{
	(void)ctx, (void)ch, (void)add;
}

static struct fake_conn *pick_conn(struct mt *t, uint8_t which)
{
	unsigned n = 0;
	struct fake_conn *c;

	for (c = t->fx->conns; c; c = c->next)
		n++;
	if (!n)
		return NULL;
	which %= n;
	for (c = t->fx->conns; which; c = c->next)
		which--;
	return c;
}

/* The oldest receive posted on c that nobody filled yet. */
static struct fake_post *pick_recv(struct mt *t, struct fake_conn *c)
{
	for (size_t i = 0; i < t->fx->n_posts; i++) {
		struct fake_post *p = &t->fx->posts[i];

		if (!p->used && p->conn_id == c->id && (p->op == XPORT_OP_RECV))
			return p;
	}
	return NULL;
}

static struct link *conn_link(struct mt *t, struct fake_conn *c)
{
	for (size_t i = 0; i < t->m.n_links; i++)
		if (c->base.ctx == t->m.links[i])
			return t->m.links[i];
	return NULL;
}

static void ev_request(struct mt *t, struct in *in, bool raw)
{
	uint8_t pdata[XPORT_PDATA_MAX];
	char from[48];
	uint8_t who = U8(in), sel = U8(in);
	uint16_t src = (uint16_t)(1 + who % 4); /* 1..3 configured, 4 not */
	uint32_t rail = sel & 1;
	size_t len;
	struct fake_conn *fc;
	struct xport_event ev;

	if (raw) {
		len = U8(in) % (XPORT_CONNECT_PDATA_MAX + 1);
		for (size_t i = 0; i < len; i++)
			pdata[i] = U8(in);
	} else {
		struct link *l = mesh_link_find(&t->m, src);
		struct mesh_cm_pdata pd = {
			.kind = MESH_CM_CONNECT,
			.qp_index = (uint8_t)(U8(in) % (t->cfg.qps_per_link + 1)),
			.qp_count = (sel & 2) ? (uint8_t)U8(in) : (uint8_t)t->cfg.qps_per_link,
			.rail = (uint8_t)rail,
			.rail_count = (uint8_t)t->m.n_rails,
			.flags = (sel & 4) ? MESH_CM_F_RAIL_JOIN : 0,
			.rail_gen = U8(in),
			.cluster_hash = (sel & 8) ? U32(in) : t->m.cluster_hash,
			.src_node = src,
			.dst_node = (sel & 16) ? U16(in) : t->m.self->id,
			.link_epoch = (sel & 32) ? U64(in) : (l ? l->epoch : 0) + (U8(in) % 3),
			.boot_epoch = (sel & 64) ? U64(in) : 4242,
		};
		int n;

		for (size_t i = 0; i < sizeof(pd.nonce); i += 8) {
			uint64_t v = U64(in);

			memcpy(pd.nonce + i, &v, 8);
		}
		n = mesh_cm_pdata_encode(&pd, pdata, sizeof(pdata));
		if (n < 0)
			return;
		len = (size_t)n;
	}
	/* From the claimed node's address of that rail (mt_init: 10.R.0.ID), or a stranger's. */
	snprintf(from, sizeof(from), (sel & 128) ? "10.9.9.%u:40000" : "10.%u.0.%u:40000", rail, src);
	fc = fake_conn_incoming(t->fx, from);
	ev = cm_event(XPORT_EV_CONNECT_REQUEST, &fc->base, pdata, len);
	deliver(t, &ev);
}

/* What a proof covers, as the peer of link l sees it (the first QP of the attempt, or of rail r's
 * join when join): the peer proves as acceptor when we dialled, as dialler when we accepted. */
static struct auth_transcript peer_transcript(struct mt *t, const struct link *l, bool join, uint32_t r)
{
	r %= MESH_RAILS_MAX;
	return (struct auth_transcript){
		.cluster = t->cfg.cluster_name,
		.dialler_proves = !l->dialer,
		.dialler = l->dialer ? t->m.self->id : l->peer->id,
		.acceptor = l->dialer ? l->peer->id : t->m.self->id,
		.link_epoch = l->epoch,
		.rail = join ? r : 0,
		.gen = join ? l->rail_gen[r] : 0,
		.nonce_dialler = l->dialer ? (join ? l->rail_nonce_ours[r] : l->nonce_ours)
					   : (join ? l->rail_nonce_peer[r] : l->nonce_peer),
		.nonce_acceptor = l->dialer ? NULL : (join ? l->rail_nonce_ours[r] : l->nonce_ours),
	};
}

static void accept_proof(struct mt *t, const struct link *l, struct mesh_cm_pdata *pd)
{
	struct auth_transcript tr = peer_transcript(t, l, pd->flags & MESH_CM_F_RAIL_JOIN, pd->rail);

	tr.nonce_acceptor = pd->nonce;
	if (auth_prove(&t->peer_keys, &tr, pd->mac))
		memset(pd->mac, 0, sizeof(pd->mac));
}

static void ev_cm(struct mt *t, struct in *in)
{
	static const enum xport_ev_type types[] = {XPORT_EV_ESTABLISHED, XPORT_EV_REJECTED, XPORT_EV_CONNECT_ERROR,
						   XPORT_EV_DISCONNECTED};
	struct fake_conn *c = pick_conn(t, U8(in));
	uint8_t sel = U8(in), pdata[XPORT_PDATA_MAX] = {0};
	struct link *l;
	struct xport_event ev;
	size_t len = 0;

	if (!c || !c->base.ctx)
		return;
	l = conn_link(t, c);
	if (types[sel % 4] == XPORT_EV_ESTABLISHED && l && !(sel & 4)) {
		/* The acceptor's answer as a real peer gives it, perhaps with a field changed. */
		struct mesh_cm_pdata pd = {
			.kind = MESH_CM_ACCEPT,
			.qp_index = (uint8_t)(c->base.index % t->cfg.qps_per_link),
			.qp_count = (uint8_t)t->cfg.qps_per_link,
			.rail = (uint8_t)(c->base.index / t->cfg.qps_per_link),
			.rail_count = (uint8_t)t->m.n_rails,
			.flags = (sel & 8) ? MESH_CM_F_RAIL_JOIN : 0,
			.rail_gen = (sel & 8) ? l->rail_gen[(c->base.index / t->cfg.qps_per_link) % MESH_RAILS_MAX] : 0,
			.cluster_hash = t->m.cluster_hash,
			.src_node = (uint16_t)l->peer->id,
			.dst_node = (uint16_t)t->m.self->id,
			.link_epoch = (sel & 16) ? U64(in) : l->epoch,
			.boot_epoch = 4242,
		};
		int n;

		for (size_t i = 0; i < sizeof(pd.nonce); i++)
			pd.nonce[i] = U8(in);
		if (sel & 32) {
			/* The acceptor's proof as a real peer makes it (over our nonce), or bytes. */
			pd.flags |= MESH_CM_F_PROOF;
			if (t->peer_keys.n && !(sel & 64))
				accept_proof(t, l, &pd);
			else
				for (size_t i = 0; i < sizeof(pd.mac); i++)
					pd.mac[i] = U8(in);
		}
		n = mesh_cm_pdata_encode(&pd, pdata, sizeof(pdata));
		len = n > 0 ? (size_t)n : 0;
	} else if (sel & 4) {
		len = U8(in) % (XPORT_PDATA_MAX + 1);
		for (size_t i = 0; i < len; i++)
			pdata[i] = U8(in);
	}
	ev = cm_event(types[sel % 4], &c->base, pdata, len);
	ev.status = types[sel % 4] == XPORT_EV_ESTABLISHED ? 0 : -ECONNRESET;
	deliver(t, &ev);
}

/* The peer's word on the applications' QPs (ChannelAppQp): for one of our channels' slots, or any. */
static void peer_app_qp(struct mt *t, struct in *in, uint8_t flags, ChannelAppQp *aq)
{
	uint8_t b;

	aq->slot = (flags & 1) && t->m.chans->channels ? t->m.chans->channels->slot : U16(in);
	b = U8(in);
	aq->state = b % 8;
	aq->round = (b >> 3) & 3; /* the byte's upper bits: the corpus reads the same bytes as before */
	aq->qpn = (flags & 2) ? U32(in) : U32(in) & 0xffffff;
	aq->psn = (flags & 2) ? U32(in) : U32(in) & 0xffffff;
	aq->rx_addr = U64(in);
	aq->rx_rkey = U32(in);
	aq->dir_addr = U64(in);
	aq->dir_rkey = U32(in);
	aq->pos = (flags & 4) ? U64(in) : U16(in);
}

/* A peer message built from fields: every body the link and channel layers read. */
static int build_msg(struct mt *t, struct link *l, struct in *in, uint8_t *buf, size_t cap)
{
	PeerMsg m = PEER_MSG__INIT;
	Hello h;
	Ready r = READY__INIT;
	Keepalive k = KEEPALIVE__INIT;
	KeepaliveAck ka = KEEPALIVE_ACK__INIT;
	Goodbye g = GOODBYE__INIT;
	ChannelOpen o = CHANNEL_OPEN__INIT;
	ChannelAccept a = CHANNEL_ACCEPT__INIT;
	ChannelReject rj = CHANNEL_REJECT__INIT;
	ChannelEof e = CHANNEL_EOF__INIT;
	ChannelClose cl = CHANNEL_CLOSE__INIT;
	ChannelCloseAck ca = CHANNEL_CLOSE_ACK__INIT;
	ChannelResume rs = CHANNEL_RESUME__INIT;
	RailDown rd = RAIL_DOWN__INIT;
	RailUp ru = RAIL_UP__INIT;
	LinkAck la = LINK_ACK__INIT;
	AuthProof ap = AUTH_PROOF__INIT;
	ChannelAppQp aq = CHANNEL_APP_QP__INIT;
	uint8_t blob[AUTH_MAC_LEN + 8];
	uint8_t sel = U8(in), flags = U8(in);

	switch (sel % 17) {
	case 0:
		h = peer_hello(t, l);
		if (flags & 1)
			h.link_epoch = U64(in);
		if (flags & 2)
			h.qp_count = U8(in);
		if (flags & 4)
			h.features = U64(in);
		if (flags & 8)
			h.mailbox_len = U32(in);
		m.body_case = PEER_MSG__BODY_HELLO;
		m.hello = &h;
		break;
	case 1:
		r.link_epoch = (flags & 1) ? U64(in) : l->epoch;
		m.body_case = PEER_MSG__BODY_READY;
		m.ready = &r;
		break;
	case 2:
		k.seq = U64(in);
		k.sent_us = U64(in);
		m.body_case = PEER_MSG__BODY_KEEPALIVE;
		m.keepalive = &k;
		break;
	case 3:
		ka.seq = (flags & 1) ? U64(in) : l->ka_seq;
		ka.sent_us = U64(in);
		m.body_case = PEER_MSG__BODY_KEEPALIVE_ACK;
		m.keepalive_ack = &ka;
		break;
	case 4:
		g.reason = U32(in);
		m.body_case = PEER_MSG__BODY_GOODBYE;
		m.goodbye = &g;
		break;
	case 5:
		o.slot = U8(in) % 8;
		o.src_port = U16(in);
		o.dst_port = (flags & 1) ? U16(in) : 7000;
		o.ring_size = (flags & 2) ? U64(in) : MESH_RING_MIN << (U8(in) % 4);
		o.qps = U8(in) % 4;
		o.rx_addr = U64(in);
		o.rx_rkey = U32(in);
		o.credit_addr = U64(in);
		o.credit_rkey = U32(in);
		o.rail = U8(in) % 3;
		if (flags & 4) { /* a direct pair: we then write one after our data */
			o.direct_addr = U64(in);
			o.direct_rkey = U32(in);
		}
		m.body_case = PEER_MSG__BODY_CHANNEL_OPEN;
		m.channel_open = &o;
		break;
	case 6:
		a.slot = U8(in) % 8;
		a.peer_slot = U8(in) % 8;
		a.rx_addr = U64(in);
		a.rx_rkey = U32(in);
		a.credit_addr = U64(in);
		a.credit_rkey = U32(in);
		if (flags & 4) {
			a.direct_addr = U64(in);
			a.direct_rkey = U32(in);
		}
		m.body_case = PEER_MSG__BODY_CHANNEL_ACCEPT;
		m.channel_accept = &a;
		break;
	case 7:
		rj.slot = U8(in) % 8;
		rj.reason = (int32_t)U32(in);
		m.body_case = PEER_MSG__BODY_CHANNEL_REJECT;
		m.channel_reject = &rj;
		break;
	case 8:
		e.slot = U8(in) % 8;
		e.total = U64(in);
		m.body_case = PEER_MSG__BODY_CHANNEL_EOF;
		m.channel_eof = &e;
		break;
	case 9:
		cl.slot = U8(in) % 8;
		cl.reason = (int32_t)U32(in);
		cl.chunks = U8(in);
		cl.credits = U8(in);
		m.body_case = PEER_MSG__BODY_CHANNEL_CLOSE;
		m.channel_close = &cl;
		break;
	case 10:
		ca.slot = U8(in) % 8;
		ca.chunks = U8(in);
		ca.credits = U8(in);
		m.body_case = PEER_MSG__BODY_CHANNEL_CLOSE_ACK;
		m.channel_close_ack = &ca;
		break;
	case 11:
		rs.slot = U8(in) % 8;
		rs.peer_slot = U8(in) % 8;
		rs.rx_bytes = U32(in);
		rs.rx_seq = U16(in);
		rs.rx_cons = U32(in);
		rs.eof_known = flags & 1;
		rs.rx_addr = U64(in);
		rs.rx_rkey = U32(in);
		rs.credit_addr = U64(in);
		rs.credit_rkey = U32(in);
		rs.rail = U8(in) % 3;
		if (flags & 4) {
			rs.direct_addr = U64(in);
			rs.direct_rkey = U32(in);
		}
		m.body_case = PEER_MSG__BODY_CHANNEL_RESUME;
		m.channel_resume = &rs;
		break;
	case 12:
		rd.rail = U8(in) % 3;
		rd.gen = U8(in);
		rd.reason = (int32_t)U32(in);
		m.body_case = PEER_MSG__BODY_RAIL_DOWN;
		m.rail_down = &rd;
		break;
	case 13:
		ru.rail = U8(in) % 3;
		ru.gen = U8(in);
		ru.link_epoch = (flags & 1) ? U64(in) : l->epoch;
		m.body_case = PEER_MSG__BODY_RAIL_UP;
		m.rail_up = &ru;
		break;
	case 14:
		if (flags & 8) { /* LinkAck has no fields: the committed corpus keeps its meaning */
			peer_app_qp(t, in, flags, &aq);
			m.body_case = PEER_MSG__BODY_CHANNEL_APP_QP;
			m.channel_app_qp = &aq;
			break;
		}
		m.body_case = PEER_MSG__BODY_LINK_ACK;
		m.link_ack = &la;
		break;
	case 15:
	case 16:
		/* The dialler's proof as a real peer makes it (when we accepted: over both nonces, of
		 * the attempt or of a rail's join), or bytes of any length. */
		ap.mac.data = blob;
		ap.mac.len = AUTH_MAC_LEN;
		if (sel % 17 == 15 && t->peer_keys.n && !l->dialer) {
			struct auth_transcript tr = peer_transcript(t, l, flags & 2, U8(in));

			if (auth_prove(&t->peer_keys, &tr, blob))
				memset(blob, 0, sizeof(blob));
		} else {
			for (size_t i = 0; i < sizeof(blob); i++)
				blob[i] = U8(in);
			if (flags & 1)
				ap.mac.len = U8(in) % sizeof(blob);
		}
		m.body_case = PEER_MSG__BODY_AUTH_PROOF;
		m.auth_proof = &ap;
		break;
	}
	/* Sequenced control: in order (the next the link expects), or any number. */
	if (flags & 0x40)
		m.seq = (flags & 0x80) ? U64(in) : l->ctl_rcvd + 1;
	if (flags & 0x20)
		m.ack = (flags & 0x80) ? U64(in) : l->ctl_seq;
	return mesh_peer_msg_encode(&m, buf, cap);
}

static void ev_peer_msg(struct mt *t, struct in *in, bool raw)
{
	struct fake_conn *c = pick_conn(t, U8(in));
	struct fake_post *p;
	struct link *l;
	struct xport_event ev;
	int len;

	if (!c || !c->base.ctx || !(l = conn_link(t, c)) || !(p = pick_recv(t, c)))
		return;
	if (raw) {
		len = (int)(U16(in) % (p->len + 1));
		for (int i = 0; i < len; i++)
			((uint8_t *)p->buf)[i] = U8(in);
	} else {
		len = build_msg(t, l, in, p->buf, p->len);
		if (len < 0)
			return;
	}
	p->used = true;
	ev = wc_event(&c->base, XPORT_OP_RECV, p->wr_id, (uint32_t)len);
	deliver(t, &ev);
}

/* A completion of a posted send, write or read (success or failure), or an immediate. */
static void ev_completion(struct mt *t, struct in *in, bool imm)
{
	uint16_t which = U16(in);
	uint8_t sel = U8(in);
	struct xport_event ev;

	for (size_t k = 0; k < t->fx->n_posts; k++) {
		struct fake_post *p = &t->fx->posts[(which + k) % t->fx->n_posts];
		struct fake_conn *c = fake_conn_by_id(t->fx, p->conn_id);

		if (p->used || !c || !c->base.ctx || (imm != (p->op == XPORT_OP_RECV)))
			continue;
		p->used = true;
		if (imm) {
			ev = wc_event(&c->base, XPORT_OP_RECV_IMM, p->wr_id, U32(in) % (64u << 10));
			ev.imm = U32(in);
			ev.has_imm = true;
		} else {
			ev = wc_event(&c->base, p->op, p->wr_id, p->len);
			if (sel & 1)
				ev.status = -EIO;
		}
		deliver(t, &ev);
		return;
	}
}

/* An application's words in the AQ area of its ring page (libmesh's aq.c writes them): keys, then a
 * state, any of them hostile; then meshd looks at its rings, as a kick or its poll would make it. */
static void ev_app_aq(struct mt *t, struct in *in, uint8_t sel)
{
	struct channel *ch = t->m.chans->channels;
	struct mesh_ring_aq *q;

	for (uint8_t n = U8(in) % 8; ch && n; n--)
		ch = ch->next;
	if (!ch || !ch->ctrl)
		return;
	q = mesh_ring_aq(ch->ctrl);
	q->qpn = (sel & 32) ? U32(in) : U32(in) & 0xffffff;
	q->psn = U32(in) & 0xffffff;
	q->rx_addr = U64(in);
	q->rx_rkey = U32(in);
	q->dir_addr = U64(in);
	q->dir_rkey = U32(in);
	atomic_store_explicit(&q->app_state, U8(in) % 6, memory_order_release);
	if (sel & 64)
		atomic_store_explicit(&ch->ctrl->tx_prod, ch->ctrl->tx_prod + U16(in), memory_order_release);
	channel_poll(&t->m, ch->rail);
	mesh_reap(&t->m);
}

static void ev_local(struct mt *t, struct in *in, uint8_t kind)
{
	const char *why = NULL;
	uint8_t sel = U8(in);
	int fd = 1000 + sel % 4;
	uint32_t uid = (sel & 4) ? 1000 : 0;

	if (kind == 0)
		channel_connect(&t->m, 1 + U8(in) % 4, U16(in), MESH_RING_MIN << (U8(in) % 4), U8(in) % 4,
				(sel & 16) ? (int)(U8(in) % 4) : -1, -1, (sel & 8) ? (int)(U8(in) % 3) : -1, fd, uid, &why);
	else if (kind == 1)
		channel_listen(&t->m, U16(in), fd, uid, &why);
	else if (sel & 0x80) /* kind 2 either way: the committed corpus keeps most of its meaning */
		ev_app_aq(t, in, sel);
	else
		channel_client_gone(&t->m, fd);
	/* Node 2 is us: a connect to it is a local channel, whose messages meshd delivers to itself
	 * after the batch, as its loop does. */
	channel_local_run(&t->m);
	mesh_reap(&t->m);
}

static void check_invariants(struct mt *t)
{
	uint32_t on_rails = 0, by_id = 0;

	FUZZ_CHECK(t->m.handshakes <= t->cfg.max_handshakes);
	for (size_t i = 0; i < t->m.n_links; i++) {
		const struct link *l = t->m.links[i];

		FUZZ_CHECK(l->ctl_rail < t->m.n_rails);
		FUZZ_CHECK(!(l->rails_up >> t->m.n_rails));
	}
	/* Every channel is on its rail's list, and the rails' lists hold nothing else. */
	for (uint32_t r = 0; r < MESH_RAILS_MAX; r++)
		for (const struct channel *ch = t->m.chans->rail_channels[r]; ch; ch = ch->rail_next) {
			FUZZ_CHECK(ch->rail == r);
			FUZZ_CHECK(++on_rails <= t->m.chans->n_channels);
		}
	FUZZ_CHECK(on_rails == t->m.chans->n_channels);
	/* Every channel is found by its id, in its bucket, and the buckets hold nothing else. */
	for (uint32_t b = 0; b < MESH_CH_BUCKETS; b++)
		for (const struct channel *ch = t->m.chans->ch_by_id[b]; ch; ch = ch->id_next) {
			FUZZ_CHECK(ch->id % MESH_CH_BUCKETS == b);
			FUZZ_CHECK(++by_id <= t->m.chans->n_channels);
		}
	FUZZ_CHECK(by_id == t->m.chans->n_channels);
	for (struct channel *ch = t->m.chans->channels; ch; ch = ch->next)
		FUZZ_CHECK(channel_find(&t->m, ch->id) == ch);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint16_t ids[] = {1, 2, 3};
	static struct mt t __attribute__((aligned(64)));
	struct in in = {data, size};
	uint8_t setup = U8(&in);

	log_set_level(LOG_LVL_ERROR);
	memset(&t, 0, sizeof(t));
	mt_open(&t);
	if (setup & 4)
		t.rails = 2; /* one fake instance serves both rails */
	if (setup & 16)
		snprintf(t.cfg.app_send, sizeof(t.cfg.app_send), "on");
	mt_init(&t, 2, ids, 3);
	t.fx->path_ok = (setup & 16) != 0;
	t.m.chans->ch_ops = (struct channel_ops){.deliver = fuzz_deliver, .watch = fuzz_watch, .ctx = &t};
	if (setup & 1) {
		memset(t.m.keys.key, 0x5a, sizeof(t.m.keys.key));
		t.m.keys.n = 1;
		t.peer_keys = t.m.keys;
	}
	tick(&t);
	if (setup & 2)
		drive_to_up(&t, lk(&t, 1));
	if (setup & 8) {
		const char *why;

		channel_listen(&t.m, 7000, 999, 0, &why);
	}
	for (int n = 0; n < MAX_EVENTS && in.n; n++) {
		/* The fake keeps records of everything: stop before they fill. */
		if (t.fx->n_posts > FAKE_MAX_POSTS - 256 || t.fx->n_connects > FAKE_MAX_RECS - 32 ||
		    t.fx->n_accepts > FAKE_MAX_RECS - 8 || t.fx->n_rejects > FAKE_MAX_RECS - 8 ||
		    t.fx->n_regs > FAKE_MAX_RECS - 32 || t.fx->n_disconnects > FAKE_MAX_RECS - 32)
			break;
		switch (U8(&in) % 12) {
		case 0:
			tick_at(&t, util_now_ms() + U16(&in));
			break;
		case 1:
			ev_request(&t, &in, false);
			break;
		case 2:
			ev_request(&t, &in, true);
			break;
		case 3:
			ev_cm(&t, &in);
			break;
		case 4:
		case 5:
			ev_peer_msg(&t, &in, false);
			break;
		case 6:
			ev_peer_msg(&t, &in, true);
			break;
		case 7:
			ev_completion(&t, &in, false);
			break;
		case 8:
			ev_completion(&t, &in, true);
			break;
		case 9:
			ev_local(&t, &in, 0);
			break;
		case 10:
			ev_local(&t, &in, 1);
			break;
		case 11:
			ev_local(&t, &in, 2);
			break;
		}
		check_invariants(&t);
	}
	mt_finish(&t);
	mt_close(&t);
	return 0;
}
