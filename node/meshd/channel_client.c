/*
 * Local clients of channels (channel_internal.h): listening ports, connects with their quotas and
 * descriptor reserve, handing a channel to its application, the application's lifeline and kicks.
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

/* ---- local clients ---- */

int channel_listen(struct mesh *m, uint16_t port, int client_fd, uint32_t uid, const char **why)
{
	struct listener *li;

	/* Otherwise any local user could take a well-known port before its service starts and receive
	 * its channels. */
	if (port < CH_PORT_PRIVILEGED && uid != 0) {
		*why = "ports below 1024 are root's (as in TCP)";
		return -EACCES;
	}
	if (m->chans->draining) {
		*why = "this node's meshd is draining for maintenance";
		return -MESH_EDRAINING;
	}
	for (li = m->chans->listeners; li; li = li->next) {
		if (li->port == port) {
			*why = li->uid == uid ? "port already has a listener" : "port already has a listener of another user";
			return -EADDRINUSE;
		}
	}
	li = calloc(1, sizeof(*li));
	if (!li) {
		*why = "out of memory";
		return -ENOMEM;
	}
	li->port = port;
	li->fd = client_fd;
	li->uid = uid;
	li->next = m->chans->listeners;
	m->chans->listeners = li;
	channel_store_keep_listener(m, li);
	log_debug("listening on port %u for client fd %d (uid %u)", port, client_fd, uid);
	return 0;
}

/* Descriptors a channel takes in meshd (its ring's memfd, the lifeline, kick and wake), and those
 * kept from channels: every link's QPs twice over (a re-dial overlaps the old attempt) and the
 * control socket's clients, at most half of the limit. One user's 332 channels under a soft limit
 * of 1024 left none: root's meshctl timed out and node 2 could not rejoin ("Too many open files").
 * Counting /proc/self/fd costs a directory read per channel opened, not per byte. */
#define CH_FDS 4u
#define FD_RESERVE_BASE 32u

static uint64_t channel_fd_reserve(const struct mesh *m)
{
	uint64_t reserve = FD_RESERVE_BASE + 2ull * m->n_links * m->cfg->qps_per_link * m->n_rails;

	return MIN(reserve, m->fd_limit / 2);
}

static int channel_fds_left(struct mesh *m, const char **why)
{
	uint64_t reserve = channel_fd_reserve(m);
	int open;

	if (!m->fd_limit)
		return 0;
	open = util_fds_open();
	if (open < 0 || (uint64_t)open + CH_FDS + reserve <= m->fd_limit)
		return 0;
	*why = "meshd is near its descriptor limit (RLIMIT_NOFILE): the rest is kept for its links and the control "
	       "socket";
	return -EMFILE;
}

/* Whether uid may hold one more channel of ring_size on link l: a local user cannot take every
 * slot or pin unbounded memory through meshd. Channels still closing count: their memory is still
 * pinned. Inside one link a user other than root holds at most half of what a peer takes from one
 * node (max_channels_per_link, max_ring_mib_per_link, which the peers share): one user took all
 * 1024 channels of a link in 1.3 s, and root's next was refused by the peer. */
int channel_quota(struct mesh *m, const struct link *l, uint32_t uid, uint64_t ring_size, const char **why)
{
	uint64_t n = 0, bytes = 2 * ring_size, n_link = 0, bytes_link = 2 * ring_size;

	for (const struct channel *ch = m->chans->channels; ch; ch = ch->next)
		if (ch->owner_uid == uid) {
			n++;
			bytes += 2 * ch->size;
			if (ch->link == l) {
				n_link++;
				bytes_link += 2 * ch->size;
			}
		}
	if (n >= m->cfg->max_channels_per_uid) {
		*why = "the user holds cluster.max_channels_per_uid channels already";
		return -EDQUOT;
	}
	/* And at most half of the channels meshd's descriptors allow: under a low RLIMIT_NOFILE one user's
	 * channels took every descriptor the reserve did not keep, and no other user got one. */
	if (uid && m->fd_limit && n >= MAX((m->fd_limit - channel_fd_reserve(m)) / CH_FDS / 2, 1u)) {
		*why = "the user holds half of the channels meshd's descriptors allow (RLIMIT_NOFILE; the rest are kept "
		       "for other users)";
		return -EDQUOT;
	}
	if (bytes > m->cfg->max_ring_bytes_per_uid) {
		*why = "the user's rings would exceed cluster.max_ring_bytes_per_uid";
		return -EDQUOT;
	}
	if (uid && n_link >= MAX(m->cfg->max_channels_per_link / 2, 1u)) {
		*why = "the user holds half of cluster.max_channels_per_link channels with that node already (the rest "
		       "are kept for other users)";
		return -EDQUOT;
	}
	if (uid && bytes_link > ((uint64_t)m->cfg->max_ring_mib_per_link << 20) / 2) {
		*why = "the user's rings with that node would exceed half of cluster.max_ring_mib_per_link (the rest "
		       "are kept for other users)";
		return -EDQUOT;
	}
	return channel_fds_left(m, why);
}

