/*
 * cm_mesh: one node of a raw rdma_cm full mesh, the reference that meshd's formation is measured
 * against (tests/bench/formation.py --raw-cm). It does what forming a mesh costs rdma_cm and the
 * verbs alone, and nothing of meshd's: node NODE of NODES listens on ADDR:PORT+NODE and, like meshd,
 * dials every lower node with QPS RC queue pairs (the higher id dials the lower); every QP has its
 * own CQ, as meshd's do. A refused or unreachable dial (the lower node's listener is not up yet: all
 * start at once) is retried after a backoff that starts at 50 ms and doubles up to 1 s (what
 * formation.py gives meshd). No Hello, no keys, no proof, no admission limit.
 *
 *   cm_mesh -n NODE -N NODES -a ADDR -p PORT [-q QPS] [-T SECONDS]
 *
 * Prints one JSON line once all (NODES - 1) * QPS connections of this node are ESTABLISHED:
 * {"node":N,"established":C,"mono_ms":M,"attempts":A}, M on CLOCK_MONOTONIC (the clock of Python's
 * time.monotonic), then keeps its connections until SIGTERM or SIGINT (exit 0) so that its peers
 * finish too. Exit status 1 on bad arguments, 2 on a verbs or rdma_cm failure or when the mesh is
 * not complete within -T seconds (default 300): it never hangs.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define CM_MAGIC 0x434d4d53u /* "CMMS" */
#define MAX_NODES 1024
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000

struct pdata {
	uint32_t magic;
	uint16_t from, qp;
};

/* One dialled QP: its id while it connects, its retry time while it waits. */
struct dial {
	struct rdma_cm_id *id;
	struct ibv_cq *cq;
	uint16_t peer, qp;
	uint64_t retry_ms;
	uint32_t backoff_ms;
	int done;
};

static volatile sig_atomic_t g_stop;
static struct ibv_pd *g_pd;
static struct ibv_context *g_verbs;

static void on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int usage(void)
{
	fprintf(stderr, "usage: cm_mesh -n NODE -N NODES -a ADDR -p PORT [-q QPS] [-T SECONDS]\n");
	return 1;
}

/* The PD of the (one) device the ids resolve to; every QP of this process uses it. */
static struct ibv_pd *pd_for(struct ibv_context *verbs)
{
	if (!g_pd) {
		g_verbs = verbs;
		g_pd = ibv_alloc_pd(verbs);
		if (!g_pd)
			perror("cm_mesh: ibv_alloc_pd");
	} else if (verbs != g_verbs) {
		fprintf(stderr, "cm_mesh: ids on two devices: one address, one device expected\n");
		return NULL;
	}
	return g_pd;
}

/* An RC QP on its own CQ, as meshd creates them. */
static int qp_create(struct rdma_cm_id *id, struct ibv_cq **cq_out)
{
	struct ibv_pd *pd = pd_for(id->verbs);
	struct ibv_qp_init_attr qa = {0};
	struct ibv_cq *cq;

	if (!pd)
		return -1;
	cq = ibv_create_cq(id->verbs, 64, NULL, NULL, 0);
	if (!cq) {
		perror("cm_mesh: ibv_create_cq");
		return -1;
	}
	qa.send_cq = qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 16;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, pd, &qa)) {
		perror("cm_mesh: rdma_create_qp");
		ibv_destroy_cq(cq);
		return -1;
	}
	*cq_out = cq;
	return 0;
}

static int dial_start(struct rdma_event_channel *ch, struct dial *d, const struct sockaddr_in *dst)
{
	if (rdma_create_id(ch, &d->id, d, RDMA_PS_TCP)) {
		perror("cm_mesh: rdma_create_id");
		return -1;
	}
	if (rdma_resolve_addr(d->id, NULL, (struct sockaddr *)dst, 4000)) {
		perror("cm_mesh: rdma_resolve_addr");
		return -1;
	}
	return 0;
}

/* A dial that failed: its id and QP go (after the event was acked), it is retried later. */
static void dial_fail(struct dial *d, uint64_t now)
{
	if (d->id) {
		if (d->id->qp)
			rdma_destroy_qp(d->id);
		rdma_destroy_id(d->id);
		d->id = NULL;
	}
	if (d->cq) {
		ibv_destroy_cq(d->cq);
		d->cq = NULL;
	}
	d->retry_ms = now + d->backoff_ms;
	d->backoff_ms = d->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : d->backoff_ms * 2;
}

