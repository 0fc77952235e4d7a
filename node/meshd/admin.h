/*
 * meshd's local control socket: unix SOCK_SEQPACKET, one protobuf CtlRequest per datagram, one
 * CtlReply per request. Clients are hostile until checked: an oversized, undecodable or unknown
 * request gets an error reply and a log line naming the client (SO_PEERCRED), and meshd goes on
 * serving everyone else.
 */
#ifndef MESH_MESHD_ADMIN_H
#define MESH_MESHD_ADMIN_H

#include <stdint.h>
#include <sys/un.h>

#include "mesh.h"

#define ADMIN_CLIENTS_MAX 64
#define ADMIN_PAUSE_MS 100 /* out of descriptors: the listening socket rests this long */

struct admin {
	int lfd;
	int epfd;
	uint64_t tag_listen, tag_client; /* epoll tags: tag | fd */
	uint64_t tag_kick, tag_life;     /* epoll tags of channels: tag | channel id */
	struct mesh *mesh;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int clients[ADMIN_CLIENTS_MAX];
	uint32_t client_uid[ADMIN_CLIENTS_MAX]; /* SO_PEERCRED at accept: whose channels and ports */
	int client_pid[ADMIN_CLIENTS_MAX];
	uint64_t errors;
	/* Out of descriptors the listening socket stays readable: it leaves the epoll set until then
	 * (admin_tick puts it back) instead of waking the loop without end. 0: watched. */
	uint64_t paused_until_ms;
	uint64_t pauses;
};

/* Binds path (creating its directory, replacing a stale socket, refusing a live one) and adds the
 * listening fd to epfd. The socket is mode 0660 with group cluster.socket_group, so applications
 * run in that group; without the group (or with ""), 0600: meshd's user only. */
int admin_open(struct admin *a, const char *path, int epfd, uint64_t tag_listen, uint64_t tag_client,
	       struct mesh *m);
void admin_close(struct admin *a);
/* Makes the admin socket the channels' way to applications (channel_ops) and to meshd's epoll. */
void admin_bind_channels(struct admin *a, uint64_t tag_kick, uint64_t tag_life);
void admin_on_listen(struct admin *a);
/* Periodic: watches a paused listening socket again. */
void admin_tick(struct admin *a, uint64_t now_ms);
void admin_on_client(struct admin *a, int fd);

#endif
