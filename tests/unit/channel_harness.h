/*
 * Channels in meshd (node/meshd/channel*.c) over the fake transport: the fixture of the
 * test_channel*.c programs, one per part of the channel layer. The test plays three parts:
 *
 * - the peer meshd: its ChannelOpen/Accept/Reject/Eof/Close/CloseAck arrive as SENDs on QP 0 of the
 *   link, its data and credits as RECV_IMM completions on the QP they came by; the writes we post
 *   land in memory the test owns (the peer's RX ring and credit word, checked against the keys it
 *   announced) when the test completes them;
 * - the application: the fake channel_ops.deliver keeps its own copies of the four descriptors, as
 *   SCM_RIGHTS would; the test maps the memfd, writes and reads the rings, publishes indices, kicks,
 *   shuts its write side and closes its lifeline as libmesh would;
 * - meshd's loop: transport events go through mesh_handle_event() + mesh_reap() (harness deliver()),
 *   kicks and lifelines as meshd's loop takes them (channel_on_kick_fast() + channel_pump_wanted(),
 *   channel_on_lifeline()) + mesh_reap().
 *
 * We are node 2 of {1, 2, 3}: the link to node 1 is UP (we dialled it), the link to node 3 is DOWN.
 * A case takes a struct ct from ct_setup (T()), brings the link up with ct_init() (ct_init_resume():
 * with channels resuming across a lost link) and ends in mt_finish().
 */
#ifndef MESH_TESTS_CHANNEL_HARNESS_H
#define MESH_TESTS_CHANNEL_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mesh/mesh.h>

#include "channel.h"
#include "channel_internal.h"
#include "mesh_harness.h"

#define SELF 2u
#define PEER 1u       /* link UP */
#define DOWN_NODE 3u  /* link DOWN: node 3 dials us and has not */
#define UNKNOWN_NODE 9u
#define RING MESH_RING_MIN /* 4 KiB rings: chunks of a quarter, 1 KiB */
#define CHUNK (RING / 4)
#define CLIENT_FD 1001 /* a connecting client: only a number to channel.c and to the fake deliver */
#define LISTEN_FD 1002
#define ROOT 0u     /* the uid of a client (SO_PEERCRED) */
#define ALICE 1000u
#define BOB 1001u
#define PEER_SLOT 7u /* the peer meshd's slot of a channel */
#define PEER_RX_RKEY 0x5eed0001u
#define PEER_CREDIT_RKEY 0x5eed0002u
#define PEER_DIRECT_RKEY 0x5eed0003u
#define PEER_HINT_RKEY 0x5eed0004u
#define ACCESS_RW (XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_WRITE)
#define MAX_APPS 64
#define MAX_CHANS 6
#define MAX_IDS (2 * MESH_CH_BUCKETS) /* channel ids and slots the harness tracks (channel_find__ tests a second bucket round) */

enum { FD_MEMFD, FD_LIFELINE, FD_KICK, FD_WAKE }; /* the order of channel_ops.deliver's fds[] */

/* What the fake deliver got: a reply to a client and, with a channel, the application's copies of
 * its four descriptors and (once app_map() ran) the mapped ring. */
struct app {
	int client_fd;
	int status;
	char why[128];
	bool setup;
	uint32_t channel_id, qps;
	uint64_t ring_size;
	size_t map_len;
	uint16_t local_port, peer_port;
	int fds[4];
	uint8_t *map;
	struct mesh_ring_ctrl *ctrl;
	uint8_t *tx, *rx;
	uint64_t tx_prod, rx_cons; /* what this application published */
};

