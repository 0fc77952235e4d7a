/*
 * Application-posted writes (ring.h, the AQ area; cluster.app_send): meshd offers an application
 * the writes of its channel, the application posts them itself on a QP (or tcp connection) of its
 * own connected to the peer application's, and meshd takes them back when a rail, the link or the
 * application goes. The protocol's rounds are in docs/design.md, "Application-posted writes".
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

/* ---- application-posted writes (ring.h, the AQ area) ---- */

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
void channel_aq_offer(struct channel *ch)
{
	if (channel_aq_possible(ch) && channel_aq_path(ch))
		ch->aq_offered = true;
}

static int channel_aq_send(struct channel *ch, ChannelAppQp *a)
{
	PeerMsg msg = PEER_MSG__INIT;

	/* After our Close or CloseAck the peer may free the slot and give it to its next channel at
	 * once: a word of ours for this one would land there (a SENDING after the ack once broke the
	 * next channel as "posts from 0, which does not fit"). The channel is ending; nothing of its
	 * writes needs the peer's meshd any more. Dropped as if sent. */
	if (ch->close_sent || ch->ack_sent) {
		log_debug("channel %u: ChannelAppQp state %u not sent: the channel's close is under way", ch->id,
			  a->state);
		return 0;
	}

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
void channel_aq_renew(struct channel *ch)
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

/* Relays our application's offer of its QP (or tcp port and token), checked: 0 once sent, else
 * the channel is broken or the next pump retries. */
static int channel_aq_relay_offer(struct channel *ch)
{
	struct mesh_ring_aq *q = mesh_ring_aq(ch->ctrl);
	ChannelAppQp a = CHANNEL_APP_QP__INIT;
	uint8_t token[MESH_AQ_TOKEN_LEN];

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
			return -EPROTO;
		}
	} else if (a.qpn > 0xffffff || a.psn > 0xffffff || !a.rx_rkey || !a.dir_rkey) {
		channel_break(ch, -EPROTO, "application offered QP %u PSN %u with keys %u/%u", a.qpn, a.psn, a.rx_rkey,
			      a.dir_rkey);
		return -EPROTO;
	}
	return channel_aq_send(ch, &a);
}

/* Our application said IDLE: it is done with its QP. A grant it never took goes back to us
 * (nothing of it went); one it took, the peer hears of before the hand-back. */
static void channel_aq_on_idle(struct channel *ch)
{
	struct mesh_ring_aq *q = mesh_ring_aq(ch->ctrl);
	ChannelAppQp a = CHANNEL_APP_QP__INIT;
	bool own_accord;

	channel_aq_take(ch, false);
	ch->aq_tell = false; /* could not go: the peer answers the hand-back from what it placed */
	if (ch->aq_app == MESH_AQ_NONE && ch->aq_revoked && (ch->link->features & MESH_FEAT_APPQP_RENEW))
		/* Its answer to a revocation that came before its offer (two resumes close together,
		 * or the link lost while it made its first QP): channel_aq_revoke could not know it
		 * would answer, and asks for a new round only now. */
		ch->aq_renew = true;
	log_debug("channel %u: the application is done with its own QP (%s, peer's writes %s)", ch->id,
		  !ch->aq_granted ? "not granted" : ch->resuming ? "resuming" : "granted",
		  ch->aq_peer_sends ? "its own" : "ours");
	/* Done of its own accord (a shutdown, its QP failed, a forked child that holds none of its
	 * parent's QP), not answering a revocation: the peer's application, which has our offer, may
	 * be granted and write to that QP at any time, even if it does not yet; nobody might read
	 * what it writes there (a forked child does not read its parent's connection). Revoked, it
	 * hands back and its meshd posts to us. After a resume or the peer's own REVOKE its round is
	 * being ended already (and may be renewed: a late REVOKE of ours would end the next one). */
	own_accord = ch->aq_app != MESH_AQ_NONE && !ch->aq_revoked && !ch->resuming;
	ch->aq_app = MESH_AQ_IDLE;
	ch->aq_done = true;
	if (ch->aq_peer_sends || own_accord) {
		/* Its QP is done: the peer's application must stop writing to it and hand back too. */
		a.state = AQ_MSG_REVOKE;
		if (channel_aq_send(ch, &a))
			log_debug("channel %u: cannot revoke the peer's writes now; its link's resume will", ch->id);
	}
	if (!ch->aq_granted || ch->aq_wait_pos)
		return;
	channel_aq_account(ch); /* its last publication, read by this pump */
	if (ch->resuming) {
		/* The resume rewinds our sending half to what the peer has. */
		channel_aq_ungrant(ch);
		return;
	}
	/* It gave the half back: the peer says where its reader's bytes end, and we post from there. */
	channel_app_qp__init(&a);
	a.state = AQ_MSG_HANDBACK;
	ch->aq_revoked = true;
	ch->aq_wait_pos = true;
	atomic_store_explicit(&q->grant, MESH_AQ_REVOKED, memory_order_release);
	if (channel_aq_send(ch, &a))
		ch->aq_wait_pos = false; /* the link is going: its resume rewinds instead */
}

