/*
 * What the peer meshd sends for channels (node/meshd/channel_peer.c): a ChannelOpen to a listener,
 * without one, beyond the peer's share or with more QPs than the link; its EOF, Close and CloseAck,
 * also when they overtake the data and credits they count; data before its Accept or after its
 * EOF.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "channel_harness.h"
#include "unit_main.h"

/* ---- ChannelOpen -------------------------------------------------------------------------------- */

static void channel_on_message__open_to_listener__delivered_and_accepted(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;
	struct ch_regs r;
	struct channel *ch;
	struct fake_post *p;
	struct chan *h;
	struct app *a;
	size_t from;

	ct_init(c, 3);
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ROOT, &why), 0);
	h = open_in(c, 50000, 7000, RING, 2, PEER_SLOT);
	r = find_regs(c, RING);
	/* The Accept named the ring and credit word the peer may write, with their keys. */
	assert_ptr_equal(h->our_rx, r.rx->addr);
	assert_int_equal(h->our_rx_rkey, r.rx->rkey);
	assert_ptr_equal(h->our_credit, r.cin->addr);
	assert_int_equal(h->our_credit_rkey, r.cin->rkey);
	a = h->app;
	assert_int_equal(a->client_fd, LISTEN_FD);
	assert_int_equal(a->channel_id, h->id);
	assert_true(a->ring_size == RING);
	assert_int_equal(a->qps, 2);
	assert_int_equal(a->local_port, 7000);
	assert_int_equal(a->peer_port, 50000);
	assert_int_equal(a->ctrl->peer_node, PEER);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	ch = chn(c, h);
	assert_false(ch->opener);
	assert_int_equal(ch->peer_slot, PEER_SLOT);
	assert_string_equal(channel_state_name(ch), "OPEN");
	/* It sends as the opener asked: over 2 QPs, into the opener's ring, naming the opener's slot. */
	from = c->t.fx->n_posts;
	app_write(h, 2 * CHUNK);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 2);
	for (size_t i = 0; i < 2; i++) {
		p = write_post(c, h, from, false, i);
		assert_int_equal(p->conn_id, conn_id(c->l->conns[i]));
		assert_true(p->raddr == (uintptr_t)h->peer_rx + i * CHUNK);
		assert_int_equal(p->imm, MESH_IMM(0, PEER_SLOT, i));
	}
	mt_finish(&c->t);
}

/* A ChannelOpen meshd refuses: to a port nobody listens on, to a listener whose client cannot take
 * the channel (gone: deliver_err), with more QPs than the link has. The peer hears the reason in a
 * Reject naming its slot, never an Accept; nothing of the channel is left, the link stays UP.
 * registers: the refusal came after the channel's rings were registered (and they are freed);
 * otherwise nothing was registered at all. */
struct refused_open {
	bool listen; /* a listener on port 7000 */
	uint16_t dst_port;
	uint32_t qps;
	int deliver_err;
	bool registers;
	int reason;
};

static void expect_open_refused(struct ct *c, struct refused_open o)
{
	const char *why = NULL;
	size_t from, regs;
	struct chan *h;
	PeerMsg *m;

	ct_init(c, 2);
	if (o.listen)
		assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ROOT, &why), 0);
	h = chan_new(c, RING, PEER_SLOT);
	from = c->t.fx->n_posts;
	regs = c->t.fx->n_regs;
	c->deliver_err = o.deliver_err;
	peer_open(c, h, 50000, o.dst_port, o.qps);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_REJECT, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_reject->slot, PEER_SLOT);
	assert_int_equal(m->channel_reject->reason, o.reason);
	mesh_peer_msg_free(m);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_ACCEPT), 0);
	if (!o.registers)
		assert_int_equal(c->t.fx->n_regs, regs);
	assert_int_equal(c->t.fx->live_mrs, 2);
	assert_int_equal(c->t.m.chans->n_channels, 0);
	assert_int_equal(c->n_apps, 0);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

static void channel_on_message__open_without_listener__rejected_econnrefused(void **state)
{
	expect_open_refused(*state, (struct refused_open){.dst_port = 7001, .qps = 2, .reason = -ECONNREFUSED});
}

static void channel_on_message__listener_cannot_take_it__rejected_and_freed(void **state)
{
	expect_open_refused(*state, (struct refused_open){.listen = true, .dst_port = 7000, .qps = 2,
							  .deliver_err = -EPIPE, .registers = true,
							  .reason = -ECONNREFUSED});
}

static void channel_on_message__open_with_more_qps_than_link__rejected_einval(void **state)
{
	expect_open_refused(*state, (struct refused_open){.listen = true, .dst_port = 7000, .qps = 3,
							  .reason = -EINVAL});
}

