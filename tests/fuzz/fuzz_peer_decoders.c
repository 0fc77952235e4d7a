/*
 * Fuzz target: the decoders of what other processes send (proto/wire.h). The first input byte
 * picks the decoder, the rest is the message:
 *   0  mesh_peer_msg_decode   a PeerMsg from a peer daemon (Hello, Ready, Keepalive, ...)
 *   1  mesh_cm_pdata_decode   rdma_cm private data of connect, accept and reject
 *   2  mesh_ctl_req_decode    a CtlRequest from a local client
 *   3  mesh_peer_msg_decode   of a PeerMsg built from field values read from the input
 *   4  mesh_ctl_req_decode    of a CtlRequest built the same way
 * (the byte is taken modulo 5, so every input means something).
 *
 * For each decoder: the result is one of the documented codes, the out-parameter is written only
 * on success, a decoded message meets the range guarantees its callers rely on, and its values
 * encode and decode again to the same values (and, for protobuf, encode again to the same bytes).
 * Every decoded message is freed, so LeakSanitizer sees a leak in a decoder's error path.
 *
 * Modes 3 and 4 exist because protobuf-c itself is not instrumented: libFuzzer sees no comparison
 * inside its parser, and a varint in the raw input hides the values from the comparisons in
 * wire.c. Read as fixed-width fields, the values are found by libFuzzer's comparison tracing, and
 * the decoder's verdict is checked both ways: it must accept exactly the values in range.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mesh/mesh.h>

#include "fuzz.h"
#include "ring.h"
#include "wire.h"

enum { SEL_PEER_MSG, SEL_CM_PDATA, SEL_CTL_REQ, SEL_PEER_FIELDS, SEL_CTL_FIELDS, SEL_COUNT };

/* ---- peer messages ------------------------------------------------------------------------- */

static void check_peer_msg_in_range(const PeerMsg *m)
{
	switch (m->body_case) {
	case PEER_MSG__BODY_HELLO: {
		const Hello *h = m->hello;

		FUZZ_CHECK(h != NULL);
		FUZZ_CHECK(h->node_id <= MESH_NODE_ID_MAX);
		FUZZ_CHECK(h->qp_count >= 1 && h->qp_count <= MESH_QPS_PER_LINK_MAX);
		FUZZ_CHECK(h->mailbox_len >= MESH_MAILBOX_MIN);
		FUZZ_CHECK(h->mailbox_addr != 0);
		FUZZ_CHECK(h->mailbox_addr + h->mailbox_len > h->mailbox_addr);
		break;
	}
	case PEER_MSG__BODY_READY:
		FUZZ_CHECK(m->ready != NULL);
		break;
	case PEER_MSG__BODY_KEEPALIVE:
		FUZZ_CHECK(m->keepalive != NULL);
		break;
	case PEER_MSG__BODY_KEEPALIVE_ACK:
		FUZZ_CHECK(m->keepalive_ack != NULL);
		break;
	case PEER_MSG__BODY_GOODBYE:
		FUZZ_CHECK(m->goodbye != NULL);
		break;
	case PEER_MSG__BODY_CHANNEL_OPEN: {
		const ChannelOpen *o = m->channel_open;

		FUZZ_CHECK(o != NULL);
		FUZZ_CHECK(o->slot < MESH_CHANNEL_SLOTS && o->src_port <= 65535 && o->dst_port <= 65535);
		FUZZ_CHECK(mesh_ring_size_valid(o->ring_size));
		FUZZ_CHECK(o->qps >= 1 && o->qps <= MESH_QPS_PER_LINK_MAX);
		FUZZ_CHECK(o->rx_addr != 0 && o->rx_addr + o->ring_size >= o->rx_addr);
		FUZZ_CHECK(o->credit_addr != 0 && o->credit_addr + MESH_CREDIT_AREA >= o->credit_addr);
		FUZZ_CHECK(!o->direct_rkey || (o->direct_addr && o->direct_addr + MESH_RING_DIRECT_LEN > o->direct_addr));
		break;
	}
	case PEER_MSG__BODY_CHANNEL_ACCEPT:
		FUZZ_CHECK(m->channel_accept != NULL);
		FUZZ_CHECK(m->channel_accept->slot < MESH_CHANNEL_SLOTS && m->channel_accept->peer_slot < MESH_CHANNEL_SLOTS);
		FUZZ_CHECK(m->channel_accept->rx_addr != 0 && m->channel_accept->credit_addr != 0);
		FUZZ_CHECK(!m->channel_accept->direct_rkey || m->channel_accept->direct_addr);
		break;
	case PEER_MSG__BODY_CHANNEL_REJECT:
		FUZZ_CHECK(m->channel_reject != NULL);
		FUZZ_CHECK(m->channel_reject->slot < MESH_CHANNEL_SLOTS && m->channel_reject->reason < 0);
		break;
	case PEER_MSG__BODY_CHANNEL_EOF:
		FUZZ_CHECK(m->channel_eof != NULL && m->channel_eof->slot < MESH_CHANNEL_SLOTS);
		break;
	case PEER_MSG__BODY_CHANNEL_CLOSE:
		FUZZ_CHECK(m->channel_close != NULL);
		FUZZ_CHECK(m->channel_close->slot < MESH_CHANNEL_SLOTS && m->channel_close->reason <= 0);
		break;
	case PEER_MSG__BODY_CHANNEL_CLOSE_ACK:
		FUZZ_CHECK(m->channel_close_ack != NULL && m->channel_close_ack->slot < MESH_CHANNEL_SLOTS);
		break;
	case PEER_MSG__BODY_CHANNEL_RESUME:
		FUZZ_CHECK(m->channel_resume != NULL);
		FUZZ_CHECK(m->channel_resume->slot < MESH_CHANNEL_SLOTS && m->channel_resume->peer_slot < MESH_CHANNEL_SLOTS);
		FUZZ_CHECK(m->channel_resume->rx_seq <= 65535 && m->channel_resume->rx_cons <= m->channel_resume->rx_bytes);
		FUZZ_CHECK(m->channel_resume->rx_addr && m->channel_resume->credit_addr);
		FUZZ_CHECK(m->channel_resume->rail < MESH_RAILS_MAX);
		FUZZ_CHECK(!m->channel_resume->direct_rkey || m->channel_resume->direct_addr);
		break;
	case PEER_MSG__BODY_RAIL_DOWN:
		FUZZ_CHECK(m->rail_down != NULL && m->rail_down->rail < MESH_RAILS_MAX && m->rail_down->gen <= 65535);
		break;
	case PEER_MSG__BODY_RAIL_UP:
		FUZZ_CHECK(m->rail_up != NULL && m->rail_up->rail < MESH_RAILS_MAX && m->rail_up->gen <= 65535);
		break;
	case PEER_MSG__BODY_LINK_ACK:
		FUZZ_CHECK(m->link_ack != NULL);
		break;
	case PEER_MSG__BODY_AUTH_PROOF:
		FUZZ_CHECK(m->auth_proof != NULL && m->auth_proof->mac.len == MESH_AUTH_MAC_LEN);
		break;
	case PEER_MSG__BODY_CHANNEL_APP_QP: {
		const ChannelAppQp *a = m->channel_app_qp;

		FUZZ_CHECK(a != NULL && a->slot < MESH_CHANNEL_SLOTS && a->state >= 1 && a->state <= 6);
		FUZZ_CHECK(a->qpn <= 0xffffff && a->psn <= 0xffffff);
		FUZZ_CHECK(a->state != 1 || (a->rx_addr && a->rx_rkey && a->dir_rkey && a->dir_addr &&
					     a->dir_addr + MESH_RING_DIRECT_LEN > a->dir_addr));
		break;
	}
	default:
		FUZZ_CHECK(!"decoded peer message has no known body");
	}
}

