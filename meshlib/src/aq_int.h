/*
 * libmesh's own sending half (proto/ring.h's AQ area), shared by its two forms: an RC QP of its own
 * (aq.c) and, over meshd's tcp provider, a TCP connection of its own (aq_tcp.c). Private to them.
 */
#ifndef MESH_LIB_AQ_INT_H
#define MESH_LIB_AQ_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "internal.h"

#define AQ_SQ 128 /* send work requests: chains of 3 (two runs of the ring, a pair) or AQ_BATCH */
#define AQ_RELEASE_MS 1000 /* how long a shutdown waits for our writes to go */

struct aq_dev;
struct aq_tcp;

struct lib_aq {
	struct aq_tcp *tcp; /* over the tcp provider (MESH_AQ_PATH_TCP, aq_tcp.c): none of the verbs below */
	struct aq_dev *dev;
	struct ibv_comp_channel *cch;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr_tx, *mr_rx, *mr_dir;
	unsigned gen;       /* aq_forks when it was made: a forked child must not use it */
	uint32_t round;     /* meshd's offer round it answers (ring.h) */
	uint32_t state;     /* what we said in app_state */
	bool owned;         /* meshd granted us the sending half */
	bool failed;        /* our QP erred (or we gave up): IDLE once nothing is in flight */
	bool armed;         /* the CQ will raise an event on its next completion */
	bool connected;     /* in RTS: the peer's pairs land, consume receives and raise events */
	bool qp_err;        /* a completion failed: the QP is in error, nothing more goes or comes */
	bool imm_pos;       /* the peer's QP takes the position in an immediate (MESH_AQ_CAP_IMM_POS) */
	uint64_t rx_seen;   /* the peer's bytes below it are in our RX area (its immediates) */
	uint64_t posted;    /* stream position our writes cover */
	uint64_t done;      /* position covered by completed pairs (all writes before them completed) */
	uint32_t sq_out;    /* send work requests not completed */
	uint32_t rq_posted; /* receives posted */
	uint32_t max_inline; /* writes up to this size go inline (the QP's limit, at most AQ_INLINE) */
	uint8_t fifo[AQ_SQ]; /* work requests per signalled pair, oldest first */
	uint32_t fifo_head, fifo_len;
	uint64_t peer_rx_addr, peer_dir_addr;
	uint32_t peer_rx_rkey, peer_dir_rkey;
};

/* Whether q was made by this process, not inherited by a forked child (pthread_atfork). */
bool aq_mine(const struct lib_aq *q);
/* MESH_APP_SEND=off (or 0) in the environment: no offer taken. */
bool aq_env_off(void);
/* Publishes our state in app_state and kicks meshd, which relays it. */
void aq_say(mesh_channel_t *c, uint32_t state);
/* Done with the half: what we published but did not send is meshd's, and we say IDLE. */
void aq_give_back(mesh_channel_t *c);
uint64_t aq_now_ms(void);
/* Reads meshd's grant word into *grant. When it grants us the half and we can take it (READY,
 * not failed, not owned yet), its position is checked against our TX window: outside it we fail;
 * inside we own the half from there (posted) and return true with *from. */
bool aq_grant_take(mesh_channel_t *c, uint32_t *grant, uint64_t *from);

/* aq_tcp.c: the same steps over a TCP connection of our own (ring.h MESH_AQ_PATH_TCP). */
int aq_tcp_open(mesh_channel_t *c, struct lib_aq *q);
/* look_in: also take the peer's bytes (not for a send step: aq_progress_send). */
void aq_tcp_progress(mesh_channel_t *c, bool look_in);
int aq_tcp_fd(const struct lib_aq *q);
int aq_tcp_wait_fd(mesh_channel_t *c);
void aq_tcp_release(mesh_channel_t *c);
/* Closes what q->tcp holds (a forked child closes only its copies of the descriptors). */
void aq_tcp_destroy(struct lib_aq *q);

#endif
