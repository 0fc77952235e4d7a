/*
 * Wire contracts that are not protobuf: the rdma_cm private data of connect/accept/reject, limits
 * and versions, and the checked decoders of peer and control messages.
 *
 * The private data is a fixed, versioned, big-endian struct. IB/RoCE RC connect requests carry at
 * most 56 bytes of private data, so the struct is size-checked at build time; a receiver accepts
 * more bytes (the CM pads) but never fewer.
 */
#ifndef MESH_PROTO_WIRE_H
#define MESH_PROTO_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <mesh/mesh.h> /* MESH_RAILS_MAX: a link has qp_count QPs on each rail */

#include "ctl.pb-c.h"
#include "peer.pb-c.h"

#define MESH_CM_MAGIC 0x4d455348u /* "MESH" */
#define MESH_CM_VERSION 2 /* 2: the nonce, and the acceptor's proof in its accept */
#define MESH_CM_PDATA_MAX 56 /* rdma_cm RC connect private data limit (IB CM REQ: 92 - rdma_cm's 36) */
#define MESH_CM_ACCEPT_PDATA_MAX 88 /* an accept with the proof; an IB CM REP carries up to 196 */

#define MESH_NODE_ID_MAX 65535u
#define MESH_QPS_PER_LINK_MAX 16u

/* Largest peer message a receiver accepts: also the size of each posted receive buffer. */
#define MESH_PEER_MSG_MAX 1024u
/* Largest local control request meshd accepts; replies may be larger. */
#define MESH_CTL_REQ_MAX 4096u
#define MESH_CTL_REPLY_MAX (1u << 20)
#define MESH_CTL_VERSION 1
/* `meshctl drain`: its deadline when none is given, and at most (CtlRequest.drain_ms). */
#define MESH_DRAIN_DEFAULT_MS 300000u
#define MESH_DRAIN_MAX_MS 86400000u
/* CtlRequest.link_wait_ms: a CONNECT waits at most a day for its link (libmesh asks for its timeout). */
#define MESH_CONNECT_WAIT_MAX_MS 86400000u
/* `meshctl ping` (CtlRequest count, interval_ms, timeout_ms): the bounds meshd holds a client to.
 * A probe is a Keepalive message whose seq has MESH_PING_TAG set, the ping's id in bits 62..32 and
 * the probe's number in bits 31..0: every meshd that agreed MESH_FEAT_KEEPALIVE echoes it untouched
 * in its KeepaliveAck, on the rail it came by, so a peer needs nothing new to be pinged, and our own
 * keepalives (numbered from 1) never carry the tag. */
#define MESH_PING_COUNT_MAX 10000u
#define MESH_PING_INTERVAL_DEFAULT_MS 1000u
#define MESH_PING_INTERVAL_MIN_MS 10u
#define MESH_PING_INTERVAL_USER_MS 200u
#define MESH_PING_INTERVAL_MAX_MS 60000u
#define MESH_PING_TIMEOUT_DEFAULT_MS 2000u
#define MESH_PING_TIMEOUT_MAX_MS 60000u
#define MESH_PING_MAX 8u     /* pings meshd runs at once */
#define MESH_PING_PER_UID 2u /* of them, for one user other than root and meshd's */
#define MESH_PING_TAG (1ull << 63)
#define MESH_PING_SEQ(id, seq) (MESH_PING_TAG | ((uint64_t)((id) & 0x7fffffffu) << 32) | (uint32_t)(seq))
#define MESH_PING_SEQ_ID(s) ((uint32_t)((s) >> 32) & 0x7fffffffu)
#define MESH_PING_SEQ_N(s) ((uint32_t)(s))

/* Feature bits of Hello. A message kind is sent only if both sides announced its bit. */
#define MESH_FEAT_KEEPALIVE (1ull << 0)
#define MESH_FEAT_GOODBYE (1ull << 1)
/* Bit 2 named channels whose credits all landed on one pair of words (earlier builds): retired, so
 * that such a peer and this one see no channels in common, the open answered with a clear
 * "does not support channels" on both sides rather than a data path they read differently. */
#define MESH_FEAT_CHANNELS (1ull << 5) /* stream channels, credits in MESH_CREDIT_SLOTS slots */
#define MESH_FEAT_RESUME (1ull << 3) /* channels wait for a link that went DOWN and resume (ChannelResume) */
/* a link stays UP while one rail is: control messages are sequenced and fail over (PeerMsg.seq/ack),
 * a lost rail's channels move (ChannelResume.rail), the rail rejoins (RailDown, RailUp, MESH_CM_F_RAIL_JOIN) */
#define MESH_FEAT_RAILS (1ull << 4)
/* Rail 0's keepalive is an RDMA WRITE of a counter into the peer's mailbox word MESH_KA_OFF: no
 * receive, no answer, no wake-up at the peer, which looks at the word on its own timer; the write's
 * completion is the writer's round trip. Keepalive messages and their acks cost each end two
 * messages sent and two received per interval and link: 64 idle meshd over rdma in the VM spent
 * both vCPUs on them. Other rails keep Keepalive messages (their mailbox is not registered there). */