/* A peer may have opened only so many channels, and so much ring memory, to us at once: one more is
 * refused with -EBUSY (meshd would pin whatever a peer asks for); room again once one closes. */
static void channel_on_message__open_beyond_the_peers_share__rejected_ebusy(void **state)
{
	struct ct *c = *state;
	const char *why;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	c->t.cfg.max_channels_per_link = 2;
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ROOT, &why), 0);
	open_in(c, 50000, 7000, RING, 2, PEER_SLOT);
	open_in(c, 50001, 7000, RING, 2, PEER_SLOT + 1);
	h = chan_new(c, RING, PEER_SLOT + 2);
	from = c->t.fx->n_posts;
	peer_open(c, h, 50002, 7000, 2);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_ACCEPT), 0);
	assert_int_equal(sent_reject_reason(c, from), -EBUSY);
	assert_int_equal(c->t.m.chans->n_channels, 2);

	/* The memory share, 1 MiB: the two small channels take 16 KiB (both directions), one with
	 * 256 KiB rings 512 KiB more; a second such one would pass the share. */
	c->t.cfg.max_channels_per_link = 100;
	c->t.cfg.max_ring_mib_per_link = 1;
	open_in(c, 50003, 7000, 256u << 10, 2, PEER_SLOT + 3);
	h = chan_new(c, 256u << 10, PEER_SLOT + 4);
	from = c->t.fx->n_posts;
	peer_open(c, h, 50004, 7000, 2);
	assert_int_equal(sent_reject_reason(c, from), -EBUSY);
	assert_int_equal(c->t.m.chans->n_channels, 3);
	mt_finish(&c->t);
}

/* ---- the peer's EOF, Close and CloseAck --------------------------------------------------------- */

static void channel_on_message__peer_eof__flag_once_all_bytes_arrived(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 0, 0, 0, CHUNK);
	/* The EOF overtook the second chunk (on another QP). */
	peer_eof(c, h, 2 * CHUNK);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_string_equal(channel_state_name(chn(c, h)), "HALF_CLOSED");
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	assert_true(ring_rx_prod(h) == 2 * CHUNK);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN | MESH_STATE_PEER_EOF);
	app_read(h, 2 * CHUNK);
	mt_finish(&c->t);
}

static void channel_on_message__eof_below_received__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 0, 0, 0, CHUNK);
	peer_eof(c, h, CHUNK - 1);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_on_imm__data_after_eof__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 0, 0, 0, CHUNK);
	peer_eof(c, h, CHUNK);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN | MESH_STATE_PEER_EOF);
	peer_data(c, h, 1, 1, CHUNK, 10);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_on_message__peer_close__ack_once_our_writes_completed(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	PeerMsg *m;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 2 * CHUNK);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 2);
	peer_credit_placed(c, h, 0, 2 * CHUNK);
	peer_eof(c, h, 0);
	peer_close(c, h, 0);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE_ACK), 0);
	complete_write(c, h, write_post(c, h, from, false, 1));
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE_ACK), 0);
	complete_write(c, h, write_post(c, h, from, false, 0));
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE_ACK), 1);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_CLOSE_ACK, 0);
	assert_int_equal(m->channel_close_ack->slot, PEER_SLOT);
	mesh_peer_msg_free(m);
	/* Answered, not closed a second time by us; the application sees the end of the stream. */
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE), 0);
	assert_true(ring_tx_cons(h) == 2 * CHUNK);
	assert_true(ring_state(h) & MESH_STATE_PEER_EOF);
	assert_int_equal(c->t.m.chans->n_channels, 1);
	app_hangup(c, h);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE), 0);
	assert_int_equal(c->t.m.chans->n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 2);
	mt_finish(&c->t);
}

/* Close and CloseAck ride QP 0, the peer's data and credits other QPs: the peer's Close may be seen
 * before its last chunk. The slot stays ours until every immediate the Close counted has landed;
 * before, the late chunk landed on the next channel that took the slot, as that channel's data. */
