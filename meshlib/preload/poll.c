/*
 * poll, select and epoll over channels and kernel descriptors together.
 *
 * A channel's descriptor is readable when the channel changed (bytes, space, end, error, meshd
 * gone); what it can do is asked of the channel (mesh_channel_status). So each wait first looks at
 * the channels (no system call); when none is ready it arms them (clears their descriptor, then
 * looks once more, so a change after the look wakes the kernel's wait) and only then sleeps in the
 * kernel on every descriptor at once. Readiness that no change signals (free space of a channel
 * nobody reads from) is thereby seen without busy loops.
 *
 * epoll: the application's epoll set E keeps its kernel descriptors. Channels (and the mesh side of
 * listeners) go into a shadow epoll set S of ours, with the application's events and data kept in a
 * registry; epoll_wait reports from both. Edge-triggered registrations (EPOLLET) are in S edge-
 * triggered too: a registration reports a readiness once, and again after the next change of the
 * channel (or a new EPOLL_CTL_MOD), as the kernel's own edges do.
 *
 * Spinning: a wait with channels in it that finds nothing ready looks again, yielding between
 * looks, for the channels' spin budget (cluster.app_spin_us or MESH_SPIN_US) before it arms and
 * sleeps, as a blocking read does (chan.c chan_wait): an answer that comes within it is taken
 * without meshd's wake-up hop. The kernel descriptors are looked at too (a zero-timeout wait), so
 * they lose nothing to the spin.
 *
 * The interposers (preload.c) call in here once a call names a tracked descriptor.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "preload.h"

#define PL_POLL_STACK 64

/* ---- time ---- */

static int64_t now_ms(void)
{
	return (int64_t)(pl_mono_us() / 1000);
}

/* Milliseconds left until deadline (-1: none) for a kernel wait. */
static int left_ms(int64_t deadline)
{
	int64_t l;

	if (deadline < 0)
		return -1;
	l = deadline - now_ms();
	return l <= 0 ? 0 : l > 0x7fffffff ? 0x7fffffff : (int)l;
}

static int64_t deadline_of(int timeout_ms)
{
	return timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
}

static int real_wait(struct pollfd *pf, nfds_t n, int ms, const sigset_t *mask)
{
	struct timespec ts;

	if (!mask)
		return pl_real.poll(pf, n, ms);
	ts.tv_sec = ms / 1000;
	ts.tv_nsec = (long)(ms % 1000) * 1000000L;
	return pl_real.ppoll(pf, n, ms < 0 ? NULL : &ts, mask);
}

/* ---- poll ---- */

