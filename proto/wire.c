#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include <mesh/mesh.h>

#include "ring.h"
#include "wire.h"

int mesh_cm_pdata_encode(const struct mesh_cm_pdata *pd, void *buf, size_t len)
{
	struct mesh_cm_wire w;
	bool proof = pd->flags & MESH_CM_F_PROOF;

	if (len < sizeof(w) + (proof ? MESH_AUTH_MAC_LEN : 0))
		return -ENOSPC;
	memset(&w, 0, sizeof(w));
	w.magic = htobe32(MESH_CM_MAGIC);
	w.version = MESH_CM_VERSION;
	w.kind = pd->kind;
	w.qp_index = pd->qp_index;
	w.qp_count = pd->qp_count;
	w.rail = pd->rail;
	w.rail_count = pd->rail_count;
	w.flags = pd->flags;
	w.rail_gen = htobe16(pd->rail_gen);
	w.cluster_hash = htobe32(pd->cluster_hash);
	w.src_node = htobe16(pd->src_node);
	w.dst_node = htobe16(pd->dst_node);
	w.link_epoch = htobe64(pd->link_epoch);
	w.boot_epoch = htobe64(pd->boot_epoch);
	if (pd->reason < 0 && -pd->reason > MESH_ERRNO_BASE && -pd->reason - MESH_ERRNO_BASE <= UINT16_MAX)
		w.reason = htobe16((uint16_t)(-pd->reason - MESH_ERRNO_BASE));
	memcpy(w.nonce, pd->nonce, sizeof(w.nonce));
	memcpy(buf, &w, sizeof(w));
	if (!proof)
		return (int)sizeof(w);
	memcpy((uint8_t *)buf + sizeof(w), pd->mac, MESH_AUTH_MAC_LEN);
	return (int)(sizeof(w) + MESH_AUTH_MAC_LEN);
}

int mesh_cm_pdata_decode(const void *buf, size_t len, struct mesh_cm_pdata *out)
{
	struct mesh_cm_wire w;
	struct mesh_cm_pdata pd;

	if (!buf || len < offsetof(struct mesh_cm_wire, qp_index))
		return -EBADMSG;
	memcpy(&w, buf, offsetof(struct mesh_cm_wire, qp_index));
	if (be32toh(w.magic) != MESH_CM_MAGIC)
		return -MESH_EBADMAGIC;
	if (w.version != MESH_CM_VERSION)
		return -MESH_EPROTOVER;
	if (len < sizeof(w))
		return -EBADMSG;
	memcpy(&w, buf, sizeof(w));
	if (w.kind < MESH_CM_CONNECT || w.kind > MESH_CM_REJECT)
		return -EPROTO;
	if (w.kind != MESH_CM_REJECT &&
	    (w.qp_count == 0 || w.qp_count > MESH_QPS_PER_LINK_MAX || w.qp_index >= w.qp_count))
		return -EPROTO;
	if (!w.rail_count)
		w.rail_count = 1;
	if (w.rail_count > MESH_RAILS_MAX || w.rail >= w.rail_count)
		return -EPROTO;
	if (w.flags & ~(MESH_CM_F_RAIL_JOIN | MESH_CM_F_PROOF))
		return -EPROTO;
	if ((w.flags & MESH_CM_F_PROOF) && (w.kind != MESH_CM_ACCEPT || len < sizeof(w) + MESH_AUTH_MAC_LEN))
		return -EPROTO;
	memset(&pd, 0, sizeof(pd));
	pd.version = w.version;
	pd.kind = w.kind;
	pd.qp_index = w.qp_index;
	pd.qp_count = w.qp_count;
	pd.rail = w.rail;
	pd.rail_count = w.rail_count;
	pd.flags = w.flags;
	pd.rail_gen = be16toh(w.rail_gen);
	pd.cluster_hash = be32toh(w.cluster_hash);
	pd.src_node = be16toh(w.src_node);
	pd.dst_node = be16toh(w.dst_node);
	pd.link_epoch = be64toh(w.link_epoch);
	pd.boot_epoch = be64toh(w.boot_epoch);
	if (w.reason)
		pd.reason = -(MESH_ERRNO_BASE + (int)be16toh(w.reason));
	memcpy(pd.nonce, w.nonce, sizeof(pd.nonce));
	if (w.flags & MESH_CM_F_PROOF)
		memcpy(pd.mac, (const uint8_t *)buf + sizeof(w), MESH_AUTH_MAC_LEN);
	*out = pd;
	return 0;
}

