/*
 * meshcat: ncat for mesh channels.
 *
 *   meshcat [-s SOCKET] -l PORT                           one channel to PORT, copied to stdout
 *   meshcat [-s SOCKET] [-r SIZE] [-q QPS] [-t MS] [-n] NODE PORT
 *                                                         stdin copied into a channel to NODE:PORT
 *                                                         (its link waited for unless -n)
 *
 * Both copies are zero-copy: read(2) goes straight into the space mesh_send_reserve hands out,
 * write(2) straight from what mesh_recv_peek shows. The sender shuts its side at the end of stdin
 * and waits until the peer closes, printing whatever the peer sends meanwhile; the exit status is
 * 0 only when every byte went through.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mesh/mesh.h>

#define EXIT_USAGE 1
#define EXIT_FAIL 2

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: meshcat [-s SOCKET] -l PORT\n"
		"       meshcat [-s SOCKET] [-r SIZE] [-q QPS] [-t MS] [-n] NODE PORT\n"
		"\n"
		"Like ncat, over a mesh channel. With -l: accepts one channel to PORT of this node and\n"
		"copies it to stdout until the peer shuts it. Otherwise: opens a channel to PORT of node\n"
		"NODE, copies stdin into it, shuts it at the end of stdin and waits until the peer closes\n"
		"(bytes the peer sends back go to stdout).\n"
		"\n"
		"Options:\n"
		"  -l, --listen PORT      accept one channel on PORT\n"
		"  -s, --socket PATH      meshd's control socket (default $%s, else %s)\n"
		"  -r, --ring-size SIZE   ring bytes per direction, a power of two, 4K..256M (suffix K, M)\n"
		"  -q, --qps N            QPs of the link to stripe over, 1..16 (default: all)\n"
		"  -t, --timeout MS       how long to wait for the link to NODE to be UP and the peer to\n"
		"                         accept (default 30000)\n"
		"  -n, --no-wait          fail at once when the link to NODE is not UP, rather than wait\n"
		"                         for it within the timeout\n"
		"  -V, --version          print the version\n"
		"  -h, --help             this help\n"
		"\n"
		"Exit status: 0 when every byte went through, 1 on a usage error, 2 on any failure.\n",
		MESH_SOCKET_ENV, MESH_SOCKET_DEFAULT);
}

static bool parse_u64(const char *s, uint64_t max, bool suffix, uint64_t *out)
{
	unsigned long long v;
	char *end;

	if (!*s || *s == '-')
		return false;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s)
		return false;
	if (suffix && (*end == 'k' || *end == 'K') && v <= max >> 10) {
		v <<= 10;
		end++;
	} else if (suffix && (*end == 'm' || *end == 'M') && v <= max >> 20) {
		v <<= 20;
		end++;
	}
	if (*end || v > max)
		return false;
	*out = v;
	return true;
}

/* Writes len bytes to fd, or fails. */
static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Copies received bytes to stdout: with MESH_NONBLOCK until none are waiting, else until EOF.
 * Returns 0 (and *eof at the end of the stream) or a negative errno, already reported. */
static int rx_to_stdout(mesh_channel_t *c, int flags, bool *eof)
{
	for (;;) {
		const void *buf;
		ssize_t n = mesh_recv_peek(c, &buf, flags);
		int ret;

		if (n == -EINTR)
			continue;
		if (n == -EAGAIN)
			return 0;
		if (n < 0) {
			fprintf(stderr, "meshcat: receive: %s\n", mesh_strerror((int)n));
			return (int)n;
		}
		if (n == 0) {
			*eof = true;
			return 0;
		}
		ret = write_all(STDOUT_FILENO, buf, (size_t)n);
		if (ret) {
			fprintf(stderr, "meshcat: write to stdout: %s\n", strerror(-ret));
			return ret;
		}
		ret = mesh_recv_release(c, (size_t)n);
		if (ret) {
			fprintf(stderr, "meshcat: release: %s\n", mesh_strerror(ret));
			return ret;
		}
	}
}

