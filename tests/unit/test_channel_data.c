/*
 * The data path of a channel (node/meshd/channel.c posting, channel_peer.c completions and
 * immediates): our application's bytes striped over the channel's QPs in chunks, within the
 * reader's credit; the peer's chunks taken in sequence whatever the QP, and every hostile immediate
 * (a duplicate, out of the window, too long, beyond the reader's credit) breaking the channel
 * alone; the credits we write back; polling; and a rail's thread taking a channel's events under
 * its rail's lock alone (the fast path). Direct receive and pair hints: test_channel_direct.c.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "channel_harness.h"
#include "unit_main.h"

/* ---- the data path: sending -------------------------------------------------------------------- */

static void channel_on_kick__app_wrote__chunks_striped_round_robin(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 3);
	h = open_out(c, RING, 3, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 3000);
	/* Published, not kicked: meshd does not look. */
	assert_int_equal(write_count(c, h, from, false), 0);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 3); /* 1024 + 1024 + 952 over QPs 0, 1, 2 */
	assert_true(check_data_posts(c, h, from, 0, 0, 0, CHUNK) == 3000);
	assert_int_equal(chn(c, h)->inflight, 3);
	complete_data(c, h, from);
	/* Written is not reusable yet: only what the peer's meshd says it placed (lost with the link,
	 * a written chunk is written again from this ring). */
	assert_true(ring_tx_cons(h) == 0);
	peer_credit_placed(c, h, 0, 3000);
	assert_true(ring_tx_cons(h) == 3000);
	check_peer_ring(h, 0, 3000);
	assert_true(chn(c, h)->tx_bytes == 3000);
	assert_true(chn(c, h)->tx_chunks == 3);

	/* Around the ring's end: 3000..4024, 4024..4096, then 4096.. at offset 0; QPs and seqs go on. */
	peer_credit(c, h, 3000);
	from = c->t.fx->n_posts;
	app_write(h, 2000);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 3);
	assert_true(check_data_posts(c, h, from, 0, 3, 3000, CHUNK) == 2000);
	assert_int_equal(write_post(c, h, from, false, 1)->len, RING - 4024);
	complete_data(c, h, from);
	peer_credit_placed(c, h, 3000, 5000);
	assert_true(ring_tx_cons(h) == 5000);
	check_peer_ring(h, 5000 - RING, 5000);
	mt_finish(&c->t);
}

/* A ring of four chunks or more: chunks of CH_CHUNK_MAX; a smaller one: of a quarter of it. */
static void channel_on_kick__large_ring__chunks_of_chunk_max(void **state)
{
	struct ct *c = *state;
	const uint64_t size = 8 * (uint64_t)CH_CHUNK_MAX;
	const uint32_t n = 3 * CH_CHUNK_MAX + 3392;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, size, 2, PEER_SLOT);
	assert_int_equal(chn(c, h)->chunk, CH_CHUNK_MAX);
	from = c->t.fx->n_posts;
	app_write(h, n);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 4);
	assert_true(check_data_posts(c, h, from, 0, 0, 0, CH_CHUNK_MAX) == n);
	for (size_t i = 0; i < 3; i++)
		assert_int_equal(write_post(c, h, from, false, i)->len, CH_CHUNK_MAX);
	complete_data(c, h, from);
	check_peer_ring(h, 0, n);
	mt_finish(&c->t);
}

static void channel_open__ring_under_four_chunks__chunk_of_a_quarter(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, 2 * (uint64_t)CH_CHUNK_MAX, 2, PEER_SLOT);
	assert_int_equal(chn(c, h)->chunk, CH_CHUNK_MAX / 2);
	mt_finish(&c->t);
}

