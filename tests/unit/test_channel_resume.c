/*
 * Links and rails going DOWN and coming UP again, for channels (node/meshd/channel_resume.c): a
 * channel resumes where it stood (ChannelResume: what was not placed is written again, nothing is
 * lost or duplicated), moves to the other rail when its own fails, waits no longer than
 * cluster.resume_timeout_ms, and ends at once when it cannot resume (a Goodbye, a restarted peer,
 * a QP that refuses with resuming off, a channel still opening).
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
#include "util.h"

/* ---- resuming across a lost link (cluster.resume_timeout_ms) ----------------------------------- */

/* Live registrations in scope that a peer may write or read. */
static size_t remote_regs_in(const struct ct *c, const void *scope)
{
	size_t n = 0;

	for (size_t i = 0; i < c->t.fx->n_regs; i++) {
		const struct fake_reg *r = &c->t.fx->regs[i];

		n += !r->gone && r->scope == scope && (r->access & (XPORT_ACCESS_REMOTE_WRITE | XPORT_ACCESS_REMOTE_READ));
	}
	return n;
}

/* The link's next attempt reaches nothing of it before it proved itself (with a key, the proof
 * comes before our Hello; without one, all of its QPs connected): its QPs have a protection scope
 * of their own, no memory a peer may write or read is registered in it until our Hello (the
 * mailbox), and a resuming channel's rings only once the link is UP (its ChannelResume carries
 * the new keys). Before, every attempt shared the link's scope, and a stranger's QP admitted into
 * it could reach the rings of channels waiting to resume. */
static void channel_link_down__next_attempt__reaches_nothing_until_up(void **state)
{
	struct ct *c = *state;
	const void *old;
	struct chan *h;
	size_t from;
	PeerMsg *m;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	old = c->l->scope;
	assert_true(remote_regs_in(c, old) >= 2); /* the mailbox, the channel's rings */
	link_lost(c);
	tick_at(&c->t, util_now_ms() + 5000);
	assert_int_equal(c->l->phase, LINK_QPS);
	assert_ptr_not_equal(c->l->scope, old);
	for (uint32_t i = 0; i < mesh_link_qps(&c->t.m); i++)
		assert_ptr_equal(c->l->conns[i]->scope, c->l->scope);
	establish_qp(&c->t, c->l, 0);
	assert_int_equal(remote_regs_in(c, c->l->scope), 0);
	from = c->t.fx->n_posts;
	drive_to_up(&c->t, c->l);
	m = sent_resume(c, h, from);
	assert_ptr_equal(reg_of_rkey(c, m->channel_resume->rx_rkey)->scope, c->l->scope);
	assert_ptr_equal(reg_of_rkey(c, m->channel_resume->credit_rkey)->scope, c->l->scope);
	mesh_peer_msg_free(m);
	mt_finish(&c->t);
}

/* Both directions in flight when the link goes: each side tells the other where its receiving
 * half stands, and each sender writes again from there, at the same ring offsets and sequence
 * numbers; nothing is lost or duplicated, the application saw only a pause. */
