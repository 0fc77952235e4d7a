#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "admin.h"
#include "log.h"
#include "metrics.h"
#include "metrics_http.h"
#include "util.h"

#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* libmicrohttpd is loaded by the first metrics_http_open that serves (MESH_MHD_SONAME, from the
 * build): linked, it mapped itself and GnuTLS with its eight libraries into every meshd, a tenth of
 * meshd's start-up where 64 start at once (docs/design.md, "Formation"), for an endpoint that is off
 * unless configured. Its header still gives every type, checked by the compiler through MHD(). */
static const char *const mhd_names[] = {
	"MHD_start_daemon", "MHD_stop_daemon", "MHD_run", "MHD_get_daemon_info", "MHD_queue_response",
	"MHD_create_response_from_buffer", "MHD_add_response_header", "MHD_destroy_response",
	"MHD_get_connection_info",
};
enum {
	MHD_START, MHD_STOP, MHD_RUN, MHD_INFO, MHD_QUEUE, MHD_CREATE, MHD_HEADER, MHD_DESTROY, MHD_CONN_INFO,
	MHD_NSYMS
};
static void *mhd_sym[MHD_NSYMS];
#define MHD(i, fn) ((__typeof__(fn) *)mhd_sym[i])

static int mhd_load(const char *listen)
{
	char err[256];
	int ret;

	_Static_assert(ARRAY_SIZE(mhd_names) == MHD_NSYMS, "one name per symbol");
	if (mhd_sym[MHD_NSYMS - 1])
		return 0;
	ret = util_dl_load(MESH_MHD_SONAME, mhd_names, mhd_sym, MHD_NSYMS, err, sizeof(err));
	if (ret)
		log_error("cannot serve metrics on %s: %s (Debian's libmicrohttpd12)", listen, err);
	return ret;
}

/* libmicrohttpd's format and arguments, passed through. */
static void mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	struct metrics_http *h = cls;
	uint64_t dropped;
	char msg[256];
	size_t n;

	if (!log_ratelimit_ok(&h->log_rl, util_now_ms(), &dropped))
		return;
	if (dropped)
		log_warn("metrics endpoint %s: %llu messages not logged (more than %u in %u s)", h->listen,
			 (unsigned long long)dropped, METRICS_HTTP_LOG_BURST, METRICS_HTTP_LOG_INTERVAL_MS / 1000);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
		msg[--n] = '\0';
	log_warn("metrics endpoint %s: %s", h->listen, msg);
}