static void channel_on_kick__peer_credit_exhausted__stops_exactly_at_credit(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, RING);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 4);
	complete_data(c, h, from);
	peer_credit_placed(c, h, 0, RING);
	assert_true(ring_tx_cons(h) == RING);
	/* A whole ring the reader has not consumed: the sender waits for it (once counted). */
	assert_true(chn(c, h)->credit_stalls == 1);

	/* The ring is free again, but the peer's reader has not consumed anything: nothing may go. */
	from = c->t.fx->n_posts;
	app_write(h, 1500);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_true(chn(c, h)->credit_stalls == 1);
	app_kick(c, h);
	tick(&c->t);
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_true(chn(c, h)->credit_stalls == 1);

	/* 1000 bytes of credit: exactly 1000 bytes go; a ring is still unconsumed: the same wait. */
	peer_credit(c, h, 1000);
	assert_int_equal(write_count(c, h, from, false), 1);
	assert_true(check_data_posts(c, h, from, 0, 4, RING, CHUNK) == 1000);
	assert_true(chn(c, h)->credit_stalls == 1);

	/* Everything credited: the rest. */
	peer_credit(c, h, RING);
	assert_true(check_data_posts(c, h, from, 0, 4, RING, CHUNK) == 1500);
	complete_data(c, h, from);
	peer_credit_placed(c, h, RING, RING + 1500);
	assert_true(ring_tx_cons(h) == RING + 1500);
	check_peer_ring(h, 1500, RING + 1500);
	mt_finish(&c->t);
}

static void channel_on_completion__out_of_order__tx_cons_over_completed_prefix(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 3);
	h = open_out(c, RING, 3, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 3000);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 3);
	/* The peer's meshd saw all of it placed (its immediates can beat our completions). */
	peer_credit_placed(c, h, 0, 3000);
	complete_write(c, h, write_post(c, h, from, false, 2));
	assert_true(ring_tx_cons(h) == 0);
	assert_int_equal(chn(c, h)->inflight, 2);
	complete_write(c, h, write_post(c, h, from, false, 0));
	assert_true(ring_tx_cons(h) == CHUNK);
	complete_write(c, h, write_post(c, h, from, false, 1));
	assert_true(ring_tx_cons(h) == 3000);
	assert_int_equal(chn(c, h)->inflight, 0);
	mt_finish(&c->t);
}

static void channel_on_imm__credit_beyond_sent__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 1000);
	app_kick(c, h);
	complete_data(c, h, from);
	from = c->t.fx->n_posts;
	peer_credit(c, h, 1001);
	assert_int_equal(sent_close_reason(c, h, from), -EPROTO);
	app_write(h, 100);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_on_imm__credit_going_back__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 2000);
	app_kick(c, h);
	complete_data(c, h, from);
	peer_credit(c, h, 1500);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	peer_credit(c, h, 1499);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

/* The peer's next credit write may land while we read the words of the last one: an RDMA WRITE's
 * bytes are placed in no promised order, so one pair of words could be read half old, half new
 * (seen in the VM under 12 streams, twice: "peer placed 52137984 bytes, outside [52139008,
 * 52140032]"). Each credit has its slot: the one the immediate names is whole, whatever the next
 * write is doing to its own; and a placed position behind its own reader is the peer's error. */
static void channel_on_imm__credit_slots__next_write_landing_is_not_read(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct channel *ch;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	ch = chn(c, h);
	from = c->t.fx->n_posts;
	app_write(h, 3000);
	app_kick(c, h);
	complete_data(c, h, from);
	/* Credit 0 whole in slot 0; credit 1 half landed in slot 1 (its reader, not yet its placed). */
	h->our_credit[0] = 1500;
	h->our_credit[1] = 1800;
	h->our_credit[2] = 2500;
	h->our_credit[3] = 0;
	peer_imm(c, 0, MESH_IMM(1, h->slot, 0), MESH_CREDIT_LEN);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_true(ch->peer_cons == 1500);
	assert_true(ch->peer_placed == 1800);
	/* Credit 1 lands whole, its immediate follows. */
	h->our_credit[3] = 2600;
	peer_imm(c, 0, MESH_IMM(1, h->slot, 1), MESH_CREDIT_LEN);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_true(ch->peer_cons == 2500);
	assert_true(ch->peer_placed == 2600);
	/* Placed behind its own reader: nobody's torn words, the peer's error. */
	peer_credit_placed(c, h, 2700, 2650);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

/* ---- the data path: receiving ------------------------------------------------------------------ */

static void channel_on_imm__chunks_out_of_order__rx_prod_when_contiguous(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 1, 2, 2 * CHUNK, 500);
	assert_true(ring_rx_prod(h) == 0);
	peer_data(c, h, 0, 0, 0, CHUNK);
	assert_true(ring_rx_prod(h) == CHUNK);
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	assert_true(ring_rx_prod(h) == 2 * CHUNK + 500);
	assert_true(chn(c, h)->rx_chunks == 3);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	app_read(h, 2 * CHUNK + 500);
	mt_finish(&c->t);
}

