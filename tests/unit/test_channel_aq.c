/*
 * Application-posted writes (node/meshd/channel_aq.c; cluster.app_send, the AQ area of ring.h):
 * meshd relays the applications' offers (a QP or a tcp port and token) and grants the writes, takes
 * them back (a hand-back, an idle application, a resume) and posts from where the peer says it
 * placed them, follows the peer application's writes within the reader's credit, and breaks the
 * channel on hostile words.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "channel_harness.h"
#include "unit_main.h"

#define AQ_QPN 0x1234u
#define AQ_PSN 0x777u

/* cluster.app_send on, and a provider with paths: channels opened from now on are offered. */
static void aq_on(struct ct *c)
{
	c->t.fx->path_ok = true;
	strcpy(c->t.cfg.app_send, "on");
	c->aq_caps = MESH_AQ_CAP_IMM_POS | MESH_AQ_CAP_TAKE;
}

/* The peer's ChannelAppQp about its application's QP of the given round. */
static void peer_app_qp_round(struct ct *c, const struct chan *h, uint32_t state, uint64_t pos, uint32_t round)
{
	PeerMsg m = PEER_MSG__INIT;
	ChannelAppQp a = CHANNEL_APP_QP__INIT;

	a.slot = h->slot;
	a.state = state;
	a.pos = pos;
	a.round = round;
	if (state == 1) {
		a.qpn = 0x4321;
		a.psn = 0x99;
		a.rx_addr = 0x10000;
		a.rx_rkey = 0x55;
		a.dir_addr = 0x20000;
		a.dir_rkey = 0x66;
		a.caps = MESH_AQ_CAP_IMM_POS | 0x40; /* and a bit nobody knows yet: relayed as it is */
	}
	m.body_case = PEER_MSG__BODY_CHANNEL_APP_QP;
	m.channel_app_qp = &a;
	peer_msg(c, &m);
}

static void peer_app_qp(struct ct *c, const struct chan *h, uint32_t state, uint64_t pos)
{
	peer_app_qp_round(c, h, state, pos, 0);
}

/* Our application's QP: its keys, then the state, then the kick (as libmesh's aq.c does). */
static void app_aq_say(struct ct *c, struct chan *h, uint32_t state, uint32_t qpn)
{
	struct mesh_ring_aq *q = mesh_ring_aq(h->app->ctrl);

	q->qpn = qpn;
	q->psn = AQ_PSN;
	q->rx_addr = 0x30000;
	q->rx_rkey = 0x77;
	q->dir_addr = 0x40000;
	q->dir_rkey = 0x88;
	q->caps = c->aq_caps;
	atomic_store_explicit(&q->app_state, state, memory_order_release);
	app_kick(c, h);
}

/* Our application takes the grant meshd offered (MESH_AQ_CAP_TAKE), and kicks, as aq.c does. */
static bool app_take(struct ct *c, struct chan *h)
{
	uint32_t v = MESH_AQ_APP;
	bool took = atomic_compare_exchange_strong(&mesh_ring_aq(h->app->ctrl)->grant, &v, MESH_AQ_TAKEN);

	app_kick(c, h);
	return took;
}

static uint32_t sent_aq_state(struct ct *c, size_t from, size_t nth, uint64_t *pos)
{
	PeerMsg *m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_APP_QP, nth);
	uint32_t st;

	if (!m)
		return 0;
	st = m->channel_app_qp->state;
	if (pos)
		*pos = m->channel_app_qp->pos;
	mesh_peer_msg_free(m);
	return st;
}

/* Both applications offered and connected their QPs (OFFER and READY each way, ours first). */
static void aq_both_ready(struct ct *c, struct chan *h)
{
	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN);
	peer_app_qp(c, h, 1, 0);
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN);
	peer_app_qp(c, h, 2, 0);
}

/* Both applications offered and connected their QPs: meshd grants ours the sending half. */
static void aq_granted(struct ct *c, struct chan *h)
{
	size_t from = c->t.fx->n_posts;
	struct mesh_ring_aq *q = mesh_ring_aq(h->app->ctrl);
	uint64_t pos = 99;

	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN);
	peer_app_qp(c, h, 1, 0);
	assert_int_equal(atomic_load(&q->peer_state), MESH_AQ_PEER_INFO);
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN);
	peer_app_qp(c, h, 2, 0);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 1);
	assert_int_equal(sent_aq_state(c, from, 1, NULL), 2);
	/* Offered: the peer hears once our application took it. */
	assert_int_equal(sent_aq_state(c, from, 2, NULL), 0);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_APP);
	assert_int_equal(atomic_load(&q->grant_pos), h->app->tx_prod);
	assert_true(app_take(c, h));
	assert_int_equal(sent_aq_state(c, from, 2, &pos), 3);
	assert_int_equal(pos, h->app->tx_prod);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_TAKEN);
	complete_sends(c);
}

