/*
 * The mesh: one link per configured peer, the dial rule, admission of handshakes, and the link
 * state machine. Driven by three entry points so that it runs the same under meshd's epoll loop
 * and under the unit tests' fake transport:
 *   mesh_handle_event()  for every event a transport poll returns,
 *   mesh_reap()          after each batch of events (destroys detached connections),
 *   mesh_tick()          periodically (keepalives, timeouts, re-dials).
 */
#ifndef MESH_MESHD_MESH_H
#define MESH_MESHD_MESH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "auth.h"
#include "config.h"
#include "log.h"
#include "metrics.h"
#include "numa_topo.h"
#include "ping.h"
#include "transport.h"
#include "wire.h"

/* Phases of one link attempt; links_state() maps them to DOWN / CONNECTING / UP. */
enum link_phase {
	LINK_IDLE,       /* no attempt: DOWN (dialler: waiting for the next dial) */
	LINK_QPS,        /* QPs connecting */
	LINK_AUTH,       /* all QPs connected, our nonce sent: the proofs of the cluster key (key_file) */
	LINK_HELLO,      /* all QPs connected, our Hello sent, waiting for the peer's */
	LINK_PROOF,      /* writing and reading back our token in the peer's mailbox */
	LINK_READY_WAIT, /* our proof done and Ready sent, waiting for the peer's Ready */
	LINK_UP,
};

enum link_state { LINK_STATE_DOWN_, LINK_STATE_CONNECTING_, LINK_STATE_UP_ };

#define MESH_XPORTS_MAX 2 /* rdma and tcp */
/* Transport instances: one per provider and rail (each listens on one of the node's addresses),
 * laid out provider-major: instance p * n_rails + r. */
#define MESH_XPORT_INSTANCES (MESH_XPORTS_MAX * MESH_RAILS_MAX)
/* QPs of a link: qps_per_link on every rail; QP r * qps_per_link + i is QP i of rail r. */
#define LINK_CONNS_MAX (MESH_QPS_PER_LINK_MAX * MESH_RAILS_MAX)
_Static_assert(LINK_CONNS_MAX <= 64, "link->est_mask has a bit per QP");
#define LINK_RECV_BUFS 64   /* the first QP of each rail: buffered receives (control messages on rail 0,
			     * every rail's keepalives, data immediates) */
/* Queue depths one short of a power of two: Soft-RoCE keeps one slot of each ring empty and rounds
 * the slots up to a power of two, so 128 work requests would allocate (zero, map, unmap) 256 slots
 * and a CQ for 256 completions 512: twice each QP's memory. Hardware providers round 127 up to 128
 * themselves. 127, not 255: 111 data writes in flight per QP are 7 MiB of 64 KiB chunks, past any
 * link's bandwidth-delay product, and at 255 the queues of 64 meshd forming on one machine took
 * nearly a gigabyte (docs/design.md, "Queue depths of 127"). */
#define LINK_DATA_RECVS 127 /* the other QPs: receives without a buffer, for data immediates */
#define LINK_SEND_BUFS 32   /* send slots; a sequenced control message keeps its slot until the peer acks it */
#define LINK_SQ_DEPTH 127   /* send queue depth of every QP */
#define LINK_SQ_CONTROL 16  /* of which the data path leaves this many for control messages */
#define LINK_REJECTS_PENDING 32
#define LINK_ERR_MAX 160
#define LINK_EPOCH_AHEAD_US (600ull * 1000000) /* a connect's epoch may lead our clock by 10 minutes */
/* With several providers (transport "auto"), a link that went DOWN re-dials over the provider it
 * was UP on for this long before it alternates: a peer meshd restarting refuses connections for
 * the second or so it takes to start, and the other provider's attempt to a peer without it (an
 * rdma dial to a tcp-only node) waits out its whole connect timeout before tcp is tried again. */
#define LINK_XP_STICKY_MS 10000u
#define REJECT_LOG_BURST 20u           /* refusals logged per interval, at most */
#define REJECT_LOG_INTERVAL_MS 10000u

struct mesh;
struct mesh_chans;
struct channel;

