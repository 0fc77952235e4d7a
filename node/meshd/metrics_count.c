/*
 * The metrics the link code counts as it runs (metrics.h's link_metrics_* inlines): a link's
 * error folded into a fixed reason, the label name of a reason, and the bounds of the round-trip
 * histogram. mesh.c and the link files call into it; it calls nothing of meshd, so the counting
 * stands below the renderer (metrics.c), which reads the mesh.
 */
#include <errno.h>
#include <stdint.h>

#include <mesh/mesh.h>

#include "metrics.h"

const uint32_t metrics_rtt_bounds_us[METRICS_RTT_BUCKETS] = {
	10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000,
};

static const char *const reason_names[METRICS_REASONS] = {
	[METRICS_REASON_KEEPALIVE] = "keepalive",
	[METRICS_REASON_SHUTDOWN] = "shutdown",
	[METRICS_REASON_HANDSHAKE_TIMEOUT] = "handshake_timeout",
	[METRICS_REASON_NO_ANSWER] = "no_answer",
	[METRICS_REASON_REFUSED] = "refused",
	[METRICS_REASON_BUSY] = "busy",
	[METRICS_REASON_STALE] = "stale",
	[METRICS_REASON_AUTH] = "auth",
	[METRICS_REASON_PROOF] = "proof",
	[METRICS_REASON_MISMATCH] = "mismatch",
	[METRICS_REASON_PROTOCOL] = "protocol",
	[METRICS_REASON_CONNECTION] = "connection",
	[METRICS_REASON_RESOURCES] = "resources",
	[METRICS_REASON_OTHER] = "other",
};

const char *metrics_reason_name(enum metrics_reason r)
{
	return (unsigned)r < METRICS_REASONS ? reason_names[r] : "other";
}

enum metrics_reason metrics_reason_of(int err)
{
	switch (-err) {
	case MESH_EKEEPALIVE:
		return METRICS_REASON_KEEPALIVE;
	case MESH_ESHUTDOWN:
		return METRICS_REASON_SHUTDOWN;
	case MESH_EHANDSHAKE:
		return METRICS_REASON_HANDSHAKE_TIMEOUT;
	case ETIMEDOUT:
		return METRICS_REASON_NO_ANSWER;
	case ECONNREFUSED:
	case MESH_EREFUSED:
		return METRICS_REASON_REFUSED;
	case MESH_EBUSY:
		return METRICS_REASON_BUSY;
	case MESH_ESTALE:
		return METRICS_REASON_STALE;
	case MESH_EAUTH:
		return METRICS_REASON_AUTH;
	case MESH_EPROOF:
		return METRICS_REASON_PROOF;
	case MESH_EREMOVED: /* the peer's configuration no longer has us (or ours it) */
	case MESH_ECLUSTER:
	case MESH_EQPCOUNT:
	case MESH_EPROTOVER:
	case MESH_EDIALRULE:
	case MESH_EUNKNOWNNODE:
		return METRICS_REASON_MISMATCH;
	case MESH_EPEERMSG:
	case MESH_EPDATA:
	case MESH_EBADMAGIC:
	case MESH_EDUPQP:
	case EPROTO:
	case EBADMSG:
		return METRICS_REASON_PROTOCOL;
	case ECONNRESET:
	case ECONNABORTED:
	case ENOTCONN:
	case EPIPE:
	case EIO:
	case EHOSTUNREACH:
	case ENETUNREACH:
	case ENETDOWN:
	case EADDRNOTAVAIL:
		return METRICS_REASON_CONNECTION;
	case ENOMEM:
	case ENOBUFS:
	case ENOSPC:
	case EAGAIN:
		return METRICS_REASON_RESOURCES;
	default:
		return METRICS_REASON_OTHER;
	}
}