static int poll_core(struct pollfd *fds, nfds_t n, int64_t deadline, const sigset_t *mask)
{
	struct pollfd stack_pf[PL_POLL_STACK];
	struct pl_fd *stack_p[PL_POLL_STACK];
	struct pollfd *pf = stack_pf;
	struct pl_fd **p = stack_p;
	nfds_t extra = 0, m;
	uint32_t spin = 0;
	struct pl_spin sp;
	int ret = -1;

	for (nfds_t i = 0; i < n; i++) {
		struct pl_fd *e = pl_get(fds[i].fd);

		if (e && e->kind == PL_LISTENER && e->lfd >= 0)
			extra++;
		pl_put(e);
	}
	m = n + extra;
	if (m > PL_POLL_STACK) {
		pf = calloc(m, sizeof(*pf));
		p = calloc(n, sizeof(*p));
		if (!pf || !p) {
			free(pf);
			free(p);
			errno = ENOMEM;
			return -1;
		}
	}
	for (nfds_t i = 0; i < n; i++) {
		p[i] = pl_get(fds[i].fd);
		if (!spin && p[i] && p[i]->kind == PL_CHANNEL)
			spin = pl_chan_spin_us(p[i]);
	}
	pl_spin_start(&sp, spin);
	for (;;) {
		nfds_t k = n;
		int ready = 0, r;
		/* Spinning (above): look without arming and without sleeping, yield, again. */
		bool spinning = pl_spin_on(&sp, deadline);

		/* Look, then arm, at the channels. */
		for (int pass = 0; pass < (spinning ? 1 : 2) && !ready; pass++) {
			for (nfds_t i = 0; i < n; i++) {
				if (!p[i] || p[i]->kind != PL_CHANNEL)
					continue;
				fds[i].revents = pl_chan_revents(p[i], pass == 1) & (fds[i].events | POLLERR | POLLHUP);
				ready += fds[i].revents != 0;
			}
		}
		for (nfds_t i = 0; i < n; i++) {
			pf[i] = fds[i];
			if (p[i] && p[i]->kind == PL_CHANNEL)
				pf[i].events = POLLIN;
			else if (p[i] && p[i]->kind == PL_LISTENER && p[i]->lfd >= 0)
				pf[k++] = (struct pollfd){.fd = p[i]->lfd, .events = POLLIN};
		}
		r = real_wait(pf, m, ready || spinning ? 0 : left_ms(deadline), mask);
		if (r < 0) {
			if (ready)
				r = 0;
			else
				goto out;
		}
		k = n;
		ready = 0;
		for (nfds_t i = 0; i < n; i++) {
			if (p[i] && p[i]->kind == PL_CHANNEL) {
				if (!fds[i].revents && pf[i].revents)
					fds[i].revents = pl_chan_revents(p[i], false) & (fds[i].events | POLLERR | POLLHUP);
			} else {
				fds[i].revents = pf[i].revents;
				if (p[i] && p[i]->kind == PL_LISTENER && p[i]->lfd >= 0 && pf[k++].revents)
					fds[i].revents |= fds[i].events & POLLIN;
			}
			ready += fds[i].revents != 0;
		}
		/* A spinning look knows the deadline from the spin's clock (pl_spin_on). */
		if (ready || (!spinning && left_ms(deadline) == 0)) {
			ret = ready;
			goto out;
		}
		if (spinning)
			sched_yield(); /* the one we wait for (meshd, the peer) may need this very CPU */
	}
out:
	for (nfds_t i = 0; i < n; i++)
		pl_put(p[i]);
	if (pf != stack_pf) {
		int e = errno;

		free(pf);
		free(p);
		errno = e;
	}
	return ret;
}

bool pl_poll_tracked(const struct pollfd *fds, nfds_t n)
{
	for (nfds_t i = 0; i < n; i++)
		if (pl_tracked(fds[i].fd))
			return true;
	return false;
}

int pl_poll(struct pollfd *fds, nfds_t n, int timeout_ms, const sigset_t *mask)
{
	return poll_core(fds, n, deadline_of(timeout_ms), mask);
}

int pl_ts_ms(const struct timespec *ts)
{
	int64_t ms;

	if (!ts)
		return -1;
	ms = (int64_t)ts->tv_sec * 1000 + (ts->tv_nsec + 999999) / 1000000;
	return ms > 0x7fffffff ? 0x7fffffff : (int)ms;
}

int pl_tv_ms(const struct timeval *tv)
{
	return tv ? (int)(tv->tv_sec * 1000 + (tv->tv_usec + 999) / 1000) : -1;
}

/* ---- select ---- */

static int select_core(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, int64_t deadline, const sigset_t *mask)
{
	struct pollfd *pf;
	nfds_t n = 0;
	int ret, count = 0;

	if (nfds < 0 || nfds > FD_SETSIZE) {
		errno = EINVAL;
		return -1;
	}
	pf = calloc((size_t)nfds + 1, sizeof(*pf));
	if (!pf) {
		errno = ENOMEM;
		return -1;
	}
	for (int fd = 0; fd < nfds; fd++) {
		short ev = 0;

		if (rd && FD_ISSET(fd, rd))
			ev |= POLLIN;
		if (wr && FD_ISSET(fd, wr))
			ev |= POLLOUT;
		if (ex && FD_ISSET(fd, ex))
			ev |= POLLPRI;
		if (ev)
			pf[n++] = (struct pollfd){.fd = fd, .events = ev};
	}
	ret = poll_core(pf, n, deadline, mask);
	if (ret < 0)
		goto out;
	for (nfds_t i = 0; i < n; i++) {
		short r = pf[i].revents;
		int fd = pf[i].fd;

		if (r & POLLNVAL) {
			errno = EBADF;
			ret = -1;
			goto out;
		}
		if (rd && FD_ISSET(fd, rd)) {
			if (r & (POLLIN | POLLHUP | POLLERR))
				count++;
			else
				FD_CLR(fd, rd);
		}
		if (wr && FD_ISSET(fd, wr)) {
			if (r & (POLLOUT | POLLERR))
				count++;
			else
				FD_CLR(fd, wr);
		}
		if (ex && FD_ISSET(fd, ex)) {
			if (r & POLLPRI)
				count++;
			else
				FD_CLR(fd, ex);
		}
	}
	ret = count;
out:
	free(pf);
	return ret;
}

