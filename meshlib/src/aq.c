/*
 * Application-posted writes (proto/ring.h, the AQ area): the channel's sending half sent by the
 * application itself, so that no meshd stands between a message and the wire. meshd offers it in
 * the control page with a path: an RDMA device and port (an RC QP of our own, aq_verbs.c) or, over
 * meshd's tcp provider, two addresses (a TCP connection of our own, aq_tcp.c). This file is what
 * the channel calls (internal.h's aq_*): it picks the path's ops table at the offer and calls the
 * path only through it, as meshd reaches a transport through transport.h; a new offer after a
 * resume (ring.h round) replaces the path. What both paths say to meshd is aq_page.c's.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "aq_int.h"

static void aq_destroy(struct lib_aq *q)
{
	q->ops->destroy(q);
	free(q);
}

void aq_open(mesh_channel_t *c)
{
	struct mesh_ring_aq *a = mesh_ring_aq(c->ctrl);
	const struct aq_ops *ops;
	struct lib_aq *q;
	uint32_t round;

	/* The round first: meshd rewrites the path before it changes it (release). */
	round = atomic_load_explicit(&a->round, memory_order_acquire);
	if (!a->path_valid || aq_env_off())
		return;
	if (a->path_valid == MESH_AQ_PATH_TCP)
		ops = &aq_tcp_ops;
	else if (a->path_valid == MESH_AQ_PATH_RDMA)
		ops = &aq_verbs_ops;
	else
		return;
	q = aq_new(ops, round);
	if (!q)
		return;
	c->aq = q; /* the offer it makes says our state through c */
	if (ops->open(c, q)) {
		c->aq = NULL; /* meshd sends our bytes, as without an offer */
		aq_destroy(q);
	}
}

uint64_t aq_rx_seen(const mesh_channel_t *c)
{
	return c->aq ? c->aq->rx_seen : 0;
}

bool aq_owned(const mesh_channel_t *c)
{
	return c->aq && c->aq->owned && !c->aq->failed;
}

uint64_t aq_reusable(const mesh_channel_t *c, uint64_t tx_cons)
{
	const struct lib_aq *q = c->aq;

	/* Bytes still on the wire are read again by a retransmission: not ours to overwrite. Once
	 * nothing is outstanding (all completed, or flushed by a stopped QP) meshd's word stands. */
	if (q && q->sq_out && q->done < tx_cons)
		return q->done;
	return tx_cons;
}

/* meshd offers a new QP (a resume revoked ours; ring.h round): the old one goes (nothing of it is
 * in flight once we said IDLE; its descriptor leaves the channel's epoll set as it closes), and a
 * new one is offered as at the start, its completion channel added to that set. */
static void aq_renew(mesh_channel_t *c)
{
	struct epoll_event ev = {.events = EPOLLIN};
	struct lib_aq *old = c->aq;

	lib_debug("channel %u: meshd offers a new QP (round %u)", c->info.channel_id,
		  atomic_load_explicit(&mesh_ring_aq(c->ctrl)->round, memory_order_relaxed));
	c->aq = NULL;
	aq_destroy(old);
	aq_open(c);
	if (!c->aq || c->epfd < 0)
		return;
	if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, aq_fd(c), &ev)) {
		/* A poller of the channel's fd would not wake for the peer's writes: meshd posts ours. */
		lib_debug("channel %u: cannot watch our new QP's completions: %s", c->info.channel_id, strerror(errno));
		c->aq->failed = true;
		aq_give_back(c);
	}
}

void aq_progress(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;

	if (q && q->state == MESH_AQ_IDLE && !q->sq_out && aq_mine(q) && !c->shut_wr &&
	    atomic_load_explicit(&mesh_ring_aq(c->ctrl)->round, memory_order_acquire) != q->round) {
		aq_renew(c);
		q = c->aq;
	}
	if (q)
		q->ops->progress(c);
}

void aq_progress_send(mesh_channel_t *c)
{
	if (!c->aq || c->aq->state == MESH_AQ_IDLE || c->aq->ops->progress_send(c))
		aq_progress(c);
}

bool aq_connected(const mesh_channel_t *c)
{
	return c->aq && c->aq->connected && !c->aq->qp_err;
}

bool aq_look_is_syscall(const mesh_channel_t *c)
{
	return c->aq && c->aq->ops->look_is_syscall;
}

int aq_fd(const mesh_channel_t *c)
{
	if (!c->aq || !aq_mine(c->aq))
		return -1;
	return c->aq->ops->fd(c->aq);
}

int aq_wait_fd(mesh_channel_t *c)
{
	return c->aq ? c->aq->ops->wait_fd(c) : -1;
}

void aq_event(mesh_channel_t *c)
{
	if (c->aq)
		c->aq->ops->event(c);
}

void aq_release(mesh_channel_t *c)
{
	if (c->aq)
		c->aq->ops->release(c);
}

void aq_close(mesh_channel_t *c)
{
	if (!c->aq)
		return;
	aq_destroy(c->aq); /* a forked child's: its own copies of descriptors, none of its parent's verbs objects */
	c->aq = NULL;
}
