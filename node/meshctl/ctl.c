/*
 * Talking to meshd: a connection to its control socket (never hanging on a stuck daemon), one request
 * and its reply, a listing fetched page after page, and a request that changes the node. SIGINT and
 * SIGTERM, caught during ping and --watch, make a blocked receive return -EINTR rather than end the
 * process.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "meshctl.h"
#include "sockerr.h"
#include "util.h"

/* Set by SIGINT and SIGTERM during ping and --watch: stop, say what there is. */
volatile sig_atomic_t interrupted;

/* The first SIGINT or SIGTERM ends the ping or watch (its blocking call returns EINTR, the loop
 * sees the flag) and the process exits at once; later ones are ignored from here: timeout(1) sends
 * its signal twice (to the process, then to its group), and under load the second came while
 * LeakSanitizer stopped the process at exit to look for leaks, which then spun for good (1 run in
 * 7 to 33 of `meshctl -w` under ASan beside busy cores). */
static void on_interrupt(int sig)
{
	struct sigaction ign = {.sa_handler = SIG_IGN};

	(void)sig;
	interrupted = 1;
	sigaction(SIGINT, &ign, NULL);
	sigaction(SIGTERM, &ign, NULL);
}

/* SIGINT and SIGTERM end a ping or a watch (their blocking calls return EINTR), not the process. */
void catch_interrupts(void)
{
	struct sigaction sa = {.sa_handler = on_interrupt}; /* no SA_RESTART */

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

/* Set while `drain --wait` polls a meshd that is about to go: its absence is the answer, not an error. */
bool ctl_quiet;

int ctl_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = REPLY_TIMEOUT_S};
	int fd, ret;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "meshctl: socket path %s is too long\n", path);
		return -ENAMETOOLONG;
	}
	util_strlcpy(sa.sun_path, path, sizeof(sa.sun_path));
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		char why[320];

		ret = -errno;
		mesh_sock_explain(path, ret, why, sizeof(why));
		if (!ctl_quiet)
			fprintf(stderr, "meshctl: %s%s\n", why,
				ret == -ENOENT || ret == -ECONNREFUSED ? "; -s or $" MESH_SOCKET_ENV " names another socket" : "");
		close(fd);
		return ret;
	}
	/* Never hang on a stuck daemon. */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	return fd;
}

/* One request on a connected socket. */
static int ctl_send(int fd, const char *path, const CtlRequest *req)
{
	uint8_t qbuf[96];
	size_t qlen;

	qlen = ctl_request__pack(req, qbuf);
	/* (meshd may have refused us before we asked, and hung up: its reason is the reply below.) */
	if (send(fd, qbuf, qlen, MSG_NOSIGNAL) != (ssize_t)qlen && errno != EPIPE && errno != ECONNRESET) {
		int ret = -errno;

		fprintf(stderr, "meshctl: send to %s: %s\n", path, strerror(errno));
		return ret;
	}
	return 0;
}

/* One reply (decoded; free with ctl_reply__free_unpacked). -EINTR, unsaid, when interrupted. */
int ctl_recv(int fd, const char *path, CtlReply **out)
{
	uint8_t *rbuf;
	ssize_t n;
	int ret;

	rbuf = malloc(MESH_CTL_REPLY_MAX);
	if (!rbuf)
		return -ENOMEM;
	n = recv(fd, rbuf, MESH_CTL_REPLY_MAX, MSG_TRUNC);
	ret = -errno;
	if (n < 0 && ret == -EINTR && interrupted) {
		free(rbuf);
		return ret;
	}
	if (n <= 0 || n > (ssize_t)MESH_CTL_REPLY_MAX) {
		if (n == 0 || n > (ssize_t)MESH_CTL_REPLY_MAX)
			ret = -EPROTO;
		fprintf(stderr, "meshctl: no reply from meshd at %s: %s\n", path,
			n == 0 ? "connection closed" : n > 0 ? "reply too large" : strerror(-ret));
		free(rbuf);
		return ret;
	}
	*out = ctl_reply__unpack(NULL, (size_t)n, rbuf);
	free(rbuf);
	if (!*out) {
		fprintf(stderr, "meshctl: undecodable reply from meshd at %s\n", path);
		return -EBADMSG;
	}
	return 0;
}