struct link {
	struct mesh *mesh;
	const struct config_node *peer;
	bool dialer; /* our id is higher: we dial */
	uint8_t xp;  /* index in mesh->xports of the current (or last) attempt's provider */
	uint8_t xp_up;    /* once UP (ups > 0): the provider it was last UP over, until down_ms */
	uint64_t down_ms; /* (LINK_XP_STICKY_MS) */
	enum link_phase phase;
	uint64_t epoch;
	/* Acceptor with a key: the epoch of the last attempt whose dialler proved the key. An attempt
	 * that ends before the proof puts epoch back to it (link_epoch_forget_unproven); epoch_ended
	 * keeps the ended attempt's epoch, so a late QP of it is still stale. */
	uint64_t epoch_proven;
	uint64_t epoch_ended;
	uint64_t phase_ms;   /* when the current phase began */
	enum link_state shown; /* the state meshctl shows, and since when: re-dials of a DOWN link */
	uint64_t shown_ms;     /* do not reset it */
	uint64_t attempt_ms; /* when the current attempt began */
	xport_conn_t *conns[LINK_CONNS_MAX];
	uint64_t est_mask; /* established QPs of the current attempt (bit i: QP i): link_qps_established() */

	/* Registered memory: receive slots (LINK_RECV_BUFS per rail), send slots and proof scratch
	 * (local), and the mailbox the peer may write and read (remote). Allocated once, registered per
	 * attempt on rail 0, whose QP 0 carries the control messages and whose QPs prove the mailbox
	 * key; the buffers again on every other rail's device (mr_rails), whose first QP carries that
	 * rail's keepalives. */
	uint8_t *buf;
	size_t buf_len;
	uint8_t *mailbox;
	xport_mr_t *mr_local;
	xport_mr_t *mr_mailbox; /* registered only as our Hello goes: after the peer proved the key */
	/* The protection scope of the current attempt (xport_conn.scope, link_begin): a protection
	 * domain of its own on each device, so what the link had registered in earlier attempts (the
	 * rings of channels waiting to resume) is out of reach of this attempt's QPs until it proved
	 * itself and the channels registered again in it (channel.c, link_up). */
	const void *scope;
	xport_mr_t *mr_rails[MESH_RAILS_MAX]; /* [0] unused: rail 0 uses mr_local */
	uint32_t send_busy;    /* bitmap of send slots in flight */
	uint32_t send_unacked; /* bitmap of send slots holding a sequenced message the peer has not acked */
	uint8_t send_qp[LINK_SEND_BUFS];   /* the QP a slot's send was posted on */
	uint16_t send_len[LINK_SEND_BUFS]; /* its encoded length */
	uint64_t send_seq[LINK_SEND_BUFS]; /* its control sequence number, 0: unsequenced */
	uint32_t recvs_posted; /* bitmap of rails whose first QP has its buffered receives */
	uint32_t sq_used[LINK_CONNS_MAX]; /* work requests in flight per QP */

	/* Channels of this link by slot (MESH_IMM slot of the data path). */
	struct channel **ch_slots;
	uint32_t ch_cap;
	/* ChannelRejects that found every send buffer busy, sent by the next tick. */
	uint32_t n_rejects;
	uint32_t rej_slot[LINK_REJECTS_PENDING];
	int32_t rej_reason[LINK_REJECTS_PENDING];

	/* The peer's Hello of this attempt. */
	bool have_peer_hello;
	uint64_t peer_boot_epoch;
	/* The meshd the peer's succeeds with its channels kept (Hello.predecessor_epoch), 0 none. */
	uint64_t peer_pred_epoch;
	uint64_t features; /* agreed: ours & theirs */
	uint64_t peer_mb_addr;
	uint32_t peer_mb_len;
	uint32_t peer_mb_rkey;

	uint32_t proofs_done;
	bool peer_ready;

	/* The proof of the cluster key, before anything of the link is given (auth.h): the nonces in
	 * the private data of the link's QP 0, the acceptor's proof in its accept, the dialler's as
	 * AuthProof on QP 0; a rail's join the same on the rail's first QP (bitmaps by rail). */
	uint8_t nonce_ours[AUTH_NONCE_LEN], nonce_peer[AUTH_NONCE_LEN];
	bool auth_proof_sent, peer_proved;
	uint8_t rail_nonce_ours[MESH_RAILS_MAX][AUTH_NONCE_LEN], rail_nonce_peer[MESH_RAILS_MAX][AUTH_NONCE_LEN];
	uint32_t rails_proof_sent, rails_peer_proved;

