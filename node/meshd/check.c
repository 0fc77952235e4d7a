/*
 * meshd --check: what a start would refuse, found without starting. The same code as a start where
 * there is one (config_load, auth_load_keys, the providers' listen, metrics_http_probe), each
 * listener opened and closed again at once; every problem found is one line, and the checks go on
 * after the first (except when the file itself does not load: then nothing else can be known).
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "auth.h"
#include "check.h"
#include "config.h"
#include "metrics_http.h"
#include "transport.h"
#include "util.h"

int check_key_path(const struct mesh_config *cfg, const char *cfg_path, char *out, size_t len)
{
	const char *slash = strrchr(cfg_path, '/');
	int n;

	if (cfg->key_file[0] == '/' || !slash)
		n = snprintf(out, len, "%s", cfg->key_file);
	else
		n = snprintf(out, len, "%.*s/%s", (int)(slash - cfg_path), cfg_path, cfg->key_file);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

void check_listen_why(int err, const struct xport_ops *ops, const char *addr, uint16_t port, uint32_t node_id,
		      char *out, size_t len)
{
	bool rdma = ops == &xport_rdma_ops;

	if (err == -EADDRNOTAVAIL)
		snprintf(out, len,
			 "%s is not an address of this host: is this host node %u (--node-id)? else correct that node's "
			 "addr (or rails) in the file",
			 addr, node_id);
	else if (err == -EADDRINUSE)
		snprintf(out, len, "port %u of %s is in use (another meshd on this host? %s)", port, addr,
			 rdma ? "`rdma resource show cm_id`" : "`ss -ltnp`");
	else if (err == -ENODEV && rdma)
		snprintf(out, len,
			 "no RDMA device serves %s (`rdma link` lists them); transport = \"auto\" or \"tcp\" runs without",
			 addr);
	else if (err == -EACCES)
		snprintf(out, len, "port %u is below 1024: meshd needs CAP_NET_BIND_SERVICE", port);
	else
		snprintf(out, len, "%s", mesh_strerror(err));
}

/* Collects the problems: one line each to err, counted. */
struct check {
	const char *path;
	FILE *err;
	int problems;
};

