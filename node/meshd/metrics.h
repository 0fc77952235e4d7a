/*
 * Metrics: the counters meshd keeps for Prometheus beyond what the link and channel code already
 * counts, and one renderer of the text exposition format (version 0.0.4) that both the HTTP
 * endpoint (metrics_http.h, cluster.metrics_listen) and `meshctl metrics` (the control socket)
 * serve, so the two never differ.
 *
 * Names carry the rdmamesh_ prefix (but the process_* families, named as every Prometheus client
 * library names them), values are in base units (bytes, seconds), counters end in _total; every
 * family has its HELP and TYPE lines. Labels: peer (node id), rail, transport,
 * reason, direction, state. The renderer reads the mesh and must run where the control socket
 * runs: on rail 0's thread, under the daemon's lock.
 *
 * The counting (the inlines below, metrics_count.c) calls nothing of meshd, so the link code
 * stands on it; the renderer (metrics.c) stands on the link code.
 */
#ifndef MESH_MESHD_METRICS_H
#define MESH_MESHD_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mesh/mesh.h> /* MESH_RAILS_MAX */

/* Why a link attempt or an UP link ended: the error of link_fail() folded into a fixed set of
 * label values, so that whatever a peer sends, the series stay few. */
enum metrics_reason {
	METRICS_REASON_KEEPALIVE,         /* MESH_EKEEPALIVE: the peer went silent */
	METRICS_REASON_SHUTDOWN,          /* MESH_ESHUTDOWN: the peer said goodbye, or we stop */
	METRICS_REASON_HANDSHAKE_TIMEOUT, /* MESH_EHANDSHAKE */
	METRICS_REASON_NO_ANSWER,         /* ETIMEDOUT: a dial nobody answered */
	METRICS_REASON_REFUSED,           /* the peer refused (ECONNREFUSED, MESH_EREFUSED) */
	METRICS_REASON_BUSY,              /* MESH_EBUSY */
	METRICS_REASON_STALE,             /* MESH_ESTALE: a newer attempt replaced it */
	METRICS_REASON_AUTH,              /* MESH_EAUTH: the cluster key was not proven */
	METRICS_REASON_PROOF,             /* MESH_EPROOF: the mailbox key failed its proof */
	METRICS_REASON_MISMATCH,          /* the peer is configured otherwise (cluster, QPs, version, ids) */
	METRICS_REASON_PROTOCOL,          /* malformed or unexpected messages or private data */
	METRICS_REASON_CONNECTION,        /* a QP or connection failed or was lost */
	METRICS_REASON_RESOURCES,         /* out of memory or queue room here */
	METRICS_REASON_OTHER,
	METRICS_REASONS,
};

/* The label value of a reason ("keepalive", "handshake_timeout", ...). */
const char *metrics_reason_name(enum metrics_reason r);
/* The reason of a negative errno or MESH_E* code. */
enum metrics_reason metrics_reason_of(int err);

/* Keepalive round trips as a Prometheus histogram (rdmamesh_link_rtt_seconds): upper bounds of
 * its buckets in microseconds, 10 us (RDMA within a rack) to 1 s (TCP on a loaded LAN, beyond any
 * keepalive timeout worth having), 1-2.5-5 per decade. A sample above the last is counted in +Inf
 * only. */
#define METRICS_RTT_BUCKETS 16
extern const uint32_t metrics_rtt_bounds_us[METRICS_RTT_BUCKETS];

/* One rail's round trips: n[b] the samples of bucket b alone (at most its bound, above the one
 * before), n[METRICS_RTT_BUCKETS] those above every bound. The renderer adds them up into the
 * cumulative buckets, so a sample costs one increment (and a scan of a few bounds). */
struct metrics_rtt {
	uint64_t n[METRICS_RTT_BUCKETS + 1];
	uint64_t sum_us;
};

/* The bucket of a sample of us microseconds: the first whose bound is at least us, or
 * METRICS_RTT_BUCKETS (+Inf only). */
static inline uint32_t metrics_rtt_bucket(uint64_t us)
{
	uint32_t b = 0;

	while (b < METRICS_RTT_BUCKETS && us > metrics_rtt_bounds_us[b])
		b++;
	return b;
}

/* Counters of one link (struct link embeds it), for its whole life: link attempts come and go,
 * these only grow. */