static int run_listen(mesh_session_t *s, uint16_t port)
{
	mesh_listener_t *l;
	mesh_channel_t *c;
	bool eof = false;
	int ret;

	ret = mesh_listen(s, port, &l);
	if (ret) {
		fprintf(stderr, "meshcat: listen on port %u: %s\n", port,
			*mesh_session_error(s) ? mesh_session_error(s) : mesh_strerror(ret));
		return ret;
	}
	do
		ret = mesh_accept(l, 0, &c);
	while (ret == -EINTR);
	mesh_listener_close(l);
	if (ret) {
		fprintf(stderr, "meshcat: accept on port %u: %s\n", port, mesh_strerror(ret));
		return ret;
	}
	ret = rx_to_stdout(c, 0, &eof);
	if (mesh_close(c) && !ret)
		ret = -EIO;
	return ret;
}

/* stdin into the channel until its end, bytes from the peer to stdout meanwhile. */
static int tx_from_stdin(mesh_channel_t *c, bool *peer_eof)
{
	int cfd = mesh_channel_fd(c);

	if (cfd < 0) {
		fprintf(stderr, "meshcat: channel fd: %s\n", mesh_strerror(cfd));
		return cfd;
	}
	for (;;) {
		struct pollfd p[2];
		nfds_t np = 0;
		void *buf;
		ssize_t room, n;
		int ret;

		ret = rx_to_stdout(c, MESH_NONBLOCK, peer_eof);
		if (ret)
			return ret;
		room = mesh_send_reserve(c, &buf, MESH_NONBLOCK);
		if (room < 0 && room != -EAGAIN) {
			fprintf(stderr, "meshcat: send: %s\n", mesh_strerror((int)room));
			return (int)room;
		}
		/* stdin only while there is room for what it gives; the channel while it may still
		 * bring bytes or room. */
		if (room > 0)
			p[np++] = (struct pollfd){.fd = STDIN_FILENO, .events = POLLIN};
		if (room < 0 || !*peer_eof)
			p[np++] = (struct pollfd){.fd = cfd, .events = POLLIN};
		if (poll(p, np, -1) < 0) {
			if (errno == EINTR)
				continue;
			fprintf(stderr, "meshcat: poll: %s\n", strerror(errno));
			return -errno;
		}
		if (room <= 0 || !p[0].revents)
			continue;
		n = read(STDIN_FILENO, buf, (size_t)room);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			fprintf(stderr, "meshcat: read from stdin: %s\n", strerror(errno));
			return -errno;
		}
		if (n == 0)
			return 0; /* the reservation lapses unused */
		ret = mesh_send_commit(c, (size_t)n);
		if (ret) {
			fprintf(stderr, "meshcat: send: %s\n", mesh_strerror(ret));
			return ret;
		}
	}
}