bool pl_select_tracked(int nfds, fd_set *rd, fd_set *wr, fd_set *ex)
{
	for (int fd = 0; fd < nfds && fd < FD_SETSIZE; fd++)
		if (((rd && FD_ISSET(fd, rd)) || (wr && FD_ISSET(fd, wr)) || (ex && FD_ISSET(fd, ex))) && pl_tracked(fd))
			return true;
	return false;
}

int pl_select(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, int timeout_ms, const sigset_t *mask)
{
	return select_core(nfds, rd, wr, ex, deadline_of(timeout_ms), mask);
}

/* ---- epoll ---- */

struct ep_reg {
	int fd;           /* the application's descriptor */
	bool listener;    /* S watches the listener's mesh descriptor; E the kernel socket */
	bool signalled;   /* S reported it since the last look */
	bool disabled;    /* EPOLLONESHOT fired */
	uint32_t events;  /* as the application asked */
	uint32_t armed;   /* EPOLLET: what may still be reported before the next change */
	epoll_data_t data;
};

struct ep_set {
	int shadow; /* S */
	pthread_mutex_t lock;
	struct ep_reg *regs;
	size_t n, cap, next;
};

static _Atomic(struct ep_set *) sets[PL_FD_MAX];
static atomic_int sets_hi; /* above the highest epoll descriptor that ever had a registry */
static pthread_mutex_t sets_lock = PTHREAD_MUTEX_INITIALIZER;

/* Taken in the order the calls take them: the registries' lock, then each set's (before the
 * descriptor table's, which ep_collect takes under a set's lock). */
void pl_epoll_fork(enum pl_fork_stage stage)
{
	if (stage == PL_FORK_PREPARE)
		pthread_mutex_lock(&sets_lock);
	for (int e = 0, hi = atomic_load(&sets_hi); e < hi; e++) {
		struct ep_set *s = atomic_load_explicit(&sets[e], memory_order_relaxed);

		if (!s)
			continue;
		if (stage == PL_FORK_PREPARE)
			pthread_mutex_lock(&s->lock);
		else
			pthread_mutex_unlock(&s->lock);
	}
	if (stage != PL_FORK_PREPARE)
		pthread_mutex_unlock(&sets_lock);
}

static struct ep_set *set_get(int epfd, bool create)
{
	struct ep_set *s;

	if (epfd < 0 || epfd >= PL_FD_MAX)
		return NULL;
	s = atomic_load(&sets[epfd]);
	if (s || !create)
		return s;
	pthread_mutex_lock(&sets_lock);
	s = atomic_load(&sets[epfd]);
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (s) {
			s->shadow = epoll_create1(EPOLL_CLOEXEC);
			if (s->shadow < 0) {
				free(s);
				s = NULL;
			} else {
				pthread_mutex_init(&s->lock, NULL);
				atomic_store(&sets[epfd], s);
				if (atomic_load(&sets_hi) <= epfd)
					atomic_store(&sets_hi, epfd + 1);
			}
		}
	}
	pthread_mutex_unlock(&sets_lock);
	return s;
}

static struct ep_reg *reg_find(struct ep_set *s, int fd)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->regs[i].fd == fd)
			return &s->regs[i];
	return NULL;
}

static void reg_remove(struct ep_set *s, struct ep_reg *r)
{
	*r = s->regs[--s->n];
}

