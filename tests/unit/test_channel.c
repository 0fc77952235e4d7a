/*
 * A channel's set-up and life in meshd (node/meshd/channel.c): the ChannelOpen a connect sends and
 * what it registers, the four descriptors the client gets, the peer's answer or its silence (the
 * handshake timeout), finding a channel by id, an application that breaks its ring's rules, and the
 * end of a channel: EOF once every byte went, the lifeline's hang-up, the close handshake, and
 * control messages that wait for a free send buffer. The fixture of every test_channel*.c is
 * channel_harness.[ch]; what the other programs cover is in tests/README.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "channel_harness.h"
#include "unit_main.h"

/* ---- connect and accept ------------------------------------------------------------------------ */

static bool fd_is(int fd, const char *what)
{
	char path[64], buf[256];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, buf, sizeof(buf) - 1);
	if (n < 0)
		return false;
	buf[n] = '\0';
	return strstr(buf, what) != NULL;
}

static void channel_connect__up_link__open_carries_slot_ports_ring_and_keys(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;
	const ChannelOpen *o;
	struct ch_regs r;
	struct channel *ch;
	size_t from, regs;
	PeerMsg *m;

	ct_init(c, 3);
	from = c->t.fx->n_posts;
	regs = c->t.fx->n_regs;
	assert_int_equal(channel_connect(&c->t.m, PEER, 80, RING, 9, -1, -1, -1, CLIENT_FD, ROOT, &why), 0);
	/* TX (local), RX and the credit word in (remote write), the credit, direct and hint words out
	 * (local), the pair hint in (remote write), the direct pair of the control page (remote write). */
	assert_int_equal(c->t.fx->n_regs, regs + 6);
	r = find_regs(c, RING);
	for (size_t i = regs; i < regs + 6; i++)
		assert_int_equal(c->t.fx->regs[i].conn_id, conn_id(c->l->conns[0]));
	assert_int_equal(fake_post_count(c->t.fx, from, XPORT_OP_SEND, 0), 1);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_OPEN, 0);
	assert_non_null(m);
	o = m->channel_open;
	assert_true(o->slot < c->l->ch_cap);
	ch = c->l->ch_slots[o->slot];
	assert_non_null(ch);
	assert_int_equal(o->slot, ch->slot);
	assert_int_equal(o->dst_port, 80);
	assert_int_equal(o->src_port, ch->local_port);
	assert_true(o->src_port >= 49152);
	assert_true(o->ring_size == RING);
	assert_int_equal(o->qps, 3); /* 9 asked for, the link has 3 */
	assert_int_equal(ch->qps, 3);
	assert_true(o->rx_addr == (uintptr_t)r.rx->addr);
	assert_int_equal(o->rx_rkey, r.rx->rkey);
	assert_true(o->credit_addr == (uintptr_t)r.cin->addr);
	assert_int_equal(o->credit_rkey, r.cin->rkey);
	/* The direct pair: 16 bytes of the control page, nothing else of it. */
	assert_ptr_equal(r.dir->addr, (uint8_t *)ch->map + MESH_RING_DIRECT_OFF);
	assert_true(o->direct_addr == (uintptr_t)r.dir->addr);
	assert_int_equal(o->direct_rkey, r.dir->rkey);
	/* The pair hint: its 16 bytes of the credit page. */
	assert_ptr_equal(r.hin->addr, ch->credit + CH_HINT_IN);
	assert_true(o->hint_addr == (uintptr_t)r.hin->addr);
	assert_int_equal(o->hint_rkey, r.hin->rkey);
	/* The rings registered are the ones in the memfd: TX then RX after the control page. */
	assert_ptr_equal(r.tx->addr, ch->tx);
	assert_ptr_equal(r.rx->addr, ch->rx);
	assert_ptr_equal((uint8_t *)r.tx->addr, (uint8_t *)ch->map + MESH_RING_CTRL_SIZE);
	assert_ptr_equal((uint8_t *)r.rx->addr, (uint8_t *)ch->map + MESH_RING_CTRL_SIZE + RING);
	mesh_peer_msg_free(m);
	/* The client hears once the peer answers. */
	assert_int_equal(c->n_apps, 0);
	assert_int_equal(c->t.m.chans->n_channels, 1);
	assert_string_equal(channel_state_name(ch), "OPENING");
	assert_int_equal(c->watch_add[ch->id], 1);
	mt_finish(&c->t);
}

