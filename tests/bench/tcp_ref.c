/*
 * tcp_ref: kernel TCP at its best, the reference the tcp provider's figures are compared with.
 * rstream -T s measures TCP through rsocket's own harness; this is the plain shape a TCP program
 * has, in C, so that the ratio is against TCP itself and not against a harness or an interpreter.
 *
 *   tcp_ref -s PORT [-T SECONDS]                                  server: one connection, then exit
 *   tcp_ref -c ADDR PORT -t lat [-S SIZE] [-n ITERS] [-p] [-T SECONDS]   ping-pong
 *   tcp_ref -c ADDR PORT -t bw [-S SIZE] [-D SECONDS] [-T SECONDS]       one-way stream
 *
 * Both ends set TCP_NODELAY. lat: SIZE bytes each way ITERS times (after ITERS / 10 of warm-up);
 * the half round trip is half of each round trip: typical (median), average and p99. With -p both
 * ends busy-poll (recv with MSG_DONTWAIT in a loop, as perftest polls its CQ) instead of sleeping in
 * recv: TCP's lowest latency, at the price of a CPU per end. bw: the client writes SIZE-byte
 * buffers for SECONDS and shuts its side; the server counts what it read and answers the count,
 * which the client checks (every byte sent arrived).
 *
 * Output: one JSON object on stdout (test, size, and typ_us/avg_us/p99_us/iters or mb_s/seconds).
 * Exit status 0; 1 on bad arguments; 2 when the connection failed, a count did not match or the
 * run did not end within -T seconds (default 120): it never hangs.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SIZE_MAX_ARG (4u << 20)

static bool busy_poll;

static void usage(FILE *f)
{
	fprintf(f, "Usage: tcp_ref -s PORT [-T SECONDS]\n"
		   "       tcp_ref -c ADDR PORT -t lat|bw [-S SIZE] [-n ITERS] [-D SECONDS] [-p] [-T SECONDS]\n\n"
		   "Kernel TCP as a plain C program uses it (TCP_NODELAY, blocking calls), the reference\n"
		   "for the tcp provider's benchmark. The server takes one connection; the client runs a\n"
		   "ping-pong (lat: half round trip, typical, average, p99) or a one-way stream (bw) and\n"
		   "prints one JSON object.\n\n"
		   "  -S SIZE     message or buffer size in bytes (default 64 for lat, 65536 for bw)\n"
		   "  -n ITERS    round trips (lat, default 10000)\n"
		   "  -D SECONDS  stream duration (bw, default 4)\n"
		   "  -p          busy-poll (recv MSG_DONTWAIT in a loop) instead of sleeping in recv\n"
		   "  -T SECONDS  give up (exit 2) after this long (default 120)\n");
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_alarm(int sig)
{
	static const char msg[] = "tcp_ref: timed out\n";

	(void)sig;
	if (write(2, msg, sizeof(msg) - 1) < 0)
		_exit(2);
	_exit(2);
}

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Reads exactly len bytes (0), or less at EOF (1), or fails (-1). */
static int read_all(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t n = recv(fd, p, len, busy_poll ? MSG_DONTWAIT : 0);

		if (n < 0 && (errno == EINTR || (busy_poll && errno == EAGAIN)))
			continue;
		if (n < 0)
			return -1;
		if (n == 0)
			return 1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void nodelay(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* The request: test ('L' or 'B'), busy poll (0/1), size (u32, network order). */
struct hello {
	char test;
	char poll;
	uint32_t size;
} __attribute__((packed));

static int serve(const char *port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
	int one = 1, lfd, fd;
	struct hello h;
	char *buf;
	uint64_t total = 0;
	char line[32];

	sa.sin_port = htons((uint16_t)atoi(port));
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(lfd, 1)) {
		fprintf(stderr, "tcp_ref: listen on port %s: %s\n", port, strerror(errno));
		return 2;
	}
	fd = accept(lfd, NULL, NULL);
	close(lfd);
	if (fd < 0) {
		fprintf(stderr, "tcp_ref: accept: %s\n", strerror(errno));
		return 2;
	}
	nodelay(fd);
	if (read_all(fd, &h, sizeof(h)) || ntohl(h.size) == 0 || ntohl(h.size) > SIZE_MAX_ARG ||
	    (h.test != 'L' && h.test != 'B')) {
		fprintf(stderr, "tcp_ref: bad request from the client\n");
		close(fd);
		return 2;
	}
	busy_poll = h.poll == 1;
	buf = malloc(ntohl(h.size));
	if (!buf) {
		close(fd);
		return 2;
	}
	for (;;) {
		ssize_t n;

		if (h.test == 'L') {
			if (read_all(fd, buf, ntohl(h.size)) || write_all(fd, buf, ntohl(h.size)))
				break;
			continue;
		}
		n = recv(fd, buf, ntohl(h.size), 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		total += (uint64_t)n;
	}
	if (h.test == 'B') {
		snprintf(line, sizeof(line), "%llu\n", (unsigned long long)total);
		if (write_all(fd, line, strlen(line)))
			fprintf(stderr, "tcp_ref: cannot answer the count: %s\n", strerror(errno));
	}
	free(buf);
	close(fd);
	return 0;
}

static int dial(const char *addr, const char *port)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
	int fd, ret = getaddrinfo(addr, port, &hints, &ai);

	if (ret) {
		fprintf(stderr, "tcp_ref: %s port %s: %s\n", addr, port, gai_strerror(ret));
		return -1;
	}
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen)) {
		fprintf(stderr, "tcp_ref: connect to %s port %s: %s\n", addr, port, strerror(errno));
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	if (fd >= 0)
		nodelay(fd);
	return fd;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* One clock reading per round trip, as perftest and meshbench take them: a round trip lasts from
 * its reading to the next one's. */
static int run_lat(int fd, uint32_t size, long iters)
{
	long warm = iters / 10, n = 0;
	double *half = calloc((size_t)iters, sizeof(*half)), sum = 0, prev = 0;
	char *buf = calloc(1, size);
	int ret = 2;

	if (!half || !buf)
		goto out;
	for (long i = -warm; i <= iters; i++) {
		double t = now_s();

		if (i > 0) {
			half[n] = (t - prev) / 2 * 1e6;
			sum += half[n++];
		}
		prev = t;
		if (i == iters)
			break;
		if (write_all(fd, buf, size) || read_all(fd, buf, size)) {
			fprintf(stderr, "tcp_ref: ping-pong broke at round trip %ld: %s\n", i, strerror(errno));
			goto out;
		}
	}
	qsort(half, (size_t)n, sizeof(*half), cmp_double);
	printf("{\"test\": \"lat\", \"size\": %u, \"poll\": %s, \"iters\": %ld, \"typ_us\": %.3f, \"avg_us\": %.3f, "
	       "\"p99_us\": %.3f}\n",
	       size, busy_poll ? "true" : "false", n, half[n / 2], sum / (double)n, half[n * 99 / 100]);
	ret = 0;
out:
	free(half);
	free(buf);
	return ret;
}

static int run_bw(int fd, uint32_t size, double secs)
{
	char *buf = calloc(1, size), line[32] = "";
	uint64_t sent = 0;
	double t0, t;
	int ret = 2;

	if (!buf)
		return 2;
	t0 = now_s();
	do {
		if (write_all(fd, buf, size)) {
			fprintf(stderr, "tcp_ref: stream broke after %llu bytes: %s\n", (unsigned long long)sent,
				strerror(errno));
			goto out;
		}
		sent += size;
	} while (now_s() - t0 < secs);
	shutdown(fd, SHUT_WR);
	busy_poll = false;
	if (read_all(fd, line, sizeof(line) - 1) < 0 || strtoull(line, NULL, 10) != sent) {
		fprintf(stderr, "tcp_ref: sent %llu bytes, the server counted '%s'\n", (unsigned long long)sent,
			strtok(line, "\n") ? line : "nothing");
		goto out;
	}
	t = now_s() - t0; /* to the server's count: every byte read */
	printf("{\"test\": \"bw\", \"size\": %u, \"mb_s\": %.2f, \"seconds\": %.3f, \"bytes\": %llu}\n", size,
	       (double)sent / t / 1e6, t, (unsigned long long)sent);
	ret = 0;
out:
	free(buf);
	return ret;
}

int main(int argc, char **argv)
{
	const char *server = NULL, *test = NULL;
	long iters = 10000, size = 0, limit = 120;
	double secs = 4;
	int c, fd, ret;
	struct hello h;

	while ((c = getopt(argc, argv, "s:ct:S:n:D:pT:h")) != -1) {
		switch (c) {
		case 's':
			server = optarg;
			break;
		case 'c':
			break;
		case 't':
			test = optarg;
			break;
		case 'S':
			size = strtol(optarg, NULL, 0);
			break;
		case 'n':
			iters = strtol(optarg, NULL, 0);
			break;
		case 'D':
			secs = strtod(optarg, NULL);
			break;
		case 'p':
			busy_poll = true;
			break;
		case 'T':
			limit = strtol(optarg, NULL, 0);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 1;
		}
	}
	if (limit <= 0 || limit > 86400) {
		fprintf(stderr, "tcp_ref: -T must be 1..86400 seconds\n");
		return 1;
	}
	signal(SIGALRM, on_alarm);
	alarm((unsigned)limit);
	if (server)
		return serve(server);
	if (argc - optind != 2 || !test || (strcmp(test, "lat") && strcmp(test, "bw"))) {
		usage(stderr);
		return 1;
	}
	if (!size)
		size = strcmp(test, "lat") ? 65536 : 64;
	if (size < 1 || size > (long)SIZE_MAX_ARG || iters < 10 || iters > 100000000 || !(secs > 0 && secs < 3600)) {
		fprintf(stderr, "tcp_ref: -S must be 1..%u, -n 10..100000000, -D over 0 and under 3600\n", SIZE_MAX_ARG);
		return 1;
	}
	fd = dial(argv[optind], argv[optind + 1]);
	if (fd < 0)
		return 2;
	h.test = strcmp(test, "lat") ? 'B' : 'L';
	h.poll = busy_poll;
	h.size = htonl((uint32_t)size);
	if (write_all(fd, &h, sizeof(h))) {
		fprintf(stderr, "tcp_ref: cannot send the request: %s\n", strerror(errno));
		close(fd);
		return 2;
	}
	ret = h.test == 'L' ? run_lat(fd, (uint32_t)size, iters) : run_bw(fd, (uint32_t)size, secs);
	close(fd);
	return ret;
}
