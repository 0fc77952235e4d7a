/*
 * Stream channels inside meshd: the shared-memory rings of local applications (proto/ring.h),
 * the ChannelOpen/Accept/Reject/Eof/Close/CloseAck exchange with the peer meshd over the link's
 * control QP, and the data path: new TX bytes go as RDMA WRITE_WITH_IMM, striped round-robin over
 * the channel's QPs, from the TX ring straight to the same offset of the peer's RX ring; the
 * receiver reorders chunks by sequence number and publishes them; credits (the reader's rx_cons)
 * come back by WRITE_WITH_IMM into the sender's credit word. meshd never copies payload.
 *
 * Closing never breaks the link: a side sends ChannelClose only once none of its writes is in
 * flight, and frees the registered rings only after the peer's ChannelCloseAck (which the peer
 * sends once it has no write in flight either) or after acknowledging the peer's Close.
 */
#ifndef MESH_MESHD_CHANNEL_H
#define MESH_MESHD_CHANNEL_H

#include <stdbool.h>
#include <stdint.h>

#include "ring.h"
#include "transport.h"
#include "wire.h"

#define CH_WINDOW 256u          /* chunks in flight per direction (sender); < 2^16 for the sequence numbers */
/* Largest WRITE_WITH_IMM of the data path (and a quarter of the default ring): every chunk costs
 * a work request, a completion, an immediate and its receive at both ends, and over tcp a frame
 * and two system calls, so streams move in chunks as large as the ring allows (docs/design.md). */
#define CH_CHUNK_MAX (256u << 10)
#define CH_PORT_PRIVILEGED 1024u /* ports below it: root's to listen on, as in TCP */
#define CH_CREDIT_PAGE 4096u     /* the credit words' own mapping: the slots in (peer writes), then out */
#define CH_CREDIT_OUT (2u * MESH_CREDIT_SLOTS) /* index of the out words (our credit, as posted) */
#define CH_DIRECT_OUT (CH_CREDIT_OUT + 2u)     /* then the direct pair we write to the peer (ring.h) */
#define CH_HINT_OUT (CH_DIRECT_OUT + 2u)       /* then the pair hint we write to the peer (wire.h) */
#define CH_HINT_IN (CH_HINT_OUT + 2u)          /* then the pair hint the peer writes (remote write) */
/* The receiving side asks for no more direct pairs once this many chunks in a row arrived while
 * none of them had been read through a pair, and asks for them again once both CH_PAIRS_RETRY_MS
 * and CH_PAIRS_RETRY_CHUNKS chunks have passed: a reader that starts to poll has them back within
 * about a second on a busy channel, and one that still sleeps pays for at most one pair in 65. */
#define CH_PAIRS_IDLE_MAX 16u
#define CH_PAIRS_RETRY_MS 1000u
#define CH_PAIRS_RETRY_CHUNKS 1024u

struct mesh;
struct link;

enum ch_state {
	CH_OPENING, /* opener: ChannelOpen sent, waiting for Accept/Reject */
	CH_OPEN,
	CH_CLOSING, /* no more data moves; the close handshake or the application is pending */
};
/* An OPEN channel whose link went DOWN stays CH_OPEN with `resuming` set (shown RESUMING): nothing
 * moves until the link is UP again to the same peer meshd and both halves resumed (ChannelResume),
 * or resume_timeout_ms passed. */

struct channel {
	uint32_t id; /* node-wide, shown by meshctl */
	struct mesh *mesh;
	struct link *link;
	struct channel *next; /* mesh's list */
	uint32_t slot, peer_slot;
	uint16_t local_port, peer_port;
	uint32_t peer_node; /* meshd's own record (the ring's copy is the application's to overwrite) */
	uint32_t owner_uid; /* the local user it counts against: the opener's, or the listener's */
	bool opener;
	enum ch_state state;
	uint64_t size;
	uint32_t qps, next_qp, chunk;
	uint32_t rail, qp0; /* the rail and the link's index of its first QP (rail * qps_per_link) */
	uint64_t open_ms;
	int numa_want; /* node the rings and credit page were placed on, -1 unplaced */