uint32_t mesh_cluster_hash(const char *name)
{
	uint32_t h = 2166136261u;

	for (; *name; name++) {
		h ^= (uint8_t)*name;
		h *= 16777619u;
	}
	return h;
}

int mesh_peer_msg_encode(const PeerMsg *msg, void *buf, size_t len)
{
	size_t n = peer_msg__get_packed_size(msg);

	if (n > len || n > MESH_PEER_MSG_MAX)
		return -EMSGSIZE;
	return (int)peer_msg__pack(msg, buf);
}

/* A channel's direct pair (ring.h): none (key 0), or 16 bytes at a non-zero address. */
static bool direct_ok(uint64_t addr, uint32_t rkey)
{
	return !rkey || (addr && addr + MESH_RING_DIRECT_LEN > addr);
}

static const char *peer_msg_check(const PeerMsg *m)
{
	switch (m->body_case) {
	case PEER_MSG__BODY_HELLO: {
		const Hello *h = m->hello;

		if (h->node_id > MESH_NODE_ID_MAX)
			return "hello.node_id out of range 0..65535";
		if (h->qp_count == 0 || h->qp_count > MESH_QPS_PER_LINK_MAX)
			return "hello.qp_count out of range 1..16";
		if (h->mailbox_len < MESH_MAILBOX_MIN)
			return "hello.mailbox_len below the minimum";
		if (h->mailbox_addr == 0)
			return "hello.mailbox_addr is 0";
		if (h->mailbox_addr + h->mailbox_len < h->mailbox_addr)
			return "hello.mailbox wraps the address space";
		return NULL;
	}
	case PEER_MSG__BODY_READY:
	case PEER_MSG__BODY_KEEPALIVE:
	case PEER_MSG__BODY_KEEPALIVE_ACK:
	case PEER_MSG__BODY_GOODBYE:
		return NULL;
	case PEER_MSG__BODY_CHANNEL_OPEN: {
		const ChannelOpen *o = m->channel_open;

		if (o->slot >= MESH_CHANNEL_SLOTS)
			return "channel_open.slot out of range";
		if (o->src_port > 65535 || o->dst_port > 65535)
			return "channel_open port out of range 0..65535";
		if (!mesh_ring_size_valid(o->ring_size))
			return "channel_open.ring_size is not a power of two in 4 KiB..256 MiB";
		if (o->qps == 0 || o->qps > MESH_QPS_PER_LINK_MAX)
			return "channel_open.qps out of range 1..16";
		if (!o->rx_addr || o->rx_addr + o->ring_size < o->rx_addr || !o->credit_addr || o->credit_addr + MESH_CREDIT_AREA < o->credit_addr)
			return "channel_open: bad ring or credit address";
		if (!direct_ok(o->direct_addr, o->direct_rkey))
			return "channel_open: bad direct pair address";
		return NULL;
	}
	case PEER_MSG__BODY_CHANNEL_ACCEPT: {
		const ChannelAccept *a = m->channel_accept;

		if (a->slot >= MESH_CHANNEL_SLOTS || a->peer_slot >= MESH_CHANNEL_SLOTS)
			return "channel_accept slot out of range";
		if (!a->rx_addr || !a->credit_addr || a->credit_addr + MESH_CREDIT_AREA < a->credit_addr)
			return "channel_accept: bad ring or credit address";
		if (!direct_ok(a->direct_addr, a->direct_rkey))
			return "channel_accept: bad direct pair address";
		return NULL;
	}
	case PEER_MSG__BODY_CHANNEL_REJECT:
		if (m->channel_reject->slot >= MESH_CHANNEL_SLOTS || m->channel_reject->reason >= 0)
			return "channel_reject: bad slot or a reason that is not a negative errno";
		return NULL;
	case PEER_MSG__BODY_CHANNEL_EOF:
		return m->channel_eof->slot >= MESH_CHANNEL_SLOTS ? "channel_eof.slot out of range" : NULL;
	case PEER_MSG__BODY_CHANNEL_CLOSE:
		if (m->channel_close->slot >= MESH_CHANNEL_SLOTS || m->channel_close->reason > 0)
			return "channel_close: bad slot or a positive reason";
		return NULL;
	case PEER_MSG__BODY_CHANNEL_CLOSE_ACK:
		return m->channel_close_ack->slot >= MESH_CHANNEL_SLOTS ? "channel_close_ack.slot out of range" : NULL;
	case PEER_MSG__BODY_CHANNEL_RESUME: {
		const ChannelResume *r = m->channel_resume;

		if (r->slot >= MESH_CHANNEL_SLOTS || r->peer_slot >= MESH_CHANNEL_SLOTS)
			return "channel_resume slot out of range";
		if (r->rx_seq > 65535)
			return "channel_resume.rx_seq out of range 0..65535";
		if (r->rx_cons > r->rx_bytes)
			return "channel_resume.rx_cons beyond rx_bytes";
		if (!r->rx_addr || !r->credit_addr || r->credit_addr + MESH_CREDIT_AREA < r->credit_addr)
			return "channel_resume: bad ring or credit address";
		if (r->rail >= MESH_RAILS_MAX)
			return "channel_resume.rail out of range";
		if (!direct_ok(r->direct_addr, r->direct_rkey))
			return "channel_resume: bad direct pair address";
		return NULL;
	}
	case PEER_MSG__BODY_RAIL_DOWN:
		return m->rail_down->rail >= MESH_RAILS_MAX || m->rail_down->gen > 65535 ? "rail_down: rail or gen out of range"
											: NULL;
	case PEER_MSG__BODY_RAIL_UP:
		return m->rail_up->rail >= MESH_RAILS_MAX || m->rail_up->gen > 65535 ? "rail_up: rail or gen out of range" : NULL;
	case PEER_MSG__BODY_LINK_ACK:
		return NULL;
	case PEER_MSG__BODY_AUTH_PROOF:
		return m->auth_proof->mac.len != MESH_AUTH_MAC_LEN ? "auth_proof.mac is not 32 bytes" : NULL;
	case PEER_MSG__BODY_CHANNEL_APP_QP: {
		const ChannelAppQp *a = m->channel_app_qp;

		if (a->slot >= MESH_CHANNEL_SLOTS)
			return "channel_app_qp.slot out of range";
		if (a->state < 1 || a->state > 6)
			return "channel_app_qp.state out of range 1..6";
		if (a->qpn > 0xffffff || a->psn > 0xffffff)
			return "channel_app_qp: QP number or PSN beyond 24 bits";
		if (a->tcp_token.len && a->tcp_token.len != MESH_AQ_TOKEN_LEN)
			return "channel_app_qp.tcp_token is not 16 bytes";
		if (a->tcp_port > 65535)
			return "channel_app_qp.tcp_port beyond 16 bits";
		if (a->state == 1 && a->tcp_token.len) {
			if (!a->tcp_port || a->qpn || a->rx_rkey || a->dir_rkey)
				return "channel_app_qp: a tcp offer without a port, or with QP keys";
			return NULL;
		}
		if (a->state == 1 && (!a->rx_addr || !a->rx_rkey || !direct_ok(a->dir_addr, a->dir_rkey) || !a->dir_rkey))
			return "channel_app_qp: an offer without ring or direct pair keys";
		return NULL;
	}
	default:
		return "message has no known body";
	}
}