static uint16_t channel_ephemeral_port(struct mesh *m)
{
	uint16_t p = (uint16_t)(CH_EPHEMERAL_FIRST + (m->chans->next_channel_id % (65536u - CH_EPHEMERAL_FIRST)));

	return p;
}

int channel_connect(struct mesh *m, uint32_t node, uint16_t port, uint64_t ring_size, uint32_t qps, int numa_hint,
		    int caller_node, int rail_req, int client_fd, uint32_t uid, const char **why)
{
	struct link *l;
	struct channel *ch;
	uint32_t rail;
	int ret, numa_node;

	if (node == m->self->id) {
		/* Ring to ring in this process: any rail asked for is taken as rail 0 (there is no device). */
		l = local_link(m);
		if (!l) {
			*why = "out of memory";
			return -ENOMEM;
		}
		rail_req = rail_req >= (int)m->n_rails ? rail_req : -1;
	} else {
		l = mesh_link_find(m, node);
	}
	if (!l) {
		*why = "node is not in the cluster configuration";
		return -MESH_EUNKNOWNNODE;
	}
	if (m->chans->draining) {
		*why = "this node's meshd is draining for maintenance";
		return -MESH_EDRAINING;
	}
	if (l->phase != LINK_UP) {
		*why = "the link to that node is not UP";
		return -ENETUNREACH;
	}
	if (!(l->features & MESH_FEAT_CHANNELS)) {
		*why = "the peer's meshd does not support channels";
		return -EOPNOTSUPP;
	}
	if (!ring_size)
		ring_size = MESH_RING_DEFAULT;
	if (!qps || qps > m->cfg->qps_per_link)
		qps = m->cfg->qps_per_link;
	if (rail_req >= (int)m->n_rails) {
		*why = "no such rail: the cluster's nodes have fewer addresses (nodes.addr and nodes.rails)";
		return -EINVAL;
	}
	/* The device nearest the hint, else nearest the connecting thread; its node takes the rings. */
	rail = rail_req >= 0 ? (uint32_t)rail_req
	       : link_is_local(l) ? 0
				  : numa_rail_pick(m->numa.rail_node, m->n_rails, numa_hint >= 0 ? numa_hint : caller_node);
	/* A rail that failed (the link is UP on others) is not used until it is back. */
	rail = (uint32_t)mesh_link_pick_rail(l, (int)rail);
	numa_node = mesh_rail_node(m, rail, numa_hint);
	if (numa_node == -EINVAL) {
		*why = "the NUMA hint names no online node of this machine (meshctl node lists them)";
		return -EINVAL;
	}
	ret = channel_quota(m, l, uid, ring_size, why);
	if (ret)
		return ret;
	ch = channel_new(l, ring_size, qps, rail, numa_node, why, &ret);
	if (!ch)
		return ret;
	ch->owner_uid = uid;
	ch->opener = true;
	ch->state = CH_OPENING;
	ch->peer_port = port;
	ch->local_port = channel_ephemeral_port(m);
	ch->ctrl->local_port = ch->local_port;
	ch->ctrl->peer_port = port;
	ch->reply_fd = client_fd;
	ch->open_pending = true;
	ret = channel_send_open(ch);
	if (ret && ret != -ENOBUFS) {
		/* The peer knows nothing of it: free it at once, the client hears why. */
		*why = "cannot reach the peer";
		ch->state = CH_CLOSING;
		ch->app_gone = true;
		ch->reply_fd = -1;
		channel_free(ch);
		return ret;
	}
	log_debug("channel %u: opening to node %u port %u (ring %llu, %u QPs on rail %u, rings on node %d)%s", ch->id,
		  node, port, (unsigned long long)ring_size, qps, rail, numa_node,
		  ret ? "; the link's send slots are all in flight: the Open waits for one" : "");
	return 0;
}

/* ---- connects waiting for their link ---- */

static int wait_connect(struct mesh *m, const struct channel_connect_args *a, const char **why)
{
	return channel_connect(m, a->node, a->port, a->ring_size, a->qps, a->numa_hint, a->caller_node, a->rail,
			       a->client_fd, a->uid, why);
}

int channel_connect_wait(struct mesh *m, const struct channel_connect_args *a, uint32_t wait_ms, const char **why)
{
	struct link_wait *w;
	int ret = wait_connect(m, a, why);

	if (ret != -ENETUNREACH || !wait_ms)
		return ret;
	for (w = m->chans->link_waits; w; w = w->next) {
		if (w->a.client_fd == a->client_fd) {
			*why = "a connect already waits for its link on this control connection";
			return -EALREADY;
		}
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		*why = "out of memory";
		return -ENOMEM;
	}
	w->a = *a;
	w->wait_ms = wait_ms;
	w->deadline_ms = now_ms() + wait_ms;
	w->next = m->chans->link_waits;
	m->chans->link_waits = w;
	log_debug("connect to node %u port %u (client fd %d, uid %u) waits up to %u ms for the link", a->node, a->port,
		  a->client_fd, a->uid, wait_ms);
	return 0;
}

/* What becomes of a waiting connect now: 1 to keep waiting, else 0 and *status and *why to answer
 * (status 0: channel_connect took it, the answer comes with the channel). */
