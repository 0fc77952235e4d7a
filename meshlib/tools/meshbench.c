/*
 * meshbench: perftest-like benchmark of mesh channels, two processes on two nodes.
 *
 *   meshbench [-s SOCKET] [-j] [-1] -l PORT                                  server
 *   meshbench [-s SOCKET] [-r RING] [-q QPS] [-t bw|rate|lat] [-n ITERS | -D SECONDS]
 *             [-m SIZE[,SIZE...]] [-C] [-p] [-c] [-j] NODE PORT                client
 *
 * Every run (one test at one message size) opens its own channel and starts with a handshake: the
 * client sends a 32-byte header (test, size, flags), the server answers "ready", then:
 *
 *   bw, rate  the client streams messages of SIZE bytes (one commit each) and shuts its side; the
 *             server reads and discards until EOF, then answers with the byte count it read. The
 *             client's clock runs from "ready" until that answer, so it covers the last byte read.
 *             The counts must match: a run whose bytes did not all arrive fails.
 *   lat       ping-pong: the client sends SIZE bytes, the server echoes them, the client waits for
 *             all of them; the half round trip of every iteration is kept (after a warm-up).
 *
 * Zero-copy by default: the client commits messages straight in the TX ring (mesh_send_reserve /
 * mesh_send_commit) and, like perftest, does not write the payload; the server releases what it
 * peeks without copying (mesh_recv_peek / mesh_recv_release). -C copies through mesh_send /
 * mesh_recv like an ordinary application; -c writes a pattern and checks every byte at the other
 * end (slower: it measures the check too).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mesh/mesh.h>

#define EXIT_USAGE 1
#define EXIT_FAIL 2

#define BENCH_MAGIC 0x4d424e43u /* "MBNC" */
#define BENCH_VERSION 1
#define MAX_SIZES 32
#define SIZE_MAX_MSG (1ull << 30)
#define LAT_WARMUP 16
#define COPY_BUF (1u << 20)

enum test { T_BW = 1, T_RATE = 2, T_LAT = 3 };

/* Header flags: how both ends move the bytes. */
#define F_LAST (1u << 0)  /* the client's last run: a server started with -1 exits after it */
#define F_COPY (1u << 1)  /* mesh_send/mesh_recv instead of reserve/commit, peek/release */
#define F_CHECK (1u << 2) /* pattern written and checked */
#define F_POLL (1u << 3)  /* busy-poll with MESH_NONBLOCK instead of sleeping */
#define F_KNOWN (F_LAST | F_COPY | F_CHECK | F_POLL)

/* Host byte order on both ends: a peer of another byte order fails the magic check. */
struct bench_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t test;
	uint32_t flags;
	uint32_t reserved0;
	uint64_t size;
	uint64_t reserved1;
};

struct bench_ready {
	uint32_t magic;
	int32_t status; /* 0, or the negative errno of a refused header */
};

struct bench_result {
	uint32_t magic;
	int32_t status;       /* 0, or -EILSEQ when the pattern check failed */
	uint64_t bytes;       /* read before EOF */
	uint64_t ns;          /* first byte to EOF, at the server */
	uint64_t mismatch_at; /* stream position of the first bad byte (status -EILSEQ) */
};

_Static_assert(sizeof(struct bench_hdr) == 32, "header is 32 bytes");
_Static_assert(sizeof(struct bench_result) == 32, "result is 32 bytes");

static volatile sig_atomic_t g_stop;
static bool g_json;

static void on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