void pl_epoll_forget(int fd)
{
	struct ep_set *s;

	if (fd < 0 || fd >= PL_FD_MAX)
		return;
	/* fd was an epoll set: drop its registry and shadow. */
	if (atomic_load_explicit(&sets[fd], memory_order_relaxed)) {
		pthread_mutex_lock(&sets_lock);
		s = atomic_exchange(&sets[fd], NULL);
		pthread_mutex_unlock(&sets_lock);
	} else {
		s = NULL;
	}
	if (s) {
		pl_real.close(s->shadow);
		pthread_mutex_destroy(&s->lock);
		free(s->regs);
		free(s);
	}
	/* fd was in sets (only tracked descriptors are): the kernel forgets a closed descriptor, so
	 * do we. */
	if (!pl_tracked(fd))
		return;
	for (int e = 0, hi = atomic_load(&sets_hi); e < hi; e++) {
		struct ep_reg *r;

		s = atomic_load_explicit(&sets[e], memory_order_relaxed);
		if (!s)
			continue;
		pthread_mutex_lock(&s->lock);
		r = reg_find(s, fd);
		if (r)
			reg_remove(s, r);
		pthread_mutex_unlock(&s->lock);
	}
}

static uint32_t shadow_events(const struct ep_reg *r)
{
	if (r->disabled)
		return 0;
	return EPOLLIN | (r->events & EPOLLET);
}

static int ctl_tracked(int epfd, int op, int fd, struct epoll_event *ev, struct pl_fd *p)
{
	struct epoll_event sev = {0};
	struct ep_set *s;
	struct ep_reg *r;
	int sfd = p->kind == PL_LISTENER ? p->lfd : fd;
	int ret = 0;

	if (op != EPOLL_CTL_DEL && !ev) {
		errno = EFAULT;
		return -1;
	}
	if (p->kind == PL_LISTENER) {
		/* The kernel socket stays in the application's set, as it asked. */
		ret = pl_real.epoll_ctl(epfd, op, fd, ev);
		if (ret || sfd < 0)
			return ret;
	}
	s = set_get(epfd, op == EPOLL_CTL_ADD);
	if (!s) {
		if (op == EPOLL_CTL_ADD) {
			errno = ENOMEM;
			return -1;
		}
		errno = ENOENT;
		return p->kind == PL_LISTENER ? 0 : -1;
	}
	pthread_mutex_lock(&s->lock);
	r = reg_find(s, fd);
	switch (op) {
	case EPOLL_CTL_ADD:
		if (r) {
			errno = EEXIST;
			ret = -1;
			break;
		}
		if (s->n == s->cap) {
			size_t cap = s->cap ? s->cap * 2 : 16;
			struct ep_reg *regs = realloc(s->regs, cap * sizeof(*regs));

			if (!regs) {
				errno = ENOMEM;
				ret = -1;
				break;
			}
			s->regs = regs;
			s->cap = cap;
		}
		r = &s->regs[s->n++];
		*r = (struct ep_reg){.fd = fd, .listener = p->kind == PL_LISTENER, .events = ev->events,
				     .armed = ev->events, .data = ev->data};
		sev.events = shadow_events(r);
		sev.data.fd = fd;
		ret = pl_real.epoll_ctl(s->shadow, EPOLL_CTL_ADD, sfd, &sev);
		if (ret)
			reg_remove(s, r);
		break;
	case EPOLL_CTL_MOD:
		if (!r) {
			errno = ENOENT;
			ret = -1;
			break;
		}
		r->events = ev->events;
		r->armed = ev->events;
		r->data = ev->data;
		r->disabled = false;
		sev.events = shadow_events(r);
		sev.data.fd = fd;
		ret = pl_real.epoll_ctl(s->shadow, EPOLL_CTL_MOD, sfd, &sev);
		break;
	case EPOLL_CTL_DEL:
		if (!r) {
			errno = ENOENT;
			ret = -1;
			break;
		}
		reg_remove(s, r);
		pl_real.epoll_ctl(s->shadow, EPOLL_CTL_DEL, sfd, NULL);
		break;
	default:
		errno = EINVAL;
		ret = -1;
	}
	pthread_mutex_unlock(&s->lock);
	return ret;
}

int pl_epoll_ctl(struct pl_fd *p, int epfd, int op, int fd, struct epoll_event *ev)
{
	int ret = ctl_tracked(epfd, op, fd, ev, p);

	pl_put(p);
	return ret;
}