static void channel_on_imm__duplicate_pending_seq__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	expect_broken(c, h, -EPROTO);
	assert_true(ring_rx_prod(h) == 0);
	mt_finish(&c->t);
}

static void channel_on_imm__duplicate_delivered_seq__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 0, 0, 0, CHUNK);
	peer_data(c, h, 0, 0, 0, CHUNK);
	expect_broken(c, h, -EPROTO);
	assert_true(ring_rx_prod(h) == CHUNK);
	mt_finish(&c->t);
}

static void channel_on_imm__seq_outside_window__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	uint16_t w;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	w = (uint16_t)chn(c, h)->rx_window;
	peer_data(c, h, 1, (uint16_t)(w - 1), 0, 10); /* the last of the window: kept */
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	peer_imm(c, 1, MESH_IMM(0, h->slot, w), 10);
	expect_broken(c, h, -EPROTO);
	assert_true(ring_rx_prod(h) == 0);
	mt_finish(&c->t);
}

/* Each QP has its own CQ and meshd drains one after the other, while the sender's window of
 * CH_WINDOW chunks waits only for its NIC's acknowledgements: a receiver that has not yet looked at
 * QP 0's CQ sees QP 1's chunks far past rx_seq. Here 193 of QP 1's chunks (seqs 1, 3, ... 385: what
 * QP 0's 64 receives and the sender's window allow) before chunk 0. None may break the channel. */
static void channel_on_imm__one_qp_lags_past_the_senders_window__kept_in_order(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	const uint32_t len = 8, last = 385;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	assert_true(chn(c, h)->rx_window > last);
	for (uint32_t s = 1; s <= last; s += 2)
		peer_data(c, h, 1, (uint16_t)s, (uint64_t)s * len, len);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_true(ring_rx_prod(h) == 0);
	for (uint32_t s = 0; s <= last; s += 2) {
		peer_data(c, h, 0, (uint16_t)s, (uint64_t)s * len, len);
		assert_true(ring_rx_prod(h) == (uint64_t)(s + 2) * len);
	}
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_true(chn(c, h)->rx_chunks == last + 1);
	app_read(h, (uint64_t)(last + 1) * len);
	mt_finish(&c->t);
}

/* The window covers the worst case of the QP count: at most 8192 (16 QPs), under half of the
 * 16-bit sequence space, so an old chunk is never taken for a new one. */
static void channel_rx_window__every_qp_count__covers_lag_and_below_half_seq_space(void **state)
{
	(void)state;
	for (uint32_t q = 1; q <= MESH_QPS_PER_LINK_MAX; q++) {
		uint32_t w = channel_rx_window(q);

		assert_true(w >= CH_WINDOW + q * (LINK_DATA_RECVS + 1));
		assert_true(w <= 32768);
		assert_int_equal(w & (w - 1), 0);
	}
}

static void channel_on_imm__zero_length__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_imm(c, 0, MESH_IMM(0, h->slot, 0), 0);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_on_imm__longer_than_ring__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_imm(c, 1, MESH_IMM(0, h->slot, 0), RING + 1);
	expect_broken(c, h, -EPROTO);
	assert_true(ring_rx_prod(h) == 0);
	mt_finish(&c->t);
}