static enum MHD_Result answer_text(struct MHD_Connection *conn, unsigned status, const char *text)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	r = MHD(MHD_CREATE, MHD_create_response_from_buffer)(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
	if (!r)
		return MHD_NO;
	MHD(MHD_HEADER, MHD_add_response_header)(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD(MHD_HEADER, MHD_add_response_header)(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	ret = MHD(MHD_QUEUE, MHD_queue_response)(conn, status, r);
	MHD(MHD_DESTROY, MHD_destroy_response)(r);
	return ret;
}

/* What a text is rendered by: 0 and the status to serve it with, or a negative errno. */
typedef int metrics_http_render_fn(struct metrics_http *h, struct metrics_buf *b, unsigned *status);

static int render_metrics(struct metrics_http *h, struct metrics_buf *b, unsigned *status)
{
	h->admin->http_renders++;
	*status = MHD_HTTP_OK;
	return admin_metrics_render(h->admin, b);
}

static int render_health(struct metrics_http *h, struct metrics_buf *b, unsigned *status)
{
	int ret = metrics_health_render(h->admin->mesh, b);

	if (ret < 0)
		return ret;
	*status = ret ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK;
	return 0;
}

/* The text to serve: rendered at most every METRICS_HTTP_RENDER_MS, the last one in between (NULL:
 * out of memory). libmicrohttpd counts the connections a response is queued on, so the one kept
 * in t lives on for those still sending it when a newer one replaces it. */
static struct MHD_Response *cached_text(struct metrics_http *h, struct metrics_http_text *t,
					metrics_http_render_fn *render, const char *content_type)
{
	uint64_t now = util_now_ms();
	struct metrics_buf b = {0};
	struct MHD_Response *r;
	unsigned status;
	char *text;
	size_t len;

	if (t->r && now - t->ms < METRICS_HTTP_RENDER_MS)
		return t->r;
	if (render(h, &b, &status)) {
		metrics_buf_free(&b);
		return NULL;
	}
	text = metrics_buf_take(&b, &len);
	r = MHD(MHD_CREATE, MHD_create_response_from_buffer)(len, text, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(text);
		return NULL;
	}
	MHD(MHD_HEADER, MHD_add_response_header)(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
	if (t->r)
		MHD(MHD_DESTROY, MHD_destroy_response)(t->r);
	t->r = r;
	t->ms = now;
	t->status = status;
	return r;
}

/* Called from MHD_run, that is from meshd's loop under the lock: the mesh may be read. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
				  const char *version, const char *upload_data, size_t *upload_data_size, void **req_cls)
{
	struct metrics_http *h = cls;
	struct metrics_http_text *t;
	struct MHD_Response *r;

	(void)version;
	(void)upload_data;
	(void)upload_data_size;
	(void)req_cls;
	if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
		return answer_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
	if (!strcmp(url, "/metrics")) {
		h->admin->http_scrapes++;
		t = &h->metrics;
		r = cached_text(h, t, render_metrics, METRICS_CONTENT_TYPE);
	} else if (!strcmp(url, "/healthz")) {
		t = &h->health;
		r = cached_text(h, t, render_health, "text/plain; charset=utf-8");
	} else {
		return answer_text(conn, MHD_HTTP_NOT_FOUND, "not found: meshd serves /metrics and /healthz only\n");
	}
	if (!r)
		return answer_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
	return MHD(MHD_QUEUE, MHD_queue_response)(conn, t->status, r);
}

/* Ends the connection: libmicrohttpd, finding its socket shut, closes it in its next run. */
static void conn_shut(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci;

	ci = MHD(MHD_CONN_INFO, MHD_get_connection_info)(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (ci && ci->connect_fd >= 0)
		shutdown(ci->connect_fd, SHUT_RDWR);
}

/* Gives each connection its deadline (METRICS_HTTP_DEADLINE_MS from now) and forgets it when
 * libmicrohttpd closes it. Called from MHD_run. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
			  enum MHD_ConnectionNotificationCode toe)
{
	struct metrics_http *h = cls;
	struct metrics_http_conn *c = *socket_ctx;

	if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
		if (c)
			c->conn = NULL;
		*socket_ctx = NULL;
		return;
	}
	for (size_t i = 0; i < ARRAY_SIZE(h->conns) && !c; i++)
		if (!h->conns[i].conn)
			c = &h->conns[i];
	if (!c) {
		/* More than libmicrohttpd's own limit, which the table is sized for: a connection
		 * without a deadline is what the table is there to prevent, so it ends at once. */
		conn_shut(conn);
		return;
	}
	c->conn = conn;
	c->deadline_ms = util_now_ms() + METRICS_HTTP_DEADLINE_MS;
	c->shut = false;
	*socket_ctx = c;
}

/* Shuts down every connection past its deadline, once. */
static void expire(struct metrics_http *h, uint64_t now)
{
	for (size_t i = 0; i < ARRAY_SIZE(h->conns); i++) {
		struct metrics_http_conn *c = &h->conns[i];

		if (c->conn && !c->shut && now >= c->deadline_ms) {
			conn_shut(c->conn);
			c->shut = true;
		}
	}
}

static struct MHD_Daemon *start(struct metrics_http *h, const struct sockaddr_storage *ss, unsigned flags)
{
	/* The logger first: libmicrohttpd says so, else it may print some messages itself.
	 * MHD_USE_TURBO: a connection libmicrohttpd ends is closed outright when it is released, with
	 * no shutdown() first. With that shutdown a timed-out client read EOF, connected again at once
	 * and was refused for the per-address slot its old connection still held: libmicrohttpd gives
	 * the slot back only when it releases the connection, in a later run that also handles the new
	 * accept first (a scraper's reconnect was reset in one try in two to eight, also after running
	 * libmicrohttpd again at once). */
	return MHD(MHD_START, MHD_start_daemon)(
		MHD_USE_EPOLL | MHD_USE_TURBO | MHD_USE_ERROR_LOG | flags, 0, NULL, NULL, on_request, h,
		MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h, MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
		MHD_OPTION_SOCK_ADDR, (const struct sockaddr *)ss,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)METRICS_HTTP_CONNS_MAX, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
		(unsigned)METRICS_HTTP_CONNS_PER_IP, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)METRICS_HTTP_TIMEOUT_S,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)METRICS_HTTP_MEMORY, MHD_OPTION_LISTEN_BACKLOG_SIZE,
		(unsigned)METRICS_HTTP_BACKLOG, MHD_OPTION_END);
}

