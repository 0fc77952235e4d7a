/*
 * The handshake of a link attempt, from connected QPs to UP: the proof of the cluster key (auth.h)
 * in the CM private data and AuthProof, on the attempt's first QP and on a rail's join; then Hello
 * (the mailbox key, sent only once the peer proved the key), the proof of the peer's mailbox key by
 * a WRITE and a READ back on every QP, and Ready. link_progress() steps an attempt through these
 * phases; link_connect.c calls it as QPs connect, and mesh.c as messages arrive.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <mesh/mesh.h>

#include "auth.h"
#include "link_internal.h"
#include "log.h"
#include "mesh.h"
#include "util.h"

_Static_assert(AUTH_NONCE_LEN == MESH_AUTH_NONCE_LEN && AUTH_MAC_LEN == MESH_AUTH_MAC_LEN,
	       "the proof and the private data disagree on nonce or MAC sizes");

/* ---- the proof of the cluster key (auth.h) ---- */

/* The transcript of the link's proof (rail 0, gen 0) or of rail r's join (gen), as the prover
 * (dialler_proves) makes it; ours and theirs are our nonce and the peer's. */
static struct auth_transcript link_transcript(const struct link *l, bool dialler_proves, uint32_t rail, uint32_t gen,
					      const uint8_t *ours, const uint8_t *theirs)
{
	struct auth_transcript t = {
		.cluster = l->mesh->cfg->cluster_name,
		.dialler_proves = dialler_proves,
		.dialler = l->dialer ? l->mesh->self->id : l->peer->id,
		.acceptor = l->dialer ? l->peer->id : l->mesh->self->id,
		.link_epoch = l->epoch,
		.rail = rail,
		.gen = gen,
		.nonce_dialler = l->dialer ? ours : theirs,
		.nonce_acceptor = l->dialer ? theirs : ours,
	};

	return t;
}

int link_send_proof(struct link *l, uint32_t qp, uint32_t rail, uint32_t gen, const uint8_t *ours,
		    const uint8_t *theirs)
{
	struct auth_transcript t = link_transcript(l, l->dialer, rail, gen, ours, theirs);
	uint8_t mac[AUTH_MAC_LEN];
	PeerMsg msg = PEER_MSG__INIT;
	AuthProof p = AUTH_PROOF__INIT;
	int ret = auth_prove(&l->mesh->keys, &t, mac);

	if (ret)
		return ret;
	p.mac.data = mac;
	p.mac.len = sizeof(mac);
	msg.body_case = PEER_MSG__BODY_AUTH_PROOF;
	msg.auth_proof = &p;
	return link_send_on(l, qp, &msg);
}

bool link_check_proof(const struct link *l, uint32_t rail, uint32_t gen, const uint8_t *ours, const uint8_t *theirs,
		      const uint8_t *mac, size_t mac_len)
{
	struct auth_transcript t = link_transcript(l, !l->dialer, rail, gen, ours, theirs);

	return auth_verify(&l->mesh->keys, &t, mac, mac_len);
}

/* The acceptor, answering the first QP of an attempt (rail 0, QP 0) or of rail r's join: takes the
 * dialler's nonce from its request, puts ours in the accept and, with a key, our proof over both, so
 * the dialler knows we hold the key the moment that QP connects (its proof comes back as AuthProof). */
/* Which proof a first QP's private data belongs to: the link attempt's (rail 0, gen 0) or rail r's
 * join's, with that proof's nonces. */
struct link_auth_slot {
	uint32_t rail, gen;
	uint8_t *ours, *theirs;
};

static struct link_auth_slot link_auth_slot(struct link *l, const struct mesh_cm_pdata *pd)
{
	bool join = pd->flags & MESH_CM_F_RAIL_JOIN;
	uint32_t r = join ? pd->rail : 0;

	return (struct link_auth_slot){
		.rail = r,
		.gen = join ? l->rail_gen[r] : 0,
		.ours = join ? l->rail_nonce_ours[r] : l->nonce_ours,
		.theirs = join ? l->rail_nonce_peer[r] : l->nonce_peer,
	};
}