static void channel_connect__qps_and_ring_unset__link_qps_and_default_ring(void **state)
{
	struct ct *c = *state;
	const uint32_t ask[] = {0, 1, 2, 4};
	const uint32_t want[] = {3, 1, 2, 3};
	uint32_t slots[4], ports[4];
	const char *why = NULL;

	ct_init(c, 3);
	for (int i = 0; i < 4; i++) {
		size_t from = c->t.fx->n_posts;
		PeerMsg *m;

		assert_int_equal(channel_connect(&c->t.m, PEER, 80, i ? RING : 0, ask[i], -1, -1, -1, CLIENT_FD, ROOT, &why), 0);
		m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_OPEN, 0);
		assert_non_null(m);
		assert_int_equal(m->channel_open->qps, want[i]);
		assert_true(m->channel_open->ring_size == (i ? RING : MESH_RING_DEFAULT));
		slots[i] = m->channel_open->slot;
		ports[i] = m->channel_open->src_port;
		for (int j = 0; j < i; j++) {
			assert_int_not_equal(slots[i], slots[j]);
			assert_int_not_equal(ports[i], ports[j]);
		}
		mesh_peer_msg_free(m);
	}
	assert_int_equal(c->t.m.chans->n_channels, 4);
	mt_finish(&c->t);
}

static void channel_on_message__accept__open_and_delivered_with_four_fds(void **state)
{
	struct ct *c = *state;
	struct channel *ch;
	struct chan *h;
	struct app *a;
	int seals;

	ct_init(c, 2);
	h = connect_out(c, 80, RING, 2, PEER_SLOT);
	peer_accept(c, h);
	assert_int_equal(c->n_apps, 1);
	a = &c->apps[0];
	h->app = a;
	assert_int_equal(a->client_fd, CLIENT_FD);
	assert_int_equal(a->status, 0);
	assert_true(a->setup);
	assert_int_equal(a->channel_id, h->id);
	assert_true(a->ring_size == RING);
	assert_int_equal(a->qps, 2);
	assert_int_equal(a->peer_port, 80);
	assert_int_equal(a->local_port, h->local_port);
	/* Four distinct descriptors: a sealed memfd, the lifeline socket, the kick and wake eventfds. */
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < i; j++)
			assert_int_not_equal(a->fds[i], a->fds[j]);
	seals = fcntl(a->fds[FD_MEMFD], F_GET_SEALS);
	assert_true(seals >= 0);
	seals &= F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	assert_int_equal(seals, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	assert_true(fd_is(a->fds[FD_MEMFD], "memfd:"));
	assert_true(fd_is(a->fds[FD_LIFELINE], "socket:"));
	assert_true(fd_is(a->fds[FD_KICK], "eventfd"));
	assert_true(fd_is(a->fds[FD_WAKE], "eventfd"));
	app_map(a);
	assert_int_equal(a->ctrl->peer_node, PEER);
	assert_int_equal(ring_state(h), MESH_STATE_OPEN);
	assert_int_equal(ring_error(h), 0);
	assert_true(ring_tx_cons(h) == 0);
	assert_true(ring_rx_prod(h) == 0);
	ch = chn(c, h);
	assert_string_equal(channel_state_name(ch), "OPEN");
	assert_true(ch->opener);
	assert_int_equal(ch->peer_slot, PEER_SLOT);
	/* meshd keeps no copy of what only the application needs. */
	assert_int_equal(ch->memfd, -1);
	assert_int_equal(ch->app_life_fd, -1);
	/* The RX ring we announced is the application's RX area: the peer's bytes show there. */
	peer_data(c, h, 0, 0, 0, 100);
	assert_true(ring_rx_prod(h) == 100);
	app_read(h, 100);
	mt_finish(&c->t);
}

