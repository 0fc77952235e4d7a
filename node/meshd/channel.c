/*
 * Channels (channel.h): creation and destruction, the application's side of the ring, the data
 * path that posts a channel's writes and credits, the lifecycle from open to close (the pump), the
 * tick and polling, and the table of calls the link layer makes (mesh_upper). The rest of the
 * channel layer, one file per concern, shares channel_internal.h: channel_client.c (local clients:
 * listen, connect, quotas, lifelines and kicks), channel_peer.c (the peer's messages, completions
 * and immediates, and the fast path of a rail's thread), channel_resume.c (links and rails going
 * DOWN and UP: resuming, moving between rails), channel_aq.c (writes the application posts
 * itself) and channel_local.c (channels to this node).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "channel.h"
#include "channel_internal.h"
#include "log.h"
#include "mesh.h"
#include "util.h"

uint32_t channel_rx_window(uint32_t qps)
{
	uint32_t need = CH_WINDOW + qps * (LINK_DATA_RECVS + 1), w = CH_WINDOW;

	while (w < need)
		w *= 2;
	return w;
}

struct channel *channel_find(struct mesh *m, uint32_t id)
{
	for (struct channel *ch = m->chans->ch_by_id[id % MESH_CH_BUCKETS]; ch; ch = ch->id_next)
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

struct channel *link_channel(struct link *l, uint32_t slot)
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

/* Slot `slot` of l for ch, as a restored channel's record names it (the peer knows it by it): its
 * table grown to hold it; -EEXIST when another channel holds it. */
static int link_slot_take(struct link *l, struct channel *ch, uint32_t slot)
{
	if (slot >= MESH_CHANNEL_SLOTS)
		return -ERANGE;
	if (slot >= l->ch_cap) {
		uint32_t nc = l->ch_cap ? l->ch_cap : 16;
		struct channel **s;

		while (nc <= slot)
			nc = MIN(nc * 2, MESH_CHANNEL_SLOTS);
		s = realloc(l->ch_slots, nc * sizeof(*s));
		if (!s)
			return -ENOMEM;
		memset(s + l->ch_cap, 0, (nc - l->ch_cap) * sizeof(*s));
		l->ch_slots = s;
		l->ch_cap = nc;
	}
	if (l->ch_slots[slot])
		return -EEXIST;
	l->ch_slots[slot] = ch;
	ch->slot = slot;
	return 0;
}

/* A control message to the peer's meshd, or to ourselves for a local channel. */
int link_send(struct link *l, const PeerMsg *msg)
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

int channel_mr_reg(struct channel *ch, xport_conn_t *c, struct channel_mrs *mr)
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
void channel_mrs_bury(struct mesh *m, struct channel_mrs mr)
{
	mesh_bury_mr(m, mr.tx);
	mesh_bury_mr(m, mr.rx);
	mesh_bury_mr(m, mr.cin);
	mesh_bury_mr(m, mr.cout);
	mesh_bury_mr(m, mr.dir);
	mesh_bury_mr(m, mr.hin);
}

struct channel_mrs channel_mrs(const struct channel *ch)
{
	return (struct channel_mrs){ch->mr_tx, ch->mr_rx, ch->mr_cin, ch->mr_cout, ch->mr_dir, ch->mr_hin};
}

void channel_mrs_set(struct channel *ch, const struct channel_mrs *mr)
{
	ch->mr_tx = mr->tx;
	ch->mr_rx = mr->rx;
	ch->mr_cin = mr->cin;
	ch->mr_cout = mr->cout;
	ch->mr_dir = mr->dir;
	ch->mr_hin = mr->hin;
}

/* ---- creation and destruction ---- */

/* Its rail's list (struct mesh_chans, rail_channels): a rail's thread walks its own channels only. */
void channel_rail_link(struct channel *ch)
{
	struct mesh *m = ch->mesh;

	ch->rail_next = m->chans->rail_channels[ch->rail];
	m->chans->rail_channels[ch->rail] = ch;
}

void channel_rail_unlink(struct channel *ch)
{
	for (struct channel **pp = &ch->mesh->chans->rail_channels[ch->rail]; *pp; pp = &(*pp)->rail_next) {
		if (*pp == ch) {
			*pp = ch->rail_next;
			break;
		}
	}
	ch->rail_next = NULL;
}

