/*
 * The link state machine over a real provider: several `struct mesh` in one process, each with
 * its own provider instance listening on its own port, pumped by this test instead of meshd's
 * epoll loop. One source, run over every provider: tcp on loopback here, rdma in the Soft-RoCE VM.
 * (tests/unit/test_mesh.c covers the same machine case by case over a fake transport.)
 *
 *   MESH_XPORT=tcp|rdma MESH_XPORT_ADDR=127.0.0.1 mesh_link_test [case]
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "channel.h"
#include "config.h"
#include "log.h"
#include "mesh.h"
#include "transport.h"
#include "util.h"

#include "../unit/unit_main.h"
#include "provider_env.h"

#define NODES 3
#define WAIT_MS 30000

static const struct xport_ops *ops;
static const char *addr;
static uint16_t next_port;

struct node {
	xport_t *x;
	struct mesh m;
	bool live;
	bool frozen; /* not pumped: looks like a hung process to its peers */
};

struct world {
	struct mesh_config cfg;
	struct config_node nodes[NODES];
	struct node n[NODES];
};

static void node_start(struct world *w, int i)
{
	struct xport_attr xa = {.connect_timeout_ms = w->cfg.connect_timeout_ms,
				.max_send_wr = LINK_SQ_DEPTH,
				.max_recv_wr = MAX(LINK_RECV_BUFS, LINK_DATA_RECVS)};
	struct node *n = &w->n[i];

	assert_int_equal(xport_create(ops, &xa, &n->x), 0);
	assert_int_equal(xport_listen(n->x, addr, w->nodes[i].port), 0);
	assert_int_equal(mesh_init(&n->m, &w->cfg, &w->nodes[i], &n->x, 1), 0);
	assert_int_equal(channel_layer_init(&n->m), 0);
	n->live = true;
	n->frozen = false;
}

/* A process death as the peers see it: every QP and the listener go away at once. */
static void node_kill(struct world *w, int i)
{
	struct node *n = &w->n[i];

	n->m.stopping = true; /* no goodbyes: this is a crash, not a stop */
	mesh_cleanup(&n->m);
	xport_destroy(n->x);
	n->x = NULL;
	n->live = false;
}

static void pump_once(struct world *w)
{
	struct pollfd pfd[NODES];
	int np = 0;

	for (int i = 0; i < NODES; i++) {
		struct node *n = &w->n[i];
		struct xport_event evs[32];
		int k;

		if (!n->live || n->frozen)
			continue;
		do {
			k = xport_poll(n->x, evs, 32);
			for (int j = 0; j < k; j++)
				mesh_handle_event(&n->m, &evs[j]);
			mesh_reap(&n->m);
		} while (k == 32);
		mesh_tick(&n->m, util_now_ms());
		mesh_reap(&n->m);
		pfd[np].fd = xport_event_fd(n->x);
		pfd[np++].events = POLLIN;
	}
	poll(pfd, (nfds_t)np, 10);
}

typedef bool (*world_pred)(struct world *w);

static bool pump_until(struct world *w, world_pred pred)
{
	uint64_t end = util_now_ms() + WAIT_MS;

	while (util_now_ms() < end) {
		pump_once(w);
		if (pred(w))
			return true;
	}
	return false;
}

static bool all_up(struct world *w)
{
	for (int i = 0; i < NODES; i++)
		if (!w->n[i].live || mesh_links_up(&w->n[i].m) != NODES - 1)
			return false;
	return true;
}

static struct link *link_of(struct world *w, int i, int peer)
{
	return mesh_link_find(&w->n[i].m, w->nodes[peer].id);
}

static bool peers_of_2_down(struct world *w)
{
	return link_state(link_of(w, 0, 2)) == LINK_STATE_DOWN_ && link_state(link_of(w, 1, 2)) == LINK_STATE_DOWN_;
}

