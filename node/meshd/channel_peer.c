/*
 * What the peer sends for channels (channel_internal.h): ChannelOpen and its refusals, the other
 * channel messages, completions of our writes and immediates of the peer's, and the fast path a
 * rail's thread runs under its rail's lock alone (mesh.h, struct mesh_locks).
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
#include <unistd.h>

#include <mesh/mesh.h>

#include "channel.h"
#include "channel_internal.h"
#include "log.h"
#include "mesh.h"
#include "util.h"

/* ---- the peer ---- */

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
void channel_refuse_resume(struct link *l, uint32_t peer_slot, int reason)
{
	ChannelClose c;
	PeerMsg msg = channel_close_msg(&c, peer_slot, reason, 0, 0);

	if (link_send(l, &msg))
		log_warn("node %u: cannot refuse the resume of its slot %u now; it times out", l->peer->id, peer_slot);
}

void channel_flush_rejects(struct link *l)
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

	if (m->chans->draining) {
		log_info("node %u opened a channel to port %u: refused, this node is draining", l->peer->id, o->dst_port);
		channel_reject(l, o->slot, -MESH_EDRAINING);
		return;
	}
	for (li = m->chans->listeners; li && li->port != o->dst_port; li = li->next)
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

/* The peer accepted our open: the channel is OPEN and goes to its application (or, nobody
 * waiting any more, closes at once). */
static void channel_on_accept(struct link *l, const ChannelAccept *a)
{
	struct channel *ch = link_channel(l, a->slot);

	if (!ch || ch->state != CH_OPENING || ch->open_pending) {
		log_warn("node %u accepted channel slot %u, which is not opening", l->peer->id, a->slot);
		return;
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
}

static void channel_on_reject(struct link *l, const ChannelReject *r)
{
	struct channel *ch = link_channel(l, r->slot);

	if (!ch || ch->state != CH_OPENING || ch->open_pending)
		return;
	ch->error = r->reason;
	/* Not the errno's name again: applications print it after that, or instead. */
	if (ch->error == -ECONNREFUSED)
		snprintf(ch->why, sizeof(ch->why), "nobody listens on that port");
	else
		snprintf(ch->why, sizeof(ch->why), "node %u refused: %s", l->peer->id, mesh_strerror(r->reason));
	ch->app_gone = true;
	channel_free(ch); /* answers the client with the reason */
}

static void channel_on_eof(struct link *l, const ChannelEof *e)
{
	struct channel *ch = link_channel(l, e->slot);

	if (!ch || ch->state == CH_OPENING)
		return;
	if (e->total < ch->rx_bytes || ch->eof_known) {
		channel_break(ch, -EPROTO, "peer sent EOF at %llu after %llu bytes arrived", (unsigned long long)e->total,
			      (unsigned long long)ch->rx_bytes);
	} else {
		ch->eof_known = true;
		ch->eof_total = e->total;
	}
	channel_pump(ch);
}

static void channel_on_close(struct link *l, const ChannelClose *c)
{
	struct channel *ch = link_channel(l, c->slot);

	if (!ch || ch->state == CH_OPENING) {
		log_warn("node %u closed channel slot %u, which is not open", l->peer->id, c->slot);
		return;
	}
	ch->close_rcvd = true;
	ch->state = CH_CLOSING;
	ch->resuming = false; /* the peer ended it (it may refuse our resume so): nothing to wait for */
	channel_note_peer_final(ch, c->chunks, c->credits);
	if (c->reason && !ch->error) {
		ch->error = c->reason;
		snprintf(ch->why, sizeof(ch->why), "node %u closed the channel: %s", l->peer->id, mesh_strerror(ch->error));
	} else if (!ch->eof_known) {
		/* A clean close without an EOF message: everything that arrived is the stream. */
		ch->eof_known = true;
		ch->eof_total = ch->rx_bytes;
	}
	channel_pump(ch);
}

static void channel_on_close_ack(struct link *l, const ChannelCloseAck *a)
{
	struct channel *ch = link_channel(l, a->slot);

	if (ch && ch->close_sent) {
		ch->ack_rcvd = true;
		channel_note_peer_final(ch, a->chunks, a->credits);
		channel_pump(ch);
	}
}

int channel_on_message(struct link *l, const PeerMsg *msg)
{
	if (!(l->features & MESH_FEAT_CHANNELS))
		return -MESH_EPEERMSG;
	switch (msg->body_case) {
	case PEER_MSG__BODY_CHANNEL_OPEN:
		channel_on_open(l, msg->channel_open);
		return 0;
	case PEER_MSG__BODY_CHANNEL_ACCEPT:
		channel_on_accept(l, msg->channel_accept);
		return 0;
	case PEER_MSG__BODY_CHANNEL_REJECT:
		channel_on_reject(l, msg->channel_reject);
		return 0;
	case PEER_MSG__BODY_CHANNEL_EOF:
		channel_on_eof(l, msg->channel_eof);
		return 0;
	case PEER_MSG__BODY_CHANNEL_CLOSE:
		channel_on_close(l, msg->channel_close);
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
		channel_on_close_ack(l, msg->channel_close_ack);
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

int channel_on_completion(struct link *l, uint32_t kind, uint32_t idx, int status)
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

int channel_on_imm(struct link *l, uint32_t imm, uint32_t len)
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

bool channel_fast_ok(const struct channel *ch, uint32_t rail)
{
	return ch->rail == rail && !ch->local && ch->state == CH_OPEN && !ch->error && !ch->resuming &&
	       !ch->refused_ms && !ch->open_pending && !ch->accept_pending && !ch->app_gone && !ch->app_shut &&
	       !ch->close_rcvd && !ch->close_sent && !ch->peer_final && ch->link && ch->link->phase == LINK_UP &&
	       mesh_link_rail_up(ch->link, rail) && channel_aq_settled(ch);
}

/* The usual pump, under every lock, by the next channel_pump_wanted. */
void channel_want_slow(struct channel *ch, uint32_t rail)
{
	ch->slow_wanted = true;
	ch->mesh->rail_slow[rail] = true;
}

/* channel_pump's data part; whatever else the channel needs (it stopped being one that only moves
 * data: the application shut its side, a write was refused, the stream broke) is left to the
 * usual pump. */
void channel_pump_fast(struct channel *ch, uint32_t rail)
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

bool channel_fast_completion(struct link *l, uint32_t rail, uint32_t kind, uint32_t idx)
{
	struct channel *ch = link_channel(l, channel_wr_slot(kind, idx));

	if (!ch || !ch->inflight || !channel_fast_ok(ch, rail))
		return false;
	channel_completed(ch, kind, idx);
	channel_pump_fast(ch, rail);
	return true;
}

bool channel_fast_imm_ok(struct link *l, uint32_t rail, uint32_t imm)
{
	struct channel *ch = link_channel(l, MESH_IMM_SLOT(imm));

	return ch && channel_fast_ok(ch, rail);
}

void channel_fast_imm(struct link *l, uint32_t rail, uint32_t imm, uint32_t len)
{
	struct channel *ch = link_channel(l, MESH_IMM_SLOT(imm));

	channel_take_imm(ch, l, imm, len);
	channel_pump_fast(ch, rail);
}
