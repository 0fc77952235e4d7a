#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "channel.h"
#include "log.h"
#include "mesh.h"
#include "util.h"

#define WR_ID(kind, idx) (((uint64_t)(kind) << 32) | (uint32_t)(idx))
#define CH_EPHEMERAL_FIRST 49152u

static uint64_t now_ms(void)
{
	return util_now_ms();
}

uint32_t channel_rx_window(uint32_t qps)
{
	uint32_t need = CH_WINDOW + qps * (LINK_DATA_RECVS + 1), w = CH_WINDOW;

	while (w < need)
		w *= 2;
	return w;
}

struct channel *channel_find(struct mesh *m, uint32_t id)
{
	for (struct channel *ch = m->ch_by_id[id % MESH_CH_BUCKETS]; ch; ch = ch->id_next)
		if (ch->id == id)
			return ch;
	return NULL;
}

const char *channel_state_name(const struct channel *ch)
{
	if (ch->error)
		return "ERROR";
	if (ch->resuming)
		return "RESUMING";
	switch (ch->state) {
	case CH_OPENING:
		return "OPENING";
	case CH_OPEN:
		return ch->app_shut || ch->eof_known ? "HALF_CLOSED" : "OPEN";
	default:
		return "CLOSING";
	}
}

static struct channel *link_channel(struct link *l, uint32_t slot)
{
	return slot < l->ch_cap ? l->ch_slots[slot] : NULL;
}

static int link_slot_alloc(struct link *l, struct channel *ch)
{
	for (uint32_t i = 0; i < l->ch_cap; i++) {
		if (!l->ch_slots[i]) {
			l->ch_slots[i] = ch;
			ch->slot = i;
			return 0;
		}
	}
	if (l->ch_cap < MESH_CHANNEL_SLOTS) {
		uint32_t nc = l->ch_cap ? MIN(l->ch_cap * 2, MESH_CHANNEL_SLOTS) : 16;
		struct channel **s = realloc(l->ch_slots, nc * sizeof(*s));

		if (!s)
			return -ENOMEM;
		memset(s + l->ch_cap, 0, (nc - l->ch_cap) * sizeof(*s));
		ch->slot = l->ch_cap;
		s[l->ch_cap] = ch;
		l->ch_slots = s;
		l->ch_cap = nc;
		return 0;
	}
	return -EMFILE;
}

/* ---- channels to the local node ----
 *
 * A channel to this node is two channels of this meshd, opener and acceptor, in the slots of a link
 * of its own: always UP, without QPs, never in mesh->links (no keepalives, no meshctl links row).
 * Everything a peer's meshd would receive is queued here and delivered after the batch that
 * queued it: a control message is encoded and decoded again (the very handlers of a remote
 * channel run), a data or credit "write" is a memcpy into the other channel's ring or credit words
 * (both are mapped in this process) followed by the receiver's immediate and then the sender's
 * completion, the order RC gives them. So the pair shares all of a remote channel's code: credits,
 * EOF, the close handshake, counters, meshctl rows; only the bytes move by one copy in meshd
 * instead of an RDMA WRITE. */

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

static bool link_is_local(const struct link *l)
{
	return l->mesh->local && l == &l->mesh->local->link;
}

static struct link *local_link(struct mesh *m)
{
	struct channel_local *lo = m->local;

	if (!lo) {
		lo = calloc(1, sizeof(*lo));
		if (!lo)
			return NULL;
		lo->link.mesh = m;
		lo->link.peer = m->self;
		lo->link.phase = LINK_UP;
		lo->link.features = MESH_FEAT_CHANNELS;
		lo->link.rails_up = 1; /* its channels are on rail 0: that rail's thread pumps them */
		lo->link.peer_boot_epoch = m->boot_epoch;
		m->local = lo;
	}
	return &lo->link;
}

static int local_push(struct mesh *m, const struct local_ev *ev)
{
	struct channel_local *lo = m->local;

	if (lo->head && lo->head == lo->n)
		lo->head = lo->n = 0;
	if (lo->n == lo->cap) {
		size_t nc = lo->cap ? lo->cap * 2 : 256;
		struct local_ev *q;

		if (lo->head) {
			/* Room at the front: move what is queued there first. */
			memmove(lo->q, lo->q + lo->head, (lo->n - lo->head) * sizeof(*q));
			lo->n -= lo->head;
			lo->head = 0;
		} else {
			q = realloc(lo->q, nc * sizeof(*q));
			if (!q)
				return -ENOBUFS;
			lo->q = q;
			lo->cap = nc;
		}
	}
	lo->q[lo->n++] = *ev;
	return 0;
}

bool channel_local_pending(const struct mesh *m)
{
	return m->local && m->local->head < m->local->n;
}

/* A control message to the peer's meshd, or to ourselves for a local channel. */
static int link_send(struct link *l, const PeerMsg *msg)
{
	struct local_ev ev = {.kind = LOCAL_MSG};
	int ret;

	if (!link_is_local(l))
		return mesh_link_send(l, msg);
	ev.len = (uint32_t)peer_msg__get_packed_size(msg);
	ev.msg = malloc(ev.len ? ev.len : 1);
	if (!ev.msg)
		return -ENOBUFS; /* kept pending by the caller, as with busy send buffers */
	peer_msg__pack(msg, ev.msg);
	ret = local_push(l->mesh, &ev);
	if (ret)
		free(ev.msg);
	return ret;
}

/* Whether [addr, addr + len) lies in [base, base + size). */
static bool local_within(uint64_t addr, uint32_t len, const void *base, uint64_t size)
{
	uint64_t b = (uintptr_t)base;

	return addr >= b && len <= size && addr - b <= size - len;
}

/* An RDMA WRITE with immediate of the data path: on a link, posted on QP qp; on the local link a
 * copy into the other channel's ring or credit words (checked to be there: the address came from
 * its Open or Accept, which this meshd wrote itself, but a slip must not scribble over memory). */
static int channel_write_imm(struct channel *ch, uint32_t qp, xport_mr_t *mr, const void *buf, uint32_t len,
			     uint64_t raddr, uint32_t rkey, uint32_t imm, uint64_t wr_id)
{
	struct link *l = ch->link;
	struct channel *peer;
	struct local_ev ev = {.kind = LOCAL_IMM, .imm = imm, .len = len};
	int ret;

	if (!ch->local)
		return xport_post_write_imm(l->conns[qp], mr, buf, len, raddr, rkey, imm, wr_id);
	peer = link_channel(l, ch->peer_slot);
	if (!peer || peer->peer_slot != ch->slot ||
	    !(local_within(raddr, len, peer->rx, peer->size) || local_within(raddr, len, peer->credit, MESH_CREDIT_AREA)))
		return -EFAULT;
	memcpy((void *)(uintptr_t)raddr, buf, len);
	ret = local_push(ch->mesh, &ev);
	if (ret)
		return ret;
	ev = (struct local_ev){.kind = LOCAL_DONE, .qp = qp, .wr_id = wr_id};
	return local_push(ch->mesh, &ev);
}

/* The channel's registrations on the device of connection c, as struct channel names them. The
 * peer may write the RX ring, the credit slots, the pair hint and the 16 bytes of the direct pair,
 * nothing else of the control page. What was registered before a failure stays in mr, for the
 * caller to release. */
struct channel_mrs {
	xport_mr_t *tx, *rx, *cin, *cout, *dir, *hin;
};

static int channel_mr_reg(struct channel *ch, xport_conn_t *c, struct channel_mrs *mr)
{
	const unsigned remote = XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_WRITE;
	int ret;

	if ((ret = xport_mr_reg(c, ch->tx, ch->size, XPORT_ACCESS_LOCAL, &mr->tx)) ||
	    (ret = xport_mr_reg(c, ch->rx, ch->size, remote, &mr->rx)) ||
	    (ret = xport_mr_reg(c, ch->credit, MESH_CREDIT_AREA, remote, &mr->cin)) ||
	    (ret = xport_mr_reg(c, ch->credit + CH_CREDIT_OUT, 2 * MESH_CREDIT_LEN + MESH_PAIR_HINT_LEN,
				XPORT_ACCESS_LOCAL, &mr->cout)) ||
	    (ret = xport_mr_reg(c, ch->credit + CH_HINT_IN, MESH_PAIR_HINT_LEN, remote, &mr->hin)))
		return ret;
	if (strcmp(ch->mesh->cfg->direct_receive, "on"))
		return 0; /* cluster.direct_receive = off: no key, so the peer writes no pair */
	return xport_mr_reg(c, mesh_ring_direct(ch->ctrl), MESH_RING_DIRECT_LEN, remote, &mr->dir);
}

/* Registrations go through the graveyard: after the batch, after any QP that used them. */
static void channel_mrs_bury(struct mesh *m, struct channel_mrs mr)
{
	mesh_bury_mr(m, mr.tx);
	mesh_bury_mr(m, mr.rx);
	mesh_bury_mr(m, mr.cin);
	mesh_bury_mr(m, mr.cout);
	mesh_bury_mr(m, mr.dir);
	mesh_bury_mr(m, mr.hin);
}

static struct channel_mrs channel_mrs(const struct channel *ch)
{
	return (struct channel_mrs){ch->mr_tx, ch->mr_rx, ch->mr_cin, ch->mr_cout, ch->mr_dir, ch->mr_hin};
}

static void channel_mrs_set(struct channel *ch, const struct channel_mrs *mr)
{
	ch->mr_tx = mr->tx;
	ch->mr_rx = mr->rx;
	ch->mr_cin = mr->cin;
	ch->mr_cout = mr->cout;
	ch->mr_dir = mr->dir;
	ch->mr_hin = mr->hin;
}

static uint32_t mr_key(const xport_mr_t *mr)
{
	return mr ? mr->rkey : 0;
}

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

/* ---- creation and destruction ---- */

/* Its rail's list (mesh.rail_channels): a rail's thread walks its own channels only. */
static void channel_rail_link(struct channel *ch)
{
	struct mesh *m = ch->mesh;

	ch->rail_next = m->rail_channels[ch->rail];
	m->rail_channels[ch->rail] = ch;
}

static void channel_rail_unlink(struct channel *ch)
{
	for (struct channel **pp = &ch->mesh->rail_channels[ch->rail]; *pp; pp = &(*pp)->rail_next) {
		if (*pp == ch) {
			*pp = ch->rail_next;
			break;
		}
	}
	ch->rail_next = NULL;
}

static void channel_free(struct channel *ch)
{
	struct mesh *m = ch->mesh;
	struct channel **pp;

	for (pp = &m->channels; *pp; pp = &(*pp)->next) {
		if (*pp == ch) {
			*pp = ch->next;
			break;
		}
	}
	for (pp = &m->ch_by_id[ch->id % MESH_CH_BUCKETS]; *pp; pp = &(*pp)->id_next) {
		if (*pp == ch) {
			*pp = ch->id_next;
			break;
		}
	}
	channel_rail_unlink(ch);
	m->n_channels--;
	if (ch->link && ch->link->ch_slots && link_channel(ch->link, ch->slot) == ch)
		ch->link->ch_slots[ch->slot] = NULL;
	if (m->ch_ops.watch)
		m->ch_ops.watch(m->ch_ops.ctx, ch, false);
	channel_mrs_bury(m, channel_mrs(ch));
	if (ch->reply_fd >= 0 && m->ch_ops.deliver)
		m->ch_ops.deliver(m->ch_ops.ctx, ch->reply_fd, ch->error ? ch->error : -ECONNRESET,
				  ch->why[0] ? ch->why : "channel closed before it opened", NULL, NULL);
	/* The rings may still be a DMA target until the QPs in the graveyard are gone. */
	mesh_bury_map(m, ch->map, ch->map_len);
	mesh_bury_map(m, ch->credit, CH_CREDIT_PAGE);
	for (int *fd = &ch->memfd; fd <= &ch->app_life_fd; fd++)
		if (*fd >= 0)
			close(*fd);
	log_debug("channel %u freed", ch->id);
	free(ch->rx_len);
	free(ch);
}

static struct channel *channel_new(struct link *l, uint64_t size, uint32_t qps, uint32_t rail, int node, const char **why,
				   int *errp)
{
	struct mesh *m = l->mesh;
	struct channel *ch = calloc(1, sizeof(*ch));
	int sv[2];
	size_t len = MESH_RING_CTRL_SIZE + 2 * size;

	*why = "out of memory";
	*errp = -ENOMEM;
	if (!ch)
		return NULL;
	ch->memfd = ch->kick_fd = ch->wake_fd = ch->life_fd = ch->app_life_fd = ch->reply_fd = -1;
	ch->mesh = m;
	ch->link = l;
	ch->size = size;
	ch->qps = qps;
	ch->rail = rail;
	ch->qp0 = rail * m->cfg->qps_per_link;
	ch->chunk = (uint32_t)MIN((uint64_t)CH_CHUNK_MAX, size / 4);
	ch->rx_window = channel_rx_window(qps);
	ch->open_ms = now_ms();
	ch->pairs_wanted = true;
	ch->pairs_told = 1; /* the peer's hint words start zero, which means pairs wanted */
	ch->peer_boot = l->peer_boot_epoch;
	ch->xp = l->xp;
	ch->id = ++m->next_channel_id;
	ch->next = m->channels;
	m->channels = ch;
	ch->id_next = m->ch_by_id[ch->id % MESH_CH_BUCKETS];
	m->ch_by_id[ch->id % MESH_CH_BUCKETS] = ch;
	channel_rail_link(ch);
	m->n_channels++;
	ch->rx_len = calloc(ch->rx_window, sizeof(*ch->rx_len));
	if (!ch->rx_len) {
		ch->link = NULL;
		goto err;
	}
	if (link_slot_alloc(l, ch)) {
		*why = "no free channel slot on this link";
		*errp = -EMFILE;
		ch->link = NULL;
		goto err;
	}
	ch->memfd = memfd_create("mesh-channel", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	/* Sealed at its size: neither side can shrink it under the other's mapping (SIGBUS). */
	if (ch->memfd < 0 || ftruncate(ch->memfd, (off_t)len) ||
	    fcntl(ch->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		*why = "memfd_create/ftruncate/seal failed";
		*errp = -errno;
		goto err;
	}
	ch->map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, ch->memfd, 0);
	if (ch->map == MAP_FAILED) {
		ch->map = NULL;
		*why = "mmap of the ring failed";
		*errp = -errno;
		goto err;
	}
	ch->map_len = len;
	ch->ctrl = ch->map;
	ch->tx = (uint8_t *)ch->map + MESH_RING_CTRL_SIZE;
	ch->rx = ch->tx + size;
	/* Its own page: the credit words are registered (a peer writes one) and placed like the rings. */
	ch->credit = mmap(NULL, CH_CREDIT_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ch->credit == MAP_FAILED)
		ch->credit = NULL;
	/* Before the first touch: the policy decides where the pages are allocated. */
	ch->numa_want = node;
	if (node >= 0 && ch->credit) {
		int ret = numa_place(ch->map, len, node);

		if (!ret)
			ret = numa_place(ch->credit, CH_CREDIT_PAGE, node);
		if (ret) {
			log_warn("channel %u: cannot place the rings on NUMA node %d: %s; unplaced", ch->id, node,
				 mesh_strerror(ret));
			ch->numa_want = -1;
		}
	}
	ch->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ch->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!ch->credit || ch->kick_fd < 0 || ch->wake_fd < 0 ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv)) {
		*why = "out of descriptors or memory";
		goto err;
	}
	memset(ch->credit, 0, (CH_DIRECT_OUT + 2) * sizeof(*ch->credit));
	ch->life_fd = sv[0];
	ch->app_life_fd = sv[1];
	ch->ctrl->magic = MESH_RING_MAGIC;
	ch->ctrl->version = MESH_RING_VERSION;
	ch->ctrl->ring_size = size;
	ch->ctrl->tx_off = MESH_RING_CTRL_SIZE;
	ch->ctrl->rx_off = MESH_RING_CTRL_SIZE + size;
	ch->ctrl->channel_id = ch->id;
	ch->ctrl->peer_node = l->peer->id;
	ch->peer_node = l->peer->id;
	ch->ctrl->spin_us = m->cfg->app_spin_us;
	atomic_store_explicit(&ch->ctrl->daemon_flags, m->polling[rail] ? MESH_DAEMON_POLLING : 0, memory_order_relaxed);
	ch->local = link_is_local(l);
	/* On the rail's device; its first QP stands for all of the rail's QPs (a local channel's rings
	 * are only ever copied by this process: nothing to register). */
	if (!ch->local) {
		struct channel_mrs mr = {0};

		*errp = channel_mr_reg(ch, l->conns[ch->qp0], &mr);
		channel_mrs_set(ch, &mr);
		if (*errp) {
			*why = "memory registration failed";
			goto err;
		}
	}
	if (m->ch_ops.watch)
		m->ch_ops.watch(m->ch_ops.ctx, ch, true);
	return ch;
