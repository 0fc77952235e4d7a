/*
 * Dialling and accepting a link's QPs (link_internal.h): an attempt begins (its epoch and
 * protection scope), the dialler connects every QP of every rail, and the acceptor judges each
 * connection request: private data, cluster, dial rule, the node's own address, epochs (stale,
 * ahead of our clock, an unproven attempt's), rail joins, admission. A refusal names no detail on
 * the wire (the log has it). Established QPs go on to the handshake (link_handshake.c). Which
 * peers are dialled, while admission's window (link_admit.c) has room, is mesh_admit's here.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <mesh/mesh.h>
#include "link_internal.h"
#include "log.h"
#include "mesh.h"
#include "util.h"

/* Starts an attempt: the epoch grows across our restarts (wall clock) and across attempts. */
/* A new attempt, with a protection scope of its own: a number never used before in this process,
 * as a pointer (scopes are only compared, never dereferenced; no heap address is that small). A
 * stranger's QP admitted into an attempt before its proof reaches nothing: the mailbox is
 * registered only for our Hello, and the link's channels only once it is UP. */
static void link_begin(struct link *l, uint64_t epoch)
{
	l->scope = (const void *)(uintptr_t)++l->mesh->scopes;
	l->epoch = epoch;
	l->attempt_ms = now_ms();
	l->est_mask = 0;
	link_set_phase(l, LINK_QPS);
}

void link_dial(struct link *l)
{
	struct mesh *m = l->mesh;
	uint8_t pdata[XPORT_PDATA_MAX];
	struct mesh_cm_pdata pd = {
		.kind = MESH_CM_CONNECT,
		.qp_count = (uint8_t)m->cfg->qps_per_link,
		.rail_count = (uint8_t)m->n_rails,
		.cluster_hash = m->cluster_hash,
		.src_node = m->self->id,
		.dst_node = l->peer->id,
		.boot_epoch = m->boot_epoch,
	};
	uint32_t q = m->cfg->qps_per_link;
	int ret = 0, len;

	link_begin(l, MAX(l->epoch + 1, util_wall_us()));
	pd.link_epoch = l->epoch;
	if (util_random(l->nonce_ours, AUTH_NONCE_LEN)) {
		link_fail(l, -EIO, "no random bytes for the attempt's nonce");
		return;
	}
	memcpy(pd.nonce, l->nonce_ours, AUTH_NONCE_LEN);
	log_debug("dialling node %u at %s:%u, epoch %llu", l->peer->id, l->peer->addr, l->peer->port,
		  (unsigned long long)l->epoch);
	for (uint32_t i = 0; i < mesh_link_qps(m) && !ret; i++) {
		uint32_t r = i / q;

		pd.rail = (uint8_t)r;
		pd.qp_index = (uint8_t)(i % q);
		len = mesh_cm_pdata_encode(&pd, pdata, sizeof(pdata));
		ret = xport_connect(mesh_xport(m, l->xp, r), mesh_node_addr(m->self, r), mesh_node_addr(l->peer, r),
				    l->peer->port, pdata, (size_t)len, l, i, &l->conns[i]);
		if (ret) {
			l->conns[i] = NULL;
			link_fail(l, ret, "cannot dial %s:%u (rail %u)", mesh_node_addr(l->peer, r), l->peer->port, r);
		} else {
			l->conns[i]->scope = l->scope; /* before its QP exists (route resolved) */
		}
	}
}

/* Dials the peers that are due, round the links from where the last look stopped, while the window
 * and cluster.max_handshakes leave room. */
void mesh_admit(struct mesh *m, uint64_t t)
{
	size_t n = m->n_links, i = m->adm.next;

	for (size_t k = 0; k < n && !m->stopping; k++, i = (i + 1) % n) {
		struct link *l = m->links[i];

		if (m->adm.dials >= mesh_dial_window(m) || m->handshakes >= m->cfg->max_handshakes)
			break;
		if (!l->dialer || l->phase != LINK_IDLE || t < l->next_dial_ms || l->failed_tick == m->adm.ticks)
			continue;
		link_dial(l);
		m->adm.next = (i + 1) % n;
	}
	m->adm.ended = false; /* what ended before or failed at once above: looked at now, or backing off */
}

/* Refuses connection c for `reason`, with the detail (fmt) in our log only. Strangers choose how
 * often we refuse them, so at most REJECT_LOG_BURST such lines per REJECT_LOG_INTERVAL_MS are
 * written. The wire says only what a real peer acts on: come back later (EBUSY, ESHUTDOWN), with a
 * newer epoch (ESTALE), not twice (EDUPQP), in our protocol version (EPROTOVER); every other reason
 * is the generic MESH_EREFUSED, and no cluster hash, node id or epoch travels with it, so a prober
 * learns neither the cluster's hash nor which of its fields was wrong. */