static void check_same_peer_msg(const PeerMsg *a, const PeerMsg *b)
{
	FUZZ_CHECK(a->body_case == b->body_case);
	FUZZ_CHECK(a->seq == b->seq && a->ack == b->ack);
	switch (a->body_case) {
	case PEER_MSG__BODY_HELLO:
		FUZZ_CHECK(a->hello->node_id == b->hello->node_id);
		FUZZ_CHECK(a->hello->cluster_hash == b->hello->cluster_hash);
		FUZZ_CHECK(a->hello->boot_epoch == b->hello->boot_epoch);
		FUZZ_CHECK(a->hello->link_epoch == b->hello->link_epoch);
		FUZZ_CHECK(a->hello->features == b->hello->features);
		FUZZ_CHECK(a->hello->qp_count == b->hello->qp_count);
		FUZZ_CHECK(a->hello->mailbox_addr == b->hello->mailbox_addr);
		FUZZ_CHECK(a->hello->mailbox_len == b->hello->mailbox_len);
		FUZZ_CHECK(a->hello->mailbox_rkey == b->hello->mailbox_rkey);
		break;
	case PEER_MSG__BODY_READY:
		FUZZ_CHECK(a->ready->link_epoch == b->ready->link_epoch);
		break;
	case PEER_MSG__BODY_KEEPALIVE:
		FUZZ_CHECK(a->keepalive->seq == b->keepalive->seq);
		FUZZ_CHECK(a->keepalive->sent_us == b->keepalive->sent_us);
		break;
	case PEER_MSG__BODY_KEEPALIVE_ACK:
		FUZZ_CHECK(a->keepalive_ack->seq == b->keepalive_ack->seq);
		FUZZ_CHECK(a->keepalive_ack->sent_us == b->keepalive_ack->sent_us);
		break;
	case PEER_MSG__BODY_GOODBYE:
		FUZZ_CHECK(a->goodbye->reason == b->goodbye->reason);
		break;
	case PEER_MSG__BODY_CHANNEL_OPEN:
		FUZZ_CHECK(a->channel_open->slot == b->channel_open->slot);
		FUZZ_CHECK(a->channel_open->src_port == b->channel_open->src_port);
		FUZZ_CHECK(a->channel_open->dst_port == b->channel_open->dst_port);
		FUZZ_CHECK(a->channel_open->ring_size == b->channel_open->ring_size);
		FUZZ_CHECK(a->channel_open->qps == b->channel_open->qps);
		FUZZ_CHECK(a->channel_open->rx_addr == b->channel_open->rx_addr);
		FUZZ_CHECK(a->channel_open->rx_rkey == b->channel_open->rx_rkey);
		FUZZ_CHECK(a->channel_open->credit_addr == b->channel_open->credit_addr);
		FUZZ_CHECK(a->channel_open->credit_rkey == b->channel_open->credit_rkey);
		FUZZ_CHECK(a->channel_open->direct_addr == b->channel_open->direct_addr);
		FUZZ_CHECK(a->channel_open->direct_rkey == b->channel_open->direct_rkey);
		break;
	case PEER_MSG__BODY_CHANNEL_ACCEPT:
		FUZZ_CHECK(a->channel_accept->slot == b->channel_accept->slot);
		FUZZ_CHECK(a->channel_accept->peer_slot == b->channel_accept->peer_slot);
		FUZZ_CHECK(a->channel_accept->rx_addr == b->channel_accept->rx_addr);
		FUZZ_CHECK(a->channel_accept->rx_rkey == b->channel_accept->rx_rkey);
		FUZZ_CHECK(a->channel_accept->credit_addr == b->channel_accept->credit_addr);
		FUZZ_CHECK(a->channel_accept->credit_rkey == b->channel_accept->credit_rkey);
		FUZZ_CHECK(a->channel_accept->direct_addr == b->channel_accept->direct_addr);
		FUZZ_CHECK(a->channel_accept->direct_rkey == b->channel_accept->direct_rkey);
		break;
	case PEER_MSG__BODY_CHANNEL_REJECT:
		FUZZ_CHECK(a->channel_reject->slot == b->channel_reject->slot);
		FUZZ_CHECK(a->channel_reject->reason == b->channel_reject->reason);
		break;
	case PEER_MSG__BODY_CHANNEL_EOF:
		FUZZ_CHECK(a->channel_eof->slot == b->channel_eof->slot);
		FUZZ_CHECK(a->channel_eof->total == b->channel_eof->total);
		break;
	case PEER_MSG__BODY_CHANNEL_CLOSE:
		FUZZ_CHECK(a->channel_close->slot == b->channel_close->slot);
		FUZZ_CHECK(a->channel_close->reason == b->channel_close->reason);
		FUZZ_CHECK(a->channel_close->chunks == b->channel_close->chunks);
		FUZZ_CHECK(a->channel_close->credits == b->channel_close->credits);
		break;
	case PEER_MSG__BODY_CHANNEL_CLOSE_ACK:
		FUZZ_CHECK(a->channel_close_ack->slot == b->channel_close_ack->slot);
		FUZZ_CHECK(a->channel_close_ack->chunks == b->channel_close_ack->chunks);
		FUZZ_CHECK(a->channel_close_ack->credits == b->channel_close_ack->credits);
		break;
	case PEER_MSG__BODY_CHANNEL_RESUME: {
		const ChannelResume *x = a->channel_resume, *y = b->channel_resume;

		FUZZ_CHECK(x->slot == y->slot && x->peer_slot == y->peer_slot && x->rx_bytes == y->rx_bytes);
		FUZZ_CHECK(x->rx_seq == y->rx_seq && x->rx_cons == y->rx_cons && x->eof_known == y->eof_known);
		FUZZ_CHECK(x->rx_addr == y->rx_addr && x->rx_rkey == y->rx_rkey && x->credit_addr == y->credit_addr);
		FUZZ_CHECK(x->credit_rkey == y->credit_rkey && x->rail == y->rail);
		FUZZ_CHECK(x->direct_addr == y->direct_addr && x->direct_rkey == y->direct_rkey);
		break;
	}
	case PEER_MSG__BODY_RAIL_DOWN:
		FUZZ_CHECK(a->rail_down->rail == b->rail_down->rail && a->rail_down->gen == b->rail_down->gen);
		FUZZ_CHECK(a->rail_down->reason == b->rail_down->reason);
		break;
	case PEER_MSG__BODY_RAIL_UP:
		FUZZ_CHECK(a->rail_up->rail == b->rail_up->rail && a->rail_up->gen == b->rail_up->gen);
		FUZZ_CHECK(a->rail_up->link_epoch == b->rail_up->link_epoch);
		break;
	case PEER_MSG__BODY_LINK_ACK:
		break;
	case PEER_MSG__BODY_AUTH_PROOF:
		FUZZ_CHECK(a->auth_proof->mac.len == b->auth_proof->mac.len &&
			   !memcmp(a->auth_proof->mac.data, b->auth_proof->mac.data, a->auth_proof->mac.len));
		break;
	case PEER_MSG__BODY_CHANNEL_APP_QP: {
		const ChannelAppQp *x = a->channel_app_qp, *y = b->channel_app_qp;

		FUZZ_CHECK(x->slot == y->slot && x->state == y->state && x->qpn == y->qpn && x->psn == y->psn);
		FUZZ_CHECK(x->rx_addr == y->rx_addr && x->rx_rkey == y->rx_rkey && x->dir_addr == y->dir_addr);
		FUZZ_CHECK(x->dir_rkey == y->dir_rkey && x->pos == y->pos);
		break;
	}
	default:
		FUZZ_CHECK(!"peer message has no known body");
	}
}