/* Relays what our application did with its QP. Its words are hostile: a state that goes back or
 * a QP number beyond 24 bits breaks its own channel, as any other breach of the ring contract. */
void channel_aq_app(struct channel *ch)
{
	struct mesh_ring_aq *q = mesh_ring_aq(ch->ctrl);
	ChannelAppQp a = CHANNEL_APP_QP__INIT;
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
	/* An offer made after the round was revoked (the link went while the application made its
	 * QP) is not relayed: the QP stops at once, and the peer's application would connect to it. */
	if (ch->aq_app == MESH_AQ_NONE && st != MESH_AQ_IDLE && !ch->aq_done) {
		if (channel_aq_relay_offer(ch))
			return; /* broken, or the next pump retries */
		ch->aq_app = MESH_AQ_OFFER;
	}
	if (ch->aq_app == MESH_AQ_OFFER && st >= MESH_AQ_READY) {
		a.state = AQ_MSG_READY;
		if (st == MESH_AQ_READY && channel_aq_send(ch, &a))
			return;
		ch->aq_app = MESH_AQ_READY;
	}
	if (st == MESH_AQ_IDLE)
		channel_aq_on_idle(ch);
}

/* Not granted (any more): nothing of a grant offered and not taken is left either. */
void channel_aq_ungrant(struct channel *ch)
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
void channel_aq_take(struct channel *ch, bool force)
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
void channel_aq_grant(struct channel *ch)
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
void channel_aq_account(struct channel *ch)
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
void channel_aq_rx(struct channel *ch)
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
	/* A grant offered and not taken is withdrawn first (or found taken and counted): the REVOKED
	 * stored below would otherwise be read as the application's word over the grant, and the
	 * channel broken for what meshd wrote (the peer's REVOKE did so). */
	channel_aq_take(ch, true);
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
void channel_aq_revoke(struct channel *ch)
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
/* The peer's offer of its application's QP (or connection): QPN, PSN and keys were checked by the
 * decoder (wire.c), as every field of the peer. An offer of a round we installed or passed already
 * is stale; the latest waits until our application's page can take it (ours has no offer: it stays
 * unanswered). */
static bool aq_on_offer(struct channel *ch, const ChannelAppQp *a)
{
	if (a->round < ch->aq_peer_next)
		return false;
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
	return true;
}

static bool aq_on_ready(struct channel *ch, const ChannelAppQp *a)
{
	struct mesh_ring_aq *q = mesh_ring_aq(ch->ctrl);

	if (ch->aq_pend.valid && a->round == ch->aq_pend.round) {
		ch->aq_pend.ready = true; /* installed with its offer */
		return false;
	}
	if (atomic_load_explicit(&q->peer_state, memory_order_relaxed) != MESH_AQ_PEER_INFO || a->round != ch->aq_peer_round)
		return false;
	ch->aq_peer_ready = true;
	atomic_store_explicit(&q->peer_state, MESH_AQ_PEER_READY, memory_order_release);
	channel_wake_app(ch);
	return true;
}

