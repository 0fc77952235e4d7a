/*
 * The descriptor table: which of the application's descriptor numbers are mesh channels or mesh
 * listeners (struct pl_fd), with a reference per table slot and per call in progress, so that a
 * close() in one thread never frees what a read() in another still uses. Also what a channel's
 * entry can do now (pl_chan_revents, pl_chan_spin_us), which the data calls and the waits both ask.
 */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "preload.h"

static _Atomic(struct pl_fd *) table[PL_FD_MAX];
static pthread_rwlock_t table_lock = PTHREAD_RWLOCK_INITIALIZER;

static void atfork_prepare(void)
{
	pthread_rwlock_wrlock(&table_lock);
}

static void atfork_parent(void)
{
	pthread_rwlock_unlock(&table_lock);
}

static void atfork_child(void)
{
	pthread_rwlock_unlock(&table_lock);
}

/* The table's lock is held across fork, so a child never inherits it locked by a thread it lacks. */
__attribute__((constructor)) static void table_init(void)
{
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

bool pl_tracked(int fd)
{
	return fd >= 0 && fd < PL_FD_MAX && atomic_load_explicit(&table[fd], memory_order_acquire);
}

struct pl_fd *pl_get(int fd)
{
	struct pl_fd *p;

	if (!pl_tracked(fd))
		return NULL;
	pthread_rwlock_rdlock(&table_lock);
	p = atomic_load_explicit(&table[fd], memory_order_acquire);
	if (p)
		atomic_fetch_add(&p->refs, 1);
	pthread_rwlock_unlock(&table_lock);
	return p;
}

struct pl_fd *pl_lookup(int fd)
{
	return pl_bypass() ? NULL : pl_get(fd);
}

struct pl_fd *pl_chan_get(int fd)
{
	struct pl_fd *p = pl_lookup(fd);

	if (p && p->kind != PL_CHANNEL) {
		pl_put(p);
		return NULL;
	}
	return p;
}

void pl_put(struct pl_fd *p)
{
	if (!p || atomic_fetch_sub(&p->refs, 1) != 1)
		return;
	pl_lib_enter();
	if (p->owner == getpid()) {
		if (p->ch)
			mesh_close(p->ch);
		if (p->ls)
			mesh_listener_close(p->ls);
	} else {
		/* A forked child's copy: its descriptors are closed, but nothing may be said to meshd
		 * or written to the control page, which stay the parent's. */
		if (p->ch)
			pl_warn(1, "a mesh channel inherited through fork() is left to the parent");
		if (p->ls)
			mesh_listener_close(p->ls); /* only this process's reference of the connection */
	}
	pl_lib_leave();
	pthread_mutex_destroy(&p->lock);
	free(p);
}

struct pl_fd *pl_new(enum pl_kind kind, int family)
{
	struct pl_fd *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	p->kind = kind;
	atomic_init(&p->refs, 1);
	pthread_mutex_init(&p->lock, NULL);
	p->owner = getpid();
	p->family = family;
	p->lfd = -1;
	return p;
}

/* Puts p at fd (taking a reference); returns what was there, which the caller puts. */
struct pl_fd *pl_table_set(int fd, struct pl_fd *p)
{
	struct pl_fd *old;

	if (p)
		atomic_fetch_add(&p->refs, 1);
	pthread_rwlock_wrlock(&table_lock);
	old = atomic_exchange(&table[fd], p);
	pthread_rwlock_unlock(&table_lock);
	return old;
}

short pl_chan_revents(struct pl_fd *p, bool arm)
{
	struct mesh_channel_status st;
	short ev = 0;
	int ret;

	if (p->owner != getpid())
		return POLLERR | POLLHUP;
	if (atomic_load(&p->connecting))
		return POLLOUT;
	pthread_mutex_lock(&p->lock);
	pl_lib_enter();
	ret = mesh_channel_status(p->ch, arm ? MESH_STATUS_ARM : 0, &st);
	pl_lib_leave();
	pthread_mutex_unlock(&p->lock);
	if (ret)
		return POLLERR;
	if ((st.ready & MESH_READY_RECV) || p->rd_shut)
		ev |= POLLIN | POLLRDNORM;
	if ((st.ready & MESH_READY_EOF) || p->rd_shut)
		ev |= POLLRDHUP;
	if (st.ready & MESH_READY_SEND)
		ev |= POLLOUT | POLLWRNORM;
	if (st.ready & MESH_READY_ERROR)
		ev |= POLLERR | POLLHUP;
	if ((st.ready & MESH_READY_EOF) && (st.ready & MESH_READY_SHUT))
		ev |= POLLHUP;
	return ev;
}

/* The channel's spin budget (mesh_channel_status: meshd's hint or MESH_SPIN_US), 0 if unknown. */
uint32_t pl_chan_spin_us(struct pl_fd *p)
{
	struct mesh_channel_status st;
	int ret;

	pthread_mutex_lock(&p->lock);
	pl_lib_enter();
	ret = mesh_channel_status(p->ch, 0, &st);
	pl_lib_leave();
	pthread_mutex_unlock(&p->lock);
	return ret ? 0 : st.spin_us;
}