	/* Rails of an UP link (MESH_FEAT_RAILS): the link stays UP while one rail is. Control messages
	 * ride the first QP of ctl_rail (moved only when that rail fails) and are sequenced per attempt:
	 * ctl_seq the last we sent, ctl_acked the peer's ack, ctl_rcvd the last we took in order,
	 * ctl_ack_sent what our messages told the peer. A failed rail is dialled again by the dialler
	 * (rail_gen counts its incarnations) and is UP once all its QPs connected and both sides sent
	 * RailUp on it. */
	uint32_t rails_up;       /* bitmap */
	uint32_t rails_joining;  /* bitmap: QPs of a rail join in flight */
	uint32_t rails_peer_up;  /* bitmap: the peer's RailUp of the joining rail arrived */
	uint32_t rails_railup_sent; /* bitmap: our RailUp of the joining rail is sent */
	uint32_t ctl_rail;
	uint64_t ctl_seq, ctl_acked, ctl_rcvd, ctl_ack_sent;
	uint64_t ctl_resend; /* next seq to send again after a control failover, 0: none */
	uint32_t raildown_pending; /* bitmap: RailDown not sent yet (send slots busy) */
	int32_t raildown_reason[MESH_RAILS_MAX];
	uint16_t rail_gen[MESH_RAILS_MAX];
	uint32_t rail_failures[MESH_RAILS_MAX]; /* failed joins since the rail was last UP */
	uint64_t rail_next_dial_ms[MESH_RAILS_MAX];
	uint64_t rail_attempt_ms[MESH_RAILS_MAX];
	uint64_t rail_failovers; /* rails of this link that failed while it stayed UP */
	char rail_error[MESH_RAILS_MAX][LINK_ERR_MAX];
	char rail_last_error[LINK_ERR_MAX + 16]; /* "rail R: why" of the last rail failure (meshctl) */

	/* Liveness and re-dial. */
	uint64_t last_rx_ms;
	uint64_t rail_rx_ms[MESH_RAILS_MAX]; /* anything received on the rail's QPs: a silent rail is dead */
	uint64_t next_ka_ms;
	uint64_t ka_seq;
	/* Keepalives by WRITE (MESH_FEAT_KA_WRITE): our latest, posted at ka_write_us; the peer's
	 * word as last seen in our mailbox. */
	uint64_t ka_write_us, ka_write_seq, ka_word_seen;
	uint64_t rtt_us;
	/* Per rail: when our last keepalive went out, and the ones skipped because every send slot
	 * or send-queue entry was busy (said when the link or the rail goes DOWN: which side went
	 * quiet). */
	uint64_t ka_tx_ms[MESH_RAILS_MAX];
	uint64_t ka_skipped[MESH_RAILS_MAX];
	uint32_t failures; /* failed attempts since the last UP */
	uint64_t next_dial_ms;
	uint64_t failed_tick; /* mesh.adm.ticks when it last failed: not re-dialled in the same tick */

	/* Its node was removed from the configuration (link_reconf.c): out of mesh->links, waiting
	 * until then for its Goodbye to go out; 0: a link of the mesh. */
	uint64_t leave_ms;
	/* Then its peer's entry, copied: the configuration it came from is freed after the reload,
	 * and events of its QPs still name the peer until it is closed. */
	struct config_node *peer_own;

	/* Counters. */
	uint32_t ups;
	uint64_t tx_msgs, rx_msgs;
	struct link_metrics metrics; /* for Prometheus (metrics.h): downs and failed attempts by reason,
				      * keepalive misses, channel payload */
	char last_error[LINK_ERR_MAX];
	/* Why the link last went DOWN from UP: last_error moves on with every failed re-dial, and an
	 * operator (or a test) asking later would read why the peer is unreachable now, not why it fell. */
	char down_error[LINK_ERR_MAX];
};

struct mesh_graveyard {
	xport_conn_t **conns;
	size_t n_conns, cap_conns;
	xport_mr_t **mrs;
	size_t n_mrs, cap_mrs;
	struct mesh_map {
		void *addr;
		size_t len; /* 0: heap memory (free), else a mapping (munmap) */
	} *maps;
	size_t n_maps, cap_maps;
};

