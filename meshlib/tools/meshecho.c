/*
 * meshecho: an echo server for mesh channels.
 *
 *   meshecho [-s SOCKET] -l PORT [-n COUNT]
 *
 * Accepts channels to PORT, several at once, and sends every byte back until the peer shuts its
 * side, then closes that channel. One thread, one poll() over the listener fd and the fd of every
 * channel, non-blocking calls only. With -n it stops accepting after COUNT channels and exits once
 * they are all done; the exit status is 0 when each of them ended cleanly.
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mesh/mesh.h>

#define EXIT_USAGE 1
#define EXIT_FAIL 2

struct echo_chan {
	mesh_channel_t *c;
	int fd;
	struct mesh_channel_info info;
	uint64_t bytes;
};

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: meshecho [-s SOCKET] -l PORT [-n COUNT] [-v]\n"
		"\n"
		"Echo server: accepts channels to PORT of this node (any number at once) and sends every\n"
		"byte back until the peer shuts its side, then closes the channel.\n"
		"\n"
		"Options:\n"
		"  -l, --listen PORT   the port to accept channels on (required)\n"
		"  -n, --count COUNT   exit after COUNT channels are done (default: run until meshd goes)\n"
		"  -s, --socket PATH   meshd's control socket (default $%s, else %s)\n"
		"  -v, --verbose       one line per finished channel on stderr\n"
		"  -V, --version       print the version\n"
		"  -h, --help          this help\n"
		"\n"
		"Exit status: 0 when every channel ended cleanly, 1 on a usage error, 2 on any failure.\n",
		MESH_SOCKET_ENV, MESH_SOCKET_DEFAULT);
}

static bool parse_uint(const char *s, unsigned long max, unsigned long *out)
{
	unsigned long v;
	char *end;

	if (!*s || *s == '-')
		return false;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v > max)
		return false;
	*out = v;
	return true;
}

/* Echoes what is there. Returns 1 while the channel goes on, 0 once the peer shut its side and
 * everything was sent back, or a negative errno. */
static int echo_serve(struct echo_chan *e)
{
	for (;;) {
		const void *buf;
		ssize_t n, sent;
		int ret;

		n = mesh_recv_peek(e->c, &buf, MESH_NONBLOCK);
		if (n == -EAGAIN)
			return 1;
		if (n <= 0)
			return (int)n;
		sent = mesh_send(e->c, buf, (size_t)n, MESH_NONBLOCK);
		if (sent == -EAGAIN)
			return 1; /* the channel fd wakes us when room frees up */
		if (sent < 0)
			return (int)sent;
		ret = mesh_recv_release(e->c, (size_t)sent);
		if (ret)
			return ret;
		e->bytes += (uint64_t)sent;
	}
}

/* Serves a channel; closes it when it is done. Returns 1 while open, 0 done cleanly, -1 failed. */
static int echo_step(struct echo_chan *e, bool verbose)
{
	int ret = echo_serve(e);

	if (ret > 0)
		return 1;
	if (ret < 0)
		fprintf(stderr, "meshecho: channel %u from node %u port %u: %s after %llu bytes\n", e->info.channel_id,
			e->info.peer_node, e->info.peer_port, mesh_strerror(ret), (unsigned long long)e->bytes);
	else if (verbose)
		fprintf(stderr, "meshecho: channel %u from node %u port %u: %llu bytes echoed\n", e->info.channel_id,
			e->info.peer_node, e->info.peer_port, (unsigned long long)e->bytes);
	if (mesh_close(e->c) && !ret)
		ret = -EIO;
	e->c = NULL;
	return ret ? -1 : 0;
}

/* Accepts one waiting channel, if any (the listener fd stays readable while more wait). chans[]
 * has room for one more. Returns 0, or -1 when the listener is gone. */