/* A PeerMsg with the known fields of another, and none of its unknown fields: the round trip
 * checks the decoder, not how protobuf-c re-encodes what it skipped. (It does not always re-encode
 * that losslessly: a field number 0 written as a two-byte tag, 0x81 0x00, is kept as an unknown
 * field and re-encoded as the one-byte tag 0x01, which protobuf-c's own decoder then refuses.) */
struct peer_msg_copy {
	PeerMsg msg;
	Hello hello;
	Ready ready;
	Keepalive keepalive;
	KeepaliveAck keepalive_ack;
	Goodbye goodbye;
	ChannelOpen channel_open;
	ChannelAccept channel_accept;
	ChannelReject channel_reject;
	ChannelEof channel_eof;
	ChannelClose channel_close;
	ChannelCloseAck channel_close_ack;
	ChannelResume channel_resume;
	RailDown rail_down;
	RailUp rail_up;
	LinkAck link_ack;
	AuthProof auth_proof;
	ChannelAppQp channel_app_qp;
};

static void peer_msg_copy_init(struct peer_msg_copy *c)
{
	*c = (struct peer_msg_copy){
		.msg = PEER_MSG__INIT,
		.hello = HELLO__INIT,
		.ready = READY__INIT,
		.keepalive = KEEPALIVE__INIT,
		.keepalive_ack = KEEPALIVE_ACK__INIT,
		.goodbye = GOODBYE__INIT,
		.channel_open = CHANNEL_OPEN__INIT,
		.channel_accept = CHANNEL_ACCEPT__INIT,
		.channel_reject = CHANNEL_REJECT__INIT,
		.channel_eof = CHANNEL_EOF__INIT,
		.channel_close = CHANNEL_CLOSE__INIT,
		.channel_close_ack = CHANNEL_CLOSE_ACK__INIT,
		.channel_resume = CHANNEL_RESUME__INIT,
		.rail_down = RAIL_DOWN__INIT,
		.rail_up = RAIL_UP__INIT,
		.link_ack = LINK_ACK__INIT,
		.auth_proof = AUTH_PROOF__INIT,
		.channel_app_qp = CHANNEL_APP_QP__INIT,
	};
}