/* NUMA placement of this node (numa_topo.h): set up by main.c before the data-path thread starts. */
struct mesh_numa {
	struct numa_topo topo;
	bool usable;      /* libnuma works and there are several nodes */
	bool by_device;   /* numa = auto: a channel's rings go to its device's node */
	int rail_node[MESH_RAILS_MAX]; /* node of each rail's device (preferred provider), -1 none */
	int home;         /* node of the data-path thread and default of the rings, -1 unplaced */
	const char *why;  /* how home was chosen, or why nothing is placed */
	size_t n_devs;    /* the devices the providers use, by transport instance */
	struct mesh_numa_dev {
		char name[NUMA_NAME_MAX];
		char netdev[NUMA_NAME_MAX];
		const char *provider;
		uint32_t rail;
		int node;
	} devs[MESH_XPORT_INSTANCES];
	/* the data-path threads, one per rail */
	size_t n_threads;
	struct mesh_numa_thread {
		char name[16];
		char devices[MESH_XPORTS_MAX * (NUMA_NAME_MAX + 1)];
		int node; /* pinned to, -1: not pinned */
		uint32_t tid;
		/* Its work (struct mesh_locks): events of its transports taken under its rail's lock
		 * alone, events it left to the usual way (under every lock), the times it took every
		 * lock itself, and its channels' kicks it took. Written by that thread only. */
		uint64_t fast_events, deferred_events, slow_sections, kicks;
		/* Its wake-ups (epoll_wait returned), and the tick's last look at them: when they last
		 * changed, at the tick's granularity (a thread asleep with work in its CQs is seen). */
		uint64_t wakes, wakes_seen, wake_seen_ms;
	} threads[MESH_RAILS_MAX];
};

/*
 * The daemon's locks (main.c, admin.c). Whoever holds `ctl` and then every rail's lock, in rail
 * order (mesh_lock_all), has the whole mesh to itself, as under the one lock there was before:
 * links, channels, transports, the control plane, all of mesh.c and channel.c. A data-path thread
 * moves the data of its own rail's channels under its rail's lock alone (the fast path:
 * mesh_fast_event, channel_poll_fast): completions and immediates of its transports, and the
 * pumps of channels that only move data (channel.c, channel_fast_ok), touching only its rail's
 * channels and QPs; anything else (a control message, a failed completion, a channel closing or
 * resuming) it leaves, in the order of each work queue, to itself under every lock. So two rails
 * carry two streams at once, and the rest of the code stays single-threaded.
 */
struct mesh_locks {
	pthread_mutex_t ctl;
	pthread_mutex_t rail[MESH_RAILS_MAX];
	uint32_t n_rails;
	_Atomic uint32_t all_waiting; /* threads in mesh_lock_all*: the rails' threads let them first */
};
void mesh_locks_init(struct mesh_locks *k);
void mesh_locks_destroy(struct mesh_locks *k);
void mesh_lock_all(struct mesh_locks *k);
/* Every lock by abs (CLOCK_MONOTONIC): 0, or ETIMEDOUT holding nothing. */
int mesh_lock_all_by(struct mesh_locks *k, const struct timespec *abs);
/* Every lock if each is free now: 0, or EBUSY holding nothing. */
int mesh_trylock_all(struct mesh_locks *k);
void mesh_unlock_all(struct mesh_locks *k);

/* wr_id kinds of the layer above (the channels' data path): the link layer hands the completions of
 * these to mesh_upper.completion (link_internal.h owns 1..4, 7 and 8). */
#define WR_CH_DATA 5u
#define WR_CH_CREDIT 6u
#define WR_CH_DIRECT 9u /* link_internal.h's 7 and 8 come between */
#define WR_CH_HINT 10u

/* The layer above the links (channels: channel_upper in channel.c) and everything the link layer
 * tells it: the link layer calls up only through this table, the layer above calls down through
 * the mesh_link_* functions below, so each file has one direction of calls. Set by whoever sets the
 * mesh up (main.c, the unit tests); NULL: links without channels (every channel message is then a
 * protocol error of the link, and data immediates too). */
