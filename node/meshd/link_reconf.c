/*
 * A reload's share of the link layer (SIGHUP, `meshctl reload`: main.c). main.c loaded the new
 * configuration, checked that no key only a start applies changed (config_reload_check) and put it
 * where m->cfg points; the links still point at the nodes of the configuration before. Here every
 * link is pointed at its node in the new one, and only the links the change is about are touched:
 *   - a node removed: its link leaves m->links at once (no dial, request or channel finds it), its
 *     channels fail with MESH_EREMOVED, and an UP link first tells the peer so by a Goodbye, which
 *     is given LINK_LEAVE_GRACE_MS to go out before the QPs close (as at a stop);
 *   - a node added: a new idle link (a dialler dials at once, as at start);
 *   - a node's address, port or rails changed: its link re-forms there (its channels resume);
 *   - every other link keeps its QPs, its channels and its counters: no flap, no resume.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <mesh/mesh.h>

#include "link_internal.h"
#include "log.h"
#include "util.h"

/* Whether a link to a must re-form to reach b: where it dials or is dialled from. */
static bool node_moved(const struct config_node *a, const struct config_node *b)
{
	if (a->port != b->port || MAX(1u, a->n_rails) != MAX(1u, b->n_rails))
		return true;
	for (uint32_t r = 0; r < MAX(1u, a->n_rails); r++)
		if (strcmp(mesh_node_addr(a, r), mesh_node_addr(b, r)))
			return true;
	return false;
}

static int leaving_push(struct mesh *m, struct link *l)
{
	if (m->n_leaving == m->leaving_cap) {
		size_t nc = m->leaving_cap ? m->leaving_cap * 2 : 8;
		struct link **a = realloc(m->leaving, nc * sizeof(*a));

		if (!a)
			return -ENOMEM;
		m->leaving = a;
		m->leaving_cap = nc;
	}
	m->leaving[m->n_leaving++] = l;
	return 0;
}

/* The peer of l is no longer in the configuration: its channels fail now, the peer hears why. */
static void link_remove(struct mesh *m, struct link *l)
{
	bool bye = l->phase == LINK_UP && (l->features & MESH_FEAT_GOODBYE);

	log_info("node %u was removed from the configuration: closing its link (%s)", l->peer->id,
		 link_state_name(link_state(l)));
	l->peer_own = malloc(sizeof(*l->peer_own));
	if (l->peer_own) {
		*l->peer_own = *l->peer;
		l->peer = l->peer_own;
	} else {
		bye = false; /* no memory to keep it: it closes now, while its entry is still there */
	}
	l->leave_ms = util_now_ms() + (bye ? LINK_LEAVE_GRACE_MS : 0);
	if (bye) {
		Goodbye g = GOODBYE__INIT;
		PeerMsg msg = PEER_MSG__INIT;

		g.reason = MESH_EREMOVED;
		msg.body_case = PEER_MSG__BODY_GOODBYE;
		msg.goodbye = &g;
		if (mesh_link_send(l, &msg))
			l->leave_ms = util_now_ms(); /* no room to say it: the close says the rest */
	}
	/* Channels fail now, also those waiting on a DOWN link to resume: nothing will resume them. */
	if (m->upper)
		m->upper->link_down(l, -MESH_EREMOVED, false);
	if (l->leave_ms <= util_now_ms() || leaving_push(m, l)) {
		link_fail(l, -MESH_EREMOVED, "node %u was removed from the configuration", l->peer->id);
		mesh_link_free(m, l, true);
	}
}

void mesh_leaving_tick(struct mesh *m, uint64_t t, bool all)
{
	size_t k = 0;

	for (size_t i = 0; i < m->n_leaving; i++) {
		struct link *l = m->leaving[i];

		if (all || l->phase == LINK_IDLE || t >= l->leave_ms) {
			link_fail(l, -MESH_EREMOVED, "node %u was removed from the configuration", l->peer->id);
			mesh_link_free(m, l, true); /* at a stop, mesh_cleanup reaps next */
		} else {
			m->leaving[k++] = l;
		}
	}
	m->n_leaving = k;
	if (all) {
		free(m->leaving);
		m->leaving = NULL;
		m->leaving_cap = 0;
	}
}

/* Makes room for one more link; 0 or -ENOMEM. */
static int links_reserve(struct mesh *m)
{
	struct link **a;
	size_t nc;

	if (m->n_links < m->links_cap)
		return 0;
	nc = m->links_cap ? m->links_cap * 2 : 4;
	a = realloc(m->links, nc * sizeof(*a));
	if (!a)
		return -ENOMEM;
	m->links = a;
	m->links_cap = nc;
	return 0;
}

int mesh_reconfigure(struct mesh *m, const struct config_node *self, struct mesh_reconf *out)
{
	const struct mesh_config *cfg = m->cfg;
	size_t k = 0;
	int ret = 0;

	memset(out, 0, sizeof(*out));
	m->self = self;
	/* Links of nodes that stay are pointed at their new entries; the others leave. */
	for (size_t i = 0; i < m->n_links; i++) {
		struct link *l = m->links[i];
		const struct config_node *n = config_node_find(cfg, l->peer->id);

		if (!n || n == self) {
			out->removed++;
			link_remove(m, l);
			continue;
		}
		m->links[k++] = l;
		if (node_moved(l->peer, n)) {
			out->moved++;
			log_info("node %u moved in the configuration (%s port %u -> %s port %u, %u rail(s)): its link re-forms there",
				 n->id, l->peer->addr, l->peer->port, n->addr, n->port, MAX(1u, n->n_rails));
			l->peer = n;
			/* Its channels wait to resume, as after any DOWN; a dialler dials the new place at
			 * once, without the backoff of failures at the old one. */
			link_fail(l, -ECANCELED, "node %u moved in the configuration", n->id);
			l->failures = 0;
			l->next_dial_ms = util_now_ms();
		} else {
			l->peer = n;
		}
	}
	m->n_links = k;
	/* Nodes added: links in id order, as mesh_init makes them. */
	for (size_t i = 0; i < cfg->n_nodes; i++) {
		const struct config_node *n = &cfg->nodes[i];
		struct link *l;
		size_t at;

		if (n == self || mesh_link_find(m, n->id))
			continue;
		l = links_reserve(m) ? NULL : mesh_link_new(m, n);
		if (!l) {
			log_error("node %u added to the configuration: no memory for its link", n->id);
			ret = -ENOMEM;
			continue;
		}
		at = mesh_link_slot(m, n->id);
		memmove(&m->links[at + 1], &m->links[at], (m->n_links - at) * sizeof(*m->links));
		m->links[at] = l;
		m->n_links++;
		out->added++;
		log_info("node %u added to the configuration at %s port %u: %s", n->id, n->addr, n->port,
			 l->dialer ? "dialling it" : "waiting for its dial");
	}
	if (m->adm.next >= m->n_links)
		m->adm.next = 0;
	return ret;
}