static void channel_on_imm__beyond_reader_credit__channel_error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	for (uint16_t s = 0; s < 4; s++)
		peer_data(c, h, s % 2, s, s * CHUNK, CHUNK);
	assert_true(ring_rx_prod(h) == RING);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	/* The reader consumed nothing: a fifth chunk overruns it. */
	peer_imm(c, 0, MESH_IMM(0, h->slot, 4), CHUNK);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

/* ring.h: libmesh's window is rx_cons <= rx_prod <= rx_cons + ring_size; meshd must not publish the
 * chunk that broke it. */
static void channel_on_imm__beyond_reader_credit__rx_prod_stays_in_window(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	for (uint16_t s = 0; s < 4; s++)
		peer_data(c, h, s % 2, s, s * CHUNK, CHUNK);
	peer_imm(c, 0, MESH_IMM(0, h->slot, 4), CHUNK);
	assert_true(ring_state(h) & MESH_STATE_ERROR);
	if (ring_rx_prod(h) > h->app->rx_cons + RING)
		fail_msg("meshd published rx_prod %llu with rx_cons %llu and a ring of %u",
			 (unsigned long long)ring_rx_prod(h), (unsigned long long)h->app->rx_cons, RING);
	mt_finish(&c->t);
}

static void channel_on_kick__stream_quarter_consumed__one_credit_then_next_after_completion(void **state)
{
	struct ct *c = *state;
	struct fake_post *p;
	struct ch_regs r;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	r = find_regs(c, RING);
	for (uint16_t s = 0; s < 3; s++)
		peer_data(c, h, s % 2, s, s * CHUNK, CHUNK);
	assert_true(ring_rx_prod(h) == 3 * CHUNK);
	from = c->t.fx->n_posts;
	/* Three quarters of the ring arrived uncredited (a stream: its sender is short of room): a
	 * quarter read is worth a credit (ring.h mesh_ring_credit_step). Less than a quarter: none. */
	app_read(h, 1000);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, true), 0);
	/* A quarter. */
	app_read(h, CHUNK - 1000);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, true), 1);
	p = write_post(c, h, from, true, 0);
	assert_int_equal(p->conn_id, conn_id(c->l->conns[0]));
	assert_int_equal(p->len, MESH_CREDIT_LEN);
	assert_true(p->raddr == (uintptr_t)h->peer_credit);
	assert_int_equal(p->rkey, PEER_CREDIT_RKEY);
	assert_int_equal(p->imm, MESH_IMM(1, PEER_SLOT, 0));
	assert_ptr_equal(p->mr->addr, r.cout->addr);
	assert_true(((const uint64_t *)p->buf)[0] == CHUNK);
	assert_true(((const uint64_t *)p->buf)[1] == 3 * CHUNK); /* placed */
	assert_int_equal(write_count(c, h, from, false), 0);
	/* Everything read, but a credit is in flight: the next waits for its completion. */
	app_read(h, 2 * CHUNK);
	app_kick(c, h);
	tick(&c->t);
	assert_int_equal(write_count(c, h, from, true), 1);
	complete_write(c, h, p);
	assert_true(h->peer_credit[0] == CHUNK);
	assert_int_equal(write_count(c, h, from, true), 2);
	p = write_post(c, h, from, true, 1);
	assert_int_equal(p->imm, MESH_IMM(1, PEER_SLOT, 1)); /* the next slot */
	assert_true(*(const uint64_t *)p->buf == 3 * CHUNK);
	complete_write(c, h, p);
	assert_true(h->peer_credit[2] == 3 * CHUNK);
	assert_true(h->peer_credit[0] == CHUNK);
	/* Nothing new consumed: nothing more. */
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, true), 2);
	assert_int_equal(chn(c, h)->inflight, 0);
	mt_finish(&c->t);
}

/* A sender with room (less than three quarters of the ring arrived uncredited: requests and
 * answers, an echo) is credited per half ring, not per quarter (ring.h mesh_ring_credit_step). */