/* One request on a connected socket, one reply back (decoded; free with ctl_reply__free_unpacked). */
int ctl_call(int fd, const char *path, const CtlRequest *req, CtlReply **out)
{
	int ret = ctl_send(fd, path, req);

	return ret ? ret : ctl_recv(fd, path, out);
}

void listing_free(struct listing *ls)
{
	free(ls->view.links);
	free(ls->view.channels);
	free(ls->view.ports);
	for (size_t i = 0; i < ls->n_pages; i++)
		ctl_reply__free_unpacked(ls->pages[i], NULL);
	free(ls->pages);
	memset(ls, 0, sizeof(*ls));
}

/* Appends n items of a page to the list *all of *len items. */
static int list_append(void ***all, size_t *len, void *const *items, size_t n)
{
	void **a = realloc(*all, (*len + n + 1) * sizeof(*a));

	if (!a)
		return -ENOMEM;
	if (n)
		memcpy(a + *len, items, n * sizeof(*a));
	*all = a;
	*len += n;
	return 0;
}

/* Keeps page r of the listing and adds its items to the view. */
static int listing_add(struct listing *ls, CtlReply *r)
{
	CtlReply **pages = realloc(ls->pages, (ls->n_pages + 1) * sizeof(*pages));
	CtlReply *v = &ls->view;

	if (!pages) {
		ctl_reply__free_unpacked(r, NULL);
		return -ENOMEM;
	}
	ls->pages = pages;
	ls->pages[ls->n_pages++] = r;
	if (ls->n_pages == 1) {
		*v = *r;
		v->n_links = v->n_channels = v->n_ports = 0;
		v->links = NULL;
		v->channels = NULL;
		v->ports = NULL;
	}
	if (list_append((void ***)&v->links, &v->n_links, (void *const *)r->links, r->n_links) ||
	    list_append((void ***)&v->channels, &v->n_channels, (void *const *)r->channels, r->n_channels) ||
	    list_append((void ***)&v->ports, &v->n_ports, (void *const *)r->ports, r->n_ports))
		return -ENOMEM;
	return 0;
}

/* One listing, page after page on one connection until the first reply's total is reached. */
int listing_fetch(const char *path, CtlObject obj, bool live, struct listing *ls)
{
	CtlRequest req = CTL_REQUEST__INIT;
	int fd = ctl_connect(path), ret;
	const CtlReply *v = &ls->view;
	CtlReply *r;

	memset(ls, 0, sizeof(*ls));
	if (fd < 0)
		return fd;
	req.version = MESH_CTL_VERSION;
	req.object = obj;
	req.live = live;
	ret = ctl_call(fd, path, &req, &r);
	if (!ret)
		ret = listing_add(ls, r);
	while (!ret && !v->status) {
		size_t got = obj == CTL_OBJECT__CTL_OBJECT_LINKS ? v->n_links
			     : obj == CTL_OBJECT__CTL_OBJECT_CHANNELS ? v->n_channels
			     : obj == CTL_OBJECT__CTL_OBJECT_PORTS ? v->n_ports : 0;

		if (got >= v->total)
			break;
		req.offset = got;
		ret = ctl_call(fd, path, &req, &r);
		if (ret)
			break;
		if (r->status || !(r->n_links + r->n_channels + r->n_ports)) {
			/* The list shrank under us, or meshd refused the page: what we have is the listing. */
			if (r->status)
				fprintf(stderr, "meshctl: meshd: page at %zu: %s\n", got, r->error ? r->error : "error");
			ctl_reply__free_unpacked(r, NULL);
			break;
		}
		ret = listing_add(ls, r);
	}
	close(fd);
	if (ret)
		listing_free(ls);
	return ret;
}

/* One request that changes the node (reload, drain) on a connection of its own: 0 with its reply
 * (free with ctl_reply__free_unpacked), or -1 when meshd cannot be reached or answered wrongly (said). */
int node_op(const char *path, CtlOp op, uint32_t drain_ms, CtlReply **out)
{
	CtlRequest req = CTL_REQUEST__INIT;
	int fd = ctl_connect(path), ret;

	if (fd < 0)
		return -1;
	req.version = MESH_CTL_VERSION;
	req.object = CTL_OBJECT__CTL_OBJECT_NODE;
	req.op = op;
	req.drain_ms = drain_ms;
	ret = ctl_call(fd, path, &req, out);
	close(fd);
	return ret ? -1 : 0;
}
