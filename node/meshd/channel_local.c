/*
 * Channels to this node (channel_internal.h): a pair of channels of this meshd on a link of its own,
 * always UP and without QPs; what a peer's meshd would receive is queued and delivered after the
 * batch that queued it, so the pair runs the code of a remote channel.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "channel.h"
#include "channel_internal.h"
#include "log.h"
#include "mesh.h"
#include "util.h"

/* ---- channels to the local node ----
 *
 * A channel to this node is two channels of this meshd, opener and acceptor, in the slots of a link
 * of its own: always UP, without QPs, never in mesh->links (no keepalives, no meshctl links row).
 * Everything a peer's meshd would receive is queued here and delivered after the batch that
 * queued it: a control message is encoded and decoded again (the very handlers of a remote
 * channel run), a data or credit "write" is a memcpy into the other channel's ring or credit words
 * (both are mapped in this process) followed by the receiver's immediate and then the sender's
 * completion, the order RC gives them. So the pair shares all of a remote channel's code: credits,
 * EOF, the close handshake, counters, meshctl rows; only the bytes move by one copy in meshd
 * instead of an RDMA WRITE. */

bool link_is_local(const struct link *l)
{
	return l->mesh->chans->local && l == &l->mesh->chans->local->link;
}

struct link *local_link(struct mesh *m)
{
	struct channel_local *lo = m->chans->local;

	if (!lo) {
		lo = calloc(1, sizeof(*lo));
		if (!lo)
			return NULL;
		lo->link.mesh = m;
		lo->link.peer = m->self;
		lo->link.phase = LINK_UP;
		lo->link.features = MESH_FEAT_CHANNELS;
		lo->link.rails_up = 1; /* its channels are on rail 0: that rail's thread pumps them */
		lo->link.peer_boot_epoch = m->boot_epoch;
		m->chans->local = lo;
	}
	return &lo->link;
}

int local_push(struct mesh *m, const struct local_ev *ev)
{
	struct channel_local *lo = m->chans->local;

	if (lo->head && lo->head == lo->n)
		lo->head = lo->n = 0;
	if (lo->n == lo->cap) {
		size_t nc = lo->cap ? lo->cap * 2 : 256;
		struct local_ev *q;

		if (lo->head) {
			/* Room at the front: move what is queued there first. */
			memmove(lo->q, lo->q + lo->head, (lo->n - lo->head) * sizeof(*q));
			lo->n -= lo->head;
			lo->head = 0;
		} else {
			q = realloc(lo->q, nc * sizeof(*q));
			if (!q)
				return -ENOBUFS;
			lo->q = q;
			lo->cap = nc;
		}
	}
	lo->q[lo->n++] = *ev;
	return 0;
}

bool channel_local_pending(const struct mesh *m)
{
	return m->chans->local && m->chans->local->head < m->chans->local->n;
}

bool channel_local_run(struct mesh *m)
{
	struct channel_local *lo = m->chans->local;
	struct link *l;

	if (!lo)
		return false;
	l = &lo->link;
	/* What the handlers queue meanwhile (a sender's next chunks) waits for the next call: a busy
	 * local stream cannot keep this thread from its other events. Counted, not bounded by index:
	 * a push may move the queue to the front of its array. */
	for (size_t k = lo->n - lo->head; k; k--) {
		struct local_ev ev = lo->q[lo->head++]; /* a copy: handlers may grow the queue */

		switch (ev.kind) {
		case LOCAL_MSG: {
			PeerMsg *msg = peer_msg__unpack(NULL, ev.len, ev.msg);

			free(ev.msg);
			if (!msg) {
				log_error("local channel message of %u bytes does not decode: dropped", ev.len);
				break;
			}
			if (channel_on_message(l, msg))
				log_error("local channel message %d not handled: dropped", (int)msg->body_case);
			peer_msg__free_unpacked(msg, NULL);
			break;
		}
		case LOCAL_IMM:
			channel_on_imm(l, ev.imm, ev.len);
			break;
		case LOCAL_DONE:
			if (ev.qp < LINK_CONNS_MAX && l->sq_used[ev.qp])
				l->sq_used[ev.qp]--;
			if (channel_on_completion(l, (uint32_t)(ev.wr_id >> 32), (uint32_t)ev.wr_id, 0))
				log_error("local channel completion 0x%llx for no channel", (unsigned long long)ev.wr_id);
			break;
		}
	}
	if (lo->head == lo->n)
		lo->head = lo->n = 0;
	return lo->head < lo->n;
}

void channel_local_free(struct mesh *m)
{
	struct channel_local *lo = m->chans->local;

	if (!lo)
		return;
	for (size_t i = lo->head; i < lo->n; i++)
		if (lo->q[i].kind == LOCAL_MSG)
			free(lo->q[i].msg);
	free(lo->q);
	free(lo->link.ch_slots);
	free(lo);
	m->chans->local = NULL;
}
