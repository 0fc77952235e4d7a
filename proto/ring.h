/*
 * The shared-memory ring of a stream channel: the contract between libmesh (the application) and
 * meshd, which share one memfd per channel.
 *
 * memfd layout:  [ control page, 4096 bytes ][ TX data, ring_size ][ RX data, ring_size ]
 *
 * ring_size is a power of two (MESH_RING_MIN..MESH_RING_MAX), the same for both directions and on
 * both nodes: a byte at stream position p lives at offset p & (ring_size - 1) of the sender's TX
 * area and is written by RDMA to the same offset of the receiver's RX area.
 *
 * Indices are 64-bit stream positions that only grow. Each is written by exactly one side, sits on
 * its own cache line, and is accessed with C11 atomics: release when publishing, acquire when
 * reading. Neither side trusts an index the other wrote: a value outside its valid window is an
 * error of the writer (meshd closes the channel with -EPROTO; libmesh returns -EPROTO), never a
 * read or write outside the ring.
 *
 *   written by the application      written by meshd
 *   tx_prod: bytes published in TX   tx_cons: TX bytes sent and acknowledged: reusable
 *   rx_cons: RX bytes consumed       rx_prod: RX bytes arrived, in order
 *
 * Valid windows (checked by the reader):
 *   meshd:   tx_cons <= tx_prod <= tx_cons + ring_size, and tx_prod never decreases;
 *            rx_cons(previous) <= rx_cons <= rx_prod
 *   libmesh: tx_cons(previous) <= tx_cons <= tx_prod; rx_cons <= rx_prod <= rx_cons + ring_size
 *
 * Indices start at 0 and never decrease (a reader also rejects a value below the last it saw).
 * The memfd is sealed (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) before it is handed over.
 *
 * Wake-ups: the application's side blocks on the wake eventfd and sets MESH_APP_WAITING before it
 * re-checks the indices and sleeps; meshd publishes, issues a seq_cst fence, then writes the wake
 * eventfd if that flag is set, for index and for state changes. The application writes the kick
 * eventfd after publishing tx_prod, after consuming what is worth a credit (mesh_ring_credit_step:
 * a quarter or half of the ring), and after setting MESH_APP_SHUT_WR, unless meshd polls the ring:
 * the mirror image of MESH_APP_WAITING.
 *
 * Kick suppression (Dekker): while meshd's data-path thread polls it sets MESH_DAEMON_POLLING in
 * daemon_flags; before it sleeps it clears the flag, issues a seq_cst fence and reads every ring's
 * indices once more. The application publishes, issues a seq_cst fence and kicks only if the flag
 * is clear. One of the two always sees the other's store, so no publication is left unseen while
 * meshd sleeps, and a polling meshd costs the application no system call.
 *
 * Direct receive (the direct pair at MESH_RING_DIRECT_OFF of the control page): the one place a
 * third party writes. meshd registers those 16 bytes, and only those, for remote write and gives
 * their key to the peer's meshd, which writes {pos, mesh_ring_direct_check(pos)} by RDMA WRITE on
 * the same QP right after the data that pos covers (and only once every chunk below pos is on that
 * QP before it or has completed). An RC QP executes its messages in order (docs/design.md, "Direct
 * receive"), so when the pair is seen, the bytes below pos are in the RX area: the application may
 * read them before its meshd has polled their immediates. The pair is a claim, not an index: it is
 * taken only when its check matches (a pair read while it lands is torn, and ignored), when it is
 * ahead of what is known and within a ring of the reader; anything else is ignored, never an
 * error, because meshd's rx_prod still follows every byte. A zero page (an older meshd or peer)
 * never matches. rx_cons may then run ahead of meshd's rx_prod: meshd accepts it up to the valid
 * pair it reads itself, and credits the peer no further than its own rx_prod.
 *
 * spin_us (line 0, set by meshd from the configuration): how long a blocking libmesh call polls
 * the ring before it sleeps on the wake eventfd (0: sleep at once). MESH_SPIN_US in the
 * application's environment overrides it. Both are hints; a zero page from an older meshd means
 * "no spinning, always kick", which is the version-1 behaviour.
 *
 * Application-posted writes (the AQ area at MESH_RING_AQ_OFF, cluster.app_send): the sending half
 * of a channel has one owner at a time. meshd owns it by default. When meshd offers it (path_valid:
 * the device, port and path of the channel's rail), the application may create an RC QP of its
 * own on that device, register its TX area (local) and its RX area and direct pair (remote write),
 * and publish them with app_state = MESH_AQ_OFFER; meshd checks them and carries them to the peer's
 * meshd, which writes them into its application's peer_* words (peer_state = MESH_AQ_PEER_INFO).
 * Each application connects its QP to the other's (INIT -> RTR -> RTS) and says MESH_AQ_READY;
 * once both are ready and none of meshd's own writes of the channel is in flight, meshd grants the
 * sending half (grant = MESH_AQ_APP from grant_pos) and posts no more data. Where the application's
 * caps have MESH_AQ_CAP_TAKE, the grant is only offered until the application takes it: it turns
 * grant from APP to TAKEN by compare-and-swap, reads grant_pos after that, and kicks; meshd then
 * tells the peer's meshd. Bytes the application publishes while the grant is stored may go without
 * it seeing the grant (a program that writes and then waits elsewhere would never send them), so
 * meshd, after its store, fences and reads tx_prod, and on every pump until the grant is taken: if
 * tx_prod moved past grant_pos (or the application said IDLE, or is gone), meshd turns grant from
 * APP back to MESHD by compare-and-swap and posts those bytes itself, granting again later. The
 * one compare-and-swap that succeeds decides who sends them; the application publishes before it
 * looks and meshd stores before it looks (both fence seq_cst), so one of them always sees the
 * other. grant is the one word both write, and only so. The application then
 * writes its bytes to the peer's RX area at the same offsets meshd would, each batch followed on
 * the same QP by a direct pair (WRITE_WITH_IMM, whose immediate wakes a peer sleeping on its
 * completion channel) or, where the peer's caps have MESH_AQ_CAP_IMM_POS, with the batch's last
 * write carrying the position in its immediate (one work request and one packet fewer per
 * message; the peer's application publishes what its CQ said in rx_seen, which its meshd takes
 * as the pair), and publishes tx_prod with posting. tx_cons still comes from meshd
 * (the peer's credits), and the application reuses TX bytes only once its own writes of them
 * completed too. The receiving meshd takes the arrived bytes from the pair. meshd revokes the grant
 * (MESH_AQ_REVOKED) when its link or rail goes down; the application then stops posting and says
 * MESH_AQ_IDLE once nothing of its QP is in flight (also on its own when its QP fails), and meshd
 * resumes the sending half from what the peer's reader has.
 * Rounds: once the resume that revoked it is done and the application said MESH_AQ_IDLE, meshd
 * offers a new QP (where both meshd can, MESH_FEAT_APPQP_RENEW): it rewrites the path (the channel
 * may be on another rail now), sets peer_state, grant and app_state back (to PEER_NONE, MESHD and
 * NONE: the application writes nothing while it is IDLE) and then increments round (release).
 * An application that is IDLE and sees round change destroys its QP and offers a new one, as at
 * the start; one that never looks (an older libmesh, a forked child) keeps meshd's path.
 * Over the tcp provider (path_valid == MESH_AQ_PATH_TCP) the same rounds, grant and revocation
 * hold, with a TCP connection for the QP. meshd writes the rail's two addresses. The application
 * listens on its own address (port 0: any) and publishes the port and a random token in place of
 * QPN and keys; meshd relays them as it relays a QP. The application whose token is the greater
 * (memcmp) connects from its address to the peer's port and sends MESH_AQ_TCP_MAGIC and the
 * peer's token; the other accepts the connection that says its token (a stranger that cannot say
 * it is closed unheard). Each says READY once it has the connection, which carries both halves,
 * one per direction. Once granted, each sends the grant's position (8 bytes, little endian) and
 * then the stream's bytes from there, as they are; the receiving application reads them straight
 * into its RX area
 * at their offsets, within its own reader's window (bytes below rx_cons are skipped, none goes
 * beyond rx_cons + ring), and publishes how far it read in rx_seen. A connection that breaks is a
 * QP that failed: IDLE, and meshd posts from what the peer's reader has; a half that goes back
 * shuts its direction (SHUT_WR). Bytes that a revoked direction still delivers are the same bytes
 * at the same offsets as meshd's resumed writes.
 * Everything the application writes here is hostile to meshd, and everything meshd writes is
 * hostile to the application: each side checks before use.
 */