static void peer_msg_copy_values(const PeerMsg *m, struct peer_msg_copy *c)
{
	peer_msg_copy_init(c);
	c->msg.body_case = m->body_case;
	c->msg.seq = m->seq;
	c->msg.ack = m->ack;
	switch (m->body_case) {
	case PEER_MSG__BODY_HELLO:
		c->hello.node_id = m->hello->node_id;
		c->hello.cluster_hash = m->hello->cluster_hash;
		c->hello.boot_epoch = m->hello->boot_epoch;
		c->hello.link_epoch = m->hello->link_epoch;
		c->hello.features = m->hello->features;
		c->hello.qp_count = m->hello->qp_count;
		c->hello.mailbox_addr = m->hello->mailbox_addr;
		c->hello.mailbox_len = m->hello->mailbox_len;
		c->hello.mailbox_rkey = m->hello->mailbox_rkey;
		c->msg.hello = &c->hello;
		break;
	case PEER_MSG__BODY_READY:
		c->ready.link_epoch = m->ready->link_epoch;
		c->msg.ready = &c->ready;
		break;
	case PEER_MSG__BODY_KEEPALIVE:
		c->keepalive.seq = m->keepalive->seq;
		c->keepalive.sent_us = m->keepalive->sent_us;
		c->msg.keepalive = &c->keepalive;
		break;
	case PEER_MSG__BODY_KEEPALIVE_ACK:
		c->keepalive_ack.seq = m->keepalive_ack->seq;
		c->keepalive_ack.sent_us = m->keepalive_ack->sent_us;
		c->msg.keepalive_ack = &c->keepalive_ack;
		break;
	case PEER_MSG__BODY_GOODBYE:
		c->goodbye.reason = m->goodbye->reason;
		c->msg.goodbye = &c->goodbye;
		break;
	case PEER_MSG__BODY_CHANNEL_OPEN:
		c->channel_open.slot = m->channel_open->slot;
		c->channel_open.src_port = m->channel_open->src_port;
		c->channel_open.dst_port = m->channel_open->dst_port;
		c->channel_open.ring_size = m->channel_open->ring_size;
		c->channel_open.qps = m->channel_open->qps;
		c->channel_open.rx_addr = m->channel_open->rx_addr;
		c->channel_open.rx_rkey = m->channel_open->rx_rkey;
		c->channel_open.credit_addr = m->channel_open->credit_addr;
		c->channel_open.credit_rkey = m->channel_open->credit_rkey;
		c->channel_open.direct_addr = m->channel_open->direct_addr;
		c->channel_open.direct_rkey = m->channel_open->direct_rkey;
		c->msg.channel_open = &c->channel_open;
		break;
	case PEER_MSG__BODY_CHANNEL_ACCEPT:
		c->channel_accept.slot = m->channel_accept->slot;
		c->channel_accept.peer_slot = m->channel_accept->peer_slot;
		c->channel_accept.rx_addr = m->channel_accept->rx_addr;
		c->channel_accept.rx_rkey = m->channel_accept->rx_rkey;
		c->channel_accept.credit_addr = m->channel_accept->credit_addr;
		c->channel_accept.credit_rkey = m->channel_accept->credit_rkey;
		c->channel_accept.direct_addr = m->channel_accept->direct_addr;
		c->channel_accept.direct_rkey = m->channel_accept->direct_rkey;
		c->msg.channel_accept = &c->channel_accept;
		break;
	case PEER_MSG__BODY_CHANNEL_REJECT:
		c->channel_reject.slot = m->channel_reject->slot;
		c->channel_reject.reason = m->channel_reject->reason;
		c->msg.channel_reject = &c->channel_reject;
		break;
	case PEER_MSG__BODY_CHANNEL_EOF:
		c->channel_eof.slot = m->channel_eof->slot;
		c->channel_eof.total = m->channel_eof->total;
		c->msg.channel_eof = &c->channel_eof;
		break;
	case PEER_MSG__BODY_CHANNEL_CLOSE:
		c->channel_close.slot = m->channel_close->slot;
		c->channel_close.reason = m->channel_close->reason;
		c->channel_close.chunks = m->channel_close->chunks;
		c->channel_close.credits = m->channel_close->credits;
		c->msg.channel_close = &c->channel_close;
		break;
	case PEER_MSG__BODY_CHANNEL_CLOSE_ACK:
		c->channel_close_ack.slot = m->channel_close_ack->slot;
		c->channel_close_ack.chunks = m->channel_close_ack->chunks;
		c->channel_close_ack.credits = m->channel_close_ack->credits;
		c->msg.channel_close_ack = &c->channel_close_ack;
		break;
	case PEER_MSG__BODY_CHANNEL_RESUME: {
		const ChannelResume *r = m->channel_resume;

		c->channel_resume.slot = r->slot;
		c->channel_resume.peer_slot = r->peer_slot;
		c->channel_resume.rx_bytes = r->rx_bytes;
		c->channel_resume.rx_seq = r->rx_seq;
		c->channel_resume.rx_cons = r->rx_cons;
		c->channel_resume.eof_known = r->eof_known;
		c->channel_resume.rx_addr = r->rx_addr;
		c->channel_resume.rx_rkey = r->rx_rkey;
		c->channel_resume.credit_addr = r->credit_addr;
		c->channel_resume.credit_rkey = r->credit_rkey;
		c->channel_resume.rail = r->rail;
		c->channel_resume.direct_addr = r->direct_addr;
		c->channel_resume.direct_rkey = r->direct_rkey;
		c->msg.channel_resume = &c->channel_resume;
		break;
	}
	case PEER_MSG__BODY_RAIL_DOWN:
		c->rail_down.rail = m->rail_down->rail;
		c->rail_down.gen = m->rail_down->gen;
		c->rail_down.reason = m->rail_down->reason;
		c->msg.rail_down = &c->rail_down;
		break;
	case PEER_MSG__BODY_RAIL_UP:
		c->rail_up.rail = m->rail_up->rail;
		c->rail_up.gen = m->rail_up->gen;
		c->rail_up.link_epoch = m->rail_up->link_epoch;
		c->msg.rail_up = &c->rail_up;
		break;
	case PEER_MSG__BODY_LINK_ACK:
		c->msg.link_ack = &c->link_ack;
		break;
	case PEER_MSG__BODY_AUTH_PROOF:
		c->auth_proof.mac = m->auth_proof->mac;
		c->msg.auth_proof = &c->auth_proof;
		break;
	case PEER_MSG__BODY_CHANNEL_APP_QP:
		c->channel_app_qp.slot = m->channel_app_qp->slot;
		c->channel_app_qp.state = m->channel_app_qp->state;
		c->channel_app_qp.qpn = m->channel_app_qp->qpn;
		c->channel_app_qp.psn = m->channel_app_qp->psn;
		c->channel_app_qp.rx_addr = m->channel_app_qp->rx_addr;
		c->channel_app_qp.rx_rkey = m->channel_app_qp->rx_rkey;
		c->channel_app_qp.dir_addr = m->channel_app_qp->dir_addr;
		c->channel_app_qp.dir_rkey = m->channel_app_qp->dir_rkey;
		c->channel_app_qp.pos = m->channel_app_qp->pos;
		c->msg.channel_app_qp = &c->channel_app_qp;
		break;
	default:
		FUZZ_CHECK(!"peer message has no known body");
	}
}