	/* shared memory and descriptors (meshd's ends) */
	void *map;
	size_t map_len;
	struct mesh_ring_ctrl *ctrl;
	uint8_t *tx, *rx;
	int memfd, kick_fd, wake_fd, life_fd, app_life_fd;

	/* registered memory: TX (local), RX (peer writes), credit slots in (peer writes), credit,
	 * direct pair and pair hint out (local), our direct pair in the control page (peer writes),
	 * the pair hint in (peer writes) */
	xport_mr_t *mr_tx, *mr_rx, *mr_cin, *mr_cout, *mr_dir, *mr_hin;
	/* the slots the peer writes, then [CH_CREDIT_OUT..+1] ours, [CH_DIRECT_OUT..+1], [CH_HINT_OUT..+1],
	 * [CH_HINT_IN..+1] the peer's */
	uint64_t *credit;
	uint64_t peer_rx_addr, peer_credit_addr, peer_direct_addr, peer_hint_addr;
	uint32_t peer_rx_rkey, peer_credit_rkey, peer_direct_rkey; /* peer_direct_rkey 0: no direct pair */
	uint32_t peer_hint_rkey;                                   /* 0: the peer takes no pair hint */

	/* TX: app published app_tx_prod; we posted tx_sent; writes done up to tx_done */
	uint64_t app_tx_prod, tx_sent, tx_done, peer_cons, peer_placed;
	uint16_t tx_seq, tx_done_seq;
	uint32_t tx_len[CH_WINDOW];
	bool tx_ok[CH_WINDOW];
	uint8_t tx_qp[CH_WINDOW]; /* the QP (of the channel's) each chunk went on: what a direct pair covers */
	bool stalled;
	bool slow_wanted; /* the fast path left it to the usual pump (channel_pump_wanted) */
	struct channel *rail_next; /* its rail's list (struct mesh_chans) */
	struct channel *id_next;   /* its bucket (struct mesh_chans) */
	/* A QP refused a write of this resumable channel at refused_ms (0: none): nothing is posted
	 * until its rail or link goes down and the channel resumes (channel_refused). */
	uint64_t refused_ms;
	uint32_t refused_qp;
	int refused_err;
	/* Direct receive: one pair write in flight at a time, covering direct_posting; direct_sent is
	 * the largest position a pair was posted for. */
	bool direct_busy;
	uint64_t direct_sent, direct_writes;
	/* Pairs on demand (wire.h MESH_PAIR_HINT_*), as the receiving side: whether our reader takes
	 * the peer's pairs (pairs_wanted, judged from the last pairs_idle chunks; when off, asked
	 * again after pairs_idle chunks and the time since pairs_off_ms reach CH_PAIRS_RETRY_*), what
	 * we last told the peer (pairs_told: -1 not known, since a resume), one hint write in flight
	 * at a time. */
	bool pairs_wanted, hint_busy;
	int8_t pairs_told;
	uint32_t pairs_idle;
	uint64_t pairs_off_ms, hint_writes;

	/* RX: chunks in order up to rx_bytes; the app consumed app_rx_cons; we credited credit_sent.
	 * rx_len holds rx_window chunk lengths (channel_rx_window: larger than the sender's window). */
	uint16_t rx_seq;
	uint32_t rx_window;
	uint32_t *rx_len;
	uint64_t rx_bytes, app_rx_cons, credit_sent, credit_posting;
	bool credit_busy;
	bool eof_known;
	uint64_t eof_total;

	/* Immediates of the peer seen on this slot, and what its Close or CloseAck says it sent: the
	 * slot is freed only once both counts are reached (peer_final). */
	uint64_t imm_chunks_seen, imm_credits_seen, credit_writes;
	bool peer_final;
	uint64_t peer_final_chunks, peer_final_credits;

	/* Resuming: each side tells the other where its receiving half stands (resume_rx_sent) and
	 * rewinds its sending half to what the other said (resume_tx_done). */
	bool resuming, resume_rx_sent, resume_tx_done;
	uint64_t resume_deadline_ms;
	uint64_t peer_boot; /* the peer meshd's boot epoch when the channel opened */
	uint8_t xp;         /* the provider its rings are registered with (the link's when it opened) */
	bool local;         /* to this node: its peer is another channel of this meshd (channel_local_run) */
	bool kept;          /* its descriptors are in the service manager's store (channel_store.c) */
	uint64_t resumes, rewritten_bytes;
	uint64_t posted_chunks; /* data writes posted since the last resume: what Close counts */
	uint64_t rail_moves;    /* times it moved off a failed rail */
	bool imm_void;          /* its rail failed during its close: the counts of the peer's Close are moot */