/* Kicks and lifelines name their channel by id: found in its bucket, two ids of one bucket apart,
 * and no longer once freed. */
static void channel_find__ids_sharing_a_bucket__each_found_freed_one_gone(void **state)
{
	struct ct *c = *state;
	struct chan *h, *h2;
	struct channel *ch;

	ct_init(c, 2);
	h = connect_out(c, 80, RING, 2, PEER_SLOT);
	ch = channel_find(&c->t.m, h->id);
	c->t.m.chans->next_channel_id = h->id + MESH_CH_BUCKETS - 1;
	h2 = connect_out(c, 81, RING, 2, PEER_SLOT + 1);
	assert_int_equal(h2->id, h->id + MESH_CH_BUCKETS);
	assert_non_null(ch);
	assert_int_equal(ch->id, h->id);
	assert_ptr_not_equal(channel_find(&c->t.m, h2->id), ch);
	assert_int_equal(channel_find(&c->t.m, h2->id)->id, h2->id);
	assert_null(channel_find(&c->t.m, h->id + 2 * MESH_CH_BUCKETS));
	assert_null(channel_find(&c->t.m, h->id + 1));
	peer_reject(c, h->slot, -ECONNREFUSED);
	assert_null(channel_find(&c->t.m, h->id));
	assert_non_null(channel_find(&c->t.m, h2->id));
	peer_reject(c, h2->slot, -ECONNREFUSED);
	assert_null(channel_find(&c->t.m, h2->id));
	assert_int_equal(c->t.m.chans->n_channels, 0);
	mt_finish(&c->t);
}

static void channel_on_message__reject__reason_delivered_and_everything_freed(void **state)
{
	struct ct *c = *state;
	struct chan *h, *h2;
	uint32_t id, slot;
	size_t regs;

	ct_init(c, 2);
	regs = c->t.fx->n_regs;
	h = connect_out(c, 80, RING, 2, PEER_SLOT);
	id = h->id;
	slot = h->slot;
	assert_int_equal(c->t.fx->live_mrs, 2 + 6);
	peer_reject(c, slot, -ECONNREFUSED);
	assert_int_equal(c->n_apps, 1);
	assert_int_equal(c->apps[0].client_fd, CLIENT_FD);
	assert_int_equal(c->apps[0].status, -ECONNREFUSED);
	assert_false(c->apps[0].setup);
	/* Why, in words the errno's name does not already say (the application prints both). */
	if (strcmp(c->apps[0].why, "nobody listens on that port"))
		fail_msg("reply text \"%s\" is not \"nobody listens on that port\"", c->apps[0].why);
	/* Freed, and its registrations deregistered by the reap after the batch. */
	assert_null(channel_find(&c->t.m, id));
	assert_int_equal(c->t.m.chans->n_channels, 0);
	assert_null(c->l->ch_slots[slot]);
	assert_int_equal(c->t.fx->live_mrs, 2);
	assert_int_equal(c->t.fx->n_deregs, 6);
	assert_int_equal(c->t.fx->n_regs, regs + 6);
	assert_true(c->watch_del[id] >= 1);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	/* The slot serves the next channel. */
	h2 = connect_out(c, 80, RING, 2, PEER_SLOT);
	assert_int_equal(h2->slot, slot);
	mt_finish(&c->t);
}

/* ---- a failed registration, a peer that does not answer ----------------------------------------- */