static void channel_link_down__open_channel__resumes_and_rewrites_what_was_not_placed(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	PeerMsg *m;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 3000); /* chunks 0, 1, 2: 1024 + 1024 + 952 */
	app_kick(c, h);
	complete_write(c, h, write_post(c, h, from, false, 0));
	complete_write(c, h, write_post(c, h, from, false, 1));
	peer_credit_placed(c, h, 0, CHUNK); /* its meshd saw chunk 0 only */
	assert_true(ring_tx_cons(h) == CHUNK);
	/* The peer's chunks 0 and 2 arrived; 1 was lost with the link. */
	peer_data(c, h, 0, 0, 0, CHUNK);
	peer_data(c, h, 0, 2, 2 * CHUNK, 500);
	assert_true(ring_rx_prod(h) == CHUNK);

	link_lost(c);
	assert_string_equal(channel_state_name(chn(c, h)), "RESUMING");
	assert_int_equal(ring_state(h), MESH_STATE_OPEN); /* the application sees a pause, no error */
	assert_int_equal(c->t.m.chans->n_channels, 1);
	from = c->t.fx->n_posts;
	app_write(h, 500);
	app_kick(c, h);
	tick(&c->t);
	assert_int_equal(write_count(c, h, from, false), 0);

	link_back(c, 5000);
	m = sent_resume(c, h, from);
	assert_true(m->channel_resume->rx_bytes == CHUNK);
	assert_int_equal(m->channel_resume->rx_seq, 1);
	assert_true(m->channel_resume->rx_cons == 0);
	assert_false(m->channel_resume->eof_known);
	assert_true(m->channel_resume->rx_addr == (uintptr_t)h->our_rx);
	/* Registered again in the link's new attempt (a protection scope of its own, whose QPs could
	 * not reach the old registrations): new keys, of a registration through its QP. */
	assert_int_not_equal(m->channel_resume->rx_rkey, h->our_rx_rkey);
	assert_int_equal(reg_of_rkey(c, m->channel_resume->rx_rkey)->conn_id, conn_id(c->l->conns[0]));
	assert_true(m->channel_resume->credit_addr == (uintptr_t)h->our_credit);
	mesh_peer_msg_free(m);
	/* Nothing goes before the peer said where it stands. */
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_string_equal(channel_state_name(chn(c, h)), "RESUMING");
	complete_sends(c);

	from = c->t.fx->n_posts;
	peer_resume(c, h, CHUNK, 1, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	/* From byte 1024, chunk 1, on QP 0 again (striping starts afresh): 1024 + 1024 + 428. */
	assert_true(check_data_posts(c, h, from, 0, 1, CHUNK, CHUNK) == 2476);
	complete_data(c, h, from);
	check_peer_ring(h, 0, 3500);
	assert_true(chn(c, h)->rewritten_bytes == 3000 - CHUNK);
	assert_true(chn(c, h)->resumes == 1);
	assert_true(c->t.m.channel_resumes == 1);
	assert_true(c->t.m.link_flaps == 1);

	/* Our receiving half: the peer writes again from byte 1024, chunk 1; chunk 2 comes again too. */
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	peer_data(c, h, 0, 2, 2 * CHUNK, 500);
	assert_true(ring_rx_prod(h) == 2 * CHUNK + 500);
	app_read(h, 2 * CHUNK + 500);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	mt_finish(&c->t);
}

/* ---- rail failover ---------------------------------------------------------------------------- */

/* Two rails of 2 QPs each (QPs 0-1 rail 0, 2-3 rail 1), resuming on. */
static void ct_init_rails(struct ct *c)
{
	c->t.rails = 2;
	ct_init_resume(c, 2);
	assert_int_equal(c->l->rails_up, 3u);
	assert_true(c->l->features & MESH_FEAT_RAILS);
}

/* QP qp of the link reports a disconnect: its rail is lost, the link stays UP on the other. */
static void rail_lost(struct ct *c, uint32_t qp)
{
	struct xport_event ev = cm_event(XPORT_EV_DISCONNECTED, c->l->conns[qp], NULL, 0);

	ev.status = -ECONNRESET;
	deliver(&c->t, &ev);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
}

/* Every SEND since from went on QP qp. */
static void sends_only_on(struct ct *c, size_t from, uint32_t qp)
{
	unsigned cid = conn_id(c->l->conns[qp]);

	for (size_t i = from; i < c->t.fx->n_posts; i++)
		if (c->t.fx->posts[i].op == XPORT_OP_SEND && c->t.fx->posts[i].conn_id != cid)
			fail_msg("post %zu: a SEND on conn %u, expected QP %u (conn %u)", i, c->t.fx->posts[i].conn_id, qp, cid);
}