/* Both applications offered and connected their QPs; the peer's posts its half from 0. */
static void aq_peer_sending(struct ct *c, struct chan *h)
{
	aq_both_ready(c, h);
	peer_app_qp(c, h, 3, 0);
	assert_true(chn(c, h)->aq_peer_sends);
}

static void channel_app_send__offer_relayed_and_granted__meshd_posts_none_and_takes_credits(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct mesh_ring_aq *q;
	PeerMsg *m;
	size_t from;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	/* The offer: the rail's path, read off meshd's own QP. */
	assert_int_equal(q->path_valid, 1);
	assert_string_equal(q->dev, "fake0");
	assert_int_equal(q->port, 1);
	assert_int_equal(q->dgid[0], 0xab);
	from = c->t.fx->n_posts;
	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_APP_QP, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_app_qp->slot, PEER_SLOT);
	assert_int_equal(m->channel_app_qp->qpn, AQ_QPN);
	assert_int_equal(m->channel_app_qp->psn, AQ_PSN);
	assert_int_equal(m->channel_app_qp->rx_rkey, 0x77);
	assert_int_equal(m->channel_app_qp->dir_rkey, 0x88);
	assert_int_equal(m->channel_app_qp->caps, MESH_AQ_CAP_IMM_POS);
	mesh_peer_msg_free(m);
	/* The peer's offer lands in our application's page. */
	peer_app_qp(c, h, 1, 0);
	assert_int_equal(q->peer_caps, MESH_AQ_CAP_IMM_POS | 0x40);
	assert_int_equal(q->peer_qpn, 0x4321);
	assert_int_equal(q->peer_psn, 0x99);
	assert_int_equal(q->peer_rx_rkey, 0x55);
	assert_int_equal(q->peer_dir_addr, 0x20000);
	/* Not granted before both are ready. */
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	from = c->t.fx->n_posts;
	peer_app_qp(c, h, 2, 0);
	assert_int_equal(atomic_load(&q->peer_state), MESH_AQ_PEER_READY);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_APP);
	assert_true(app_take(c, h));
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 3);
	complete_sends(c);
	/* Our application posts: meshd writes nothing of its bytes, yet counts them and takes the
	 * peer's credit for them. */
	from = c->t.fx->n_posts;
	app_write(h, 1000);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	peer_credit(c, h, 1000);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(chn(c, h)->tx_bytes, 1000);
	assert_int_equal(ring_tx_cons(h), 1000);
	assert_string_equal(chn(c, h)->aq_granted ? "app" : "meshd", "app");
	mt_finish(&c->t);
}

/* Both applications offered and connected their QPs: meshd offers ours the grant, not taken yet. */
static void aq_grant_offered(struct ct *c, struct chan *h)
{
	struct mesh_ring_aq *q = mesh_ring_aq(h->app->ctrl);

	aq_both_ready(c, h);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_APP);
	assert_int_equal(atomic_load(&q->grant_pos), h->app->tx_prod);
	complete_sends(c);
}

/* The race the grant's compare-and-swap closes (ring.h MESH_AQ_CAP_TAKE): our application published
 * bytes after meshd stored the grant but looked for it just before, and makes no more calls (a
 * program that writes and then waits on something else: the Go binding's test of deadlines hung
 * so). meshd withdraws the grant and posts the bytes itself, then grants again from after them. */
static void channel_app_send__published_before_the_grant_was_taken__meshd_withdraws_and_posts_them(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	uint64_t pos = 0;
	size_t from;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_grant_offered(c, h);
	from = c->t.fx->n_posts;
	app_write(h, 100);
	app_kick(c, h); /* libmesh kicks for bytes it publishes without a grant in sight */
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	assert_int_equal(chn(c, h)->aq_withdrawn, 1);
	assert_int_equal(chn(c, h)->aq_grants, 0);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 0); /* the peer heard of no grant */
	assert_int_equal(write_count(c, h, from, false), 1);
	/* Our application looks only now: the grant is not there to take. */
	assert_false(app_take(c, h));
	complete_data(c, h, from);
	assert_int_equal(chn(c, h)->tx_done, 100);
	/* Once they completed, the grant comes again, from after them. */
	from = c->t.fx->n_posts;
	app_kick(c, h);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_APP);
	assert_int_equal(atomic_load(&q->grant_pos), 100);
	assert_true(app_take(c, h));
	assert_int_equal(sent_aq_state(c, from, 0, &pos), 3);
	assert_int_equal(pos, 100);
	assert_int_equal(chn(c, h)->aq_grants, 1);
	complete_sends(c);
	/* And it is the application's: meshd posts nothing of what comes now, and counts it. */
	from = c->t.fx->n_posts;
	app_write(h, 50);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	peer_credit(c, h, 150);
	assert_int_equal(chn(c, h)->tx_bytes, 150);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* The application says IDLE (a shutdown, a failed QP) without having taken the grant: nothing of it
 * went, so no hand-back: meshd posts what it published. */