static void channel_on_message__close_overtakes_data__slot_kept_until_counted_chunks_land(void **state)
{
	struct ct *c = *state;
	struct chan *h, *h2;
	uint32_t id;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	peer_eof(c, h, CHUNK);
	peer_close_n(c, h, 0, 1, 0); /* one chunk sent, still in our CQ of QP 1 */
	complete_sends(c);
	app_hangup(c, h);
	assert_non_null(channel_find(&c->t.m, id));
	assert_int_equal(c->t.m.chans->n_channels, 1);
	/* A new channel cannot take the slot meanwhile. */
	h2 = open_out(c, RING, 2, PEER_SLOT + 1);
	assert_int_not_equal(h2->slot, h->slot);
	peer_data(c, h, 1, 0, 0, CHUNK);
	assert_null(channel_find(&c->t.m, id));
	assert_int_equal(c->t.m.chans->n_channels, 1);
	assert_true(ring_rx_prod(h2) == 0);
	assert_int_equal(ring_state(h2), MESH_STATE_OPEN);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

/* The same for the CloseAck that answers our Close: it counts the peer's credit write, which is
 * seen after it. */
static void channel_on_message__close_ack_overtakes_credit__freed_once_it_lands(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	uint32_t id;
	size_t from;
	PeerMsg m = PEER_MSG__INIT;
	ChannelCloseAck a = CHANNEL_CLOSE_ACK__INIT;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	from = c->t.fx->n_posts;
	app_shut_wr(h);
	app_hangup(c, h);
	assert_int_equal(sent_close_reason(c, h, from), 0);
	complete_sends(c);
	a.slot = h->slot;
	a.chunks = 0;
	a.credits = 1;
	m.body_case = PEER_MSG__BODY_CHANNEL_CLOSE_ACK;
	m.channel_close_ack = &a;
	peer_msg(c, &m);
	assert_non_null(channel_find(&c->t.m, id));
	peer_credit(c, h, 0);
	assert_null(channel_find(&c->t.m, id));
	assert_int_equal(c->t.fx->live_mrs, 2);
	mt_finish(&c->t);
}

/* More immediates than the peer's Close counted: the peer broke the protocol; that channel breaks
 * (-EPROTO), the link goes on. */
static void channel_on_imm__more_than_close_counted__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_close_n(c, h, 0, 0, 0);
	complete_sends(c);
	peer_data(c, h, 1, 0, 0, CHUNK);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(ring_error(h), -EPROTO);
	assert_string_equal(chn(c, h)->why, "peer wrote after its close: 1 chunks and 0 credits, it counted 0 and 0");
	assert_true(ring_rx_prod(h) == 0);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

/* ---- ordering across QPs ------------------------------------------------------------------------ */

/* The acceptor writes as soon as its application has the channel: its chunk 1 goes on QP 1 while
 * its Accept and chunk 0 go on QP 0, and our completions of different QPs come from different CQs
 * in any order. A chunk that overtakes the Accept must not be lost. */
static void channel_on_imm__data_before_accept__kept_until_accept(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = connect_out(c, 80, RING, 2, PEER_SLOT);
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	accept_out(c, h);
	peer_data(c, h, 0, 0, 0, CHUNK);
	if (ring_rx_prod(h) != 2 * CHUNK)
		fail_msg("rx_prod %llu after chunks 0 and 1 of %u bytes: the chunk that overtook the Accept was lost",
			 (unsigned long long)ring_rx_prod(h), CHUNK);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	app_read(h, 2 * CHUNK);
	mt_finish(&c->t);
}

/* After the peer's Close (and our CloseAck) its ring is gone: bytes the application publishes now
 * can never be delivered, and it must hear so rather than wait for tx_cons forever. */
static void channel_on_kick__write_after_peer_close__application_told(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_eof(c, h, 0);
	from = c->t.fx->n_posts;
	peer_close(c, h, 0);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE_ACK), 1);
	app_write(h, 100);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	if (!(ring_state(h) & MESH_STATE_ERROR) || ring_error(h) >= 0)
		fail_msg("state 0x%x error %d after 100 bytes that can never be sent: the writer waits forever",
			 ring_state(h), ring_error(h));
	mt_finish(&c->t);
}

static const struct CMUnitTest tests[] = {
	T(channel_on_message__open_to_listener__delivered_and_accepted),
	T(channel_on_message__open_without_listener__rejected_econnrefused),
	T(channel_on_message__listener_cannot_take_it__rejected_and_freed),
	T(channel_on_message__open_with_more_qps_than_link__rejected_einval),
	T(channel_on_message__open_beyond_the_peers_share__rejected_ebusy),
	T(channel_on_message__close_overtakes_data__slot_kept_until_counted_chunks_land),
	T(channel_on_message__close_ack_overtakes_credit__freed_once_it_lands),
	T(channel_on_imm__more_than_close_counted__channel_error_eproto),
	T(channel_on_message__peer_eof__flag_once_all_bytes_arrived),
	T(channel_on_message__eof_below_received__channel_error_eproto),
	T(channel_on_imm__data_after_eof__channel_error_eproto),
	T(channel_on_message__peer_close__ack_once_our_writes_completed),
	T(channel_on_imm__data_before_accept__kept_until_accept),
	T(channel_on_kick__write_after_peer_close__application_told),
};

UNIT_MAIN("channel_peer", tests, ct_group_setup, NULL)