static void fuzz_peer_msg(const uint8_t *buf, size_t len)
{
	PeerMsg sentinel, *m = &sentinel, *m2 = &sentinel;
	uint8_t out1[MESH_PEER_MSG_MAX], out2[MESH_PEER_MSG_MAX];
	struct peer_msg_copy c;
	const char *why = "unset";
	uint8_t *copy;
	int ret, n1, n2;

	ret = mesh_peer_msg_decode(buf, len, &m, &why);
	if (len > MESH_PEER_MSG_MAX)
		FUZZ_CHECK(ret == -EMSGSIZE);
	if (ret) {
		FUZZ_CHECK(ret == -EMSGSIZE || ret == -EBADMSG || ret == -EPROTO);
		FUZZ_CHECK(why != NULL && why[0] != '\0');
		FUZZ_CHECK(m == &sentinel);
		return;
	}
	FUZZ_CHECK(why == NULL);
	FUZZ_CHECK(m != NULL && m != &sentinel);
	check_peer_msg_in_range(m);

	/* The values accepted encode within the receive buffer size and decode to the same message;
	 * encoding that again gives the same bytes. */
	peer_msg_copy_values(m, &c);
	n1 = mesh_peer_msg_encode(&c.msg, out1, sizeof(out1));
	FUZZ_CHECK(n1 > 0 && (size_t)n1 <= sizeof(out1));
	copy = fuzz_dup(out1, (size_t)n1);
	ret = mesh_peer_msg_decode(copy, (size_t)n1, &m2, &why);
	FUZZ_CHECK(ret == 0);
	check_same_peer_msg(m, m2);
	n2 = mesh_peer_msg_encode(m2, out2, sizeof(out2));
	FUZZ_CHECK(n2 == n1);
	FUZZ_CHECK(memcmp(out1, out2, (size_t)n1) == 0);
	/* One byte too small a buffer is refused, not overrun. */
	FUZZ_CHECK(mesh_peer_msg_encode(m2, out2, (size_t)n1 - 1) == -EMSGSIZE);
	free(copy);
	mesh_peer_msg_free(m2);
	mesh_peer_msg_free(m);
}

/* ---- rdma_cm private data ------------------------------------------------------------------ */

/* What mesh_cm_pdata_decode must return, from the layout in wire.h (offsets of struct
 * mesh_cm_wire: magic 0, version 4, kind 5, qp_index 6, qp_count 7): magic and version are judged
 * on the first 6 bytes, before the length. */
static int cm_pdata_expect(const uint8_t *buf, size_t len)
{
	uint8_t flags;

	if (len < 6)
		return -EBADMSG;
	if (fuzz_be32(buf) != MESH_CM_MAGIC)
		return -MESH_EBADMAGIC;
	if (buf[4] != MESH_CM_VERSION)
		return -MESH_EPROTOVER;
	if (len < sizeof(struct mesh_cm_wire))
		return -EBADMSG;
	if (buf[5] < MESH_CM_CONNECT || buf[5] > MESH_CM_REJECT)
		return -EPROTO;
	if (buf[5] != MESH_CM_REJECT && (buf[7] == 0 || buf[7] > MESH_QPS_PER_LINK_MAX || buf[6] >= buf[7]))
		return -EPROTO;
	/* rail, rail_count (0 from one-rail senders: one rail) */
	{
		size_t r = offsetof(struct mesh_cm_wire, rail), n = offsetof(struct mesh_cm_wire, rail_count);
		unsigned count = buf[n] ? buf[n] : 1;

		if (count > MESH_RAILS_MAX || buf[r] >= count)
			return -EPROTO;
	}
	flags = buf[offsetof(struct mesh_cm_wire, flags)];
	if (flags & ~(MESH_CM_F_RAIL_JOIN | MESH_CM_F_PROOF))
		return -EPROTO;
	if ((flags & MESH_CM_F_PROOF) && (buf[5] != MESH_CM_ACCEPT || len < sizeof(struct mesh_cm_wire) + MESH_AUTH_MAC_LEN))
		return -EPROTO;
	return 0;
}

