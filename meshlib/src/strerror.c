/*
 * mesh_strerror: the name of every error libmesh and meshd return, a negative errno or one of the
 * mesh's own codes (MESH_ERRNO_BASE up, mesh/mesh.h), one table row per code. Linked into libmesh
 * and, as the static mesh_errors, into meshd and meshctl, so all three say the same words.
 */
#include <string.h>

#include <mesh/mesh.h>

static const char *const mesh_errstr[MESH_ERRNO_LAST - MESH_ERRNO_BASE] = {
	[MESH_EPROTOVER - MESH_ERRNO_BASE] = "peer speaks another protocol version",
	[MESH_ECLUSTER - MESH_ERRNO_BASE] = "peer belongs to another cluster",
	[MESH_EDIALRULE - MESH_ERRNO_BASE] = "dial rule violated: a lower node id dialled a higher one",
	[MESH_EUNKNOWNNODE - MESH_ERRNO_BASE] = "node id not in the configuration",
	[MESH_ESTALE - MESH_ERRNO_BASE] = "stale link epoch",
	[MESH_EBUSY - MESH_ERRNO_BASE] = "busy: too many handshakes in flight, or the link is UP and its peer alive; try later",
	[MESH_EQPCOUNT - MESH_ERRNO_BASE] = "peers disagree on qps_per_link",
	[MESH_EBADMAGIC - MESH_ERRNO_BASE] = "not a mesh peer (bad magic)",
	[MESH_EPROOF - MESH_ERRNO_BASE] = "remote mailbox key failed the write/read proof",
	[MESH_EKEEPALIVE - MESH_ERRNO_BASE] = "keepalive timeout",
	[MESH_ECONFIG - MESH_ERRNO_BASE] = "invalid configuration",
	[MESH_EPEERMSG - MESH_ERRNO_BASE] = "malformed or unexpected peer message",
	[MESH_EHANDSHAKE - MESH_ERRNO_BASE] = "handshake timed out",
	[MESH_ESHUTDOWN - MESH_ERRNO_BASE] = "peer is shutting down",
	[MESH_EDUPQP - MESH_ERRNO_BASE] = "QP index connected twice",
	[MESH_EPDATA - MESH_ERRNO_BASE] = "malformed connect private data",
	[MESH_EPEERRESTART - MESH_ERRNO_BASE] = "the peer's meshd restarted while the link was down; the channel is gone",
	[MESH_ERESUMETIMEO - MESH_ERRNO_BASE] = "the link to the peer stayed DOWN longer than cluster.resume_timeout_ms",
	[MESH_EAUTH - MESH_ERRNO_BASE] = "the peer did not prove the cluster key (cluster.key_file)",
	[MESH_EREFUSED - MESH_ERRNO_BASE] = "the peer refused the connection (its log says why)",
	[MESH_EREMOVED - MESH_ERRNO_BASE] = "the peer node was removed from the cluster's configuration",
	[MESH_EDRAINING - MESH_ERRNO_BASE] = "the node is draining for maintenance: no new channels (meshctl drain)",
	[MESH_ERESTARTING - MESH_ERRNO_BASE] = "the peer's meshd is restarting; its channels wait for the new one",
	[MESH_EMESHDGONE - MESH_ERRNO_BASE] = "the local meshd is gone and did not come back with the channel",
};

#define MESH_STR_(x) #x
#define MESH_STR(x) MESH_STR_(x)

MESH_EXPORT const char *mesh_version(void)
{
	return MESH_STR(MESH_VERSION_MAJOR) "." MESH_STR(MESH_VERSION_MINOR);
}

MESH_EXPORT const char *mesh_strerror(int err)
{
	/* long: negating INT_MIN in int is undefined. */
	long e = err < 0 ? -(long)err : err;

	if (e == 0)
		return "success";
	if (e > MESH_ERRNO_BASE && e < MESH_ERRNO_LAST && mesh_errstr[e - MESH_ERRNO_BASE])
		return mesh_errstr[e - MESH_ERRNO_BASE];
	if (e < MESH_ERRNO_BASE)
		return strerrorname_np((int)e) ? strerror((int)e) : "unknown error";
	return "unknown error";
}