static void channel_connect__registration_fails__refused_nothing_left(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;
	size_t posts;
	int ret;

	ct_init(c, 2);
	posts = c->t.fx->n_posts;
	/* TX and RX register, the credit word does not. */
	c->t.fx->fail_mr_reg = (struct fake_fail){.err = -EFAULT, .skip = 2};
	ret = channel_connect(&c->t.m, PEER, 80, RING, 2, -1, -1, -1, CLIENT_FD, ROOT, &why);
	assert_true(ret < 0);
	assert_non_null(why);
	if (!strstr(why, "registration"))
		fail_msg("why \"%s\" does not name the registration", why);
	mesh_reap(&c->t.m);
	assert_int_equal(c->t.m.chans->n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 2);
	assert_int_equal(c->t.fx->n_posts, posts);
	assert_int_equal(c->n_apps, 0);
	/* The next connect works, in the same slot. */
	connect_out(c, 80, RING, 2, PEER_SLOT);
	assert_int_equal(c->chans[0].slot, 0);
	mt_finish(&c->t);
}

static void channel_tick__no_answer__etimedout_then_closed_after_late_accept(void **state)
{
	struct ct *c = *state;
	uint64_t t0;
	size_t from;
	struct chan *h;

	ct_init(c, 2);
	h = connect_out(c, 80, RING, 2, PEER_SLOT);
	t0 = chn(c, h)->open_ms;
	tick_at(&c->t, t0 + c->t.cfg.handshake_timeout_ms);
	assert_int_equal(c->n_apps, 0);
	tick_at(&c->t, t0 + c->t.cfg.handshake_timeout_ms + 1);
	assert_int_equal(c->n_apps, 1);
	assert_int_equal(c->apps[0].client_fd, CLIENT_FD);
	assert_int_equal(c->apps[0].status, -ETIMEDOUT);
	/* The peer may still accept and then write into our ring: the channel and its memory stay. */
	assert_int_equal(c->t.m.chans->n_channels, 1);
	assert_int_equal(c->t.fx->live_mrs, 2 + 6);
	assert_string_equal(channel_state_name(chn(c, h)), "OPENING");
	complete_sends(c);
	from = c->t.fx->n_posts;
	peer_accept(c, h);
	assert_int_equal(c->n_apps, 1); /* nobody hears twice */
	assert_int_equal(sent_close_reason(c, h, from), -ECONNRESET);
	assert_int_equal(fake_post_count(c->t.fx, from, XPORT_OP_WRITE_IMM, 0), 0);
	assert_int_equal(c->t.m.chans->n_channels, 1);
	complete_sends(c);
	peer_close_ack(c, h);
	assert_int_equal(c->t.m.chans->n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 2);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

static void channel_tick__timeout_then_reject__freed_without_second_reply(void **state)
{
	struct ct *c = *state;
	struct chan *h;

	ct_init(c, 2);
	h = connect_out(c, 80, RING, 2, PEER_SLOT);
	tick_at(&c->t, chn(c, h)->open_ms + c->t.cfg.handshake_timeout_ms + 1);
	assert_int_equal(c->n_apps, 1);
	assert_int_equal(c->apps[0].status, -ETIMEDOUT);
	peer_reject(c, h->slot, -ECONNREFUSED);
	assert_int_equal(c->n_apps, 1);
	assert_int_equal(c->t.m.chans->n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 2);
	mt_finish(&c->t);
}

/* ---- a hostile application ---------------------------------------------------------------------- */

static void channel_on_kick__tx_prod_beyond_ring__error_others_unaffected(void **state)
{
	struct ct *c = *state;
	struct chan *bad, *good;
	struct fake_post *p;
	size_t from;

	ct_init(c, 2);
	bad = open_out(c, RING, 2, PEER_SLOT);
	good = open_out(c, RING, 2, PEER_SLOT + 1);
	from = c->t.fx->n_posts;
	atomic_store_explicit(&bad->app->ctrl->tx_prod, RING + 1, memory_order_release);
	app_kick(c, bad);
	assert_int_equal(fake_post_count(c->t.fx, from, XPORT_OP_WRITE_IMM, 0), 0);
	assert_int_equal(sent_close_reason(c, bad, from), -EPROTO);
	expect_broken(c, bad, -EPROTO);
	/* The other channel on the same link goes on. */
	from = c->t.fx->n_posts;
	app_write(good, 100);
	app_kick(c, good);
	assert_int_equal(write_count(c, good, from, false), 1);
	p = write_post(c, good, from, false, 0);
	assert_int_equal(p->imm, MESH_IMM(0, PEER_SLOT + 1, 0));
	complete_write(c, good, p);
	peer_credit_placed(c, good, 0, 100);
	assert_true(ring_tx_cons(good) == 100);
	assert_int_equal(ring_state(good), MESH_STATE_OPEN);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

static void channel_on_kick__tx_prod_going_back__error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, 100);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 1);
	from = c->t.fx->n_posts;
	atomic_store_explicit(&h->app->ctrl->tx_prod, 50, memory_order_release);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	expect_broken(c, h, -EPROTO);
	mt_finish(&c->t);
}

