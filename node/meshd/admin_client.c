/*
 * The control socket's clients (admin.h's client table): a slot for a new connection and its
 * limits, a client's slot found, one reply sent, a bad request answered and counted, the rate
 * limit of the lines clients cause, a client dropped. The bottom of the control socket's files:
 * admin.c, admin_show.c, admin_channel.c and admin_ops.c call it, and it calls none of them.
 */
#include <errno.h>
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

int admin_watch_fd(int epfd, int fd, uint64_t tag)
{
	struct epoll_event ee = {.events = EPOLLIN, .data.u64 = tag | (uint32_t)fd};

	return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ee) ? -errno : 0;
}

/* Frees the metrics text a client was paging through (a new page 0, or the client gone). */
void admin_metrics_forget(struct admin *a, int slot)
{
	free(a->metrics_text[slot]);
	a->metrics_text[slot] = NULL;
	a->metrics_len[slot] = 0;
}

/* Closes a client's connection and frees its slot; the mesh's lock is held (its listeners go, a
 * connect it waits for is abandoned, before its descriptor number can be reused). */
void admin_drop(struct admin *a, int slot)
{
	int fd;

	pthread_mutex_lock(&a->lock);
	fd = a->clients[slot];
	pthread_mutex_unlock(&a->lock);
	if (fd < 0)
		return;
	admin_metrics_forget(a, slot);
	channel_client_gone(a->mesh, fd);
	ping_client_gone(a->mesh, fd);
	pthread_mutex_lock(&a->lock);
	epoll_ctl(a->ctl_epfd, EPOLL_CTL_DEL, fd, NULL);
	close(fd);
	a->clients[slot] = -1;
	a->gone[slot] = false;
	if (a->queued[slot]) {
		mesh_ctl_req_free(a->queued[slot]);
		a->queued[slot] = NULL;
	}
	pthread_mutex_unlock(&a->lock);
}

/* Whether a line a local client caused (a bad request, a refused connect, a full table) may be
 * written: a member of the group sending bad requests as fast as it could wrote 268,060 lines
 * (35.6 MB) in 5 s. At most ADMIN_LOG_BURST such lines per ADMIN_LOG_INTERVAL_MS; the next one
 * allowed is preceded by the count of those left out. meshctl node's ctl_errors counts them all. */
bool admin_client_log_ok(struct admin *a)
{
	uint64_t dropped = 0;
	bool ok;

	pthread_mutex_lock(&a->log_lock);
	ok = log_ratelimit_ok(&a->client_log, util_now_ms(), &dropped);
	pthread_mutex_unlock(&a->log_lock);
	if (ok && dropped)
		log_warn("local clients: %llu lines about their requests were not logged (at most %u in %u s)",
			 (unsigned long long)dropped, ADMIN_LOG_BURST, ADMIN_LOG_INTERVAL_MS / 1000);
	return ok;
}

/* A free slot of the client table for a connection of uid, or -1 with why it may not have one
 * (ADMIN_CLIENTS_ROOT, ADMIN_CLIENTS_PER_UID). */
int admin_slot_for(struct admin *a, uint32_t uid, char *why, size_t len)
{
	bool privileged = uid == 0 || uid == (uint32_t)geteuid();
	uint32_t used = 0, mine = 0;
	int slot = -1;

	for (int s = 0; s < ADMIN_CLIENTS_MAX; s++) {
		if (a->clients[s] < 0) {
			slot = slot < 0 ? s : slot;
			continue;
		}
		used++;
		mine += a->client_uid[s] == uid;
	}
	if (slot < 0)
		snprintf(why, len, "all %d of meshd's control connections are taken", ADMIN_CLIENTS_MAX);
	else if (!privileged && used >= ADMIN_CLIENTS_MAX - ADMIN_CLIENTS_ROOT)
		snprintf(why, len, "%u control connections are open; the last %d are kept for root", used,
			 ADMIN_CLIENTS_ROOT);
	else if (!privileged && mine >= ADMIN_CLIENTS_PER_UID)
		snprintf(why, len, "uid %u holds %u control connections, the most one user may", uid, mine);
	else
		return slot;
	return -1;
}

/* One reply on a client's connection: 0, or a negative errno (the caller drops the client: one
 * that does not read its replies loses its connection, never meshd's time). */
int admin_send_reply(int fd, const CtlReply *r)
{
	size_t n = ctl_reply__get_packed_size(r);
	uint8_t *buf;
	ssize_t sent;

	if (n > MESH_CTL_REPLY_MAX) {
		CtlReply e = CTL_REPLY__INIT;

		log_warn("reply of %zu bytes exceeds %u: answering with an error", n, MESH_CTL_REPLY_MAX);
		e.status = -EMSGSIZE;
		e.error = "reply too large for one message";
		return admin_send_reply(fd, &e);
	}
	buf = malloc(n ? n : 1);
	if (!buf)
		return -ENOMEM;
	ctl_reply__pack(r, buf);
	sent = send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
	free(buf);
	if (sent < 0) {
		int ret = -errno;

		log_warn("reply of %zu bytes to local client: %m; dropping it", n);
		return ret;
	}
	return 0;
}

int admin_reply_error(struct admin *a, int slot, int fd, int status, const char *why)
{
	CtlReply r = CTL_REPLY__INIT;

	if (admin_client_log_ok(a))
		log_warn("local client pid %d uid %u: bad request: %s", a->client_pid[slot], a->client_uid[slot], why);
	atomic_fetch_add(&a->errors, 1);
	r.status = status;
	r.error = (char *)why;
	return admin_send_reply(fd, &r);
}

/* The slot of a client's descriptor, gone or not, or -1; under a->lock. */
int admin_slot_locked(const struct admin *a, int fd)
{
	for (int i = 0; i < ADMIN_CLIENTS_MAX; i++)
		if (a->clients[i] == fd)
			return i;
	return -1;
}

/* The slot of a client that is still there, or -1. */
int admin_slot_of(struct admin *a, int fd)
{
	int slot;

	pthread_mutex_lock(&a->lock);
	slot = admin_slot_locked(a, fd);
	if (slot >= 0 && a->gone[slot])
		slot = -1;
	pthread_mutex_unlock(&a->lock);
	return slot;
}
