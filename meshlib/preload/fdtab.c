/*
 * The descriptor table: which of the application's descriptor numbers are mesh channels or mesh
 * listeners (struct pl_fd), with a reference per table slot and per call in progress, so that a
 * close() in one thread never frees what a read() in another still uses. Also what a channel's
 * entry can do now (pl_chan_revents, pl_chan_spin_us), which the data calls and the waits both ask,
 * and who of a family of forked processes uses a channel (pl_chan_mine).
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "preload.h"

static _Atomic(struct pl_fd *) table[PL_FD_MAX];
static pthread_rwlock_t table_lock = PTHREAD_RWLOCK_INITIALIZER;
static pid_t my_pid;

pid_t pl_pid(void)
{
	if (__builtin_expect(!my_pid, 0))
		my_pid = getpid();
	return my_pid;
}

/* What libc's fork handlers do here: under the table's write lock, every entry's lock too, so that
 * no thread is inside libmesh with a channel while the child's copy of it is made. */
void pl_table_fork(enum pl_fork_stage stage)
{
	if (stage == PL_FORK_PREPARE)
		pthread_rwlock_wrlock(&table_lock);
	for (int fd = 0; fd < PL_FD_MAX; fd++) {
		struct pl_fd *p = atomic_load_explicit(&table[fd], memory_order_relaxed);

		if (!p)
			continue;
		if (stage == PL_FORK_PREPARE) {
			if (p->fork_locked)
				continue; /* a dup of one already taken */
			pthread_mutex_lock(&p->lock);
			p->fork_locked = true;
			if (p->share) {
				int32_t me = pl_pid();

				/* Ours until now: whichever of parent and child uses it first takes it. */
				atomic_compare_exchange_strong(&p->share->user, &me, PL_USER_NONE);
				/* The child holds it from now on, counted before the parent returns from
				 * fork() and may close its copy (a count in the child came after the
				 * parent's close, which then took itself for the last holder and closed
				 * the channel under the child). A fork that fails leaves one too many:
				 * the last close only lets its copy go, and meshd sees the channel's
				 * application gone without a shutdown. */
				atomic_fetch_add(&p->share->holders, 1);
			}
			continue;
		}
		if (!p->fork_locked)
			continue;
		p->fork_locked = false;
		/* A mutex taken by the thread that forked: unlocked by the child's one thread alike. */
		pthread_mutex_unlock(&p->lock);
	}
	if (stage == PL_FORK_PARENT) {
		pthread_rwlock_unlock(&table_lock);
	} else if (stage == PL_FORK_CHILD) {
		/* Made anew: glibc's rwlock remembers its writer's thread id, which the child's thread
		 * does not have, and an unlock there left it locked: a daemon's second fork() (nginx's
		 * master starting its workers, memcached -d listening) waited for it forever. */
		pthread_rwlock_init(&table_lock, NULL);
		my_pid = getpid();
	}
}

/* exit(): the kernel closes a process's sockets at its end and the peer reads EOF; a channel's
 * lifeline alone would tell meshd the application went without a shutdown, and the peer would
 * read ECONNRESET. So the channels this process uses are shut first (the table is left as it is:
 * other threads may still run their last calls). _exit() and a fatal signal skip this. */
__attribute__((destructor)) static void table_exit(void)
{
	for (int fd = 0; fd < PL_FD_MAX; fd++) {
		struct pl_fd *p = atomic_load_explicit(&table[fd], memory_order_acquire);

		if (!p || !p->ch || pl_chan_user(p) != pl_pid() || pthread_mutex_trylock(&p->lock))
			continue;
		pl_lib_enter();
		mesh_shutdown(p->ch);
		pl_lib_leave();
		pthread_mutex_unlock(&p->lock);
	}
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

bool pl_chan_mine(struct pl_fd *p)
{
	int32_t user, me = pl_pid();

	if (!p->share)
		return true;
	user = atomic_load_explicit(&p->share->user, memory_order_acquire);
	if (user == me)
		return true;
	if (user == PL_USER_NONE &&
	    atomic_compare_exchange_strong(&p->share->user, &user, me))
		return true;
	return user == me;
}

int pl_chan_user(const struct pl_fd *p)
{
	return p->share ? atomic_load(&p->share->user) : pl_pid();
}

/* This process's last reference to a channel goes: whether it closes the channel (it uses it, or
 * it was the last holder of one nobody used since a fork) or only lets its copy go. */
static bool chan_closes(struct pl_fd *p)
{
	int32_t left;

	if (!p->share)
		return true;
	left = atomic_fetch_sub(&p->share->holders, 1) - 1;
	if (pl_chan_user(p) == pl_pid())
		return true;
	return left == 0 && pl_chan_mine(p);
}

void pl_put(struct pl_fd *p)
{
	if (!p || atomic_fetch_sub(&p->refs, 1) != 1)
		return;
	pl_lib_enter();
	if (p->ch && chan_closes(p)) {
		if (p->share)
			atomic_store(&p->share->user, PL_USER_CLOSED);
		mesh_close(p->ch);
	} else if (p->ch) {
		PL_DEBUG("a channel used by process %d since a fork: this process's copy goes", pl_chan_user(p));
		mesh_channel_detach(p->ch);
	}
	/* A forked copy of a listener's connection closes this process's copy only: meshd listens
	 * until the last one goes. */
	if (p->ls)
		mesh_listener_close(p->ls);
	pl_lib_leave();
	if (p->share)
		munmap(p->share, sizeof(*p->share));
	pthread_mutex_destroy(&p->lock);
	free(p);
}

struct pl_fd *pl_new(enum pl_kind kind, int family)
{
	struct pl_fd *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	if (kind == PL_CHANNEL) {
		p->share = mmap(NULL, sizeof(*p->share), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (p->share == MAP_FAILED) {
			free(p);
			return NULL;
		}
		atomic_init(&p->share->user, pl_pid());
		atomic_init(&p->share->holders, 1);
	}
	p->kind = kind;
	atomic_init(&p->refs, 1);
	pthread_mutex_init(&p->lock, NULL);
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

	if (!pl_chan_mine(p))
		return POLLERR | POLLHUP; /* another process's since a fork: its calls fail (chan.c) */
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

	if (pl_chan_user(p) != pl_pid())
		return 0; /* not this process's to look at (yet) */
	pthread_mutex_lock(&p->lock);
	pl_lib_enter();
	ret = mesh_channel_status(p->ch, 0, &st);
	pl_lib_leave();
	pthread_mutex_unlock(&p->lock);
	return ret ? 0 : st.spin_us;
}
