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
#include "metrics.h"

#define ADMIN_CLIENTS_MAX 64
#define ADMIN_PAUSE_MS 100 /* out of descriptors: the listening socket rests this long */
/* Bytes of metrics text per reply (MetricsPage): a datagram well within the default socket
 * buffers (net.core.wmem_default is 208 KiB). */
#define ADMIN_METRICS_PAGE 61440u
/* Bytes of LinkInfo, ChannelInfo or PortInfo items per reply: with the NodeInfo every reply carries
 * it stays well under a datagram the socket buffers take at once (net.core.wmem_default). */
#define ADMIN_LIST_PAGE 49152u

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
	uint64_t http_scrapes; /* requests the HTTP endpoint (metrics_http.h) answered with the text */
	/* Per client: the metrics text rendered at its request for offset 0, kept while it pages
	 * through it (CTL_OBJECT_METRICS), freed after the last page or with the client. */
	char *metrics_text[ADMIN_CLIENTS_MAX];
	size_t metrics_len[ADMIN_CLIENTS_MAX];
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
/* The node's metrics text (metrics.h) with what the control socket counts: the one renderer of
 * both the HTTP endpoint and `meshctl metrics`. 0 or -ENOMEM. */
int admin_metrics_render(struct admin *a, struct metrics_buf *b);

#endif