/* Rail 0 (control and the channel's QPs) fails under an open channel: the link stays UP, RailDown and
 * the channel's resume go on rail 1, the rings are registered again on rail 1's device (new keys),
 * and the chunks rail 0 lost are written again on rail 1's QPs at the same offsets, nothing else. */
static void channel_rail_down__opener__moves_to_other_rail_and_rewrites_what_was_not_placed(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct channel *ch;
	size_t from;
	PeerMsg *m;

	ct_init_rails(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	ch = chn(c, h);
	assert_int_equal(ch->rail, 0);
	from = c->t.fx->n_posts;
	app_write(h, 3000);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 3);
	complete_write(c, h, write_post(c, h, from, false, 0));
	peer_credit_placed(c, h, 0, CHUNK); /* the peer's meshd saw chunk 0; 1 and 2 die with rail 0 */

	from = c->t.fx->n_posts;
	rail_lost(c, 1);
	assert_int_equal(c->l->rails_up, 2u);
	assert_int_equal(c->l->ctl_rail, 1);
	assert_null(c->l->conns[0]);
	assert_int_equal(ch->rail, 1);
	assert_int_equal(ch->qp0, 2);
	assert_string_equal(channel_state_name(ch), "RESUMING");
	assert_int_equal(ring_state(h), MESH_STATE_OPEN); /* a pause, no error */
	sends_only_on(c, from, 2);
	m = sent_msg(c, from, PEER_MSG__BODY_RAIL_DOWN, 0);
	assert_non_null(m);
	assert_int_equal(m->rail_down->rail, 0);
	mesh_peer_msg_free(m);
	m = sent_resume(c, h, from);
	assert_int_equal(m->channel_resume->rail, 1);
	assert_true(m->channel_resume->rx_addr == (uintptr_t)h->our_rx);
	/* The same ring, registered again on rail 1's device: the new key, made with rail 1's QP. */
	assert_int_not_equal(m->channel_resume->rx_rkey, h->our_rx_rkey);
	assert_int_equal(m->channel_resume->rx_rkey, find_regs(c, RING).rx->rkey);
	assert_int_equal(find_regs(c, RING).rx->conn_id, conn_id(c->l->conns[2]));
	assert_int_equal(m->channel_resume->credit_rkey, find_regs(c, RING).cin->rkey);
	mesh_peer_msg_free(m);
	assert_int_equal(write_count(c, h, from, false), 0); /* nothing before the peer's resume */
	complete_sends(c);

	from = c->t.fx->n_posts;
	peer_resume_on(c, h, CHUNK, 1, 0, false, 1);
	assert_string_equal(channel_state_name(ch), "OPEN");
	assert_true(check_data_posts(c, h, from, 0, 1, CHUNK, CHUNK) == 3000 - CHUNK); /* on QPs 2, 3 */
	complete_data(c, h, from);
	check_peer_ring(h, 0, 3000);
	assert_true(ch->rail_moves == 1);
	/* Its kick moved to rail 1's thread with it (channel_ops.moved), and it is on rail 1's list
	 * alone: rail 1's thread polls and flags it, rail 0's no longer. */
	assert_int_equal(c->moved[ch->id], 1);
	assert_int_equal(c->moved_from[ch->id], 0);
	assert_null(c->t.m.chans->rail_channels[0]);
	assert_ptr_equal(c->t.m.chans->rail_channels[1], ch);
	assert_null(ch->rail_next);
	channel_set_polling(&c->t.m, 0, true);
	assert_int_equal(atomic_load(&h->app->ctrl->daemon_flags), 0);
	channel_set_polling(&c->t.m, 1, true);
	assert_int_equal(atomic_load(&h->app->ctrl->daemon_flags), MESH_DAEMON_POLLING);
	channel_set_polling(&c->t.m, 1, false);
	channel_set_polling(&c->t.m, 0, false);
	assert_true(ch->rewritten_bytes == 3000 - CHUNK);
	assert_true(c->t.m.rail_failovers == 1);
	assert_true(c->t.m.link_flaps == 0);
	mt_finish(&c->t);
}

