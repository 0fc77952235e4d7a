/*
 * libmesh's own sending half (proto/ring.h's AQ area), shared by its two paths: an RC QP of its own
 * (aq_verbs.c) and, over meshd's tcp provider, a TCP connection of its own (aq_tcp.c), both behind
 * struct aq_ops, which aq.c calls. Private to them.
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
	const struct aq_ops *ops; /* the path: aq_verbs_ops or aq_tcp_ops */
	struct aq_tcp *tcp; /* aq_tcp.c's state (MESH_AQ_PATH_TCP): none of the verbs below */
	struct aq_dev *dev;
	struct ibv_comp_channel *cch;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr_tx, *mr_rx, *mr_dir;
	unsigned gen;       /* aq_gen() when it was made: a forked child must not use it */
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

/* The application's two sending paths, as meshd's transports are (node/transport/transport.h): a
 * const table each, every slot filled; aq.c calls a path only through it. */
struct aq_ops {
	const char *name;
	/* A look at the path is a system call (a TCP connection): a reader that awaits an answer
	 * yields at each (channel.c chan_spin). */
	bool look_is_syscall;
	/* Sets up the path for c (c->aq is q) and offers it to meshd (aq_say OFFER); on failure the
	 * caller destroys q with whatever of it was made, and meshd sends everything. */
	int (*open)(mesh_channel_t *c, struct lib_aq *q);
	/* Frees the path's part of q (a forked child: only its own copies of descriptors). */
	void (*destroy)(struct lib_aq *q);
	/* A step of a call that reads or writes the ring: connect, follow meshd's grant, send. */
	void (*progress)(mesh_channel_t *c);
	/* A send step, without a look for the peer's bytes; -EOPNOTSUPP: the path has none, and the
	 * whole step (progress) runs instead. */
	int (*progress_send)(mesh_channel_t *c);
	/* The fd a channel's epoll set watches for the path. */
	int (*fd)(const struct lib_aq *q);
	/* Before sleeping: the fd to sleep on, armed (-1: none). */
	int (*wait_fd)(mesh_channel_t *c);
	/* After that fd was readable: takes its events. */
	void (*event)(mesh_channel_t *c);
	/* At shutdown: our bytes out (within AQ_RELEASE_MS), the half handed back to meshd. */
	void (*release)(mesh_channel_t *c);
};

extern const struct aq_ops aq_verbs_ops; /* aq_verbs.c: an RC QP (ring.h MESH_AQ_PATH_RDMA) */
extern const struct aq_ops aq_tcp_ops;   /* aq_tcp.c: a TCP connection (ring.h MESH_AQ_PATH_TCP) */

/* ---- aq_page.c: what both paths say to meshd ---- */

/* This process's count of forks (pthread_atfork, in the child): a path made under another count
 * is a forked child's copy of its parent's. */
unsigned aq_gen(void);
/* A fresh lib_aq on the path ops for meshd's offer of the given round. */
struct lib_aq *aq_new(const struct aq_ops *ops, uint32_t round);
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

#endif
