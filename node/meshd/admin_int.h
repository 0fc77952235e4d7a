/*
 * What the control socket's files share (admin.c, admin_client.c, admin_show.c, admin_channel.c,
 * admin_ops.c), never seen outside them: struct admin itself is in admin.h. Locks as admin.h says;
 * a request handler runs with the mesh's lock held, in the control thread or the data path
 * (admin_work).
 */
#ifndef MESH_MESHD_ADMIN_INT_H
#define MESH_MESHD_ADMIN_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "admin.h"

/* The control thread's epoll tags (tag << 32 | fd). */
enum { ADMIN_EV_LISTEN = 1, ADMIN_EV_CLIENT, ADMIN_EV_STOP };
#define ADMIN_TAG(t) ((uint64_t)(t) << 32)

/* Storage for the NUMA part of NodeInfo and its version, on the caller's stack. */
struct numa_show {
	char version[16];
	NumaDevice devs[MESH_XPORT_INSTANCES], *dptrs[MESH_XPORT_INSTANCES];
	char dcpus[MESH_XPORT_INSTANCES][512];
	DataPathThread th[MESH_RAILS_MAX], *tptr[MESH_RAILS_MAX];
	char tcpus[MESH_RAILS_MAX][512];
};

/* ---- admin_client.c: the clients (calls none of the other admin files) ---- */

/* fd into epoll set epfd for reading, tagged tag | fd: 0 or a negative errno. */
int admin_watch_fd(int epfd, int fd, uint64_t tag);
/* Frees the metrics text a client was paging through. */
void admin_metrics_forget(struct admin *a, int slot);
/* Closes a client's connection and frees its slot, with the mesh's lock. */
void admin_drop(struct admin *a, int slot);
/* Whether a line a local client caused may be logged (ADMIN_LOG_BURST per interval). */
bool admin_client_log_ok(struct admin *a);
/* A free client slot for uid, or -1 with why not; under a->lock. */
int admin_slot_for(struct admin *a, uint32_t uid, char *why, size_t len);
/* The slot of a client's descriptor, gone or not, or -1; under a->lock. */
int admin_slot_locked(const struct admin *a, int fd);
/* The slot of a client that is still there, or -1. */
int admin_slot_of(struct admin *a, int fd);
/* One reply on a client's connection: 0, or a negative errno (the caller drops the client). */
int admin_send_reply(int fd, const CtlReply *r);
/* A bad request answered with status and why, logged (rate-limited) and counted in ctl_errors. */
int admin_reply_error(struct admin *a, int slot, int fd, int status, const char *why);

/* ---- admin_show.c: what is shown ---- */

/* The whole NodeInfo of this node, its strings in b. */
void admin_fill_node_show(struct mesh *m, NodeInfo *n, struct numa_show *b);
/* What the control socket itself counts, into n at the moment of the reply. */
void admin_fill_ctl_counters(struct admin *a, NodeInfo *n);
/* CTL_OP_SHOW answered with the mesh's lock: the node and one page of its object. */
int admin_show(struct admin *a, int slot, int fd, const CtlRequest *req);
/* Control thread: NODE or LINKS from the snapshot; 1 when there is none yet. */
int admin_snapshot_reply(struct admin *a, int fd, const CtlRequest *req);
/* Frees a snapshot's buffers and clears it. */
void admin_snap_free(struct admin_snap *sn);

/* ---- admin_channel.c: channels handed to applications ---- */

/* CTL_OP_LISTEN or CTL_OP_CONNECT to the channel layer; the answer comes by admin_deliver. */
void admin_channel_request(struct admin *a, int slot, int fd, const CtlRequest *req);

/* ---- admin_ops.c: the operator's actions ---- */

/* `meshctl drain` (root or meshd's own user). */
int admin_drain(struct admin *a, int slot, int fd, const CtlRequest *req);
/* `meshctl reload` (root or meshd's own user). */
int admin_reload(struct admin *a, int slot, int fd);
/* `meshctl ping`: its first reply; the rest through admin_ping_report. */
int admin_ping(struct admin *a, int slot, int fd, const CtlRequest *req);
/* ping_ops.report (admin_open sets it): one result to the client of fd. */
int admin_ping_report(void *ctx, int fd, const struct ping_result *res);

#endif