static void channel_app_send__idle_before_taking_the_grant__withdrawn_no_hand_back(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_grant_offered(c, h);
	from = c->t.fx->n_posts;
	app_write(h, 50);
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	/* The peer's application is revoked (it has our offer and may be granted), and nothing else
	 * goes: neither SENDING nor HANDBACK. */
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 6);
	assert_int_equal(sent_aq_state(c, from, 1, NULL), 0);
	assert_int_equal(write_count(c, h, from, false), 1);
	assert_false(chn(c, h)->aq_granted);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* The peer closed and meshd acked: the peer frees the slot and may give it to its next channel at
 * once. Whatever our application does after (it takes the grant offered before, answering a request
 * that came before the close), nothing more goes for that slot: a SENDING after the ack reached the
 * peer's next channel there and broke it ("node 2's application posts from 0, which does not fit":
 * redis-benchmark closes its 50 clients with answers still coming and opens the next 50 at once). */
static void channel_app_send__peer_closed_and_acked__nothing_more_for_its_slot(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	PeerMsg *m;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	aq_grant_offered(c, h);
	from = c->t.fx->n_posts;
	peer_close(c, h, 0);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_CLOSE_ACK, 0);
	assert_non_null(m);
	mesh_peer_msg_free(m);
	from = c->t.fx->n_posts;
	app_write(h, 40);
	app_take(c, h);
	assert_null(sent_msg(c, from, PEER_MSG__BODY_CHANNEL_APP_QP, 0));
	mt_finish(&c->t);
}

/* An older libmesh (no MESH_AQ_CAP_TAKE) gets the grant as before: its own at once, the peer told
 * first. */
static void channel_app_send__application_without_take__granted_at_once(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	aq_on(c);
	c->aq_caps = MESH_AQ_CAP_IMM_POS;
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN);
	peer_app_qp(c, h, 1, 0);
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN);
	from = c->t.fx->n_posts;
	peer_app_qp(c, h, 2, 0);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 3);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_APP);
	assert_int_equal(chn(c, h)->aq_grants, 1);
	complete_sends(c);
	from = c->t.fx->n_posts;
	app_write(h, 100);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_int_equal(chn(c, h)->aq_withdrawn, 0);
	mt_finish(&c->t);
}

/* Only TAKEN may replace an offered grant: anything else the application writes there breaks its
 * own channel, named. */
static void channel_app_send__application_writes_over_the_grant__channel_broken_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	aq_grant_offered(c, h);
	atomic_store(&mesh_ring_aq(h->app->ctrl)->grant, 7);
	app_kick(c, h);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_app_send__granted__tx_space_ends_at_the_readers_credit(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	aq_granted(c, h);
	app_write(h, 3000);
	app_kick(c, h);
	/* Placed all, read 1000: the application may not write past 1000 + a ring (it posts into the
	 * peer's ring itself, where only the reader's position bounds it). */
	peer_credit_placed(c, h, 1000, 3000);
	assert_int_equal(ring_tx_cons(h), 1000);
	mt_finish(&c->t);
}

/* Bytes the application posted on its own QP are no move for a polling meshd: it takes them at its
 * next pump, as it does when it sleeps (libmesh does not kick for them). */
static void channel_poll__granted_applications_writes__not_a_move(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	aq_granted(c, h);
	app_write(h, 3000);
	assert_int_equal(channel_poll(&c->t.m, 0), 0);
	/* The next pump takes them all the same: the reader's credit is within them. */
	peer_credit_placed(c, h, 1000, 3000);
	assert_int_equal(ring_tx_cons(h), 1000);
	assert_true(chn(c, h)->tx_bytes == 3000);
	mt_finish(&c->t);
}