static int world_setup(void **state)
{
	struct world *w = calloc(1, sizeof(*w));

	assert_non_null(w);
	snprintf(w->cfg.path, sizeof(w->cfg.path), "(in memory)");
	snprintf(w->cfg.cluster_name, sizeof(w->cfg.cluster_name), "linktest");
	snprintf(w->cfg.transport, sizeof(w->cfg.transport), "%s", ops->name);
	w->cfg.qps_per_link = 2;
	w->cfg.keepalive_interval_ms = 200;
	w->cfg.keepalive_timeout_ms = 1500;
	w->cfg.connect_timeout_ms = 4000;
	w->cfg.handshake_timeout_ms = 20000;
	w->cfg.backoff_initial_ms = 50;
	w->cfg.backoff_max_ms = 500;
	w->cfg.max_handshakes = 8;
	w->cfg.mailbox_size = 4096;
	for (int i = 0; i < NODES; i++) {
		w->nodes[i].id = (uint16_t)(10 + i);
		w->nodes[i].port = next_port++;
		snprintf(w->nodes[i].addr, sizeof(w->nodes[i].addr), "%s", addr);
	}
	w->cfg.nodes = w->nodes;
	w->cfg.n_nodes = NODES;
	for (int i = 0; i < NODES; i++)
		node_start(w, i);
	*state = w;
	return 0;
}

static int world_teardown(void **state)
{
	struct world *w = *state;

	for (int i = 0; i < NODES; i++)
		if (w->n[i].live)
			node_kill(w, i);
	free(w);
	return 0;
}

static void mesh_link__three_nodes__all_up_with_proven_keys(void **state)
{
	struct world *w = *state;

	assert_true(pump_until(w, all_up));
	for (int i = 0; i < NODES; i++) {
		for (int p = 0; p < NODES; p++) {
			struct link *l, *back;

			if (p == i)
				continue;
			l = link_of(w, i, p);
			back = link_of(w, p, i);
			assert_int_equal(link_qps_established(l), 2);
			assert_true(l->epoch == back->epoch);
			assert_int_equal(l->dialer, w->nodes[i].id > w->nodes[p].id);
			/* Each side holds the other's mailbox key, and proved it. */
			assert_true(l->peer_mb_addr == (uintptr_t)back->mailbox);
			assert_int_equal(l->peer_mb_rkey, back->mr_mailbox->rkey);
			assert_string_equal(link_transport(l), ops->name);
		}
	}
}

static void mesh_link__node_dies__peers_down_then_up_with_new_epoch(void **state)
{
	struct world *w = *state;
	uint64_t e0, e1;

	assert_true(pump_until(w, all_up));
	e0 = link_of(w, 0, 2)->epoch;
	e1 = link_of(w, 1, 2)->epoch;
	node_kill(w, 2);
	assert_true(pump_until(w, peers_of_2_down));
	assert_int_equal(link_state(link_of(w, 0, 1)), LINK_STATE_UP_);
	node_start(w, 2);
	assert_true(pump_until(w, all_up));
	assert_true(link_of(w, 0, 2)->epoch > e0);
	assert_true(link_of(w, 1, 2)->epoch > e1);
	assert_int_equal(link_of(w, 0, 2)->ups, 2);
}

/* A hung peer keeps its connections but answers nothing: only the keepalive timeout notices. */
static void mesh_link__peer_hangs__keepalive_down_then_recovers(void **state)
{
	struct world *w = *state;

	assert_true(pump_until(w, all_up));
	w->n[2].frozen = true;
	assert_true(pump_until(w, peers_of_2_down));
	assert_non_null(strstr(link_of(w, 0, 2)->last_error, "keepalive"));
	assert_non_null(strstr(link_of(w, 1, 2)->last_error, "keepalive"));
	w->n[2].frozen = false;
	assert_true(pump_until(w, all_up));
}

static const struct CMUnitTest tests[] = {
	cmocka_unit_test_setup_teardown(mesh_link__three_nodes__all_up_with_proven_keys, world_setup, world_teardown),
	cmocka_unit_test_setup_teardown(mesh_link__node_dies__peers_down_then_up_with_new_epoch, world_setup,
					world_teardown),
	cmocka_unit_test_setup_teardown(mesh_link__peer_hangs__keepalive_down_then_recovers, world_setup,
					world_teardown),
};

static int mesh_link_main(int argc, char **argv);

int main(int argc, char **argv)
{
	ops = provider_from_env("mesh_link_test", &addr, &next_port, 23000);
	if (!getenv("MESH_TEST_VERBOSE"))
		log_set_level(LOG_LVL_ERROR);
	return mesh_link_main(argc, argv);
}

#define main mesh_link_main
UNIT_MAIN(ops->name, tests, NULL, NULL)
