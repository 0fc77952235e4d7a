/*
 * What both of the application's sending paths (aq_verbs.c, aq_tcp.c) say to meshd through the
 * AQ area of the control page (proto/ring.h): our state (aq_say, with a kick so that meshd relays
 * it), meshd's grant taken (aq_grant_take) and the half given back (aq_give_back). Also what
 * tells a forked child that a path is its parent's (aq_mine), the environment's MESH_APP_SEND and
 * a clock. Calls nothing else of the AQ files: they all stand on it.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "aq_int.h"

/* Forks of this process so far, counted in the child (pthread_atfork): cheaper than getpid() on
 * every look at the ring, and a child sees at once that its paths are its parent's. */
static _Atomic unsigned aq_forks;
static pthread_once_t aq_once = PTHREAD_ONCE_INIT;

static void aq_in_child(void)
{
	atomic_fetch_add_explicit(&aq_forks, 1, memory_order_relaxed);
}

static void aq_register_fork(void)
{
	if (pthread_atfork(NULL, NULL, aq_in_child))
		lib_debug("pthread_atfork failed: a forked child would not know its QPs are its parent's");
}

unsigned aq_gen(void)
{
	return atomic_load_explicit(&aq_forks, memory_order_relaxed);
}

bool aq_mine(const struct lib_aq *q)
{
	return q->gen == aq_gen();
}

bool aq_env_off(void)
{
	const char *e = getenv("MESH_APP_SEND");

	return e && (!strcmp(e, "off") || !strcmp(e, "0"));
}

/* A fresh lib_aq on the given path for meshd's offer of the given round, marked as this
 * process's (not a child's). */
struct lib_aq *aq_new(const struct aq_ops *ops, uint32_t round)
{
	struct lib_aq *q = calloc(1, sizeof(*q));

	if (!q)
		return NULL;
	pthread_once(&aq_once, aq_register_fork);
	q->ops = ops;
	q->gen = aq_gen();
	q->round = round;
	return q;
}

/* meshd must hear even while it sleeps (EAGAIN: a kick is pending anyway). */
static void aq_kick(mesh_channel_t *c)
{
	uint64_t one = 1;

	atomic_thread_fence(memory_order_seq_cst);
	if (write(c->kick, &one, sizeof(one)) < 0)
		return;
}

void aq_say(mesh_channel_t *c, uint32_t state)
{
	struct mesh_ring_aq *a = mesh_ring_aq(c->ctrl);

	c->aq->state = state;
	atomic_store_explicit(&a->app_state, state, memory_order_release);
	aq_kick(c); /* meshd relays it */
}

/* Done with our QP: whatever we published but could not post is meshd's to post now, and meshd
 * hears that the half is its own again. */
void aq_give_back(mesh_channel_t *c)
{
	c->aq->owned = false;
	c->aq->failed = true;
	tx_show(c, c->tx_prod);
	aq_say(c, MESH_AQ_IDLE);
}

bool aq_grant_take(mesh_channel_t *c, uint32_t *grant, uint64_t *from)
{
	struct mesh_ring_aq *a = mesh_ring_aq(c->ctrl);
	struct lib_aq *q = c->aq;
	uint64_t pos;

	*grant = atomic_load_explicit(&a->grant, memory_order_acquire);
	if (*grant != MESH_AQ_APP || q->owned || q->failed || q->state != MESH_AQ_READY)
		return false;
	/* Ours only once we turned it to TAKEN (ring.h MESH_AQ_CAP_TAKE): meshd withdraws a grant that
	 * bytes were published past without us, turning it back to MESHD, and then posts them itself.
	 * grant_pos is read after: meshd writes it only while the grant is not APP, so it is the
	 * position of the grant we took, even if meshd withdrew one and granted again in between. */
	if (!atomic_compare_exchange_strong_explicit(&a->grant, grant, MESH_AQ_TAKEN, memory_order_acq_rel,
						     memory_order_acquire))
		return false; /* *grant: what it is now (MESHD, or REVOKED) */
	*grant = MESH_AQ_TAKEN;
	pos = atomic_load_explicit(&a->grant_pos, memory_order_acquire);
	if (pos < c->tx_cons || pos > c->tx_prod) {
		lib_debug("channel %u: meshd granted our writes from %" PRIu64 ", outside [%" PRIu64 ", %" PRIu64 "]",
			  c->info.channel_id, pos, c->tx_cons, c->tx_prod);
		q->failed = true;
		return false;
	}
	q->owned = true;
	q->posted = pos;
	*from = pos;
	aq_kick(c); /* meshd tells the peer's meshd, which then counts and credits what we send */
	return true;
}

uint64_t aq_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}