static bool aq_on_sending(struct channel *ch, struct link *l, const ChannelAppQp *a)
{
	struct mesh_ring_aq *q = mesh_ring_aq(ch->ctrl);

	if (ch->resuming || (ch->aq_peer_next && a->round < ch->aq_peer_round) ||
	    (a->round < ch->aq_peer_next && atomic_load_explicit(&q->peer_state, memory_order_relaxed) == MESH_AQ_PEER_NONE)) {
		/* Of a QP that a resume revokes, or revoked (our page has a newer one, or none since we
		 * renewed): sent before the peer's ChannelResume, so it comes before ours is done; its
		 * bytes come again by our immediates. */
		log_debug("channel %u: node %u's application posts from round %u, ours has %u%s; ignored", ch->id,
			  l->peer->id, a->round, ch->aq_peer_round, ch->resuming ? " (resuming)" : "");
		return false;
	}
	if (!ch->aq_peer_ready || a->round != ch->aq_peer_round || ch->aq_peer_sends || a->pos < ch->rx_bytes ||
	    a->pos > ch->app_rx_cons + ch->size) {
		channel_break(ch, -EPROTO,
			      "node %u's application posts from %llu in round %u, which does not fit (%llu placed; "
			      "its QP of round %u is %s%s)",
			      l->peer->id, (unsigned long long)a->pos, a->round, (unsigned long long)ch->rx_bytes,
			      ch->aq_peer_round, !ch->aq_peer_next ? "not installed" : ch->aq_peer_ready ? "ready" : "not ready",
			      ch->aq_peer_sends ? " and posting already" : "");
		return true;
	}
	ch->aq_peer_sends = true;
	ch->aq_peer_from = a->pos;
	return true;
}

/* Its application's writes all completed before it said so: the pair is final. (Our application's
 * rx_seen may lag its CQ: we then answer less than arrived, and the peer writes those bytes again,
 * identical, where they are.) */
static void aq_on_handback(struct channel *ch, struct link *l)
{
	ChannelAppQp r = CHANNEL_APP_QP__INIT;

	channel_aq_rx(ch);
	ch->aq_peer_sends = false;
	r.state = AQ_MSG_PLACED;
	r.pos = ch->rx_bytes;
	if (channel_aq_send(ch, &r))
		log_debug("channel %u: cannot answer node %u's hand-back now; its resume will", ch->id, l->peer->id);
}

/* The peer's application is done with its QP: ours stops writing to it and says IDLE, and its
 * hand-back follows. One not installed yet is just dropped; one before the installed is stale. */
static void aq_on_revoke(struct channel *ch, const ChannelAppQp *a)
{
	if (ch->aq_pend.valid && a->round == ch->aq_pend.round)
		ch->aq_pend.valid = false;
	if (ch->aq_peer_next && a->round == ch->aq_peer_round)
		channel_aq_stop_app(ch);
}

/* Where the peer placed our application's writes it handed back: meshd posts from there. */
static bool aq_on_placed(struct channel *ch, struct link *l, const ChannelAppQp *a)
{
	if (!ch->aq_wait_pos)
		return false; /* a resume came between: it rewound already */
	if (a->pos < ch->peer_placed || a->pos > ch->tx_sent) {
		channel_break(ch, -EPROTO, "node %u placed %llu of our bytes, outside [%llu, %llu]", l->peer->id,
			      (unsigned long long)a->pos, (unsigned long long)ch->peer_placed, (unsigned long long)ch->tx_sent);
		return true;
	}
	ch->rewritten_bytes += ch->tx_sent - a->pos;
	ch->tx_sent = ch->tx_done = a->pos;
	ch->peer_placed = a->pos;
	ch->aq_wait_pos = false;
	channel_aq_ungrant(ch);
	log_info("channel %u (node %u port %u): the application gave its writes back at %llu; meshd posts them", ch->id,
		 l->peer->id, ch->peer_port, (unsigned long long)a->pos);
	return true;
}

void channel_on_app_qp(struct link *l, const ChannelAppQp *a)
{
	struct channel *ch = link_channel(l, a->slot);
	bool pump = true;

	if (!ch || ch->state != CH_OPEN)
		return; /* closed meanwhile: nothing to relay */
	switch (a->state) {
	case AQ_MSG_OFFER:
		pump = aq_on_offer(ch, a);
		break;
	case AQ_MSG_READY:
		pump = aq_on_ready(ch, a);
		break;
	case AQ_MSG_SENDING:
		pump = aq_on_sending(ch, l, a);
		break;
	case AQ_MSG_HANDBACK:
		aq_on_handback(ch, l);
		break;
	case AQ_MSG_REVOKE:
		aq_on_revoke(ch, a);
		break;
	case AQ_MSG_PLACED:
		pump = aq_on_placed(ch, l, a);
		break;
	default:
		log_warn("node %u sent ChannelAppQp state %u for channel slot %u; ignored", l->peer->id, a->state, a->slot);
		return;
	}
	/* A stale or ignored message changes nothing: no pump for it. */
	if (pump)
		channel_pump(ch);
}
