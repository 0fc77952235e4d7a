/*
 * Local clients of channels (node/meshd/channel_client.c): listening ports (well-known ports,
 * another user's port, a client gone), connects refused at once (an unknown node, a link DOWN),
 * connects that wait for their link (held, opened once it is UP, timed out, freed with the client),
 * the quotas of a user and of a listener (channels, ring memory, half of the descriptor budget,
 * half of a link's share), and connects while every send slot of the link is in flight.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "channel_harness.h"
#include "unit_main.h"
#include "util.h"

/* ---- connects refused at once ------------------------------------------------------------------- */

static void expect_connect_refused(struct ct *c, uint32_t node, int err)
{
	size_t regs = c->t.fx->n_regs, posts = c->t.fx->n_posts;
	const char *why = NULL;
	int ret = channel_connect(&c->t.m, node, 80, RING, 0, -1, -1, -1, CLIENT_FD, ROOT, &why);

	if (ret != err)
		fail_msg("channel_connect to node %u: %d (%s), expected %d (%s)", node, ret, mesh_strerror(ret), err,
			 mesh_strerror(err));
	assert_non_null(why);
	assert_int_equal(c->t.fx->n_regs, regs);
	assert_int_equal(c->t.fx->n_posts, posts);
	assert_int_equal(c->t.m.chans->n_channels, 0);
	assert_int_equal(c->n_apps, 0);
}

static void channel_connect__unknown_node__eunknownnode(void **state)
{
	struct ct *c = *state;

	ct_init(c, 2);
	expect_connect_refused(c, UNKNOWN_NODE, -MESH_EUNKNOWNNODE);
	mt_finish(&c->t);
}

static void channel_connect__link_down__enetunreach(void **state)
{
	struct ct *c = *state;

	ct_init(c, 2);
	assert_int_equal(link_state(lk(&c->t, DOWN_NODE)), LINK_STATE_DOWN_);
	expect_connect_refused(c, DOWN_NODE, -ENETUNREACH);
	mt_finish(&c->t);
}

/* ---- connects that wait for their link (CtlRequest.link_wait_ms) -------------------------------- */

static struct channel_connect_args wait_args(uint32_t node, int client_fd)
{
	struct channel_connect_args a = {.node = node, .port = 80, .ring_size = RING, .numa_hint = -1,
					 .caller_node = -1, .rail = -1, .client_fd = client_fd, .uid = ROOT};

	return a;
}

static size_t n_waits(const struct mesh *m)
{
	size_t n = 0;

	for (const struct link_wait *w = m->chans->link_waits; w; w = w->next)
		n++;
	return n;
}

/* Nothing is answered while the link forms; once it is UP the connect goes on as any other (an
 * Open to the peer, the channel OPENING) and waits no more. */
static void channel_connect_wait__link_down__held_then_opened_when_up(void **state)
{
	struct ct *c = *state;
	struct channel_connect_args a = wait_args(PEER, CLIENT_FD);
	struct link *l;
	const char *why = NULL;
	size_t from;
	PeerMsg *m;

	ct_init_dialled(c, 2);
	l = c->l;
	assert_int_not_equal(link_state(l), LINK_STATE_UP_);
	assert_int_equal(channel_connect_wait(&c->t.m, &a, 60000, &why), 0);
	assert_int_equal(n_waits(&c->t.m), 1);
	assert_int_equal(c->t.m.chans->n_channels, 0);
	/* One per control connection: a second is refused, the first still waits. */
	assert_int_equal(channel_connect_wait(&c->t.m, &a, 60000, &why), -EALREADY);
	assert_non_null(why);
	assert_int_equal(n_waits(&c->t.m), 1);
	tick(&c->t);
	assert_int_equal(c->n_apps, 0);
	assert_int_equal(n_waits(&c->t.m), 1);
	from = c->t.fx->n_posts;
	drive_to_up(&c->t, l);
	assert_int_equal(n_waits(&c->t.m), 0);
	assert_int_equal(c->n_apps, 0); /* answered when the peer answers, as any connect */
	assert_int_equal(c->t.m.chans->n_channels, 1);
	assert_int_equal(c->t.m.chans->channels->state, CH_OPENING);
	assert_ptr_equal(c->t.m.chans->channels->link, l);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_OPEN, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_open->dst_port, 80);
	mesh_peer_msg_free(m);
	mt_finish(&c->t);
}

