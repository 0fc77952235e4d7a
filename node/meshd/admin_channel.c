/*
 * Channels handed to applications (channel_ops, channel.h): a LISTEN or CONNECT request passed to
 * the channel layer, the reply that carries a channel's four descriptors to its application, the
 * kick and lifeline descriptors watched in the data path's epoll sets (and moved with a channel's
 * rail), and listening clients adopted from the meshd before a restart.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "admin.h"
#include "admin_int.h"
#include "channel.h"
#include "log.h"
#include "util.h"

/* channel_ops.deliver: a reply to a LISTEN'ing or CONNECT'ing client, with the channel's four
 * descriptors when ch is set. Returns 0 or a negative errno (then the client has nothing). */
static int admin_deliver(void *ctx, int fd, int status, const char *why, const struct channel *ch, const int fds[4])
{
	struct admin *a = ctx;
	CtlReply r = CTL_REPLY__INIT;
	ChannelSetup setup = CHANNEL_SETUP__INIT;
	NodeInfo node = NODE_INFO__INIT;
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} cbuf;
	struct msghdr mh = {0};
	struct iovec iov;
	uint8_t *buf;
	size_t n;
	ssize_t sent;
	int slot = admin_slot_of(a, fd);

	if (slot < 0)
		return -ENOTCONN;
	r.status = status;
	r.error = (char *)(why ? why : "");
	/* Never an empty datagram: on SEQPACKET it would read like the end of the connection. */
	node.id = a->mesh->self->id;
	node.cluster = (char *)a->mesh->cfg->cluster_name;
	r.node = &node;
	if (ch) {
		setup.channel_id = ch->id;
		setup.peer_node = ch->link ? ch->link->peer->id : 0;
		setup.local_port = ch->local_port;
		setup.peer_port = ch->peer_port;
		setup.ring_size = ch->size;
		setup.memfd_size = ch->map_len;
		setup.qps = ch->qps;
		r.setup = &setup;
	}
	n = ctl_reply__get_packed_size(&r);
	buf = malloc(n ? n : 1);
	if (!buf)
		return -ENOMEM;
	ctl_reply__pack(&r, buf);
	iov.iov_base = buf;
	iov.iov_len = n;
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	if (ch && fds) {
		struct cmsghdr *cm;

		memset(&cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf.buf;
		mh.msg_controllen = sizeof(cbuf.buf);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(4 * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, 4 * sizeof(int));
	}
	sent = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	free(buf);
	if (sent < 0) {
		int ret = -errno;

		log_warn("local client fd %d: cannot deliver a channel reply: %m", fd);
		return ret;
	}
	return 0;
}

/* The epoll set a channel's kick goes to: its rail's thread's. */
static int admin_kick_epfd(const struct admin *a, uint32_t rail)
{
	return rail < a->n_kick_epfd ? a->kick_epfd[rail] : a->epfd;
}

/* A channel's kick descriptor into the epoll set of its rail's thread. */
static void admin_watch_kick(struct admin *a, struct channel *ch)
{
	struct epoll_event ee = {.events = EPOLLIN, .data.u64 = a->tag_kick | ch->id};

	if (epoll_ctl(admin_kick_epfd(a, ch->rail), EPOLL_CTL_ADD, ch->kick_fd, &ee))
		log_warn("channel %u: epoll add kick (rail %u): %m", ch->id, ch->rail);
}

/* channel_ops.watch: the kick descriptor of a channel in its rail's thread's epoll set, the
 * lifeline in the data path's (a close takes every lock anyway). */
static void admin_watch(void *ctx, struct channel *ch, bool add)
{
	struct admin *a = ctx;
	struct epoll_event ee = {.events = EPOLLIN, .data.u64 = a->tag_life | ch->id};

	if (!add) {
		if (ch->kick_fd >= 0)
			epoll_ctl(admin_kick_epfd(a, ch->rail), EPOLL_CTL_DEL, ch->kick_fd, NULL);
		if (ch->life_fd >= 0)
			epoll_ctl(a->epfd, EPOLL_CTL_DEL, ch->life_fd, NULL);
		return;
	}
	admin_watch_kick(a, ch);
	if (epoll_ctl(a->epfd, EPOLL_CTL_ADD, ch->life_fd, &ee))
		log_warn("channel %u: epoll add lifeline: %m", ch->id);
}

