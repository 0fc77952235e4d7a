/*
 * Direct receive (ring.h MESH_RING_DIRECT_OFF) and pairs on demand (wire.h MESH_PAIR_HINT_*), in
 * node/meshd/channel.c: after the data on its QP we write the peer's {pos, check} pair, one at a
 * time, covering only what is ordered or done; an application may read past rx_prod up to a valid
 * pair; a reader that sleeps through the pairs has its peer asked for none, and asked again once
 * it reads through them; both survive a resume.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "channel_harness.h"
#include "unit_main.h"

/* ---- direct receive ------------------------------------------------------------------------- */

/* 64 zeroed bytes, aligned: the peer's words our writes land in. */
static uint64_t *peer_words(void)
{
	uint64_t *w = aligned_alloc(64, 64);

	assert_non_null(w);
	memset(w, 0, 64);
	return w;
}

/* An outgoing channel whose peer announces a direct pair in its Accept, and a pair hint with hint. */
static struct chan *open_out_paired(struct ct *c, uint32_t qps, bool hint)
{
	struct chan *h = connect_out(c, 5000, RING, qps, PEER_SLOT);

	h->peer_dir = peer_words();
	if (hint)
		h->peer_hint = peer_words();
	accept_out(c, h);
	return h;
}

static struct chan *open_out_direct(struct ct *c, uint32_t qps)
{
	return open_out_paired(c, qps, false);
}

/* The nth plain WRITE to raddr posted since from, or NULL. */
static struct fake_post *plain_write(struct ct *c, const void *raddr, size_t from, size_t nth)
{
	for (size_t i = from; raddr && i < c->t.fx->n_posts; i++) {
		struct fake_post *p = &c->t.fx->posts[i];

		if (p->op != XPORT_OP_WRITE || p->raddr != (uintptr_t)raddr)
			continue;
		if (nth-- == 0)
			return p;
	}
	return NULL;
}

/* The {value, check} of a plain WRITE p of len bytes (a direct pair, a pair hint): its value. */
static uint64_t checked_word(const struct fake_post *p, uint32_t len)
{
	const uint64_t *w = p->buf;

	assert_int_equal(p->len, len);
	assert_true(w[1] == mesh_ring_direct_check(w[0]));
	return w[0];
}

/* The nth write of a direct pair to channel h's peer posted since from, or NULL. */
static struct fake_post *direct_post(struct ct *c, const struct chan *h, size_t from, size_t nth)
{
	return plain_write(c, h->peer_dir, from, nth);
}

/* The pair p carries: pos, with its check. */
static uint64_t direct_pos(const struct fake_post *p)
{
	return checked_word(p, MESH_RING_DIRECT_LEN);
}

/* The peer's NIC lands {pos, check} in our direct pair (check_ok false: a pair read half landed). */
static void peer_direct(const struct chan *h, uint64_t pos, bool check_ok)
{
	uint64_t check = mesh_ring_direct_check(pos);

	atomic_store_explicit(&h->our_dir->pos, pos, memory_order_release);
	atomic_store_explicit(&h->our_dir->check, check_ok ? check : check ^ 1, memory_order_release);
}

/* The peer's bytes [pos, pos + len) land in our RX ring, their immediate not polled yet. */
static void peer_bytes(const struct chan *h, uint64_t pos, uint32_t len)
{
	for (uint32_t i = 0; i < len; i++)
		h->our_rx[(pos + i) & (h->size - 1)] = pat(pos + i, SALT_IN);
}

