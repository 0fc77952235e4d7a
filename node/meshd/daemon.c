/*
 * The meshd program's small helpers (daemon.h) that main.c (start-up), loop.c (the loop) and
 * reload.c (a reload) all use: they stand below those three and call none of them.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>

#include "config.h"
#include "daemon.h"
#include "mesh.h"
#include "util.h"

/* Every address of every other node, for the providers (xport_attr.node_addrs): pointers into
 * d->cfg; *n set. NULL when out of memory. */
const char **node_addrs_list(const struct daemon *d, const struct config_node *self, uint32_t *n)
{
	const char **a = calloc(d->cfg.n_nodes * CONFIG_RAILS_MAX, sizeof(*a));

	*n = 0;
	if (!a)
		return NULL;
	for (size_t i = 0; i < d->cfg.n_nodes; i++) {
		const struct config_node *nd = &d->cfg.nodes[i];

		if (nd == self)
			continue;
		for (uint32_t r = 0; r < MAX(1u, nd->n_rails); r++)
			a[(*n)++] = mesh_node_addr(nd, r);
	}
	return a;
}

/* The tick every period_ms, the first in a millisecond: 0 or -errno. */
int timer_set(int fd, uint32_t period_ms)
{
	struct itimerspec its = {
		.it_interval = {.tv_sec = period_ms / 1000, .tv_nsec = (long)(period_ms % 1000) * 1000000L},
		.it_value = {.tv_sec = 0, .tv_nsec = 1000000L},
	};

	return timerfd_settime(fd, 0, &its, NULL) ? -errno : 0;
}

/* fd into epoll set epfd for reading, tagged tag | fd: 0 or -errno. */
int add_fd(int epfd, int fd, uint64_t tag)
{
	struct epoll_event ee = {.events = EPOLLIN, .data.u64 = tag | (uint32_t)fd};

	return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ee) ? -errno : 0;
}