#ifndef MESH_PROTO_RING_H
#define MESH_PROTO_RING_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>

#define MESH_RING_MAGIC 0x4d52494eu /* "MRIN" */
#define MESH_RING_VERSION 1
#define MESH_RING_CTRL_SIZE 4096u
#define MESH_RING_MIN (4u << 10)
#define MESH_RING_MAX (256u << 20)
#define MESH_RING_DEFAULT (1u << 20)
/* The reader's progress (bytes consumed since the last credit) worth a credit to its sender, given
 * `uncredited`, the bytes that arrived since the last credit: a quarter ring once those are three
 * quarters of it or more (the sender has at most a quarter of its window left: a stream), else
 * half a ring (rsocket's rule: a sender that has room anyway, as with requests and answers or an
 * echo, hears less often). Every credit is the reader's kick of meshd, a credit write and its
 * completion at both ends: a 64 MiB echo in 64 KiB pairs (Soft-RoCE VM) spent 1.7x more of meshd's
 * CPU per MB with a quarter always, and echoed 6% slower; a stream of application-posted writes
 * ran 5% slower with half always (its window trailed the reader by more). A sender is stalled
 * only with a whole ring uncredited, so it always hears once its reader made room for a quarter.
 * libmesh (when to kick) and meshd (when to credit) both take it from here. */