static void channel_on_kick__sender_with_room__credit_per_half_ring(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 0, 0, 0, CHUNK);
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	from = c->t.fx->n_posts;
	app_read(h, CHUNK);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, true), 0); /* a quarter: not yet */
	app_read(h, CHUNK);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, true), 1);
	assert_true(((const uint64_t *)write_post(c, h, from, true, 0)->buf)[0] == 2 * CHUNK);
	mt_finish(&c->t);
}

static void channel_on_kick__caught_up_below_a_quarter__no_credit(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 0, 0, 0, 64);
	from = c->t.fx->n_posts;
	/* A small message read to the end: the sender has most of the ring, a credit would be a
	 * write per message for nothing. */
	app_read(h, 64);
	app_kick(c, h);
	tick(&c->t);
	assert_int_equal(write_count(c, h, from, true), 0);
	mt_finish(&c->t);
}

/* ---- polling (main.c's hot loop) ------------------------------------------------------------------ */

static void channel_poll__published_without_kick__posted_and_counted(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	/* Nothing moved: nothing to do, and no pump. */
	assert_int_equal(channel_poll(&c->t.m, 0), 0);
	/* A polling meshd finds what the application published without a kick. */
	app_write(h, 100);
	assert_int_equal(channel_poll(&c->t.m, 0), 1);
	mesh_reap(&c->t.m);
	assert_int_equal(write_count(c, h, from, false), 1);
	assert_int_equal(write_post(c, h, from, false, 0)->len, 100);
	/* Seen once: the next look finds nothing new. */
	assert_int_equal(channel_poll(&c->t.m, 0), 0);
	/* A shutdown is a publication too. */
	atomic_fetch_or(&h->app->ctrl->app_flags, MESH_APP_SHUT_WR);
	assert_int_equal(channel_poll(&c->t.m, 0), 1);
	assert_true(chn(c, h)->app_shut);
	mt_finish(&c->t);
}

/* A polling meshd counts a read only once it is worth a credit (what the application kicks for
 * while meshd sleeps): every smaller one counted kept an adaptive meshd polling through a whole
 * stream of two applications that post their own writes. */
static void channel_poll__reads_below_a_credit_step__not_a_move(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	for (uint16_t s = 0; s < 4; s++)
		peer_data(c, h, s % 2, s, s * CHUNK, CHUNK);
	from = c->t.fx->n_posts;
	app_read(h, 1000);
	assert_int_equal(channel_poll(&c->t.m, 0), 0);
	app_read(h, CHUNK - 1000); /* a quarter, and a whole ring arrived: worth a credit */
	assert_int_equal(channel_poll(&c->t.m, 0), 1);
	assert_int_equal(write_count(c, h, from, true), 1);
	/* Taken: the next look finds nothing new. */
	assert_int_equal(channel_poll(&c->t.m, 0), 0);
	mt_finish(&c->t);
}

static void channel_set_polling__on_and_off__every_ring_flag_and_new_channels(void **state)
{
	struct ct *c = *state;
	struct chan *a, *b;

	ct_init(c, 2);
	a = open_out(c, RING, 2, PEER_SLOT);
	assert_int_equal(atomic_load(&a->app->ctrl->daemon_flags), 0);
	channel_set_polling(&c->t.m, 0, true);
	assert_true(c->t.m.polling[0]);
	assert_int_equal(atomic_load(&a->app->ctrl->daemon_flags), MESH_DAEMON_POLLING);
	/* A channel born while meshd polls says so from the start. */
	b = open_out(c, RING, 2, PEER_SLOT + 1);
	assert_int_equal(atomic_load(&b->app->ctrl->daemon_flags), MESH_DAEMON_POLLING);
	channel_set_polling(&c->t.m, 0, false);
	assert_int_equal(atomic_load(&a->app->ctrl->daemon_flags), 0);
	assert_int_equal(atomic_load(&b->app->ctrl->daemon_flags), 0);
	/* The spin hint comes from the configuration. */
	assert_int_equal(a->app->ctrl->spin_us, 77);
	mt_finish(&c->t);
}

