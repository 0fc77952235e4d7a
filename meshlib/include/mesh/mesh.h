/*
 * libmesh: the public interface of rdmamesh (the only installed header).
 *
 * Errors: every function returns 0 or a count on success and a negative errno value on failure
 * (-ENOENT, -ECONNRESET, ...). Failures specific to the mesh use the reserved range below;
 * mesh_strerror() names every code, errno values included.
 *
 * Stream channels (mesh_connect / mesh_listen / send / recv) arrive with the channels issue; today
 * the header carries the error contract shared by libmesh, meshd and meshctl.
 */
#ifndef MESH_MESH_H
#define MESH_MESH_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MESH_BUILDING_LIB)
#define MESH_EXPORT __attribute__((visibility("default")))
#else
#define MESH_EXPORT
#endif

#define MESH_VERSION_MAJOR 0
#define MESH_VERSION_MINOR 1

/* Default path of meshd's local control socket; the MESH_SOCKET environment variable overrides it. */
#define MESH_SOCKET_DEFAULT "/run/meshd/meshd.sock"
#define MESH_SOCKET_ENV "MESH_SOCKET"

/* Mesh-specific error codes, returned negated like errno values. */
enum mesh_errno {
	MESH_ERRNO_BASE = 2000,
	MESH_EPROTOVER = 2001,    /* peer speaks another protocol version */
	MESH_ECLUSTER = 2002,     /* peer belongs to another cluster */
	MESH_EDIALRULE = 2003,    /* a lower node id dialled a higher one */
	MESH_EUNKNOWNNODE = 2004, /* node id not in the configuration */
	MESH_ESTALE = 2005,       /* connection attempt older than the current link epoch */
	MESH_EBUSY = 2006,        /* too many handshakes in flight, try later */
	MESH_EQPCOUNT = 2007,     /* peers disagree on qps_per_link */
	MESH_EBADMAGIC = 2008,    /* private data or message is not from a mesh peer */
	MESH_EPROOF = 2009,       /* the peer's mailbox key failed the write/read proof */
	MESH_EKEEPALIVE = 2010,   /* no message from the peer within the keepalive timeout */
	MESH_ECONFIG = 2011,      /* invalid configuration */
	MESH_EPEERMSG = 2012,     /* malformed or unexpected message from a peer */
	MESH_EHANDSHAKE = 2013,   /* handshake did not complete in time */
	MESH_ESHUTDOWN = 2014,    /* peer is shutting down */
	MESH_EDUPQP = 2015,       /* the same QP index was connected twice */
	MESH_EPDATA = 2016,       /* connect private data missing, truncated or of the wrong kind */
	MESH_ERRNO_LAST = 2017
};

/* Name of an error: mesh_strerror(-MESH_ECLUSTER) or mesh_strerror(-ENOENT). Never NULL. */
MESH_EXPORT const char *mesh_strerror(int err);

#ifdef __cplusplus
}
#endif
#endif