err:
	log_warn("channel to node %u: %s: %m", l->peer->id, *why);
	channel_free(ch);
	return NULL;
}

/* ---- the application side ---- */

static void channel_wake_app(struct channel *ch)
{
	uint64_t one = 1;

	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&ch->ctrl->app_flags, memory_order_acquire) & MESH_APP_WAITING) {
		if (write(ch->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
			log_debug("channel %u: wake: %m", ch->id);
	}
}

/* TX bytes the application may overwrite: written, and seen placed by the peer's meshd (its credit
 * says so). Not merely written: a write that completed may still be lost with the link before the
 * peer's meshd saw it, and a resume writes it again from this ring. The peer's placed position
 * never goes back, even across a resume (it resumes from there or later), so neither does this. */
static uint64_t channel_tx_freed(const struct channel *ch)
{
	/* Where the application may post its own writes (ring.h AQ area), nothing of ours bounds them
	 * to the peer's credit: the TX space it sees must, so it ends where the peer's reader does (from
	 * the start: the bound must never move back when the grant comes). */
	if (ch->aq_offered)
		return MIN(ch->tx_done, ch->peer_cons);
	return MIN(ch->tx_done, ch->peer_placed);
}

static void channel_publish(struct channel *ch)
{
	uint32_t st = MESH_STATE_OPEN;
	bool changed;

	if (ch->eof_known && ch->rx_bytes == ch->eof_total)
		st |= MESH_STATE_PEER_EOF;
	if (ch->error) {
		st |= MESH_STATE_ERROR;
		atomic_store_explicit(&ch->ctrl->error, ch->error, memory_order_relaxed);
	}
	changed = st != ch->published_state || channel_tx_freed(ch) != ch->published_tx ||
		  ch->rx_bytes != ch->published_rx;
	if (!changed)
		return; /* a periodic pump must not wake a waiting application for nothing */
	atomic_store_explicit(&ch->ctrl->tx_cons, channel_tx_freed(ch), memory_order_release);
	atomic_store_explicit(&ch->ctrl->rx_prod, ch->rx_bytes, memory_order_release);
	atomic_store_explicit(&ch->ctrl->state, st, memory_order_release);
	ch->published_state = st;
	ch->published_tx = channel_tx_freed(ch);
	ch->published_rx = ch->rx_bytes;
	channel_wake_app(ch);
}

/* A control message to the peer. -ENOBUFS (every send buffer of the link in flight) is not an
 * error: the caller keeps the message pending and the next pump (at the latest the tick) retries. */
static int channel_send(struct channel *ch, PeerMsg *msg)
{
	int ret;

	if (!ch->link || ch->link->phase != LINK_UP)
		return -ENOTCONN;
	ret = link_send(ch->link, msg);
	if (ret && ret != -ENOBUFS)
		log_warn("channel %u: cannot send a control message to node %u: %s", ch->id, ch->link->peer->id,
			 mesh_strerror(ret));
	return ret;
}

/* A ChannelClose to the peer's slot: reason, and how many data and credit writes we posted. */
static PeerMsg channel_close_msg(ChannelClose *c, uint32_t peer_slot, int reason, uint64_t chunks, uint64_t credits)
{
	PeerMsg msg = PEER_MSG__INIT;

	channel_close__init(c);
	c->slot = peer_slot;
	c->reason = reason;
	c->chunks = chunks;
	c->credits = credits;
	msg.body_case = PEER_MSG__BODY_CHANNEL_CLOSE;
	msg.channel_close = c;
	return msg;
}

static void channel_send_close(struct channel *ch, int reason)
{
	ChannelClose c;
	PeerMsg msg = channel_close_msg(&c, ch->peer_slot, reason, ch->posted_chunks, ch->credit_writes);

	if (!channel_send(ch, &msg))
		ch->close_sent = true;
}

static void channel_send_ack(struct channel *ch)
{
	PeerMsg msg = PEER_MSG__INIT;
	ChannelCloseAck a = CHANNEL_CLOSE_ACK__INIT;

	a.slot = ch->peer_slot;
	a.chunks = ch->posted_chunks;
	a.credits = ch->credit_writes;
	msg.body_case = PEER_MSG__BODY_CHANNEL_CLOSE_ACK;
	msg.channel_close_ack = &a;
	if (!channel_send(ch, &msg))
		ch->ack_sent = true;
}

static void channel_detach(struct channel *ch);

/* The channel is broken: no more data moves; the application sees err after the bytes it has. */
static void channel_break(struct channel *ch, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void channel_break(struct channel *ch, int err, const char *fmt, ...)
{
	va_list ap;

	if (ch->error)
		return;
	va_start(ap, fmt);
	vsnprintf(ch->why, sizeof(ch->why), fmt, ap);
	va_end(ap);
	ch->error = err;
	ch->state = CH_CLOSING;
	if (ch->resuming) {
		/* A broken channel waits for nothing: with the link UP its Close tells the peer, without
		 * it the peer's resume finds the slot free and is refused. */
		ch->resuming = false;
		if (!ch->link || ch->link->phase != LINK_UP)
			channel_detach(ch);
	}
	log_warn("channel %u (node %u port %u): %s (%s)", ch->id, ch->peer_node, ch->peer_port, ch->why,
		 mesh_strerror(err));
}

/* The furthest claim of arrived bytes in our page, unchecked (0: none): a whole direct pair, or
 * what our application's own CQ said of the peer application's writes (ring.h rx_seen, where the
 * position rides in the immediate: MESH_AQ_CAP_IMM_POS). */
static uint64_t channel_rx_claim(struct channel *ch)
{
	uint64_t pos, seen;

	if (!mesh_ring_direct_read(ch->ctrl, &pos))
		pos = 0;
	if (ch->aq_offered && (seen = atomic_load_explicit(&mesh_ring_aq(ch->ctrl)->rx_seen, memory_order_acquire)) > pos)
		pos = seen;
	return pos;
}

/* How far the application may have read: our contiguous prefix, or further where channel_rx_claim
 * said so (ring.h; a sender never passes our credit by a ring, and we never credit past
 * rx_bytes). */
static uint64_t channel_rx_readable(struct channel *ch)
{
	uint64_t pos;

	if (ch->local)
		return ch->rx_bytes;
	pos = channel_rx_claim(ch);
	if (pos <= ch->rx_bytes || pos - ch->rx_bytes > ch->size)
		return ch->rx_bytes;
	return pos;
}

/* The reader's position as we tell the peer: never past what we placed ourselves. The
 * application may be ahead (it read a direct pair before we saw the immediates), but what we
 * credit is also what we call placed, and a resume rewrites from there. */
static uint64_t channel_rx_credit(const struct channel *ch)
{
	return MIN(ch->app_rx_cons, ch->rx_bytes);
}

/* Reads and checks what the application published. */
static int channel_read_app(struct channel *ch)
{
	/* The flag first: the tx_prod published before MESH_APP_SHUT_WR is then visible too, so the
	 * last bytes are never cut off. */
	uint32_t flags = atomic_load_explicit(&ch->ctrl->app_flags, memory_order_acquire);
	uint64_t tx_prod = atomic_load_explicit(&ch->ctrl->tx_prod, memory_order_acquire);
	uint64_t rx_cons = atomic_load_explicit(&ch->ctrl->rx_cons, memory_order_acquire);
	/* Never below what the application was already allowed to read: a direct pair caught while
	 * the next one lands reads as invalid for a moment, and the reader may be past rx_bytes by an
	 * earlier valid one (a channel of the VM's all-to-all test broke so, its reader having moved
	 * by nothing). */
	uint64_t readable = MAX(channel_rx_readable(ch), ch->app_rx_cons);

	if (ch->app_shut && tx_prod != ch->app_tx_prod)
		tx_prod = ch->app_tx_prod; /* bytes after SHUT_WR are not part of the stream */
	if (!mesh_ring_in_window(tx_prod, ch->app_tx_prod, ch->published_tx + ch->size)) {
		channel_break(ch, -EPROTO, "application published tx_prod %llu outside [%llu, %llu]",
			      (unsigned long long)tx_prod, (unsigned long long)ch->app_tx_prod,
			      (unsigned long long)(ch->published_tx + ch->size));
		return -EPROTO;
	}
	if (!mesh_ring_in_window(rx_cons, ch->app_rx_cons, readable)) {
		channel_break(ch, -EPROTO, "application published rx_cons %llu outside [%llu, %llu]",
			      (unsigned long long)rx_cons, (unsigned long long)ch->app_rx_cons,
			      (unsigned long long)readable);
		return -EPROTO;
	}
	ch->app_tx_prod = tx_prod;
	ch->app_rx_cons = rx_cons;
	if (flags & MESH_APP_SHUT_WR)
		ch->app_shut = true;
	return 0;
}

/* ---- the data path ---- */

static bool channel_may_post(const struct channel *ch)
{
	return ch->state == CH_OPEN && !ch->error && !ch->close_rcvd && !ch->close_sent && !ch->resuming &&
	       !ch->refused_ms && ch->link && mesh_link_rail_up(ch->link, ch->rail);
}

static bool channel_resumable(const struct channel *ch);

/* A QP refused one of the channel's writes: it is a connection going down, whose own event (a
 * rail or the link DOWN) may come only later in this batch or at the keepalive timeout. A channel
 * that can resume waits for that event without posting (the resume then rewinds past whatever the
 * QP lost): breaking it here lost a channel to a blip it was made to live through. channel_tick
 * breaks it after all if no such event comes (a QP refusing work on a link that stays UP). */
static void channel_refused(struct channel *ch, uint32_t qp, int err, const char *what)
{
	if (!channel_resumable(ch)) {
		channel_break(ch, -ECONNRESET, "posting %s on QP %u failed: %s", what, qp, mesh_strerror(err));
		return;
	}
	if (ch->refused_ms)
		return;
	ch->refused_ms = now_ms();
	ch->refused_qp = qp;
	ch->refused_err = err;
	log_info("channel %u (node %u port %u): QP %u refused %s (%s); waiting for its rail or link to go down, "
		 "then resuming", ch->id, ch->link->peer->id, ch->peer_port, qp, what, mesh_strerror(err));
}

static void channel_aq_account(struct channel *ch);
static void channel_aq_ungrant(struct channel *ch);
static void channel_aq_take(struct channel *ch, bool force);

static void channel_post_data(struct channel *ch)
{
	struct link *l = ch->link;

	if (ch->aq_granted || ch->aq_wait_pos) {
		/* The application posts (or did, and the peer is to say how far it got). */
		if (ch->aq_granted)
			channel_aq_account(ch);
		return;
	}
	while (channel_may_post(ch) && ch->tx_sent < ch->app_tx_prod) {
		uint64_t credit_end = ch->peer_cons + ch->size;
		uint64_t off = ch->tx_sent & (ch->size - 1);
		uint32_t qp = ch->qp0 + ch->next_qp, len;
		int ret;

		if (ch->tx_sent >= credit_end)
			return;
		if ((uint16_t)(ch->tx_seq - ch->tx_done_seq) >= CH_WINDOW || !mesh_link_sq_room(l, qp))
			return;
		len = (uint32_t)MIN(MIN(ch->app_tx_prod, credit_end) - ch->tx_sent, (uint64_t)ch->chunk);
		len = (uint32_t)MIN((uint64_t)len, mesh_ring_contig(ch->tx_sent, ch->size));
		ret = channel_write_imm(ch, qp, ch->mr_tx, ch->tx + off, len, ch->peer_rx_addr + off, ch->peer_rx_rkey, MESH_IMM(0, ch->peer_slot, ch->tx_seq),
					   WR_ID(WR_CH_DATA, (ch->slot << 16) | ch->tx_seq));
		if (ret) {
			channel_refused(ch, qp, ret, "a data write");
			return;
		}
		mesh_link_sq_take(l, qp);
		ch->tx_len[ch->tx_seq % CH_WINDOW] = len;
		ch->tx_ok[ch->tx_seq % CH_WINDOW] = false;
		ch->tx_qp[ch->tx_seq % CH_WINDOW] = (uint8_t)ch->next_qp;
		ch->tx_seq++;
		ch->tx_sent += len;
		ch->tx_bytes += len;
		ch->tx_chunks++;
		/* The link's counters: another rail's fast path may add to them at the same time. */
		__atomic_fetch_add(&l->metrics.tx_bytes, len, __ATOMIC_RELAXED);
		__atomic_fetch_add(&l->metrics.tx_chunks, 1, __ATOMIC_RELAXED);
		ch->posted_chunks++;
		ch->inflight++;
		ch->next_qp = (ch->next_qp + 1) % ch->qps;
	}
}

/* Whether the peer's meshd said its reader sleeps through our direct pairs (wire.h
 * MESH_PAIR_HINT_*), so that we write none: only a whole hint counts, a torn or foreign one leaves
 * the pairs on. */
bool channel_pairs_paused(const struct channel *ch)
{
	uint64_t v, c;

	if (!ch->credit || !ch->peer_direct_rkey || ch->local)
		return false;
	v = __atomic_load_n(&ch->credit[CH_HINT_IN], __ATOMIC_ACQUIRE);
	c = __atomic_load_n(&ch->credit[CH_HINT_IN + 1], __ATOMIC_ACQUIRE);
	return v == MESH_PAIR_HINT_OFF && c == mesh_ring_direct_check(v);
}

/* Direct receive (ring.h): the pair {pos, check} into the peer's control page, on the QP of our
 * last chunk, pos covering every chunk that is on that QP before it or has completed. The verbs
 * execute one RC QP's writes in order, so the peer's application may read every byte below pos
 * as soon as it sees the pair, without waiting for its meshd to poll the immediates. One pair in
 * flight at a time (its source words must not change under the NIC); the next covers what came
 * meanwhile. Nothing for a peer that gave no key (an older meshd) or for the local link. */
static void channel_post_direct(struct channel *ch)
{
	uint64_t pos = ch->tx_done;
	uint32_t q = ch->tx_qp[(uint16_t)(ch->tx_seq - 1) % CH_WINDOW];
	int ret;

	if (!ch->peer_direct_rkey || ch->direct_busy || ch->local || !channel_may_post(ch) || channel_pairs_paused(ch) ||
	    ch->aq_granted || ch->aq_wait_pos)
		return;
	if (ch->tx_seq == ch->tx_done_seq)
		q = 0; /* all completed: any QP will do */
	for (uint16_t s = ch->tx_done_seq; s != ch->tx_seq; s++) {
		if (!ch->tx_ok[s % CH_WINDOW] && ch->tx_qp[s % CH_WINDOW] != q)
			break;
		pos += ch->tx_len[s % CH_WINDOW];
	}
	if (pos <= ch->direct_sent || !mesh_link_sq_room(ch->link, ch->qp0 + q))
		return;
	ch->credit[CH_DIRECT_OUT] = pos;
	ch->credit[CH_DIRECT_OUT + 1] = mesh_ring_direct_check(pos);
	ret = xport_post_write(ch->link->conns[ch->qp0 + q], ch->mr_cout, &ch->credit[CH_DIRECT_OUT],
			       MESH_RING_DIRECT_LEN, ch->peer_direct_addr, ch->peer_direct_rkey,
			       WR_ID(WR_CH_DIRECT, ch->slot));
	if (ret) {
		/* The pair only spares the reader a hop: without it the bytes still arrive through the
		 * immediates. A QP that refuses it is a connection going down whose own event follows
		 * (a blip the channel must live through by resuming, which breaking it here prevented:
		 * a CI run lost a channel so), so nothing is taken and the next pair tries again. */
		log_debug("channel %u: posting a direct pair on QP %u failed: %s", ch->id, ch->qp0 + q,
			  mesh_strerror(ret));
		return;
	}
	mesh_link_sq_take(ch->link, ch->qp0 + q);
	ch->direct_busy = true;
	ch->direct_sent = pos;
	ch->direct_writes++;
	ch->inflight++;
}

/* Pairs on demand, as the receiving side (wire.h MESH_PAIR_HINT_*): a chunk's immediate has just
 * been taken. The peer's pairs were of use if our reader already read past what we had placed
 * before it (it saw a pair); after CH_PAIRS_IDLE_MAX chunks in a row without that, the reader is
 * one that sleeps until we wake it (or reads only when it is done with other work), and we ask
 * for no more pairs; once CH_PAIRS_RETRY_CHUNKS chunks and CH_PAIRS_RETRY_MS have passed we ask
 * for them again (by time alone, a channel carrying a request now and then had them on for most
 * of its messages: redis in the VM gained nothing). rx_cons is the application's word: a hostile
 * one changes only whether its own channel gets pairs. */
static void channel_pairs_judge(struct channel *ch, uint64_t placed_before)
{
	uint64_t cons;

	if (!ch->peer_hint_rkey || !ch->mr_dir || ch->local)
		return; /* no pairs come (direct_receive = off), or the peer takes no hints */
	if (!ch->pairs_wanted) {
		if (++ch->pairs_idle >= CH_PAIRS_RETRY_CHUNKS && now_ms() >= ch->pairs_off_ms + CH_PAIRS_RETRY_MS) {
			ch->pairs_wanted = true;
			ch->pairs_idle = 0;
		}
		return;
	}
	cons = atomic_load_explicit(&ch->ctrl->rx_cons, memory_order_acquire);
	if (cons > placed_before)
		ch->pairs_idle = 0;
	else if (++ch->pairs_idle >= CH_PAIRS_IDLE_MAX) {
		ch->pairs_wanted = false;
		ch->pairs_idle = 0;
		ch->pairs_off_ms = now_ms();
	}
}

/* The hint itself, when what we want differs from what the peer last heard: a plain WRITE on
 * QP 0, one in flight at a time (its source words must not change under the NIC). A refused post
 * is a connection going down, as for the direct pair: the resume that follows says it again. */
static void channel_post_hint(struct channel *ch)
{
	uint64_t v = ch->pairs_wanted ? MESH_PAIR_HINT_ON : MESH_PAIR_HINT_OFF;

	if (!ch->peer_hint_rkey || ch->hint_busy || ch->local || ch->pairs_told == (int8_t)ch->pairs_wanted ||
	    !channel_may_post(ch) || !mesh_link_sq_room(ch->link, ch->qp0))
		return;
	ch->credit[CH_HINT_OUT] = v;
	ch->credit[CH_HINT_OUT + 1] = mesh_ring_direct_check(v);
	if (xport_post_write(ch->link->conns[ch->qp0], ch->mr_cout, &ch->credit[CH_HINT_OUT], MESH_PAIR_HINT_LEN,
			     ch->peer_hint_addr, ch->peer_hint_rkey, WR_ID(WR_CH_HINT, ch->slot)))
		return;
	mesh_link_sq_take(ch->link, ch->qp0);
	ch->hint_busy = true;
	ch->pairs_told = (int8_t)ch->pairs_wanted;
	ch->hint_writes++;
	ch->inflight++;
}

/* The sender waits for the peer's reader when a whole ring of its bytes is not consumed yet:
 * either meshd has no credit to post them, or the application cannot write (its TX space comes
 * back only with what the reader's meshd placed, and the credits that say so follow the reader).
 * Counted once per wait. */
static void channel_note_stall(struct channel *ch)
{
	bool stalled = ch->app_tx_prod - ch->peer_cons >= ch->size;

	if (stalled && !ch->stalled) {
		ch->credit_stalls++;
		if (ch->link)
			__atomic_fetch_add(&ch->link->metrics.credit_stalls, 1, __ATOMIC_RELAXED);
	}
	ch->stalled = stalled;
}

static void channel_post_credit(struct channel *ch)
{
	struct link *l = ch->link;
	uint64_t cons = channel_rx_credit(ch);
	int ret;

	if (!channel_may_post(ch) || ch->credit_busy || cons == ch->credit_sent)
		return;
	/* Only per half ring, or a quarter when the sender is short of room (ring.h
	 * mesh_ring_credit_step): a sender is stalled only with a whole ring uncredited, so once its
	 * reader has made room for a quarter it hears; small exchanges (ping-pong, requests) cost no
	 * credit write each. */
	if (cons - ch->credit_sent < mesh_ring_credit_step(ch->size, ch->rx_bytes - ch->credit_sent))
		return;
	if (!mesh_link_sq_room(l, ch->qp0))
		return;
	/* Into the next of the peer's credit slots (wire.h MESH_CREDIT_SLOTS), named by the immediate. */
	ch->credit[CH_CREDIT_OUT] = cons;
	ch->credit[CH_CREDIT_OUT + 1] = ch->rx_bytes;
	ret = channel_write_imm(ch, ch->qp0, ch->mr_cout, &ch->credit[CH_CREDIT_OUT], MESH_CREDIT_LEN,
				ch->peer_credit_addr + (ch->credit_writes % MESH_CREDIT_SLOTS) * MESH_CREDIT_LEN,
				ch->peer_credit_rkey, MESH_IMM(1, ch->peer_slot, ch->credit_writes),
				WR_ID(WR_CH_CREDIT, ch->slot));
	if (ret) {
		channel_refused(ch, ch->qp0, ret, "a credit write");
		return;
	}
	mesh_link_sq_take(l, ch->qp0);
	ch->credit_writes++;
	ch->credit_busy = true;
	ch->credit_posting = cons;
	ch->inflight++;
}

/* ---- application-posted writes (ring.h, the AQ area) ---- */

static void channel_pump(struct channel *ch);

/* ChannelAppQp states (proto/peer.proto). */
enum { AQ_MSG_OFFER = 1, AQ_MSG_READY, AQ_MSG_SENDING, AQ_MSG_HANDBACK, AQ_MSG_PLACED, AQ_MSG_REVOKE };

/* Offered to the application at hand-over: cluster.app_send and direct_receive on, a remote link
 * over a provider with QP paths (rdma), whose peer relays ChannelAppQp. */
static bool channel_aq_possible(const struct channel *ch)
{
	const struct mesh_config *cfg = ch->mesh->cfg;

	return !ch->local && ch->link && ch->link->phase == LINK_UP && (ch->link->features & MESH_FEAT_APPQP) &&
	       !strcmp(cfg->app_send, "on") && !strcmp(cfg->direct_receive, "on");
}

/* The page's path is the tcp provider's: the application's own TCP connection stands for its QP. */
static bool channel_aq_tcp(const struct channel *ch)
{
	return mesh_ring_aq(ch->ctrl)->path_valid == MESH_AQ_PATH_TCP;
}

/* The path of the channel's rail (read off its first QP) into the control page. */
static bool channel_aq_path(struct channel *ch)
{
	struct mesh_ring_aq *q = mesh_ring_aq(ch->ctrl);
	struct xport_path p;
	int ret;

	memset(&p, 0, sizeof(p));
	ret = xport_path(ch->link->conns[ch->qp0], &p);
	if (ret) {
		if (ret != -EOPNOTSUPP)
			log_debug("channel %u: no path for application-posted writes: %s", ch->id, mesh_strerror(ret));
		return false;
	}
	if (p.kind == XPORT_PATH_TCP) {
		if (!(ch->link->features & MESH_FEAT_APPTCP))
			return false; /* the peer's meshd would not relay such an offer */
		memset(q->dev, 0, sizeof(q->dev));
		q->port = 0; /* an older libmesh takes no offer without a port */
		q->tcp_family = (uint8_t)p.family;
		memcpy(q->tcp_local, p.local, sizeof(q->tcp_local));
		memcpy(q->tcp_peer, p.peer, sizeof(q->tcp_peer));
		q->path_valid = MESH_AQ_PATH_TCP;
		return true;
	}
	memcpy(q->dev, p.dev, sizeof(q->dev));
	q->dev[sizeof(q->dev) - 1] = '\0';
	q->port = p.port;
	q->sgid_index = p.sgid_index;
	q->path_mtu = p.path_mtu;
	q->hop_limit = p.hop_limit;
	q->traffic_class = p.traffic_class;
	q->ack_timeout = p.ack_timeout;
	memcpy(q->dgid, p.dgid, sizeof(q->dgid));
	q->path_valid = MESH_AQ_PATH_RDMA;
	return true;
}

/* The first offer, before the application maps the page. */
static void channel_aq_offer(struct channel *ch)
{
	if (channel_aq_possible(ch) && channel_aq_path(ch))
		ch->aq_offered = true;
}

static int channel_aq_send(struct channel *ch, ChannelAppQp *a)
{
	PeerMsg msg = PEER_MSG__INIT;

	a->slot = ch->peer_slot;
	a->round = ch->aq_round; /* what our application's QP it concerns (HANDBACK and PLACED: none) */
	msg.body_case = PEER_MSG__BODY_CHANNEL_APP_QP;
	msg.channel_app_qp = a;
	return channel_send(ch, &msg);
}

/* The peer application's latest offer into our application's page, once its page can take one
 * (offered, in a round not revoked, no peer QP in it yet): an offer that came early (the peer's
 * meshd renewed before ours) waits, with its READY, in aq_pend. */
static void channel_aq_install(struct channel *ch)
{
	struct mesh_ring_aq *q = mesh_ring_aq(ch->ctrl);

	if (!ch->aq_pend.valid || !ch->aq_offered || ch->aq_done ||
	    atomic_load_explicit(&q->peer_state, memory_order_relaxed) != MESH_AQ_PEER_NONE)
		return;
	q->peer_qpn = ch->aq_pend.qpn;
	q->peer_psn = ch->aq_pend.psn;
	q->peer_rx_addr = ch->aq_pend.rx_addr;
	q->peer_rx_rkey = ch->aq_pend.rx_rkey;
	q->peer_dir_addr = ch->aq_pend.dir_addr;
	q->peer_dir_rkey = ch->aq_pend.dir_rkey;
	q->peer_caps = ch->aq_pend.caps;
	q->peer_tcp_port = ch->aq_pend.tcp_port;
	memcpy(q->peer_tcp_token, ch->aq_pend.tcp_token, sizeof(q->peer_tcp_token));
	ch->aq_peer_round = ch->aq_pend.round;
	ch->aq_peer_next = (uint64_t)ch->aq_pend.round + 1;
	ch->aq_peer_ready = ch->aq_pend.ready;
	ch->aq_pend.valid = false;
	atomic_store_explicit(&q->peer_state, ch->aq_peer_ready ? MESH_AQ_PEER_READY : MESH_AQ_PEER_INFO,
			      memory_order_release);
	channel_wake_app(ch);
}

/* A resume revoked our application's QP: once the resume is done and the application said IDLE,
 * it is offered a new one on the channel's rail now (ring.h round). The page's words go back to a
 * fresh offer's before the round changes; the application writes nothing while it is IDLE. */
static void channel_aq_renew(struct channel *ch)
{
	struct mesh_ring_aq *q = mesh_ring_aq(ch->ctrl);

	if (!ch->aq_renew || ch->resuming || ch->state != CH_OPEN)
		return;
	if (ch->app_gone || ch->app_shut || ch->error || !channel_aq_possible(ch) ||
	    !(ch->link->features & MESH_FEAT_APPQP_RENEW)) {
		ch->aq_renew = false;
		return;
	}
	if (ch->aq_app != MESH_AQ_IDLE || ch->aq_granted || ch->aq_wait_pos)
		return; /* its QP is still being stopped, or the peer is to say where our bytes end */
	if (!channel_aq_path(ch)) {
		ch->aq_renew = false;
		return;
	}
	atomic_store_explicit(&q->peer_state, MESH_AQ_PEER_NONE, memory_order_relaxed);
	atomic_store_explicit(&q->grant, MESH_AQ_MESHD, memory_order_relaxed);
	atomic_store_explicit(&q->grant_pos, 0, memory_order_relaxed);
	atomic_store_explicit(&q->app_state, MESH_AQ_NONE, memory_order_relaxed);
	ch->aq_round++;
	atomic_store_explicit(&q->round, ch->aq_round, memory_order_release);
	ch->aq_app = MESH_AQ_NONE;
	ch->aq_done = ch->aq_revoked = ch->aq_peer_ready = ch->aq_renew = false;
	channel_aq_ungrant(ch);
	log_info("channel %u (node %u port %u): the application may post its own writes again (rail %u, round %u)",
		 ch->id, ch->peer_node, ch->peer_port, ch->rail, ch->aq_round);
	channel_aq_install(ch);
	channel_wake_app(ch);
}

static bool aq_token_zero(const uint8_t t[MESH_AQ_TOKEN_LEN])
{
	uint8_t acc = 0;

	for (int i = 0; i < MESH_AQ_TOKEN_LEN; i++)
		acc |= t[i];
	return !acc;
}

/* Relays what our application did with its QP. Its words are hostile: a state that goes back or
 * a QP number beyond 24 bits breaks its own channel, as any other breach of the ring contract. */
static void channel_aq_app(struct channel *ch)
{
	struct mesh_ring_aq *q = mesh_ring_aq(ch->ctrl);
	ChannelAppQp a = CHANNEL_APP_QP__INIT;
	uint8_t token[MESH_AQ_TOKEN_LEN];
	uint32_t st;

	/* Even once the application is gone: its last word (IDLE, before its shutdown) still counts. */
	if (!ch->aq_offered || ch->state != CH_OPEN || !ch->link || ch->link->phase != LINK_UP)
		return;
	st = atomic_load_explicit(&q->app_state, memory_order_acquire);
	if (st == ch->aq_app)
		return;
	if (st > MESH_AQ_IDLE || st < ch->aq_app) {
		channel_break(ch, -EPROTO, "application's own QP went from state %u to %u", ch->aq_app, st);
		return;
	}
	if (ch->aq_app == MESH_AQ_NONE && st != MESH_AQ_IDLE) {
		a.state = AQ_MSG_OFFER;
		a.qpn = q->qpn;
		a.psn = q->psn;
		a.rx_addr = q->rx_addr;
		a.rx_rkey = q->rx_rkey;
		a.dir_addr = q->dir_addr;
		a.dir_rkey = q->dir_rkey;
		a.caps = q->caps & ~MESH_AQ_CAP_TAKE; /* the peer's application checks what it uses */
		ch->aq_take = q->caps & MESH_AQ_CAP_TAKE; /* as offered: the words may change later */
		if (channel_aq_tcp(ch)) {
			uint32_t port = q->tcp_port;

			/* A port and a token in place of a QP: the rest goes as zero. */
			channel_app_qp__init(&a);
			a.state = AQ_MSG_OFFER;
			a.tcp_port = port;
			a.tcp_token.data = token;
			a.tcp_token.len = sizeof(token);
			memcpy(token, q->tcp_token, sizeof(token));
			if (!port || port > 65535 || aq_token_zero(token)) {
				channel_break(ch, -EPROTO, "application offered TCP port %u with %s token", port,
					      aq_token_zero(token) ? "a zero" : "a");
				return;
			}
		} else if (a.qpn > 0xffffff || a.psn > 0xffffff || !a.rx_rkey || !a.dir_rkey) {
			channel_break(ch, -EPROTO, "application offered QP %u PSN %u with keys %u/%u", a.qpn, a.psn,
				      a.rx_rkey, a.dir_rkey);
			return;
		}
		if (channel_aq_send(ch, &a))
			return; /* the next pump retries */
		ch->aq_app = MESH_AQ_OFFER;
	}
	if (ch->aq_app == MESH_AQ_OFFER && st >= MESH_AQ_READY) {
		channel_app_qp__init(&a);
		a.state = AQ_MSG_READY;
		if (st == MESH_AQ_READY && channel_aq_send(ch, &a))
			return;
		ch->aq_app = MESH_AQ_READY;
	}
	if (st == MESH_AQ_IDLE) {
		/* A grant it never took goes back to us (nothing of it went); one it took, the peer
		 * hears of before the hand-back. */
		channel_aq_take(ch, false);
		ch->aq_tell = false; /* could not go: the peer answers the hand-back from what it placed */
		log_debug("channel %u: the application is done with its own QP (%s, peer's writes %s)", ch->id,
			  !ch->aq_granted ? "not granted" : ch->resuming ? "resuming" : "granted",
			  ch->aq_peer_sends ? "its own" : "ours");
		ch->aq_app = MESH_AQ_IDLE;
		ch->aq_done = true;
		if (ch->aq_peer_sends) {
			/* Its QP is done: the peer's application must stop writing to it and hand back too. */
			channel_app_qp__init(&a);
			a.state = AQ_MSG_REVOKE;
			if (channel_aq_send(ch, &a))
				log_debug("channel %u: cannot revoke the peer's writes now; its link's resume will", ch->id);
		}
		if (ch->aq_granted && !ch->aq_wait_pos) {
			channel_aq_account(ch); /* its last publication, read by this pump */
			if (ch->resuming) {
				/* The resume rewinds our sending half to what the peer has. */
				channel_aq_ungrant(ch);
			} else {
				/* It gave the half back: the peer says where its reader's bytes end, and we
				 * post from there. */
				channel_app_qp__init(&a);
				a.state = AQ_MSG_HANDBACK;
				ch->aq_revoked = true;
				ch->aq_wait_pos = true;
				atomic_store_explicit(&q->grant, MESH_AQ_REVOKED, memory_order_release);
				if (channel_aq_send(ch, &a))
					ch->aq_wait_pos = false; /* the link is going: its resume rewinds instead */
			}
		}
	}
}

/* Not granted (any more): nothing of a grant offered and not taken is left either. */
static void channel_aq_ungrant(struct channel *ch)
{
	ch->aq_granted = ch->aq_untaken = ch->aq_tell = false;
}

/* The application posts from now on: meshd counts the grant, and the peer's meshd is to hear from
 * where (it then takes the arrived bytes from the pair, or rx_seen). */
static void channel_aq_posts(struct channel *ch, uint64_t from)
{
	ch->aq_grants++;
	if (ch->link)
		ch->link->metrics.app_grants++;
	log_debug("channel %u: the application posts its own writes from %llu", ch->id, (unsigned long long)from);
}

static void channel_aq_tell(struct channel *ch)
{
	ChannelAppQp a = CHANNEL_APP_QP__INIT;

	a.state = AQ_MSG_SENDING;
	a.pos = ch->aq_from;
	if (!channel_aq_send(ch, &a))
		ch->aq_tell = false; /* else the next pump retries */
}

/* A grant offered and not taken yet (aq_untaken; ring.h MESH_AQ_CAP_TAKE). Withdrawn, by turning
 * the page's grant from APP back to MESHD, when bytes were published past its position (the
 * application may have looked before our store: they would wait for its next call, which a program
 * that writes and then waits elsewhere never makes; the Go binding's test of deadlines hung so),
 * when the application said IDLE or is gone (it will not take it), or when `force` (a revocation).
 * Whichever compare-and-swap succeeds, ours or the application's (APP to TAKEN), decides who sends
 * them. Until it is decided nothing of the half is posted or counted. Taken: the peer hears. */
static void channel_aq_take(struct channel *ch, bool force)
{
	struct mesh_ring_aq *q = mesh_ring_aq(ch->ctrl);
	uint32_t v;

	if (!ch->aq_untaken) {
		if (ch->aq_tell)
			channel_aq_tell(ch);
		return;
	}
	v = atomic_load_explicit(&q->grant, memory_order_acquire);
	if (v == MESH_AQ_APP) {
		/* After our store of the grant (and the application after its publication): one of
		 * the two loads sees the other's store. */
		atomic_thread_fence(memory_order_seq_cst);
		if (!force && !ch->app_gone &&
		    atomic_load_explicit(&ch->ctrl->tx_prod, memory_order_relaxed) == ch->aq_from &&
		    atomic_load_explicit(&q->app_state, memory_order_relaxed) == MESH_AQ_READY)
			return; /* it takes it with its next bytes, or any call before */
		if (atomic_compare_exchange_strong_explicit(&q->grant, &v, MESH_AQ_MESHD, memory_order_acq_rel,
							    memory_order_acquire)) {
			channel_aq_ungrant(ch);
			ch->aq_withdrawn++;
			log_debug("channel %u: the grant from %llu withdrawn before the application took it", ch->id,
				  (unsigned long long)ch->aq_from);
			return;
		}
	}
	if (v != MESH_AQ_TAKEN) {
		channel_break(ch, -EPROTO, "application wrote %u over meshd's grant (only %u may replace %u)", v,
			      MESH_AQ_TAKEN, MESH_AQ_APP);
		return;
	}
	ch->aq_untaken = false;
	ch->aq_tell = true;
	channel_aq_posts(ch, ch->aq_from);
	if (!force)
		channel_aq_tell(ch);
}

/* The application posts our sending half from now on: once both applications are ready and none
 * of our own data writes or pairs is in flight (the peer's meshd then has every byte below the
 * position, or will have it by the immediates already on their way). */
static void channel_aq_grant(struct channel *ch)
{
	struct mesh_ring_aq *q = mesh_ring_aq(ch->ctrl);
	ChannelAppQp a = CHANNEL_APP_QP__INIT;

	if (!ch->aq_offered || ch->aq_granted || ch->aq_done || ch->aq_app != MESH_AQ_READY || !ch->aq_peer_ready ||
	    ch->app_shut || !channel_may_post(ch) || ch->tx_sent != ch->app_tx_prod || ch->tx_done != ch->tx_sent ||
	    ch->direct_busy)
		return;
	/* The page's tx_prod now, not as this pump read it: bytes published since are ours, and the
	 * grant waits until we posted them. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&ch->ctrl->tx_prod, memory_order_acquire) != ch->tx_sent)
		return;
	ch->aq_from = ch->tx_sent;
	if (ch->aq_take) {
		/* Offered until taken: channel_aq_take decides who sends what is published meanwhile,
		 * and looks at once. */
		ch->aq_granted = ch->aq_untaken = true;
		atomic_store_explicit(&q->grant_pos, ch->aq_from, memory_order_relaxed);
		atomic_store_explicit(&q->grant, MESH_AQ_APP, memory_order_release);
		channel_aq_take(ch, false);
		if (ch->aq_granted)
			channel_wake_app(ch);
		return;
	}
	/* An application that does not take grants (an older libmesh): the peer hears first, and
	 * the grant is its own at once. A publication made while we send SENDING is left to its next
	 * call, the race MESH_AQ_CAP_TAKE closes. */
	a.state = AQ_MSG_SENDING;
	a.pos = ch->tx_sent;
	if (channel_aq_send(ch, &a))
		return;
	ch->aq_granted = true;
	channel_aq_posts(ch, ch->aq_from);
	atomic_store_explicit(&q->grant_pos, ch->tx_sent, memory_order_relaxed);
	atomic_store_explicit(&q->grant, MESH_AQ_APP, memory_order_release);
	channel_wake_app(ch);
}

/* Our application posts (aq_granted), or did until it says IDLE: what it published is on its way
 * (it publishes with the post; after a revocation, bytes it could not post count too, and the
 * rewind that follows sends them). */
static void channel_aq_account(struct channel *ch)
{
	uint64_t len = ch->app_tx_prod - ch->tx_sent;

	if (!len || ch->aq_untaken)
		return; /* not taken (yet): nothing of it is the application's */
	ch->tx_sent = ch->tx_done = ch->app_tx_prod;
	ch->tx_bytes += len;
	ch->tx_chunks++;
	__atomic_fetch_add(&ch->link->metrics.tx_bytes, len, __ATOMIC_RELAXED);
	__atomic_fetch_add(&ch->link->metrics.tx_chunks, 1, __ATOMIC_RELAXED);
}

/* The peer's application posts its half: the bytes below a valid direct pair have arrived (RC
 * order on its QP; the bytes below aq_peer_from came by our immediates, which must all be in).
 * The pair is the peer application's word: within our reader's credit and the EOF, or ignored. */
static void channel_aq_rx(struct channel *ch)
{
	uint64_t pos, len;

	if (!ch->aq_peer_sends || ch->rx_bytes < ch->aq_peer_from)
		return;
	pos = channel_rx_claim(ch); /* aq_peer_sends: offered, so rx_seen counts */
	if (pos <= ch->rx_bytes || pos > ch->app_rx_cons + ch->size || (ch->eof_known && pos > ch->eof_total))
		return;
	len = pos - ch->rx_bytes;
	ch->rx_bytes = pos;
	ch->rx_bytes_total += len;
	ch->rx_chunks++;
	if (ch->link) {
		__atomic_fetch_add(&ch->link->metrics.rx_bytes, len, __ATOMIC_RELAXED);
		__atomic_fetch_add(&ch->link->metrics.rx_chunks, 1, __ATOMIC_RELAXED);
	}
}

/* Tells our application to stop posting (it says IDLE once its QP is flushed); not granted again in
 * this round (a resume that revoked it starts another: channel_aq_renew). */
static void channel_aq_stop_app(struct channel *ch)
{
	ch->aq_done = true;
	/* Granted or not: an application whose QP is offered or connected stops it too, and says IDLE,
	 * which a new round waits for. */
	if (!ch->aq_revoked) {
		ch->aq_revoked = true;
		atomic_store_explicit(&mesh_ring_aq(ch->ctrl)->grant, MESH_AQ_REVOKED, memory_order_release);
		channel_wake_app(ch);
	}
}

/* The link or the rail is going: our application stops posting, and the resume rewinds our
 * sending half to what the peer has once it says nothing of its QP is in flight. */
static void channel_aq_revoke(struct channel *ch)
{
	/* An application that took the offer gets a new QP after the resume; the peer's offers so
	 * far were for QPs its own resume revokes (its next comes after our ChannelResume). */
	if (ch->aq_offered && ch->aq_app != MESH_AQ_NONE && ch->link && (ch->link->features & MESH_FEAT_APPQP_RENEW))
		ch->aq_renew = true;
	ch->aq_pend.valid = false;
	channel_aq_take(ch, true); /* not taken: withdrawn (nothing of it went); taken: counted */
	ch->aq_tell = false;       /* the resume rewinds to what the peer has */
	if (ch->aq_granted)
		channel_aq_account(ch);
	if (ch->aq_offered && !ch->aq_done)
		channel_aq_stop_app(ch);
	if (ch->aq_app == MESH_AQ_IDLE)
		/* It said IDLE before (a hand-back whose PLACED the link took with it, or could not
		 * send): nothing of its QP is in flight, and the resume's rewind stands for the PLACED.
		 * Left granted, the channel would wait for an IDLE that already came. */
		channel_aq_ungrant(ch);
	ch->aq_wait_pos = false;
	if (ch->aq_peer_sends) {
		channel_aq_rx(ch);
		ch->aq_peer_sends = false; /* after the resume its bytes come by our immediates again */
	}
}

/* The peer's ChannelAppQp. */
static void channel_on_app_qp(struct link *l, const ChannelAppQp *a)
{
	struct channel *ch = link_channel(l, a->slot);
	struct mesh_ring_aq *q;

	if (!ch || ch->state != CH_OPEN)
		return; /* closed meanwhile: nothing to relay */
	q = mesh_ring_aq(ch->ctrl);
	switch (a->state) {
	case AQ_MSG_OFFER:
		/* QPN, PSN and keys were checked by the decoder (wire.c), as every field of the peer. An
		 * offer of a round we installed or passed already is stale; the latest waits until our
		 * application's page can take it (ours has no offer: it stays unanswered). */
		if (a->round < ch->aq_peer_next)
			return;
		ch->aq_pend.valid = true;
		ch->aq_pend.ready = false;
		ch->aq_pend.round = a->round;
		ch->aq_pend.qpn = a->qpn;
		ch->aq_pend.psn = a->psn;
		ch->aq_pend.rx_addr = a->rx_addr;
		ch->aq_pend.rx_rkey = a->rx_rkey;
		ch->aq_pend.dir_addr = a->dir_addr;
		ch->aq_pend.dir_rkey = a->dir_rkey;
		ch->aq_pend.caps = a->caps;
		/* Checked by the decoder: 16 bytes or none; the application checks it fits its path. */
		ch->aq_pend.tcp_port = a->tcp_port;
		memset(ch->aq_pend.tcp_token, 0, sizeof(ch->aq_pend.tcp_token));
		if (a->tcp_token.len == sizeof(ch->aq_pend.tcp_token))
			memcpy(ch->aq_pend.tcp_token, a->tcp_token.data, a->tcp_token.len);
		channel_aq_install(ch);
		break;
	case AQ_MSG_READY:
		if (ch->aq_pend.valid && a->round == ch->aq_pend.round) {
			ch->aq_pend.ready = true; /* installed with its offer */
			return;
		}
		if (atomic_load_explicit(&q->peer_state, memory_order_relaxed) != MESH_AQ_PEER_INFO ||
		    a->round != ch->aq_peer_round)
			return;
		ch->aq_peer_ready = true;
		atomic_store_explicit(&q->peer_state, MESH_AQ_PEER_READY, memory_order_release);
		channel_wake_app(ch);
		break;
	case AQ_MSG_SENDING:
		if (ch->resuming || (ch->aq_peer_next && a->round < ch->aq_peer_round) ||
		    (a->round < ch->aq_peer_next && atomic_load_explicit(&q->peer_state, memory_order_relaxed) ==
							      MESH_AQ_PEER_NONE)) {
			/* Of a QP that a resume revokes, or revoked (our page has a newer one, or none
			 * since we renewed): sent before the peer's ChannelResume, so it comes before ours
			 * is done; its bytes come again by our immediates. */
			log_debug("channel %u: node %u's application posts from round %u, ours has %u%s; ignored", ch->id,
				  l->peer->id, a->round, ch->aq_peer_round, ch->resuming ? " (resuming)" : "");
			return;
		}
		if (!ch->aq_peer_ready || a->round != ch->aq_peer_round || ch->aq_peer_sends || a->pos < ch->rx_bytes ||
		    a->pos > ch->app_rx_cons + ch->size) {
			channel_break(ch, -EPROTO, "node %u's application posts from %llu, which does not fit (%llu placed)",
				      l->peer->id, (unsigned long long)a->pos, (unsigned long long)ch->rx_bytes);
			break;
		}
		ch->aq_peer_sends = true;
		ch->aq_peer_from = a->pos;
		break;
	case AQ_MSG_HANDBACK: {
		ChannelAppQp r = CHANNEL_APP_QP__INIT;

		/* Its application's writes all completed before it said so: the pair is final. (Our
		 * application's rx_seen may lag its CQ: we then answer less than arrived, and the
		 * peer writes those bytes again, identical, where they are.) */
		channel_aq_rx(ch);
		ch->aq_peer_sends = false;
		r.state = AQ_MSG_PLACED;
		r.pos = ch->rx_bytes;
		if (channel_aq_send(ch, &r))
			log_debug("channel %u: cannot answer node %u's hand-back now; its resume will", ch->id, l->peer->id);
		break;
	}
	case AQ_MSG_REVOKE:
		/* The peer's application is done with its QP: ours stops writing to it and says IDLE,
		 * and its hand-back follows. One not installed yet is just dropped; one before the
		 * installed is stale. */
		if (ch->aq_pend.valid && a->round == ch->aq_pend.round)
			ch->aq_pend.valid = false;
		if (ch->aq_peer_next && a->round == ch->aq_peer_round)
			channel_aq_stop_app(ch);
		break;
	case AQ_MSG_PLACED:
		if (!ch->aq_wait_pos)
			return; /* a resume came between: it rewound already */
		if (a->pos < ch->peer_placed || a->pos > ch->tx_sent) {
			channel_break(ch, -EPROTO, "node %u placed %llu of our bytes, outside [%llu, %llu]", l->peer->id,
				      (unsigned long long)a->pos, (unsigned long long)ch->peer_placed,
				      (unsigned long long)ch->tx_sent);
			break;
		}
		ch->rewritten_bytes += ch->tx_sent - a->pos;
		ch->tx_sent = ch->tx_done = a->pos;
		ch->peer_placed = a->pos;
		ch->aq_wait_pos = false;
		channel_aq_ungrant(ch);
		log_info("channel %u (node %u port %u): the application gave its writes back at %llu; meshd posts them",
			 ch->id, l->peer->id, ch->peer_port, (unsigned long long)a->pos);
		break;
	default:
		log_warn("node %u sent ChannelAppQp state %u for channel slot %u; ignored", l->peer->id, a->state, a->slot);
		return;
	}
	channel_pump(ch);
}

static void channel_rail_lost(struct channel *ch);
static void channel_move(struct channel *ch, uint32_t k);

/* The opener's ChannelOpen. While the link's send slots are all in flight (a burst of connects, a
 * peer slow to acknowledge) it stays pending and the pump retries it, at the latest on the tick:
 * the client waits for its turn, within its handshake_timeout_ms, instead of being told to try
 * again. -ENOBUFS: pending; another error: the link cannot carry it. */
static int channel_send_open(struct channel *ch)
{
	PeerMsg msg = PEER_MSG__INIT;
	ChannelOpen o = CHANNEL_OPEN__INIT;
	int ret;

	o.slot = ch->slot;
	o.src_port = ch->local_port;
	o.dst_port = ch->peer_port;
	o.ring_size = ch->size;
	o.qps = ch->qps;
	CHANNEL_KEYS_PUT(&o, ch);
	o.rail = ch->rail;
	msg.body_case = PEER_MSG__BODY_CHANNEL_OPEN;
	msg.channel_open = &o;
	ret = channel_send(ch, &msg);
	if (!ret)
		ch->open_pending = false;
	return ret;
}

/* The acceptor's answer; pending (retried by the pump) while the link's send buffers are busy. */
static void channel_send_accept(struct channel *ch)
{
	PeerMsg msg = PEER_MSG__INIT;
	ChannelAccept a = CHANNEL_ACCEPT__INIT;

	a.slot = ch->peer_slot;
	a.peer_slot = ch->slot;
	CHANNEL_KEYS_PUT(&a, ch);
	msg.body_case = PEER_MSG__BODY_CHANNEL_ACCEPT;
	msg.channel_accept = &a;
	if (!channel_send(ch, &msg))
		ch->accept_pending = false;
}

/* ---- resuming ---- */

/* The channel leaves its link for good: its slot is free, nothing of the link is used any more. */
static void channel_detach(struct channel *ch)
{
	struct link *l = ch->link;

	if (l && link_channel(l, ch->slot) == ch)
		l->ch_slots[ch->slot] = NULL;
	ch->link = NULL;
	ch->inflight = 0;
	ch->resuming = false;
}

/* Both halves resumed: data moves again. */
static void channel_resume_check(struct channel *ch)
{
	if (!ch->resuming || !ch->resume_rx_sent || !ch->resume_tx_done)
		return;
	ch->resuming = false;
	ch->resumes++;
	ch->mesh->channel_resumes++;
	ch->link->metrics.channel_resumes++;
	log_info("channel %u (node %u port %u) resumed after %llu ms; %llu bytes written again", ch->id,
		 ch->link->peer->id, ch->peer_port,
		 (unsigned long long)(now_ms() + ch->mesh->cfg->resume_timeout_ms - ch->resume_deadline_ms),
		 (unsigned long long)ch->rewritten_bytes);
}

/* Tells the peer where our receiving half stands. Chunks that arrived out of order are forgotten
 * (their bytes come again: the peer rewrites from our contiguous prefix), and so are the counts of
 * immediates a Close will be checked against: the peer's sending half starts afresh from here, and
 * it posts nothing before this message reached it. -ENOBUFS: the pump retries. */
static void channel_send_resume(struct channel *ch)
{
	PeerMsg msg = PEER_MSG__INIT;
	ChannelResume r = CHANNEL_RESUME__INIT;

	memset(ch->rx_len, 0, ch->rx_window * sizeof(*ch->rx_len));
	ch->imm_chunks_seen = ch->imm_credits_seen = 0;
	ch->credit_sent = channel_rx_credit(ch); /* the peer takes our reader's position from the message */
	r.slot = ch->peer_slot;
	r.peer_slot = ch->slot;
	r.rx_bytes = ch->rx_bytes;
	r.rx_seq = ch->rx_seq;
	r.rx_cons = channel_rx_credit(ch);
	r.eof_known = ch->eof_known;
	CHANNEL_KEYS_PUT(&r, ch);
	r.rail = ch->rail;
	msg.body_case = PEER_MSG__BODY_CHANNEL_RESUME;
	msg.channel_resume = &r;
	if (link_send(ch->link, &msg))
		return;
	ch->resume_rx_sent = true;
	channel_resume_check(ch);
}

/* ---- lifecycle ---- */

/* Every immediate the peer's Close or CloseAck counted has been seen: none can still land on this
 * slot (after a reuse, on another channel). */
static bool channel_peer_drained(const struct channel *ch)
{
	return ch->peer_final && (ch->imm_void || (ch->imm_chunks_seen >= ch->peer_final_chunks &&
						    ch->imm_credits_seen >= ch->peer_final_credits));
}

static bool channel_done(struct channel *ch)
{
	/* The peer no longer writes to us, and our application is gone. */
	if (!ch->app_gone || ch->inflight)
		return false;
	if (!ch->link)
		return true;
	return ((ch->close_sent && ch->ack_rcvd) || (ch->close_rcvd && ch->ack_sent)) && channel_peer_drained(ch);
}

static void channel_note_peer_final(struct channel *ch, uint64_t chunks, uint64_t credits)
{
	ch->peer_final = true;
	ch->peer_final_chunks = chunks;
	ch->peer_final_credits = credits;
}

static void channel_progress_close(struct channel *ch)
{
	bool up = ch->link && ch->link->phase == LINK_UP && !ch->resuming;

	if (!up) {
		/* Without the link nothing can be in flight any more (its QPs are gone); a resuming
		 * channel finishes its close once it has resumed. */
		ch->inflight = 0;
		return;
	}
	if (ch->state == CH_OPENING)
		return;
	/* Answer the peer's Close once none of our writes is in flight. */
	if (ch->close_rcvd && !ch->ack_sent && ch->inflight == 0)
		channel_send_ack(ch);
	if (ch->close_sent || ch->close_rcvd || ch->inflight)
		return;
	/* A broken channel tells the peer at once, whether or not our application is still there. */
	if (ch->error) {
		channel_send_close(ch, ch->error);
		return;
	}
	if (!ch->app_gone)
		return;
	/* The application closed: after a clean shutdown its last bytes and the EOF go first. */
	if (ch->app_shut && (ch->tx_sent < ch->app_tx_prod || !ch->eof_sent))
		return;
	channel_send_close(ch, ch->app_shut ? 0 : -ECONNRESET);
}

static void channel_pump(struct channel *ch)
{
	if (ch->open_pending) {
		/* The peer has not heard of it: a client that gave up (or timed out) takes it along. */
		if (ch->app_gone) {
			ch->state = CH_CLOSING;
			channel_free(ch);
			return;
		}
		if (channel_send_open(ch) == -ENOBUFS)
			return;
	}
	channel_aq_rx(ch);
	if (!ch->app_gone || ch->app_shut)
		channel_read_app(ch);
	channel_aq_take(ch, false);
	channel_aq_app(ch);
	channel_aq_renew(ch);
	/* Bytes published after the peer closed can never go: say so rather than let a sender wait. */
	if (ch->close_rcvd && !ch->error && ch->app_tx_prod > ch->tx_sent)
		channel_break(ch, -EPIPE, "application wrote after node %u closed the channel",
			      ch->link ? ch->link->peer->id : 0);
	if (ch->accept_pending)
		channel_send_accept(ch);
	if (ch->resuming && !ch->resume_rx_sent && ch->link && ch->link->phase == LINK_UP) {
		/* Off a lost rail: the opener picks the next one, the acceptor follows its resume. */
		if (ch->opener && !mesh_link_rail_up(ch->link, ch->rail))
			channel_move(ch, (uint32_t)mesh_link_pick_rail(ch->link, -1));
		if (ch->resuming && mesh_link_rail_up(ch->link, ch->rail) && !ch->accept_pending &&
		    !ch->link->raildown_pending)
			channel_send_resume(ch);
	}
	if (ch->state == CH_OPEN) {
		channel_post_data(ch);
		channel_post_direct(ch);
		channel_post_hint(ch);
		channel_note_stall(ch);
		channel_aq_grant(ch);
		if (ch->app_shut && !ch->eof_sent && ch->tx_sent == ch->app_tx_prod && channel_may_post(ch) &&
		    !ch->aq_granted && !ch->aq_wait_pos) {
			PeerMsg msg = PEER_MSG__INIT;
			ChannelEof e = CHANNEL_EOF__INIT;

			e.slot = ch->peer_slot;
			e.total = ch->tx_sent;
			msg.body_case = PEER_MSG__BODY_CHANNEL_EOF;
			msg.channel_eof = &e;
			if (!channel_send(ch, &msg))
				ch->eof_sent = true;
		}
		if (!ch->app_gone)
			channel_post_credit(ch);
	}
	channel_progress_close(ch);
	if (!ch->app_gone)
		channel_publish(ch);
	if (channel_done(ch))
		channel_free(ch);
}

/* ---- local clients ---- */

int channel_listen(struct mesh *m, uint16_t port, int client_fd, uint32_t uid, const char **why)
{
	struct listener *li;

	/* Otherwise any local user could take a well-known port before its service starts and receive
	 * its channels. */
	if (port < CH_PORT_PRIVILEGED && uid != 0) {
		*why = "ports below 1024 are root's (as in TCP)";
		return -EACCES;
	}
	for (li = m->listeners; li; li = li->next) {
		if (li->port == port) {
			*why = li->uid == uid ? "port already has a listener" : "port already has a listener of another user";
			return -EADDRINUSE;
		}
	}
	li = calloc(1, sizeof(*li));
	if (!li) {
		*why = "out of memory";
		return -ENOMEM;
	}
	li->port = port;
	li->fd = client_fd;
	li->uid = uid;
	li->next = m->listeners;
	m->listeners = li;
	log_debug("listening on port %u for client fd %d (uid %u)", port, client_fd, uid);
	return 0;
}

/* Whether uid may hold one more channel of ring_size on link l: a local user cannot take every
 * slot or pin unbounded memory through meshd. Channels still closing count: their memory is still
 * pinned. Inside one link a user other than root holds at most half of what a peer takes from one
 * node (max_channels_per_link, max_ring_mib_per_link, which the peers share): one user took all
 * 1024 channels of a link in 1.3 s, and root's next was refused by the peer. */
/* Descriptors a channel takes in meshd (its ring's memfd, the lifeline, kick and wake), and those
 * kept from channels: every link's QPs twice over (a re-dial overlaps the old attempt) and the
 * control socket's clients, at most half of the limit. One user's 332 channels under a soft limit
 * of 1024 left none: root's meshctl timed out and node 2 could not rejoin ("Too many open files").
 * Counting /proc/self/fd costs a directory read per channel opened, not per byte. */
#define CH_FDS 4u
#define FD_RESERVE_BASE 32u

static int channel_fds_left(struct mesh *m, const char **why)
{
	uint64_t reserve = FD_RESERVE_BASE + 2ull * m->n_links * m->cfg->qps_per_link * m->n_rails;
	int open;

	if (!m->fd_limit)
		return 0;
	reserve = MIN(reserve, m->fd_limit / 2);
	open = util_fds_open();
	if (open < 0 || (uint64_t)open + CH_FDS + reserve <= m->fd_limit)
		return 0;
	*why = "meshd is near its descriptor limit (RLIMIT_NOFILE): the rest is kept for its links and the control "
	       "socket";
	return -EMFILE;
}

static int channel_quota(struct mesh *m, const struct link *l, uint32_t uid, uint64_t ring_size, const char **why)
{
	uint64_t n = 0, bytes = 2 * ring_size, n_link = 0, bytes_link = 2 * ring_size;

	for (const struct channel *ch = m->channels; ch; ch = ch->next)
		if (ch->owner_uid == uid) {
			n++;
			bytes += 2 * ch->size;
			if (ch->link == l) {
				n_link++;
				bytes_link += 2 * ch->size;
			}
		}
	if (n >= m->cfg->max_channels_per_uid) {
		*why = "the user holds cluster.max_channels_per_uid channels already";
		return -EDQUOT;
	}
	if (bytes > m->cfg->max_ring_bytes_per_uid) {
		*why = "the user's rings would exceed cluster.max_ring_bytes_per_uid";
		return -EDQUOT;
	}
	if (uid && n_link >= MAX(m->cfg->max_channels_per_link / 2, 1u)) {
		*why = "the user holds half of cluster.max_channels_per_link channels with that node already (the rest "
		       "are kept for other users)";
		return -EDQUOT;
	}
	if (uid && bytes_link > ((uint64_t)m->cfg->max_ring_mib_per_link << 20) / 2) {
		*why = "the user's rings with that node would exceed half of cluster.max_ring_mib_per_link (the rest "
		       "are kept for other users)";
		return -EDQUOT;
	}
	return channel_fds_left(m, why);
}

static uint16_t channel_ephemeral_port(struct mesh *m)
{
	uint16_t p = (uint16_t)(CH_EPHEMERAL_FIRST + (m->next_channel_id % (65536u - CH_EPHEMERAL_FIRST)));

	return p;
}

int channel_connect(struct mesh *m, uint32_t node, uint16_t port, uint64_t ring_size, uint32_t qps, int numa_hint,
		    int caller_node, int rail_req, int client_fd, uint32_t uid, const char **why)
{
	struct link *l;
	struct channel *ch;
	uint32_t rail;
	int ret, numa_node;

	if (node == m->self->id) {
		/* Ring to ring in this process: any rail asked for is taken as rail 0 (there is no device). */
		l = local_link(m);
		if (!l) {
			*why = "out of memory";
			return -ENOMEM;
		}
		rail_req = rail_req >= (int)m->n_rails ? rail_req : -1;
	} else {
		l = mesh_link_find(m, node);
	}
	if (!l) {
		*why = "node is not in the cluster configuration";
		return -MESH_EUNKNOWNNODE;
	}
	if (l->phase != LINK_UP) {
		*why = "the link to that node is not UP";
		return -ENETUNREACH;
	}
	if (!(l->features & MESH_FEAT_CHANNELS)) {
		*why = "the peer's meshd does not support channels";
		return -EOPNOTSUPP;
	}
	if (!ring_size)
		ring_size = MESH_RING_DEFAULT;
	if (!qps || qps > m->cfg->qps_per_link)
		qps = m->cfg->qps_per_link;
	if (rail_req >= (int)m->n_rails) {
		*why = "no such rail: the cluster's nodes have fewer addresses (nodes.addr and nodes.rails)";
		return -EINVAL;
	}
	/* The device nearest the hint, else nearest the connecting thread; its node takes the rings. */
	rail = rail_req >= 0 ? (uint32_t)rail_req
	       : link_is_local(l) ? 0
				  : numa_rail_pick(m->numa.rail_node, m->n_rails, numa_hint >= 0 ? numa_hint : caller_node);
	/* A rail that failed (the link is UP on others) is not used until it is back. */
	rail = (uint32_t)mesh_link_pick_rail(l, (int)rail);
	numa_node = mesh_rail_node(m, rail, numa_hint);
	if (numa_node == -EINVAL) {
		*why = "the NUMA hint names no online node of this machine (meshctl node lists them)";
		return -EINVAL;
	}
	ret = channel_quota(m, l, uid, ring_size, why);
	if (ret)
		return ret;
	ch = channel_new(l, ring_size, qps, rail, numa_node, why, &ret);
	if (!ch)
		return ret;
	ch->owner_uid = uid;
	ch->opener = true;
	ch->state = CH_OPENING;
	ch->peer_port = port;
	ch->local_port = channel_ephemeral_port(m);
	ch->ctrl->local_port = ch->local_port;
	ch->ctrl->peer_port = port;
	ch->reply_fd = client_fd;
	ch->open_pending = true;
	ret = channel_send_open(ch);
	if (ret && ret != -ENOBUFS) {
		/* The peer knows nothing of it: free it at once, the client hears why. */
		*why = "cannot reach the peer";
		ch->state = CH_CLOSING;
		ch->app_gone = true;
		ch->reply_fd = -1;
		channel_free(ch);
		return ret;
	}
	log_debug("channel %u: opening to node %u port %u (ring %llu, %u QPs on rail %u, rings on node %d)%s", ch->id,
		  node, port, (unsigned long long)ring_size, qps, rail, numa_node,
		  ret ? "; the link's send slots are all in flight: the Open waits for one" : "");
	return 0;
}

void channel_client_gone(struct mesh *m, int client_fd)
{
	struct listener **pp = &m->listeners;

	while (*pp) {
		struct listener *li = *pp;

		if (li->fd == client_fd) {
			*pp = li->next;
			free(li);
		} else {
			pp = &li->next;
		}
	}
	for (struct channel *ch = m->channels, *next; ch; ch = next) {
		next = ch->next;
		if (ch->reply_fd == client_fd) {
			/* Nobody will take this channel: it closes like one whose application died. */
			ch->reply_fd = -1;
			ch->app_gone = true;
			channel_pump(ch);
		}
	}
}

static int channel_hand_over(struct channel *ch, int fd)
{
	struct mesh *m = ch->mesh;
	int fds[4] = {ch->memfd, ch->app_life_fd, ch->kick_fd, ch->wake_fd};
	int ret;

	channel_aq_offer(ch);
	ret = m->ch_ops.deliver ? m->ch_ops.deliver(m->ch_ops.ctx, fd, 0, NULL, ch, fds) : -ENOTCONN;

	if (ret)
		return ret;
	/* The application has its copies now; meshd keeps the mapping, the kick, wake and lifeline. */
	close(ch->memfd);
	ch->memfd = -1;
	close(ch->app_life_fd);
	ch->app_life_fd = -1;
	return 0;
}

/* ---- the peer ---- */

static void channel_on_resume(struct link *l, const ChannelResume *r);

static void channel_reject(struct link *l, uint32_t slot, int reason)
{
	PeerMsg msg = PEER_MSG__INIT;
	ChannelReject r = CHANNEL_REJECT__INIT;

	r.slot = slot;
	r.reason = reason;
	msg.body_case = PEER_MSG__BODY_CHANNEL_REJECT;
	msg.channel_reject = &r;
	if (link_send(l, &msg) == -ENOBUFS) {
		/* Kept for the tick: an opener left without an answer would keep its ring forever. */
		if (l->n_rejects < LINK_REJECTS_PENDING) {
			l->rej_slot[l->n_rejects] = slot;
			l->rej_reason[l->n_rejects++] = reason;
		} else {
			log_error("node %u: too many channel rejects pending; dropping the one of slot %u", l->peer->id,
				  slot);
		}
	}
}

/* The peer resumed a channel we do not have (any more): its channel fails with reason. */
static void channel_refuse_resume(struct link *l, uint32_t peer_slot, int reason)
{
	ChannelClose c;
	PeerMsg msg = channel_close_msg(&c, peer_slot, reason, 0, 0);

	if (link_send(l, &msg))
		log_warn("node %u: cannot refuse the resume of its slot %u now; it times out", l->peer->id, peer_slot);
}

static void channel_flush_rejects(struct link *l)
{
	uint32_t n = l->n_rejects;

	l->n_rejects = 0;
	for (uint32_t i = 0; i < n && l->phase == LINK_UP; i++)
		channel_reject(l, l->rej_slot[i], l->rej_reason[i]);
}

static void channel_on_open(struct link *l, const ChannelOpen *o)
{
	struct mesh *m = l->mesh;
	struct listener *li;
	struct channel *ch;
	const char *why;
	int ret;

	for (li = m->listeners; li && li->port != o->dst_port; li = li->next)
		;
	if (!li) {
		log_info("node %u opened a channel to port %u: nobody listens", l->peer->id, o->dst_port);
		channel_reject(l, o->slot, -ECONNREFUSED);
		return;
	}
	if (o->qps > m->cfg->qps_per_link || o->rail >= m->n_rails) {
		log_warn("node %u opened a channel with %u QPs on rail %u; this link has %u QPs on each of %u rails",
			 l->peer->id, o->qps, o->rail, m->cfg->qps_per_link, m->n_rails);
		channel_reject(l, o->slot, -EINVAL);
		return;
	}
	{
		/* What the peer has opened to us already: a peer cannot pin unbounded memory here. */
		uint64_t n = 0, bytes = 2 * o->ring_size;

		for (uint32_t i = 0; i < l->ch_cap; i++) {
			const struct channel *c = l->ch_slots[i];

			if (c && !c->opener) {
				n++;
				bytes += 2 * c->size;
			}
		}
		if (n >= m->cfg->max_channels_per_link || bytes > ((uint64_t)m->cfg->max_ring_mib_per_link << 20)) {
			log_warn("node %u opened a channel to port %u beyond its share: %llu channels and %llu MiB of rings "
				 "with it (cluster.max_channels_per_link %u, max_ring_mib_per_link %u); refusing it",
				 l->peer->id, o->dst_port, (unsigned long long)n + 1, (unsigned long long)(bytes >> 20),
				 m->cfg->max_channels_per_link, m->cfg->max_ring_mib_per_link);
			channel_reject(l, o->slot, -EBUSY);
			return;
		}
	}
	ret = channel_quota(m, l, li->uid, o->ring_size, &why);
	if (ret) {
		log_warn("node %u opened a channel to port %u: %s (uid %u); refusing it", l->peer->id, o->dst_port, why,
			 li->uid);
		channel_reject(l, o->slot, ret);
		return;
	}
	if (!mesh_link_rail_up(l, o->rail)) {
		/* It failed here and the peer has not heard yet: its connect fails, a retry takes another. */
		log_info("node %u opened a channel on rail %u, which is DOWN here", l->peer->id, o->rail);
		channel_reject(l, o->slot, -ENETDOWN);
		return;
	}
	ch = channel_new(l, o->ring_size, o->qps, o->rail, mesh_rail_node(m, o->rail, -1), &why, &ret);
	if (!ch) {
		channel_reject(l, o->slot, ret);
		return;
	}
	ch->state = CH_OPEN;
	l->metrics.channels_opened++;
	ch->owner_uid = li->uid;
	ch->peer_slot = o->slot;
	ch->local_port = (uint16_t)o->dst_port;
	ch->peer_port = (uint16_t)o->src_port;
	ch->ctrl->local_port = ch->local_port;
	ch->ctrl->peer_port = ch->peer_port;
	CHANNEL_KEYS_TAKE(ch, o);
	channel_publish(ch);
	if (channel_hand_over(ch, li->fd)) {
		log_warn("channel from node %u to port %u: the listener did not take it", l->peer->id, o->dst_port);
		channel_reject(l, o->slot, -ECONNREFUSED);
		ch->app_gone = true;
		ch->state = CH_OPENING; /* the peer never saw it open: free without a close handshake */
		channel_free(ch);
		return;
	}
	ch->accept_pending = true;
	channel_send_accept(ch);
	log_debug("channel %u: accepted from node %u port %u to port %u", ch->id, l->peer->id, ch->peer_port,
		  ch->local_port);
}

static int channel_on_message(struct link *l, const PeerMsg *msg)
{
	struct channel *ch;

	if (!(l->features & MESH_FEAT_CHANNELS))
		return -MESH_EPEERMSG;
	switch (msg->body_case) {
	case PEER_MSG__BODY_CHANNEL_OPEN:
		channel_on_open(l, msg->channel_open);
		return 0;
	case PEER_MSG__BODY_CHANNEL_ACCEPT: {
		const ChannelAccept *a = msg->channel_accept;

		ch = link_channel(l, a->slot);
		if (!ch || ch->state != CH_OPENING || ch->open_pending) {
			log_warn("node %u accepted channel slot %u, which is not opening", l->peer->id, a->slot);
			return 0;
		}
		ch->peer_slot = a->peer_slot;
		CHANNEL_KEYS_TAKE(ch, a);
		ch->state = CH_OPEN;
		l->metrics.channels_opened++;
		if (!mesh_link_rail_up(l, ch->rail))
			channel_rail_lost(ch); /* its rail failed while it opened: it moves at once */
		channel_publish(ch);
		/* Nobody waits for it any more (timeout, client gone): it closes right away. */
		if (ch->reply_fd < 0 || channel_hand_over(ch, ch->reply_fd))
			ch->app_gone = true;
		ch->reply_fd = -1;
		channel_pump(ch);
		return 0;
	}
	case PEER_MSG__BODY_CHANNEL_REJECT:
		ch = link_channel(l, msg->channel_reject->slot);
		if (ch && ch->state == CH_OPENING && !ch->open_pending) {
			ch->error = msg->channel_reject->reason;
			/* Not the errno's name again: applications print it after that, or instead. */
			if (ch->error == -ECONNREFUSED)
				snprintf(ch->why, sizeof(ch->why), "nobody listens on that port");
			else
				snprintf(ch->why, sizeof(ch->why), "node %u refused: %s", l->peer->id,
					 mesh_strerror(msg->channel_reject->reason));
			ch->app_gone = true;
			channel_free(ch); /* answers the client with the reason */
		}
		return 0;
	case PEER_MSG__BODY_CHANNEL_EOF:
		ch = link_channel(l, msg->channel_eof->slot);
		if (!ch || ch->state == CH_OPENING)
			return 0;
		if (msg->channel_eof->total < ch->rx_bytes || ch->eof_known) {
			channel_break(ch, -EPROTO, "peer sent EOF at %llu after %llu bytes arrived",
				      (unsigned long long)msg->channel_eof->total, (unsigned long long)ch->rx_bytes);
		} else {
			ch->eof_known = true;
			ch->eof_total = msg->channel_eof->total;
		}
		channel_pump(ch);
		return 0;
	case PEER_MSG__BODY_CHANNEL_CLOSE:
		ch = link_channel(l, msg->channel_close->slot);
		if (!ch || ch->state == CH_OPENING) {
			log_warn("node %u closed channel slot %u, which is not open", l->peer->id,
				 msg->channel_close->slot);
			return 0;
		}
		ch->close_rcvd = true;
		ch->state = CH_CLOSING;
		ch->resuming = false; /* the peer ended it (it may refuse our resume so): nothing to wait for */
		channel_note_peer_final(ch, msg->channel_close->chunks, msg->channel_close->credits);
		if (msg->channel_close->reason && !ch->error) {
			ch->error = msg->channel_close->reason;
			snprintf(ch->why, sizeof(ch->why), "node %u closed the channel: %s", l->peer->id,
				 mesh_strerror(ch->error));
		} else if (!ch->eof_known) {
			/* A clean close without an EOF message: everything that arrived is the stream. */
			ch->eof_known = true;
			ch->eof_total = ch->rx_bytes;
		}
		channel_pump(ch);
		return 0;
	case PEER_MSG__BODY_CHANNEL_APP_QP:
		if (!(l->features & MESH_FEAT_APPQP))
			return -MESH_EPEERMSG;
		channel_on_app_qp(l, msg->channel_app_qp);
		return 0;
	case PEER_MSG__BODY_CHANNEL_RESUME:
		if (!(l->features & MESH_FEAT_RESUME))
			return -MESH_EPEERMSG;
		channel_on_resume(l, msg->channel_resume);
		return 0;
	case PEER_MSG__BODY_CHANNEL_CLOSE_ACK:
		ch = link_channel(l, msg->channel_close_ack->slot);
		if (ch && ch->close_sent) {
			ch->ack_rcvd = true;
			channel_note_peer_final(ch, msg->channel_close_ack->chunks, msg->channel_close_ack->credits);
			channel_pump(ch);
		}
		return 0;
	default:
		return -MESH_EPEERMSG;
	}
}

static uint32_t channel_wr_slot(uint32_t kind, uint32_t idx)
{
	return kind == WR_CH_DATA ? idx >> 16 : idx;
}

/* One of the channel's writes completed (it has writes in flight). */
static void channel_completed(struct channel *ch, uint32_t kind, uint32_t idx)
{
	ch->inflight--;
	if (kind == WR_CH_DATA) {
		uint16_t seq = (uint16_t)idx;

		ch->tx_ok[seq % CH_WINDOW] = true;
		while (ch->tx_done_seq != ch->tx_seq && ch->tx_ok[ch->tx_done_seq % CH_WINDOW]) {
			ch->tx_ok[ch->tx_done_seq % CH_WINDOW] = false;
			ch->tx_done += ch->tx_len[ch->tx_done_seq % CH_WINDOW];
			ch->tx_done_seq++;
		}
	} else if (kind == WR_CH_CREDIT) {
		ch->credit_busy = false;
		ch->credit_sent = ch->credit_posting;
	} else if (kind == WR_CH_HINT) {
		ch->hint_busy = false;
	} else {
		ch->direct_busy = false;
	}
}

static int channel_on_completion(struct link *l, uint32_t kind, uint32_t idx, int status)
{
	struct channel *ch = link_channel(l, channel_wr_slot(kind, idx));

	if (status)
		return status; /* a failed write breaks the QP, hence the link */
	if (!ch || !ch->inflight)
		return -EPROTO;
	channel_completed(ch, kind, idx);
	channel_pump(ch);
	return 0;
}

/* What an immediate of the peer says about the channel on its slot: a chunk of data in our ring,
 * or a credit in our credit page. A peer that breaks the stream's rules breaks the channel. */
static void channel_take_imm(struct channel *ch, struct link *l, uint32_t imm, uint32_t len)
{
	if (imm & MESH_IMM_CREDIT)
		ch->imm_credits_seen++;
	else
		ch->imm_chunks_seen++;
	if (ch->peer_final && !ch->imm_void &&
	    (ch->imm_chunks_seen > ch->peer_final_chunks || ch->imm_credits_seen > ch->peer_final_credits)) {
		channel_break(ch, -EPROTO, "peer wrote after its close: %llu chunks and %llu credits, it counted %llu and %llu",
			      (unsigned long long)ch->imm_chunks_seen, (unsigned long long)ch->imm_credits_seen,
			      (unsigned long long)ch->peer_final_chunks, (unsigned long long)ch->peer_final_credits);
		return;
	}
	/* Data may beat the Accept (other QPs complete independently): it is in our ring already, and
	 * counts as soon as it arrives. */
	if (imm & MESH_IMM_CREDIT) {
		/* The slot this write filled: whole now, and no later write is landing on it (wire.h
		 * MESH_CREDIT_SLOTS says why). Credits come in order on one QP, so both words only grow;
		 * the reader cannot have consumed what its meshd had not placed. */
		const uint64_t *w = ch->credit + 2 * (MESH_IMM_SEQ(imm) % MESH_CREDIT_SLOTS);
		uint64_t c = __atomic_load_n(&w[0], __ATOMIC_ACQUIRE);
		uint64_t placed = __atomic_load_n(&w[1], __ATOMIC_ACQUIRE);

		/* Our application posts, publishing as it goes, and tells us nothing: what it published is
		 * what the peer may have placed and credited. */
		if (ch->aq_granted && !ch->app_gone && !channel_read_app(ch))
			channel_aq_account(ch);

		if (!mesh_ring_in_window(c, ch->peer_cons, ch->tx_sent))
			channel_break(ch, -EPROTO, "peer credited %llu bytes, outside [%llu, %llu]", (unsigned long long)c,
				      (unsigned long long)ch->peer_cons, (unsigned long long)ch->tx_sent);
		else if (!mesh_ring_in_window(placed, MAX(ch->peer_placed, c), ch->tx_sent))
			channel_break(ch, -EPROTO, "peer placed %llu bytes, outside [%llu, %llu] (its reader at %llu)",
				      (unsigned long long)placed, (unsigned long long)MAX(ch->peer_placed, c),
				      (unsigned long long)ch->tx_sent, (unsigned long long)c);
		else {
			ch->peer_cons = c;
			ch->peer_placed = placed;
		}
	} else {
		uint16_t seq = MESH_IMM_SEQ(imm);
		uint32_t w = ch->rx_window;

		if ((uint16_t)(seq - ch->rx_seq) >= w || ch->rx_len[seq % w] || !len || len > ch->size) {
			channel_break(ch, -EPROTO, "peer sent chunk %u of %u bytes, expected %u..%u", seq, len, ch->rx_seq,
				      (uint16_t)(ch->rx_seq + w - 1));
		} else {
			uint64_t end = ch->rx_bytes;
			uint16_t s = ch->rx_seq;

			ch->rx_len[seq % w] = len;
			ch->rx_chunks++;
			__atomic_fetch_add(&l->metrics.rx_chunks, 1, __ATOMIC_RELAXED);
			while (ch->rx_len[s % w])
				end += ch->rx_len[s++ % w];
			/* Never more than a ring ahead of the reader (the peer ignored our credits), never past
			 * the EOF: such bytes are not published, the channel breaks. */
			if (end > ch->app_rx_cons + ch->size)
				channel_break(ch, -EPROTO, "peer wrote %llu bytes past the reader's credit",
					      (unsigned long long)(end - ch->app_rx_cons - ch->size));
			else if (ch->eof_known && end > ch->eof_total)
				channel_break(ch, -EPROTO, "peer sent data after its EOF");
			else {
				uint64_t before = ch->rx_bytes;

				while (ch->rx_seq != s) {
					ch->rx_len[ch->rx_seq % w] = 0;
					ch->rx_seq++;
				}
				ch->rx_bytes_total += end - ch->rx_bytes;
				__atomic_fetch_add(&l->metrics.rx_bytes, end - ch->rx_bytes, __ATOMIC_RELAXED);
				ch->rx_bytes = end;
				channel_pairs_judge(ch, before);
			}
		}
	}
}

static int channel_on_imm(struct link *l, uint32_t imm, uint32_t len)
{
	struct channel *ch = link_channel(l, MESH_IMM_SLOT(imm));

	if (!ch) {
		log_warn("node %u wrote to channel slot %u, which is not open", l->peer->id, MESH_IMM_SLOT(imm));
		return 0;
	}
	channel_take_imm(ch, l, imm, len);
	channel_pump(ch);
	return 0;
}

/* ---- the fast path (mesh.h, struct mesh_locks) ---- */

/* A channel of this rail that only moves data: open, not resuming, nothing of a close under way,
 * nothing of its open or accept pending, its application there and not shut, its link and rail
 * UP. Its pump then touches nothing but the channel, its rail's QPs and the link's counters (added
 * atomically), so the rail's thread may run it under its rail's lock alone. */
/* Nothing of application-posted writes for the usual pump to do: none offered or no more, or
 * granted and still the application's. */
static bool channel_aq_settled(const struct channel *ch)
{
	if (!ch->aq_offered)
		return true;
	if (ch->aq_done && !ch->aq_granted && !ch->aq_wait_pos && !ch->aq_renew)
		/* Unless its application moved: its IDLE is relayed by the usual pump. */
		return atomic_load_explicit(&mesh_ring_aq(ch->ctrl)->app_state, memory_order_relaxed) == ch->aq_app;
	return ch->aq_granted && !ch->aq_untaken && !ch->aq_tell && !ch->aq_revoked &&
	       atomic_load_explicit(&mesh_ring_aq(ch->ctrl)->app_state, memory_order_relaxed) != MESH_AQ_IDLE;
}

static bool channel_fast_ok(const struct channel *ch, uint32_t rail)
{
	return ch->rail == rail && !ch->local && ch->state == CH_OPEN && !ch->error && !ch->resuming &&
	       !ch->refused_ms && !ch->open_pending && !ch->accept_pending && !ch->app_gone && !ch->app_shut &&
	       !ch->close_rcvd && !ch->close_sent && !ch->peer_final && ch->link && ch->link->phase == LINK_UP &&
	       mesh_link_rail_up(ch->link, rail) && channel_aq_settled(ch);
}

/* The usual pump, under every lock, by the next channel_pump_wanted. */
static void channel_want_slow(struct channel *ch, uint32_t rail)
{
	ch->slow_wanted = true;
	ch->mesh->rail_slow[rail] = true;
}

/* channel_pump's data part; whatever else the channel needs (it stopped being one that only moves
 * data: the application shut its side, a write was refused, the stream broke) is left to the
 * usual pump. */
static void channel_pump_fast(struct channel *ch, uint32_t rail)
{
	if (channel_fast_ok(ch, rail))
		channel_aq_rx(ch); /* the peer's application's bytes: what we credit follows them */
	if (channel_fast_ok(ch, rail) && !channel_read_app(ch) && channel_fast_ok(ch, rail)) {
		channel_post_data(ch);
		channel_post_direct(ch);
		channel_post_hint(ch);
		channel_note_stall(ch);
		channel_post_credit(ch);
	}
	if (!channel_fast_ok(ch, rail))
		channel_want_slow(ch, rail);
	channel_publish(ch);
}

static bool channel_fast_completion(struct link *l, uint32_t rail, uint32_t kind, uint32_t idx)
{
	struct channel *ch = link_channel(l, channel_wr_slot(kind, idx));

	if (!ch || !ch->inflight || !channel_fast_ok(ch, rail))
		return false;
	channel_completed(ch, kind, idx);
	channel_pump_fast(ch, rail);
	return true;
}

static bool channel_fast_imm_ok(struct link *l, uint32_t rail, uint32_t imm)
{
	struct channel *ch = link_channel(l, MESH_IMM_SLOT(imm));

	return ch && channel_fast_ok(ch, rail);
}

static void channel_fast_imm(struct link *l, uint32_t rail, uint32_t imm, uint32_t len)
{
	struct channel *ch = link_channel(l, MESH_IMM_SLOT(imm));

	channel_take_imm(ch, l, imm, len);
	channel_pump_fast(ch, rail);
}

/* An open channel with nothing of a close under way waits for its link (both sides keep it). */
static bool channel_resumable(const struct channel *ch)
{
	const struct link *l = ch->link;

	return l->mesh->cfg->resume_timeout_ms && (l->features & MESH_FEAT_RESUME) && ch->state == CH_OPEN &&
	       !ch->error && !ch->accept_pending && !ch->close_sent && !ch->close_rcvd;
}

static void channel_link_down(struct link *l, int err, bool may_resume)
{
	/* A peer removed from the configuration (ours or its own) is said as such; any other DOWN that
	 * breaks channels is a reset. */
	int cerr = err == -MESH_EREMOVED ? err : -ECONNRESET;
	const char *how = err == -MESH_EREMOVED ? "was removed from the configuration" : "went DOWN";

	for (uint32_t i = 0; i < l->ch_cap; i++) {
		struct channel *ch = l->ch_slots[i];

		if (!ch)
			continue;
		if (may_resume && (ch->resuming || channel_resumable(ch))) {
			/* Writes and credits in flight died with the QPs: the resume rewinds past them. */
			if (!ch->resuming) {
				ch->resuming = true;
				ch->resume_deadline_ms = now_ms() + l->mesh->cfg->resume_timeout_ms;
				log_info("channel %u (node %u port %u): link DOWN, waiting up to %u ms to resume", ch->id,
					 l->peer->id, ch->peer_port, l->mesh->cfg->resume_timeout_ms);
			}
			ch->resume_rx_sent = ch->resume_tx_done = false;
			channel_aq_revoke(ch);
			ch->inflight = 0;
			ch->credit_busy = ch->direct_busy = ch->hint_busy = false;
			ch->pairs_told = -1; /* the last hint may have died with them: say it again */
			ch->stalled = false;
			ch->refused_ms = 0;
			continue;
		}
		/* The QPs are gone: the registrations go with them, the slot is free. */
		l->ch_slots[i] = NULL;
		if (ch->state == CH_OPENING) {
			/* Nobody answers any more: the waiting client hears it now (channel_free). */
			ch->error = cerr;
			snprintf(ch->why, sizeof(ch->why), "link to node %u %s", l->peer->id, how);
			ch->link = NULL;
			ch->app_gone = true;
			channel_free(ch);
			continue;
		}
		channel_break(ch, cerr, "link to node %u %s", l->peer->id, how);
		ch->link = NULL;
		ch->inflight = 0;
		channel_pump(ch);
	}
}

/* The channel's rail is gone while the link stays UP: an open channel waits and moves (the resume
 * rewinds past what its rail's QPs lost); one whose close is under way finishes it without the rail
 * (nothing of the peer can land on its slot any more: the counts of a Close no longer matter). */
static void channel_rail_lost(struct channel *ch)
{
	struct link *l = ch->link;
	bool open = ch->state == CH_OPEN && !ch->error && !ch->close_sent && !ch->close_rcvd;

	ch->inflight = 0;
	ch->credit_busy = ch->direct_busy = ch->hint_busy = false;
	ch->pairs_told = -1; /* the last hint may have died with the rail: say it again */
	ch->stalled = false;
	ch->refused_ms = 0;
	if (open && l->mesh->cfg->resume_timeout_ms && (l->features & MESH_FEAT_RESUME)) {
		if (!ch->resuming) {
			ch->resuming = true;
			ch->resume_deadline_ms = now_ms() + l->mesh->cfg->resume_timeout_ms;
			log_info("channel %u (node %u port %u): rail %u lost, moving to another rail", ch->id, l->peer->id,
				 ch->peer_port, ch->rail);
		}
		ch->resume_rx_sent = ch->resume_tx_done = false;
		channel_aq_revoke(ch);
		return;
	}
	ch->imm_void = true;
	if (open)
		channel_break(ch, -ECONNRESET, "rail %u to node %u failed (resuming is off)", ch->rail, l->peer->id);
	else if (ch->close_rcvd && !ch->app_gone && !ch->error && (!ch->eof_known || ch->rx_bytes < ch->eof_total))
		/* The peer's last writes may have died with the rail: say so rather than cut the stream. */
		channel_break(ch, -ECONNRESET, "rail %u to node %u failed while the channel closed; bytes after %llu lost",
			      ch->rail, l->peer->id, (unsigned long long)ch->rx_bytes);
}

static void channel_rail_down(struct link *l, uint32_t r)
{
	for (uint32_t i = 0; i < l->ch_cap; i++) {
		struct channel *ch = l->ch_slots[i];

		if (!ch || ch->rail != r || ch->state == CH_OPENING)
			continue; /* an opening channel moves when its Accept comes */
		channel_rail_lost(ch);
	}
	for (uint32_t i = 0; i < l->ch_cap; i++)
		if (l->ch_slots[i] && l->ch_slots[i]->rail == r)
			channel_pump(l->ch_slots[i]); /* may free it */
}

/* Registers the rings and credit words again on rail k's device (the same memory: a second
 * registration) and moves the channel there; the old registrations go after the batch. */
/* The channel's memory registered again through c (another rail's device, or the link's new
 * attempt's scope), the old registrations buried; on failure (no c: -ENETDOWN) nothing changes. */
static int channel_mrs_renew(struct channel *ch, xport_conn_t *c)
{
	struct channel_mrs mr = {0};
	int ret = c ? channel_mr_reg(ch, c, &mr) : -ENETDOWN;

	if (ret) {
		channel_mrs_bury(ch->mesh, mr);
		return ret;
	}
	channel_mrs_bury(ch->mesh, channel_mrs(ch));
	channel_mrs_set(ch, &mr);
	return 0;
}

static void channel_move(struct channel *ch, uint32_t k)
{
	struct link *l = ch->link;
	struct mesh *m = ch->mesh;
	uint32_t from = ch->rail;
	int ret;

	if (k == ch->rail)
		return;
	ret = channel_mrs_renew(ch, l->conns[k * m->cfg->qps_per_link]);
	if (ret) {
		channel_break(ch, ret, "cannot move from rail %u to rail %u: registration failed", ch->rail, k);
		return;
	}
	log_info("channel %u (node %u port %u): moved from rail %u to rail %u", ch->id, l->peer->id, ch->peer_port,
		 ch->rail, k);
	channel_rail_unlink(ch);
	ch->rail = k;
	channel_rail_link(ch);
	ch->qp0 = k * m->cfg->qps_per_link;
	ch->next_qp = 0;
	ch->rail_moves++;
	if (m->ch_ops.moved && !ch->app_gone)
		m->ch_ops.moved(m->ch_ops.ctx, ch, from);
	atomic_store_explicit(&ch->ctrl->daemon_flags, m->polling[k] ? MESH_DAEMON_POLLING : 0, memory_order_relaxed);
}

/* A resuming channel's rings and credit words, registered again in the link's new attempt (its
 * protection scope: mesh.h, link.scope), whose QPs could not reach the old registrations; our
 * ChannelResume carries the new keys. Until the attempt was UP, with the peer's proof, nothing of
 * the channel was reachable from it. The old registrations go after the batch. */
static void channel_reregister(struct channel *ch)
{
	int ret;

	if (ch->local)
		return;
	ret = channel_mrs_renew(ch, ch->link->conns[ch->qp0]);
	if (ret) {
		channel_detach(ch);
		channel_break(ch, ret, "cannot register its rings with the link's new attempt");
	}
}

static void channel_link_up(struct link *l)
{
	for (uint32_t i = 0; i < l->ch_cap; i++) {
		struct channel *ch = l->ch_slots[i];

		if (!ch || !ch->resuming)
			continue;
		if (l->xp != ch->xp) {
			/* Its rings are registered with the other provider: nothing of them is reachable. */
			channel_detach(ch);
			channel_break(ch, -ECONNRESET, "the link to node %u came back over %s", l->peer->id,
				      link_transport(l));
		} else if (l->peer_boot_epoch != ch->peer_boot) {
			/* Another meshd process: whatever it had of this channel is gone. */
			channel_detach(ch);
			channel_break(ch, -MESH_EPEERRESTART, "node %u's meshd restarted while the link was DOWN",
				      l->peer->id);
		} else if (!(l->features & MESH_FEAT_RESUME)) {
			channel_detach(ch);
			channel_break(ch, -ECONNRESET, "node %u no longer resumes channels", l->peer->id);
		} else {
			channel_reregister(ch);
		}
		channel_pump(ch); /* sends our ChannelResume */
	}
}

/* The peer's ChannelResume: where its receiving half stands; our sending half goes back there. */
static void channel_on_resume(struct link *l, const ChannelResume *r)
{
	struct channel *ch = link_channel(l, r->slot);

	if (!ch || ch->peer_slot != r->peer_slot || ch->state == CH_OPENING) {
		/* Nothing of ours to resume: a channel we already closed or timed out, or a forgery. The
		 * peer's channel fails with a Close; ours, if the slot holds another, is left alone. */
		log_warn("node %u resumed channel slot %u (its slot %u), which is not its channel here; refusing it",
			 l->peer->id, r->slot, r->peer_slot);
		channel_refuse_resume(l, r->peer_slot, ch ? -EPROTO : -ECONNRESET);
		return;
	}
	if (r->rail != ch->rail && (l->features & MESH_FEAT_RAILS)) {
		if (ch->opener || !ch->resuming) {
			/* The acceptor resumed before it heard where we moved: its next resume will say. */
			log_debug("channel %u: node %u resumed it on rail %u, it is on rail %u here", ch->id, l->peer->id,
				  r->rail, ch->rail);
			if (!ch->resuming)
				channel_break(ch, -EPROTO, "node %u moved the channel to rail %u while it was not waiting",
					      l->peer->id, r->rail);
			channel_pump(ch);
			return;
		}
		if (!mesh_link_rail_up(l, r->rail)) {
			/* Down here: the opener hears our RailDown and moves it again. */
			log_info("channel %u: node %u moves it to rail %u, which is DOWN here; waiting", ch->id, l->peer->id,
				 r->rail);
			return;
		}
		channel_move(ch, r->rail);
		if (!ch->resuming) {
			channel_pump(ch);
			return;
		}
		ch->resume_rx_sent = false; /* ours goes again, with the keys of the new rail */
	}
	if (!ch->resuming || ch->resume_tx_done) {
		channel_break(ch, -EPROTO, "node %u sent ChannelResume for a channel that was not waiting", l->peer->id);
		channel_pump(ch);
		return;
	}
	/* Its reader may be ahead of the message: a credit it wrote after it (on another rail's QP)
	 * can arrive first, so the larger of the two positions stands. */
	if (r->rx_bytes < ch->peer_placed || r->rx_bytes > ch->tx_sent) {
		channel_break(ch, -EPROTO,
			      "node %u resumes at %llu (reader at %llu), outside what was sent [%llu, %llu]", l->peer->id,
			      (unsigned long long)r->rx_bytes, (unsigned long long)r->rx_cons,
			      (unsigned long long)ch->peer_placed, (unsigned long long)ch->tx_sent);
		channel_pump(ch);
		return;
	}
	ch->rewritten_bytes += ch->tx_sent - r->rx_bytes;
	ch->tx_sent = ch->tx_done = r->rx_bytes;
	ch->tx_seq = ch->tx_done_seq = (uint16_t)r->rx_seq;
	memset(ch->tx_ok, 0, sizeof(ch->tx_ok));
	ch->peer_cons = MAX(ch->peer_cons, r->rx_cons);
	ch->peer_placed = r->rx_bytes;
	CHANNEL_KEYS_TAKE(ch, r);
	ch->posted_chunks = ch->credit_writes = 0;
	ch->next_qp = 0; /* the peer's receive window starts afresh: so does the striping */
	if (ch->eof_sent && !r->eof_known)
		ch->eof_sent = false; /* lost with the link: sent again once the bytes before it are */
	ch->resume_tx_done = true;
	channel_resume_check(ch);
	channel_pump(ch);
}

bool channel_on_kick_fast(struct mesh *m, uint32_t id, uint32_t rail)
{
	struct channel *ch = channel_find(m, id);
	uint64_t v;

	if (!ch || ch->rail != rail)
		return false;
	if (read(ch->kick_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_debug("channel %u: kick read: %m", id);
	if (channel_fast_ok(ch, rail))
		channel_pump_fast(ch, rail);
	else
		channel_want_slow(ch, rail);
	return true;
}

void channel_on_lifeline(struct mesh *m, uint32_t id)
{
	struct channel *ch = channel_find(m, id);
	char buf[64];
	ssize_t n;

	if (!ch)
		return;
	n = recv(ch->life_fd, buf, sizeof(buf), MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return;
	if (n > 0)
		return; /* nothing is defined on the lifeline yet: ignore, it is not a close */
	/* The application closed or died: a clean close if it shut its write side first. */
	channel_read_app(ch);
	ch->app_gone = true;
	if (m->ch_ops.watch)
		m->ch_ops.watch(m->ch_ops.ctx, ch, false);
	log_debug("channel %u: application %s", ch->id, ch->app_shut ? "closed" : "gone without shutdown");
	channel_pump(ch);
}

/* How long a channel whose QP refused a write waits for the rail's or link's DOWN: the keepalive
 * timeout finds a dead connection that sent no event, twice that is a QP that stays refusing. */
static uint32_t channel_refused_wait_ms(const struct mesh *m)
{
	return MAX(2 * m->cfg->keepalive_timeout_ms, 1000u);
}

static void channel_tick(struct mesh *m, uint64_t t)
{
	for (size_t i = 0; i < m->n_links; i++)
		if (m->links[i]->n_rejects)
			channel_flush_rejects(m->links[i]);
	for (struct channel *ch = m->channels, *next; ch; ch = next) {
		next = ch->next;
		if (ch->state == CH_OPENING && ch->reply_fd >= 0 && t - ch->open_ms > m->cfg->handshake_timeout_ms) {
			/* The client hears now; the channel waits for the peer's answer (its Accept would
			 * be followed by writes into our registered ring), then closes. */
			if (m->ch_ops.deliver)
				m->ch_ops.deliver(m->ch_ops.ctx, ch->reply_fd, -ETIMEDOUT, "the peer did not answer in time",
						  NULL, NULL);
			ch->reply_fd = -1;
			ch->app_gone = true;
		}
		if (ch->refused_ms && t - ch->refused_ms >= channel_refused_wait_ms(m)) {
			channel_break(ch, -ECONNRESET, "QP %u refused a write (%s), yet no DOWN in %u ms", ch->refused_qp,
				      mesh_strerror(ch->refused_err), channel_refused_wait_ms(m));
			ch->refused_ms = 0;
		}
		if (ch->resuming && t >= ch->resume_deadline_ms) {
			struct link *l = ch->link;
			bool up = l->phase == LINK_UP;

			/* With the link UP (the peer never answered our resume) the close tells the peer. */
			if (!up)
				channel_detach(ch);
			channel_break(ch, -MESH_ERESUMETIMEO, "link to node %u not back within %u ms (cluster.resume_timeout_ms)",
				      l->peer->id, m->cfg->resume_timeout_ms);
		}
		channel_pump(ch);
	}
}

/* Has the application published anything since the last pump that meshd must act on now? A few
 * loads, no system call. About what it kicks for when meshd sleeps (ring.h): bytes for meshd to
 * post, reads that may be worth a credit (a quarter ring: the pump decides with mesh_ring_credit_step),
 * a shutdown, its QP's state. Bytes its own QP posted (the half granted to it) and smaller reads
 * are taken at the next pump that runs anyway: counted as moves, they kept a polling meshd polling
 * (cluster.polling = adaptive) for as long as two applications exchanged over their own QPs, every
 * read and write of theirs a "move". */
static bool channel_app_moved(const struct channel *ch)
{
	const struct mesh_ring_ctrl *k = ch->ctrl;
	uint64_t rx_cons = atomic_load_explicit(&k->rx_cons, memory_order_relaxed);

	/* A grant offered and not taken: the application took it, or published past it (channel_aq_take). */
	if (ch->aq_tell ||
	    (ch->aq_untaken &&
	     (atomic_load_explicit(&mesh_ring_aq(ch->ctrl)->grant, memory_order_relaxed) != MESH_AQ_APP ||
	      atomic_load_explicit(&k->tx_prod, memory_order_relaxed) != ch->aq_from)))
		return true;
	/* A value that went back passes the step (unsigned): the pump then breaks the channel. */
	return (!ch->aq_granted && atomic_load_explicit(&k->tx_prod, memory_order_relaxed) != ch->app_tx_prod) ||
	       (rx_cons != ch->app_rx_cons && rx_cons - ch->credit_sent >= MESH_RING_CREDIT_MIN(ch->size)) ||
	       ((atomic_load_explicit(&k->app_flags, memory_order_relaxed) & MESH_APP_SHUT_WR) && !ch->app_shut) ||
	       (ch->aq_offered &&
		atomic_load_explicit(&mesh_ring_aq(ch->ctrl)->app_state, memory_order_relaxed) != ch->aq_app);
}

int channel_poll_fast(struct mesh *m, uint32_t rail)
{
	int n = 0;

	for (struct channel *ch = m->rail_channels[rail]; ch; ch = ch->rail_next) {
		if (ch->app_gone || ch->state == CH_OPENING || !channel_app_moved(ch))
			continue;
		if (channel_fast_ok(ch, rail))
			channel_pump_fast(ch, rail); /* never frees it */
		else
			channel_want_slow(ch, rail);
		n++;
	}
	return n;
}

void channel_pump_wanted(struct mesh *m, uint32_t rail)
{
	m->rail_slow[rail] = false;
	for (struct channel *ch = m->channels, *next; ch; ch = next) {
		next = ch->next; /* the pump may free ch */
		if (ch->slow_wanted) {
			ch->slow_wanted = false;
			channel_pump(ch);
		}
	}
}

int channel_poll(struct mesh *m, uint32_t rail)
{
	int n = 0;

	for (struct channel *ch = m->rail_channels[rail], *next; ch; ch = next) {
		next = ch->rail_next; /* the pump may free ch */
		if (ch->app_gone || ch->state == CH_OPENING || !channel_app_moved(ch))
			continue;
		channel_pump(ch);
		n++;
	}
	return n;
}

void channel_set_polling(struct mesh *m, uint32_t rail, bool on)
{
	m->polling[rail] = on;
	for (struct channel *ch = m->rail_channels[rail]; ch; ch = ch->rail_next)
		atomic_store_explicit(&ch->ctrl->daemon_flags, on ? MESH_DAEMON_POLLING : 0, memory_order_relaxed);
	/* Orders the clearing before the caller's last look at the rings (proto/ring.h, Dekker). */
	atomic_thread_fence(memory_order_seq_cst);
}

bool channel_local_run(struct mesh *m)
{
	struct channel_local *lo = m->local;
	struct link *l;

	if (!lo)
		return false;
	l = &lo->link;
	/* What the handlers queue meanwhile (a sender's next chunks) waits for the next call: a busy
	 * local stream cannot keep this thread from its other events. Counted, not bounded by index:
	 * a push may move the queue to the front of its array. */
	for (size_t k = lo->n - lo->head; k; k--) {
		struct local_ev ev = lo->q[lo->head++]; /* a copy: handlers may grow the queue */

		switch (ev.kind) {
		case LOCAL_MSG: {
			PeerMsg *msg = peer_msg__unpack(NULL, ev.len, ev.msg);

			free(ev.msg);
			if (!msg) {
				log_error("local channel message of %u bytes does not decode: dropped", ev.len);
				break;
			}
			if (channel_on_message(l, msg))
				log_error("local channel message %d not handled: dropped", (int)msg->body_case);
			peer_msg__free_unpacked(msg, NULL);
			break;
		}
		case LOCAL_IMM:
			channel_on_imm(l, ev.imm, ev.len);
			break;
		case LOCAL_DONE:
			if (ev.qp < LINK_CONNS_MAX && l->sq_used[ev.qp])
				l->sq_used[ev.qp]--;
			if (channel_on_completion(l, (uint32_t)(ev.wr_id >> 32), (uint32_t)ev.wr_id, 0))
				log_error("local channel completion 0x%llx for no channel", (unsigned long long)ev.wr_id);
			break;
		}
	}
	if (lo->head == lo->n)
		lo->head = lo->n = 0;
	return lo->head < lo->n;
}

static void channel_local_free(struct mesh *m)
{
	struct channel_local *lo = m->local;

	if (!lo)
		return;
	for (size_t i = lo->head; i < lo->n; i++)
		if (lo->q[i].kind == LOCAL_MSG)
			free(lo->q[i].msg);
	free(lo->q);
	free(lo->link.ch_slots);
	free(lo);
	m->local = NULL;
}

static void channel_cleanup(struct mesh *m)
{
	while (m->channels) {
		struct channel *ch = m->channels;

		ch->error = ch->error ? ch->error : -ECONNRESET;
		channel_free(ch);
	}
	channel_local_free(m);
	while (m->listeners) {
		struct listener *li = m->listeners;

		m->listeners = li->next;
		free(li);
	}
}

const struct mesh_upper channel_upper = {
	.message = channel_on_message,
	.imm = channel_on_imm,
	.completion = channel_on_completion,
	.link_down = channel_link_down,
	.link_up = channel_link_up,
	.rail_down = channel_rail_down,
	.tick = channel_tick,
	.cleanup = channel_cleanup,
	.fast_completion = channel_fast_completion,
	.fast_imm_ok = channel_fast_imm_ok,
	.fast_imm = channel_fast_imm,
};