void mesh_reject(struct mesh *m, xport_conn_t *c, int reason, enum log_level lvl, const char *fmt, ...)
{
	uint8_t pdata[XPORT_PDATA_MAX];
	struct mesh_cm_pdata pd = {.kind = MESH_CM_REJECT, .reason = -MESH_EREFUSED};
	uint64_t dropped;
	int len;

	if (reason == -MESH_EBUSY || reason == -MESH_ESHUTDOWN || reason == -MESH_ESTALE || reason == -MESH_EDUPQP ||
	    reason == -MESH_EPROTOVER)
		pd.reason = reason;
	m->peer_rejects++;
	m->last_reject_reason = reason;
	if (lvl <= log_current_level && log_ratelimit_ok(&m->reject_log, now_ms(), &dropped)) {
		char detail[512];
		va_list ap;

		va_start(ap, fmt);
		vsnprintf(detail, sizeof(detail), fmt, ap);
		va_end(ap);
		if (dropped)
			log_warn("%llu connection refusals were not logged (more than %u in %u s)",
				 (unsigned long long)dropped, REJECT_LOG_BURST, REJECT_LOG_INTERVAL_MS / 1000);
		log_at(lvl, "rejecting %s%s: %s", c->peer_addr, detail, mesh_strerror(reason));
	}
	len = mesh_cm_pdata_encode(&pd, pdata, sizeof(pdata));
	xport_reject(c, pdata, (size_t)len);
	mesh_bury_conn(m, c);
}

/* Takes connection c as QP idx of the link (an attempt's or a rail's join): registers and posts
 * receives as its first QP needs, then accepts with our private data answering req. */
static int link_accept_conn(struct link *l, xport_conn_t *c, uint32_t idx, const struct mesh_cm_pdata *req)
{
	struct mesh *m = l->mesh;
	uint8_t pdata[XPORT_PDATA_MAX];
	struct mesh_cm_pdata rep = *req;
	int ret, len;

	c->ctx = l;
	c->scope = l->scope; /* what we register through it is for this attempt's peer alone */
	c->index = idx;
	l->conns[idx] = c;
	ret = xport_admit(c);
	if (!ret)
		ret = link_register(l, c);
	if (!ret)
		ret = link_post_recvs(l, c);
	if (ret)
		return ret;
	rep.kind = MESH_CM_ACCEPT;
	rep.src_node = m->self->id;
	rep.dst_node = req->src_node;
	rep.boot_epoch = m->boot_epoch;
	memset(rep.nonce, 0, sizeof(rep.nonce));
	if (req->qp_index == 0 && (req->rail == 0 || (req->flags & MESH_CM_F_RAIL_JOIN))) {
		ret = link_accept_auth(l, req, &rep);
		if (ret)
			return ret;
	}
	len = mesh_cm_pdata_encode(&rep, pdata, sizeof(pdata));
	return xport_accept(c, pdata, (size_t)len);
}

/* A connection request: validate the private data against the configuration and the dial rule,
 * then join it to the link's current attempt (or start a new one for a newer epoch). */
/* The link a connection request is for, once it passed every check that needs no epoch: private
 * data, cluster, this node, a configured node, the dial rule, QPs and rails per link, the rail it
 * came to, the node's own address. NULL: refused (said). *xp and *rail: where it came. */