int link_accept_auth(struct link *l, const struct mesh_cm_pdata *req, struct mesh_cm_pdata *rep)
{
	bool join = req->flags & MESH_CM_F_RAIL_JOIN;
	struct link_auth_slot a = link_auth_slot(l, req);
	uint32_t r = a.rail;
	struct auth_transcript t;
	int ret = util_random(a.ours, AUTH_NONCE_LEN);

	if (ret)
		return ret;
	memcpy(a.theirs, req->nonce, AUTH_NONCE_LEN);
	memcpy(rep->nonce, a.ours, AUTH_NONCE_LEN);
	if (!l->mesh->keys.n)
		return 0;
	t = link_transcript(l, false, r, a.gen, a.ours, a.theirs);
	ret = auth_prove(&l->mesh->keys, &t, rep->mac);
	if (ret)
		return ret;
	rep->flags |= MESH_CM_F_PROOF;
	if (join)
		l->rails_proof_sent |= 1u << r;
	else
		l->auth_proof_sent = true;
	return 0;
}

/* The dialler, on the accept of the first QP of an attempt or of rail r's join: the acceptor's nonce,
 * and with a key its proof, which must verify. 0 or -MESH_EAUTH with *why. */
int link_take_accept_auth(struct link *l, const struct mesh_cm_pdata *pd, const char **why)
{
	bool join = pd->flags & MESH_CM_F_RAIL_JOIN;
	struct link_auth_slot a = link_auth_slot(l, pd);
	bool proof = pd->flags & MESH_CM_F_PROOF;

	if (!l->mesh->keys.n && proof) {
		*why = "it proves a cluster key; this node has none (cluster.key_file)";
		return -MESH_EAUTH;
	}
	if (l->mesh->keys.n && !proof) {
		*why = "it accepted without proving the cluster key (no cluster.key_file there?)";
		return -MESH_EAUTH;
	}
	if (proof && !link_check_proof(l, a.rail, a.gen, a.ours, pd->nonce, pd->mac, sizeof(pd->mac))) {
		*why = "its proof of the cluster key does not verify (another key?)";
		return -MESH_EAUTH;
	}
	memcpy(a.theirs, pd->nonce, AUTH_NONCE_LEN);
	if (join && proof)
		l->rails_peer_proved |= 1u << a.rail;
	else if (!join)
		l->peer_proved = proof;
	return 0;
}

/* ---- Hello, the proof of the mailbox key, Ready ---- */

static int link_send_hello(struct link *l)
{
	struct mesh *m = l->mesh;
	Hello h = HELLO__INIT;
	PeerMsg msg = PEER_MSG__INIT;
	int ret = link_register_mailbox(l);

	if (ret)
		return ret;
	h.node_id = m->self->id;
	h.cluster_hash = m->cluster_hash;
	h.boot_epoch = m->boot_epoch;
	h.predecessor_epoch = m->predecessor_epoch;
	h.link_epoch = l->epoch;
	h.features = MESH_FEAT_ALL;
	h.qp_count = m->cfg->qps_per_link;
	h.mailbox_addr = (uintptr_t)l->mailbox;
	h.mailbox_len = m->cfg->mailbox_size;
	h.mailbox_rkey = l->mr_mailbox->rkey;
	msg.body_case = PEER_MSG__BODY_HELLO;
	msg.hello = &h;
	return mesh_link_send(l, &msg);
}

/* Proves the peer's mailbox key on every QP: write our token into slot i, read slot i back. RC
 * executes requests of one QP in order, so the READ returns what the WRITE stored. */