static void check_same_pdata(const struct mesh_cm_pdata *a, const struct mesh_cm_pdata *b)
{
	FUZZ_CHECK(a->version == b->version);
	FUZZ_CHECK(a->kind == b->kind);
	FUZZ_CHECK(a->qp_index == b->qp_index);
	FUZZ_CHECK(a->qp_count == b->qp_count);
	FUZZ_CHECK(a->rail == b->rail);
	FUZZ_CHECK(a->rail_count == b->rail_count);
	FUZZ_CHECK(a->flags == b->flags && a->rail_gen == b->rail_gen);
	FUZZ_CHECK(a->cluster_hash == b->cluster_hash);
	FUZZ_CHECK(a->src_node == b->src_node);
	FUZZ_CHECK(a->dst_node == b->dst_node);
	FUZZ_CHECK(a->link_epoch == b->link_epoch);
	FUZZ_CHECK(a->boot_epoch == b->boot_epoch);
	FUZZ_CHECK(a->reason == b->reason);
	FUZZ_CHECK(memcmp(a->nonce, b->nonce, sizeof(a->nonce)) == 0);
	if (a->flags & MESH_CM_F_PROOF)
		FUZZ_CHECK(memcmp(a->mac, b->mac, sizeof(a->mac)) == 0);
}

static void fuzz_cm_pdata(const uint8_t *buf, size_t len)
{
	/* Every field of the wire struct comes before its reserved byte, the nonce after it; an accept
	 * with MESH_CM_F_PROOF has the proof after the struct. */
	enum {
		WIRE_LEN = sizeof(struct mesh_cm_wire),
		FIELDS_LEN = offsetof(struct mesh_cm_wire, reserved),
		NONCE_OFF = offsetof(struct mesh_cm_wire, nonce),
		MAX_LEN = WIRE_LEN + MESH_AUTH_MAC_LEN,
	};
	struct mesh_cm_pdata pd, pd2, untouched;
	uint8_t out[MAX_LEN], want[MAX_LEN];
	uint8_t *copy;
	size_t n;
	int ret;

	memset(&pd, 0xa5, sizeof(pd));
	memcpy(&untouched, &pd, sizeof(pd)); /* padding included */
	ret = mesh_cm_pdata_decode(buf, len, &pd);
	FUZZ_CHECK(ret == cm_pdata_expect(buf, len));
	if (ret) {
		FUZZ_CHECK(memcmp(&pd, &untouched, sizeof(pd)) == 0);
		return;
	}
	FUZZ_CHECK(pd.version == MESH_CM_VERSION);
	FUZZ_CHECK(pd.kind >= MESH_CM_CONNECT && pd.kind <= MESH_CM_REJECT);
	if (pd.kind != MESH_CM_REJECT) {
		FUZZ_CHECK(pd.qp_count >= 1 && pd.qp_count <= MESH_QPS_PER_LINK_MAX);
		FUZZ_CHECK(pd.qp_index < pd.qp_count);
	}
	FUZZ_CHECK(pd.rail_count >= 1 && pd.rail_count <= MESH_RAILS_MAX && pd.rail < pd.rail_count);
	FUZZ_CHECK(pd.reason == 0 ||
		   (pd.reason < -MESH_ERRNO_BASE && pd.reason >= -(MESH_ERRNO_BASE + UINT16_MAX)));
	FUZZ_CHECK(!(pd.flags & MESH_CM_F_PROOF) || pd.kind == MESH_CM_ACCEPT);

	/* Encoding gives back every field byte (the reserved byte is written as 0, a rail_count of 0
	 * as the 1 it means), the nonce and the proof, and decodes to the same values. */
	n = WIRE_LEN + ((pd.flags & MESH_CM_F_PROOF) ? MESH_AUTH_MAC_LEN : 0);
	FUZZ_CHECK(mesh_cm_pdata_encode(&pd, out, n - 1) == -ENOSPC);
	FUZZ_CHECK(mesh_cm_pdata_encode(&pd, out, sizeof(out)) == (int)n);
	memcpy(want, buf, n);
	if (!want[offsetof(struct mesh_cm_wire, rail_count)])
		want[offsetof(struct mesh_cm_wire, rail_count)] = 1;
	FUZZ_CHECK(memcmp(out, want, FIELDS_LEN) == 0);
	for (size_t i = FIELDS_LEN; i < NONCE_OFF; i++)
		FUZZ_CHECK(out[i] == 0);
	FUZZ_CHECK(memcmp(out + NONCE_OFF, want + NONCE_OFF, n - NONCE_OFF) == 0);
	copy = fuzz_dup(out, n);
	memset(&pd2, 0x5a, sizeof(pd2));
	FUZZ_CHECK(mesh_cm_pdata_decode(copy, n, &pd2) == 0);
	check_same_pdata(&pd, &pd2);
	free(copy);
}

/* ---- control requests ---------------------------------------------------------------------- */

/* The fuzz target's own reading of ctl.proto's rules for a request meshd accepts. */
static bool ctl_req_in_range(const CtlRequest *r)
{
	switch (r->op) {
	case CTL_OP__CTL_OP_SHOW:
		return r->object == CTL_OBJECT__CTL_OBJECT_LINKS || r->object == CTL_OBJECT__CTL_OBJECT_NODE ||
		       r->object == CTL_OBJECT__CTL_OBJECT_CHANNELS || r->object == CTL_OBJECT__CTL_OBJECT_PORTS ||
		       r->object == CTL_OBJECT__CTL_OBJECT_METRICS; /* any offset: meshd judges it against its text */
	case CTL_OP__CTL_OP_LISTEN:
		return r->port <= 65535;
	case CTL_OP__CTL_OP_CONNECT:
		return r->node <= MESH_NODE_ID_MAX && r->port <= 65535 && r->qps <= MESH_QPS_PER_LINK_MAX &&
		       (r->ring_size == 0 || mesh_ring_size_valid(r->ring_size));
	case CTL_OP__CTL_OP_RELOAD:
		return r->object == CTL_OBJECT__CTL_OBJECT_NODE;
	case CTL_OP__CTL_OP_DRAIN:
		return r->object == CTL_OBJECT__CTL_OBJECT_NODE && r->drain_ms <= MESH_DRAIN_MAX_MS;
	case CTL_OP__CTL_OP_PING:
		return r->node <= MESH_NODE_ID_MAX && r->count >= 1 && r->count <= MESH_PING_COUNT_MAX &&
		       (!r->interval_ms ||
			(r->interval_ms >= MESH_PING_INTERVAL_MIN_MS && r->interval_ms <= MESH_PING_INTERVAL_MAX_MS)) &&
		       r->timeout_ms <= MESH_PING_TIMEOUT_MAX_MS && (!r->has_rail || r->rail < MESH_RAILS_MAX);
	default:
		return false;
	}
}