static int wait_judge(struct mesh *m, const struct link_wait *w, uint64_t t, int *status, const char **why, char *buf,
		      size_t len)
{
	struct link *l = mesh_link_find(m, w->a.node);

	*why = NULL;
	if (!l) {
		*status = -MESH_EUNKNOWNNODE;
		*why = "the node was removed from the cluster configuration while the connect waited for its link";
	} else if (m->chans->draining) {
		*status = -MESH_EDRAINING;
		*why = "this node's meshd is draining for maintenance";
	} else if (l->phase == LINK_UP) {
		*status = wait_connect(m, &w->a, why);
	} else if (t >= w->deadline_ms) {
		snprintf(buf, len, "the link to node %u did not come UP within %u ms (meshctl links %u says why)", w->a.node,
			 w->wait_ms, w->a.node);
		*status = -ETIMEDOUT;
		*why = buf;
	} else {
		return 1;
	}
	return 0;
}

/* The tick and every link that came UP: waiting connects whose link is UP go on, those past their
 * deadline (or whose node drains or was removed) are answered. */
void channel_waits_run(struct mesh *m, uint64_t t)
{
	struct link_wait **pp = &m->chans->link_waits;

	while (*pp) {
		struct link_wait *w = *pp;
		const char *why;
		char buf[128];
		int status;

		if (wait_judge(m, w, t, &status, &why, buf, sizeof(buf))) {
			pp = &w->next;
			continue;
		}
		*pp = w->next;
		if (status && m->chans->ch_ops.deliver)
			m->chans->ch_ops.deliver(m->chans->ch_ops.ctx, w->a.client_fd, status, why, NULL, NULL);
		log_debug("connect to node %u port %u (client fd %d) no longer waits for the link: %s", w->a.node, w->a.port,
			  w->a.client_fd, status ? mesh_strerror(status) : "opening");
		free(w);
	}
}

void channel_waits_free(struct mesh *m)
{
	while (m->chans->link_waits) {
		struct link_wait *w = m->chans->link_waits;

		m->chans->link_waits = w->next;
		free(w);
	}
}

void channel_client_gone(struct mesh *m, int client_fd)
{
	struct listener **pp = &m->chans->listeners;

	for (struct link_wait **wp = &m->chans->link_waits; *wp;) {
		struct link_wait *w = *wp;

		if (w->a.client_fd == client_fd) {
			*wp = w->next;
			free(w);
		} else {
			wp = &w->next;
		}
	}

	while (*pp) {
		struct listener *li = *pp;

		if (li->fd == client_fd) {
			*pp = li->next;
			channel_store_drop_listener(m, li);
			free(li);
		} else {
			pp = &li->next;
		}
	}
	for (struct channel *ch = m->chans->channels, *next; ch; ch = next) {
		next = ch->next;
		if (ch->reply_fd == client_fd) {
			/* Nobody will take this channel: it closes like one whose application died. */
			ch->reply_fd = -1;
			ch->app_gone = true;
			channel_pump(ch);
		}
	}
}

int channel_hand_over(struct channel *ch, int fd)
{
	struct mesh *m = ch->mesh;
	const struct channel_ops *ops = &m->chans->ch_ops;
	int fds[4] = {ch->memfd, ch->app_life_fd, ch->kick_fd, ch->wake_fd};
	int ret;

	channel_aq_offer(ch);
	ret = ops->deliver ? ops->deliver(ops->ctx, fd, 0, NULL, ch, fds) : -ENOTCONN;

	if (ret)
		return ret;
	/* The application has its copies now; meshd keeps the mapping, the kick, wake and lifeline,
	 * and, kept in the service manager's store for a restart, the ring's memfd (a rename keeps it
	 * again). */
	channel_store_keep(ch);
	if (!ch->kept) {
		close(ch->memfd);
		ch->memfd = -1;
	}
	close(ch->app_life_fd);
	ch->app_life_fd = -1;
	return 0;
}

bool channel_on_kick_fast(struct mesh *m, uint32_t id, uint32_t rail)
{
	struct channel *ch = channel_find(m, id);
	uint64_t v;

	if (!ch || ch->rail != rail)
		return false;
	if (read(ch->kick_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_debug("channel %u: kick read: %m", id);
	if (channel_fast_ok(ch, rail))
		channel_pump_fast(ch, rail);
	else
		channel_want_slow(ch, rail);
	return true;
}

void channel_on_lifeline(struct mesh *m, uint32_t id)
{
	struct channel *ch = channel_find(m, id);
	char buf[64];
	ssize_t n;

	if (!ch)
		return;
	n = recv(ch->life_fd, buf, sizeof(buf), MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return;
	if (n > 0)
		return; /* nothing is defined on the lifeline yet: ignore, it is not a close */
	/* The application closed or died: a clean close if it shut its write side first. */
	channel_read_app(ch);
	ch->app_gone = true;
	if (m->chans->ch_ops.watch)
		m->chans->ch_ops.watch(m->chans->ch_ops.ctx, ch, false);
	log_debug("channel %u: application %s", ch->id, ch->app_shut ? "closed" : "gone without shutdown");
	channel_pump(ch);
}