static int link_start_proof(struct link *l)
{
	uint32_t q = l->mesh->cfg->qps_per_link;
	uint8_t *token = l->buf + BUF_TOKEN_OFF(l->mesh); /* the WRITE's source must be registered memory */
	int ret;

	ret = util_random(token, MESH_PROOF_LEN);
	if (ret)
		return ret;
	/* Bind the token to this node, so two peers' tokens never collide. */
	token[0] = (uint8_t)(l->mesh->self->id >> 8);
	token[1] = (uint8_t)l->mesh->self->id;
	for (uint32_t i = 0; i < q; i++) {
		uint64_t raddr = l->peer_mb_addr + (uint64_t)i * MESH_PROOF_LEN;
		uint8_t *scratch = l->buf + BUF_PROOF_OFF(l->mesh) + i * MESH_PROOF_LEN;

		memset(scratch, 0, MESH_PROOF_LEN);
		ret = xport_post_write(l->conns[i], l->mr_local, token, MESH_PROOF_LEN, raddr, l->peer_mb_rkey,
				       WR_ID(WR_PROOF_WRITE, i));
		if (ret)
			return ret;
		ret = xport_post_read(l->conns[i], l->mr_local, scratch, MESH_PROOF_LEN, raddr, l->peer_mb_rkey,
				      WR_ID(WR_PROOF_READ, i));
		if (ret)
			return ret;
		l->sq_used[i] += 2;
	}
	return 0;
}

/* Our Hello (with the mailbox registered for it) and the phase that waits for the peer's: the next
 * step of a keyless attempt once its QPs are up, of a keyed one once the peer proved the key.
 * False when the link failed. */
static bool link_go_hello(struct link *l)
{
	int ret = link_send_hello(l);

	if (ret) {
		link_fail(l, ret, "cannot register the mailbox or send Hello");
		return false;
	}
	link_set_phase(l, LINK_HELLO);
	return true;
}

void link_progress(struct link *l)
{
	struct mesh *m = l->mesh;
	int ret;

	if (l->phase == LINK_QPS && link_qps_established(l) == mesh_link_qps(m)) {
		if (m->keys.n) {
			/* Nothing of the link (the mailbox key in our Hello) before the peer proved the key:
			 * the acceptor proved it in its accept, the dialler proves it now. */
			if (!l->auth_proof_sent) {
				ret = link_send_proof(l, 0, 0, 0, l->nonce_ours, l->nonce_peer);
				if (ret) {
					link_fail(l, ret, "cannot send the proof of the cluster key");
					return;
				}
				l->auth_proof_sent = true;
			}
			link_set_phase(l, LINK_AUTH);
		} else if (!link_go_hello(l)) {
			return;
		}
	}
	if (l->phase == LINK_AUTH && l->peer_proved && !link_go_hello(l))
		return;
	if (l->phase == LINK_HELLO && l->have_peer_hello) {
		ret = link_start_proof(l);
		if (ret) {
			link_fail(l, ret, "cannot post the mailbox proof");
			return;
		}
		link_set_phase(l, LINK_PROOF);
	}
	if (l->phase == LINK_PROOF && l->proofs_done == m->cfg->qps_per_link) {
		PeerMsg msg = PEER_MSG__INIT;
		Ready r = READY__INIT;

		r.link_epoch = l->epoch;
		msg.body_case = PEER_MSG__BODY_READY;
		msg.ready = &r;
		ret = mesh_link_send(l, &msg);
		if (ret) {
			link_fail(l, ret, "cannot send Ready");
			return;
		}
		link_set_phase(l, LINK_READY_WAIT);
	}
	if (l->phase == LINK_READY_WAIT && l->peer_ready) {
		uint64_t t = now_ms();

		link_set_phase(l, LINK_UP);
		l->ups++;
		l->xp_up = l->xp;
		l->failures = 0;
		l->last_rx_ms = t;
		for (uint32_t r = 0; r < MESH_RAILS_MAX; r++)
			l->rail_rx_ms[r] = t;
		l->next_ka_ms = t;
		l->last_error[0] = '\0';
		l->rails_up = (1u << m->n_rails) - 1;
		l->ctl_rail = 0;
		memset(l->rail_failures, 0, sizeof(l->rail_failures));
		for (uint32_t r = 0; r < MESH_RAILS_MAX; r++)
			l->rail_error[r][0] = '\0';
		if (l->dialer)
			mesh_adm_on_up(m, t - l->attempt_ms);
		if (m->upper)
			m->upper->link_up(l);
		log_info("link to node %u UP: epoch %llu, %u QPs, peer mailbox 0x%llx len %u rkey 0x%x, %llu ms",
			 l->peer->id, (unsigned long long)l->epoch, link_qps_established(l), (unsigned long long)l->peer_mb_addr,
			 l->peer_mb_len, l->peer_mb_rkey, (unsigned long long)(t - l->attempt_ms));
	}
}