static struct link *request_link(struct mesh *m, const struct xport_event *ev, struct mesh_cm_pdata *pd, size_t *xp,
				 uint32_t *rail)
{
	xport_conn_t *c = ev->conn;
	struct link *l;
	int ret;

	ret = mesh_cm_pdata_decode(ev->pdata, ev->pdata_len, pd);
	if (!ret && pd->kind != MESH_CM_CONNECT)
		ret = -EPROTO;
	if (ret) {
		/* Plain errno values do not fit the reason field: say "malformed" rather than nothing. */
		mesh_reject(m, c, ret == -MESH_EBADMAGIC || ret == -MESH_EPROTOVER ? ret : -MESH_EPDATA, LOG_LVL_WARN,
			    ": bad private data (%u bytes)", ev->pdata_len);
		return NULL;
	}
	if (pd->cluster_hash != m->cluster_hash) {
		mesh_reject(m, c, -MESH_ECLUSTER, LOG_LVL_WARN, " (node %u): cluster hash 0x%08x, ours 0x%08x (\"%s\")",
			    pd->src_node, pd->cluster_hash, m->cluster_hash, m->cfg->cluster_name);
		return NULL;
	}
	if (pd->dst_node != m->self->id) {
		mesh_reject(m, c, -MESH_EUNKNOWNNODE, LOG_LVL_WARN, " (node %u): it dialled node %u, we are node %u",
			    pd->src_node, pd->dst_node, m->self->id);
		return NULL;
	}
	l = mesh_link_find(m, pd->src_node);
	if (!l) {
		mesh_reject(m, c, -MESH_EUNKNOWNNODE, LOG_LVL_WARN, ": node %u is not in %s", pd->src_node, m->cfg->path);
		return NULL;
	}
	if (!mesh_dials(pd->src_node, m->self->id)) {
		mesh_reject(m, c, -MESH_EDIALRULE, LOG_LVL_WARN, ": node %u dialled node %u, but the higher id dials",
			    pd->src_node, m->self->id);
		return NULL;
	}
	if (pd->qp_count != m->cfg->qps_per_link) {
		mesh_reject(m, c, -MESH_EQPCOUNT, LOG_LVL_WARN, " (node %u): %u QPs per link, ours %u", pd->src_node,
			    pd->qp_count, m->cfg->qps_per_link);
		return NULL;
	}
	if (pd->rail_count != m->n_rails) {
		mesh_reject(m, c, -MESH_EQPCOUNT, LOG_LVL_WARN, " (node %u): %u rails, ours %u (nodes.rails)",
			    pd->src_node, pd->rail_count, m->n_rails);
		return NULL;
	}
	/* Rail r's QPs come to rail r's address: a QP on another device could not reach the memory
	 * a channel of rail r registered. */
	for (size_t i = 0; i < m->n_xports * m->n_rails; i++)
		if (m->xports[i] == c->xport) {
			*xp = i / m->n_rails;
			*rail = (uint32_t)(i % m->n_rails);
		}
	if (*rail != pd->rail) {
		mesh_reject(m, c, -MESH_EPDATA, LOG_LVL_WARN, " (node %u): QP of rail %u came to %s, our rail %u",
			    pd->src_node, pd->rail, mesh_node_addr(m->self, *rail), *rail);
		return NULL;
	}
	/* A node is bound to its configured addresses: a connection claiming node N on rail r comes from
	 * N's address of rail r (its dialler binds its source there), or it is a stranger. */
	if (!util_addr_same_host(c->peer_addr, mesh_node_addr(l->peer, *rail))) {
		mesh_reject(m, c, -MESH_EUNKNOWNNODE, LOG_LVL_WARN, ": it claims node %u, whose rail %u address is %s",
			    pd->src_node, *rail, mesh_node_addr(l->peer, *rail));
		return NULL;
	}
	return l;
}

/* A failed rail of the UP link, dialled again: only by the same peer process, for this link epoch,
 * over the link's provider, and only once the rail is down here too. */
static void request_rail_join(struct link *l, xport_conn_t *c, const struct mesh_cm_pdata *pd, uint32_t rail,
			      size_t xp, uint32_t idx)
{
	struct mesh *m = l->mesh;
	const char *bad = NULL;
	int ret, reason = -MESH_ESTALE;
	uint32_t bit = 1u << rail;

	if (!link_sequenced(l) || pd->link_epoch != l->epoch || pd->boot_epoch != l->peer_boot_epoch || xp != l->xp)
		bad = "it is not of the UP link";
	else if ((l->rails_up | l->raildown_pending) & bit)
		bad = "the rail is still UP here", reason = -MESH_EBUSY;
	else if ((l->rails_joining & bit) && pd->rail_gen != l->rail_gen[rail]) {
		if ((int16_t)(pd->rail_gen - l->rail_gen[rail]) > 0)
			link_rail_bury(l, rail); /* a newer join replaces the one in flight */
		else
			bad = "an older join";
	}
	if (!bad && l->conns[idx])
		bad = "that QP is already there", reason = -MESH_EDUPQP;
	if (bad) {
		mesh_reject(m, c, reason, LOG_LVL_INFO, " (node %u): rail %u join gen %u of epoch %llu: %s",
			    pd->src_node, rail, pd->rail_gen, (unsigned long long)pd->link_epoch, bad);
		return;
	}
	if (!(l->rails_joining & bit)) {
		l->rails_joining |= bit;
		l->rails_peer_up &= ~bit;
		l->rails_railup_sent &= ~bit;
		l->rail_gen[rail] = pd->rail_gen;
		l->rail_attempt_ms[rail] = now_ms();
	}
	ret = link_accept_conn(l, c, idx, pd);
	if (ret)
		link_rail_fail(l, rail, ret, "cannot accept QP %u of the rail's join", idx);
}