static void channel_on_kick__peer_has_direct_pair__pair_after_the_data_on_its_qp_one_at_a_time(void **state)
{
	struct ct *c = *state;
	struct fake_post *d, *p;
	struct ch_regs r;
	struct chan *h;
	size_t from;

	ct_init(c, 1);
	h = open_out_direct(c, 1);
	r = find_regs(c, RING);
	from = c->t.fx->n_posts;
	app_write(h, 100);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 1);
	d = write_post(c, h, from, false, 0);
	p = direct_post(c, h, from, 0);
	assert_non_null(p);
	/* After the data, on the same QP (posts are recorded in order), from our registered out words. */
	assert_true(p > d);
	assert_int_equal(p->conn_id, d->conn_id);
	assert_ptr_equal(p->mr->addr, r.cout->addr);
	assert_ptr_equal(p->buf, (const uint8_t *)r.cout->addr + MESH_CREDIT_LEN);
	assert_true(direct_pos(p) == 100);
	assert_int_equal(chn(c, h)->inflight, 2);
	/* While it is in flight the next bytes go, their pair waits: its source must not change. */
	app_write(h, 50);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 2);
	assert_null(direct_post(c, h, from, 1));
	assert_true(direct_pos(p) == 100);
	complete_write(c, h, p);
	assert_true(h->peer_dir[0] == 100 && h->peer_dir[1] == mesh_ring_direct_check(100));
	p = direct_post(c, h, from, 1);
	assert_non_null(p);
	assert_true(direct_pos(p) == 150);
	complete_data(c, h, from);
	complete_write(c, h, p);
	assert_int_equal(chn(c, h)->inflight, 0);
	assert_true(chn(c, h)->direct_writes == 2);
	/* Nothing new: no pair. A completed stream needs none either. */
	app_kick(c, h);
	tick(&c->t);
	assert_null(direct_post(c, h, from, 2));
	check_peer_ring(h, 0, 150);
	mt_finish(&c->t);
}

/* A QP that refuses the direct pair (its connection went down; the link's event comes later): the
 * channel is not broken for it, the data still counts, and the next pair goes out when it can. */
static void channel_on_kick__direct_pair_refused__channel_kept_next_pair_later(void **state)
{
	struct ct *c = *state;
	struct fake_post *p;
	struct chan *h;
	size_t from;

	ct_init(c, 1);
	h = open_out_direct(c, 1);
	from = c->t.fx->n_posts;
	c->t.fx->fail_post_plain_write.err = -ENOTCONN;
	app_write(h, 100);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 1);
	assert_null(direct_post(c, h, from, 0));
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_true(chn(c, h)->direct_writes == 0);
	assert_int_equal(chn(c, h)->inflight, 1);
	/* More bytes: their pair covers everything so far. */
	app_write(h, 50);
	app_kick(c, h);
	p = direct_post(c, h, from, 0);
	assert_non_null(p);
	assert_true(direct_pos(p) == 100 || direct_pos(p) == 150);
	complete_data(c, h, from);
	complete_write(c, h, p);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	check_peer_ring(h, 0, 150);
	app_hangup(c, h);
	mt_finish(&c->t);
}

static void channel_on_kick__striped_over_two_qps__pair_covers_only_what_is_ordered_or_done(void **state)
{
	struct ct *c = *state;
	struct fake_post *p;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out_direct(c, 2);
	from = c->t.fx->n_posts;
	app_write(h, 2 * CHUNK);
	app_kick(c, h);
	assert_true(check_data_posts(c, h, from, 0, 0, 0, CHUNK) == 2 * CHUNK);
	/* Chunk 0 on QP 0 is neither done nor ahead of a pair on QP 1: nothing can be vouched for. */
	assert_null(direct_post(c, h, from, 0));
	complete_write(c, h, write_post(c, h, from, false, 0));
	/* Chunk 0 done, chunk 1 on QP 1: a pair behind it there covers both. */
	p = direct_post(c, h, from, 0);
	assert_non_null(p);
	assert_int_equal(p->conn_id, conn_id(c->l->conns[1]));
	assert_true(p > write_post(c, h, from, false, 1));
	assert_true(direct_pos(p) == 2 * CHUNK);
	/* A peer without a pair (an older meshd) gets none: the other tests' peers. */
	mt_finish(&c->t);
}