/* ---- the fast path (mesh.h, struct mesh_locks) ---------------------------------------------- */

/* A channel whose application shut its side, which the fast path marked for the usual pump: its
 * EOF (a control message) goes only when that pump runs, once. */
static void eof_left_to_the_usual_pump(struct ct *c, struct chan *h, size_t from)
{
	assert_true(c->t.m.rail_slow[0] && chn(c, h)->slow_wanted);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 0);
	channel_pump_wanted(&c->t.m, 0);
	mesh_reap(&c->t.m);
	assert_false(c->t.m.rail_slow[0] || chn(c, h)->slow_wanted);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 1);
}

/* A channel that only moves data: its rail's thread pumps it and takes its completions and
 * immediates under the rail's lock alone (deliver() offers every event to mesh_fast_event first),
 * with what the usual way gives. */
static void mesh_fast_event__open_channel_stream__taken_as_the_usual_way_would(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	uint64_t taken;

	ct_init(c, 3);
	h = open_out(c, RING, 3, PEER_SLOT);
	c->t.fast = true;
	from = c->t.fx->n_posts;
	app_write(h, 3000);
	assert_int_equal(channel_poll_fast(&c->t.m, 0), 1);
	assert_false(c->t.m.rail_slow[0]);
	assert_int_equal(write_count(c, h, from, false), 3);
	assert_true(check_data_posts(c, h, from, 0, 0, 0, CHUNK) == 3000);
	taken = c->t.fast_taken;
	complete_data(c, h, from);
	assert_int_equal(c->t.fast_taken - taken, 3);
	assert_int_equal(chn(c, h)->inflight, 0);
	peer_credit_placed(c, h, 0, 3000); /* an immediate on the rail's first QP */
	assert_int_equal(c->t.fast_taken - taken, 4);
	assert_true(ring_tx_cons(h) == 3000);
	check_peer_ring(h, 0, 3000);
	peer_data(c, h, 1, 0, 0, 700); /* an immediate on a data QP */
	assert_int_equal(c->t.fast_taken - taken, 5);
	assert_true(ring_rx_prod(h) == 700);
	assert_false(c->t.m.rail_slow[0]);
	assert_true(c->l->metrics.tx_bytes == 3000 && c->l->metrics.tx_chunks == 3 && c->l->metrics.rx_bytes == 700);
	mt_finish(&c->t);
}

/* What is more than moving data goes the usual way, as it did: a control message, a channel whose
 * application shut its side (its EOF is a control message: the fast pump marks it, the usual pump
 * sends it), a failed completion (the link fails). */
static void mesh_fast_event__control_shutdown_or_failure__left_to_the_usual_way(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	struct xport_event ev;
	size_t from;
	uint64_t taken;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	c->t.fast = true;
	taken = c->t.fast_taken;
	peer_eof(c, h, 0);
	assert_int_equal(c->t.fast_taken, taken);
	assert_true(chn(c, h)->eof_known);
	assert_true(ring_state(h) & MESH_STATE_PEER_EOF);

	from = c->t.fx->n_posts;
	app_shut_wr(h);
	assert_int_equal(channel_poll_fast(&c->t.m, 0), 1);
	eof_left_to_the_usual_pump(c, h, from);

	ev = wc_event(c->l->conns[1], XPORT_OP_WRITE, ((uint64_t)WR_CH_DATA << 32) | (chn(c, h)->slot << 16), 0);
	ev.status = -EIO;
	deliver(&c->t, &ev);
	assert_int_equal(c->t.fast_taken, taken);
	assert_int_not_equal(c->l->phase, LINK_UP);
	mt_finish(&c->t);
}

/* Whether the channel's kick eventfd holds a kick meshd has not read. */
static bool kick_pending(struct ct *c, struct chan *h)
{
	struct pollfd p = {.fd = chn(c, h)->kick_fd, .events = POLLIN};

	return poll(&p, 1, 0) == 1;
}