/* The acceptor of a channel on a lost rail does not pick a rail: it waits for the opener's resume,
 * moves where that says, and answers with its own resume carrying the keys of the new rail. */
static void channel_rail_down__acceptor__follows_the_openers_rail(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct channel *ch;
	size_t from;
	PeerMsg *m;

	const char *why;

	ct_init_rails(c);
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ROOT, &why), 0);
	h = open_in(c, 50000, 7000, RING, 2, PEER_SLOT);
	ch = chn(c, h);
	from = c->t.fx->n_posts;
	app_write(h, 2000);
	app_kick(c, h);
	complete_write(c, h, write_post(c, h, from, false, 0));

	from = c->t.fx->n_posts;
	rail_lost(c, 0);
	assert_string_equal(channel_state_name(ch), "RESUMING");
	assert_int_equal(ch->rail, 0); /* not moved yet */
	assert_null(sent_msg(c, from, PEER_MSG__BODY_CHANNEL_RESUME, 0));
	complete_sends(c);

	from = c->t.fx->n_posts;
	peer_resume_on(c, h, CHUNK, 1, 0, false, 1);
	assert_int_equal(ch->rail, 1);
	m = sent_resume(c, h, from);
	assert_int_equal(m->channel_resume->rail, 1);
	assert_int_equal(m->channel_resume->rx_rkey, find_regs(c, RING).rx->rkey);
	assert_int_equal(find_regs(c, RING).rx->conn_id, conn_id(c->l->conns[2]));
	mesh_peer_msg_free(m);
	assert_string_equal(channel_state_name(ch), "OPEN");
	assert_true(check_data_posts(c, h, from, 0, 1, CHUNK, CHUNK) == 2000 - CHUNK);
	complete_data(c, h, from);
	check_peer_ring(h, 0, 2000);
	mt_finish(&c->t);
}

/* A rail lost during a resume (the link came back, our resume went, the peer's did not yet): the
 * channel moves, resumes again with the new rail, and ignores the peer's resume for the old one. */
static void channel_rail_down__during_a_resume__resumes_again_on_the_new_rail(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct channel *ch;
	size_t from;
	PeerMsg *m;

	ct_init_rails(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	ch = chn(c, h);
	from = c->t.fx->n_posts;
	app_write(h, 1500);
	app_kick(c, h);
	link_lost(c);
	link_back(c, 5000);
	assert_int_equal(c->l->rails_up, 3u);
	m = sent_resume(c, h, from);
	assert_int_equal(m->channel_resume->rail, 0);
	mesh_peer_msg_free(m);
	complete_sends(c);

	from = c->t.fx->n_posts;
	rail_lost(c, 0);
	/* Control moved to rail 1 with what the peer had not acked (our first resume, sent again), then
	 * the channel's new resume. */
	sends_only_on(c, from, 2);
	m = sent_resume(c, h, from);
	assert_int_equal(m->channel_resume->rail, 0);
	mesh_peer_msg_free(m);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_RESUME, 1);
	assert_non_null(m);
	assert_int_equal(m->channel_resume->rail, 1);
	mesh_peer_msg_free(m);
	complete_sends(c);
	/* The peer's resume of rail 0, sent before it heard: ignored, the channel still waits. */
	from = c->t.fx->n_posts;
	peer_resume_on(c, h, 0, 0, 0, false, 0);
	assert_string_equal(channel_state_name(ch), "RESUMING");
	assert_int_equal(write_count(c, h, from, false), 0);
	peer_resume_on(c, h, 0, 0, 0, false, 1);
	assert_string_equal(channel_state_name(ch), "OPEN");
	assert_true(check_data_posts(c, h, from, 0, 0, 0, CHUNK) == 1500);
	complete_data(c, h, from);
	check_peer_ring(h, 0, 1500);
	assert_true(ch->resumes == 1); /* the one interrupted by the rail's loss never completed */
	assert_true(ch->rail_moves == 1);
	mt_finish(&c->t);
}