static void channel_app_send__hostile_qp_words__channel_broken_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h, *h2;

	ct_init(c, 2);
	aq_on(c);
	/* a QP number beyond 24 bits */
	h = open_out(c, RING, 2, PEER_SLOT);
	app_aq_say(c, h, MESH_AQ_OFFER, 1u << 24);
	expect_broken(c, h, -EPROTO);
	/* a state that goes back */
	h2 = open_out(c, RING, 2, PEER_SLOT + 1);
	app_aq_say(c, h2, MESH_AQ_OFFER, AQ_QPN);
	app_aq_say(c, h2, MESH_AQ_READY, AQ_QPN);
	app_aq_say(c, h2, MESH_AQ_OFFER, AQ_QPN);
	expect_broken(c, h2, -EPROTO);
	/* a state beyond IDLE: the first channel is broken already; a third one */
	h = open_out(c, RING, 2, PEER_SLOT + 2);
	app_aq_say(c, h, 7, AQ_QPN);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_app_send__peer_sends_from_an_unfit_position__channel_broken(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	/* SENDING before its application said READY */
	peer_app_qp(c, h, 3, 0);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_app_send__hand_back__peer_says_placed_meshd_posts_from_there(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_granted(c, h);
	app_write(h, 3000);
	app_kick(c, h);
	/* The application's QP failed after 1000 of its 3000 bytes arrived: it says IDLE. */
	from = c->t.fx->n_posts;
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 6); /* REVOKE: the peer's writes too */
	assert_int_equal(sent_aq_state(c, from, 1, NULL), 4); /* HANDBACK */
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_REVOKED);
	assert_int_equal(write_count(c, h, from, false), 0); /* nothing before the peer says where */
	complete_sends(c);
	/* The peer read the pair: 1000 arrived. meshd writes the rest from the application's TX. */
	from = c->t.fx->n_posts;
	peer_app_qp(c, h, 5, 1000);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_true(write_count(c, h, from, false) > 0);
	complete_data(c, h, from);
	/* Bytes 1000..3000 are in the peer's ring now, written by meshd from the application's TX. */
	check_peer_ring(h, 1000, 3000);
	assert_int_equal(chn(c, h)->rewritten_bytes, 2000);
	assert_false(chn(c, h)->aq_granted);
	mt_finish(&c->t);
}

/* The application said IDLE (a shutdown hands its half back) and the link went before the peer's
 * PLACED came: the resume's rewind takes the PLACED's place, and meshd posts the rest (it waited on
 * a grant nobody held: a stream's last bytes hung in the VM's resilience test, the sender's meshd
 * still saying "writer app"). */
