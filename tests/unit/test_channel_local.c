/*
 * Channels to this node (node/meshd/channel_local.c): refused without a listener and, with one,
 * both ends delivered, bytes copied ring to ring through the reader's credits, the EOF and the
 * close, all without a link or a device.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "channel_harness.h"
#include "unit_main.h"
#include "util.h"

/* Delivers what the local channels queued, until nothing more comes (bounded: no livelock). */
static void local_settle(struct ct *c)
{
	for (int i = 0; channel_local_run(&c->t.m); i++)
		if (i > 1000)
			fail_msg("channels to the local node keep queueing work");
}

static void channel_connect__self_nobody_listens__refused_without_the_transport(void **state)
{
	struct ct *c = *state;
	size_t regs, posts;
	const char *why = NULL;

	ct_init(c, 2);
	regs = c->t.fx->n_regs;
	posts = c->t.fx->n_posts;
	assert_int_equal(channel_connect(&c->t.m, SELF, 80, RING, 0, -1, -1, -1, CLIENT_FD, ROOT, &why), 0);
	assert_int_equal(c->n_apps, 0); /* answered once the Open reached "the peer": after the batch */
	local_settle(c);
	assert_int_equal(c->n_apps, 1);
	assert_int_equal(c->apps[0].client_fd, CLIENT_FD);
	assert_int_equal(c->apps[0].status, -ECONNREFUSED);
	assert_int_equal(c->t.m.chans->n_channels, 0);
	/* Nothing of it touched a link or a device. */
	assert_int_equal(c->t.fx->n_regs, regs);
	assert_int_equal(c->t.fx->n_posts, posts);
	mt_finish(&c->t);
}

/* Both ends delivered, bytes copied ring to ring with the receiver's credits, the EOF after the
 * last byte, and both channels freed once both applications are gone. */
static void channel_connect__self_listener__ring_to_ring_then_closed(void **state)
{
	struct ct *c = *state;
	struct app *op, *ac;
	size_t regs, posts;
	const char *why = NULL;
	uint64_t sent = 0, got = 0, total = 3 * RING + 1000;

	ct_init(c, 2);
	regs = c->t.fx->n_regs;
	posts = c->t.fx->n_posts;
	assert_int_equal(channel_listen(&c->t.m, 80, LISTEN_FD, ROOT, &why), 0);
	assert_int_equal(channel_connect(&c->t.m, SELF, 80, RING, 2, -1, -1, -1, CLIENT_FD, ROOT, &why), 0);
	local_settle(c);
	assert_int_equal(c->n_apps, 2);
	ac = c->apps[0].client_fd == LISTEN_FD ? &c->apps[0] : &c->apps[1];
	op = ac == &c->apps[0] ? &c->apps[1] : &c->apps[0];
	assert_int_equal(ac->client_fd, LISTEN_FD);
	assert_int_equal(op->client_fd, CLIENT_FD);
	assert_true(op->setup && ac->setup && op->status == 0 && ac->status == 0);
	assert_int_equal(op->peer_port, 80);
	assert_int_equal(ac->local_port, 80);
	assert_int_equal(ac->peer_port, op->local_port);
	assert_int_equal(c->t.m.chans->n_channels, 2);
	app_map(op);
	app_map(ac);
	assert_int_equal(channel_find(&c->t.m, op->channel_id)->peer_node, SELF);
	/* Three rings and a bit: only the reader's credits let the writer go on. */
	while (got < total) {
		uint64_t room = RING - (op->tx_prod - atomic_load(&op->ctrl->tx_cons));
		uint64_t n = MIN(room, total - sent), avail;

		for (uint64_t i = 0; i < n; i++)
			op->tx[(sent + i) & (RING - 1)] = pat(sent + i, SALT_OUT);
		sent += n;
		op->tx_prod = sent;
		atomic_store(&op->ctrl->tx_prod, sent);
		loop_kick(&c->t.m, op->channel_id);
		local_settle(c);
		avail = atomic_load(&ac->ctrl->rx_prod) - got;
		if (!n && !avail)
			fail_msg("stuck: %llu sent, %llu received", (unsigned long long)sent, (unsigned long long)got);
		for (uint64_t i = 0; i < avail; i++)
			if (ac->rx[(got + i) & (RING - 1)] != pat(got + i, SALT_OUT))
				fail_msg("byte %llu differs", (unsigned long long)(got + i));
		got += avail;
		atomic_store(&ac->ctrl->rx_cons, got);
		loop_kick(&c->t.m, ac->channel_id);
		local_settle(c);
	}
	assert_true(sent == total && got == total);
	/* The opener shuts its side and goes: the acceptor sees the EOF after the last byte. */
	atomic_fetch_or(&op->ctrl->app_flags, MESH_APP_SHUT_WR);
	app_close(op);
	channel_on_lifeline(&c->t.m, op->channel_id);
	local_settle(c);
	assert_true(atomic_load(&ac->ctrl->state) & MESH_STATE_PEER_EOF);
	assert_int_equal(atomic_load(&ac->ctrl->rx_prod), total);
	assert_int_equal(atomic_load(&ac->ctrl->error), 0);
	app_close(ac);
	channel_on_lifeline(&c->t.m, ac->channel_id);
	local_settle(c);
	/* The close handshake ran through the queue alone, with no tick and nothing on the link. */
	assert_int_equal(c->t.m.chans->n_channels, 0);
	assert_int_equal(c->t.fx->n_regs, regs);
	assert_int_equal(c->t.fx->n_posts, posts);
	mt_finish(&c->t);
}

static const struct CMUnitTest tests[] = {
	T(channel_connect__self_nobody_listens__refused_without_the_transport),
	T(channel_connect__self_listener__ring_to_ring_then_closed),
};

UNIT_MAIN("channel_local", tests, ct_group_setup, NULL)