static void channel_on_kick__rx_cons_beyond_rx_prod__error_eproto(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	peer_data(c, h, 0, 0, 0, CHUNK);
	from = c->t.fx->n_posts;
	atomic_store_explicit(&h->app->ctrl->rx_cons, CHUNK + 1, memory_order_release);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, true), 0);
	expect_broken(c, h, -EPROTO);
	assert_int_equal(sent_close_reason(c, h, from), -EPROTO);
	mt_finish(&c->t);
}

/* ---- EOF and close ------------------------------------------------------------------------------ */

static void channel_on_kick__shut_wr__eof_once_all_bytes_posted(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;
	PeerMsg *m;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_write(h, RING);
	app_kick(c, h);
	complete_data(c, h, from);
	peer_credit_placed(c, h, 0, RING);
	/* 1000 more and the write side shut, but no credit for them yet: no EOF. */
	from = c->t.fx->n_posts;
	app_write(h, 1000);
	app_shut_wr(h);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 0);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 0);
	assert_string_equal(channel_state_name(chn(c, h)), "HALF_CLOSED");
	/* Bytes published after SHUT_WR are not part of the stream. */
	atomic_store_explicit(&h->app->ctrl->tx_prod, RING + 1500, memory_order_release);
	peer_credit(c, h, RING);
	assert_true(check_data_posts(c, h, from, 0, 4, RING, CHUNK) == 1000);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 1);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_EOF, 0);
	assert_int_equal(m->channel_eof->slot, PEER_SLOT);
	assert_true(m->channel_eof->total == RING + 1000);
	mesh_peer_msg_free(m);
	complete_data(c, h, from);
	complete_sends(c);
	app_kick(c, h);
	tick(&c->t);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 1);
	assert_int_equal(ring_state(h) & MESH_STATE_ERROR, 0);
	mt_finish(&c->t);
}

static void channel_on_lifeline__after_shut_wr__close_0_when_idle_freed_on_ack(void **state)
{
	struct ct *c = *state;
	size_t from, regs;
	uint32_t id;
	struct chan *h;

	ct_init(c, 2);
	regs = c->t.fx->n_regs;
	h = open_out(c, RING, 2, PEER_SLOT);
	id = h->id;
	from = c->t.fx->n_posts;
	app_write(h, 2 * CHUNK);
	app_shut_wr(h);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 2);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 1);
	app_hangup(c, h);
	/* Two writes in flight: no Close yet. */
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE), 0);
	complete_write(c, h, write_post(c, h, from, false, 0));
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE), 0);
	complete_write(c, h, write_post(c, h, from, false, 1));
	assert_int_equal(sent_close_reason(c, h, from), 0);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE), 1);
	check_peer_ring(h, 0, 2 * CHUNK);
	/* The peer may still write until it acknowledges: everything stays registered. */
	assert_int_equal(c->t.m.chans->n_channels, 1);
	assert_int_equal(c->t.fx->live_mrs, 2 + 6);
	complete_sends(c);
	peer_close_ack(c, h);
	assert_null(channel_find(&c->t.m, id));
	assert_int_equal(c->t.m.chans->n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 2);
	assert_int_equal(c->t.fx->n_deregs, c->t.fx->n_regs - regs);
	assert_int_equal(c->t.fx->live_conns, (int)c->t.cfg.qps_per_link);
	assert_true(c->watch_del[id] >= 1);
	assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	mt_finish(&c->t);
}