static int echo_accept(mesh_listener_t *l, struct echo_chan *chans, size_t *nchans, unsigned long *accepted,
		       unsigned long *done, unsigned long *failed, bool verbose)
{
	struct echo_chan *e = &chans[*nchans];
	int ret = mesh_accept(l, MESH_NONBLOCK, &e->c);

	if (ret == -EAGAIN)
		return 0;
	if (ret == -ECONNRESET) {
		fprintf(stderr, "meshecho: meshd closed the listener\n");
		return -1;
	}
	if (ret) {
		/* One bad channel setup does not stop the server. */
		fprintf(stderr, "meshecho: accept: %s\n", mesh_strerror(ret));
		return 0;
	}
	++*accepted;
	e->bytes = 0;
	mesh_channel_info(e->c, &e->info);
	e->fd = mesh_channel_fd(e->c);
	if (e->fd < 0) {
		fprintf(stderr, "meshecho: channel %u: fd: %s\n", e->info.channel_id, mesh_strerror(e->fd));
		mesh_close(e->c);
		ret = -1;
	} else {
		/* Bytes may have come before there was an fd to wake: serve once now. */
		ret = echo_step(e, verbose);
	}
	if (ret > 0) {
		++*nchans;
	} else {
		++*done;
		*failed += ret < 0;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"listen", required_argument, NULL, 'l'}, {"count", required_argument, NULL, 'n'},
		{"socket", required_argument, NULL, 's'}, {"verbose", no_argument, NULL, 'v'},
		{"version", no_argument, NULL, 'V'},      {"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	unsigned long port = 0, count = 0, accepted = 0, done = 0, failed = 0;
	struct echo_chan *chans = NULL;
	struct pollfd *pfds = NULL;
	size_t nchans = 0, cap = 0;
	const char *sock = NULL;
	bool have_port = false, verbose = false;
	mesh_listener_t *l = NULL;
	mesh_session_t *s;
	int ch, ret, status = EXIT_FAIL;

	while ((ch = getopt_long(argc, argv, "l:n:s:vVh", longopts, NULL)) != -1) {
		switch (ch) {
		case 'l':
			if (!parse_uint(optarg, 65535, &port)) {
				fprintf(stderr, "meshecho: -l %s: expected a port 0..65535\n", optarg);
				return EXIT_USAGE;
			}
			have_port = true;
			break;
		case 'n':
			if (!parse_uint(optarg, 1000000000ul, &count) || !count) {
				fprintf(stderr, "meshecho: -n %s: expected a count 1..1000000000\n", optarg);
				return EXIT_USAGE;
			}
			break;
		case 's':
			sock = optarg;
			break;
		case 'v':
			verbose = true;
			break;
		case 'V':
			printf("meshecho %d.%d\n", MESH_VERSION_MAJOR, MESH_VERSION_MINOR);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (!have_port || optind != argc) {
		fprintf(stderr, "meshecho: %s\n", have_port ? "unexpected argument" : "-l PORT is required");
		usage(stderr);
		return EXIT_USAGE;
	}
	ret = mesh_open(sock, &s);
	if (ret) {
		fprintf(stderr, "meshecho: socket %s: %s\n", sock ? sock : "(default)", mesh_strerror(ret));
		return EXIT_FAIL;
	}
	ret = mesh_listen(s, (uint16_t)port, &l);
	if (ret) {
		fprintf(stderr, "meshecho: listen on port %lu: %s\n", port,
			*mesh_session_error(s) ? mesh_session_error(s) : mesh_strerror(ret));
		goto out_session;
	}
	while (!count || done < count) {
		bool accepting = !count || accepted < count;
		size_t np = 0;

		/* Room for one more channel than now, so that an accept always has a slot. */
		if (nchans == cap) {
			size_t ncap = cap ? 2 * cap : 8;
			struct echo_chan *nc = realloc(chans, ncap * sizeof(*nc));
			struct pollfd *npf;

			if (nc)
				chans = nc;
			npf = nc ? realloc(pfds, (ncap + 1) * sizeof(*npf)) : NULL;
			if (!npf) {
				fprintf(stderr, "meshecho: out of memory\n");
				goto out_close;
			}
			pfds = npf;
			cap = ncap;
		}
		/* pfds[0] is the listener (fd -1 once COUNT were accepted: poll skips it), then one
		 * entry per channel, in the order of chans[]. */
		pfds[np++] = (struct pollfd){.fd = accepting ? mesh_listener_fd(l) : -1, .events = POLLIN};
		for (size_t i = 0; i < nchans; i++)
			pfds[np++] = (struct pollfd){.fd = chans[i].fd, .events = POLLIN};
		if (poll(pfds, np, -1) < 0) {
			if (errno == EINTR)
				continue;
			fprintf(stderr, "meshecho: poll: %s\n", strerror(errno));
			goto out_close;
		}
		for (size_t i = 0; i < nchans;) {
			int r = pfds[i + 1].revents ? echo_step(&chans[i], verbose) : 1;

			if (r > 0) {
				i++;
				continue;
			}
			done++;
			failed += r < 0;
			/* Keep pfds[] in step with chans[] for the rest of this pass. */
			memmove(&chans[i], &chans[i + 1], (nchans - i - 1) * sizeof(chans[0]));
			memmove(&pfds[i + 1], &pfds[i + 2], (nchans - i - 1) * sizeof(pfds[0]));
			nchans--;
		}
		if (pfds[0].revents && echo_accept(l, chans, &nchans, &accepted, &done, &failed, verbose) < 0)
			goto out_close;
	}
	status = failed ? EXIT_FAIL : 0;
out_close:
	for (size_t i = 0; i < nchans; i++)
		mesh_close(chans[i].c);
	free(chans);
	free(pfds);
	mesh_listener_close(l);
out_session:
	mesh_session_close(s);
	return status;
}