int main(int argc, char **argv)
{
	unsigned node = 0, nodes = 0, qps = 2, port = 0, timeout_s = 300;
	const char *addr = NULL;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen_id;
	struct sockaddr_in sin = {.sin_family = AF_INET};
	struct dial *dials;
	size_t n_dials, established = 0, want, attempts = 0;
	uint64_t deadline;
	int c, printed = 0;

	while ((c = getopt(argc, argv, "n:N:a:p:q:T:")) != -1) {
		switch (c) {
		case 'n': node = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'N': nodes = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'a': addr = optarg; break;
		case 'p': port = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'q': qps = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'T': timeout_s = (unsigned)strtoul(optarg, NULL, 10); break;
		default: return usage();
		}
	}
	if (!addr || node < 1 || node > nodes || nodes > MAX_NODES || qps < 1 || qps > 16 || !port ||
	    port + nodes > 65535 || inet_pton(AF_INET, addr, &sin.sin_addr) != 1)
		return usage();
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	deadline = now_ms() + (uint64_t)timeout_s * 1000u;
	want = (size_t)(nodes - 1) * qps;

	ch = rdma_create_event_channel();
	if (!ch) {
		perror("cm_mesh: rdma_create_event_channel");
		return 2;
	}
	if (rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP)) {
		perror("cm_mesh: rdma_create_id");
		return 2;
	}
	sin.sin_port = htons((uint16_t)(port + node));
	if (rdma_bind_addr(listen_id, (struct sockaddr *)&sin) || rdma_listen(listen_id, 1024)) {
		perror("cm_mesh: bind/listen");
		return 2;
	}
	n_dials = (size_t)(node - 1) * qps;
	dials = calloc(n_dials ? n_dials : 1, sizeof(*dials));
	if (!dials)
		return 2;
	for (size_t i = 0; i < n_dials; i++) {
		dials[i].peer = (uint16_t)(1 + i / qps);
		dials[i].qp = (uint16_t)(i % qps);
		dials[i].backoff_ms = BACKOFF_MIN_MS;
		dials[i].retry_ms = 0; /* at once */
	}

	while (!g_stop) {
		struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
		struct rdma_cm_event *ev;
		uint64_t now = now_ms();

		if (!printed && now > deadline) {
			fprintf(stderr, "cm_mesh %u: %zu of %zu connections after %u s\n", node, established, want, timeout_s);
			return 2;
		}
		for (size_t i = 0; i < n_dials; i++) {
			struct dial *d = &dials[i];

			if (!d->done && !d->id && d->retry_ms <= now) {
				struct sockaddr_in dst = sin;

				dst.sin_port = htons((uint16_t)(port + d->peer));
				attempts++;
				if (dial_start(ch, d, &dst))
					return 2;
			}
		}
		if (!printed && established == want) {
			printf("{\"node\":%u,\"established\":%zu,\"mono_ms\":%llu,\"attempts\":%zu}\n", node, established,
			       (unsigned long long)now_ms(), attempts);
			fflush(stdout);
			printed = 1;
		}
		if (poll(&pfd, 1, 20) <= 0)
			continue;
		if (rdma_get_cm_event(ch, &ev))
			continue;
		{
			struct rdma_cm_id *id = ev->id;
			struct dial *d = ev->listen_id ? NULL : id->context;
			enum rdma_cm_event_type type = ev->event;
			struct pdata pd = {0};

			if (type == RDMA_CM_EVENT_CONNECT_REQUEST && ev->param.conn.private_data &&
			    ev->param.conn.private_data_len >= sizeof(pd))
				memcpy(&pd, ev->param.conn.private_data, sizeof(pd));
			rdma_ack_cm_event(ev);
			switch (type) {
			case RDMA_CM_EVENT_ADDR_RESOLVED:
				if (rdma_resolve_route(id, 4000))
					dial_fail(d, now_ms());
				break;
			case RDMA_CM_EVENT_ROUTE_RESOLVED: {
				struct rdma_conn_param cp = {0};
				struct pdata out = {CM_MAGIC, (uint16_t)node, d->qp};

				if (qp_create(id, &d->cq)) {
					dial_fail(d, now_ms());
					break;
				}
				cp.private_data = &out;
				cp.private_data_len = sizeof(out);
				cp.responder_resources = cp.initiator_depth = 1;
				cp.retry_count = 7;
				cp.rnr_retry_count = 7;
				if (rdma_connect(id, &cp))
					dial_fail(d, now_ms());
				break;
			}
			case RDMA_CM_EVENT_CONNECT_REQUEST: {
				struct rdma_conn_param cp = {0};
				struct ibv_cq *cq;

				if (pd.magic != CM_MAGIC || pd.from <= node || pd.from > nodes || qp_create(id, &cq)) {
					rdma_reject(id, NULL, 0);
					rdma_destroy_id(id);
					break;
				}
				cp.responder_resources = cp.initiator_depth = 1;
				if (rdma_accept(id, &cp)) {
					perror("cm_mesh: rdma_accept");
					return 2;
				}
				break;
			}
			case RDMA_CM_EVENT_ESTABLISHED:
				established++;
				if (d)
					d->done = 1;
				break;
			case RDMA_CM_EVENT_ADDR_ERROR:
			case RDMA_CM_EVENT_ROUTE_ERROR:
			case RDMA_CM_EVENT_CONNECT_ERROR:
			case RDMA_CM_EVENT_UNREACHABLE:
			case RDMA_CM_EVENT_REJECTED:
				if (d && !d->done)
					dial_fail(d, now_ms());
				break;
			case RDMA_CM_EVENT_DISCONNECTED:
				/* A peer that stopped (the run is over): nothing to form any more. */
				break;
			default:
				break;
			}
		}
	}
	return 0;
}
