/*
 * What the files of the channel layer share, and nothing outside them sees: channel.c, channel_client.c,
 * channel_peer.c, channel_resume.c, channel_aq.c and channel_local.c (channel.c says which does what).
 * The rest of meshd goes through channel.h and mesh.h's struct mesh_upper.
 */
#ifndef MESH_MESHD_CHANNEL_INTERNAL_H
#define MESH_MESHD_CHANNEL_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "channel.h"
#include "mesh.h"
#include "util.h"

static inline uint64_t now_ms(void)
{
	return util_now_ms();
}

static inline uint32_t mr_key(const xport_mr_t *mr)
{
	return mr ? mr->rkey : 0;
}

#define WR_ID(kind, idx) (((uint64_t)(kind) << 32) | (uint32_t)(idx))

#define CH_EPHEMERAL_FIRST 49152u

enum { LOCAL_MSG, LOCAL_IMM, LOCAL_DONE };

struct local_ev {
	uint8_t kind;
	uint32_t imm, len; /* LOCAL_IMM; LOCAL_MSG: len of msg */
	uint32_t qp;       /* LOCAL_DONE */
	uint64_t wr_id;    /* LOCAL_DONE */
	uint8_t *msg;      /* LOCAL_MSG: the encoded PeerMsg */
};

struct channel_local {
	struct link link;
	struct local_ev *q;
	size_t head, n, cap; /* q[head..n) queued */
};

/* The channel's registrations on the device of connection c, as struct channel names them. The
 * peer may write the RX ring, the credit slots, the pair hint and the 16 bytes of the direct pair,
 * nothing else of the control page. What was registered before a failure stays in mr, for the
 * caller to release. */
struct channel_mrs {
	xport_mr_t *tx, *rx, *cin, *cout, *dir, *hin;
};

/* The keys a channel announces to its peer and takes from it, alike in ChannelOpen, ChannelAccept
 * and ChannelResume: its RX ring, credit slots, direct pair and pair hint (key 0: none). The three
 * messages name the fields the same, so one macro serves their three types and a key is added once. */
#define CHANNEL_KEYS_PUT(m, ch)                                              \
	do {                                                                 \
		(m)->rx_addr = (uintptr_t)(ch)->rx;                          \
		(m)->rx_rkey = mr_key((ch)->mr_rx);                          \
		(m)->credit_addr = (uintptr_t)(ch)->credit;                  \
		(m)->credit_rkey = mr_key((ch)->mr_cin);                     \
		(m)->direct_addr = (uintptr_t)mesh_ring_direct((ch)->ctrl);  \
		(m)->direct_rkey = mr_key((ch)->mr_dir);                     \
		(m)->hint_addr = (uintptr_t)((ch)->credit + CH_HINT_IN);     \
		(m)->hint_rkey = mr_key((ch)->mr_hin);                       \
	} while (0)

#define CHANNEL_KEYS_TAKE(ch, m)                        \
	do {                                            \
		(ch)->peer_rx_addr = (m)->rx_addr;         \
		(ch)->peer_rx_rkey = (m)->rx_rkey;         \
		(ch)->peer_credit_addr = (m)->credit_addr; \
		(ch)->peer_credit_rkey = (m)->credit_rkey; \
		(ch)->peer_direct_addr = (m)->direct_addr; \
		(ch)->peer_direct_rkey = (m)->direct_rkey; \
		(ch)->peer_hint_addr = (m)->hint_addr;     \
		(ch)->peer_hint_rkey = (m)->hint_rkey;     \
	} while (0)

/* ChannelAppQp states (proto/peer.proto). */
enum { AQ_MSG_OFFER = 1, AQ_MSG_READY, AQ_MSG_SENDING, AQ_MSG_HANDBACK, AQ_MSG_PLACED, AQ_MSG_REVOKE };

/* channel.c */
struct channel *link_channel(struct link *l, uint32_t slot);
int link_send(struct link *l, const PeerMsg *msg);
int channel_mr_reg(struct channel *ch, xport_conn_t *c, struct channel_mrs *mr);
void channel_mrs_bury(struct mesh *m, struct channel_mrs mr);
struct channel_mrs channel_mrs(const struct channel *ch);
void channel_mrs_set(struct channel *ch, const struct channel_mrs *mr);
void channel_rail_link(struct channel *ch);
void channel_rail_unlink(struct channel *ch);
void channel_free(struct channel *ch);
struct channel *channel_new(struct link *l, uint64_t size, uint32_t qps, uint32_t rail, int node, const char **why,
				   int *errp);