/* channel_ops.moved: the kick follows the channel to its new rail's thread. A kick not yet read
 * is reported by the new set at once (level-triggered). */
static void admin_moved(void *ctx, struct channel *ch, uint32_t from)
{
	struct admin *a = ctx;
	int old = admin_kick_epfd(a, from);

	if (old == admin_kick_epfd(a, ch->rail) || ch->kick_fd < 0)
		return;
	epoll_ctl(old, EPOLL_CTL_DEL, ch->kick_fd, NULL);
	admin_watch_kick(a, ch);
}

/* A listening client's connection the last meshd kept (channel_store.c): a client again, its user
 * from the connection (SO_PEERCRED), listening on port as it asked the last meshd. Takes fd (closed
 * on failure). */
static int admin_adopt(void *ctx, int fd, uint16_t port)
{
	struct admin *a = ctx;
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	const char *why = NULL;
	char full[128];
	int slot, ret;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) || fcntl(fd, F_SETFL, O_NONBLOCK)) {
		ret = -errno;
		close(fd);
		return ret;
	}
	pthread_mutex_lock(&a->lock);
	slot = admin_slot_for(a, cred.uid, full, sizeof(full));
	ret = slot < 0 ? -EMFILE : admin_watch_fd(a->ctl_epfd, fd, ADMIN_TAG(ADMIN_EV_CLIENT));
	if (!ret) {
		a->client_uid[slot] = cred.uid;
		a->client_pid[slot] = cred.pid;
		a->clients[slot] = fd;
	}
	pthread_mutex_unlock(&a->lock);
	if (ret) {
		close(fd);
		return ret;
	}
	ret = channel_listen(a->mesh, port, fd, cred.uid, &why);
	if (ret) {
		log_warn("port %u: %s", port, why);
		admin_drop(a, slot);
	}
	return ret;
}

void admin_bind_channels(struct admin *a, uint64_t tag_kick, uint64_t tag_life, const int *rail_epfd,
			 uint32_t n_rails)
{
	a->tag_kick = tag_kick;
	a->tag_life = tag_life;
	a->n_kick_epfd = MIN(n_rails, (uint32_t)MESH_RAILS_MAX);
	for (uint32_t r = 0; r < a->n_kick_epfd; r++)
		a->kick_epfd[r] = rail_epfd[r];
	a->mesh->chans->ch_ops.deliver = admin_deliver;
	a->mesh->chans->ch_ops.watch = admin_watch;
	a->mesh->chans->ch_ops.moved = admin_moved;
	a->mesh->chans->ch_ops.adopt = admin_adopt;
	a->mesh->chans->ch_ops.ctx = a;
}

void admin_channel_request(struct admin *a, int slot, int fd, const CtlRequest *req)
{
	const char *why = NULL;
	int ret;

	if (req->op == CTL_OP__CTL_OP_LISTEN) {
		ret = channel_listen(a->mesh, (uint16_t)req->port, fd, a->client_uid[slot], &why);
		admin_deliver(a, fd, ret, why, NULL, NULL);
		return;
	}
	if (req->has_numa && req->numa_node < 0) {
		ret = -EINVAL;
		why = "the NUMA hint is negative";
	} else {
		/* The caller's node is only a preference: a value naming no node simply matches no device. */
		int caller = req->has_caller_node && req->caller_node < NUMA_NODES_MAX ? (int)req->caller_node : -1;

		struct channel_connect_args ca = {
			.node = req->node,
			.port = (uint16_t)req->port,
			.ring_size = req->ring_size,
			.qps = req->qps,
			.numa_hint = req->has_numa ? req->numa_node : -1,
			.caller_node = caller,
			.rail = req->has_rail ? (int)MIN(req->rail, (uint32_t)INT32_MAX) : -1,
			.client_fd = fd,
			.uid = a->client_uid[slot],
		};

		/* link_wait_ms is bounded by the decoder (a day); the waits by the client slots. */
		ret = channel_connect_wait(a->mesh, &ca, req->link_wait_ms, &why);
	}
	if (ret) {
		if (admin_client_log_ok(a))
			log_info("local client pid %d uid %u: connect to node %u port %u: %s (%s)", a->client_pid[slot],
			 a->client_uid[slot], req->node, req->port, why ? why : "", mesh_strerror(ret));
		admin_deliver(a, fd, ret, why, NULL, NULL);
	}
}