/* A kick reaches the thread of the channel's rail (channel_ops.watch), which takes it under its
 * rail's lock alone: a channel that only moves data is pumped at once; one whose application shut
 * its side is marked for the usual pump (its EOF is a control message); another rail's thread (the
 * channel moved meanwhile) leaves it unread for the set it is in now; an unknown id is nothing. */
static void channel_on_kick_fast__own_rail_pumps__shut_to_usual_way__other_rail_untouched(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	uint64_t one = 1;

	ct_init(c, 3);
	h = open_out(c, RING, 3, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 3000);
	assert_int_equal(write(h->app->fds[FD_KICK], &one, sizeof(one)), (ssize_t)sizeof(one));
	assert_false(channel_on_kick_fast(&c->t.m, h->id, 1));
	assert_true(kick_pending(c, h));
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_true(channel_on_kick_fast(&c->t.m, h->id, 0));
	assert_false(kick_pending(c, h));
	assert_false(c->t.m.rail_slow[0] || chn(c, h)->slow_wanted);
	assert_int_equal(write_count(c, h, from, false), 3);
	assert_true(check_data_posts(c, h, from, 0, 0, 0, CHUNK) == 3000);
	assert_false(channel_on_kick_fast(&c->t.m, h->id + 1000, 0));

	from = c->t.fx->n_posts;
	app_shut_wr(h);
	assert_int_equal(write(h->app->fds[FD_KICK], &one, sizeof(one)), (ssize_t)sizeof(one));
	assert_true(channel_on_kick_fast(&c->t.m, h->id, 0));
	eof_left_to_the_usual_pump(c, h, from);
	mt_finish(&c->t);
}

static const struct CMUnitTest tests[] = {
	T(channel_on_kick__app_wrote__chunks_striped_round_robin),
	T(channel_on_kick_fast__own_rail_pumps__shut_to_usual_way__other_rail_untouched),
	T(channel_on_kick__large_ring__chunks_of_chunk_max),
	T(channel_open__ring_under_four_chunks__chunk_of_a_quarter),
	T(channel_on_kick__peer_credit_exhausted__stops_exactly_at_credit),
	T(channel_on_completion__out_of_order__tx_cons_over_completed_prefix),
	T(channel_on_imm__credit_beyond_sent__channel_error_eproto),
	T(channel_on_imm__credit_going_back__channel_error_eproto),
	T(channel_on_imm__credit_slots__next_write_landing_is_not_read),
	T(channel_on_imm__chunks_out_of_order__rx_prod_when_contiguous),
	T(channel_on_imm__duplicate_pending_seq__channel_error_eproto),
	T(channel_on_imm__duplicate_delivered_seq__channel_error_eproto),
	T(channel_on_imm__seq_outside_window__channel_error_eproto),
	T(channel_on_imm__one_qp_lags_past_the_senders_window__kept_in_order),
	cmocka_unit_test(channel_rx_window__every_qp_count__covers_lag_and_below_half_seq_space),
	T(channel_on_imm__zero_length__channel_error_eproto),
	T(channel_on_imm__longer_than_ring__channel_error_eproto),
	T(channel_on_imm__beyond_reader_credit__channel_error_eproto),
	T(channel_on_imm__beyond_reader_credit__rx_prod_stays_in_window),
	T(channel_on_kick__stream_quarter_consumed__one_credit_then_next_after_completion),
	T(channel_on_kick__sender_with_room__credit_per_half_ring),
	T(channel_on_kick__caught_up_below_a_quarter__no_credit),
	T(channel_poll__published_without_kick__posted_and_counted),
	T(channel_poll__reads_below_a_credit_step__not_a_move),
	T(mesh_fast_event__open_channel_stream__taken_as_the_usual_way_would),
	T(mesh_fast_event__control_shutdown_or_failure__left_to_the_usual_way),
	T(channel_set_polling__on_and_off__every_ring_flag_and_new_channels),
};

UNIT_MAIN("channel_data", tests, ct_group_setup, NULL)
