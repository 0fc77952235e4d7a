/*
 * The Prometheus endpoint: GET /metrics (and /healthz) over HTTP on cluster.metrics_listen, served by
 * libmicrohttpd in external-polling mode inside meshd's own loop: its epoll descriptor sits in
 * rail 0's epoll set and metrics_http_run() is called when it is readable and on every tick
 * (connection timeouts). No thread of its own, so the text is rendered exactly where the control
 * socket renders its replies: on rail 0's thread, under the daemon's lock; at most every
 * METRICS_HTTP_RENDER_MS, scrapes in between are served the same text.
 *
 * What a client can make meshd do is bounded: METRICS_HTTP_CONNS_MAX connections at once
 * (METRICS_HTTP_CONNS_PER_IP from one address), an idle connection closed after
 * METRICS_HTTP_TIMEOUT_S, any connection METRICS_HTTP_DEADLINE_MS after it was accepted whatever it
 * sends, request headers within METRICS_HTTP_MEMORY bytes. Any other path than /metrics and
 * /healthz is 404, any other method than GET and HEAD 405.
 *
 * GET /healthz answers 200 "ok" when every configured link is UP, else 503 and the links that are
 * not (metrics_health_render), rendered as rarely as /metrics and under the same limits.
 */
#ifndef MESH_MESHD_METRICS_HTTP_H
#define MESH_MESHD_METRICS_HTTP_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "log.h"

/* 16 addresses to take every slot (scrapers need one or two each: Prometheus, a probe, a curl);
 * each slot costs a descriptor and at most METRICS_HTTP_MEMORY. */
#define METRICS_HTTP_CONNS_MAX 64
#define METRICS_HTTP_CONNS_PER_IP 4
#define METRICS_HTTP_BACKLOG 64
/* libmicrohttpd's timeout is one of inactivity, which every byte restarts: clients trickling a byte
 * a second held every slot for as long as they liked. The deadline ends any connection, whatever it
 * sends, that long after its accept; a scraper that keeps its connection alive opens another. */
#define METRICS_HTTP_TIMEOUT_S 5
#define METRICS_HTTP_DEADLINE_MS 10000u
/* A scrape renders the whole text under the daemon's locks on rail 0's thread: a flood of them
 * (6.8k a second) took 40% of that thread. The text is rendered at most this often and the last
 * one served in between, so counters may be up to this old. */
#define METRICS_HTTP_RENDER_MS 250u
#define METRICS_HTTP_MEMORY (16u << 10)
#define METRICS_HTTP_LOG_BURST 10u /* libmicrohttpd's messages per interval, at most */
#define METRICS_HTTP_LOG_INTERVAL_MS 60000u

struct admin;
struct MHD_Daemon;
struct MHD_Response;

/* A connection libmicrohttpd holds, and when it must end. */
struct metrics_http_conn {
	struct MHD_Connection *conn; /* NULL: a free entry */
	uint64_t deadline_ms;
	bool shut; /* shut down at its deadline; libmicrohttpd closes it */
};

/* A text served from the last rendering while it is younger than METRICS_HTTP_RENDER_MS. */
struct metrics_http_text {
	struct MHD_Response *r; /* NULL: none rendered yet */
	uint64_t ms;            /* when it was rendered (util_now_ms) */
	unsigned status;        /* the HTTP status it is served with */
};

struct metrics_http {
	struct MHD_Daemon *mhd;
	int fd; /* MHD's epoll descriptor, -1 when off */
	struct admin *admin;
	char listen[CONFIG_LISTEN_MAX];
	struct log_ratelimit log_rl; /* clients cause libmicrohttpd's messages (limits reached...) */
	struct metrics_http_conn conns[METRICS_HTTP_CONNS_MAX];
	struct metrics_http_text metrics, health; /* /metrics, /healthz */
};

/* Whether listen ("" none) can be served: binds and listens on it as metrics_http_open will, then
 * lets go. 0, or a negative errno with err saying what is wrong ("port 9464 of 127.0.0.1 is in use"). */
int metrics_http_probe(const char *listen, char *err, size_t errlen);

/* Starts serving on listen ("ADDR:PORT", "[V6]:PORT", ":PORT" on 127.0.0.1); "" serves nothing (returns 0,
 * h->fd -1). Returns 0 or a negative errno, logged with the address. */
int metrics_http_open(struct metrics_http *h, const char *listen, struct admin *a);
/* Accepts, reads and answers whatever is ready, closes timed-out connections and those past their
 * deadline; never blocks. */
void metrics_http_run(struct metrics_http *h);
void metrics_http_close(struct metrics_http *h);

#endif