/* The link does not come: -ETIMEDOUT at the deadline, naming the link, and the wait is freed. */
static void channel_connect_wait__deadline_passes__etimedout_names_the_link(void **state)
{
	struct ct *c = *state;
	struct channel_connect_args a = wait_args(DOWN_NODE, CLIENT_FD);
	const char *why = NULL;

	ct_init(c, 2);
	assert_int_equal(channel_connect_wait(&c->t.m, &a, 1000, &why), 0);
	tick_at(&c->t, util_now_ms() + 500);
	assert_int_equal(c->n_apps, 0);
	tick_at(&c->t, util_now_ms() + 5000);
	assert_int_equal(c->n_apps, 1);
	assert_int_equal(c->apps[0].client_fd, CLIENT_FD);
	assert_int_equal(c->apps[0].status, -ETIMEDOUT);
	assert_false(c->apps[0].setup);
	if (!strstr(c->apps[0].why, "the link to node 3 did not come UP within 1000 ms"))
		fail_msg("reply text \"%s\" does not name the link", c->apps[0].why);
	assert_int_equal(n_waits(&c->t.m), 0);
	assert_int_equal(c->t.m.chans->n_channels, 0);
	mt_finish(&c->t);
}

/* A client that goes takes its wait along; without a wait, an UP link or an unknown node, the
 * answer is channel_connect's at once; a drain answers the waiting ones. */
static void channel_connect_wait__client_gone_no_wait_or_drain__answered_or_freed(void **state)
{
	struct ct *c = *state;
	struct channel_connect_args a = wait_args(DOWN_NODE, CLIENT_FD), b = wait_args(DOWN_NODE, CLIENT_FD + 1);
	struct channel_connect_args u = wait_args(UNKNOWN_NODE, CLIENT_FD + 2);
	const char *why = NULL;

	ct_init(c, 2);
	assert_int_equal(channel_connect_wait(&c->t.m, &a, 60000, &why), 0);
	assert_int_equal(channel_connect_wait(&c->t.m, &b, 60000, &why), 0);
	assert_int_equal(n_waits(&c->t.m), 2);
	channel_client_gone(&c->t.m, CLIENT_FD);
	assert_int_equal(n_waits(&c->t.m), 1);
	assert_int_equal(c->n_apps, 0);
	a.client_fd = CLIENT_FD + 3;
	assert_int_equal(channel_connect_wait(&c->t.m, &a, 0, &why), -ENETUNREACH);
	assert_int_equal(channel_connect_wait(&c->t.m, &u, 60000, &why), -MESH_EUNKNOWNNODE);
	assert_int_equal(n_waits(&c->t.m), 1);
	c->t.m.chans->draining = true;
	c->t.m.chans->drain_deadline_ms = util_now_ms() + 3600u * 1000u;
	tick(&c->t);
	assert_int_equal(c->n_apps, 1);
	assert_int_equal(c->apps[0].client_fd, CLIENT_FD + 1);
	assert_int_equal(c->apps[0].status, -MESH_EDRAINING);
	assert_int_equal(n_waits(&c->t.m), 0);
	c->t.m.chans->draining = false;
	mt_finish(&c->t);
}

/* ---- listening ports ---------------------------------------------------------------------------- */

static void channel_client_gone__listener__no_longer_accepts(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;
	size_t from;
	struct chan *h;
	PeerMsg *m;

	ct_init(c, 2);
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ROOT, &why), 0);
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD + 1, ROOT, &why), -EADDRINUSE);
	channel_client_gone(&c->t.m, LISTEN_FD);
	h = chan_new(c, RING, PEER_SLOT);
	from = c->t.fx->n_posts;
	peer_open(c, h, 50000, 7000, 2);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_REJECT, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_reject->reason, -ECONNREFUSED);
	mesh_peer_msg_free(m);
	assert_int_equal(c->n_apps, 0);
	assert_int_equal(c->t.m.chans->n_channels, 0);
	/* The port is free for another client. */
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD + 1, ROOT, &why), 0);
	mt_finish(&c->t);
}