struct mesh_upper {
	/* A message of the layer above (a PeerMsg body it owns), an immediate of the data path, the
	 * completion of one of its work requests (wr_id kinds WR_CH_*): 0, or a negative errno when the
	 * peer broke the protocol badly enough that the link must go. */
	int (*message)(struct link *l, const PeerMsg *msg);
	int (*imm)(struct link *l, uint32_t imm, uint32_t len);
	int (*completion)(struct link *l, uint32_t kind, uint32_t idx, int status);
	/* The link went DOWN (err: why, as link_fail was told; may_resume: false when the peer said
	 * Goodbye, we stop, or the peer was removed from the configuration), came UP, or lost rail r
	 * while staying UP. */
	void (*link_down)(struct link *l, int err, bool may_resume);
	void (*link_up)(struct link *l);
	void (*rail_down)(struct link *l, uint32_t r);
	/* Periodic work after the links' (timeouts), and everything at exit. */
	void (*tick)(struct mesh *m, uint64_t now_ms);
	void (*cleanup)(struct mesh *m);
	/* The fast path (struct mesh_locks): under rail's lock alone, a successful completion of a
	 * data-path write on rail's QPs, or the immediate of one; false when the channel it names
	 * is not one that only moves data, having changed nothing: the event then goes the usual way.
	 * fast_imm_ok says whether fast_imm will take the immediate (checked before the receive is
	 * posted again). */
	bool (*fast_completion)(struct link *l, uint32_t rail, uint32_t kind, uint32_t idx);
	bool (*fast_imm_ok)(struct link *l, uint32_t rail, uint32_t imm);
	void (*fast_imm)(struct link *l, uint32_t rail, uint32_t imm, uint32_t len);
};

struct mesh {
	const struct mesh_config *cfg;
	const struct mesh_upper *upper;
	const struct config_node *self;
	/* Providers in order of preference; a dialler that gets no answer over one tries the next.
	 * Each has an instance per rail: mesh_xport(). */
	xport_t *xports[MESH_XPORT_INSTANCES];
	size_t n_xports; /* providers */
	uint32_t n_rails;
	char xport_names[32]; /* "rdma", "tcp", "rdma+tcp" */
	uint32_t cluster_hash;
	struct auth_keys keys; /* cluster.key_file; none: links are not authenticated */
	uint64_t boot_epoch; /* wall clock us at start */
	/* The meshd this one succeeds with the channels it kept (channel_store.c), 0: a fresh start;
	 * said in every Hello so that peers resume those channels rather than fail them. */
	uint64_t predecessor_epoch;
	/* The service manager's descriptor store (sd_notify FDSTORE=1, channel_store.c): main.c sets
	 * keep and drop when one is kept for meshd ($FDSTORE), else keep is NULL and nothing is kept.
	 * A stop with channels kept is a handover: they are left as they are for the next meshd. */
	struct {
		int (*keep)(void *ctx, const char *name, const int *fds, size_t n);
		void (*drop)(void *ctx, const char *name);
		void *ctx;
		uint32_t n_kept;
		bool handover, restoring;
	} store;
	uint64_t scopes;     /* attempts' protection scopes handed out (link_begin) */
	uint64_t fd_limit;   /* RLIMIT_NOFILE in force, 0 unknown (channel.c keeps a reserve of it) */
	uint64_t start_ms;
	size_t n_links;
	/* One per peer, sorted by peer id. Each link is allocated on its own: a reload adds and removes
	 * peers (mesh_reconfigure), and channels and connections keep pointers to their link. */
	struct link **links;
	size_t links_cap;
	/* Links of nodes a reload removed, until their Goodbye went out (link_reconf.c). */
	struct link **leaving;
	size_t n_leaving, leaving_cap;
	uint32_t handshakes; /* attempts in flight (phases QPS..READY_WAIT) */
	/* Admission of our own dials (link_admit.c; mesh_admit in link_connect.c), as TCP's congestion
	 * window: at most `window` of our attempts in flight, grown by every attempt of ours that comes
	 * UP (by one while below ssthresh, then by 1/window) and halved when an attempt times out or a
	 * peer answers busy, at most once per smoothed attempt time; never above
	 * cluster.max_handshakes. A fixed window as large as the mesh stormed: 64 meshd in one VM
	 * dialled 63 peers each at once, attempts timed out and were re-dialled while the old ones were
	 * still being set up, and no link formed. */
	struct mesh_admission {
		double window, ssthresh;
		uint32_t dials;      /* our attempts in flight (dialler links in phases QPS..READY_WAIT) */
		uint64_t srtt_ms;    /* an attempt's time from dial to UP, smoothed (RFC 6298); 0: none yet */
		uint64_t rttvar_ms;  /* and its variation */
		uint64_t last_cut_ms;
		uint64_t cuts;       /* times the window was halved */
		size_t next;         /* the link the next look starts at: dials go round the peers */
		uint64_t ticks;      /* mesh_tick calls so far */
		bool ended;          /* an attempt of ours ended in this event: look for the next dial at once */
	} adm;
	uint64_t peer_rejects;
	int last_reject_reason;            /* the detail of the last refusal (the wire may say less) */
	struct log_ratelimit reject_log;   /* refusals are logged at this rate at most */
	uint64_t link_flaps;      /* UP links that went DOWN */
	uint64_t channel_resumes; /* channels that resumed after their link came back */
	uint64_t rail_failovers;  /* rails that failed while their link stayed UP on the others */
	bool stopping;
	/* The configuration in force (main.c, daemon_reload): `meshctl node` and the metrics show it. */
	struct mesh_conf_state {
		uint64_t generation; /* 1 at start, one more per reload applied */
		uint64_t loaded_us;  /* wall clock of its load */
		uint64_t reloads, refused; /* reloads applied, reloads refused */
		char error[512];     /* why the last reload was refused; "" when it was applied */
	} conf;
	struct mesh_graveyard grave;

