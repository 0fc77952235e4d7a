/*
 * What the files of the link layer share, and nothing outside them sees. They stand in layers,
 * each calling only the files below it, so that none calls back up (no two call each other):
 *   mesh.c            links' messages and events dispatched, keepalives, the tick, the locks,
 *                     set-up and clean-up;
 *   link_reconf.c     a reload's nodes added, removed, moved;
 *   link_connect.c    dialling (and which peer is dialled next: mesh_admit) and accepting QPs;
 *   link_ping.c       `meshctl ping`'s probes (ping.h);
 *   link_rail.c       rails failing and rejoining (a join's AuthProof: link_rail_on_auth);
 *   link_handshake.c  the proofs of the cluster key, Hello, the mailbox proof, Ready;
 *   link_core.c       the primitives of a link: phases, link_fail, registrations and receives,
 *                     sends and control messages, the table of links, the graveyard;
 *   link_admit.c      admission's window for our dials, calling nothing of the link layer.
 * link_reconf.c, link_connect.c and link_ping.c call none of each other. Everything here works on
 * struct mesh and struct link of mesh.h; the rest of meshd goes through mesh.h alone.
 */
#ifndef MESH_MESHD_LINK_INTERNAL_H
#define MESH_MESHD_LINK_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "mesh.h"
#include "util.h"

static inline uint64_t now_ms(void)
{
	return util_now_ms();
}

/* v doubled n times, never past max: the backoffs and the rail join's time after failures. */
static inline uint64_t doubled(uint64_t v, uint32_t n, uint64_t max)
{
	for (uint32_t i = 0; i < n && v < max; i++)
		v *= 2;
	return MIN(v, max);
}

/* wr_id of our work requests: kind in the high half, slot or QP index in the low half. Every
 * connection has its own CQ, so a wr_id never outlives its attempt. */
enum wr_kind { WR_RECV = 1, WR_SEND, WR_PROOF_WRITE, WR_PROOF_READ, /* mesh.h: WR_CH_DATA, WR_CH_CREDIT */
	       WR_RECV_DATA = 7, WR_KA_WRITE /* mesh.h: WR_CH_DIRECT (9), WR_CH_HINT (10) */ };
_Static_assert(WR_CH_DATA == WR_PROOF_READ + 1 && WR_CH_CREDIT + 1 == WR_RECV_DATA &&
		       WR_CH_DIRECT == WR_KA_WRITE + 1 && WR_CH_HINT == WR_CH_DIRECT + 1,
	       "wr_id kinds of link_internal.h and mesh.h overlap");
#define WR_ID(kind, idx) (((uint64_t)(kind) << 32) | (uint32_t)(idx))
#define WR_KIND(id) ((uint32_t)((id) >> 32))
#define WR_IDX(id) ((uint32_t)(id))

/* Layout of link->buf: receive slots of every rail (rail r's are r * LINK_RECV_BUFS ...), send
 * slots, proof scratch, token. */
#define BUF_RECV_OFF 0
#define BUF_SEND_OFF(m) (BUF_RECV_OFF + (size_t)LINK_RECV_BUFS * (m)->n_rails * MESH_PEER_MSG_MAX)
#define BUF_PROOF_OFF(m) (BUF_SEND_OFF(m) + LINK_SEND_BUFS * MESH_PEER_MSG_MAX)
#define BUF_TOKEN_OFF(m) (BUF_PROOF_OFF(m) + MESH_QPS_PER_LINK_MAX * MESH_PROOF_LEN)
#define BUF_KA_OFF(m) (BUF_TOKEN_OFF(m) + MESH_PROOF_LEN)
#define BUF_LEN(m) (BUF_KA_OFF(m) + MESH_KA_LEN)

/* link_reconf.c: links of removed nodes, closed once their Goodbye had its time (all: now). */
#define LINK_LEAVE_GRACE_MS 300
void mesh_leaving_tick(struct mesh *m, uint64_t t, bool all);

/* link_connect.c */
void link_dial(struct link *l);
void mesh_admit(struct mesh *m, uint64_t t);
void mesh_reject(struct mesh *m, xport_conn_t *c, int reason, enum log_level lvl, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void mesh_on_request(struct mesh *m, const struct xport_event *ev);
void mesh_on_established(struct link *l, const struct xport_event *ev);

/* link_rail.c */
void link_rail_fail(struct link *l, uint32_t r, int err, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void link_rail_progress(struct link *l, uint32_t r);
void link_rail_bury(struct link *l, uint32_t r);
void link_send_raildowns(struct link *l);
uint64_t rail_join_timeout_ms(const struct link *l, uint32_t r);
void link_conn_fail(struct link *l, xport_conn_t *c, int err, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void link_rail_dial(struct link *l, uint32_t r);
bool link_rail_on_auth(struct link *l, uint32_t qp, const PeerMsg *msg);

/* link_handshake.c: the handshake of an attempt and the proofs of the cluster key. */
int link_send_proof(struct link *l, uint32_t qp, uint32_t rail, uint32_t gen, const uint8_t *ours,
		    const uint8_t *theirs);
bool link_check_proof(const struct link *l, uint32_t rail, uint32_t gen, const uint8_t *ours, const uint8_t *theirs,
		      const uint8_t *mac, size_t mac_len);
int link_accept_auth(struct link *l, const struct mesh_cm_pdata *req, struct mesh_cm_pdata *rep);
int link_take_accept_auth(struct link *l, const struct mesh_cm_pdata *pd, const char **why);
void link_progress(struct link *l);
void link_on_hello(struct link *l, const Hello *h);
void link_on_auth(struct link *l, uint32_t qp, const PeerMsg *msg);

/* link_core.c (mesh.h has its public ones) */
const char *link_phase_name(enum link_phase p);
bool phase_in_handshake(enum link_phase p);
void mesh_bury_conn(struct mesh *m, xport_conn_t *c);
void link_note_state(struct link *l);
void link_set_phase(struct link *l, enum link_phase p);
void link_fail(struct link *l, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
uint32_t link_qp_rail(const struct link *l, uint32_t qp);
bool link_qp_first(const struct link *l, uint32_t qp);
xport_mr_t *link_buf_mr(const struct link *l, uint32_t r);
int link_register(struct link *l, xport_conn_t *c);
int link_register_mailbox(struct link *l);
int link_post_recvs(struct link *l, xport_conn_t *c);
bool link_sequenced(const struct link *l);
bool msg_sequenced(PeerMsg__BodyCase k);
uint32_t link_ctl_qp(const struct link *l);
int link_send_on(struct link *l, uint32_t qp, const PeerMsg *msg);
void link_ctl_resend(struct link *l);
uint64_t link_ka_word(const struct link *l);
uint32_t link_rail_slots_busy(const struct link *l, uint32_t r);
void link_rails_diag(const struct link *l, uint64_t t, enum log_level lvl);
struct link *mesh_link_new(struct mesh *m, const struct config_node *node);
void mesh_link_free(struct mesh *m, struct link *l, bool buried);

/* link_admit.c: admission of our dials (struct mesh_admission). */
void mesh_adm_init(struct mesh *m);
void mesh_adm_on_up(struct mesh *m, uint64_t sample_ms);
void mesh_adm_on_congestion(struct mesh *m, uint64_t t);
uint64_t mesh_adm_no_answer_ms(const struct mesh *m);

#endif