/* A close under way when the channel's rail fails: the peer's CloseAck counts writes of ours whose
 * immediates died with the rail; the slot is freed all the same (nothing can land on it any more). */
static void channel_rail_down__close_under_way__freed_on_the_ack(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init_rails(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 1000);
	app_kick(c, h);
	complete_data(c, h, from);
	app_shut_wr(h);
	app_hangup(c, h);
	assert_true(chn(c, h)->close_sent);
	rail_lost(c, 1);
	assert_int_equal(c->t.m.chans->n_channels, 1);
	complete_sends(c);
	/* The peer counted 3 chunks and a credit it never saw (they died with rail 0). */
	c->peer_imms[h->slot][0] = 3;
	c->peer_imms[h->slot][1] = 1;
	peer_close_ack(c, h);
	assert_int_equal(c->t.m.chans->n_channels, 0);
	mt_finish(&c->t);
}

/* The link comes back to another meshd process (a restart: another boot epoch): the channel's state
 * is gone there, so it fails at once with its own error, and leaves the link. */
static void channel_link_up__peer_restarted__epeerrestart_at_once(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	uint32_t id;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	link_lost(c);
	assert_string_equal(channel_state_name(chn(c, h)), "RESUMING");
	c->t.peer_boot = 9999;
	from = c->t.fx->n_posts;
	link_back(c, 5000);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_RESUME), 0);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(h), -MESH_EPEERRESTART);
	assert_null(link_channel_of(c, h->slot));
	app_hangup(c, h);
	assert_null(channel_find(&c->t.m, id));
	mt_finish(&c->t);
}

/* ---- resuming: its timeout, its messages crossing others or hostile ----------------------------- */

/* The link stays DOWN past resume_timeout_ms: the channel fails with the timeout's own error. */
static void channel_tick__down_past_resume_timeout__eresumetimeo(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	uint32_t id;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	link_lost(c);
	tick_at(&c->t, util_now_ms() + RESUME_MS - 1000);
	assert_string_equal(channel_state_name(chn(c, h)), "RESUMING");
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	tick_at(&c->t, util_now_ms() + RESUME_MS + 1000);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(h), -MESH_ERESUMETIMEO);
	assert_non_null(strstr(chn(c, h)->why, "cluster.resume_timeout_ms"));
	app_hangup(c, h);
	assert_null(channel_find(&c->t.m, id));
	mt_finish(&c->t);
}

/* A peer that resumes at an offset we never sent breaks that channel (-EPROTO, told with a Close);
 * the link and the other channel go on. */
static void channel_on_message__resume_beyond_sent__eproto_others_resume(void **state)
{
	struct ct *c = *state;
	struct chan *bad, *good;
	size_t from;

	ct_init_resume(c, 2);
	bad = open_out(c, RING, 2, PEER_SLOT);
	good = open_out(c, RING, 2, PEER_SLOT + 1);
	app_write(bad, 100);
	app_kick(c, bad);
	link_lost(c);
	link_back(c, 5000);
	complete_sends(c);
	from = c->t.fx->n_posts;
	peer_resume(c, bad, 101, 1, 0, false);
	assert_true(ring_state(bad) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(bad), -EPROTO);
	assert_non_null(strstr(chn(c, bad)->why, "outside what was sent"));
	assert_int_equal(sent_close_reason(c, bad, from), -EPROTO);
	peer_resume(c, good, 0, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, good)), "OPEN");
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

