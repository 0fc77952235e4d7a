/*
 * chan_test: one end of a verified stream through libmesh, for the channel integration tests.
 *
 *   chan_test [-s SOCK] send NODE PORT BYTES [-r RING] [-q QPS] [-S SEED] [-R BYTES_PER_S] [-z]
 *       connects, sends a 24-byte header (magic, seed, length) and BYTES bytes of a pseudo-random
 *       stream derived from SEED, shuts its side, waits for the peer to close; -z uses zero-copy
 *       reserve/commit instead of mesh_send; -R paces the stream (a slow producer, so that it
 *       outlasts the faults a test makes under it).
 *   chan_test [-s SOCK] recv PORT COUNT [-p PAUSE_MS] [-a AFTER_BYTES] [-z]
 *       accepts COUNT channels and serves them together (poll over non-blocking channels); checks
 *       every byte against the stream its header announces, and the length at EOF, then closes;
 *       -p pauses reading PAUSE_MS once AFTER_BYTES arrived (a slow reader), -z uses peek/release.
 *
 * Prints one line per channel ("ok ..." or "FAIL ...") and exits 0 only when every channel was
 * complete and correct.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mesh/mesh.h>

#define HDR_MAGIC 0x43484e54u /* "CHNT" */
#define MAX_CH 64
#define BUF 65536

struct hdr {
	uint32_t magic;
	uint32_t reserved;
	uint64_t seed;
	uint64_t len;
};