/* Collects what the registrations of s have to report; the set is locked. */
static int ep_collect(struct ep_set *s, struct epoll_event *out, int max)
{
	struct epoll_event sev[64];
	int k, n = 0;

	k = pl_real.epoll_wait(s->shadow, sev, 64, 0);
	for (int i = 0; i < k; i++) {
		struct ep_reg *r = reg_find(s, sev[i].data.fd);

		if (r) {
			r->signalled = true;
			if (r->events & EPOLLET)
				r->armed = r->events;
		}
	}
	for (size_t j = 0; j < s->n && n < max; j++) {
		size_t i = (s->next + j) % s->n;
		struct ep_reg *r = &s->regs[i];
		uint32_t want, rev = 0;
		struct pl_fd *p;

		if (r->disabled)
			continue;
		want = (r->events & EPOLLET ? r->armed : r->events) | EPOLLERR | EPOLLHUP;
		if (r->listener) {
			if (r->signalled)
				rev = EPOLLIN & want;
		} else if ((p = pl_get(r->fd))) {
			if (want & ~(uint32_t)(EPOLLERR | EPOLLHUP) || r->signalled)
				rev = (uint32_t)pl_chan_revents(p, r->signalled) & want;
			pl_put(p);
		}
		r->signalled = false;
		if (!rev)
			continue;
		if (r->events & EPOLLET)
			r->armed &= ~rev;
		if (r->events & EPOLLONESHOT) {
			struct epoll_event off = {.events = 0, .data.fd = r->fd};

			r->disabled = true;
			if (!r->listener)
				pl_real.epoll_ctl(s->shadow, EPOLL_CTL_MOD, r->fd, &off);
		}
		out[n].events = rev;
		out[n].data = r->data;
		n++;
	}
	if (s->n)
		s->next = (s->next + 1) % s->n;
	return n;
}

/* The spin budget of the set's first channel (they all have meshd's); the set is locked. */
static uint32_t ep_spin_us(struct ep_set *s)
{
	for (size_t i = 0; i < s->n; i++) {
		struct pl_fd *p;
		uint32_t spin;

		if (s->regs[i].listener || s->regs[i].disabled || !(p = pl_get(s->regs[i].fd)))
			continue;
		spin = p->kind == PL_CHANNEL ? pl_chan_spin_us(p) : 0;
		pl_put(p);
		if (spin)
			return spin;
	}
	return 0;
}

int pl_epoll_wait(int epfd, struct epoll_event *out, int max, int timeout, const sigset_t *mask)
{
	struct ep_set *s = set_get(epfd, false);
	int64_t deadline = deadline_of(timeout);
	struct pl_spin sp;
	uint32_t spin;

	if (!s || !s->n || max <= 0 || !out)
		return mask ? pl_real.epoll_pwait(epfd, out, max, timeout, mask) : pl_real.epoll_wait(epfd, out, max, timeout);
	pthread_mutex_lock(&s->lock);
	spin = ep_spin_us(s);
	pthread_mutex_unlock(&s->lock);
	pl_spin_start(&sp, spin);
	for (;;) {
		struct pollfd pf[2] = {{.fd = epfd, .events = POLLIN}, {.fd = s->shadow, .events = POLLIN}};
		int n, m;

		pthread_mutex_lock(&s->lock);
		n = ep_collect(s, out, max);
		pthread_mutex_unlock(&s->lock);
		if (n) {
			m = pl_real.epoll_wait(epfd, out + n, max - n, 0);
			return n + (m > 0 ? m : 0);
		}
		if (pl_spin_on(&sp, deadline)) {
			m = pl_real.epoll_wait(epfd, out, max, 0);
			if (m)
				return m;
			sched_yield();
			continue;
		}
		if (left_ms(deadline) == 0)
			return pl_real.epoll_wait(epfd, out, max, 0);
		m = real_wait(pf, 2, left_ms(deadline), mask);
		if (m < 0)
			return -1;
		if (pf[0].revents) {
			m = pl_real.epoll_wait(epfd, out, max, 0);
			if (m)
				return m;
		}
	}
}