/* Whether a connection request's epoch may go on: stale, ahead of our clock, a newer attempt on a
 * live UP link or one that finds the handshakes full is refused (false, said); a newer one (or, against
 * an unproven attempt, any first QP) replaces the attempt in flight, and an idle link begins one. */
static bool request_epoch_ok(struct link *l, xport_conn_t *c, const struct mesh_cm_pdata *pd, uint32_t idx)
{
	struct mesh *m = l->mesh;
	bool unproven;

	/* Epochs follow the dialler's wall clock: one far in the future is a forgery that would make
	 * every real attempt look stale. */
	if (pd->link_epoch > util_wall_us() + LINK_EPOCH_AHEAD_US) {
		mesh_reject(m, c, -MESH_ESTALE, LOG_LVL_WARN, " (node %u): epoch %llu is more than %llu s ahead of our clock",
			    pd->src_node, (unsigned long long)pd->link_epoch,
			    (unsigned long long)(LINK_EPOCH_AHEAD_US / 1000000));
		return false;
	}
	/* With a cluster key, an attempt whose dialler has not proved the key holds no epoch: against it
	 * a newcomer is judged by the last proven epoch, and the first QP of one replaces it whatever
	 * its epoch. Otherwise a stranger's CONNECT with an epoch minutes ahead made every real attempt
	 * stale for as long as it stayed unproven (the handshake timeout), and one such CONNECT per
	 * timeout kept the real node out for good (issue 38). A late QP of an ended attempt is still
	 * stale, and a newcomer that is not a first QP cannot replace anything. */
	unproven = m->keys.n && l->phase != LINK_IDLE && l->phase != LINK_UP && !l->peer_proved;
	if (unproven && pd->link_epoch < l->epoch &&
	    (idx != 0 || pd->link_epoch <= l->epoch_proven || pd->link_epoch == l->epoch_ended)) {
		mesh_reject(m, c, -MESH_ESTALE, LOG_LVL_WARN, " (node %u): epoch %llu, QP %u, while the attempt of epoch %llu "
			    "is unproven", pd->src_node, (unsigned long long)pd->link_epoch, idx, (unsigned long long)l->epoch);
		return false;
	}
	/* Older than the link, or of the attempt that just ended (a late QP of a failed attempt must
	 * not start an orphan attempt that holds an admission slot). */
	if ((pd->link_epoch < l->epoch && !unproven) || (pd->link_epoch == l->epoch_ended && pd->link_epoch != l->epoch) ||
	    (l->phase == LINK_IDLE && pd->link_epoch == l->epoch)) {
		mesh_reject(m, c, -MESH_ESTALE, LOG_LVL_WARN, " (node %u): stale epoch %llu, current %llu", pd->src_node,
			    (unsigned long long)pd->link_epoch, (unsigned long long)l->epoch);
		return false;
	}
	/* With a cluster key an UP link whose peer is alive is not given up for an attempt that has
	 * proved nothing yet: that is how a stranger would take it DOWN. A restarted peer's old link
	 * falls silent (or disconnects), and its new attempt is taken once the link was quiet for two
	 * keepalive intervals. */
	if (pd->link_epoch > l->epoch && l->phase == LINK_UP && m->keys.n &&
	    now_ms() - l->last_rx_ms < 2ull * m->cfg->keepalive_interval_ms) {
		mesh_reject(m, c, -MESH_EBUSY, LOG_LVL_WARN,
			    " (node %u): epoch %llu while the link of epoch %llu is UP and its peer alive", pd->src_node,
			    (unsigned long long)pd->link_epoch, (unsigned long long)l->epoch);
		return false;
	}
	if (pd->link_epoch > l->epoch || l->phase == LINK_IDLE || (unproven && pd->link_epoch != l->epoch)) {
		if (l->phase == LINK_IDLE && m->handshakes >= m->cfg->max_handshakes) {
			mesh_reject(m, c, -MESH_EBUSY, LOG_LVL_INFO, " (node %u): %u handshakes in flight", pd->src_node,
				    m->handshakes);
			return false;
		}
		if (l->phase != LINK_IDLE)
			link_fail(l, -MESH_ESTALE, "node %u re-dialled with epoch %llu", pd->src_node,
				  (unsigned long long)pd->link_epoch);
		link_begin(l, pd->link_epoch);
	}
	return true;
}