	/* Application-posted writes (ring.h AQ area): offered at hand-over (aq_offered); the state of
	 * our application's QP as last relayed (aq_app); the peer's application is ready (aq_peer_ready);
	 * our application posts our sending half (aq_granted; from the page's grant_pos) or was told to stop
	 * (aq_revoked); it gave the half back and we wait for the peer to say where its reader's bytes
	 * end (aq_wait_pos); the peer's application posts its half from aq_peer_from (aq_peer_sends:
	 * rx_bytes then follow its direct pairs); after a revocation nothing is granted in this round
	 * (aq_done). A resume that revoked it asks for a new round (aq_renew: ring.h round, aq_round)
	 * once the application is IDLE. The peer's offers carry its own rounds: the latest is kept
	 * (aq_pend) until our application's page can take it, and none below aq_peer_next (installed
	 * already, or stale) is; aq_peer_round is the round installed, whose READY, SENDING and
	 * REVOKE count. An application with MESH_AQ_CAP_TAKE (aq_take) takes a grant before it is its
	 * own: until then the grant is offered only (aq_untaken, from aq_from), and we may withdraw it;
	 * once taken the peer is to hear SENDING (aq_tell, until it could be sent). */
	bool aq_offered, aq_peer_ready, aq_granted, aq_revoked, aq_wait_pos, aq_peer_sends, aq_done, aq_renew;
	bool aq_take, aq_untaken, aq_tell;
	uint64_t aq_from;
	uint64_t aq_withdrawn; /* grants withdrawn before they were taken (bytes published meanwhile) */
	uint8_t aq_app;
	uint32_t aq_round, aq_peer_round;
	uint64_t aq_grants; /* times our application was granted the sending half */
	uint64_t aq_peer_from, aq_peer_next;
	struct {
		bool valid, ready;
		uint32_t round, qpn, psn, rx_rkey, dir_rkey, caps, tcp_port;
		uint64_t rx_addr, dir_addr;
		uint8_t tcp_token[MESH_AQ_TOKEN_LEN];
	} aq_pend;

	/* lifecycle */
	uint32_t inflight; /* data and credit writes posted, not completed */
	bool app_gone, app_shut, eof_sent, close_sent, ack_rcvd, close_rcvd, ack_sent;
	bool accept_pending; /* acceptor: ChannelAccept not sent yet (send buffers busy) */
	bool open_pending;   /* opener: ChannelOpen not sent yet (send buffers busy): the peer knows nothing */
	int error;          /* negative errno once broken */
	int reply_fd;       /* opener: the client waiting for the connect result, -1 none */
	char why[96];

	/* counters */
	uint64_t tx_bytes, rx_bytes_total, tx_chunks, rx_chunks, credit_stalls;
	uint32_t published_state; /* what the ring shows, to wake the application only on a change */
	uint64_t published_tx, published_rx;
};

struct listener {
	struct listener *next;
	uint16_t port;
	int fd;       /* the client connection that listens */
	uint32_t uid; /* its user (SO_PEERCRED): channels accepted on the port are theirs */
	bool kept;    /* its connection is in the service manager's store (channel_store.c) */
};

/* What admin_channel.c provides: delivery of a channel to an application. */
struct channel_ops {
	/* Sends a CtlReply (status, or a ChannelSetup with the four descriptors) on client fd. */
	int (*deliver)(void *ctx, int fd, int status, const char *why, const struct channel *ch, const int fds[4]);
	/* epoll registration of a channel's kick and lifeline fds (add = false: remove). The kick
	 * goes to the set of the thread of the channel's rail. */
	void (*watch)(void *ctx, struct channel *ch, bool add);
	/* The channel moved from rail `from` to ch->rail: its kick moves to that rail's thread. */
	void (*moved)(void *ctx, struct channel *ch, uint32_t from);
	/* A listening client's connection the last meshd kept (channel_store.c): served as a client
	 * again, listening on port. Takes the descriptor (closed on failure); 0 or -errno. */
	int (*adopt)(void *ctx, int fd, uint16_t port);
	void *ctx;
};