	/* The layer above's state (channel.h, channel_layer_init), opaque here: set and freed by it. */
	struct mesh_chans *chans;
	/* The rail's data-path thread polls its rings now (MESH_DAEMON_POLLING, channel_set_polling):
	 * the rail thread's mode, which link_rail.c says when the rail fails, so it stays here. */
	bool polling[MESH_RAILS_MAX];
	/* Set by the loop around one mesh_tick: judge no link or rail by its keepalives this time (the
	 * tick came after a stall, and what arrived meanwhile may not be read yet). */
	bool tick_no_liveness;
	/* The fast path of each rail (struct mesh_locks), written by that rail's thread: a channel it
	 * could not pump wants the usual pump (channel_pump_wanted), and it holds events it polled but
	 * left to the usual way: connections they name must not be destroyed until it has handled
	 * them (mesh_reap waits). */
	bool rail_slow[MESH_RAILS_MAX];
	bool rail_deferring[MESH_RAILS_MAX];
	struct mesh_numa numa;
	struct mesh_pings pings; /* meshctl ping (ping.h); pings.ops set by the owner of the clients */
};

/* What a reload changed of the links (mesh_reconfigure). */
struct mesh_reconf {
	uint32_t added, removed, moved;
};

/* Applies a new configuration to the links (link_reconf.c): m->cfg already holds it, self is this
 * node's entry in it (its own address, port and rails unchanged: config_reload_check), and the
 * links still point at the nodes of the configuration before, which must stay allocated until
 * this returns. Links of removed nodes close (their channels fail with MESH_EREMOVED), added
 * nodes get links, links of nodes that moved (address, port, rails) re-form; the others are not
 * touched. 0, or -ENOMEM when a link could not be added (the rest is applied). */
int mesh_reconfigure(struct mesh *m, const struct config_node *self, struct mesh_reconf *out);

/* Sets up links for every peer of cfg (self = our node) over the given transport instances
 * (already created and listening): per provider in order of preference, one per rail of self. */
int mesh_init(struct mesh *m, const struct mesh_config *cfg, const struct config_node *self, xport_t *const *xports,
	      size_t n_xports);
/* The provider of a link's current or last attempt. */
const char *link_transport(const struct link *l);
void mesh_cleanup(struct mesh *m);

void mesh_handle_event(struct mesh *m, const struct xport_event *ev);
/* The fast path of rail's thread, under that rail's lock alone (struct mesh_locks): true when ev
 * was handled (or is one the usual way ignores), false when it must go to mesh_handle_event under
 * every lock, with everything polled after it, in order. */