static void channel_app_send__hand_back_then_link_lost__resume_rewinds_meshd_posts_the_rest(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	aq_granted(c, h);
	app_write(h, 3000);
	app_kick(c, h);
	from = c->t.fx->n_posts;
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	assert_int_equal(sent_aq_state(c, from, 1, NULL), 4); /* HANDBACK (after REVOKE), lost with the link */
	link_lost(c);
	link_back(c, 5000);
	mesh_peer_msg_free(sent_resume(c, h, from));
	complete_sends(c);
	/* The peer's reader has 1000 of the 3000: meshd writes the rest itself. */
	from = c->t.fx->n_posts;
	peer_resume(c, h, 1000, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_false(chn(c, h)->aq_granted);
	assert_true(write_count(c, h, from, false) > 0);
	complete_data(c, h, from);
	check_peer_ring(h, 1000, 3000);
	/* A PLACED that comes late after all is stale: ignored. */
	peer_app_qp(c, h, 5, 1000);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* Our application is done with its QP of its own accord before the peer's application sends (a
 * forked child takes the channel over and hands back its parent's QP, which nobody reads any more):
 * the peer's application, granted at any time, would write where no one looks and the stream would
 * stall (issue 43: a forking server stalled 1 run in 3). meshd revokes it at once; its SENDING that
 * crossed the REVOKE and its HANDBACK are answered. */
static void channel_app_send__idle_of_its_own_accord_before_the_peer_sends__peer_revoked(void **state)
{
	struct ct *c = *state;
	uint64_t pos = 99;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	aq_both_ready(c, h);
	from = c->t.fx->n_posts;
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 6); /* REVOKE of the QP the peer has */
	assert_false(chn(c, h)->aq_granted);
	complete_sends(c);
	/* The peer's meshd had granted its application before the REVOKE came: its SENDING crosses. */
	peer_app_qp(c, h, 3, 0);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_true(chn(c, h)->aq_peer_sends);
	/* Its application stopped and handed back: nothing of it was read here, so 0 is placed. */
	from = c->t.fx->n_posts;
	peer_app_qp(c, h, 4, 0);
	assert_int_equal(sent_aq_state(c, from, 0, &pos), 5);
	assert_int_equal(pos, 0);
	assert_false(chn(c, h)->aq_peer_sends);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* The same IDLE answering the peer's REVOKE (its application was done first, before it sent): the
 * peer's round is ending already, and a REVOKE back could end its next one. None is sent back. */
static void channel_app_send__idle_answering_the_peers_revoke__no_revoke_back(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_both_ready(c, h);
	peer_app_qp(c, h, 6, 0);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_REVOKED);
	from = c->t.fx->n_posts;
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	for (size_t i = 0; i < 4; i++)
		assert_int_not_equal(sent_aq_state(c, from, i, NULL), 6);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

static void channel_app_send__peer_application_writes__rx_follows_its_pair_within_the_credit(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_direct *d;
	struct chan *h;

	ct_init(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	aq_peer_sending(c, h); /* its application posts from 0 */
	d = mesh_ring_direct(h->app->ctrl);
	/* Its application's pair at 500: meshd's rx_bytes and counters follow at the next pump. */
	atomic_store(&d->pos, 500);
	atomic_store(&d->check, mesh_ring_direct_check(500));
	app_kick(c, h);
	assert_int_equal(chn(c, h)->rx_bytes, 500);
	assert_int_equal(chn(c, h)->rx_bytes_total, 500);
	assert_int_equal(ring_rx_prod(h), 500);
	/* A pair past the reader's credit (a ring beyond what it consumed) is ignored, as is a torn one. */
	atomic_store(&d->pos, RING + 1);
	atomic_store(&d->check, mesh_ring_direct_check(RING + 1));
	app_kick(c, h);
	assert_int_equal(chn(c, h)->rx_bytes, 500);
	atomic_store(&d->pos, 700);
	atomic_store(&d->check, mesh_ring_direct_check(701));
	app_kick(c, h);
	assert_int_equal(chn(c, h)->rx_bytes, 500);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* A lost link revokes our application's QP; once the channel resumed and the application said
 * IDLE, meshd offers it a new one (round 1) and grants the half again when both new QPs are
 * ready. Messages of the peer's old QP that come late change nothing. */
static void channel_app_send__resume_revoked_the_qp__new_round_offered_and_granted_again(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	size_t from;
	PeerMsg *m;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_granted(c, h);
	assert_int_equal(chn(c, h)->aq_grants, 1);
	app_write(h, 3000);
	app_kick(c, h);

	link_lost(c);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_REVOKED);
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	assert_int_equal(atomic_load(&q->round), 0); /* not before the resume is done */
	from = c->t.fx->n_posts;
	link_back(c, 5000);
	mesh_peer_msg_free(sent_resume(c, h, from));
	complete_sends(c);
	assert_int_equal(atomic_load(&q->round), 0);
	/* The peer's reader has 1000 of the 3000 our application published: meshd writes the rest. */
	from = c->t.fx->n_posts;
	peer_resume(c, h, 1000, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_true(write_count(c, h, from, false) > 0);
	complete_data(c, h, from);
	check_peer_ring(h, 1000, 3000);
	/* The new round: the page as for a first offer, the round changed last. */
	assert_int_equal(atomic_load(&q->round), 1);
	assert_int_equal(q->path_valid, 1);
	assert_string_equal(q->dev, "fake0");
	assert_int_equal(atomic_load(&q->app_state), MESH_AQ_NONE);
	assert_int_equal(atomic_load(&q->peer_state), MESH_AQ_PEER_NONE);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	/* Late words of the peer's old QP: ignored, not a breach. */
	peer_app_qp_round(c, h, 3, 1000, 0);
	peer_app_qp_round(c, h, 1, 0, 0);
	assert_int_equal(atomic_load(&q->peer_state), MESH_AQ_PEER_NONE);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	/* The peer's meshd renewed first: its new offer and READY wait for our application's. */
	peer_app_qp_round(c, h, 1, 0, 1);
	peer_app_qp_round(c, h, 2, 0, 1);
	assert_int_equal(atomic_load(&q->peer_state), MESH_AQ_PEER_READY);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	from = c->t.fx->n_posts;
	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN + 1);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_APP_QP, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_app_qp->state, 1);
	assert_int_equal(m->channel_app_qp->round, 1);
	assert_int_equal(m->channel_app_qp->qpn, AQ_QPN + 1);
	mesh_peer_msg_free(m);
	complete_sends(c);
	from = c->t.fx->n_posts;
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN + 1);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 2);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_APP);
	assert_int_equal(atomic_load(&q->grant_pos), 3000);
	assert_true(app_take(c, h));
	assert_int_equal(sent_aq_state(c, from, 1, NULL), 3); /* SENDING: granted again */
	assert_int_equal(chn(c, h)->aq_grants, 2);
	complete_sends(c);
	/* The peer's application posts its half again too, from its new QP. */
	peer_app_qp_round(c, h, 3, 0, 1);
	assert_true(chn(c, h)->aq_peer_sends);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* The link goes before the grant (both QPs offered, ours connected): our application is told to
 * stop all the same, and once it is IDLE and the channel resumed it gets a new round. */