void channel_wake_app(struct channel *ch);
void channel_publish(struct channel *ch);
int channel_send(struct channel *ch, PeerMsg *msg);
PeerMsg channel_close_msg(ChannelClose *c, uint32_t peer_slot, int reason, uint64_t chunks, uint64_t credits);
void channel_break(struct channel *ch, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
uint64_t channel_rx_claim(struct channel *ch);
uint64_t channel_rx_credit(const struct channel *ch);
int channel_read_app(struct channel *ch);
bool channel_may_post(const struct channel *ch);
void channel_post_data(struct channel *ch);
void channel_post_direct(struct channel *ch);
void channel_pairs_judge(struct channel *ch, uint64_t placed_before);
void channel_post_hint(struct channel *ch);
void channel_note_stall(struct channel *ch);
void channel_post_credit(struct channel *ch);
int channel_send_open(struct channel *ch);
void channel_send_accept(struct channel *ch);
void channel_note_peer_final(struct channel *ch, uint64_t chunks, uint64_t credits);
void channel_pump(struct channel *ch);

/* channel_client.c */
int channel_quota(struct mesh *m, const struct link *l, uint32_t uid, uint64_t ring_size, const char **why);
int channel_hand_over(struct channel *ch, int fd);
void channel_waits_run(struct mesh *m, uint64_t t);
void channel_waits_free(struct mesh *m);

/* channel_peer.c */
void channel_refuse_resume(struct link *l, uint32_t peer_slot, int reason);
void channel_flush_rejects(struct link *l);
int channel_on_message(struct link *l, const PeerMsg *msg);
int channel_on_completion(struct link *l, uint32_t kind, uint32_t idx, int status);
int channel_on_imm(struct link *l, uint32_t imm, uint32_t len);
bool channel_fast_ok(const struct channel *ch, uint32_t rail);
void channel_want_slow(struct channel *ch, uint32_t rail);
void channel_pump_fast(struct channel *ch, uint32_t rail);
bool channel_fast_completion(struct link *l, uint32_t rail, uint32_t kind, uint32_t idx);
bool channel_fast_imm_ok(struct link *l, uint32_t rail, uint32_t imm);
void channel_fast_imm(struct link *l, uint32_t rail, uint32_t imm, uint32_t len);

/* channel_resume.c */
void channel_detach(struct channel *ch);
void channel_send_resume(struct channel *ch);
bool channel_resumable(const struct channel *ch);
void channel_link_down(struct link *l, int err, bool may_resume);
void channel_rail_lost(struct channel *ch);
void channel_rail_down(struct link *l, uint32_t r);
void channel_move(struct channel *ch, uint32_t k);
void channel_link_up(struct link *l);
void channel_on_resume(struct link *l, const ChannelResume *r);

/* channel.c: a channel the last meshd kept (channel_store.c), from its record and its four
 * descriptors (CH_KEPT_*, which it owns from now on, also on failure), RESUMING on l. */
enum { CH_KEPT_RING, CH_KEPT_KICK, CH_KEPT_WAKE, CH_KEPT_LIFE, CH_KEPT_FDS };
struct channel_record {
	uint32_t id, peer_node, slot, peer_slot, uid, qps;
	uint16_t local_port, peer_port;
	bool opener;
	uint8_t xp;
	uint64_t size, peer_boot;
};
struct channel *channel_restore(struct link *l, const struct channel_record *r, int fds[CH_KEPT_FDS],
				const char **why, int *errp);

/* channel_store.c: the channel's descriptors into the store once it is OPEN and handed over (the
 * ring's memfd is then kept open by meshd too), out when it is freed; renamed when the peer's meshd
 * was succeeded by another (the record names the peer's boot epoch). */
void channel_store_keep(struct channel *ch);
void channel_store_drop(struct channel *ch);
void channel_store_rename(struct channel *ch, uint64_t peer_boot);
/* And a listening client's connection, kept with its port: the application's listener lives on. */
void channel_store_keep_listener(struct mesh *m, struct listener *li);
void channel_store_drop_listener(struct mesh *m, struct listener *li);

/* channel_aq.c */
void channel_aq_offer(struct channel *ch);
void channel_aq_renew(struct channel *ch);
void channel_aq_app(struct channel *ch);
void channel_aq_ungrant(struct channel *ch);
void channel_aq_take(struct channel *ch, bool force);
void channel_aq_grant(struct channel *ch);
void channel_aq_account(struct channel *ch);
void channel_aq_rx(struct channel *ch);
void channel_aq_revoke(struct channel *ch);
void channel_on_app_qp(struct link *l, const ChannelAppQp *a);

/* channel_local.c */
bool link_is_local(const struct link *l);
struct link *local_link(struct mesh *m);
int local_push(struct mesh *m, const struct local_ev *ev);
void channel_local_free(struct mesh *m);

#endif