static void fuzz_ctl_req(const uint8_t *buf, size_t len)
{
	CtlRequest sentinel, *r = &sentinel, *r2 = &sentinel;
	CtlRequest fresh = CTL_REQUEST__INIT;
	const char *why = "unset";
	uint8_t *out1, *out2;
	size_t n1, n2;
	int ret;

	ret = mesh_ctl_req_decode(buf, len, &r, &why);
	if (len > MESH_CTL_REQ_MAX)
		FUZZ_CHECK(ret == -EMSGSIZE);
	if (ret) {
		FUZZ_CHECK(ret == -EMSGSIZE || ret == -EBADMSG || ret == -EPROTO);
		FUZZ_CHECK(why != NULL && why[0] != '\0');
		FUZZ_CHECK(r == &sentinel);
		return;
	}
	FUZZ_CHECK(why == NULL);
	FUZZ_CHECK(r != NULL && r != &sentinel);
	FUZZ_CHECK(r->version == MESH_CTL_VERSION);
	FUZZ_CHECK(ctl_req_in_range(r));

	/* The values, without unknown fields (see peer_msg_copy_values), encode and decode to the
	 * same request, and encode again to the same bytes. */
	fresh.version = r->version;
	fresh.object = r->object;
	fresh.op = r->op;
	fresh.port = r->port;
	fresh.node = r->node;
	fresh.ring_size = r->ring_size;
	fresh.qps = r->qps;
	fresh.has_numa = r->has_numa;
	fresh.numa_node = r->numa_node;
	fresh.drain_ms = r->drain_ms;
	fresh.count = r->count;
	fresh.interval_ms = r->interval_ms;
	fresh.timeout_ms = r->timeout_ms;
	fresh.has_rail = r->has_rail;
	fresh.rail = r->rail;
	n1 = ctl_request__get_packed_size(&fresh);
	FUZZ_CHECK(n1 <= MESH_CTL_REQ_MAX);
	out1 = calloc(n1, 1);
	FUZZ_CHECK(out1 != NULL || n1 == 0);
	FUZZ_CHECK(ctl_request__pack(&fresh, out1) == n1);
	ret = mesh_ctl_req_decode(out1, n1, &r2, &why);
	FUZZ_CHECK(ret == 0);
	FUZZ_CHECK(r2->version == r->version);
	FUZZ_CHECK(r2->object == r->object && r2->op == r->op && r2->port == r->port && r2->node == r->node &&
		   r2->ring_size == r->ring_size && r2->qps == r->qps && r2->drain_ms == r->drain_ms &&
		   r2->count == r->count && r2->interval_ms == r->interval_ms && r2->timeout_ms == r->timeout_ms &&
		   r2->has_rail == r->has_rail && r2->rail == r->rail);
	n2 = ctl_request__get_packed_size(r2);
	FUZZ_CHECK(n2 == n1);
	out2 = calloc(n2, 1);
	FUZZ_CHECK(out2 != NULL || n2 == 0);
	FUZZ_CHECK(ctl_request__pack(r2, out2) == n2);
	FUZZ_CHECK(n1 == 0 || memcmp(out1, out2, n1) == 0);
	free(out2);
	free(out1);
	mesh_ctl_req_free(r2);
	mesh_ctl_req_free(r);
}

/* ---- messages built from field values ------------------------------------------------------ */

/* The next width bytes of the input as a little-endian integer; 0 once the input is used up. */
static uint64_t take(const uint8_t **p, size_t *len, size_t width)
{
	uint64_t v = 0;

	for (size_t i = 0; i < width && *len; i++, (*p)++, (*len)--)
		v |= (uint64_t)**p << (8 * i);
	return v;
}

/* Whether mesh_peer_msg_decode must accept m: the ranges of wire.h and peer.proto. */
static int peer_msg_valid(const PeerMsg *m)
{
	const Hello *h = m->hello;

	switch (m->body_case) {
	case PEER_MSG__BODY_HELLO:
		return h->node_id <= MESH_NODE_ID_MAX && h->qp_count >= 1 &&
		       h->qp_count <= MESH_QPS_PER_LINK_MAX && h->mailbox_len >= MESH_MAILBOX_MIN &&
		       h->mailbox_addr != 0 && h->mailbox_addr <= UINT64_MAX - h->mailbox_len;
	case PEER_MSG__BODY_READY:
	case PEER_MSG__BODY_KEEPALIVE:
	case PEER_MSG__BODY_KEEPALIVE_ACK:
	case PEER_MSG__BODY_GOODBYE:
	case PEER_MSG__BODY_LINK_ACK:
		return 1;
	case PEER_MSG__BODY_RAIL_DOWN:
		return m->rail_down->rail < MESH_RAILS_MAX && m->rail_down->gen <= 65535;
	case PEER_MSG__BODY_RAIL_UP:
		return m->rail_up->rail < MESH_RAILS_MAX && m->rail_up->gen <= 65535;
	default:
		return 0;
	}
}