/* A resume naming a slot we do not have: the peer's channel is refused with a Close. */
static void channel_on_message__resume_unknown_slot__refused_with_close(void **state)
{
	struct ct *c = *state;
	struct chan h = {.slot = 9, .peer_slot = 3, .size = RING};
	size_t from;
	PeerMsg *m;
	uint8_t ring[16];
	uint64_t credit[2 * MESH_CREDIT_SLOTS];

	ct_init_resume(c, 2);
	h.peer_rx = ring;
	h.peer_credit = credit;
	from = c->t.fx->n_posts;
	peer_resume(c, &h, 0, 0, 0, false);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_CLOSE, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_close->slot, 3);
	assert_int_equal(m->channel_close->reason, -ECONNRESET);
	mesh_peer_msg_free(m);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

/* The link goes again while a resume is half done (ours sent, the peer's not yet): the next UP
 * resumes it once. */
static void channel_link_down__during_resume__resumes_on_next_up(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	link_lost(c);
	link_back(c, 5000);
	complete_sends(c);
	link_lost(c);
	assert_string_equal(channel_state_name(chn(c, h)), "RESUMING");
	from = c->t.fx->n_posts;
	link_back(c, 10000);
	mesh_peer_msg_free(sent_resume(c, h, from));
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_true(chn(c, h)->resumes == 1);
	assert_true(c->t.m.link_flaps == 2);
	mt_finish(&c->t);
}

/* The application shuts down and closes while the channel waits: after the resume its last bytes,
 * the EOF and the Close still go, in that order. */
static void channel_on_lifeline__while_resuming__bytes_eof_close_after_resume(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	uint32_t id;
	PeerMsg *m;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	link_lost(c);
	app_write(h, 700);
	app_shut_wr(h);
	app_hangup(c, h);
	assert_non_null(channel_find(&c->t.m, id));
	link_back(c, 5000);
	complete_sends(c);
	from = c->t.fx->n_posts;
	peer_resume(c, h, 0, 0, 0, false);
	assert_int_equal(write_count(c, h, from, false), 1);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 1);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_EOF, 0);
	assert_true(m->channel_eof->total == 700);
	mesh_peer_msg_free(m);
	complete_data(c, h, from);
	assert_int_equal(sent_close_reason(c, h, from), 0);
	complete_sends(c);
	peer_close_ack(c, h);
	assert_null(channel_find(&c->t.m, id));
	mt_finish(&c->t);
}

/* The peer's first credit after its resume can overtake the resume (another rail's QP): its reader's
 * position never goes back for it, and nothing the application was given back is taken away. */
static void channel_on_message__credit_overtakes_resume__positions_never_go_back(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	app_write(h, 2 * CHUNK);
	app_kick(c, h);
	complete_data(c, h, 0);
	peer_credit_placed(c, h, 0, 2 * CHUNK);
	assert_true(ring_tx_cons(h) == 2 * CHUNK);
	link_lost(c);
	link_back(c, 5000);
	complete_sends(c);
	peer_credit_placed(c, h, CHUNK, 2 * CHUNK); /* its reader went on meanwhile */
	peer_resume(c, h, 2 * CHUNK, 2, 0, false);  /* says where it stood when it sent this */
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_true(chn(c, h)->peer_cons == CHUNK);
	assert_true(ring_tx_cons(h) == 2 * CHUNK);
	mt_finish(&c->t);
}

/* Our resume is refused (the peer timed the channel out meanwhile): its Close ends the wait, the
 * close completes at once, and the slot is free when the application closes. */
static void channel_on_message__close_while_resuming__acked_and_freed(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	uint32_t id;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	link_lost(c);
	link_back(c, 5000);
	complete_sends(c);
	from = c->t.fx->n_posts;
	peer_close_n(c, h, -ECONNRESET, 0, 0);
	assert_int_equal(ring_error(h), -ECONNRESET);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE_ACK), 1);
	complete_sends(c);
	app_hangup(c, h);
	assert_null(channel_find(&c->t.m, id));
	mt_finish(&c->t);
}

/* ---- channels that end at once ------------------------------------------------------------------ */