#define MESH_FEAT_KA_WRITE (1ull << 6)
/* Application-posted writes: it relays ChannelAppQp (proto/ring.h's AQ area, cluster.app_send). */
#define MESH_FEAT_APPQP (1ull << 7)
/* After a resume that revoked an application's QP, it is offered a new one (ring.h round,
 * ChannelAppQp.round): without the bit, a revoked channel stays meshd-posted for its life. */
#define MESH_FEAT_APPQP_RENEW (1ull << 8)
/* Over the tcp provider, an application's own TCP connection stands for its QP (ring.h
 * MESH_AQ_PATH_TCP, ChannelAppQp.tcp_port and tcp_token): without the bit, tcp links offer nothing. */
#define MESH_FEAT_APPTCP (1ull << 9)
#define MESH_FEAT_ALL \
	(MESH_FEAT_KEEPALIVE | MESH_FEAT_GOODBYE | MESH_FEAT_CHANNELS | MESH_FEAT_RESUME | MESH_FEAT_RAILS | \
	 MESH_FEAT_KA_WRITE | MESH_FEAT_APPQP | MESH_FEAT_APPQP_RENEW | MESH_FEAT_APPTCP)

/* Immediate data of the channel data path (RDMA WRITE_WITH_IMM):
 *   bit 31      0 = data chunk, 1 = credit update
 *   bits 30..16 the receiver's channel slot (MESH_CHANNEL_SLOTS per link)
 *   bits 15..0  data: chunk sequence number (mod 2^16); credit: the credit write's number (mod 2^16) */
#define MESH_IMM_CREDIT (1u << 31)
/* A credit write: the reader's rx_cons, then the bytes its meshd has placed (contiguous rx_prod),
 * both u64 in the host order of the cluster (one machine architecture per cluster). The sender
 * posts up to rx_cons + ring size, and lets its application reuse TX bytes only up to the placed
 * position: bytes written but not yet seen placed are written again if the link is lost. */
#define MESH_CREDIT_LEN 16u
/* Credit write n lands in slot n % MESH_CREDIT_SLOTS of the sender's credit area, and the sender
 * reads the slot its immediate names. An RDMA WRITE is complete when its immediate arrives, but its
 * bytes are placed in no promised order (under emulation a byte at a time), so a later write landing
 * on the same words could be read half old and half new. With slots, the next write to this slot
 * is MESH_CREDIT_SLOTS credits later, each a quarter ring of the reader's progress at least (two
 * rings; ring.h mesh_ring_credit_step), while the reader cannot get more than a ring past the last
 * credit the sender has read: it cannot be under way while the sender reads this one. */
#define MESH_CREDIT_SLOTS 8u
#define MESH_CREDIT_AREA (MESH_CREDIT_SLOTS * MESH_CREDIT_LEN)
/* Pairs on demand: a direct pair (ring.h) helps only a reader that polls its ring when the bytes
 * land; one asleep in the kernel is woken by its meshd, which has the bytes' immediate by then, and
 * the pair was a second write and acknowledgement per message for nothing. So the receiving meshd
 * tells the sending one by a plain RDMA WRITE of {value, check} (check: ring.h's
 * mesh_ring_direct_check(value); anything else, a pair read while it lands included, is ignored)
 * into the MESH_PAIR_HINT_LEN bytes the sender announced (ChannelOpen/Accept/Resume hint_addr,
 * hint_rkey; 0 from an older meshd: no hints, pairs as always). The words start zero: pairs wanted. */
#define MESH_PAIR_HINT_LEN 16u
#define MESH_PAIR_HINT_ON 1u  /* the reader took bytes through pairs: write them */
#define MESH_PAIR_HINT_OFF 2u /* it slept through them: write none (until told otherwise) */
#define MESH_CHANNEL_SLOTS 32768u
#define MESH_IMM(credit, slot, seq) (((credit) ? MESH_IMM_CREDIT : 0u) | ((uint32_t)(slot) << 16) | ((uint32_t)(seq) & 0xffffu))
#define MESH_IMM_SLOT(imm) (((imm) >> 16) & 0x7fffu)
#define MESH_IMM_SEQ(imm) ((uint16_t)(imm))

/* The proof of the cluster key: each side's nonce travels in its private data (connect, accept), the
 * acceptor's proof in its accept (MESH_CM_F_PROOF), the dialler's in an AuthProof message. 16 random
 * bytes from each side make every transcript fresh; the HMAC-SHA256 is whole. */
#define MESH_AUTH_NONCE_LEN 16u
#define MESH_AUTH_MAC_LEN 32u