void mesh_on_request(struct mesh *m, const struct xport_event *ev)
{
	xport_conn_t *c = ev->conn;
	struct mesh_cm_pdata pd;
	struct link *l;
	uint32_t idx, rail = 0;
	size_t xp = 0;
	int ret;

	l = request_link(m, ev, &pd, &xp, &rail);
	if (!l)
		return;
	idx = pd.rail * m->cfg->qps_per_link + pd.qp_index;
	if (pd.flags & MESH_CM_F_RAIL_JOIN) {
		request_rail_join(l, c, &pd, rail, xp, idx);
		return;
	}
	if (!request_epoch_ok(l, c, &pd, idx))
		return;
	if (l->phase != LINK_QPS || l->conns[idx]) {
		mesh_reject(m, c, -MESH_EDUPQP, LOG_LVL_WARN, " (node %u): QP %u of epoch %llu %s", pd.src_node, idx,
			    (unsigned long long)pd.link_epoch, l->phase != LINK_QPS ? "after the handshake began" : "twice");
		return;
	}
	l->xp = (uint8_t)xp;
	ret = link_accept_conn(l, c, idx, &pd);
	if (ret)
		link_fail(l, ret, "cannot accept QP %u", idx);
}

void mesh_on_established(struct link *l, const struct xport_event *ev)
{
	struct mesh *m = l->mesh;
	struct mesh_cm_pdata pd;
	int ret;

	if (l->phase == LINK_UP && (l->rails_joining & (1u << link_qp_rail(l, ev->conn->index)))) {
		uint32_t r = link_qp_rail(l, ev->conn->index);

		if (l->dialer) {
			ret = mesh_cm_pdata_decode(ev->pdata, ev->pdata_len, &pd);
			if (!ret && (pd.kind != MESH_CM_ACCEPT || pd.src_node != l->peer->id || pd.dst_node != m->self->id ||
				     pd.link_epoch != l->epoch || pd.rail_count != m->n_rails || !(pd.flags & MESH_CM_F_RAIL_JOIN) ||
				     pd.rail_gen != l->rail_gen[r] || pd.cluster_hash != m->cluster_hash ||
				     pd.rail * m->cfg->qps_per_link + pd.qp_index != ev->conn->index))
				ret = -MESH_EPEERMSG;
			if (!ret && pd.qp_index == 0) {
				const char *why = "";

				ret = link_take_accept_auth(l, &pd, &why);
				if (ret) {
					link_rail_fail(l, r, ret, "node %u's accept of rail %u's join: %s", l->peer->id, r, why);
					return;
				}
			}
			if (!ret)
				ret = link_register(l, ev->conn);
			if (!ret)
				ret = link_post_recvs(l, ev->conn);
			if (ret) {
				link_rail_fail(l, r, ret, "QP %u of the rail's join: bad accept or cannot post", ev->conn->index);
				return;
			}
		}
		l->est_mask |= 1ull << ev->conn->index;
		link_rail_progress(l, r);
		return;
	}
	if (l->phase != LINK_QPS) {
		link_fail(l, -EPROTO, "QP %u established in phase %s", ev->conn->index, link_phase_name(l->phase));
		return;
	}
	if (l->dialer) {
		/* The acceptor answers with its own private data: check it as strictly as a request. */
		ret = mesh_cm_pdata_decode(ev->pdata, ev->pdata_len, &pd);
		if (!ret && (pd.kind != MESH_CM_ACCEPT || pd.src_node != l->peer->id || pd.dst_node != m->self->id ||
			     pd.link_epoch != l->epoch || pd.rail_count != m->n_rails ||
			     pd.rail * m->cfg->qps_per_link + pd.qp_index != ev->conn->index))
			ret = -MESH_EPEERMSG;
		if (!ret && pd.cluster_hash != m->cluster_hash)
			ret = -MESH_ECLUSTER;
		if (ret) {
			link_fail(l, ret, "QP %u: bad accept private data from %s", ev->conn->index, ev->conn->peer_addr);
			return;
		}
		if (ev->conn->index == 0) {
			const char *why = "";

			ret = link_take_accept_auth(l, &pd, &why);
			if (ret) {
				link_fail(l, ret, "node %u's accept: %s", l->peer->id, why);
				return;
			}
		}
		ret = link_register(l, ev->conn);
		if (!ret)
			ret = link_post_recvs(l, ev->conn);
		if (ret) {
			link_fail(l, ret, "cannot register or post on QP %u", ev->conn->index);
			return;
		}
	}
	l->est_mask |= 1ull << ev->conn->index;
	link_note_state(l);
	link_progress(l);
}