/* One channel as the test sees it. */
struct chan {
	uint32_t id;        /* meshd's channel id */
	uint32_t slot;      /* ours: what the peer's messages and immediates name */
	uint32_t peer_slot; /* the peer's: what ours name */
	uint16_t local_port;
	uint64_t size;
	struct app *app;
	/* what we announced: our RX ring and credit word (meshd's memory, written by the "peer") */
	uint8_t *our_rx;
	uint64_t *our_credit;
	uint32_t our_rx_rkey, our_credit_rkey;
	/* the peer's RX ring and credit word: the targets of our writes */
	uint8_t *peer_rx;
	uint64_t *peer_credit;
	/* the peer's direct pair, when it announces one (open_out_direct): {pos, check} */
	uint64_t *peer_dir;
	/* our direct pair, from our Open or Accept */
	struct mesh_ring_direct *our_dir;
	uint32_t our_dir_rkey;
	/* the peer's pair hint, when it announces one (open_out_hinted), and ours from our Open */
	uint64_t *peer_hint, *our_hint;
};

struct ct {
	struct mt t; /* first: the harness's fixture */
	struct link *l;
	struct app apps[MAX_APPS];
	size_t n_apps;
	int deliver_err; /* armed: the next deliver fails with it (the client is gone) */
	uint32_t aq_caps;  /* what our application's offers say it takes (aq_on: today's libmesh's) */
	unsigned watch_add[MAX_IDS], watch_del[MAX_IDS];
	unsigned moved[MAX_IDS];   /* channel_ops.moved calls */
	uint32_t moved_from[MAX_IDS];
	struct chan chans[MAX_CHANS];
	size_t n_chans;
	/* immediates the peer sent to each of our slots (data, credit): what its Close counts */
	uint64_t peer_imms[MAX_IDS][2];
};

/* ---- the application's side: channel_ops ------------------------------------------------------ */

/* The fake application's channel_ops (ct_init installs them): deliver notes the reply in the next
 * struct app, watch and moved count their calls per channel id. */
int app_deliver(void *ctx, int fd, int status, const char *why, const struct channel *ch, const int fds[4]);
void app_watch(void *ctx, struct channel *ch, bool add);
void app_moved(void *ctx, struct channel *ch, uint32_t from);

/* Maps the memfd as libmesh does and checks the control page meshd filled in. */
void app_map(struct app *a);

/* Unmaps the ring and closes the application's descriptors (what it does on exit). */
void app_close(struct app *a);

/* Byte `pos` of a stream; salt tells the directions apart. */
uint8_t pat(uint64_t pos, uint8_t salt);

#define SALT_OUT 0xa5 /* our application's stream */
#define SALT_IN 0x5a  /* the peer's stream */

/* The application appends n bytes to TX and publishes tx_prod. */
void app_write(struct chan *h, uint32_t n);

/* The application reads n bytes (checking them) and publishes rx_cons. */
void app_read(struct chan *h, uint64_t n);

/* The application shuts its write side (MESH_APP_SHUT_WR), without a kick. */
void app_shut_wr(struct chan *h);

/* What meshd's loop does with a readable kick (main.c, run): the thread of the channel's rail
 * takes it under its rail's lock, then, under every lock, pumps what it left to the usual way. */
void loop_kick(struct mesh *m, uint32_t id);

/* Writes the kick eventfd; meshd's loop then sees it readable. */
void app_kick(struct ct *c, struct chan *h);

/* The application closes (or dies): its lifeline end goes, meshd's loop sees the hang-up. */
void app_hangup(struct ct *c, struct chan *h);

/* What meshd published in the ring's control page, as the application reads it. */
uint32_t ring_state(const struct chan *h);
int32_t ring_error(const struct chan *h);
uint64_t ring_tx_cons(const struct chan *h);
uint64_t ring_rx_prod(const struct chan *h);

/* ---- fixture -------------------------------------------------------------------------------- */

/* A zeroed struct ct with the fake transport (mt_open); the teardown closes what the applications
 * kept and frees the peer's memory. */
int ct_setup(void **state);
int ct_teardown(void **state);

/* Every SEND of ours still outstanding on QP 0 completes (the peer received it). */
void complete_sends(struct ct *c);

/* Brings the link to node 1 UP over qps QPs, with the fake application attached. */
void ct_init(struct ct *c, uint32_t qps);
/* The same up to the dial: the link to node 1 dialled, not UP yet (drive_to_up takes it there). */
void ct_init_dialled(struct ct *c, uint32_t qps);