/* A resumable channel open when the peer's Goodbye with reason comes: the link goes DOWN and the
 * channel ends at once with want_err for its application, waiting for nothing. */
static void goodbye_ends_channel(struct ct *c, uint32_t reason, int want_err)
{
	struct chan *h;
	PeerMsg m = PEER_MSG__INIT;
	Goodbye g = GOODBYE__INIT;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	g.reason = reason;
	m.body_case = PEER_MSG__BODY_GOODBYE;
	m.goodbye = &g;
	peer_msg(c, &m);
	assert_int_equal(link_state(c->l), LINK_STATE_DOWN_);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(h), want_err);
	assert_false(chn(c, h)->resuming);
	app_hangup(c, h);
	mt_finish(&c->t);
}

/* A Goodbye (the peer meshd stops) leaves nothing to wait for: channels break at once. */
static void channel_link_down__goodbye__econnreset_at_once(void **state)
{
	goodbye_ends_channel(*state, MESH_ESHUTDOWN, -ECONNRESET);
}

/* The peer removed this node from its configuration (a reload there): even a resumable channel
 * ends at once, and its application hears the removal, not a reset. */
static void channel_goodbye__peer_removed_us__eremoved_to_the_app_no_resume(void **state)
{
	goodbye_ends_channel(*state, MESH_EREMOVED, -MESH_EREMOVED);
}

/* A QP refuses the data write (its connection died; the link's own event may come later in the
 * batch): the application hears the reset a lost link means, not the provider's errno. */
/* Resuming off: a QP that refuses a data write ends the channel as a lost link would. */
static void channel_post_data__qp_refuses_resuming_off__econnreset_to_the_app(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	c->t.fx->fail_post_write.err = -ENOTCONN;
	app_write(h, 1000);
	app_kick(c, h);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(h), -ECONNRESET);
	assert_string_equal(channel_state_name(chn(c, h)), "ERROR");
	app_hangup(c, h);
	mt_finish(&c->t);
}

/* Resuming on: a refused data write is a connection going down whose event comes later (a blip
 * the channel lives through). The channel stays OPEN and posts nothing more; when the link goes
 * DOWN and comes back, it resumes and every byte arrives once. */
static void channel_post_data__qp_refuses__channel_resumes_after_the_links_event(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	c->t.fx->fail_post_write.err = -ENOTCONN;
	app_write(h, 3000);
	app_kick(c, h);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_int_equal(write_count(c, h, from, false), 0);
	/* Later kicks and ticks post nothing on the refusing QPs, and nothing breaks. */
	app_write(h, 500);
	app_kick(c, h);
	tick(&c->t);
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_false(ring_state(h) & MESH_STATE_ERROR);

	link_lost(c);
	assert_string_equal(channel_state_name(chn(c, h)), "RESUMING");
	link_back(c, 5000);
	complete_sends(c);
	from = c->t.fx->n_posts;
	peer_resume(c, h, 0, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_true(check_data_posts(c, h, from, 0, 0, 0, CHUNK) == 3500);
	complete_data(c, h, from);
	check_peer_ring(h, 0, 3500);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	app_hangup(c, h);
	mt_finish(&c->t);
}

/* Resuming on, but the refusing QP's link never goes down: the channel does not wait forever. */
static void channel_tick__qp_refused_and_link_stays_up__econnreset_naming_it(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init_resume(c, 2);
	c->l->features &= ~MESH_FEAT_KEEPALIVE; /* the link's own timeout stays out of it */
	h = open_out(c, RING, 2, PEER_SLOT);
	c->t.fx->fail_post_write.err = -ENOTCONN;
	app_write(h, 1000);
	app_kick(c, h);
	tick_at(&c->t, util_now_ms() + c->t.cfg.keepalive_timeout_ms);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	tick_at(&c->t, util_now_ms() + 2 * (uint64_t)c->t.cfg.keepalive_timeout_ms + 1000);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(h), -ECONNRESET);
	assert_non_null(strstr(chn(c, h)->why, "refused a write"));
	app_hangup(c, h);
	mt_finish(&c->t);
}