/* Like TCP: a user other than root cannot take a well-known port before its service starts. */
static void channel_listen__port_below_1024_not_root__eacces(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;

	ct_init(c, 2);
	assert_int_equal(channel_listen(&c->t.m, 80, LISTEN_FD, ALICE, &why), -EACCES);
	assert_non_null(strstr(why, "below 1024"));
	assert_int_equal(channel_listen(&c->t.m, 1023, LISTEN_FD, ALICE, &why), -EACCES);
	assert_int_equal(channel_listen(&c->t.m, 1024, LISTEN_FD, ALICE, &why), 0);
	assert_int_equal(channel_listen(&c->t.m, 80, LISTEN_FD + 1, ROOT, &why), 0);
	mt_finish(&c->t);
}

static void channel_listen__port_held_by_another_user__eaddrinuse_naming_it(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;

	ct_init(c, 2);
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ALICE, &why), 0);
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD + 1, BOB, &why), -EADDRINUSE);
	assert_non_null(strstr(why, "another user"));
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD + 1, ROOT, &why), -EADDRINUSE);
	mt_finish(&c->t);
}

/* ---- quotas ------------------------------------------------------------------------------------- */

/* Every user has a share of channels and of pinned ring memory: one more is -EDQUOT for that user
 * alone, and a channel that closes gives its room back. */
static void channel_connect__beyond_the_users_quota__edquot(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;
	struct channel *ch;

	ct_init(c, 2);
	c->t.cfg.max_channels_per_uid = 2;
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), 0);
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), 0);
	for (ch = c->t.m.chans->channels; ch; ch = ch->next)
		assert_int_equal(ch->owner_uid, ALICE);
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), -EDQUOT);
	assert_non_null(strstr(why, "max_channels_per_uid"));
	assert_int_equal(c->t.m.chans->n_channels, 2);
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, BOB, &why), 0);

	/* Bytes: both directions count; 2 x 64 KiB fits 128 KiB, a third ring of 4 KiB does not. */
	c->t.cfg.max_channels_per_uid = 100;
	c->t.cfg.max_ring_bytes_per_uid = 2 * (2 * RING) + (2u * (64u << 10));
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, 64u << 10, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), 0);
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, 4096, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), -EDQUOT);
	assert_non_null(strstr(why, "max_ring_bytes_per_uid"));
	mt_finish(&c->t);
}

/* A user other than root holds at most half of the channels meshd's descriptors allow (four each,
 * after the reserve for links and control clients): under a low RLIMIT_NOFILE one user's channels
 * took every descriptor and no other user got one. Bob and root still open theirs. */
static void channel_connect__half_of_the_descriptor_budget__edquot_others_still_open(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;
	uint64_t reserve;
	int open = util_fds_open(), alice = 0;

	ct_init(c, 2);
	assert_true(open > 0);
	reserve = 32 + 2ull * c->t.m.n_links * c->t.cfg.qps_per_link * c->t.m.n_rails;
	/* Room for 40 channels besides what the test process holds: 20 for one user. */
	c->t.m.fd_limit = (uint64_t)open + reserve + 40 * 4;
	while (alice < 40 && !channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ALICE, &why))
		alice++;
	if (alice != (int)(((uint64_t)open + 40 * 4) / 4 / 2))
		fail_msg("Alice opened %d channels, expected half of the %llu the budget allows: %s", alice,
			 (unsigned long long)(((uint64_t)open + 40 * 4) / 4), why);
	assert_non_null(strstr(why, "half of the channels meshd's descriptors allow"));
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, BOB, &why), 0);
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ROOT, &why), 0);
	mt_finish(&c->t);
}

/* Inside one link a user other than root holds at most half of what the peer takes from this node
 * (max_channels_per_link, max_ring_mib_per_link): the rest stay for other users and root. */