/* meshd's channel h (fails the case if it is gone); the channel in our slot of the link, or NULL. */
struct channel *chn(struct ct *c, const struct chan *h);
struct channel *link_channel_of(struct ct *c, uint32_t slot);

/* A new struct chan of the test with the peer's RX ring and credit area; the peer's slot is peer_slot. */
struct chan *chan_new(struct ct *c, uint64_t size, uint32_t peer_slot);

/* ---- what we sent ----------------------------------------------------------------------------- */

/* The nth message of kind `body` we sent since post index `from`, decoded (free it), or NULL. */
PeerMsg *sent_msg(struct ct *c, size_t from, PeerMsg__BodyCase body, size_t nth);

/* How many messages of kind `body` we sent since from. */
size_t sent_count(struct ct *c, size_t from, PeerMsg__BodyCase body);

/* Our ChannelClose to channel h (the first since from): its reason. Fails if there is none. */
int sent_close_reason(struct ct *c, const struct chan *h, size_t from);

/* The reason of our first ChannelReject since from. */
int sent_reject_reason(struct ct *c, size_t from);

/* The post is a credit WRITE_WITH_IMM (its immediate says so), not data. */
bool is_credit(const struct fake_post *p);

/* The nth data (credit false) or credit WRITE_WITH_IMM of channel h posted since from, or NULL. */
struct fake_post *write_post(struct ct *c, const struct chan *h, size_t from, bool credit, size_t nth);

/* How many of those were posted since from. */
size_t write_count(struct ct *c, const struct chan *h, size_t from, bool credit);

/* The peer's NIC executes a write we posted (data into its RX ring, a credit into its credit word,
 * both checked against what it announced), then our QP reports the completion. */
void complete_write(struct ct *c, struct chan *h, struct fake_post *p);

/* Completes every data write of channel h posted since from and not completed yet, in order. */
void complete_data(struct ct *c, struct chan *h, size_t from);

/* ---- what the peer sends ---------------------------------------------------------------------- */

/* On the first QP of the rail that carries control; with several rails a well-behaved peer numbers
 * its control messages (the next one we expect) and acks all of ours. */
void peer_msg(struct ct *c, PeerMsg *m);

/* A WRITE_WITH_IMM of the peer reaches QP qp: a receive of ours there completes with the immediate. */
void peer_imm(struct ct *c, uint32_t qp, uint32_t imm, uint32_t len);

/* The peer sends bytes [pos, pos + len) of its stream as chunk seq over QP qp: they land in the RX
 * ring we announced, then the immediate arrives. */
void peer_data(struct ct *c, const struct chan *h, uint32_t qp, uint16_t seq, uint64_t pos, uint32_t len);

/* The peer's reader consumed up to cons and its meshd has placed up to placed: its credit write
 * number n (counted as meshd counts what arrives) lands in our credit slot n, then its immediate. */
void peer_credit_placed(struct ct *c, const struct chan *h, uint64_t cons, uint64_t placed);

/* The same, placed as far as it said before, or the reader. */
void peer_credit(struct ct *c, const struct chan *h, uint64_t cons);

/* The peer's channel messages: its Open and Accept announce its ring and credit area (and its direct
 * pair and pair hint when h has them), with the PEER_*_RKEY keys. */
void peer_open(struct ct *c, const struct chan *h, uint16_t src_port, uint16_t dst_port, uint32_t qps);
void peer_accept(struct ct *c, const struct chan *h);
void peer_reject(struct ct *c, uint32_t slot, int reason);
void peer_eof(struct ct *c, const struct chan *h, uint64_t total);

/* The peer's Close counts the immediates it sent to channel h (peer_close_n: other counts). */
void peer_close_n(struct ct *c, const struct chan *h, int reason, uint64_t chunks, uint64_t credits);