/* The stream: byte i of seed s, computed 8 bytes at a time (splitmix64 of the block index). */
static uint64_t block(uint64_t seed, uint64_t i)
{
	uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void stream_fill(uint64_t seed, uint64_t off, uint8_t *p, size_t n)
{
	size_t k = 0;

	/* Unaligned head and tail byte by byte, whole 8-byte blocks at once (cheap under emulation). */
	while (k < n && (off + k) % 8)
		p[k] = (uint8_t)(block(seed, (off + k) / 8) >> (8 * ((off + k) % 8))), k++;
	for (; k + 8 <= n; k += 8) {
		uint64_t b = block(seed, (off + k) / 8);

		memcpy(p + k, &b, 8);
	}
	for (; k < n; k++)
		p[k] = (uint8_t)(block(seed, (off + k) / 8) >> (8 * ((off + k) % 8)));
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int usage(void)
{
	fprintf(stderr, "usage: chan_test [-s SOCK] send NODE PORT BYTES [-r RING] [-q QPS] [-S SEED] [-R BYTES_PER_S] [-z]\n"
			"       chan_test [-s SOCK] recv PORT COUNT [-p PAUSE_MS] [-a AFTER_BYTES] [-z]\n");
	return 2;
}

static int do_send(mesh_session_t *s, int argc, char **argv)
{
	struct mesh_channel_opts o = {0};
	uint32_t node;
	uint16_t port;
	uint64_t len, seed = 1, off = 0, rate = 0;
	struct timespec t0;
	bool zc = false;
	mesh_channel_t *c;
	struct hdr h;
	uint8_t *buf = malloc(BUF);
	size_t hoff = 0;
	int opt, ret;
	ssize_t n;

	if (argc < 4 || !buf) {
		free(buf);
		return usage();
	}
	node = (uint32_t)strtoul(argv[1], NULL, 0);
	port = (uint16_t)strtoul(argv[2], NULL, 0);
	len = strtoull(argv[3], NULL, 0);
	optind = 4;
	while ((opt = getopt(argc, argv, "r:q:S:R:z")) != -1) {
		switch (opt) {
		case 'R':
			rate = strtoull(optarg, NULL, 0);
			break;
		case 'r':
			o.mask |= MESH_OPT_RING_SIZE;
			o.ring_size = strtoull(optarg, NULL, 0);
			break;
		case 'q':
			o.mask |= MESH_OPT_QPS;
			o.qps = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'S':
			seed = strtoull(optarg, NULL, 0);
			break;
		case 'z':
			zc = true;
			break;
		default:
			free(buf);
			return usage();
		}
	}
	ret = mesh_connect(s, node, port, &o, &c);
	if (ret) {
		printf("FAIL connect to node %u port %u: %s\n", node, port, mesh_strerror(ret));
		free(buf);
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	h = (struct hdr){.magic = HDR_MAGIC, .seed = seed, .len = len};
	while (hoff < sizeof(h)) {
		n = mesh_send(c, (uint8_t *)&h + hoff, sizeof(h) - hoff, 0);
		if (n < 0)
			goto fail;
		hoff += (size_t)n;
	}
	while (off < len) {
		if (rate) {
			struct timespec t;
			double ahead;

			clock_gettime(CLOCK_MONOTONIC, &t);
			ahead = (double)off / (double)rate - ((double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9);
			if (ahead > 0)
				usleep((useconds_t)(ahead * 1e6));
		}
		if (zc) {
			void *p;

			n = mesh_send_reserve(c, &p, 0);
			if (n < 0)
				goto fail;
			n = (ssize_t)(len - off < (uint64_t)n ? len - off : (uint64_t)n);
			stream_fill(seed, off, p, (size_t)n);
			ret = mesh_send_commit(c, (size_t)n);
			if (ret) {
				n = ret;
				goto fail;
			}
		} else {
			size_t want = len - off < BUF ? (size_t)(len - off) : BUF;

			stream_fill(seed, off, buf, want);
			for (size_t done = 0; done < want; done += (size_t)n) {
				n = mesh_send(c, buf + done, want - done, 0);
				if (n < 0)
					goto fail;
			}
			n = (ssize_t)want;
		}
		off += (uint64_t)n;
	}
	ret = mesh_shutdown(c);
	if (ret) {
		n = ret;
		goto fail;
	}
	/* The peer closes once it has everything: then every byte went through. */
	n = mesh_recv(c, buf, BUF, 0);
	if (n != 0)
		goto fail;
	printf("ok sent %" PRIu64 " bytes to node %u port %u\n", len, node, port);
	mesh_close(c);
	free(buf);
	return 0;
fail:
	printf("FAIL sending to node %u port %u after %" PRIu64 " of %" PRIu64 " bytes: %s\n", node, port, off, len,
	       n < 0 ? mesh_strerror((int)n) : "unexpected data from the receiver");
	mesh_close(c);
	free(buf);
	return 1;
}

#define GAPS 8 /* the longest pauses between a channel's bytes, reported at its end */

struct rx {
	mesh_channel_t *c;
	struct hdr h;
	size_t hoff;
	uint64_t got;
	bool done, failed;
	uint64_t last_ms;       /* when bytes last came (0: not yet) */
	uint64_t gaps[GAPS];    /* the longest pauses between them, ms, longest first */
};

/* Bytes came now: the pause since the last ones joins the longest, if it is one of them. What an
 * application sees of a restart of its meshd or an outage (restart_test prints it). */
static void rx_note(struct rx *r)
{
	uint64_t t = now_ms(), gap = r->last_ms ? t - r->last_ms : 0;

	r->last_ms = t;
	for (int i = 0; i < GAPS; i++) {
		if (gap > r->gaps[i]) {
			uint64_t g = r->gaps[i];

			r->gaps[i] = gap;
			gap = g;
		}
	}
}

/* A channel's stream arrived whole: its length, seed and longest pauses, longest first. */
static void rx_ok(const struct rx *r)
{
	printf("ok received %" PRIu64 " bytes (seed %" PRIu64 "; longest pauses", r->got, r->h.seed);
	for (int i = 0; i < GAPS; i++)
		printf(" %" PRIu64, r->gaps[i]);
	printf(" ms)\n");
}

static int do_recv(mesh_session_t *s, int argc, char **argv)
{
	uint16_t port;
	int count, opt, ret, accepted = 0, finished = 0, bad = 0;
	uint64_t pause_ms = 0, after = 0, total = 0, paused_until = 0;
	bool zc = false, paused_once = false;
	mesh_listener_t *l;
	struct rx rx[MAX_CH];
	uint8_t *buf = malloc(BUF), *want = malloc(BUF);

	if (argc < 3 || !buf || !want)
		return usage();
	port = (uint16_t)strtoul(argv[1], NULL, 0);
	count = atoi(argv[2]);
	if (count < 1 || count > MAX_CH)
		return usage();
	optind = 3;
	while ((opt = getopt(argc, argv, "p:a:z")) != -1) {
		switch (opt) {
		case 'p':
			pause_ms = strtoull(optarg, NULL, 0);
			break;
		case 'a':
			after = strtoull(optarg, NULL, 0);
			break;
		case 'z':
			zc = true;
			break;
		default:
			return usage();
		}
	}
	ret = mesh_listen(s, port, &l);
	if (ret) {
		printf("FAIL listen on port %u: %s\n", port, mesh_strerror(ret));
		return 1;
	}
	printf("listening on port %u\n", port);
	fflush(stdout);
	memset(rx, 0, sizeof(rx));
	while (finished < count) {
		struct pollfd pfd[MAX_CH + 1];
		int np = 0;

		if (accepted < count) {
			pfd[np].fd = mesh_listener_fd(l);
			pfd[np++].events = POLLIN;
		}
		for (int i = 0; i < accepted; i++) {
			pfd[np].fd = rx[i].done ? -1 : mesh_channel_fd(rx[i].c);
			pfd[np++].events = POLLIN;
		}
		if (poll(pfd, (nfds_t)np, 100) < 0 && errno != EINTR)
			break;
		while (accepted < count) {
			ret = mesh_accept(l, MESH_NONBLOCK, &rx[accepted].c);
			if (ret == -EAGAIN)
				break;
			if (ret) {
				printf("FAIL accept: %s\n", mesh_strerror(ret));
				return 1;
			}
			accepted++;
		}
		if (paused_until && now_ms() < paused_until)
			continue;
		paused_until = 0;
		for (int i = 0; i < accepted; i++) {
			struct rx *r = &rx[i];
			ssize_t n;

			if (r->done)
				continue;
			for (;;) {
				const void *p;

				if (pause_ms && !paused_once && total >= after) {
					paused_once = true;
					paused_until = now_ms() + pause_ms;
					printf("pausing the reader for %" PRIu64 " ms after %" PRIu64 " bytes\n", pause_ms, total);
					fflush(stdout);
					break;
				}
				if (zc) {
					n = mesh_recv_peek(r->c, &p, MESH_NONBLOCK);
					if (n > BUF)
						n = BUF;
					if (n > 0)
						memcpy(buf, p, (size_t)n);
				} else {
					n = mesh_recv(r->c, buf, BUF, MESH_NONBLOCK);
				}
				if (n == -EAGAIN)
					break;
				if (n <= 0) {
					if (n < 0)
						printf("FAIL channel %d: %s after %" PRIu64 " bytes\n", i, mesh_strerror((int)n),
						       r->got);
					else if (r->hoff < sizeof(r->h) || r->got != r->h.len)
						printf("FAIL channel %d: EOF after %" PRIu64 " of %" PRIu64 " bytes\n", i, r->got,
						       r->h.len);
					else
						rx_ok(r);
					r->failed = n < 0 || r->hoff < sizeof(r->h) || r->got != r->h.len;
					bad += r->failed;
					r->done = true;
					finished++;
					mesh_close(r->c);
					break;
				}
				{
					size_t k = 0;

					while (r->hoff < sizeof(r->h) && k < (size_t)n)
						((uint8_t *)&r->h)[r->hoff++] = buf[k++];
					if (r->hoff == sizeof(r->h) && r->h.magic != HDR_MAGIC) {
						printf("FAIL channel %d: bad header\n", i);
						return 1;
					}
					if (k < (size_t)n) {
						stream_fill(r->h.seed, r->got, want, (size_t)n - k);
						if (memcmp(buf + k, want, (size_t)n - k) || r->got + ((size_t)n - k) > r->h.len) {
							printf("FAIL channel %d: wrong bytes at %" PRIu64 "\n", i, r->got);
							return 1;
						}
						r->got += (size_t)n - k;
						total += (size_t)n - k;
						rx_note(r);
					}
				}
				if (zc && (ret = mesh_recv_release(r->c, (size_t)n))) {
					printf("FAIL release: %s\n", mesh_strerror(ret));
					return 1;
				}
			}
		}
	}
	mesh_listener_close(l);
	free(buf);
	free(want);
	printf("%d channels, %d correct\n", count, count - bad);
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	const char *sock = NULL;
	mesh_session_t *s;
	int ret;

	if (argc > 2 && !strcmp(argv[1], "-s")) {
		sock = argv[2];
		argc -= 2;
		argv += 2;
	}
	if (argc < 2)
		return usage();
	ret = mesh_open(sock, &s);
	if (ret) {
		fprintf(stderr, "chan_test: %s\n", mesh_strerror(ret));
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(argv[1], "send"))
		ret = do_send(s, argc - 1, argv + 1);
	else if (!strcmp(argv[1], "recv"))
		ret = do_recv(s, argc - 1, argv + 1);
	else
		ret = usage();
	mesh_session_close(s);
	return ret;
}