static const char *test_name(unsigned t)
{
	return t == T_BW ? "bw" : t == T_RATE ? "rate" : t == T_LAT ? "lat" : "?";
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: meshbench [-s SOCKET] [-j] [-1] -l PORT\n"
		"       meshbench [-s SOCKET] [-r RING] [-q QPS] [-N NODE] [-R RAIL] [-t bw|rate|lat] [-n ITERS | -D SECONDS]\n"
		"                 [-m SIZE[,SIZE...]] [-C] [-p] [-c] [-j] [-T MS] NODE PORT\n"
		"\n"
		"Benchmark of mesh channels, like perftest. The server (-l) accepts one channel per run\n"
		"and serves runs one after the other; the client opens a channel to PORT of node NODE for\n"
		"each message size and prints one row per run.\n"
		"\n"
		"Tests (-t):\n"
		"  bw    bandwidth, one direction: the client streams SIZE-byte messages, the server reads\n"
		"        and discards them; timed until the server has read the last byte (default)\n"
		"  rate  the same with small messages, reported as messages per second (default 64 B)\n"
		"  lat   ping-pong: half the round trip of SIZE bytes echoed by the server (default 64 B),\n"
		"        minimum, typical (median), average, 99th percentile and maximum\n"
		"\n"
		"Options:\n"
		"  -l, --listen PORT      server: accept runs on PORT\n"
		"  -1, --once             server: exit after the client's last run (default: until a signal)\n"
		"  -s, --socket PATH      meshd's control socket (default $%s, else %s)\n"
		"  -t, --test TEST        bw, rate or lat (default bw)\n"
		"  -m, --size LIST        message sizes, comma-separated, suffix K, M or G (default: bw 65536,\n"
		"                         rate and lat 64); lat sizes must fit the ring\n"
		"  -n, --iters N          messages per run (bw, rate) or round trips (lat, default 1000)\n"
		"  -D, --duration SEC     run for SEC seconds instead (default for bw and rate: 3)\n"
		"  -r, --ring-size SIZE   ring bytes per direction, a power of two 4K..256M (default: meshd's)\n"
		"  -q, --qps N            QPs of the link to stripe over, 1..16 (default: all)\n"
		"  -N, --numa NODE        NUMA node of this side's rings, and with several devices the device\n"
		"                         on that node (default: the device's node, cluster.numa)\n"
		"  -R, --rail RAIL        the device (rail) to use: 0 = nodes.addr, i = nodes.rails[i-1]\n"
		"                         (default: the one on -N's node, else on this thread's node, else 0)\n"
		"  -C, --copy             mesh_send/mesh_recv (copies) instead of zero-copy reserve/commit and\n"
		"                         peek/release\n"
		"  -c, --check            write a pattern and check every byte at the other end\n"
		"  -p, --poll             busy-poll (MESH_NONBLOCK) instead of sleeping, on both ends\n"
		"  -j, --json             one JSON object per run and line instead of the table\n"
		"  -T, --timeout MS       how long to wait for the server to accept (default 30000)\n"
		"  -V, --version          print the version\n"
		"  -h, --help             this help\n"
		"\n"
		"Units: MB = 10^6 bytes, Gbit = 10^9 bits; latencies in microseconds.\n"
		"Exit status: 0 when every run completed with every byte accounted for, 1 on a usage error,\n"
		"2 on any failure.\n",
		MESH_SOCKET_ENV, MESH_SOCKET_DEFAULT);
}

/* ---- parsing ---- */

static bool parse_u64(const char *s, uint64_t max, bool suffix, uint64_t *out)
{
	unsigned long long v;
	char *end;
	unsigned shift = 0;

	if (!*s || *s == '-')
		return false;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s)
		return false;
	if (suffix && *end) {
		switch (*end) {
		case 'k':
		case 'K':
			shift = 10;
			break;
		case 'm':
		case 'M':
			shift = 20;
			break;
		case 'g':
		case 'G':
			shift = 30;
			break;
		default:
			return false;
		}
		end++;
		if (v > max >> shift)
			return false;
		v <<= shift;
	}
	if (*end || v > max)
		return false;
	*out = v;
	return true;
}

static int parse_sizes(const char *arg, uint64_t *sizes, int max)
{
	char *copy = strdup(arg), *save = NULL, *tok;
	int n = 0;

	if (!copy)
		return -1;
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (n == max || !parse_u64(tok, SIZE_MAX_MSG, true, &sizes[n]) || !sizes[n]) {
			n = -1;
			break;
		}
		n++;
	}
	free(copy);
	return n;
}

/* ---- the pattern of -c: byte p of the stream is byte p % 8 of word p / 8 ---- */

static inline uint64_t pat_word(uint64_t w)
{
	return (w + 1) * 0x9e3779b97f4a7c15ull;
}

static inline uint8_t pat_byte(uint64_t p)
{
	return (uint8_t)(pat_word(p >> 3) >> ((p & 7) * 8));
}

static void pat_fill(uint8_t *b, uint64_t pos, size_t n)
{
	size_t k = 0;

	for (; k < n && ((pos + k) & 7); k++)
		b[k] = pat_byte(pos + k);
	for (; k + 8 <= n; k += 8) {
		uint64_t w = pat_word((pos + k) >> 3);

		memcpy(b + k, &w, 8);
	}
	for (; k < n; k++)
		b[k] = pat_byte(pos + k);
}

/* Offset of the first byte that is not the pattern, or n. */
static size_t pat_check(const uint8_t *b, uint64_t pos, size_t n)
{
	size_t k = 0;

	for (; k < n && ((pos + k) & 7); k++)
		if (b[k] != pat_byte(pos + k))
			return k;
	for (; k + 8 <= n; k += 8) {
		uint64_t w = pat_word((pos + k) >> 3), v;

		memcpy(&v, b + k, 8);
		if (v != w)
			break;
	}
	for (; k < n; k++)
		if (b[k] != pat_byte(pos + k))
			return k;
	return n;
}

/* ---- channel calls that wait: sleeping, or spinning with -p ---- */

static bool g_poll;

/* Retry a call interrupted by a signal unless we are asked to stop; with -p, spin on -EAGAIN,
 * yielding the CPU between tries (meshd and the peer may need it: perftest has two processes to
 * schedule, a channel four). */
static bool retry(ssize_t r)
{
	if (g_stop)
		return false;
	if (r == -EAGAIN && g_poll) {
		sched_yield();
		return true;
	}
	return r == -EINTR;
}

static int wflags(void)
{
	return g_poll ? MESH_NONBLOCK : 0;
}

static ssize_t do_reserve(mesh_channel_t *c, void **buf)
{
	ssize_t r;

	do
		r = mesh_send_reserve(c, buf, wflags());
	while (retry(r));
	return r;
}