void channel_free(struct channel *ch)
{
	struct mesh *m = ch->mesh;
	struct channel **pp;

	for (pp = &m->chans->channels; *pp; pp = &(*pp)->next) {
		if (*pp == ch) {
			*pp = ch->next;
			break;
		}
	}
	for (pp = &m->chans->ch_by_id[ch->id % MESH_CH_BUCKETS]; *pp; pp = &(*pp)->id_next) {
		if (*pp == ch) {
			*pp = ch->id_next;
			break;
		}
	}
	channel_rail_unlink(ch);
	channel_store_drop(ch);
	m->chans->n_channels--;
	if (ch->link && ch->link->ch_slots && link_channel(ch->link, ch->slot) == ch)
		ch->link->ch_slots[ch->slot] = NULL;
	if (m->chans->ch_ops.watch)
		m->chans->ch_ops.watch(m->chans->ch_ops.ctx, ch, false);
	channel_mrs_bury(m, channel_mrs(ch));
	if (ch->reply_fd >= 0 && m->chans->ch_ops.deliver)
		m->chans->ch_ops.deliver(m->chans->ch_ops.ctx, ch->reply_fd, ch->error ? ch->error : -ECONNRESET,
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

/* ch->memfd mapped (control page, TX and RX rings) and the credit page made (its own page: the
 * credit words are registered, a peer writes one, and placed like the rings; NULL when out of
 * memory, which the caller checks). 0, or -1 with errno and *why. */
static int channel_map_memfd(struct channel *ch, size_t len, const char **why)
{
	ch->map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, ch->memfd, 0);
	if (ch->map == MAP_FAILED) {
		ch->map = NULL;
		*why = "mmap of the ring failed";
		return -1;
	}
	ch->map_len = len;
	ch->ctrl = ch->map;
	ch->tx = (uint8_t *)ch->map + MESH_RING_CTRL_SIZE;
	ch->rx = ch->tx + ch->size;
	ch->credit = mmap(NULL, CH_CREDIT_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ch->credit == MAP_FAILED)
		ch->credit = NULL;
	return 0;
}

/* The channel's memory: the ring memfd (control page, TX and RX rings; sealed at its size: neither
 * side can shrink it under the other's mapping, SIGBUS), mapped here, and the credit page; both on
 * NUMA node `node` when one is wanted, placed before the first touch. 0, or -errno with *why. */
static int channel_map_rings(struct channel *ch, size_t len, int node, const char **why)
{
	ch->memfd = memfd_create("mesh-channel", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (ch->memfd < 0 || ftruncate(ch->memfd, (off_t)len) ||
	    fcntl(ch->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		*why = "memfd_create/ftruncate/seal failed";
		return -errno;
	}
	if (channel_map_memfd(ch, len, why))
		return -errno;
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
	return 0;
}

/* The ring's control page as the application finds it (proto/ring.h). */
static void channel_ring_init(struct channel *ch)
{
	struct mesh *m = ch->mesh;

	ch->ctrl->magic = MESH_RING_MAGIC;
	ch->ctrl->version = MESH_RING_VERSION;
	ch->ctrl->ring_size = ch->size;
	ch->ctrl->tx_off = MESH_RING_CTRL_SIZE;
	ch->ctrl->rx_off = MESH_RING_CTRL_SIZE + ch->size;
	ch->ctrl->channel_id = ch->id;
	ch->ctrl->peer_node = ch->peer_node;
	ch->ctrl->spin_us = m->cfg->app_spin_us;
	atomic_store_explicit(&ch->ctrl->daemon_flags, m->polling[ch->rail] ? MESH_DAEMON_POLLING : 0,
			      memory_order_relaxed);
}

/* What a channel made anew and one restored (channel_restore) start with: meshd's record of it on
 * link l, numbered id, in the mesh's lists, with its receive window (NULL: out of memory, nothing
 * to free). */
static struct channel *channel_alloc(struct link *l, uint64_t size, uint32_t qps, uint32_t rail, uint32_t id)
{
	struct mesh *m = l->mesh;
	struct channel *ch = calloc(1, sizeof(*ch));

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
	ch->peer_node = l->peer->id;
	ch->local = link_is_local(l);
	ch->id = id;
	ch->next = m->chans->channels;
	m->chans->channels = ch;
	ch->id_next = m->chans->ch_by_id[ch->id % MESH_CH_BUCKETS];
	m->chans->ch_by_id[ch->id % MESH_CH_BUCKETS] = ch;
	channel_rail_link(ch);
	m->chans->n_channels++;
	ch->rx_len = calloc(ch->rx_window, sizeof(*ch->rx_len));
	if (!ch->rx_len) {
		ch->link = NULL;
		channel_free(ch);
		return NULL;
	}
	return ch;
}

struct channel *channel_new(struct link *l, uint64_t size, uint32_t qps, uint32_t rail, int node, const char **why,
			    int *errp)
{
	struct mesh *m = l->mesh;
	struct channel *ch = channel_alloc(l, size, qps, rail, m->chans->next_channel_id + 1);
	int sv[2];

	*why = "out of memory";
	*errp = -ENOMEM;
	if (!ch)
		return NULL;
	m->chans->next_channel_id++;
	if (link_slot_alloc(l, ch)) {
		*why = "no free channel slot on this link";
		*errp = -EMFILE;
		ch->link = NULL;
		goto err;
	}
	*errp = channel_map_rings(ch, MESH_RING_CTRL_SIZE + 2 * size, node, why);
	if (*errp)
		goto err;
	*errp = -ENOMEM;
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
	channel_ring_init(ch);
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
	if (m->chans->ch_ops.watch)
		m->chans->ch_ops.watch(m->chans->ch_ops.ctx, ch, true);
	return ch;
err:
	log_warn("channel to node %u: %s: %m", l->peer->id, *why);
	channel_free(ch);
	return NULL;
}

/* The application's ring as the last meshd left it (its memfd from the descriptor store): mapped
 * here and checked against the record, which the application cannot write; the page it can. 0, or
 * -errno with *why. */
static int channel_map_kept(struct channel *ch, int memfd, const char **why)
{
	size_t len = MESH_RING_CTRL_SIZE + 2 * ch->size;
	struct stat st;

	ch->memfd = memfd;
	if (fstat(memfd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != len) {
		*why = "its ring descriptor is not a ring of the recorded size";
		return -EINVAL;
	}
	/* Sealed at its size, as channel_map_rings made it: nobody can shrink it under our mapping. */
	if ((fcntl(memfd, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
		*why = "its ring descriptor is not sealed at its size";
		return -EINVAL;
	}
	if (channel_map_memfd(ch, len, why))
		return -errno;
	ch->numa_want = -1;
	if (!ch->credit) {
		*why = "out of memory";
		return -ENOMEM;
	}
	/* Only meshd's own words are rewritten: the geometry the application's page must agree with. */
	channel_ring_init(ch);
	return 0;
}

/* Where the last meshd's halves stood, read off the page: the application published tx_prod and
 * rx_cons, the last meshd tx_cons and rx_prod. The resume then rewinds each half to what the other
 * side has; only a position that contradicts the ring is refused (-EPROTO): its writer can only be
 * the application, and only its own channel fails. */
static int channel_kept_positions(struct channel *ch, const char **why)
{
	struct mesh_ring_ctrl *c = ch->ctrl;
	uint64_t tx_prod = atomic_load_explicit(&c->tx_prod, memory_order_acquire);
	uint64_t tx_cons = atomic_load_explicit(&c->tx_cons, memory_order_acquire);
	uint64_t rx_prod = atomic_load_explicit(&c->rx_prod, memory_order_acquire);
	uint64_t rx_cons = atomic_load_explicit(&c->rx_cons, memory_order_acquire);
	uint32_t st = atomic_load_explicit(&c->state, memory_order_acquire);

	if (tx_prod < tx_cons || tx_prod - tx_cons > ch->size || rx_cons > rx_prod + ch->size ||
	    (rx_cons < rx_prod && rx_prod - rx_cons > ch->size)) {
		*why = "its ring's positions contradict each other";
		return -EPROTO;
	}
	if (st & MESH_STATE_ERROR) {
		*why = "it had failed before the restart";
		return -ECONNRESET;
	}
	/* Sent: everything published (the peer's resume says what it has); placed by the peer: at
	 * least what the application was allowed to reuse. */
	ch->app_tx_prod = ch->tx_sent = ch->tx_done = tx_prod;
	ch->peer_cons = ch->peer_placed = tx_cons;
	/* Received: what was published, or what the reader took past it by a direct pair (the bytes
	 * between are written again by the peer, the same bytes in the same place). */
	ch->rx_bytes = MAX(rx_prod, rx_cons);
	ch->app_rx_cons = ch->credit_sent = rx_cons;
	if (st & MESH_STATE_PEER_EOF) {
		ch->eof_known = true;
		ch->eof_total = rx_prod;
		ch->rx_bytes = rx_prod;
	}
	ch->published_state = st;
	ch->published_tx = tx_cons;
	ch->published_rx = rx_prod;
	return 0;
}

/* Application-posted writes of a kept channel: whatever its application's own QP was doing, it is
 * revoked as at a link's DOWN (it says IDLE, and gets a new round once the channel resumed). */
static void channel_kept_aq(struct channel *ch)
{
	struct mesh_ring_aq *q = mesh_ring_aq(ch->ctrl);
	uint32_t st = atomic_load_explicit(&q->app_state, memory_order_acquire);
	uint32_t grant = atomic_load_explicit(&q->grant, memory_order_acquire);

	if (!q->path_valid || st > MESH_AQ_IDLE)
		return; /* never offered, or a page we cannot read: meshd posts (an IDLE never comes) */
	ch->aq_offered = true;
	ch->aq_app = (uint8_t)st;
	ch->aq_round = atomic_load_explicit(&q->round, memory_order_acquire);
	ch->aq_take = q->caps & MESH_AQ_CAP_TAKE;
	ch->aq_granted = grant == MESH_AQ_APP || grant == MESH_AQ_TAKEN;
	ch->aq_untaken = grant == MESH_AQ_APP;
	channel_aq_revoke(ch); /* the link is not UP: its features say nothing of a new round yet */
	/* As after any resume, a new round once it is IDLE (channel_aq_renew asks the link then); one
	 * that had not offered its QP yet asks by its IDLE (channel_aq_app). */
	ch->aq_renew = st != MESH_AQ_NONE;
}

struct channel *channel_restore(struct link *l, const struct channel_record *r, int fds[4], const char **why,
				int *errp)
{
	struct mesh *m = l->mesh;
	struct channel *ch = channel_alloc(l, r->size, r->qps, 0, r->id);

	*why = "out of memory";
	*errp = -ENOMEM;
	if (!ch)
		return NULL;
	m->chans->next_channel_id = MAX(m->chans->next_channel_id, r->id);
	ch->peer_slot = r->peer_slot;
	ch->local_port = r->local_port;
	ch->peer_port = r->peer_port;
	ch->owner_uid = r->uid;
	ch->opener = r->opener;
	ch->peer_boot = r->peer_boot;
	ch->xp = r->xp;
	ch->kick_fd = fds[CH_KEPT_KICK];
	ch->wake_fd = fds[CH_KEPT_WAKE];
	ch->life_fd = fds[CH_KEPT_LIFE];
	*errp = link_slot_take(l, ch, r->slot);
	if (*errp) {
		*why = "its slot on the link is taken";
		ch->link = NULL;
		ch->memfd = fds[CH_KEPT_RING];
		goto err;
	}
	*errp = channel_map_kept(ch, fds[CH_KEPT_RING], why);
	if (!*errp)
		*errp = channel_kept_positions(ch, why);
	if (*errp)
		goto err;
	ch->state = CH_OPEN;
	ch->resuming = true;
	ch->resume_deadline_ms = now_ms() + m->cfg->resume_timeout_ms;
	ch->pairs_told = -1;
	channel_kept_aq(ch);
	if (m->chans->ch_ops.watch)
		m->chans->ch_ops.watch(m->chans->ch_ops.ctx, ch, true);
	return ch;
err:
	channel_free(ch); /* closes the descriptors it was given */
	return NULL;
}

/* ---- the application side ---- */

void channel_wake_app(struct channel *ch)
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

void channel_publish(struct channel *ch)
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
int channel_send(struct channel *ch, PeerMsg *msg)
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
PeerMsg channel_close_msg(ChannelClose *c, uint32_t peer_slot, int reason, uint64_t chunks, uint64_t credits)
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

/* The channel is broken: no more data moves; the application sees err after the bytes it has. */

void channel_break(struct channel *ch, int err, const char *fmt, ...)
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
uint64_t channel_rx_claim(struct channel *ch)
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
uint64_t channel_rx_credit(const struct channel *ch)
{
	return MIN(ch->app_rx_cons, ch->rx_bytes);
}

/* Reads and checks what the application published. */
int channel_read_app(struct channel *ch)
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

bool channel_may_post(const struct channel *ch)
{
	return ch->state == CH_OPEN && !ch->error && !ch->close_rcvd && !ch->close_sent && !ch->resuming &&
	       !ch->refused_ms && ch->link && mesh_link_rail_up(ch->link, ch->rail);
}

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

void channel_post_data(struct channel *ch)
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
void channel_post_direct(struct channel *ch)
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
void channel_pairs_judge(struct channel *ch, uint64_t placed_before)
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
void channel_post_hint(struct channel *ch)
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
void channel_note_stall(struct channel *ch)
{
	bool stalled = ch->app_tx_prod - ch->peer_cons >= ch->size;

	if (stalled && !ch->stalled) {
		ch->credit_stalls++;
		if (ch->link)
			__atomic_fetch_add(&ch->link->metrics.credit_stalls, 1, __ATOMIC_RELAXED);
	}
	ch->stalled = stalled;
}

void channel_post_credit(struct channel *ch)
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

/* The opener's ChannelOpen. While the link's send slots are all in flight (a burst of connects, a
 * peer slow to acknowledge) it stays pending and the pump retries it, at the latest on the tick:
 * the client waits for its turn, within its handshake_timeout_ms, instead of being told to try
 * again. -ENOBUFS: pending; another error: the link cannot carry it. */
int channel_send_open(struct channel *ch)
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
void channel_send_accept(struct channel *ch)
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

void channel_note_peer_final(struct channel *ch, uint64_t chunks, uint64_t credits)
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

void channel_pump(struct channel *ch)
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

/* How long a channel whose QP refused a write waits for the rail's or link's DOWN: the keepalive
 * timeout finds a dead connection that sent no event, twice that is a QP that stays refusing. */
static uint32_t channel_refused_wait_ms(const struct mesh *m)
{
	return MAX(2 * m->cfg->keepalive_timeout_ms, 1000u);
}

static void channel_tick(struct mesh *m, uint64_t t)
{
	const struct channel_ops *ops = &m->chans->ch_ops;

	for (size_t i = 0; i < m->n_links; i++)
		if (m->links[i]->n_rejects)
			channel_flush_rejects(m->links[i]);
	for (struct channel *ch = m->chans->channels, *next; ch; ch = next) {
		next = ch->next;
		if (ch->state == CH_OPENING && ch->reply_fd >= 0 && t - ch->open_ms > m->cfg->handshake_timeout_ms) {
			/* The client hears now; the channel waits for the peer's answer (its Accept would
			 * be followed by writes into our registered ring), then closes. */
			if (ops->deliver)
				ops->deliver(ops->ctx, ch->reply_fd, -ETIMEDOUT, "the peer did not answer in time", NULL,
					     NULL);
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
		/* A drain's deadline: what is left fails with the drain's own error at both ends (the
		 * Close says it), before meshd stops (main.c). */
		if (m->chans->draining && t >= m->chans->drain_deadline_ms)
			channel_break(ch, -MESH_EDRAINING, "this node's drain deadline passed");
		channel_pump(ch);
	}
	channel_waits_run(m, t);
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

	for (struct channel *ch = m->chans->rail_channels[rail]; ch; ch = ch->rail_next) {
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
	for (struct channel *ch = m->chans->channels, *next; ch; ch = next) {
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

	for (struct channel *ch = m->chans->rail_channels[rail], *next; ch; ch = next) {
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
	for (struct channel *ch = m->chans->rail_channels[rail]; ch; ch = ch->rail_next)
		atomic_store_explicit(&ch->ctrl->daemon_flags, on ? MESH_DAEMON_POLLING : 0, memory_order_relaxed);
	/* Orders the clearing before the caller's last look at the rings (proto/ring.h, Dekker). */
	atomic_thread_fence(memory_order_seq_cst);
}

static void channel_cleanup(struct mesh *m)
{
	if (!m->chans)
		return;
	while (m->chans->channels) {
		struct channel *ch = m->chans->channels;

		ch->error = ch->error ? ch->error : -ECONNRESET;
		channel_free(ch);
	}
	channel_local_free(m);
	channel_waits_free(m);
	while (m->chans->listeners) {
		struct listener *li = m->chans->listeners;

		m->chans->listeners = li->next;
		free(li);
	}
	free(m->chans);
	m->chans = NULL;
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

int channel_layer_init(struct mesh *m)
{
	m->chans = calloc(1, sizeof(*m->chans));
	if (!m->chans)
		return -ENOMEM;
	m->upper = &channel_upper;
	return 0;
}