static void fuzz_peer_fields(const uint8_t *p, size_t len)
{
	static const PeerMsg__BodyCase bodies[] = {
		PEER_MSG__BODY__NOT_SET, PEER_MSG__BODY_HELLO, PEER_MSG__BODY_READY,
		PEER_MSG__BODY_KEEPALIVE, PEER_MSG__BODY_KEEPALIVE_ACK, PEER_MSG__BODY_GOODBYE,
		PEER_MSG__BODY_RAIL_DOWN, PEER_MSG__BODY_RAIL_UP, PEER_MSG__BODY_LINK_ACK,
	};
	PeerMsg sentinel, *m = &sentinel;
	uint8_t out[MESH_PEER_MSG_MAX];
	struct peer_msg_copy c;
	const char *why;
	uint8_t *copy;
	int n, ret;

	peer_msg_copy_init(&c);
	c.msg.body_case = bodies[take(&p, &len, 1) % (sizeof(bodies) / sizeof(bodies[0]))];
	switch (c.msg.body_case) {
	case PEER_MSG__BODY_HELLO:
		c.hello.node_id = (uint32_t)take(&p, &len, 4);
		c.hello.cluster_hash = (uint32_t)take(&p, &len, 4);
		c.hello.boot_epoch = take(&p, &len, 8);
		c.hello.link_epoch = take(&p, &len, 8);
		c.hello.features = take(&p, &len, 8);
		c.hello.qp_count = (uint32_t)take(&p, &len, 4);
		c.hello.mailbox_addr = take(&p, &len, 8);
		c.hello.mailbox_len = (uint32_t)take(&p, &len, 4);
		c.hello.mailbox_rkey = (uint32_t)take(&p, &len, 4);
		c.msg.hello = &c.hello;
		break;
	case PEER_MSG__BODY_READY:
		c.ready.link_epoch = take(&p, &len, 8);
		c.msg.ready = &c.ready;
		break;
	case PEER_MSG__BODY_KEEPALIVE:
		c.keepalive.seq = take(&p, &len, 8);
		c.keepalive.sent_us = take(&p, &len, 8);
		c.msg.keepalive = &c.keepalive;
		break;
	case PEER_MSG__BODY_KEEPALIVE_ACK:
		c.keepalive_ack.seq = take(&p, &len, 8);
		c.keepalive_ack.sent_us = take(&p, &len, 8);
		c.msg.keepalive_ack = &c.keepalive_ack;
		break;
	case PEER_MSG__BODY_GOODBYE:
		c.goodbye.reason = (uint32_t)take(&p, &len, 4);
		c.msg.goodbye = &c.goodbye;
		break;
	case PEER_MSG__BODY_RAIL_DOWN:
		c.rail_down.rail = (uint32_t)take(&p, &len, 1);
		c.rail_down.gen = (uint32_t)take(&p, &len, 4);
		c.rail_down.reason = (int32_t)(uint32_t)take(&p, &len, 4);
		c.msg.rail_down = &c.rail_down;
		break;
	case PEER_MSG__BODY_RAIL_UP:
		c.rail_up.rail = (uint32_t)take(&p, &len, 1);
		c.rail_up.gen = (uint32_t)take(&p, &len, 4);
		c.rail_up.link_epoch = take(&p, &len, 8);
		c.msg.rail_up = &c.rail_up;
		break;
	case PEER_MSG__BODY_LINK_ACK:
		c.msg.link_ack = &c.link_ack;
		break;
	default:
		break;
	}
	c.msg.seq = take(&p, &len, 8);
	c.msg.ack = take(&p, &len, 8);
	n = mesh_peer_msg_encode(&c.msg, out, sizeof(out));
	FUZZ_CHECK(n >= 0);
	copy = fuzz_dup(out, (size_t)n);
	ret = mesh_peer_msg_decode(copy, (size_t)n, &m, &why);
	if (peer_msg_valid(&c.msg)) {
		FUZZ_CHECK(ret == 0);
		check_same_peer_msg(&c.msg, m);
		mesh_peer_msg_free(m);
	} else {
		FUZZ_CHECK(ret == -EPROTO);
		FUZZ_CHECK(m == &sentinel);
	}
	/* And everything the raw mode checks. */
	fuzz_peer_msg(copy, (size_t)n);
	free(copy);
}

static void fuzz_ctl_fields(const uint8_t *p, size_t len)
{
	CtlRequest sentinel, *r = &sentinel;
	CtlRequest req = CTL_REQUEST__INIT;
	const char *why;
	uint8_t *out;
	size_t n;
	int ret;

	req.version = (uint32_t)take(&p, &len, 4);
	req.object = (CtlObject)(int32_t)(uint32_t)take(&p, &len, 4);
	n = ctl_request__get_packed_size(&req);
	out = calloc(n, 1);
	FUZZ_CHECK(out != NULL || n == 0);
	FUZZ_CHECK(ctl_request__pack(&req, out) == n);
	ret = mesh_ctl_req_decode(out, n, &r, &why);
	if (req.version == MESH_CTL_VERSION && ctl_req_in_range(&req)) {
		FUZZ_CHECK(ret == 0);
		FUZZ_CHECK(r->version == req.version && r->object == req.object);
		mesh_ctl_req_free(r);
	} else {
		FUZZ_CHECK(ret == -EPROTO);
		FUZZ_CHECK(r == &sentinel);
	}
	fuzz_ctl_req(out, n);
	free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *buf;

	if (size == 0)
		return 0;
	buf = fuzz_dup(data + 1, size - 1);
	switch (data[0] % SEL_COUNT) {
	case SEL_PEER_MSG:
		fuzz_peer_msg(buf, size - 1);
		break;
	case SEL_CM_PDATA:
		fuzz_cm_pdata(buf, size - 1);
		break;
	case SEL_CTL_REQ:
		fuzz_ctl_req(buf, size - 1);
		break;
	case SEL_PEER_FIELDS:
		fuzz_peer_fields(buf, size - 1);
		break;
	default:
		fuzz_ctl_fields(buf, size - 1);
		break;
	}
	free(buf);
	return 0;
}