struct link_metrics {
	uint64_t downs[METRICS_REASONS];       /* the UP link went DOWN */
	uint64_t hs_failures[METRICS_REASONS]; /* attempts that ended before UP */
	/* Keepalives per rail: a keepalive whose ack had not come back by the time the next one was
	 * due is a miss. */
	uint64_t ka_sent[MESH_RAILS_MAX], ka_acked[MESH_RAILS_MAX], ka_misses[MESH_RAILS_MAX];
	/* Round trips of the keepalives per rail: one sample per ack of a keepalive we sent (rail 0
	 * with MESH_FEAT_KA_WRITE: the completion of the latest write). */
	struct metrics_rtt rtt[MESH_RAILS_MAX];
	/* Channel payload over the link: bytes and chunks (RDMA writes) each way, credit stalls. */
	uint64_t tx_bytes, rx_bytes, tx_chunks, rx_chunks, credit_stalls;
	uint64_t channel_resumes;
	/* Channels that opened over the link (either side asked), and grants of a sending half to one
	 * of our applications (cluster.app_send: its own QP or TCP connection). */
	uint64_t channels_opened, app_grants;
};

/* An attempt (was_up false) or an UP link (was_up true) ended with err. */
static inline void link_metrics_failed(struct link_metrics *lm, bool was_up, int err)
{
	if (was_up)
		lm->downs[metrics_reason_of(err)]++;
	else
		lm->hs_failures[metrics_reason_of(err)]++;
}

/* Keepalive seq goes out on rail r; an ack of seq came back on rail r (a peer may echo anything:
 * only a seq we sent counts). */
static inline void link_metrics_ka_sent(struct link_metrics *lm, uint32_t r, uint64_t seq)
{
	if (r >= MESH_RAILS_MAX)
		return;
	if (lm->ka_sent[r] > lm->ka_acked[r])
		lm->ka_misses[r]++;
	lm->ka_sent[r] = seq;
}

/* True when the ack counted: its seq was sent on the rail and is newer than any acked before, so
 * the caller may take its round trip as a sample (once per keepalive, whatever the peer echoes). */
static inline bool link_metrics_ka_acked(struct link_metrics *lm, uint32_t r, uint64_t seq)
{
	if (r >= MESH_RAILS_MAX || seq > lm->ka_sent[r] || seq <= lm->ka_acked[r])
		return false;
	lm->ka_acked[r] = seq;
	return true;
}

/* A round trip beyond any keepalive timeout (600 s at most): a message's round trip is measured
 * from the time its ack echoes, which a peer may make up; it counts in +Inf as this much, so that
 * the sum cannot wrap (it would take 5e9 such samples). */
#define METRICS_RTT_MAX_US 3600000000ull

/* A round trip of us microseconds measured on rail r. */
static inline void link_metrics_rtt(struct link_metrics *lm, uint32_t r, uint64_t us)
{
	if (r >= MESH_RAILS_MAX)
		return;
	if (us > METRICS_RTT_MAX_US)
		us = METRICS_RTT_MAX_US;
	lm->rtt[r].n[metrics_rtt_bucket(us)]++;
	lm->rtt[r].sum_us += us;
}

/* A growing text buffer (metrics_buf.c). On allocation failure it stops growing and remembers it
 * (oom): the caller checks once at the end. */
struct metrics_buf {
	char *s;
	size_t len, cap;
	bool oom;
};

void metrics_buf_printf(struct metrics_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A label value escaped as the text format wants: \\ for a backslash, \" for a double quote, \n
 * for a newline; everything else as it is. */
void metrics_buf_label_value(struct metrics_buf *b, const char *v);
/* Takes the text away from b (the caller frees it); b is empty after. */
char *metrics_buf_take(struct metrics_buf *b, size_t *len);
void metrics_buf_free(struct metrics_buf *b);

struct mesh;

/* What the renderer cannot find in the mesh. */
struct metrics_extra {
	uint64_t ctl_errors;   /* bad requests on the control socket (admin.c) */
	uint64_t http_scrapes; /* requests served by the HTTP endpoint */
	uint64_t http_renders; /* texts the HTTP endpoint rendered for them */
};

/* meshd as a process (metrics_process.c): what /proc/self/stat says. */
struct metrics_proc {
	double cpu_seconds;  /* user and system */
	double start_time_s; /* since the epoch */
	uint64_t virtual_bytes, resident_bytes;
};

/* Parses the text of /proc/<pid>/stat (proc(5)) into out, given the clock ticks per second, the
 * page size and the boot time: 0, or -EINVAL for a text of another shape. */
int metrics_proc_stat_parse(const char *stat, long ticks_per_s, long page_size, uint64_t boot_s,
			    struct metrics_proc *out);
/* Appends the process_* families (process_cpu_seconds_total, process_resident_memory_bytes, ...)
 * of this process, those it can read. */
void metrics_render_process(struct metrics_buf *b);

/* The health of the node for /healthz, into b: "ok" when every configured link is UP, else how
 * many are not and a line for each (peer id, state, last error). Returns the number of links not
 * UP (0: healthy), or -ENOMEM. Runs where metrics_render runs. */
int metrics_health_render(const struct mesh *m, struct metrics_buf *b);

/* Renders every metric of the node into b (appended): 0, or -ENOMEM. */
int metrics_render(const struct mesh *m, const struct metrics_extra *x, struct metrics_buf *b);

#endif