/* The smallest step: a polling meshd looks at a reader's progress from it on. */
#define MESH_RING_CREDIT_MIN(size) ((size) / 4)
static inline uint64_t mesh_ring_credit_step(uint64_t size, uint64_t uncredited)
{
	return uncredited >= size - size / 4 ? MESH_RING_CREDIT_MIN(size) : size / 2;
}
#define MESH_CACHELINE 64

/* app_flags (written by the application) */
#define MESH_APP_WAITING (1u << 0) /* wake me through the wake eventfd */
#define MESH_APP_SHUT_WR (1u << 1) /* no more bytes after tx_prod: send EOF once they are out */

/* state (written by meshd) */
#define MESH_STATE_OPEN (1u << 0)
#define MESH_STATE_PEER_EOF (1u << 1) /* the peer shut its write side; rx_prod is final */
#define MESH_STATE_ERROR (1u << 2)    /* the channel is broken: see error; no more data moves */

/* daemon_flags (written by meshd) */
#define MESH_DAEMON_POLLING (1u << 0) /* meshd polls tx_prod/rx_cons now: no kick needed */
#define MESH_SPIN_MAX_US 1000000u     /* libmesh caps the spin hint (a hostile page cannot make it spin forever) */

struct mesh_ring_ctrl {
	/* line 0: set by meshd before the memfd is handed over, then read-only */
	alignas(MESH_CACHELINE) uint32_t magic;
	uint32_t version;
	uint64_t ring_size;
	uint64_t tx_off; /* offset of the TX area in the memfd */
	uint64_t rx_off;
	uint32_t channel_id;
	uint32_t peer_node;
	uint16_t local_port;
	uint16_t peer_port;
	uint32_t spin_us; /* hint: poll this long before sleeping (was reserved, zero) */
	/* the application's lines */
	alignas(MESH_CACHELINE) _Atomic uint64_t tx_prod;
	alignas(MESH_CACHELINE) _Atomic uint64_t rx_cons;
	alignas(MESH_CACHELINE) _Atomic uint32_t app_flags;
	/* meshd's lines */
	alignas(MESH_CACHELINE) _Atomic uint64_t tx_cons;
	alignas(MESH_CACHELINE) _Atomic uint64_t rx_prod;
	alignas(MESH_CACHELINE) _Atomic uint32_t state;
	_Atomic int32_t error; /* negative errno when MESH_STATE_ERROR */
	_Atomic uint32_t daemon_flags; /* MESH_DAEMON_*; zero from a meshd that never polls */
};
/* Direct receive: written by the peer's NIC (see above), read by both libmesh and meshd. */
#define MESH_RING_DIRECT_OFF 2048u
#define MESH_RING_DIRECT_LEN 16u
struct mesh_ring_direct {
	_Atomic uint64_t pos;   /* stream position: every byte below it is in the RX area */
	_Atomic uint64_t check; /* mesh_ring_direct_check(pos) */
};
/* Application-posted writes (above). */
#define MESH_RING_AQ_OFF 2560u
/* app_state (written by the application) */
#define MESH_AQ_NONE 0  /* no QP of its own: meshd posts (an older libmesh, or MESH_APP_SEND=off) */
#define MESH_AQ_OFFER 1 /* its QP is in INIT: qpn, psn, keys and addresses are valid */
#define MESH_AQ_READY 2 /* its QP is in RTS with receives posted: the peer may write to it */
#define MESH_AQ_IDLE 3  /* done with its QP (failed or revoked): nothing of it is in flight */
/* peer_state (written by meshd) */
#define MESH_AQ_PEER_NONE 0
#define MESH_AQ_PEER_INFO 1  /* the peer application's QP and keys are valid */
#define MESH_AQ_PEER_READY 2 /* and its QP is in RTS */
/* grant (written by meshd) */
#define MESH_AQ_MESHD 0   /* meshd posts the sending half */
#define MESH_AQ_APP 1     /* the application posts every byte from grant_pos on */
#define MESH_AQ_REVOKED 2 /* stop posting; say MESH_AQ_IDLE once nothing is in flight */
#define MESH_AQ_TAKEN 3   /* written by the application (MESH_AQ_CAP_TAKE), from APP by CAS: it posts */
/* caps (written by the application, relayed to the peer's as peer_caps) */
#define MESH_AQ_CAP_IMM_POS (1u << 0) /* its QP takes, in place of a pair, a data write whose immediate
				       * is MESH_AQ_IMM_POS | (end position & MESH_AQ_IMM_MASK):
				       * it learns the position from its CQ and publishes it in rx_seen */