static int run_connect(mesh_session_t *s, uint32_t node, uint16_t port, const struct mesh_channel_opts *opts)
{
	bool peer_eof = false;
	mesh_channel_t *c;
	int ret;

	ret = mesh_connect(s, node, port, opts, &c);
	if (ret) {
		/* The session's error, when there is one, says more than the errno's name (no meshd at
		 * the socket, nobody listening on the port) and replaces it. */
		fprintf(stderr, "meshcat: connect to node %u port %u: %s\n", node, port,
			*mesh_session_error(s) ? mesh_session_error(s) : mesh_strerror(ret));
		return ret;
	}
	ret = tx_from_stdin(c, &peer_eof);
	if (!ret) {
		ret = mesh_shutdown(c);
		if (ret)
			fprintf(stderr, "meshcat: shutdown: %s\n", mesh_strerror(ret));
	}
	/* The peer closes once it has read everything: that is the proof the bytes went through. */
	if (!ret && !peer_eof)
		ret = rx_to_stdout(c, 0, &peer_eof);
	if (mesh_close(c) && !ret)
		ret = -EIO;
	return ret;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"listen", required_argument, NULL, 'l'},  {"socket", required_argument, NULL, 's'},
		{"ring-size", required_argument, NULL, 'r'}, {"qps", required_argument, NULL, 'q'},
		{"timeout", required_argument, NULL, 't'}, {"no-wait", no_argument, NULL, 'n'},
		{"version", no_argument, NULL, 'V'},       {"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct mesh_channel_opts opts = {0};
	const char *sock = NULL;
	bool listen_mode = false, wait_link = true;
	uint64_t port = 0, node = 0, v;
	mesh_session_t *s;
	int ch, ret;

	while ((ch = getopt_long(argc, argv, "l:s:r:q:t:nVh", longopts, NULL)) != -1) {
		switch (ch) {
		case 'l':
			if (!parse_u64(optarg, 65535, false, &port)) {
				fprintf(stderr, "meshcat: -l %s: expected a port 0..65535\n", optarg);
				return EXIT_USAGE;
			}
			listen_mode = true;
			break;
		case 's':
			sock = optarg;
			break;
		case 'r':
			if (!parse_u64(optarg, UINT64_MAX, true, &v) || v < (4u << 10) || v > (256u << 20) || (v & (v - 1))) {
				fprintf(stderr, "meshcat: -r %s: expected a power of two 4K..256M\n", optarg);
				return EXIT_USAGE;
			}
			opts.ring_size = v;
			opts.mask |= MESH_OPT_RING_SIZE;
			break;
		case 'q':
			if (!parse_u64(optarg, 16, false, &v) || !v) {
				fprintf(stderr, "meshcat: -q %s: expected 1..16\n", optarg);
				return EXIT_USAGE;
			}
			opts.qps = (uint32_t)v;
			opts.mask |= MESH_OPT_QPS;
			break;
		case 't':
			if (!parse_u64(optarg, UINT32_MAX, false, &v) || !v) {
				fprintf(stderr, "meshcat: -t %s: expected milliseconds 1..%u\n", optarg, UINT32_MAX);
				return EXIT_USAGE;
			}
			opts.timeout_ms = (uint32_t)v;
			opts.mask |= MESH_OPT_TIMEOUT_MS;
			break;
		case 'n':
			wait_link = false;
			break;
		case 'V':
			printf("meshcat %d.%d\n", MESH_VERSION_MAJOR, MESH_VERSION_MINOR);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (listen_mode ? optind != argc : argc - optind != 2) {
		fprintf(stderr, "meshcat: expected %s\n", listen_mode ? "no argument after -l PORT" : "NODE PORT");
		usage(stderr);
		return EXIT_USAGE;
	}
	if (listen_mode && (opts.mask || !wait_link)) {
		fprintf(stderr, "meshcat: -r, -q, -t and -n apply to the connecting side only\n");
		return EXIT_USAGE;
	}
	/* As nc's connect(2) waits for a host that does not answer yet: a link still forming (both
	 * meshd just started, the peer rebooting) is waited for within the timeout. */
	if (wait_link)
		opts.mask |= MESH_OPT_WAIT_LINK;
	if (!listen_mode) {
		if (!parse_u64(argv[optind], 65535, false, &node)) {
			fprintf(stderr, "meshcat: node '%s': expected a node id 0..65535\n", argv[optind]);
			return EXIT_USAGE;
		}
		if (!parse_u64(argv[optind + 1], 65535, false, &port)) {
			fprintf(stderr, "meshcat: port '%s': expected 0..65535\n", argv[optind + 1]);
			return EXIT_USAGE;
		}
	}
	/* A closed stdout is an error to report, not a reason to die silently. */
	signal(SIGPIPE, SIG_IGN);
	ret = mesh_open(sock, &s);
	if (ret) {
		fprintf(stderr, "meshcat: socket %s: %s\n", sock ? sock : "(default)", mesh_strerror(ret));
		return EXIT_FAIL;
	}
	if (listen_mode)
		ret = run_listen(s, (uint16_t)port);
	else
		ret = run_connect(s, (uint32_t)node, (uint16_t)port, &opts);
	mesh_session_close(s);
	return ret ? EXIT_FAIL : 0;
}
