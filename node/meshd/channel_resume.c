/*
 * Links and rails going DOWN and coming UP again, for channels (channel_internal.h): a channel
 * waits for its link and resumes where it stood (ChannelResume: nothing lost, nothing duplicated),
 * moves to another rail when its own is lost, and registers its rings again in each new attempt's
 * protection scope.
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

/* ---- resuming ---- */

/* The channel leaves its link for good: its slot is free, nothing of the link is used any more. */
void channel_detach(struct channel *ch)
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
void channel_send_resume(struct channel *ch)
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

/* An open channel with nothing of a close under way waits for its link (both sides keep it). */
bool channel_resumable(const struct channel *ch)
{
	const struct link *l = ch->link;

	return l->mesh->cfg->resume_timeout_ms && (l->features & MESH_FEAT_RESUME) && ch->state == CH_OPEN &&
	       !ch->error && !ch->accept_pending && !ch->close_sent && !ch->close_rcvd;
}

void channel_link_down(struct link *l, int err, bool may_resume)
{
	/* A peer removed from the configuration (ours or its own) is said as such; any other DOWN that
	 * breaks channels is a reset. */
	int cerr = err == -MESH_EREMOVED ? err : -ECONNRESET;
	const char *how = err == -MESH_EREMOVED ? "was removed from the configuration" : "went DOWN";

	for (uint32_t i = 0; i < l->ch_cap; i++) {
		struct channel *ch = l->ch_slots[i];

		if (!ch)
			continue;
		if (ch->kept && l->mesh->store.handover) {
			/* Left to the next meshd as it stands: nothing is said to the application. */
			l->ch_slots[i] = NULL;
			ch->link = NULL;
			continue;
		}
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
void channel_rail_lost(struct channel *ch)
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

void channel_rail_down(struct link *l, uint32_t r)
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

void channel_move(struct channel *ch, uint32_t k)
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
	if (m->chans->ch_ops.moved && !ch->app_gone)
		m->chans->ch_ops.moved(m->chans->ch_ops.ctx, ch, from);
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

void channel_link_up(struct link *l)
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
		} else if (l->peer_boot_epoch != ch->peer_boot && l->peer_pred_epoch && l->peer_pred_epoch == ch->peer_boot &&
			   (l->features & MESH_FEAT_RESUME)) {
			/* The peer's meshd restarted with its channels kept: the new one resumes this one
			 * (or refuses our ChannelResume, if it could not restore it). */
			log_info("channel %u (node %u port %u): node %u's meshd restarted with its channels kept; resuming",
				 ch->id, l->peer->id, ch->peer_port, l->peer->id);
			channel_store_rename(ch, l->peer_boot_epoch);
			channel_reregister(ch);
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
	/* And connects that waited for this link go on now (CtlRequest.link_wait_ms). */
	if (l->mesh->chans->link_waits)
		channel_waits_run(l->mesh, now_ms());
}

/* The peer's ChannelResume: where its receiving half stands; our sending half goes back there. */
void channel_on_resume(struct link *l, const ChannelResume *r)
{
	struct channel *ch = link_channel(l, r->slot);

	if (!ch || ch->peer_slot != r->peer_slot || ch->state == CH_OPENING) {
		/* Nothing of ours to resume: a channel we already closed or timed out, or a forgery. The
		 * peer's channel fails with a Close; ours, if the slot holds another, is left alone. */
		log_warn("node %u resumed channel slot %u (its slot %u), which is not its channel here; refusing it",
			 l->peer->id, r->slot, r->peer_slot);
		/* After a restart whose handover did not bring the channel along, the peer hears that its
		 * meshd restarted: the channel is gone here. */
		channel_refuse_resume(l, r->peer_slot, ch ? -EPROTO : l->mesh->predecessor_epoch ? -MESH_EPEERRESTART : -ECONNRESET);
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