static void channel_link_down__open_channel__econnreset_freed_when_app_closes(void **state)
{
	struct ct *c = *state;
	struct xport_event ev;
	struct chan *h;
	uint32_t id;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	app_write(h, 1000);
	app_kick(c, h);
	ev = cm_event(XPORT_EV_DISCONNECTED, c->l->conns[1], NULL, 0);
	ev.status = -ECONNRESET;
	deliver(&c->t, &ev);
	assert_int_equal(link_state(c->l), LINK_STATE_DOWN_);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(h), -ECONNRESET);
	assert_string_equal(channel_state_name(chn(c, h)), "ERROR");
	/* The application still maps the ring: the channel waits for it, and its kicks move nothing. */
	app_write(h, 100);
	app_kick(c, h);
	tick(&c->t);
	assert_int_equal(c->t.m.chans->n_channels, 1);
	assert_int_equal(ring_error(h), -ECONNRESET);
	app_hangup(c, h);
	assert_null(channel_find(&c->t.m, id));
	assert_int_equal(c->t.m.chans->n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 0);
	assert_int_equal(c->t.fx->live_conns, 0);
	assert_true(c->watch_del[id] >= 1);
	mt_finish(&c->t);
}

static void channel_link_down__opening_channel__client_told_econnreset(void **state)
{
	struct ct *c = *state;
	struct xport_event ev;

	ct_init(c, 2);
	connect_out(c, 80, RING, 2, PEER_SLOT);
	ev = cm_event(XPORT_EV_DISCONNECTED, c->l->conns[0], NULL, 0);
	ev.status = -ECONNRESET;
	deliver(&c->t, &ev);
	assert_int_equal(c->n_apps, 1);
	assert_int_equal(c->apps[0].client_fd, CLIENT_FD);
	assert_int_equal(c->apps[0].status, -ECONNRESET);
	assert_int_equal(c->t.m.chans->n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 0);
	mt_finish(&c->t);
}

static const struct CMUnitTest tests[] = {
	T(channel_link_down__open_channel__resumes_and_rewrites_what_was_not_placed),
	T(channel_link_down__next_attempt__reaches_nothing_until_up),
	T(channel_rail_down__opener__moves_to_other_rail_and_rewrites_what_was_not_placed),
	T(channel_rail_down__acceptor__follows_the_openers_rail),
	T(channel_rail_down__during_a_resume__resumes_again_on_the_new_rail),
	T(channel_rail_down__close_under_way__freed_on_the_ack),
	T(channel_link_up__peer_restarted__epeerrestart_at_once),
	T(channel_tick__down_past_resume_timeout__eresumetimeo),
	T(channel_on_message__resume_beyond_sent__eproto_others_resume),
	T(channel_on_message__resume_unknown_slot__refused_with_close),
	T(channel_link_down__during_resume__resumes_on_next_up),
	T(channel_on_lifeline__while_resuming__bytes_eof_close_after_resume),
	T(channel_link_down__goodbye__econnreset_at_once),
	T(channel_on_message__close_while_resuming__acked_and_freed),
	T(channel_on_message__credit_overtakes_resume__positions_never_go_back),
	T(channel_goodbye__peer_removed_us__eremoved_to_the_app_no_resume),
	T(channel_post_data__qp_refuses_resuming_off__econnreset_to_the_app),
	T(channel_post_data__qp_refuses__channel_resumes_after_the_links_event),
	T(channel_tick__qp_refused_and_link_stays_up__econnreset_naming_it),
	T(channel_link_down__open_channel__econnreset_freed_when_app_closes),
	T(channel_link_down__opening_channel__client_told_econnreset),
};

UNIT_MAIN("channel_resume", tests, ct_group_setup, NULL)