static ssize_t do_peek(mesh_channel_t *c, const void **buf)
{
	ssize_t r;

	do
		r = mesh_recv_peek(c, buf, wflags());
	while (retry(r));
	return r;
}

static ssize_t do_send(mesh_channel_t *c, const void *buf, size_t len)
{
	ssize_t r;

	do
		r = mesh_send(c, buf, len, wflags());
	while (retry(r));
	return r;
}

static ssize_t do_recv(mesh_channel_t *c, void *buf, size_t len)
{
	ssize_t r;

	do
		r = mesh_recv(c, buf, len, wflags());
	while (retry(r));
	return r;
}

/* Exactly len bytes out (copying: control messages). */
static int send_all(mesh_channel_t *c, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = do_send(c, p, len);

		if (n < 0)
			return (int)n;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Exactly len bytes in; -ENODATA at an EOF before them. */
static int recv_all(mesh_channel_t *c, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = do_recv(c, p, len);

		if (n < 0)
			return (int)n;
		if (n == 0)
			return -ENODATA;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Waits for the peer's EOF; anything else is an error (-EBADMSG for unexpected bytes). */
static int expect_eof(mesh_channel_t *c)
{
	uint8_t b[64];
	ssize_t n = do_recv(c, b, sizeof(b));

	return n == 0 ? 0 : n < 0 ? (int)n : -EBADMSG;
}

/* One message of len bytes at stream position *pos: zero-copy, or copied from buf (len bytes). */
static int send_msg(mesh_channel_t *c, uint64_t len, uint64_t *pos, uint32_t flags, uint8_t *buf)
{
	if (flags & F_COPY) {
		uint64_t off = 0;

		if (flags & F_CHECK)
			pat_fill(buf, *pos, len);
		while (off < len) {
			ssize_t n = do_send(c, buf + off, len - off);

			if (n < 0)
				return (int)n;
			off += (uint64_t)n;
		}
		*pos += len;
		return 0;
	}
	while (len) {
		void *b;
		ssize_t n = do_reserve(c, &b);
		uint64_t k;
		int ret;

		if (n < 0)
			return (int)n;
		k = (uint64_t)n < len ? (uint64_t)n : len;
		if (flags & F_CHECK)
			pat_fill(b, *pos, k);
		ret = mesh_send_commit(c, k);
		if (ret)
			return ret;
		*pos += k;
		len -= k;
	}
	return 0;
}

/* ---- server ---- */

struct served {
	unsigned test;
	uint64_t size, bytes, ns;
	struct mesh_channel_info info;
	int status;
	uint64_t mismatch_at;
};

/* bw and rate: read and discard until EOF. */
static int serve_sink(mesh_channel_t *c, uint32_t flags, uint8_t *buf, struct served *sv)
{
	uint64_t t0 = 0;

	for (;;) {
		const void *p;
		ssize_t n;

		if (flags & F_COPY) {
			n = do_recv(c, buf, COPY_BUF);
			p = buf;
		} else {
			n = do_peek(c, &p);
		}
		if (n < 0)
			return (int)n;
		if (n == 0)
			break;
		if (!t0)
			t0 = now_ns();
		if ((flags & F_CHECK) && !sv->status) {
			size_t k = pat_check(p, sv->bytes, (size_t)n);

			if (k != (size_t)n) {
				sv->status = -EILSEQ;
				sv->mismatch_at = sv->bytes + k;
			}
		}
		if (!(flags & F_COPY)) {
			int ret = mesh_recv_release(c, (size_t)n);

			if (ret)
				return ret;
		}
		sv->bytes += (uint64_t)n;
	}
	sv->ns = t0 ? now_ns() - t0 : 0;
	return 0;
}

/* lat: send back every byte until EOF. */
static int serve_echo(mesh_channel_t *c, uint32_t flags, uint8_t *buf, struct served *sv)
{
	uint64_t t0 = now_ns();

	for (;;) {
		const void *p;
		ssize_t n;
		int ret;

		if (flags & F_COPY) {
			n = do_recv(c, buf, COPY_BUF);
			if (n <= 0) {
				if (n < 0)
					return (int)n;
				break;
			}
			ret = send_all(c, buf, (size_t)n);
			if (ret)
				return ret;
			sv->bytes += (uint64_t)n;
			continue;
		}
		n = do_peek(c, &p);
		if (n < 0)
			return (int)n;
		if (n == 0)
			break;
		for (size_t off = 0; off < (size_t)n;) {
			void *w;
			ssize_t m = do_reserve(c, &w);
			size_t k;

			if (m < 0)
				return (int)m;
			k = (size_t)m < (size_t)n - off ? (size_t)m : (size_t)n - off;
			memcpy(w, (const uint8_t *)p + off, k);
			ret = mesh_send_commit(c, k);
			if (ret)
				return ret;
			off += k;
		}
		ret = mesh_recv_release(c, (size_t)n);
		if (ret)
			return ret;
		sv->bytes += (uint64_t)n;
	}
	sv->ns = now_ns() - t0;
	return 0;
}

static void print_served(const struct served *sv)
{
	double secs = (double)sv->ns / 1e9;
	double mbs = secs > 0 ? (double)sv->bytes / secs / 1e6 : 0;

	if (g_json) {
		printf("{\"tool\":\"meshbench\",\"role\":\"server\",\"test\":\"%s\",\"size\":%" PRIu64
		       ",\"bytes\":%" PRIu64 ",\"seconds\":%.6f,\"mb_s\":%.3f,\"channel\":%u,\"node\":%u,"
		       "\"ring\":%" PRIu64 ",\"qps\":%u,\"status\":\"%s\"}\n",
		       test_name(sv->test), sv->size, sv->bytes, secs, sv->test == T_LAT ? 0.0 : mbs,
		       sv->info.channel_id, sv->info.peer_node, sv->info.ring_size, sv->info.qps,
		       sv->status ? mesh_strerror(sv->status) : "ok");
	} else if (sv->test == T_LAT) {
		printf("# served lat  %9" PRIu64 " B from node %u (channel %u, ring %" PRIu64 ", %u QPs): %" PRIu64
		       " bytes echoed in %.3f s\n",
		       sv->size, sv->info.peer_node, sv->info.channel_id, sv->info.ring_size, sv->info.qps, sv->bytes,
		       secs);
	} else {
		printf("# served %-4s %9" PRIu64 " B from node %u (channel %u, ring %" PRIu64 ", %u QPs): %" PRIu64
		       " bytes read in %.3f s, %.2f MB/s%s\n",
		       test_name(sv->test), sv->size, sv->info.peer_node, sv->info.channel_id, sv->info.ring_size,
		       sv->info.qps, sv->bytes, secs, mbs, sv->status ? ", PATTERN MISMATCH" : "");
	}
	fflush(stdout);
}

/* One run on an accepted channel. Returns 0 (and *last) or a negative errno, reported. */
static int serve_one(mesh_channel_t *c, uint8_t *buf, bool *last)
{
	struct bench_hdr h;
	struct bench_ready rd = {.magic = BENCH_MAGIC};
	struct bench_result res = {.magic = BENCH_MAGIC};
	struct served sv = {0};
	int ret;

	mesh_channel_info(c, &sv.info);
	g_poll = false;
	ret = recv_all(c, &h, sizeof(h));
	if (ret == -ENODATA) {
		/* The client closed before its header: it gave up (say, a size its ring cannot hold). */
		fprintf(stderr, "meshbench: channel %u closed by the client before any run\n", sv.info.channel_id);
		return 0;
	}
	if (ret) {
		fprintf(stderr, "meshbench: channel %u: reading the header: %s\n", sv.info.channel_id,
			mesh_strerror(ret));
		return ret;
	}
	if (h.magic != BENCH_MAGIC || h.version != BENCH_VERSION || h.test < T_BW || h.test > T_LAT ||
	    (h.flags & ~F_KNOWN) || !h.size || h.size > SIZE_MAX_MSG) {
		fprintf(stderr, "meshbench: channel %u: not a meshbench %d header (magic 0x%x, version %u, test %u)\n",
			sv.info.channel_id, BENCH_VERSION, h.magic, h.version, h.test);
		rd.status = -EPROTO;
		send_all(c, &rd, sizeof(rd));
		return -EPROTO;
	}
	sv.test = h.test;
	sv.size = h.size;
	*last = h.flags & F_LAST;
	g_poll = h.flags & F_POLL;
	ret = send_all(c, &rd, sizeof(rd));
	if (ret)
		goto fail;
	if (h.test == T_LAT) {
		ret = serve_echo(c, h.flags, buf, &sv);
		if (ret)
			goto fail;
	} else {
		ret = serve_sink(c, h.flags, buf, &sv);
		if (ret)
			goto fail;
		res.status = sv.status;
		res.bytes = sv.bytes;
		res.ns = sv.ns;
		res.mismatch_at = sv.mismatch_at;
		ret = send_all(c, &res, sizeof(res));
		if (ret)
			goto fail;
	}
	print_served(&sv);
	return 0;
fail:
	fprintf(stderr, "meshbench: channel %u (%s, %" PRIu64 " B): %s after %" PRIu64 " bytes\n", sv.info.channel_id,
		test_name(sv.test), sv.size, mesh_strerror(ret), sv.bytes);
	return ret;
}

static int run_server(mesh_session_t *s, uint16_t port, bool once)
{
	mesh_listener_t *l;
	uint8_t *buf = malloc(COPY_BUF);
	int ret, failures = 0;

	if (!buf) {
		fprintf(stderr, "meshbench: out of memory\n");
		return -ENOMEM;
	}
	ret = mesh_listen(s, port, &l);
	if (ret) {
		fprintf(stderr, "meshbench: listen on port %u: %s\n", port,
			*mesh_session_error(s) ? mesh_session_error(s) : mesh_strerror(ret));
		free(buf);
		return ret;
	}
	if (g_json)
		printf("{\"tool\":\"meshbench\",\"role\":\"server\",\"listening\":%u}\n", port);
	else
		printf("# meshbench: listening on port %u\n", port);
	fflush(stdout);
	while (!g_stop) {
		mesh_channel_t *c;
		bool last = false;

		ret = mesh_accept(l, 0, &c);
		if (ret == -EINTR)
			continue;
		if (ret) {
			fprintf(stderr, "meshbench: accept on port %u: %s\n", port, mesh_strerror(ret));
			if (ret == -ECONNRESET)
				break; /* meshd closed the listener */
			failures++;
			continue;
		}
		if (serve_one(c, buf, &last))
			failures++;
		mesh_close(c);
		if (once && last)
			break;
	}
	mesh_listener_close(l);
	free(buf);
	if (ret == -ECONNRESET)
		return ret;
	return failures ? -EIO : 0;
}

/* ---- client ---- */

struct client_cfg {
	uint32_t node;
	uint16_t port;
	unsigned test;
	uint64_t iters;   /* 0: by duration */
	double duration;  /* seconds */
	uint32_t flags;   /* F_COPY, F_CHECK, F_POLL */
	struct mesh_channel_opts opts;
};

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static const char *mode_name(uint32_t flags)
{
	return flags & F_COPY ? "copy" : "zero-copy";
}

static void print_header(const struct client_cfg *k, const struct mesh_channel_info *ci)
{
	printf("# meshbench %s to node %u port %u: ring %" PRIu64 " B, %u QPs, %s%s%s\n", test_name(k->test), k->node,
	       k->port, ci->ring_size, ci->qps, mode_name(k->flags), k->flags & F_CHECK ? ", checked" : "",
	       k->flags & F_POLL ? ", busy-poll" : "");
	if (k->test == T_LAT)
		printf("%10s %12s %12s %12s %12s %12s %12s\n", "#bytes", "#iterations", "t_min[us]", "t_typical[us]",
		       "t_avg[us]", "t_p99[us]", "t_max[us]");
	else
		printf("%10s %12s %14s %10s %12s %12s %12s\n", "#bytes", "#messages", "#total_bytes", "seconds",
		       "BW[MB/s]", "BW[Gbit/s]", "rate[Mmsg/s]");
}

/* bw and rate: stream, shut, wait for the server's count. */
static int client_stream(mesh_channel_t *c, const struct client_cfg *k, uint64_t size, uint8_t *buf,
			 const struct mesh_channel_info *ci)
{
	struct bench_result res;
	uint64_t pos = 0, msgs = 0, t0, t1, deadline;
	/* Look at the clock every message for big ones, every 64 for small ones. */
	uint64_t clock_mask = size >= 16384 ? 0 : 63;
	double secs;
	int ret;

	t0 = now_ns();
	deadline = t0 + (uint64_t)(k->duration * 1e9);
	for (;;) {
		if (k->iters ? msgs == k->iters : ((msgs & clock_mask) == 0 && now_ns() >= deadline))
			break;
		if (g_stop)
			return -EINTR;
		ret = send_msg(c, size, &pos, k->flags, buf);
		if (ret)
			return ret;
		msgs++;
	}
	ret = mesh_shutdown(c);
	if (ret)
		return ret;
	ret = recv_all(c, &res, sizeof(res));
	t1 = now_ns();
	if (ret)
		return ret;
	if (res.magic != BENCH_MAGIC)
		return -EBADMSG;
	if (res.status == -EILSEQ) {
		fprintf(stderr, "meshbench: the server found a wrong byte at stream position %" PRIu64 "\n",
			res.mismatch_at);
		return -EILSEQ;
	}
	if (res.status)
		return res.status;
	if (res.bytes != pos) {
		fprintf(stderr, "meshbench: sent %" PRIu64 " bytes, the server read %" PRIu64 "\n", pos, res.bytes);
		return -EIO;
	}
	ret = expect_eof(c);
	if (ret)
		return ret;
	secs = (double)(t1 - t0) / 1e9;
	if (g_json) {
		printf("{\"tool\":\"meshbench\",\"test\":\"%s\",\"size\":%" PRIu64 ",\"iters\":%" PRIu64
		       ",\"bytes\":%" PRIu64 ",\"seconds\":%.6f,\"mb_s\":%.3f,\"gbit_s\":%.4f,\"msg_s\":%.1f,"
		       "\"server_seconds\":%.6f,\"channel\":%u,\"node\":%u,\"port\":%u,\"ring\":%" PRIu64
		       ",\"qps\":%u,\"mode\":\"%s\",\"check\":%s,\"poll\":%s}\n",
		       test_name(k->test), size, msgs, pos, secs, (double)pos / secs / 1e6, (double)pos * 8 / secs / 1e9,
		       (double)msgs / secs, (double)res.ns / 1e9, ci->channel_id, k->node, k->port, ci->ring_size,
		       ci->qps, mode_name(k->flags), k->flags & F_CHECK ? "true" : "false",
		       k->flags & F_POLL ? "true" : "false");
	} else {
		printf("%10" PRIu64 " %12" PRIu64 " %14" PRIu64 " %10.3f %12.2f %12.4f %12.6f\n", size, msgs, pos, secs,
		       (double)pos / secs / 1e6, (double)pos * 8 / secs / 1e9, (double)msgs / secs / 1e6);
	}
	return 0;
}

/* lat: ping-pong. One clock reading per round trip, at its start, as perftest takes one time stamp
 * per iteration: a round trip lasts from its reading to the next one. Two readings around each would
 * add the cost of a reading to every figure, and where the clock source is emulated (an HPET in a
 * VM) a reading is a system call of 1-2 us. */
static int client_lat(mesh_channel_t *c, const struct client_cfg *k, uint64_t size, uint8_t *buf,
		      const struct mesh_channel_info *ci)
{
	uint64_t cap = k->iters ? k->iters : 4096, n = 0, pos = 0, rpos = 0, deadline = 0, sum = 0, prev = 0, i;
	uint64_t *lat = malloc(cap * sizeof(*lat));
	double avg, p99, typ;
	int ret = 0;

	if (!lat)
		return -ENOMEM;
	for (i = 0;; i++) {
		uint64_t t = now_ns(), got = 0;

		if (i > LAT_WARMUP) {
			if (n == cap) {
				uint64_t *nl = realloc(lat, 2 * cap * sizeof(*lat));

				if (!nl) {
					ret = -ENOMEM;
					goto out;
				}
				lat = nl;
				cap *= 2;
			}
			lat[n++] = t - prev;
		}
		prev = t;
		if (i == LAT_WARMUP && !k->iters)
			deadline = t + (uint64_t)(k->duration * 1e9);
		if (i >= LAT_WARMUP && (k->iters ? n == k->iters : t >= deadline))
			break;
		if (g_stop) {
			ret = -EINTR;
			goto out;
		}
		ret = send_msg(c, size, &pos, k->flags, buf);
		if (ret)
			goto out;
		while (got < size) {
			const void *p;
			ssize_t r;
			size_t m;

			if (k->flags & F_COPY) {
				r = do_recv(c, buf, size - got);
				p = buf;
			} else {
				r = do_peek(c, &p);
			}
			if (r < 0) {
				ret = (int)r;
				goto out;
			}
			if (r == 0) {
				ret = -ENODATA;
				goto out;
			}
			m = (uint64_t)r < size - got ? (size_t)r : (size_t)(size - got);
			if ((k->flags & F_CHECK) && pat_check(p, rpos, m) != m) {
				fprintf(stderr, "meshbench: wrong byte echoed near stream position %" PRIu64 "\n", rpos);
				ret = -EILSEQ;
				goto out;
			}
			if (!(k->flags & F_COPY)) {
				ret = mesh_recv_release(c, m);
				if (ret)
					goto out;
			}
			got += m;
			rpos += m;
		}
	}
	ret = mesh_shutdown(c);
	if (!ret)
		ret = expect_eof(c);
	if (ret)
		goto out;
	qsort(lat, n, sizeof(*lat), cmp_u64);
	for (i = 0; i < n; i++)
		sum += lat[i];
	/* Half round trips, in microseconds. */
	avg = (double)sum / (double)n / 2e3;
	typ = (double)lat[n / 2] / 2e3;
	p99 = (double)lat[n * 99 / 100 < n ? n * 99 / 100 : n - 1] / 2e3;
	if (g_json) {
		printf("{\"tool\":\"meshbench\",\"test\":\"lat\",\"size\":%" PRIu64 ",\"iters\":%" PRIu64
		       ",\"t_min_us\":%.3f,\"t_typical_us\":%.3f,\"t_avg_us\":%.3f,\"t_p99_us\":%.3f,\"t_max_us\":%.3f,"
		       "\"channel\":%u,\"node\":%u,\"port\":%u,\"ring\":%" PRIu64 ",\"qps\":%u,\"mode\":\"%s\","
		       "\"check\":%s,\"poll\":%s}\n",
		       size, n, (double)lat[0] / 2e3, typ, avg, p99, (double)lat[n - 1] / 2e3, ci->channel_id, k->node,
		       k->port, ci->ring_size, ci->qps, mode_name(k->flags), k->flags & F_CHECK ? "true" : "false",
		       k->flags & F_POLL ? "true" : "false");
	} else {
		printf("%10" PRIu64 " %12" PRIu64 " %12.2f %12.2f %12.2f %12.2f %12.2f\n", size, n, (double)lat[0] / 2e3,
		       typ, avg, p99, (double)lat[n - 1] / 2e3);
	}
out:
	free(lat);
	return ret;
}

static int client_run(mesh_session_t *s, const struct client_cfg *k, uint64_t size, bool last, bool *header_done)
{
	struct bench_hdr h = {.magic = BENCH_MAGIC, .version = BENCH_VERSION, .test = (uint16_t)k->test,
			      .flags = k->flags | (last ? F_LAST : 0), .size = size};
	struct bench_ready rd;
	struct mesh_channel_info ci;
	mesh_channel_t *c;
	uint8_t *buf = NULL;
	int ret;

	if (k->flags & F_COPY) {
		buf = malloc(size > COPY_BUF ? size : COPY_BUF);
		if (!buf)
			return -ENOMEM;
	}
	ret = mesh_connect(s, k->node, k->port, &k->opts, &c);
	if (ret) {
		fprintf(stderr, "meshbench: connect to node %u port %u: %s\n", k->node, k->port,
			*mesh_session_error(s) ? mesh_session_error(s) : mesh_strerror(ret));
		free(buf);
		return ret;
	}
	mesh_channel_info(c, &ci);
	if (k->test == T_LAT && size > ci.ring_size) {
		fprintf(stderr, "meshbench: lat: a message of %" PRIu64 " B does not fit the %" PRIu64 " B ring\n", size,
			ci.ring_size);
		ret = -EINVAL;
		goto out;
	}
	if (!*header_done && !g_json) {
		print_header(k, &ci);
		*header_done = true;
	}
	/* The handshake sleeps whatever the mode; the run itself polls with -p. */
	g_poll = false;
	ret = send_all(c, &h, sizeof(h));
	if (!ret)
		ret = recv_all(c, &rd, sizeof(rd));
	if (!ret && (rd.magic != BENCH_MAGIC || rd.status))
		ret = rd.magic != BENCH_MAGIC ? -EBADMSG : rd.status;
	if (ret) {
		fprintf(stderr, "meshbench: handshake with node %u port %u: %s\n", k->node, k->port, mesh_strerror(ret));
		goto out;
	}
	g_poll = k->flags & F_POLL;
	if (k->test == T_LAT)
		ret = client_lat(c, k, size, buf, &ci);
	else
		ret = client_stream(c, k, size, buf, &ci);
	if (ret)
		fprintf(stderr, "meshbench: %s of %" PRIu64 " B to node %u port %u (channel %u): %s\n", test_name(k->test),
			size, k->node, k->port, ci.channel_id, mesh_strerror(ret));
	fflush(stdout);
out:
	if (mesh_close(c) && !ret)
		ret = -EIO;
	free(buf);
	return ret;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"listen", required_argument, NULL, 'l'},   {"once", no_argument, NULL, '1'},
		{"socket", required_argument, NULL, 's'},   {"test", required_argument, NULL, 't'},
		{"size", required_argument, NULL, 'm'},     {"iters", required_argument, NULL, 'n'},
		{"duration", required_argument, NULL, 'D'}, {"ring-size", required_argument, NULL, 'r'},
		{"qps", required_argument, NULL, 'q'},      {"copy", no_argument, NULL, 'C'},
		{"numa", required_argument, NULL, 'N'},
		{"rail", required_argument, NULL, 'R'},
		{"check", no_argument, NULL, 'c'},          {"poll", no_argument, NULL, 'p'},
		{"json", no_argument, NULL, 'j'},           {"timeout", required_argument, NULL, 'T'},
		{"version", no_argument, NULL, 'V'},        {"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct client_cfg k = {.test = T_BW};
	uint64_t sizes[MAX_SIZES], v, port = 0, node = 0;
	int nsizes = 0, ch, ret = 0;
	bool listen_mode = false, once = false, client_only = false, header_done = false;
	const char *sock = NULL;
	struct sigaction sa;
	mesh_session_t *s;

	while ((ch = getopt_long(argc, argv, "l:1s:t:m:n:D:r:q:N:R:CcpjT:Vh", longopts, NULL)) != -1) {
		switch (ch) {
		case 'l':
			if (!parse_u64(optarg, 65535, false, &port)) {
				fprintf(stderr, "meshbench: -l %s: expected a port 0..65535\n", optarg);
				return EXIT_USAGE;
			}
			listen_mode = true;
			break;
		case '1':
			once = true;
			break;
		case 's':
			sock = optarg;
			break;
		case 't':
			if (!strcmp(optarg, "bw"))
				k.test = T_BW;
			else if (!strcmp(optarg, "rate"))
				k.test = T_RATE;
			else if (!strcmp(optarg, "lat"))
				k.test = T_LAT;
			else {
				fprintf(stderr, "meshbench: -t %s: expected bw, rate or lat\n", optarg);
				return EXIT_USAGE;
			}
			client_only = true;
			break;
		case 'm':
			nsizes = parse_sizes(optarg, sizes, MAX_SIZES);
			if (nsizes <= 0) {
				fprintf(stderr, "meshbench: -m %s: expected up to %d sizes 1..1G, comma-separated\n", optarg,
					MAX_SIZES);
				return EXIT_USAGE;
			}
			client_only = true;
			break;
		case 'n':
			if (!parse_u64(optarg, UINT64_MAX / 2, false, &k.iters) || !k.iters) {
				fprintf(stderr, "meshbench: -n %s: expected a positive count\n", optarg);
				return EXIT_USAGE;
			}
			client_only = true;
			break;
		case 'D': {
			char *end;

			errno = 0;
			k.duration = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(k.duration > 0) || k.duration > 86400) {
				fprintf(stderr, "meshbench: -D %s: expected seconds, more than 0\n", optarg);
				return EXIT_USAGE;
			}
			client_only = true;
			break;
		}
		case 'r':
			if (!parse_u64(optarg, UINT64_MAX, true, &v) || v < (4u << 10) || v > (256u << 20) || (v & (v - 1))) {
				fprintf(stderr, "meshbench: -r %s: expected a power of two 4K..256M\n", optarg);
				return EXIT_USAGE;
			}
			k.opts.ring_size = v;
			k.opts.mask |= MESH_OPT_RING_SIZE;
			client_only = true;
			break;
		case 'q':
			if (!parse_u64(optarg, 16, false, &v) || !v) {
				fprintf(stderr, "meshbench: -q %s: expected 1..16\n", optarg);
				return EXIT_USAGE;
			}
			k.opts.qps = (uint32_t)v;
			k.opts.mask |= MESH_OPT_QPS;
			client_only = true;
			break;
		case 'N':
			if (!parse_u64(optarg, 63, false, &v)) {
				fprintf(stderr, "meshbench: -N %s: expected a NUMA node 0..63\n", optarg);
				return EXIT_USAGE;
			}
			k.opts.numa_node = (int32_t)v;
			k.opts.mask |= MESH_OPT_NUMA_NODE;
			client_only = true;
			break;
		case 'R':
			if (!parse_u64(optarg, MESH_RAILS_MAX - 1, false, &v)) {
				fprintf(stderr, "meshbench: -R %s: expected a rail 0..%u\n", optarg, MESH_RAILS_MAX - 1);
				return EXIT_USAGE;
			}
			k.opts.rail = (uint32_t)v;
			k.opts.mask |= MESH_OPT_RAIL;
			client_only = true;
			break;
		case 'C':
			k.flags |= F_COPY;
			client_only = true;
			break;
		case 'c':
			k.flags |= F_CHECK;
			client_only = true;
			break;
		case 'p':
			k.flags |= F_POLL;
			client_only = true;
			break;
		case 'j':
			g_json = true;
			break;
		case 'T':
			if (!parse_u64(optarg, UINT32_MAX, false, &v) || !v) {
				fprintf(stderr, "meshbench: -T %s: expected milliseconds 1..%u\n", optarg, UINT32_MAX);
				return EXIT_USAGE;
			}
			k.opts.timeout_ms = (uint32_t)v;
			k.opts.mask |= MESH_OPT_TIMEOUT_MS;
			client_only = true;
			break;
		case 'V':
			printf("meshbench %d.%d\n", MESH_VERSION_MAJOR, MESH_VERSION_MINOR);
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
		fprintf(stderr, "meshbench: expected %s\n", listen_mode ? "no argument after -l PORT" : "NODE PORT");
		usage(stderr);
		return EXIT_USAGE;
	}
	if (listen_mode && client_only) {
		fprintf(stderr, "meshbench: the server takes only -s, -j and -1; the client chooses the rest\n");
		return EXIT_USAGE;
	}
	if (!listen_mode && once) {
		fprintf(stderr, "meshbench: -1 applies to the server (-l) only\n");
		return EXIT_USAGE;
	}
	if (k.iters && k.duration > 0) {
		fprintf(stderr, "meshbench: -n and -D exclude each other\n");
		return EXIT_USAGE;
	}
	if (!listen_mode) {
		if (!parse_u64(argv[optind], 65535, false, &node)) {
			fprintf(stderr, "meshbench: node '%s': expected a node id 0..65535\n", argv[optind]);
			return EXIT_USAGE;
		}
		if (!parse_u64(argv[optind + 1], 65535, false, &port)) {
			fprintf(stderr, "meshbench: port '%s': expected 0..65535\n", argv[optind + 1]);
			return EXIT_USAGE;
		}
		k.node = (uint32_t)node;
		k.port = (uint16_t)port;
		if (!nsizes) {
			sizes[0] = k.test == T_BW ? 65536 : 64;
			nsizes = 1;
		}
		for (int i = 0; i < nsizes && k.test == T_LAT && (k.opts.mask & MESH_OPT_RING_SIZE); i++) {
			if (sizes[i] > k.opts.ring_size) {
				fprintf(stderr, "meshbench: lat: -m %" PRIu64 " does not fit the ring (-r %" PRIu64 ")\n",
					sizes[i], k.opts.ring_size);
				return EXIT_USAGE;
			}
		}
		if (!k.iters && !(k.duration > 0)) {
			if (k.test == T_LAT)
				k.iters = 1000;
			else
				k.duration = 3;
		}
	}
	/* Signals interrupt waits (no SA_RESTART): the server stops between runs, cleanly. */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	ret = mesh_open(sock, &s);
	if (ret) {
		fprintf(stderr, "meshbench: socket %s: %s\n", sock ? sock : "(default)", mesh_strerror(ret));
		return EXIT_FAIL;
	}
	if (listen_mode) {
		ret = run_server(s, (uint16_t)port, once);
	} else {
		for (int i = 0; i < nsizes && !ret && !g_stop; i++)
			ret = client_run(s, &k, sizes[i], i == nsizes - 1, &header_done);
		if (!ret && g_stop)
			ret = -EINTR;
	}
	mesh_session_close(s);
	return ret ? EXIT_FAIL : 0;
}