#define MESH_AQ_CAP_TAKE (1u << 1) /* it takes a grant by CAS (above); its own meshd's, not relayed */
#define MESH_AQ_IMM_POS 0x80000000u
#define MESH_AQ_IMM_MASK 0x7fffffffu /* a ring is at most 256 MiB: the reader resolves the rest */
#define MESH_AQ_DEV_LEN 32
/* path_valid (written by meshd) */
#define MESH_AQ_PATH_RDMA 1 /* dev, port, GIDs and the rest: an RC QP of its own */
#define MESH_AQ_PATH_TCP 2  /* tcp_*: a TCP connection of its own (below) */
#define MESH_AQ_TOKEN_LEN 16
/* The first bytes of an application's own TCP connection, then the token (MESH_AQ_PATH_TCP). */
#define MESH_AQ_TCP_MAGIC 0x4d415154u /* "MAQT" */
struct mesh_ring_aq {
	/* set by meshd before the memfd is handed over, rewritten only for a new round (above) while
	 * the application is IDLE; path_valid 0: no offer */
	alignas(MESH_CACHELINE) uint32_t path_valid;
	uint8_t port, sgid_index, path_mtu, hop_limit; /* ibv port, GID index, enum ibv_mtu, GRH hop limit */
	uint8_t traffic_class, ack_timeout, pad[2];
	uint8_t dgid[16]; /* the peer's GID on the rail */
	char dev[MESH_AQ_DEV_LEN]; /* the rail's device, NUL-terminated */
	/* the application's */
	alignas(MESH_CACHELINE) _Atomic uint32_t app_state;
	uint32_t qpn, psn, rx_rkey, dir_rkey;
	uint64_t rx_addr, dir_addr;
	uint32_t caps; /* MESH_AQ_CAP_*: what its QP takes (0 from an older libmesh) */
	/* meshd's: the peer application's QP */
	alignas(MESH_CACHELINE) _Atomic uint32_t peer_state;
	uint32_t peer_qpn, peer_psn, peer_rx_rkey, peer_dir_rkey;
	uint64_t peer_rx_addr, peer_dir_addr;
	uint32_t peer_caps; /* its caps, as its meshd relayed them */
	/* meshd's: who posts the sending half */
	alignas(MESH_CACHELINE) _Atomic uint32_t grant;
	_Atomic uint32_t round; /* the offer's round: 0 at hand-over, one more for each new offer */
	_Atomic uint64_t grant_pos;
	/* the application's, written as it polls its CQ (MESH_AQ_CAP_IMM_POS): every byte of the peer
	 * application's below it is in the RX area (its own line: it changes with every message) */
	alignas(MESH_CACHELINE) _Atomic uint64_t rx_seen;
	/* path_valid == MESH_AQ_PATH_TCP (the tcp provider, below): meshd's, set with the path */
	alignas(MESH_CACHELINE) uint8_t tcp_family; /* AF_INET or AF_INET6 */
	uint8_t tcp_pad[3];
	uint8_t tcp_local[16], tcp_peer[16]; /* our node's and the peer's address on the rail (network order) */
	/* the application's: where it listens for the peer application's connection, and the token that
	 * connection must open with */
	alignas(MESH_CACHELINE) uint32_t tcp_port;
	uint8_t tcp_token[MESH_AQ_TOKEN_LEN];
	/* meshd's: the peer application's, as its meshd relayed them (peer_state >= PEER_INFO) */
	alignas(MESH_CACHELINE) uint32_t peer_tcp_port;
	uint8_t peer_tcp_token[MESH_AQ_TOKEN_LEN];
};
_Static_assert(MESH_RING_DIRECT_OFF + MESH_RING_DIRECT_LEN <= MESH_RING_AQ_OFF, "direct pair overlaps the AQ area");
_Static_assert(MESH_RING_AQ_OFF + sizeof(struct mesh_ring_aq) <= MESH_RING_CTRL_SIZE, "AQ area overflows the page");
_Static_assert(MESH_RING_AQ_OFF % MESH_CACHELINE == 0, "AQ area is cache-line aligned");
_Static_assert(MESH_RING_MAX <= MESH_AQ_IMM_MASK, "an immediate's position resolves within a ring");

