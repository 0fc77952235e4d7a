/*
 * `meshctl ping` (link_ping.c): round trips to a peer's meshd on the rails of the link, as a local
 * client asked (CTL_OP_PING). A probe is a Keepalive message tagged MESH_PING_TAG (wire.h), sent on
 * the first QP of its rail and answered by the peer's meshd on the same QP; its time is from our post
 * to the answer's arrival. The link layer runs the pings (mesh_tick, the answers); whoever owns the
 * clients (admin_ops.c) is told each result through struct ping_ops.
 */
#ifndef MESH_MESHD_PING_H
#define MESH_MESHD_PING_H

#include <stdbool.h>
#include <stdint.h>

#include <mesh/mesh.h> /* MESH_RAILS_MAX */

#include "wire.h"

#define PING_WINDOW 8 /* probes of one ping in flight on one rail: a round waits for room */

struct mesh;
struct link;

/* One result of a ping, for its client. */
struct ping_result {
	uint32_t rail, seq; /* seq 1..count */
	int status;         /* 0: answered in rtt_us; else why not (-ETIMEDOUT, -ENETDOWN, -ENOBUFS) */
	uint64_t rtt_us;
	bool done;          /* the ping is over: nothing follows (rail and seq mean nothing then) */
};

struct ping_ops {
	/* Tells client fd a result; non-zero: it cannot take it, and the ping stops. */
	int (*report)(void *ctx, int fd, const struct ping_result *res);
	void *ctx;
};

struct ping {
	int fd;            /* the client's connection; -1: a free entry */
	uint32_t uid;
	uint32_t id;       /* in the probes' seq (MESH_PING_SEQ), 1..2^31-1 */
	uint32_t peer;
	uint32_t rails;    /* bitmap of the rails probed */
	uint32_t count, sent, interval_ms, timeout_ms;
	uint64_t next_ms;  /* when the next round is due */
	uint32_t n_flight[MESH_RAILS_MAX];
	struct ping_probe {
		uint32_t seq;
		uint64_t sent_us; /* the clock at the post: the round trip's start */
		uint64_t sent_ms; /* the tick's time at the post: its timeout's start */
	} flight[MESH_RAILS_MAX][PING_WINDOW];
};

struct mesh_pings {
	struct ping p[MESH_PING_MAX];
	uint32_t last_id;
	struct ping_ops ops;
	char why[160]; /* ping_start's refusal */
};

/* What a client asked for (checked by mesh_ctl_req_decode already). */
struct ping_request {
	uint32_t peer;
	int rail;          /* -1: every rail of the link */
	uint32_t count, interval_ms, timeout_ms;
	uint32_t uid;
	bool privileged;   /* root or meshd's own user: not held to MESH_PING_PER_UID */
};

void ping_init(struct mesh *m);
/* Starts a ping for client fd: 0 with the rails it probes (*rails), or a negative errno and *why.
 * Its first round goes with the next ping_tick, which the caller may run at once. */
int ping_start(struct mesh *m, int fd, const struct ping_request *rq, uint32_t *rails, const char **why);
/* The client of fd is gone: its ping stops, unreported. */
void ping_client_gone(struct mesh *m, int fd);
/* Rounds that are due, probes that timed out, pings that are over (mesh_tick). */
void ping_tick(struct mesh *m, uint64_t now_ms);
/* A result's status in words, for the client. */
const char *ping_status_text(int status);
/* The answer to a probe (a KeepaliveAck whose seq has MESH_PING_TAG) on rail r of link l. */
void ping_on_ack(struct link *l, uint32_t r, uint64_t seq);

#endif