static void problem(struct check *c, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void problem(struct check *c, int line, const char *fmt, ...)
{
	va_list ap;

	if (line > 0)
		fprintf(c->err, "%s:%d: ", c->path, line);
	va_start(ap, fmt);
	vfprintf(c->err, fmt, ap);
	va_end(ap);
	fputc('\n', c->err);
	c->problems++;
}

static void check_keys(struct check *c, const struct mesh_config *cfg)
{
	char path[PATH_MAX], err[512];
	struct auth_keys keys;

	if (!cfg->key_file[0])
		return;
	if (check_key_path(cfg, c->path, path, sizeof(path))) {
		problem(c, 0, "cluster.key_file %s: the path is too long", cfg->key_file);
		return;
	}
	if (auth_load_keys(path, &keys, err, sizeof(err)))
		problem(c, 0, "%s", err);
	explicit_bzero(&keys, sizeof(keys));
}

/* A start refuses a socket another meshd answers on (admin.c); a file nobody answers on it replaces. */
static void check_socket(struct check *c, const char *sock)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd;

	if (strlen(sock) >= sizeof(sa.sun_path)) {
		problem(c, 0, "control socket %s: longer than %zu bytes", sock, sizeof(sa.sun_path) - 1);
		return;
	}
	util_strlcpy(sa.sun_path, sock, sizeof(sa.sun_path));
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	if (!connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		problem(c, 0, "control socket %s: a meshd is running there (stop it, or give this one another --socket)",
			sock);
	close(fd);
}

/* The providers a start would open for cluster.transport on these addresses, as main.c's
 * xports_open picks them. Returns how many, into want. */
static size_t check_providers(struct check *c, const struct mesh_config *cfg, const struct config_node *self,
			      const struct xport_ops *want[2])
{
	uint32_t rails = self->n_rails ? self->n_rails : 1;
	size_t n = 0;

	if (!strcmp(cfg->transport, "auto")) {
		bool all = true;

		for (uint32_t r = 0; r < rails; r++)
			all = all && xport_rdma_ops.probe(self->rail[r]);
		if (all)
			want[n++] = &xport_rdma_ops;
		want[n++] = &xport_tcp_ops;
		return n;
	}
	want[0] = xport_ops_find(cfg->transport);
	if (!want[0]) {
		problem(c, 0, "cluster.transport \"%s\" is not built into this meshd", cfg->transport);
		return 0;
	}
	return 1;
}

/* Opens a listener on addr port with ops and closes it: the problem said, with what to do. */
static void check_listen(struct check *c, const struct config_node *self, const struct xport_ops *ops, uint32_t rail)
{
	const char *addr = self->rail[rail];
	struct xport_attr xa = {.connect_timeout_ms = 1000, .max_send_wr = 1, .max_recv_wr = 1};
	char why[256];
	xport_t *x;
	int ret;

	if (ops == &xport_rdma_ops && !ops->probe(addr)) {
		/* Tells "not an address of this host" from "no RDMA device on it". */
		ret = xport_tcp_ops.probe(addr) ? 0 : -EINVAL;
		if (!ret) {
			struct xport_attr ta = xa;

			ret = xport_create(&xport_tcp_ops, &ta, &x);
			if (!ret) {
				ret = xport_listen(x, addr, 0);
				xport_destroy(x);
			}
		}
		check_listen_why(ret == -EADDRNOTAVAIL ? ret : -ENODEV, ops, addr, self->port, self->id, why, sizeof(why));
		problem(c, self->line, "node %u, rail %u: %s", self->id, rail, why);
		return;
	}
	ret = xport_create(ops, &xa, &x);
	if (ret) {
		problem(c, self->line, "node %u: cannot start the %s transport: %s", self->id, ops->name, mesh_strerror(ret));
		return;
	}
	ret = xport_listen(x, addr, self->port);
	xport_destroy(x);
	if (ret) {
		check_listen_why(ret, ops, addr, self->port, self->id, why, sizeof(why));
		problem(c, self->line, "node %u: cannot listen on %s port %u (%s, rail %u): %s", self->id, addr, self->port,
			ops->name, rail, why);
	}
}

static void check_node(struct check *c, const struct mesh_config *cfg, const struct config_node *self)
{
	const struct xport_ops *want[2];
	size_t n = check_providers(c, cfg, self, want);
	const char *listen = config_node_metrics_listen(cfg, self);
	char err[384];

	for (size_t i = 0; i < n; i++)
		for (uint32_t r = 0; r < (self->n_rails ? self->n_rails : 1u); r++)
			check_listen(c, self, want[i], r);
	if (metrics_http_probe(listen, err, sizeof(err)))
		problem(c, self->has_metrics_listen ? self->line : 0, "node %u: %s", self->id, err);
}

int check_run(const char *cfg_path, long node_id, const char *sock, FILE *out, FILE *err)
{
	struct check c = {.path = cfg_path, .err = err};
	struct mesh_config cfg;
	const struct config_node *self = NULL;
	char why[512];

	if (config_load(cfg_path, &cfg, why, sizeof(why))) {
		fprintf(err, "%s\n", why);
		return 1;
	}
	check_keys(&c, &cfg);
	if (node_id >= 0) {
		self = config_node_find(&cfg, (uint32_t)node_id);
		if (!self)
			problem(&c, cfg.nodes_line, "node id %ld is not in nodes (%zu nodes, ids %u..%u)", node_id,
				cfg.n_nodes, cfg.nodes[0].id, cfg.nodes[cfg.n_nodes - 1].id);
		else
			check_node(&c, &cfg, self);
		/* The socket is an instance's, as the ports are a node's: without a node, a running meshd
		 * there is no problem of the file (check it before a reload). */
		check_socket(&c, sock);
	}
	if (!c.problems) {
		if (self)
			fprintf(out, "%s: good for node %u (%s on %s port %u, control socket %s)\n", cfg_path, self->id,
				cfg.transport, self->addr, self->port, sock);
		else
			fprintf(out, "%s: good (%zu nodes; give --node-id to check one node's addresses and ports)\n",
				cfg_path, cfg.n_nodes);
	}
	config_free(&cfg);
	return c.problems;
}