/* Buckets of the channels by id (struct mesh_chans): ids are given in sequence, so they spread evenly. */
#define MESH_CH_BUCKETS 1024u

struct channel_local;

/* The channel layer's state of one mesh (mesh->chans): allocated by channel_layer_init and freed by
 * the layer's cleanup (mesh_cleanup, through struct mesh_upper). The link layer below only carries
 * the pointer: it never looks inside. */
struct mesh_chans {
	struct channel *channels;
	/* The same channels by rail (linked by rail_next): what a rail's thread polls and flags
	 * under its rail's lock alone. Changed only under every lock (creation, free, a move). */
	struct channel *rail_channels[MESH_RAILS_MAX];
	/* The same channels by id (linked by id_next, bucket id % MESH_CH_BUCKETS): a kick or a
	 * lifeline names its channel by id, and finding it must not cost a walk of every channel. */
	struct channel *ch_by_id[MESH_CH_BUCKETS];
	struct listener *listeners;
	/* Connects waiting for their link to come UP (CtlRequest.link_wait_ms, channel_client.c): one
	 * per control connection, so as many as the control socket has clients (admin.h) at most. */
	struct link_wait *link_waits;
	uint32_t next_channel_id, n_channels;
	struct channel_ops ch_ops;
	struct channel_local *local; /* channels to this node (channel_local.c), created on first use */
	/* `meshctl drain`: no new channel (opened here, by a peer, or a new port) from now on; meshd
	 * stops once no channel is left, or at drain_deadline_ms (main.c), failing what is left with
	 * MESH_EDRAINING. */
	bool draining;
	uint64_t drain_deadline_ms;
};

/* Puts channels on the links of m (after mesh_init): allocates m->chans and sets m->upper to
 * channel_upper, whose cleanup (called by mesh_cleanup) frees them again. 0 or -ENOMEM. */
int channel_layer_init(struct mesh *m);

/* The receiver's window of chunk sequence numbers for a channel over qps QPs. The sender keeps at
 * most CH_WINDOW chunks beyond its own completions, but a completion means the peer's NIC took the
 * chunk, not that the peer's meshd has seen it: each QP has its own CQ, drained one after the
 * other, so a receiver that lags on QP q holds at most that QP's posted receives (LINK_DATA_RECVS)
 * of q's chunks unseen, and strict round-robin striping puts q's next chunk within qps of each.
 * So an arriving chunk is less than CH_WINDOW + qps * (LINK_DATA_RECVS + 1) past rx_seq: the window
 * is the next power of two, at most 8192 for 16 QPs (under half the 16-bit sequence space). */
uint32_t channel_rx_window(uint32_t qps);

/* Requests from local clients (uid: the client's, from SO_PEERCRED). Return 0 when answered later
 * (connect) or done, else a negative errno to answer now; *why names the problem. A port has one
 * listener; ports below 1024 are root's, as in TCP. Every channel counts against its owner's
 * cluster.max_channels_per_uid and max_ring_bytes_per_uid: beyond them -EDQUOT. */
int channel_listen(struct mesh *m, uint16_t port, int client_fd, uint32_t uid, const char **why);
/* numa_hint: the application's node for the channel, -1 none; caller_node: the node the connecting
 * thread ran on, -1 unknown; rail: the rail asked for, -1 none. With several rails the device is the
 * rail asked for, else the one on the hint's node, else on the caller's node, else rail 0. */
int channel_connect(struct mesh *m, uint32_t node, uint16_t port, uint64_t ring_size, uint32_t qps, int numa_hint,
		    int caller_node, int rail, int client_fd, uint32_t uid, const char **why);
/* A connect whose link is not UP yet may wait for it (CtlRequest.link_wait_ms): channel_connect
 * with its arguments kept, tried again when the link comes UP (then answered as channel_connect
 * answers), answered -ETIMEDOUT when wait_ms passed first, -MESH_EDRAINING when the node drains
 * meanwhile, -MESH_EUNKNOWNNODE when a reload removed the node; abandoned when its client goes. One
 * per client connection (-EALREADY for a second): the control socket's client limits bound them. */