static void channel_app_send__resume_before_the_grant__application_stopped_and_offered_anew(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN);
	peer_app_qp(c, h, 1, 0);
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	link_lost(c);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_REVOKED);
	link_back(c, 5000);
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	assert_int_equal(atomic_load(&q->round), 0); /* its QP is not stopped yet */
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	assert_int_equal(atomic_load(&q->round), 1);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	assert_int_equal(atomic_load(&q->app_state), MESH_AQ_NONE);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* The receiving side of a stream whose peer application posts: the link goes, both resume, the
 * peer's application gives its writes back only after the resume (its HANDBACK), then both meshd
 * renew in either order: the peer's new SENDING makes rx follow its application again. */
static void channel_app_send__peer_renews_after_a_hand_back__its_writes_followed_again(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	size_t from;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_peer_sending(c, h);
	complete_sends(c);
	assert_true(chn(c, h)->aq_peer_sends);
	atomic_store(&q->rx_seen, 500);
	app_kick(c, h);
	assert_int_equal(chn(c, h)->rx_bytes, 500);

	link_lost(c);
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	link_back(c, 5000);
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	complete_sends(c);
	assert_int_equal(atomic_load(&q->round), 1);
	/* Its application said IDLE after the resume: its hand-back, our answer. */
	from = c->t.fx->n_posts;
	peer_app_qp_round(c, h, 4, 0, 0);
	assert_int_equal(sent_aq_state(c, from, 0, NULL), 5);
	complete_sends(c);
	/* Its meshd renewed: offer and READY of its round 1; ours offers and is ready too. */
	peer_app_qp_round(c, h, 1, 0, 1);
	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN + 1);
	assert_int_equal(atomic_load(&q->peer_state), MESH_AQ_PEER_INFO);
	peer_app_qp_round(c, h, 2, 0, 1);
	app_aq_say(c, h, MESH_AQ_READY, AQ_QPN + 1);
	complete_sends(c);
	/* Its bytes 500..700 came by its meshd's immediates before its grant. */
	peer_data(c, h, 0, 0, 500, 200);
	peer_app_qp_round(c, h, 3, 700, 1);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_true(chn(c, h)->aq_peer_sends);
	atomic_store(&q->rx_seen, 900);
	app_kick(c, h);
	assert_int_equal(chn(c, h)->rx_bytes, 900);
	mt_finish(&c->t);
}

/* Two resumes close together (a rail's failover, then the whole link): the second revokes a round
 * that the application had not answered yet (its new QP still being made, app_state NONE). It
 * answers all the same (its QP offered, then stopped: IDLE), and that IDLE must bring the next
 * round; a channel that waited for an answer it already had would stay meshd-posted for good (the
 * VM's resilience test saw app_grants stop at 2 after its second outage). */
static void channel_app_send__second_resume_before_the_application_answered__next_round_offered(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;
	size_t from;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_granted(c, h);
	link_lost(c);
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	link_back(c, 5000);
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	complete_sends(c);
	assert_int_equal(atomic_load(&q->round), 1);
	assert_int_equal(atomic_load(&q->app_state), MESH_AQ_NONE);
	/* The link goes again before the application offers its round-1 QP. */
	link_lost(c);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_REVOKED);
	link_back(c, 9000);
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	complete_sends(c);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_int_equal(atomic_load(&q->round), 1); /* its answer is still to come */
	/* The application, late: its round-1 QP offered (not relayed: it stops at once, and the peer's
	 * application would connect to it), then stopped for the revocation. */
	from = c->t.fx->n_posts;
	app_aq_say(c, h, MESH_AQ_OFFER, AQ_QPN + 1);
	assert_null(sent_msg(c, from, PEER_MSG__BODY_CHANNEL_APP_QP, 0));
	complete_sends(c);
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN + 1);
	complete_sends(c);
	assert_int_equal(atomic_load(&q->round), 2);
	assert_int_equal(atomic_load(&q->app_state), MESH_AQ_NONE);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* The same in the first round: the link goes while the application is still making its first QP
 * (nothing offered yet); it stops that QP when it sees the revocation, and its IDLE brings round 1. */