static inline struct mesh_ring_aq *mesh_ring_aq(struct mesh_ring_ctrl *k)
{
	return (struct mesh_ring_aq *)(void *)((unsigned char *)k + MESH_RING_AQ_OFF);
}

_Static_assert(sizeof(struct mesh_ring_ctrl) <= MESH_RING_DIRECT_OFF, "ring control lines overlap the direct pair");
_Static_assert(sizeof(struct mesh_ring_direct) == MESH_RING_DIRECT_LEN, "direct pair is 16 bytes");
_Static_assert(MESH_RING_DIRECT_OFF + MESH_RING_DIRECT_LEN <= MESH_RING_CTRL_SIZE, "ring control page overflows");
_Static_assert(sizeof(_Atomic uint64_t) == 8, "64-bit atomics required");

static inline int mesh_ring_size_valid(uint64_t size)
{
	return size >= MESH_RING_MIN && size <= MESH_RING_MAX && !(size & (size - 1));
}

/* Is v in [lo, hi]? Written for monotonic 64-bit positions (no wrap in practice: 2^64 bytes). */
static inline int mesh_ring_in_window(uint64_t v, uint64_t lo, uint64_t hi)
{
	return v >= lo && v <= hi;
}

/* Bytes from position pos to the end of the ring area: the longest contiguous run there. */
static inline uint64_t mesh_ring_contig(uint64_t pos, uint64_t size)
{
	return size - (pos & (size - 1));
}

/* The check word of a direct pair: a mixing function (splitmix64's finaliser) of pos, so that a pair
 * read half old, half new, at any byte boundary, does not match; offset so that a zero page does
 * not match either. Not a MAC: the peer may write what it likes into our RX area anyway. */
static inline uint64_t mesh_ring_direct_check(uint64_t pos)
{
	uint64_t z = pos + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline struct mesh_ring_direct *mesh_ring_direct(struct mesh_ring_ctrl *k)
{
	return (struct mesh_ring_direct *)(void *)((unsigned char *)k + MESH_RING_DIRECT_OFF);
}

/* The direct pair's position when its check matches (1), else 0: nothing usable is there. */
static inline int mesh_ring_direct_read(struct mesh_ring_ctrl *k, uint64_t *pos)
{
	struct mesh_ring_direct *d = mesh_ring_direct(k);
	uint64_t c = atomic_load_explicit(&d->check, memory_order_acquire);
	uint64_t p = atomic_load_explicit(&d->pos, memory_order_acquire);

	if (c != mesh_ring_direct_check(p))
		return 0;
	*pos = p;
	return 1;
}

#endif