void link_on_hello(struct link *l, const Hello *h)
{
	struct mesh *m = l->mesh;

	if (l->have_peer_hello || l->phase > LINK_HELLO) {
		link_fail(l, -MESH_EPEERMSG, "second Hello");
		return;
	}
	if (m->keys.n && !l->peer_proved) {
		link_fail(l, -MESH_EAUTH, "node %u sent its Hello without proving the cluster key (no cluster.key_file there?)",
			  h->node_id);
		return;
	}
	if (h->node_id != l->peer->id || h->cluster_hash != m->cluster_hash || h->link_epoch != l->epoch) {
		link_fail(l, -MESH_EPEERMSG, "Hello from node %u, cluster 0x%08x, epoch %llu does not match", h->node_id,
			  h->cluster_hash, (unsigned long long)h->link_epoch);
		return;
	}
	if (h->qp_count != m->cfg->qps_per_link) {
		link_fail(l, -MESH_EQPCOUNT, "Hello says %u QPs", h->qp_count);
		return;
	}
	if (h->mailbox_len < h->qp_count * MESH_PROOF_LEN) {
		link_fail(l, -MESH_EPEERMSG, "peer mailbox of %u bytes is too small for %u proofs", h->mailbox_len,
			  h->qp_count);
		return;
	}
	l->have_peer_hello = true;
	l->peer_boot_epoch = h->boot_epoch;
	l->peer_pred_epoch = h->predecessor_epoch;
	l->features = h->features & MESH_FEAT_ALL;
	l->peer_mb_addr = h->mailbox_addr;
	l->peer_mb_len = h->mailbox_len;
	l->peer_mb_rkey = h->mailbox_rkey;
	if (h->mailbox_len < MESH_KA_OFF + MESH_KA_LEN)
		l->features &= ~MESH_FEAT_KA_WRITE; /* no keepalive word in its mailbox */
	link_progress(l);
}

/* AuthProof: the dialler's, of the link's attempt on QP 0 before Hello (the acceptor proved itself in
 * its accept); one of a rail's join is link_rail_on_auth's (link_rail.c), which mesh.c asks first.
 * Without a key of ours, a peer that proves one is refused with a clear word: the two nodes'
 * configurations differ. */
void link_on_auth(struct link *l, uint32_t qp, const PeerMsg *msg)
{
	const AuthProof *p = msg->auth_proof;

	if (!l->mesh->keys.n) {
		link_fail(l, -MESH_EAUTH, "node %u proves a cluster key; this node has none (cluster.key_file)", l->peer->id);
		return;
	}
	if (qp || (l->phase != LINK_QPS && l->phase != LINK_AUTH)) {
		link_fail(l, -MESH_EPEERMSG, "AuthProof on QP %u in phase %s", qp, link_phase_name(l->phase));
		return;
	}
	if (l->dialer || !l->auth_proof_sent || l->peer_proved) {
		link_fail(l, -MESH_EPEERMSG, "unexpected AuthProof");
		return;
	}
	if (!link_check_proof(l, 0, 0, l->nonce_ours, l->nonce_peer, p->mac.data, p->mac.len)) {
		link_fail(l, -MESH_EAUTH, "node %u's proof of the cluster key does not verify (another key?)", l->peer->id);
		return;
	}
	l->peer_proved = true;
	l->epoch_proven = l->epoch; /* from now on this attempt's epoch is the real node's */
	link_progress(l);
}
