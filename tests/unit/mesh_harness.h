/*
 * Driving a mesh over the fake transport, shared by the unit tests of the link state machine
 * (test_mesh.c) and of channels (test_channel*.c, through channel_harness.h): the test plays the
 * peer. It answers connects with ESTABLISHED events carrying the acceptor's private data, delivers
 * the peer's messages into posted receive buffers, executes RDMA WRITE/READ against a buffer
 * standing in for the peer's mailbox, and checks what the mesh posted, registered, accepted,
 * rejected and disconnected.
 *
 * Events go through the fake's poll() and then mesh_handle_event() + mesh_reap(), as meshd's loop
 * does. Every test ends in mt_finish() (mesh_cleanup()), which checks that no connection or
 * registration is left.
 */
#ifndef MESH_TESTS_MESH_HARNESS_H
#define MESH_TESTS_MESH_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fake_xport.h"
#include "mesh.h"

#define PEER_RKEY 0x0badc0deu
#define PEER_MB_LEN 4096u
#define MT_QPS 2u /* QPs per link unless a test sets mt.qps before mt_init() */

#define ACCESS_MAILBOX (XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_WRITE | XPORT_ACCESS_REMOTE_READ)

struct mt {
	struct fake_xport *fx;
	struct mesh_config cfg;
	struct config_node nodes[10];
	struct mesh m;
	bool inited;
	uint32_t qps; /* 0: MT_QPS */
	uint32_t rails; /* 0: one; more: every node has that many addresses, one fake instance serves all */
	struct fake_xport *fx1; /* set before mt_init: the instance of rails 1.. (an acceptor tells rails
				 * apart by the instance a request came to); freed by mt_close */
	bool two_providers;     /* with fx1 and one rail: fx and fx1 are two providers (transport "auto") */
	uint64_t peer_boot; /* the peer meshd's boot epoch in its Hello and private data; 0: 4242 */
	uint64_t peer_pred; /* its Hello's predecessor_epoch (a restart with its channels kept) */
	uint64_t peer_feat_off; /* feature bits the peer's Hello leaves out (an older peer) */
	/* With keys (t->m.keys set after mt_init): the peer proves with peer_keys (its first key). */
	struct auth_keys peer_keys;
	uint8_t peer_nonce[AUTH_NONCE_LEN]; /* the peer's: in its accept, or the test's requests carry it */
	uint8_t our_nonce[AUTH_NONCE_LEN];  /* ours, as the peer read it from our connect */
	/* fast: deliver() offers each event to rail 0's fast path first (mesh_fast_event), as a
	 * data-path thread does under its rail's lock alone; fast_taken counts those it took. */
	bool fast;
	uint64_t fast_taken;
	/* The peer's mailbox: its address and PEER_RKEY are what the test's Hello announces. */
	uint8_t peer_mb[PEER_MB_LEN] __attribute__((aligned(64)));
};

/* Fixture: mt_open() creates the fake transport in a zeroed mt, mt_close() undoes mt_open() (and
 * mesh_init() when a test failed half-way); mt_setup/mt_teardown allocate an mt around them. */
void mt_open(struct mt *t);
void mt_close(struct mt *t);
int mt_setup(void **state);
int mt_teardown(void **state);

/* A cluster "test" of the given ids (ascending), node i at 10.0.0.i:7471; we are self_id. */
void mt_init(struct mt *t, uint16_t self_id, const uint16_t *ids, size_t n);
/* mesh_cleanup, then nothing of the transport may be left. */
void mt_finish(struct mt *t);

struct link *lk(struct mt *t, uint32_t peer);
unsigned conn_id(xport_conn_t *c);

void tick_at(struct mt *t, uint64_t now);
void tick(struct mt *t);
/* As meshd's drain loop: poll the transport, hand every event to the mesh, then reap. */
void deliver(struct mt *t, const struct xport_event *ev);

struct xport_event cm_event(enum xport_ev_type type, xport_conn_t *c, const void *pdata, size_t len);
struct xport_event wc_event(xport_conn_t *c, enum xport_op op, uint64_t wr_id, uint32_t byte_len);
struct mesh_cm_pdata decode_pdata(const uint8_t *pdata, size_t len);

/* The acceptor's answer to QP i of the link's current attempt. */
void establish_qp(struct mt *t, struct link *l, uint32_t i);
/* The last SEND posted on conn_id (since post index `from`), decoded; free with mesh_peer_msg_free. */
PeerMsg *last_send(struct mt *t, size_t from, unsigned cid);
/* The oldest receive posted on QP qp of the link that the test has not consumed yet; marks it used. */
struct fake_post *take_recv(struct mt *t, struct link *l, uint32_t qp);
/* The peer sends msg: it lands in the oldest unused receive posted on QP 0 (peer_send_on: on QP qp). */
void peer_send(struct mt *t, struct link *l, const PeerMsg *msg);
void peer_send_on(struct mt *t, struct link *l, uint32_t qp, const PeerMsg *msg);
/* The Hello a well-behaved peer sends for the link's current attempt. */
Hello peer_hello(struct mt *t, struct link *l);
void peer_send_hello(struct mt *t, struct link *l, Hello *h);
void peer_send_ready(struct mt *t, struct link *l, uint64_t epoch);
/* Checks the WRITE+READ pair of every QP (posted since `from`) and plays the remote side. With
 * corrupt_qp >= 0 that QP's READ returns other bytes, and the walk stops there. */
void run_proof(struct mt *t, struct link *l, size_t from, int corrupt_qp);
/* Our Hello, posted on QP 0 since `from` once every QP of the attempt is established. */
void check_our_hello(struct mt *t, struct link *l, size_t from);
/* The peer as acceptor of our QP i (the first of an attempt: rail 0 gen 0, or of rail's join): a
 * fresh t->peer_nonce into pd and, when it has a key (t->peer_keys), its proof over our connect's
 * nonce and its own. */
void peer_accept_auth(struct mt *t, struct link *l, uint32_t i, uint32_t rail, uint32_t gen, struct mesh_cm_pdata *pd);
/* The rest of the proof of the cluster key on QP qp once every QP is connected (the link's: rail 0
 * gen 0). We dialled: our AuthProof is the first thing we sent on qp since from. We accepted: our
 * accept carried our proof over t->peer_nonce (the requests' nonce), we sent nothing since from, and
 * the peer now sends its AuthProof with t->peer_keys. Our proof is checked against t->peer_keys when
 * check_ours. */
void peer_auth(struct mt *t, struct link *l, uint32_t qp, uint32_t rail, uint32_t gen, size_t from, bool check_ours);
/* From "every QP connecting" to UP: establish, (prove the cluster key), exchange Hellos, prove the
 * mailbox key, exchange Ready. */
void drive_to_up(struct mt *t, struct link *l);

#endif