static void channel_connect__half_of_the_links_share__edquot_others_still_open(void **state)
{
	struct ct *c = *state;
	const char *why = NULL;

	ct_init(c, 2);
	c->t.cfg.max_channels_per_link = 4;
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), 0);
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), 0);
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ALICE, &why), -EDQUOT);
	assert_non_null(strstr(why, "half of cluster.max_channels_per_link"));
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, BOB, &why), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(channel_connect(&c->t.m, PEER, 7000, RING, 2, -1, -1, -1, CLIENT_FD, ROOT, &why), 0);

	/* Bytes: half of 1 MiB is 512 KiB; Bob's 4 KiB ring and a 256 KiB one (both directions) pass it. */
	c->t.cfg.max_channels_per_link = 100;
	c->t.cfg.max_ring_mib_per_link = 1;
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, 256u << 10, 2, -1, -1, -1, CLIENT_FD, BOB, &why), -EDQUOT);
	assert_non_null(strstr(why, "half of cluster.max_ring_mib_per_link"));
	assert_int_equal(channel_connect(&c->t.m, PEER, 7000, 128u << 10, 2, -1, -1, -1, CLIENT_FD, BOB, &why), 0);
	mt_finish(&c->t);
}

/* Channels accepted on a port are its listener's: they count against that user's quota, and the
 * peer's connect hears -EDQUOT. */
static void channel_on_message__open_beyond_the_listeners_quota__rejected_edquot(void **state)
{
	struct ct *c = *state;
	const char *why;
	struct chan *h;
	size_t from;

	ct_init(c, 2);
	c->t.cfg.max_channels_per_uid = 1;
	assert_int_equal(channel_listen(&c->t.m, 7000, LISTEN_FD, ALICE, &why), 0);
	h = open_in(c, 50000, 7000, RING, 2, PEER_SLOT);
	assert_int_equal(channel_find(&c->t.m, h->id)->owner_uid, ALICE);
	h = chan_new(c, RING, PEER_SLOT + 1);
	from = c->t.fx->n_posts;
	peer_open(c, h, 50001, 7000, 2);
	assert_int_equal(sent_count(c, from, PEER_MSG__BODY_CHANNEL_ACCEPT), 0);
	assert_int_equal(sent_reject_reason(c, from), -EDQUOT);
	assert_int_equal(c->t.m.chans->n_channels, 1);
	mt_finish(&c->t);
}

/* ---- connects while the link's send slots are all in flight ------------------------------------ */

/* Connects from client fds 2000.. until one sends no ChannelOpen (every send slot of the link in
 * flight, none completed): returns that connect's result; *n_sent: how many Opens went. */
static int connect_until_no_slot(struct ct *c, size_t *n_sent, uint32_t *pending_slot)
{
	const char *why = NULL;

	for (int i = 0; i < 64; i++) {
		size_t from = c->t.fx->n_posts;
		int ret = channel_connect(&c->t.m, PEER, 5000, RING, 1, -1, -1, -1, 2000 + i, ROOT, &why);
		PeerMsg *m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_OPEN, 0);

		if (m) {
			mesh_peer_msg_free(m);
			continue;
		}
		*n_sent = (size_t)i;
		for (uint32_t s = 0; s < c->l->ch_cap; s++)
			if (c->l->ch_slots[s] && c->l->ch_slots[s]->reply_fd == 2000 + i)
				*pending_slot = s;
		return ret;
	}
	fail_msg("64 connects all sent their Open: the send slots never ran out");
	return -1;
}