static void channel_app_send__resume_before_the_first_offer__application_offered_anew(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	link_lost(c);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_REVOKED);
	link_back(c, 5000);
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	complete_sends(c);
	assert_int_equal(atomic_load(&q->round), 0);
	app_aq_say(c, h, MESH_AQ_IDLE, AQ_QPN);
	complete_sends(c);
	assert_int_equal(atomic_load(&q->round), 1);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_MESHD);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* A resume with an application that never took the offer (an older libmesh): no new round. */
static void channel_app_send__offer_not_taken__no_new_round_after_a_resume(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	link_lost(c);
	link_back(c, 5000);
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_int_equal(atomic_load(&mesh_ring_aq(h->app->ctrl)->round), 0);
	assert_false(chn(c, h)->aq_renew);
	mt_finish(&c->t);
}

/* The peer's application carries positions in its immediates (MESH_AQ_CAP_IMM_POS): no pair
 * lands, and our application publishes what its CQ said in rx_seen, which meshd takes as it would
 * a pair, within the reader's credit; the reader may consume up to it. */
static void channel_app_send__peer_writes_by_immediate__rx_follows_the_applications_rx_seen(void **state)
{
	struct ct *c = *state;
	struct mesh_ring_aq *q;
	struct chan *h;

	ct_init_resume(c, 2);
	aq_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	aq_peer_sending(c, h);
	atomic_store(&q->rx_seen, 700);
	app_kick(c, h);
	assert_int_equal(chn(c, h)->rx_bytes, 700);
	assert_int_equal(ring_rx_prod(h), 700);
	/* Past the reader's credit: ignored. */
	atomic_store(&q->rx_seen, RING + 1);
	app_kick(c, h);
	assert_int_equal(chn(c, h)->rx_bytes, 700);
	/* The link goes; our application's CQ still had completions up to 900, which it polls after
	 * meshd took 700 for its resume: reading to 900 is within what it was told, not a breach. */
	link_lost(c);
	atomic_store(&q->rx_seen, 900);
	h->app->rx_cons = 900;
	atomic_store(&h->app->ctrl->rx_cons, 900);
	app_kick(c, h);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(chn(c, h)->rx_bytes, 700); /* the resume asks for the rest again */
	mt_finish(&c->t);
}

static void channel_app_send__provider_without_paths__nothing_offered(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	strcpy(c->t.cfg.app_send, "on"); /* but the provider has no paths */
	h = open_out(c, RING, 2, PEER_SLOT);
	assert_int_equal(mesh_ring_aq(h->app->ctrl)->path_valid, 0);
	assert_false(chn(c, h)->aq_offered);
	mt_finish(&c->t);
}

/* Over the tcp provider the page gets the rail's two addresses, and the applications' ports and
 * tokens are relayed where QP numbers and keys would be; a grant follows as over rdma. */
static void channel_app_send__tcp_path__port_and_token_relayed_and_granted(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct mesh_ring_aq *q;
	PeerMsg m = PEER_MSG__INIT, *s;
	ChannelAppQp a = CHANNEL_APP_QP__INIT;
	uint8_t token[MESH_AQ_TOKEN_LEN], ptoken[MESH_AQ_TOKEN_LEN];
	size_t from;

	ct_init(c, 2);
	aq_on(c);
	c->t.fx->path_tcp = true;
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	assert_int_equal(q->path_valid, MESH_AQ_PATH_TCP);
	assert_int_equal(q->port, 0); /* an older libmesh takes no offer */
	assert_int_equal(q->tcp_family, AF_INET);
	assert_int_equal(q->tcp_local[3], 1);
	assert_int_equal(q->tcp_peer[3], 2);
	/* our application listens on 40000 */
	memset(token, 0x5a, sizeof(token));
	q->tcp_port = 40000;
	memcpy(q->tcp_token, token, sizeof(token));
	from = c->t.fx->n_posts;
	atomic_store_explicit(&q->app_state, MESH_AQ_OFFER, memory_order_release);
	app_kick(c, h);
	s = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_APP_QP, 0);
	assert_non_null(s);
	assert_int_equal(s->channel_app_qp->state, 1);
	assert_int_equal(s->channel_app_qp->tcp_port, 40000);
	assert_int_equal(s->channel_app_qp->tcp_token.len, MESH_AQ_TOKEN_LEN);
	assert_memory_equal(s->channel_app_qp->tcp_token.data, token, sizeof(token));
	assert_int_equal(s->channel_app_qp->qpn, 0);
	mesh_peer_msg_free(s);
	/* the peer's application listens on 40001 */
	memset(ptoken, 0xa5, sizeof(ptoken));
	a.slot = h->slot;
	a.state = 1;
	a.tcp_port = 40001;
	a.tcp_token.data = ptoken;
	a.tcp_token.len = sizeof(ptoken);
	m.body_case = PEER_MSG__BODY_CHANNEL_APP_QP;
	m.channel_app_qp = &a;
	peer_msg(c, &m);
	assert_int_equal(atomic_load(&q->peer_state), MESH_AQ_PEER_INFO);
	assert_int_equal(q->peer_tcp_port, 40001);
	assert_memory_equal(q->peer_tcp_token, ptoken, sizeof(ptoken));
	atomic_store_explicit(&q->app_state, MESH_AQ_READY, memory_order_release);
	app_kick(c, h);
	peer_app_qp(c, h, 2, 0);
	assert_int_equal(atomic_load(&q->grant), MESH_AQ_APP);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	mt_finish(&c->t);
}