static void channel_on_lifeline__without_shut_wr__close_econnreset(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	from = c->t.fx->n_posts;
	app_hangup(c, h);
	assert_int_equal(sent_close_reason(c, h, from), -ECONNRESET);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF), 0);
	assert_int_equal(c->t.m.chans->n_channels, 1);
	complete_sends(c);
	peer_close_ack(c, h);
	assert_int_equal(c->t.m.chans->n_channels, 0);
	assert_int_equal(c->t.fx->live_mrs, 2);
	mt_finish(&c->t);
}

/* ---- full send queues --------------------------------------------------------------------------- */

/* Every send buffer of the link busy: the peer has not completed 16 KeepaliveAcks of ours. */
static void fill_send_slots(struct ct *c)
{
	complete_sends(c);
	for (uint64_t i = 0; i < 16; i++)
		peer_keepalive(c, i + 1);
	assert_int_equal(c->l->send_busy, 0xffffu);
}

static void channel_on_lifeline__send_buffers_busy__close_sent_once_one_frees(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	fill_send_slots(c);
	from = c->t.fx->n_posts;
	app_hangup(c, h);
	complete_sends(c);
	tick(&c->t);
	if (!sent_count(c, from, PEER_MSG__BODY_CHANNEL_CLOSE))
		fail_msg("no ChannelClose reached the peer: it will never acknowledge, the channel never goes");
	assert_int_equal(sent_close_reason(c, h, from), -ECONNRESET);
	complete_sends(c);
	peer_close_ack(c, h);
	assert_int_equal(c->t.m.chans->n_channels, 0);
	mt_finish(&c->t);
}

static void channel_on_kick__send_buffers_busy__eof_sent_once_one_frees(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	fill_send_slots(c);
	from = c->t.fx->n_posts;
	app_write(h, 100);
	app_shut_wr(h);
	app_kick(c, h);
	assert_int_equal(write_count(c, h, from, false), 1);
	complete_data(c, h, from);
	complete_sends(c);
	tick(&c->t);
	if (!sent_count(c, from, PEER_MSG__BODY_CHANNEL_EOF))
		fail_msg("no ChannelEof reached the peer: its reader never sees the end of the stream");
	mt_finish(&c->t);
}

static const struct CMUnitTest tests[] = {
	T(channel_connect__up_link__open_carries_slot_ports_ring_and_keys),
	T(channel_connect__qps_and_ring_unset__link_qps_and_default_ring),
	T(channel_on_message__accept__open_and_delivered_with_four_fds),
	T(channel_find__ids_sharing_a_bucket__each_found_freed_one_gone),
	T(channel_on_message__reject__reason_delivered_and_everything_freed),
	T(channel_connect__registration_fails__refused_nothing_left),
	T(channel_tick__no_answer__etimedout_then_closed_after_late_accept),
	T(channel_tick__timeout_then_reject__freed_without_second_reply),
	T(channel_on_kick__tx_prod_beyond_ring__error_others_unaffected),
	T(channel_on_kick__tx_prod_going_back__error_eproto),
	T(channel_on_kick__rx_cons_beyond_rx_prod__error_eproto),
	T(channel_on_kick__shut_wr__eof_once_all_bytes_posted),
	T(channel_on_lifeline__after_shut_wr__close_0_when_idle_freed_on_ack),
	T(channel_on_lifeline__without_shut_wr__close_econnreset),
	T(channel_on_lifeline__send_buffers_busy__close_sent_once_one_frees),
	T(channel_on_kick__send_buffers_busy__eof_sent_once_one_frees),
};

UNIT_MAIN("channel", tests, ct_group_setup, NULL)
