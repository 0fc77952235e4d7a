/*
 * The cluster's nodes as addresses: meshd's node table, learnt once on the first connect() or
 * listen() that might go over the mesh (no meshd: every connection stays plain TCP), and the
 * conversions between a socket address and (node, port) that connect, listen and accept make.
 * The libmesh session it opens is the one every channel of the process is made on.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "preload.h"

#define PL_NODES_MAX 1024

static pthread_mutex_t nodes_lock = PTHREAD_MUTEX_INITIALIZER;
static int nodes_state; /* 0 not asked yet, 1 known, -1 no mesh (plain TCP) */
static struct pl_node *nodes;
static size_t n_nodes;
static mesh_session_t *session;

static void nodes_learn(void)
{
	struct mesh_node_addr *tab = NULL;
	const char *path;
	int n, ret;

	path = getenv(MESH_SOCKET_ENV);
	pl_lib_enter();
	ret = mesh_open(NULL, &session);
	if (ret)
		goto err;
	tab = calloc(PL_NODES_MAX, sizeof(*tab));
	if (!tab) {
		ret = -ENOMEM;
		goto err;
	}
	n = mesh_node_table(session, tab, PL_NODES_MAX);
	if (n < 0) {
		ret = n;
		goto err;
	}
	if (n > PL_NODES_MAX)
		n = PL_NODES_MAX;
	nodes = calloc((size_t)n, sizeof(*nodes));
	if (!nodes) {
		ret = -ENOMEM;
		goto err;
	}
	for (int i = 0; i < n; i++) {
		struct pl_node *d = &nodes[n_nodes];

		d->id = tab[i].node;
		d->self = tab[i].flags & MESH_NODE_SELF;
		if (inet_pton(AF_INET, tab[i].addr, d->addr) == 1) {
			d->family = AF_INET;
		} else if (inet_pton(AF_INET6, tab[i].addr, d->addr) == 1) {
			d->family = AF_INET6;
		} else {
			pl_warn(0, "node %u: address '%s' is not numeric; connections to it stay TCP", d->id,
				tab[i].addr);
			continue;
		}
		n_nodes++;
	}
	free(tab);
	pl_lib_leave();
	nodes_state = 1;
	PL_DEBUG("%zu nodes from meshd (%s)", n_nodes, path ? path : MESH_SOCKET_DEFAULT);
	return;

err:
	free(tab);
	pl_lib_leave();
	nodes_state = -1;
	pl_warn(0, "no meshd at %s (%s): every connection stays plain TCP", path && *path ? path : MESH_SOCKET_DEFAULT,
		mesh_strerror(ret));
}

void pl_nodes_fork(enum pl_fork_stage stage)
{
	if (stage == PL_FORK_PREPARE)
		pthread_mutex_lock(&nodes_lock);
	else
		pthread_mutex_unlock(&nodes_lock);
}

bool pl_nodes_ready(void)
{
	int st = __atomic_load_n(&nodes_state, __ATOMIC_ACQUIRE);

	if (st)
		return st > 0;
	pthread_mutex_lock(&nodes_lock);
	if (!nodes_state)
		nodes_learn();
	pthread_mutex_unlock(&nodes_lock);
	return nodes_state > 0;
}

/* The address of sa as (family, bytes); v4-mapped IPv6 is IPv4. */
int pl_sa_addr(const struct sockaddr *sa, socklen_t len, uint8_t out[16], uint16_t *port)
{
	if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *in = (const void *)sa;

		memcpy(out, &in->sin_addr, 4);
		*port = ntohs(in->sin_port);
		return AF_INET;
	}
	if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *in6 = (const void *)sa;

		*port = ntohs(in6->sin6_port);
		if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
			memcpy(out, &in6->sin6_addr.s6_addr[12], 4);
			return AF_INET;
		}
		memcpy(out, &in6->sin6_addr, 16);
		return AF_INET6;
	}
	return -1;
}

const struct pl_node *pl_node_by_addr(int family, const uint8_t *addr)
{
	for (size_t i = 0; i < n_nodes; i++)
		if (nodes[i].family == family && !memcmp(nodes[i].addr, addr, family == AF_INET ? 4 : 16))
			return &nodes[i];
	return NULL;
}

const struct pl_node *pl_node_by_id(uint32_t id)
{
	for (size_t i = 0; i < n_nodes; i++)
		if (nodes[i].id == id)
			return &nodes[i];
	return NULL;
}

const struct pl_node *pl_node_self(void)
{
	for (size_t i = 0; i < n_nodes; i++)
		if (nodes[i].self)
			return &nodes[i];
	return NULL;
}

/* 127.0.0.0/8 or ::1: the kernel would deliver it on this host. */
bool pl_addr_is_loopback(int family, const uint8_t *addr)
{
	static const uint8_t lo6[16] = {[15] = 1};

	return family == AF_INET ? addr[0] == 127 : !memcmp(addr, lo6, 16);
}

/* A node's address and a port as a sockaddr of the socket's family. */
void pl_sa_make(int family, const struct pl_node *n, uint16_t port, struct sockaddr_storage *ss, socklen_t *len)
{
	memset(ss, 0, sizeof(*ss));
	if (family == AF_INET6) {
		struct sockaddr_in6 *in6 = (void *)ss;

		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(port);
		if (n && n->family == AF_INET6) {
			memcpy(&in6->sin6_addr, n->addr, 16);
		} else if (n) {
			in6->sin6_addr.s6_addr[10] = 0xff;
			in6->sin6_addr.s6_addr[11] = 0xff;
			memcpy(&in6->sin6_addr.s6_addr[12], n->addr, 4);
		}
		*len = sizeof(*in6);
	} else {
		struct sockaddr_in *in = (void *)ss;

		in->sin_family = AF_INET;
		in->sin_port = htons(port);
		if (n && n->family == AF_INET)
			memcpy(&in->sin_addr, n->addr, 4);
		*len = sizeof(*in);
	}
}

void pl_sa_copy_out(const struct sockaddr_storage *ss, socklen_t len, struct sockaddr *out, socklen_t *out_len)
{
	if (!out || !out_len)
		return;
	memcpy(out, ss, *out_len < len ? *out_len : len);
	*out_len = len;
}

mesh_session_t *pl_session(void)
{
	return session;
}