void peer_close(struct ct *c, const struct chan *h, int reason);
/* Its CloseAck counts the immediates it sent to channel h, as its Close does. */
void peer_close_ack(struct ct *c, const struct chan *h);
void peer_keepalive(struct ct *c, uint64_t seq);

/* ---- opening channels ------------------------------------------------------------------------- */

/* channel_connect to node 1; notes what the ChannelOpen announced. The channel is OPENING. */
struct chan *connect_out(struct ct *c, uint16_t port, uint64_t size, uint32_t qps, uint32_t peer_slot);

/* The peer accepts: the connecting client gets the channel, and maps it. */
void accept_out(struct ct *c, struct chan *h);

/* Both: a channel we opened to port 5000 of node 1, OPEN and mapped by its application. */
struct chan *open_out(struct ct *c, uint64_t size, uint32_t qps, uint32_t peer_slot);

/* The peer opens a channel to our port, where LISTEN_FD listens: we deliver it and accept. */
struct chan *open_in(struct ct *c, uint16_t src_port, uint16_t dst_port, uint64_t size, uint32_t qps,
		     uint32_t peer_slot);

/* The channel's six registrations, the latest of each kind (access, length; the pair hint in and
 * the direct pair have the same, the hint is in the credit page). */
struct ch_regs {
	const struct fake_reg *tx, *rx, *cin, *cout, *dir, *hin;
};

/* The registrations of the latest channel with rings of `size`; each must exist. */
struct ch_regs find_regs(struct ct *c, uint64_t size);

/* Channel h broke with err: the ring says so, the link stays UP, nothing more is posted. */
void expect_broken(struct ct *c, struct chan *h, int err);

/* ---- what we wrote, checked --------------------------------------------------------------------- */

/* The data writes posted since from: striped round-robin from QP q0, consecutive sequence numbers
 * from seq0 and stream positions from pos0, each at most `chunk` bytes, never across the ring's
 * end, each to the peer's ring at pos & (size - 1) with its key, sourced from our TX ring at the
 * same offset. Returns the bytes they carry. */
uint64_t check_data_posts(struct ct *c, struct chan *h, size_t from, uint32_t q0, uint16_t seq0, uint64_t pos0,
			  uint32_t chunk);

/* The peer's ring holds our stream's bytes [lo, hi). */
void check_peer_ring(const struct chan *h, uint64_t lo, uint64_t hi);

/* ---- resuming across a lost link (cluster.resume_timeout_ms) ----------------------------------- */

#define RESUME_MS 30000u

/* The link's QP 1 dies: the link goes DOWN (the QPs and what was in flight on them are gone). */
void link_lost(struct ct *c);

/* We re-dial (after the backoff, `after_ms` from now) and the link comes UP again. */
void link_back(struct ct *c, uint64_t after_ms);

/* The registration whose remote key is rkey. */
const struct fake_reg *reg_of_rkey(const struct ct *c, uint32_t rkey);

/* Our ChannelResume to channel h (the first since from), decoded; free it. */
PeerMsg *sent_resume(struct ct *c, const struct chan *h, size_t from);

/* The peer's ChannelResume: where its receiving half stands (rx_bytes placed, the next rx_seq, its
 * reader at rx_cons), on rail `rail` (peer_resume: the channel's own), with its ring and keys. */
void peer_resume_on(struct ct *c, const struct chan *h, uint64_t rx_bytes, uint16_t rx_seq, uint64_t rx_cons,
		    bool eof_known, uint32_t rail);
void peer_resume(struct ct *c, const struct chan *h, uint64_t rx_bytes, uint16_t rx_seq, uint64_t rx_cons,
		 bool eof_known);

/* ct_init, with channels resuming across a lost link for RESUME_MS. */
void ct_init_resume(struct ct *c, uint32_t qps);

/* A case of one of the test_channel*.c programs: a fresh struct ct around it. */
#define T(f) cmocka_unit_test_setup_teardown(f, ct_setup, ct_teardown)

/* Every program's group set-up: every log message formatted (MESH_TEST_QUIET: errors only). */
int ct_group_setup(void **state);

#endif