/* The mailbox's first bytes are the proof slot: the peer writes its token there and reads it back. */
#define MESH_PROOF_LEN 32u
#define MESH_MAILBOX_MIN (MESH_QPS_PER_LINK_MAX * MESH_PROOF_LEN)
/* After the proof slots: the keepalive word (MESH_FEAT_KA_WRITE), when the mailbox holds it. */
#define MESH_KA_OFF MESH_MAILBOX_MIN
#define MESH_KA_LEN 8u
#define MESH_MAILBOX_CFG_MIN (MESH_KA_OFF + MESH_KA_LEN) /* what this meshd's own mailbox has at least */

enum mesh_cm_kind {
	MESH_CM_CONNECT = 1, /* dialler -> acceptor, in rdma_connect */
	MESH_CM_ACCEPT = 2,  /* acceptor -> dialler, in rdma_accept */
	MESH_CM_REJECT = 3,  /* acceptor -> dialler, in rdma_reject, reason set */
};

/* The private data as it travels (big-endian fields). */
struct mesh_cm_wire {
	uint32_t magic;
	uint8_t version;
	uint8_t kind;
	uint8_t qp_index;
	uint8_t qp_count;
	uint32_t cluster_hash;
	uint16_t src_node;
	uint16_t dst_node;
	uint64_t link_epoch;
	uint64_t boot_epoch;
	uint16_t reason; /* MESH_E* code without its base, reject only */
	uint8_t rail;       /* the rail (device) of this QP: 0..rail_count-1 */
	uint8_t rail_count; /* rails of the sender; 0 from senders that have only one (read as 1) */
	uint16_t rail_gen;  /* MESH_CM_F_RAIL_JOIN: the rail's incarnation (RailDown, RailUp) */
	uint8_t flags;      /* MESH_CM_F_* */
	uint8_t reserved;
	uint8_t nonce[MESH_AUTH_NONCE_LEN]; /* the sender's, fresh per link attempt or rail join */
};
/* The QPs of one rail of an UP link (link_epoch), dialled again after that rail failed. */
#define MESH_CM_F_RAIL_JOIN 0x01u
/* Accept only: MESH_AUTH_MAC_LEN bytes follow the struct, the acceptor's proof of the cluster key
 * over the dialler's nonce (its connect) and ours (this accept); on the first QP of an attempt or join. */
#define MESH_CM_F_PROOF 0x02u
_Static_assert(sizeof(struct mesh_cm_wire) == 56, "cm private data layout changed");
_Static_assert(sizeof(struct mesh_cm_wire) <= MESH_CM_PDATA_MAX, "cm private data exceeds the RC limit");

/* The same in host order. */
struct mesh_cm_pdata {
	uint8_t version;
	uint8_t kind;
	uint8_t qp_index; /* within its rail */
	uint8_t qp_count; /* per rail */
	uint8_t rail;
	uint8_t rail_count; /* 1.. */
	uint8_t flags;      /* MESH_CM_F_* */
	uint16_t rail_gen;
	uint32_t cluster_hash;
	uint16_t src_node;
	uint16_t dst_node;
	uint64_t link_epoch;
	uint64_t boot_epoch;
	int reason; /* negative MESH_E* code, or 0 */
	uint8_t nonce[MESH_AUTH_NONCE_LEN];
	uint8_t mac[MESH_AUTH_MAC_LEN]; /* with MESH_CM_F_PROOF */
};

/* Writes sizeof(struct mesh_cm_wire) bytes to buf, and the proof after them with MESH_CM_F_PROOF;
 * returns that length or -ENOSPC. */
int mesh_cm_pdata_encode(const struct mesh_cm_pdata *pd, void *buf, size_t len);
/* Checks magic, version, kind, counts and flags; returns 0, -EBADMSG (too short), -MESH_EBADMAGIC,
 * -MESH_EPROTOVER or -EPROTO (field out of range). Magic and version are judged first, so a peer
 * of another version hears MESH_EPROTOVER whatever its length. */
int mesh_cm_pdata_decode(const void *buf, size_t len, struct mesh_cm_pdata *out);

/* FNV-1a 32-bit: the cluster name's hash, carried in private data and Hello. */
uint32_t mesh_cluster_hash(const char *name);

/* Peer messages: encode into buf (returns the length, -EMSGSIZE if it does not fit). */
int mesh_peer_msg_encode(const PeerMsg *msg, void *buf, size_t len);
/* Decodes and range-checks a peer message; the caller frees *out with mesh_peer_msg_free.
 * Returns 0, -EMSGSIZE (longer than MESH_PEER_MSG_MAX), -EBADMSG (undecodable) or -EPROTO
 * (a field out of range; *why names it). */
int mesh_peer_msg_decode(const void *buf, size_t len, PeerMsg **out, const char **why);
void mesh_peer_msg_free(PeerMsg *msg);

/* Control request: decode with the size limit and check version, op and every field's range. */
int mesh_ctl_req_decode(const void *buf, size_t len, CtlRequest **out, const char **why);
void mesh_ctl_req_free(CtlRequest *req);

#endif