/* A peer's meshd that does not relay tcp offers (no MESH_FEAT_APPTCP): nothing is offered. */
static void channel_app_send__tcp_path_peer_without_the_feature__nothing_offered(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	aq_on(c);
	c->t.fx->path_tcp = true;
	c->l->features &= ~MESH_FEAT_APPTCP;
	h = open_out(c, RING, 2, PEER_SLOT);
	assert_int_equal(mesh_ring_aq(h->app->ctrl)->path_valid, 0);
	assert_false(chn(c, h)->aq_offered);
	mt_finish(&c->t);
}

/* Our application's tcp offer is hostile: a port of 0, or a token of zeros, breaks its channel. */
static void channel_app_send__tcp_offer_without_port_or_token__channel_broken_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct mesh_ring_aq *q;

	ct_init(c, 2);
	aq_on(c);
	c->t.fx->path_tcp = true;
	h = open_out(c, RING, 2, PEER_SLOT);
	q = mesh_ring_aq(h->app->ctrl);
	memset(q->tcp_token, 1, MESH_AQ_TOKEN_LEN);
	q->tcp_port = 0;
	atomic_store_explicit(&q->app_state, MESH_AQ_OFFER, memory_order_release);
	app_kick(c, h);
	expect_broken(c, h, -EPROTO);
	h = open_out(c, RING, 2, PEER_SLOT + 1);
	q = mesh_ring_aq(h->app->ctrl);
	q->tcp_port = 40000;
	atomic_store_explicit(&q->app_state, MESH_AQ_OFFER, memory_order_release);
	app_kick(c, h);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static const struct CMUnitTest tests[] = {
	T(channel_app_send__offer_relayed_and_granted__meshd_posts_none_and_takes_credits),
	T(channel_app_send__granted__tx_space_ends_at_the_readers_credit),
	T(channel_app_send__published_before_the_grant_was_taken__meshd_withdraws_and_posts_them),
	T(channel_app_send__idle_before_taking_the_grant__withdrawn_no_hand_back),
	T(channel_app_send__peer_closed_and_acked__nothing_more_for_its_slot),
	T(channel_app_send__application_without_take__granted_at_once),
	T(channel_app_send__application_writes_over_the_grant__channel_broken_eproto),
	T(channel_poll__granted_applications_writes__not_a_move),
	T(channel_app_send__hostile_qp_words__channel_broken_eproto),
	T(channel_app_send__peer_sends_from_an_unfit_position__channel_broken),
	T(channel_app_send__hand_back__peer_says_placed_meshd_posts_from_there),
	T(channel_app_send__hand_back_then_link_lost__resume_rewinds_meshd_posts_the_rest),
	T(channel_app_send__idle_of_its_own_accord_before_the_peer_sends__peer_revoked),
	T(channel_app_send__idle_answering_the_peers_revoke__no_revoke_back),
	T(channel_app_send__peer_application_writes__rx_follows_its_pair_within_the_credit),
	T(channel_app_send__resume_revoked_the_qp__new_round_offered_and_granted_again),
	T(channel_app_send__resume_before_the_grant__application_stopped_and_offered_anew),
	T(channel_app_send__peer_renews_after_a_hand_back__its_writes_followed_again),
	T(channel_app_send__second_resume_before_the_application_answered__next_round_offered),
	T(channel_app_send__resume_before_the_first_offer__application_offered_anew),
	T(channel_app_send__offer_not_taken__no_new_round_after_a_resume),
	T(channel_app_send__peer_writes_by_immediate__rx_follows_the_applications_rx_seen),
	T(channel_app_send__provider_without_paths__nothing_offered),
	T(channel_app_send__tcp_path__port_and_token_relayed_and_granted),
	T(channel_app_send__tcp_path_peer_without_the_feature__nothing_offered),
	T(channel_app_send__tcp_offer_without_port_or_token__channel_broken_eproto),
};

UNIT_MAIN("channel_aq", tests, ct_group_setup, NULL)