/* Binds and listens on ss as libmicrohttpd will (SO_REUSEADDR, a dual-stack "[::]"), then lets go:
 * 0, or a negative errno. */
static int bind_try(const struct sockaddr_storage *ss, socklen_t len)
{
	int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, zero = 0, ret = 0;

	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (ss->ss_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	if (bind(fd, (const struct sockaddr *)ss, len) || listen(fd, 1))
		ret = -errno;
	close(fd);
	return ret;
}

int metrics_http_probe(const char *listen, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	char host[INET6_ADDRSTRLEN] = "?";
	const char *why;
	socklen_t len;
	uint16_t port;
	int ret;

	if (!listen[0])
		return 0;
	ret = config_listen_parse(listen, &ss, &len, &why);
	if (ret) {
		snprintf(err, errlen, "metrics_listen \"%s\" %s", listen, why);
		return ret;
	}
	ret = bind_try(&ss, len);
	if (ret == -EAFNOSUPPORT && ss.ss_family == AF_INET6 &&
	    !memcmp(&((struct sockaddr_in6 *)&ss)->sin6_addr, &in6addr_any, 16)) {
		/* "[::]:PORT" on a host without IPv6 serves every IPv4 address (metrics_http_open). */
		struct sockaddr_in s4 = {.sin_family = AF_INET, .sin_port = ((struct sockaddr_in6 *)&ss)->sin6_port};

		memcpy(&ss, &s4, sizeof(s4));
		len = sizeof(s4);
		ret = bind_try(&ss, len);
	}
	if (!ret)
		return 0;
	if (ss.ss_family == AF_INET6) {
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof(host));
		port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	} else {
		inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof(host));
		port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	}
	if (ret == -EADDRINUSE)
		snprintf(err, errlen,
			 "metrics_listen \"%s\": port %u of %s is in use (another meshd or exporter: `ss -ltnp`; each "
			 "meshd on a host needs its own, nodes.metrics_listen)",
			 listen, port, host);
	else if (ret == -EADDRNOTAVAIL)
		snprintf(err, errlen, "metrics_listen \"%s\": %s is not an address of this host", listen, host);
	else if (ret == -EACCES)
		snprintf(err, errlen, "metrics_listen \"%s\": port %u needs CAP_NET_BIND_SERVICE (below 1024)", listen,
			 port);
	else
		snprintf(err, errlen, "metrics_listen \"%s\": cannot listen on %s port %u: %s", listen, host, port,
			 strerror(-ret));
	return ret;
}

