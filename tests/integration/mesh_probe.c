/*
 * mesh_probe: plays a hostile or confused peer against a running meshd, through the same
 * transport layer meshd uses. It dials addr:port with private data built from the options
 * (any cluster name, source and destination ids, version, QP count, epoch, or raw bytes), and
 * reports whether meshd accepted or rejected, with the reason from the reject's private data.
 *
 *   mesh_probe [-t rdma|tcp] -a ADDR -p PORT [-S SRC_ADDR] --src ID --dst ID --cluster NAME
 *              [--version V] [--qps N] [--epoch E] [--garbage] [--expect accept|reject:CODE]
 *
 * Exit status: 0 when the outcome matches --expect (or, without --expect, on any answer),
 * 1 on a mismatch, 2 on a usage or transport error, 3 when no answer came in time.
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mesh/mesh.h>

#include "transport.h"
#include "util.h"
#include "wire.h"

#define PROBE_TIMEOUT_MS 30000

static void usage(void)
{
	fprintf(stderr, "usage: mesh_probe [-t rdma|tcp] -a ADDR -p PORT [-S SRC_ADDR] --src ID --dst ID --cluster NAME\n"
			"                  [--version V] [--qps N] [--qp-index I] [--epoch E] [--garbage]\n"
			"                  [--expect accept|reject|reject:CODE]\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"src", required_argument, NULL, 1},     {"dst", required_argument, NULL, 2},
		{"cluster", required_argument, NULL, 3}, {"version", required_argument, NULL, 4},
		{"qps", required_argument, NULL, 5},     {"epoch", required_argument, NULL, 6},
		{"garbage", no_argument, NULL, 7},       {"expect", required_argument, NULL, 8},
		{"qp-index", required_argument, NULL, 9}, {NULL, 0, NULL, 0},
	};
	const char *addr = NULL, *src_addr = NULL, *cluster = "demo", *expect = NULL;
	const struct xport_ops *ops = &xport_rdma_ops;
	struct mesh_cm_pdata pd = {.kind = MESH_CM_CONNECT, .qp_count = 2};
	struct xport_attr xa = {.connect_timeout_ms = 5000, .max_send_wr = 8, .max_recv_wr = 8};
	unsigned version = MESH_CM_VERSION;
	uint8_t pdata[XPORT_CONNECT_PDATA_MAX];
	uint16_t port = 0;
	bool garbage = false;
	xport_t *x;
	xport_conn_t *conn;
	int c, ret, len, rc = 3, leak = 0;
	uint64_t deadline;

	while ((c = getopt_long(argc, argv, "t:a:p:S:", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			ops = xport_ops_find(optarg);
			if (!ops) {
				fprintf(stderr, "mesh_probe: unknown transport %s\n", optarg);
				return 2;
			}
			break;
		case 'a': addr = optarg; break;
		case 'p': port = (uint16_t)atoi(optarg); break;
		case 'S': src_addr = optarg; break;
		case 1: pd.src_node = (uint16_t)atoi(optarg); break;
		case 2: pd.dst_node = (uint16_t)atoi(optarg); break;
		case 3: cluster = optarg; break;
		case 4: version = (unsigned)atoi(optarg); break;
		case 5: pd.qp_count = (uint8_t)atoi(optarg); break;
		case 6: pd.link_epoch = strtoull(optarg, NULL, 0); break;
		case 7: garbage = true; break;
		case 8: expect = optarg; break;
		case 9: pd.qp_index = (uint8_t)atoi(optarg); break;
		default: usage(); return 2;
		}
	}
	if (!addr || !port) {
		usage();
		return 2;
	}
	if (!pd.link_epoch)
		pd.link_epoch = util_wall_us();
	pd.cluster_hash = mesh_cluster_hash(cluster);
	pd.boot_epoch = util_wall_us();
	len = mesh_cm_pdata_encode(&pd, pdata, sizeof(pdata));
	pdata[4] = (uint8_t)version; /* struct mesh_cm_wire.version */
	if (garbage) {
		/* All 56 bytes, as the CM pads them: the magic is what fails. */
		for (size_t i = 0; i < sizeof(pdata); i++)
			pdata[i] = (uint8_t)util_rand64();
		len = (int)sizeof(pdata);
	}
	ret = xport_create(ops, &xa, &x);
	if (ret) {
		fprintf(stderr, "mesh_probe: transport: %s\n", mesh_strerror(ret));
		return 2;
	}
	ret = xport_connect(x, src_addr, addr, port, pdata, (size_t)len, &rc, 0, &conn);
	if (ret) {
		fprintf(stderr, "mesh_probe: connect: %s\n", mesh_strerror(ret));
		xport_destroy(x);
		return 2;
	}
	deadline = util_now_ms() + PROBE_TIMEOUT_MS;
	while (rc == 3 && util_now_ms() < deadline) {
		struct pollfd pfd = {.fd = xport_event_fd(x), .events = POLLIN};
		struct xport_event ev;
		char got[96];

		poll(&pfd, 1, 100);
		while (rc == 3 && xport_poll(x, &ev, 1) == 1) {
			struct mesh_cm_pdata rep;

			if (ev.type == XPORT_EV_ESTABLISHED) {
				snprintf(got, sizeof(got), "accept");
			} else if (ev.type == XPORT_EV_REJECTED) {
				if (!mesh_cm_pdata_decode(ev.pdata, ev.pdata_len, &rep) && rep.kind == MESH_CM_REJECT) {
					snprintf(got, sizeof(got), "reject:%d", -rep.reason);
					/* A refusal tells a stranger nothing about the cluster. */
					if (rep.cluster_hash || rep.src_node || rep.dst_node || rep.link_epoch || rep.boot_epoch) {
						printf("the reject reveals cluster hash 0x%08x, node %u, epochs %llu/%llu\n",
						       rep.cluster_hash, rep.src_node, (unsigned long long)rep.link_epoch,
						       (unsigned long long)rep.boot_epoch);
						leak = 1;
					}
				} else
					snprintf(got, sizeof(got), "reject:none");
			} else if (ev.type == XPORT_EV_CONNECT_ERROR) {
				snprintf(got, sizeof(got), "error:%s", ev.status_str ? ev.status_str : "?");
			} else {
				continue;
			}
			printf("%s", got);
			if (!strncmp(got, "reject:", 7) && strcmp(got, "reject:none"))
				printf(" (%s)", mesh_strerror(-atoi(got + 7)));
			printf("\n");
			if (leak)
				rc = 1;
			else if (!expect)
				rc = 0;
			else if (!strcmp(expect, got) || (!strcmp(expect, "reject") && !strncmp(got, "reject:", 7)))
				rc = 0;
			else
				rc = 1;
		}
	}
	if (rc == 3)
		fprintf(stderr, "mesh_probe: no answer within %d ms\n", PROBE_TIMEOUT_MS);
	else if (rc == 1)
		fprintf(stderr, "mesh_probe: expected %s\n", expect);
	xport_disconnect(conn);
	xport_conn_destroy(conn);
	xport_destroy(x);
	return rc;
}