int mesh_peer_msg_decode(const void *buf, size_t len, PeerMsg **out, const char **why)
{
	PeerMsg *m;
	const char *bad;

	*why = NULL;
	if (len > MESH_PEER_MSG_MAX) {
		*why = "message longer than 1024 bytes";
		return -EMSGSIZE;
	}
	m = peer_msg__unpack(NULL, len, buf);
	if (!m) {
		*why = "undecodable protobuf";
		return -EBADMSG;
	}
	bad = peer_msg_check(m);
	if (bad) {
		peer_msg__free_unpacked(m, NULL);
		*why = bad;
		return -EPROTO;
	}
	*out = m;
	return 0;
}

void mesh_peer_msg_free(PeerMsg *msg)
{
	if (msg)
		peer_msg__free_unpacked(msg, NULL);
}

_Static_assert(MESH_PING_COUNT_MAX == 10000 && MESH_PING_INTERVAL_MIN_MS == 10 && MESH_PING_INTERVAL_MAX_MS == 60000 &&
		       MESH_PING_TIMEOUT_MAX_MS == 60000 && MESH_RAILS_MAX == 4 && MESH_CONNECT_WAIT_MAX_MS == 86400000,
	       "ctl_req_check's messages name the ping bounds");

static const char *ctl_req_check(const CtlRequest *r)
{
	switch (r->op) {
	case CTL_OP__CTL_OP_SHOW:
		if (r->object != CTL_OBJECT__CTL_OBJECT_LINKS && r->object != CTL_OBJECT__CTL_OBJECT_NODE &&
		    r->object != CTL_OBJECT__CTL_OBJECT_CHANNELS && r->object != CTL_OBJECT__CTL_OBJECT_PORTS &&
		    r->object != CTL_OBJECT__CTL_OBJECT_METRICS)
			return "unknown object";
		return NULL;
	case CTL_OP__CTL_OP_LISTEN:
		return r->port > 65535 ? "port out of range 0..65535" : NULL;
	case CTL_OP__CTL_OP_RELOAD:
		return r->object != CTL_OBJECT__CTL_OBJECT_NODE ? "reload: object must be NODE" : NULL;
	case CTL_OP__CTL_OP_DRAIN:
		if (r->object != CTL_OBJECT__CTL_OBJECT_NODE)
			return "drain: object must be NODE";
		return r->drain_ms > MESH_DRAIN_MAX_MS ? "drain: drain_ms over a day" : NULL;
	case CTL_OP__CTL_OP_PING:
		if (r->node > MESH_NODE_ID_MAX)
			return "ping: node out of range 0..65535";
		if (!r->count || r->count > MESH_PING_COUNT_MAX)
			return "ping: count out of range 1..10000";
		if (r->interval_ms && (r->interval_ms < MESH_PING_INTERVAL_MIN_MS || r->interval_ms > MESH_PING_INTERVAL_MAX_MS))
			return "ping: interval_ms out of range 10..60000";
		if (r->timeout_ms > MESH_PING_TIMEOUT_MAX_MS)
			return "ping: timeout_ms out of range 1..60000";
		if (r->has_rail && r->rail >= MESH_RAILS_MAX)
			return "ping: rail out of range 0..3";
		return NULL;
	case CTL_OP__CTL_OP_CONNECT:
		if (r->node > MESH_NODE_ID_MAX)
			return "node out of range 0..65535";
		if (r->port > 65535)
			return "port out of range 0..65535";
		if (r->ring_size && !mesh_ring_size_valid(r->ring_size))
			return "ring_size is not a power of two in 4 KiB..256 MiB";
		if (r->qps > MESH_QPS_PER_LINK_MAX)
			return "qps out of range 0..16";
		if (r->link_wait_ms > MESH_CONNECT_WAIT_MAX_MS)
			return "link_wait_ms over a day";
		return NULL;
	default:
		return "unknown op";
	}
}

int mesh_ctl_req_decode(const void *buf, size_t len, CtlRequest **out, const char **why)
{
	CtlRequest *r;

	*why = NULL;
	if (len > MESH_CTL_REQ_MAX) {
		*why = "request longer than 4096 bytes";
		return -EMSGSIZE;
	}
	r = ctl_request__unpack(NULL, len, buf);
	if (!r) {
		*why = "undecodable protobuf";
		return -EBADMSG;
	}
	if (r->version != MESH_CTL_VERSION) {
		*why = "unsupported control protocol version";
		ctl_request__free_unpacked(r, NULL);
		return -EPROTO;
	}
	*why = ctl_req_check(r);
	if (*why) {
		ctl_request__free_unpacked(r, NULL);
		return -EPROTO;
	}
	*out = r;
	return 0;
}

void mesh_ctl_req_free(CtlRequest *req)
{
	if (req)
		ctl_request__free_unpacked(req, NULL);
}