static void channel_on_kick__app_read_past_rx_prod__accepted_up_to_a_valid_direct_pair(void **state)
{
	struct ct *c = *state;
	struct fake_post *p;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	assert_non_null(h->our_dir);
	assert_int_not_equal(h->our_dir_rkey, 0);
	/* The peer's NIC placed chunks 0 and 1 and then the pair; their immediates are not polled yet. */
	peer_bytes(h, 0, 2 * CHUNK);
	peer_direct(h, 2 * CHUNK, true);
	from = c->t.fx->n_posts;
	app_read(h, 2 * CHUNK);
	app_kick(c, h);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	/* No credit: what we credit is also what we say we placed, and we have placed nothing. */
	assert_int_equal(write_count(c, h, from, true), 0);
	assert_true(ring_rx_prod(h) == 0);
	/* The immediates: placed now, and the reader's half ring is credited once all of it is. */
	peer_imm(c, 0, MESH_IMM(0, h->slot, 0), CHUNK);
	assert_true(ring_rx_prod(h) == CHUNK);
	assert_int_equal(write_count(c, h, from, true), 0);
	peer_imm(c, 1, MESH_IMM(0, h->slot, 1), CHUNK);
	assert_true(ring_rx_prod(h) == 2 * CHUNK);
	assert_int_equal(write_count(c, h, from, true), 1);
	p = write_post(c, h, from, true, 0);
	assert_true(((const uint64_t *)p->buf)[0] == 2 * CHUNK);
	assert_true(((const uint64_t *)p->buf)[1] == 2 * CHUNK);
	/* A pair whose check does not match (read while it landed) proves nothing: reading past what
	 * is placed is then the application's error. */
	peer_bytes(h, 2 * CHUNK, 500);
	peer_direct(h, 2 * CHUNK + 500, false);
	app_read(h, 500);
	app_kick(c, h);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

/* What the application read up to a valid pair stays read when meshd catches the next pair
 * landing (its check does not match for a moment): a channel of the VM's all-to-all test broke so,
 * its reader having moved by nothing. Reading past the torn pair is still an error. */
static void channel_on_kick__pair_torn_after_the_app_read_by_it__not_an_error(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_bytes(h, 0, CHUNK);
	peer_direct(h, CHUNK, true);
	app_read(h, CHUNK);
	app_kick(c, h);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	peer_bytes(h, CHUNK, 500);
	peer_direct(h, CHUNK + 500, false);
	app_kick(c, h);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_true(chn(c, h)->app_rx_cons == CHUNK);
	app_read(h, 500);
	app_kick(c, h);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_connect__direct_receive_off__no_key_for_the_page(void **state)
{
	struct ct *c = *state;
	size_t regs;
	struct chan *h;

	ct_init(c, 1);
	snprintf(c->t.cfg.direct_receive, sizeof(c->t.cfg.direct_receive), "off");
	regs = c->t.fx->n_regs;
	h = connect_out(c, 80, RING, 1, PEER_SLOT);
	assert_int_equal(c->t.fx->n_regs, regs + 5); /* no registration of the direct pair */
	assert_int_equal(h->our_dir_rkey, 0);
	for (size_t i = regs; i < c->t.fx->n_regs; i++)
		assert_ptr_not_equal(c->t.fx->regs[i].addr, (uint8_t *)chn(c, h)->map + MESH_RING_DIRECT_OFF);
	mt_finish(&c->t);
}

static void channel_on_kick__direct_pair_beyond_a_ring__not_taken(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 1);
	h = open_out(c, RING, 1, PEER_SLOT);
	peer_bytes(h, 0, 100);
	peer_direct(h, 100 + RING, true);
	app_read(h, 100);
	app_kick(c, h);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

/* The application read ahead of what meshd placed (a direct pair) when the link went: the resume
 * names meshd's own position, reader included (ChannelResume.rx_cons never passes rx_bytes), and
 * the bytes the peer writes again land where the application already read them. */
static void channel_link_down__app_ahead_of_placed__resume_names_the_placed_position(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	PeerMsg *m;

	ct_init_resume(c, 2); /* link_lost cuts QP 1 */
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_bytes(h, 0, 2 * CHUNK + 200);
	peer_direct(h, 2 * CHUNK + 200, true);
	app_read(h, 2 * CHUNK + 200);
	app_kick(c, h);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	from = c->t.fx->n_posts;
	link_lost(c);
	link_back(c, 5000);
	m = sent_resume(c, h, from);
	assert_true(m->channel_resume->rx_bytes == 0);
	assert_true(m->channel_resume->rx_cons == 0);
	assert_true(m->channel_resume->direct_addr == (uintptr_t)h->our_dir);
	assert_int_not_equal(m->channel_resume->direct_rkey, h->our_dir_rkey); /* the new attempt's */
	assert_int_equal(reg_of_rkey(c, m->channel_resume->direct_rkey)->conn_id, conn_id(c->l->conns[0]));
	mesh_peer_msg_free(m);
	complete_sends(c);
	peer_resume(c, h, 0, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	from = c->t.fx->n_posts;
	peer_data(c, h, 0, 0, 0, CHUNK);
	peer_data(c, h, 1, 1, CHUNK, CHUNK);
	peer_data(c, h, 0, 2, 2 * CHUNK, 200);
	assert_true(ring_rx_prod(h) == 2 * CHUNK + 200);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_int_equal(write_count(c, h, from, true), 1); /* the reader's half ring, now placed */
	peer_bytes(h, 2 * CHUNK + 200, 100);
	peer_imm(c, 1, MESH_IMM(0, h->slot, 3), 100);
	app_read(h, 100);
	app_kick(c, h);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	mt_finish(&c->t);
}

/* ---- pairs on demand (wire.h MESH_PAIR_HINT_*) ---------------------------------------------------- */

static struct chan *open_out_hinted(struct ct *c, uint32_t qps)
{
	return open_out_paired(c, qps, true);
}

/* The nth write of a pair hint to channel h's peer posted since from, or NULL. */
static struct fake_post *hint_post(struct ct *c, const struct chan *h, size_t from, size_t nth)
{
	return plain_write(c, h->peer_hint, from, nth);
}

/* The hint p carries, with its check. */
static uint64_t hint_value(const struct fake_post *p)
{
	return checked_word(p, MESH_PAIR_HINT_LEN);
}

/* The peer's 64 B chunk seq at pos: through_pair, its pair lands after it and our reader reads it
 * before its immediate is polled; else the immediate comes first and the reader reads after it. */
static void peer_small(struct ct *c, struct chan *h, uint16_t seq, uint64_t pos, bool through_pair)
{
	if (through_pair) {
		peer_bytes(h, pos, 64);
		peer_direct(h, pos + 64, true);
		app_read(h, 64);
		app_kick(c, h);
		peer_imm(c, 0, MESH_IMM(0, h->slot, seq), 64);
	} else {
		peer_data(c, h, 0, seq, pos, 64);
		app_read(h, 64);
		app_kick(c, h);
	}
}

/* A reader that sleeps until meshd wakes it never reads through the peer's pairs: after
 * CH_PAIRS_IDLE_MAX such chunks in a row we ask the peer for none (a plain WRITE on QP 0 from our
 * registered out words), say nothing more while that stands, and ask for them again once both
 * CH_PAIRS_RETRY_CHUNKS chunks and CH_PAIRS_RETRY_MS have passed, neither alone. */
static void channel_on_imm__reader_sleeps_through_the_pairs__peer_asked_for_none_then_again(void **state)
{
	struct ct *c = *state;
	struct fake_post *p;
	struct ch_regs r;
	struct chan *h;
	uint16_t seq = 0;
	size_t from;

	ct_init(c, 1);
	h = open_out_hinted(c, 1);
	r = find_regs(c, RING);
	from = c->t.fx->n_posts;
	for (; seq < CH_PAIRS_IDLE_MAX - 1; seq++)
		peer_small(c, h, seq, seq * 64u, false);
	assert_null(hint_post(c, h, from, 0));
	peer_small(c, h, seq, seq * 64u, false);
	seq++;
	p = hint_post(c, h, from, 0);
	assert_non_null(p);
	assert_true(hint_value(p) == MESH_PAIR_HINT_OFF);
	assert_int_equal(p->conn_id, conn_id(c->l->conns[0]));
	assert_ptr_equal(p->mr->addr, r.cout->addr);
	assert_ptr_equal(p->buf, (const uint8_t *)r.cout->addr + 2 * MESH_CREDIT_LEN);
	complete_write(c, h, p);
	assert_true(h->peer_hint[0] == MESH_PAIR_HINT_OFF);
	assert_true(chn(c, h)->hint_writes == 1);
	/* The second has passed (the clock moved back instead), not the chunks: nothing said. */
	chn(c, h)->pairs_off_ms -= CH_PAIRS_RETRY_MS;
	for (uint32_t i = 0; i < CH_PAIRS_RETRY_CHUNKS - 1; i++, seq++)
		peer_small(c, h, seq, seq * 64u, false);
	assert_null(hint_post(c, h, from, 1));
	/* Both: the next chunk asks for pairs again. */
	peer_small(c, h, seq, seq * 64u, false);
	seq++;
	p = hint_post(c, h, from, 1);
	assert_non_null(p);
	assert_true(hint_value(p) == MESH_PAIR_HINT_ON);
	complete_write(c, h, p);
	assert_true(h->peer_hint[0] == MESH_PAIR_HINT_ON);
	/* Still asleep: off again, and this time the chunks pass within the second (it started a
	 * minute from now: this test's own pace must not matter): nothing said. */
	for (uint32_t i = 0; i < CH_PAIRS_IDLE_MAX; i++, seq++)
		peer_small(c, h, seq, seq * 64u, false);
	p = hint_post(c, h, from, 2);
	assert_non_null(p);
	assert_true(hint_value(p) == MESH_PAIR_HINT_OFF);
	complete_write(c, h, p);
	chn(c, h)->pairs_off_ms += 60000;
	for (uint32_t i = 0; i < CH_PAIRS_RETRY_CHUNKS + 10; i++, seq++)
		peer_small(c, h, seq, seq * 64u, false);
	assert_null(hint_post(c, h, from, 3));
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_true(ring_rx_prod(h) == (uint64_t)seq * 64u);
	mt_finish(&c->t);
}

/* A reader that polls and reads through the pairs keeps them: one chunk read so in
 * CH_PAIRS_IDLE_MAX starts the count again. */
static void channel_on_imm__reader_reads_through_pairs__no_hint(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	uint16_t seq = 0;
	size_t from;

	ct_init(c, 1);
	h = open_out_hinted(c, 1);
	from = c->t.fx->n_posts;
	for (int round = 0; round < 3; round++) {
		for (uint32_t i = 0; i < CH_PAIRS_IDLE_MAX - 1; i++, seq++)
			peer_small(c, h, seq, seq * 64u, false);
		peer_small(c, h, seq, seq * 64u, true);
		seq++;
	}
	assert_null(hint_post(c, h, from, 0));
	assert_true(chn(c, h)->pairs_wanted);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	mt_finish(&c->t);
}

/* The sending side: while the peer's meshd asks for no pairs (a whole hint in our hint words) the
 * data goes alone; a torn or foreign hint, or one asking for pairs, brings them back. */
static void channel_on_kick__peer_asked_for_no_pairs__data_alone_until_asked_again(void **state)
{
	struct ct *c = *state;
	struct fake_post *p;
	struct chan *h;
	size_t from;

	ct_init(c, 1);
	h = open_out_direct(c, 1);
	assert_non_null(h->our_hint);
	assert_ptr_equal(h->our_hint, chn(c, h)->credit + CH_HINT_IN);
	h->our_hint[0] = MESH_PAIR_HINT_OFF;
	h->our_hint[1] = mesh_ring_direct_check(MESH_PAIR_HINT_OFF);
	from = c->t.fx->n_posts;
	app_write(h, 100);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 1);
	complete_data(c, h, from);
	assert_null(direct_post(c, h, from, 0));
	assert_true(chn(c, h)->direct_writes == 0);
	/* Torn (its check does not match): not a hint, the pairs go. */
	h->our_hint[1] ^= 1;
	app_write(h, 50);
	app_kick(c, h);
	p = direct_post(c, h, from, 0);
	assert_non_null(p);
	assert_true(direct_pos(p) == 150);
	complete_data(c, h, from);
	complete_write(c, h, p);
	/* Off again, then asked for: */
	h->our_hint[1] ^= 1;
	app_write(h, 50);
	app_kick(c, h);
	complete_data(c, h, from);
	assert_null(direct_post(c, h, from, 1));
	h->our_hint[0] = MESH_PAIR_HINT_ON;
	h->our_hint[1] = mesh_ring_direct_check(MESH_PAIR_HINT_ON);
	app_write(h, 50);
	app_kick(c, h);
	p = direct_post(c, h, from, 1);
	assert_non_null(p);
	assert_true(direct_pos(p) == 250);
	complete_data(c, h, from);
	complete_write(c, h, p);
	check_peer_ring(h, 0, 250);
	mt_finish(&c->t);
}

/* The hint that asked for no pairs may have died with the link: after the resume it is written
 * again, to the hint words the peer's ChannelResume names. */
static void channel_link_down__pairs_unwanted__hint_written_again_after_the_resume(void **state)
{
	struct ct *c = *state;
	struct fake_post *p;
	struct chan *h;
	uint16_t seq = 0;
	size_t from;
	PeerMsg *m;

	ct_init_resume(c, 2);
	h = open_out_hinted(c, 2);
	from = c->t.fx->n_posts;
	for (; seq < CH_PAIRS_IDLE_MAX; seq++)
		peer_small(c, h, seq, seq * 64u, false);
	p = hint_post(c, h, from, 0);
	assert_non_null(p);
	assert_true(hint_value(p) == MESH_PAIR_HINT_OFF);
	from = c->t.fx->n_posts;
	link_lost(c);
	link_back(c, 5000);
	m = sent_resume(c, h, from);
	assert_true(m->channel_resume->hint_addr == (uintptr_t)h->our_hint);
	assert_int_not_equal(m->channel_resume->hint_rkey, 0);
	mesh_peer_msg_free(m);
	complete_sends(c);
	assert_null(hint_post(c, h, from, 0));
	peer_resume(c, h, 0, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	p = hint_post(c, h, from, 0);
	assert_non_null(p);
	assert_true(hint_value(p) == MESH_PAIR_HINT_OFF);
	mt_finish(&c->t);
}

static const struct CMUnitTest tests[] = {
	T(channel_on_kick__peer_has_direct_pair__pair_after_the_data_on_its_qp_one_at_a_time),
	T(channel_on_kick__direct_pair_refused__channel_kept_next_pair_later),
	T(channel_on_kick__striped_over_two_qps__pair_covers_only_what_is_ordered_or_done),
	T(channel_on_kick__app_read_past_rx_prod__accepted_up_to_a_valid_direct_pair),
	T(channel_on_kick__direct_pair_beyond_a_ring__not_taken),
	T(channel_on_kick__pair_torn_after_the_app_read_by_it__not_an_error),
	T(channel_on_imm__reader_sleeps_through_the_pairs__peer_asked_for_none_then_again),
	T(channel_on_imm__reader_reads_through_pairs__no_hint),
	T(channel_on_kick__peer_asked_for_no_pairs__data_alone_until_asked_again),
	T(channel_link_down__pairs_unwanted__hint_written_again_after_the_resume),
	T(channel_connect__direct_receive_off__no_key_for_the_page),
	T(channel_link_down__app_ahead_of_placed__resume_names_the_placed_position),
};

UNIT_MAIN("channel_direct", tests, ct_group_setup, NULL)