struct channel_connect_args {
	uint32_t node;
	uint16_t port;
	uint64_t ring_size;
	uint32_t qps;
	int numa_hint, caller_node, rail;
	int client_fd;
	uint32_t uid;
};
struct link_wait {
	struct link_wait *next;
	struct channel_connect_args a;
	uint32_t wait_ms;
	uint64_t deadline_ms;
};
int channel_connect_wait(struct mesh *m, const struct channel_connect_args *a, uint32_t wait_ms, const char **why);
/* A client connection went away: its listeners go, its pending or waiting connect is abandoned. */
void channel_client_gone(struct mesh *m, int client_fd);

/* What the link layer tells channels (mesh.h, struct mesh_upper): a channel message, an immediate or
 * a completion of the data path, the link DOWN (open channels wait as RESUMING when
 * cluster.resume_timeout_ms and the peer allow, the others break), UP again (waiting channels resume
 * if the peer meshd is the same process, else fail with -MESH_EPEERRESTART), a rail of an UP link
 * lost (its open channels move to another rail and resume there: the opener picks it,
 * ChannelResume.rail; closing ones finish their close without it), the tick (connect and resume
 * timeouts, a pump of every channel: a lost wake-up never hangs anyone) and the exit. The one way
 * mesh.c reaches channel.c: whoever sets the mesh up calls channel_layer_init, which sets
 * mesh->upper = &channel_upper. */
struct mesh_upper;
extern const struct mesh_upper channel_upper;

/* The channels the last meshd kept in the service manager's store (channel_store.c): n descriptors
 * and their names (sd_listen_fds_with_names), taken by the channels restored (RESUMING on their
 * links) or dropped from the store and closed. Before the first link forms and after the channel
 * ops are set. Returns how many were restored. */
int channel_store_restore(struct mesh *m, const int *fds, char *const *names, size_t n);

/* From meshd's loop: the application kicked, or its lifeline closed. A kick is taken by the
 * rail's thread under its rail's lock alone (the kick descriptor sits in the epoll set of the
 * thread of the channel's rail, channel_ops.watch): a channel that only moves data is pumped for
 * it at once, another is marked for channel_pump_wanted. A channel that moved
 * to another rail meanwhile is left alone, its kick unread: its descriptor now sits in the other
 * rail's set, which reports it (level-triggered). Returns whether the kick was taken. */
bool channel_on_kick_fast(struct mesh *m, uint32_t id, uint32_t rail);
void channel_on_lifeline(struct mesh *m, uint32_t id);
/* Polling (main.c's hot loop, one per rail): pumps every channel of the rail whose application
 * published something since the last pump, without a kick; returns how many moved.
 * channel_set_polling tells every ring of the rail whether meshd polls it (MESH_DAEMON_POLLING:
 * applications skip their kicks); after clearing it the caller must call channel_poll once more
 * before it sleeps. */
int channel_poll(struct mesh *m, uint32_t rail);
/* The same under the rail's lock alone (mesh.h, struct mesh_locks): channels that only move data
 * are pumped for their data; the others are marked for channel_pump_wanted, which the rail's
 * thread calls under every lock (it pumps every marked channel). */
int channel_poll_fast(struct mesh *m, uint32_t rail);
void channel_pump_wanted(struct mesh *m, uint32_t rail);
/* Channels to the local node: what a peer's meshd would be told (control messages, immediates and
 * completions of the writes) is queued and delivered here, after the batch that queued it, never
 * from inside a handler. Delivers what was queued when called (what that queues waits for the
 * next call) and returns whether more is queued: the caller then must not sleep. */
bool channel_local_run(struct mesh *m);
bool channel_local_pending(const struct mesh *m);
void channel_set_polling(struct mesh *m, uint32_t rail, bool on);
struct channel *channel_find(struct mesh *m, uint32_t id);
const char *channel_state_name(const struct channel *ch);
bool channel_pairs_paused(const struct channel *ch);

#endif