bool mesh_fast_event(struct mesh *m, uint32_t rail, const struct xport_event *ev);
/* Destroys what was buried, unless a rail still holds polled events that may name it. */
void mesh_reap(struct mesh *m);
void mesh_tick(struct mesh *m, uint64_t now_ms);
/* Clean shutdown: Goodbye on UP links, then disconnect everything. */
/* The Goodbyes of a stop: reason MESH_ESHUTDOWN (channels end) or MESH_ERESTARTING (a restart with
 * the channels kept: the peers keep theirs waiting for the next meshd). */
void mesh_stop(struct mesh *m, int reason);

struct link *mesh_link_find(struct mesh *m, uint32_t peer);
/* Where a link to peer is, or would go, in m->links. */
size_t mesh_link_slot(const struct mesh *m, uint32_t peer);
/* The index of l in m->links, or m->n_links when it is not one of them (the local node's). */
size_t mesh_link_index(const struct mesh *m, const struct link *l);

/* The RC ACK timeout for a cluster's keepalive timeout (xport_attr.ack_timeout): 0, rdma_cm's
 * default, unless that is longer than an eighth of the keepalive timeout. */
#define MESH_ACK_TIMEOUT_MIN 12     /* 4.096 us * 2^12: 16.8 ms */
#define MESH_ACK_TIMEOUT_DEFAULT 17 /* rdma_cm's for RoCE: 4.096 us * 2^17, 0.54 s */
uint8_t mesh_ack_timeout(uint32_t keepalive_timeout_ms);

/* For channel.c: a control message on the link's QP 0; send-queue room on a QP (the data path
 * leaves LINK_SQ_CONTROL entries to control messages) and taking one entry; resources released
 * after the current batch of events (after the QPs that might still use them). */
int mesh_link_send(struct link *l, const PeerMsg *msg);
/* Whether rail r of the link carries traffic now (its QPs connected and proved). */
bool mesh_link_rail_up(const struct link *l, uint32_t r);
/* The rail a channel opened now (or moving now) should use: want if it is UP, else the lowest UP
 * rail; -1 when the link has none. */
int mesh_link_pick_rail(const struct link *l, int want);

bool mesh_link_sq_room(const struct link *l, uint32_t qp);
void mesh_link_sq_take(struct link *l, uint32_t qp);
void mesh_bury_mr(struct mesh *m, xport_mr_t *mr);
void mesh_bury_map(struct mesh *m, void *addr, size_t len);
enum link_state link_state(const struct link *l);
const char *link_state_name(enum link_state s);
uint32_t mesh_links_up(const struct mesh *m);
/* Our dials allowed in flight now: the adaptive window within cluster.max_handshakes. */
uint32_t mesh_dial_window(const struct mesh *m);

/* How many QPs of the current attempt are established. */
static inline uint32_t link_qps_established(const struct link *l)
{
	return (uint32_t)__builtin_popcountll(l->est_mask);
}

/* The instance of provider p on rail r. */
static inline xport_t *mesh_xport(const struct mesh *m, size_t p, uint32_t r)
{
	return m->xports[p * m->n_rails + r];
}

/* QPs of every link: qps_per_link on each rail. */
static inline uint32_t mesh_link_qps(const struct mesh *m)
{
	return m->cfg->qps_per_link * m->n_rails;
}

/* Address of a node on rail r (rail 0 is its addr). */
static inline const char *mesh_node_addr(const struct config_node *n, uint32_t r)
{
	return r ? n->rail[r] : n->addr;
}

/* The NUMA node of rail r's work: its data-path thread, and its channels' rings when the application
 * gave no hint (hint < 0). -EINVAL for a hint naming no online node (numa_ring_node). */
static inline int mesh_rail_node(const struct mesh *m, uint32_t r, int hint)
{
	return numa_ring_node(&m->numa.topo, m->numa.usable, m->numa.by_device, m->numa.home, m->numa.rail_node[r],
			      hint);
}

/* Dial rule: the higher id dials the lower. */
static inline bool mesh_dials(uint32_t self, uint32_t peer)
{
	return self > peer;
}

#endif