int metrics_http_open(struct metrics_http *h, const char *listen, struct admin *a)
{
	struct sockaddr_storage ss;
	const union MHD_DaemonInfo *info;
	const char *why;
	char err[256];
	socklen_t len;
	bool any6;
	int ret;

	memset(h, 0, sizeof(*h));
	h->fd = -1;
	h->admin = a;
	h->log_rl.burst = METRICS_HTTP_LOG_BURST;
	h->log_rl.interval_ms = METRICS_HTTP_LOG_INTERVAL_MS;
	if (!listen[0])
		return 0;
	util_strlcpy(h->listen, listen, sizeof(h->listen));
	/* Said here in words: libmicrohttpd's own is "Failed to bind to port 0". */
	ret = metrics_http_probe(listen, err, sizeof(err));
	if (ret) {
		log_error("cannot serve metrics: %s", err);
		return ret;
	}
	ret = mhd_load(listen);
	if (ret)
		return ret;
	/* config_load checked it: a failure here is a bug, still named. */
	ret = config_listen_parse(listen, &ss, &len, &why);
	if (ret) {
		log_error("metrics_listen \"%s\" %s", listen, why);
		return ret;
	}
	any6 = ss.ss_family == AF_INET6 && !memcmp(&((struct sockaddr_in6 *)&ss)->sin6_addr, &in6addr_any, 16);
	errno = 0;
	h->mhd = start(h, &ss, ss.ss_family == AF_INET6 ? (any6 ? MHD_USE_DUAL_STACK : MHD_USE_IPv6) : 0);
	if (!h->mhd && any6) {
		/* "[::]:PORT" on a host without IPv6: every IPv4 address. */
		struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
		uint16_t port = ((struct sockaddr_in6 *)&ss)->sin6_port;

		memset(&ss, 0, sizeof(ss));
		s4->sin_family = AF_INET;
		s4->sin_addr.s_addr = htonl(INADDR_ANY);
		s4->sin_port = port;
		errno = 0;
		h->mhd = start(h, &ss, 0);
	}
	if (!h->mhd) {
		ret = errno ? -errno : -EADDRNOTAVAIL;
		log_error("cannot serve metrics on %s: %s", listen, strerror(-ret));
		return ret;
	}
	info = MHD(MHD_INFO, MHD_get_daemon_info)(h->mhd, MHD_DAEMON_INFO_EPOLL_FD);
	if (!info || info->epoll_fd < 0) {
		log_error("metrics endpoint %s: libmicrohttpd has no epoll descriptor", listen);
		metrics_http_close(h);
		return -EINVAL;
	}
	h->fd = info->epoll_fd;
	if (listen[0] == ':')
		log_info("serving Prometheus metrics at http://127.0.0.1%s/metrics (and /healthz): loopback only, "
			 "as \"%s\" names no address (\"0.0.0.0%s\" or \"[::]%s\" serves every address)",
			 listen, listen, listen, listen);
	else
		log_info("serving Prometheus metrics at http://%s/metrics (and /healthz)", listen);
	return 0;
}

void metrics_http_run(struct metrics_http *h)
{
	if (!h->mhd)
		return;
	expire(h, util_now_ms());
	if (MHD(MHD_RUN, MHD_run)(h->mhd) != MHD_YES)
		log_debug("metrics endpoint %s: MHD_run failed", h->listen);
	/* A connection that timed out (or was shut at its deadline just now) is closed in one run but
	 * only released (its descriptor closed and its slot of the per-address limit given back) in
	 * the next: its client already reads EOF and may connect again at once, and would be refused
	 * for a slot still held. The second run releases it now rather than at the next tick; it costs
	 * one epoll_wait that returns at once. */
	MHD(MHD_RUN, MHD_run)(h->mhd);
}

static void text_release(struct metrics_http_text *t)
{
	if (t->r)
		MHD(MHD_DESTROY, MHD_destroy_response)(t->r);
	t->r = NULL;
}

void metrics_http_close(struct metrics_http *h)
{
	if (!h)
		return;
	if (h->mhd)
		MHD(MHD_STOP, MHD_stop_daemon)(h->mhd);
	h->mhd = NULL;
	text_release(&h->metrics);
	text_release(&h->health);
	h->fd = -1;
}