static void channel_connect__send_slots_all_in_flight__open_waits_for_one(void **state)
{
	struct ct *c = *state;
	uint32_t slot = UINT32_MAX;
	struct channel *ch;
	size_t sent = 0, from;
	PeerMsg *m;

	ct_init(c, 2);
	/* The burst's last connect is not refused (-EAGAIN was the answer): it waits. */
	assert_int_equal(connect_until_no_slot(c, &sent, &slot), 0);
	assert_true(sent >= 8);
	assert_true(slot < c->l->ch_cap);
	ch = c->l->ch_slots[slot];
	assert_true(ch->open_pending);
	assert_string_equal(channel_state_name(ch), "OPENING");
	assert_int_equal(c->n_apps, 0);
	/* A forged answer for a channel the peer never heard of changes nothing. */
	{
		struct chan *fake = chan_new(c, RING, PEER_SLOT);

		fake->slot = slot;
		peer_accept(c, fake);
		assert_true(ch->open_pending);
		assert_int_equal(c->n_apps, 0);
		assert_int_equal(link_state(c->l), LINK_STATE_UP_);
	}
	/* The peer takes the Opens: a slot frees, the pump on the tick sends the waiting one. */
	from = c->t.fx->n_posts;
	complete_sends(c);
	tick(&c->t);
	m = sent_msg(c, from, PEER_MSG__BODY_CHANNEL_OPEN, 0);
	assert_non_null(m);
	assert_int_equal(m->channel_open->slot, slot);
	mesh_peer_msg_free(m);
	assert_false(ch->open_pending);
	mt_finish(&c->t);
}

static void channel_connect__open_waiting_for_a_slot__client_gone_or_timeout_frees_it_unsent(void **state)
{
	struct ct *c = *state;
	uint32_t slot = UINT32_MAX, slot2 = UINT32_MAX;
	size_t sent = 0, from;
	int fd;

	ct_init(c, 2);
	assert_int_equal(connect_until_no_slot(c, &sent, &slot), 0);
	fd = c->l->ch_slots[slot]->reply_fd;
	/* The client gives up: the channel goes, and no Open for it ever leaves. */
	channel_client_gone(&c->t.m, fd);
	mesh_reap(&c->t.m);
	assert_null(c->l->ch_slots[slot]);
	/* Another waits past the handshake timeout: its client hears -ETIMEDOUT, nothing is sent. */
	assert_int_equal(channel_connect(&c->t.m, PEER, 5000, RING, 1, -1, -1, -1, 3000, ROOT, &(const char *){NULL}), 0);
	for (uint32_t s = 0; s < c->l->ch_cap; s++)
		if (c->l->ch_slots[s] && c->l->ch_slots[s]->reply_fd == 3000)
			slot2 = s;
	assert_true(slot2 < c->l->ch_cap);
	assert_true(c->l->ch_slots[slot2]->open_pending);
	from = c->t.fx->n_posts;
	tick_at(&c->t, c->l->ch_slots[slot2]->open_ms + c->t.cfg.handshake_timeout_ms + 1);
	mesh_reap(&c->t.m);
	assert_null(c->l->ch_slots[slot2]);
	{
		size_t k = 0;

		while (k < c->n_apps && c->apps[k].client_fd != 3000)
			k++;
		assert_true(k < c->n_apps); /* (the Opens that went time out too, and wait for answers) */
		assert_int_equal(c->apps[k].status, -ETIMEDOUT);
	}
	assert_null(sent_msg(c, from, PEER_MSG__BODY_CHANNEL_OPEN, 0));
	mt_finish(&c->t);
}

static const struct CMUnitTest tests[] = {
	T(channel_connect__send_slots_all_in_flight__open_waits_for_one),
	T(channel_connect__open_waiting_for_a_slot__client_gone_or_timeout_frees_it_unsent),
	T(channel_connect__unknown_node__eunknownnode),
	T(channel_connect__link_down__enetunreach),
	T(channel_connect_wait__link_down__held_then_opened_when_up),
	T(channel_connect_wait__deadline_passes__etimedout_names_the_link),
	T(channel_connect_wait__client_gone_no_wait_or_drain__answered_or_freed),
	T(channel_client_gone__listener__no_longer_accepts),
	T(channel_listen__port_below_1024_not_root__eacces),
	T(channel_listen__port_held_by_another_user__eaddrinuse_naming_it),
	T(channel_connect__beyond_the_users_quota__edquot),
	T(channel_connect__half_of_the_descriptor_budget__edquot_others_still_open),
	T(channel_connect__half_of_the_links_share__edquot_others_still_open),
	T(channel_on_message__open_beyond_the_listeners_quota__rejected_edquot),
};

UNIT_MAIN("channel_client", tests, ct_group_setup, NULL)
