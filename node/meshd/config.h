/*
 * The cluster configuration (libconfig): one file describes the whole cluster, every meshd reads
 * the same file and picks its own node by id. Every key has one row in a table (name, type,
 * default, range, help) that validates the file, rejects unknown keys with file:line and prints
 * `meshd --dump-config`.
 */
#ifndef MESH_MESHD_CONFIG_H
#define MESH_MESHD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

#define CONFIG_NAME_MAX 64
#define CONFIG_NUMA_AUTO (-1)
#define CONFIG_NUMA_OFF (-2)
#define CONFIG_NUMA_NODE_MAX 63
#define CONFIG_ADDR_MAX 64
#define CONFIG_RAILS_MAX 4 /* addresses (one per RDMA device) a node may have */
#define CONFIG_LISTEN_MAX 72 /* "[v6 address]:port" */

struct config_node {
	uint16_t id;
	uint16_t port;
	char addr[CONFIG_ADDR_MAX]; /* rail 0 */
	/* Rails: one address per device of the node (rail[0] is addr). Rail r of every node is on the
	 * same fabric; a link keeps qps_per_link QPs on each rail, a channel uses one rail. */
	uint8_t n_rails;
	char rail[CONFIG_RAILS_MAX][CONFIG_ADDR_MAX];
	char numa[16];  /* this node's own cluster.numa, "" when it has none */
	int numa_mode;  /* the same, parsed (when numa[0]) */
	bool has_metrics_listen; /* its own cluster.metrics_listen ("" turns it off for this node) */
	char metrics_listen[CONFIG_LISTEN_MAX];
	int line; /* where the node was defined, for messages */
};

struct mesh_config {
	char path[256];
	char cluster_name[CONFIG_NAME_MAX];
	char transport[16];
	char log_level[16];
	char key_file[256]; /* the cluster key (auth.h), "" none; relative: to the configuration file */
	uint32_t qps_per_link;
	uint32_t keepalive_interval_ms;
	uint32_t keepalive_timeout_ms;
	uint32_t connect_timeout_ms;
	uint32_t handshake_timeout_ms;
	uint32_t resume_timeout_ms;
	uint32_t backoff_initial_ms;
	uint32_t backoff_max_ms;
	uint32_t max_handshakes;
	uint32_t mailbox_size;
	uint32_t max_channels_per_link; /* channels a peer may have opened to us at once */
	uint32_t max_ring_mib_per_link; /* MiB of ring memory (both directions) those may take */
	uint32_t max_channels_per_uid;  /* channels one local user may hold at once */
	uint64_t max_ring_bytes_per_uid; /* ring bytes (both directions) those may take */
	char socket_group[64];           /* may use the control socket; "" or missing: meshd's user only */
	char polling[16];        /* busy | adaptive | event: how the data-path thread waits */
	uint32_t poll_budget_us; /* adaptive: keep polling this long after the last work */
	uint32_t app_spin_us;    /* hint to libmesh: poll a ring this long before sleeping */
	uint32_t control_priority; /* SCHED_FIFO priority of the control socket's thread, 0 none */
	char direct_receive[8];  /* on | off: peers may write our rings' direct pairs (ring.h) */
	char app_send[8];        /* on | off: applications may post their own writes (ring.h AQ area) */
	char numa[16];           /* "auto", "off" or a node number, as written */
	int numa_mode;           /* the same: CONFIG_NUMA_AUTO, CONFIG_NUMA_OFF or the node */
	char metrics_listen[CONFIG_LISTEN_MAX]; /* Prometheus /metrics over HTTP: "[ADDR]:PORT", "" off */
	int nodes_line;
	size_t n_nodes;
	struct config_node *nodes; /* sorted by id */
};

/* Loads and validates path. On failure returns -ENOENT/-EACCES (file) or -MESH_ECONFIG and
 * writes "path:line: what is wrong" into err. */
int config_load(const char *path, struct mesh_config *cfg, char *err, size_t errlen);
void config_free(struct mesh_config *cfg);

/* The NUMA policy of a node: its own numa key, else cluster.numa (CONFIG_NUMA_* or a node). */
int config_node_numa(const struct mesh_config *cfg, const struct config_node *node);

/* Where a node serves its metrics: its own metrics_listen, else cluster.metrics_listen; "" off. */
const char *config_node_metrics_listen(const struct mesh_config *cfg, const struct config_node *node);

/* "ADDR:PORT", "[V6ADDR]:PORT" or ":PORT" (127.0.0.1: loopback only) with a numeric address and a
 * port 1..65535 into *ss. Every address is "0.0.0.0:PORT" or "[::]:PORT". 0, or -EINVAL with *why
 * naming what is wrong. */
int config_listen_parse(const char *v, struct sockaddr_storage *ss, socklen_t *len, const char **why);

/* Whether now may replace was in a running meshd of node self_id (a reload): 0, or -MESH_ECONFIG
 * with err naming every key only a start applies that changed (cluster keys, this node's own
 * address, port, rails and numa). */
int config_reload_check(const struct mesh_config *was, const struct mesh_config *now, uint32_t self_id, char *err,
			size_t errlen);

/* The node with this id, or NULL. */
const struct config_node *config_node_find(const struct mesh_config *cfg, uint32_t id);

/* Prints every key with its type, default, range and help (meshd --dump-config). With cfg, the
 * values in force are printed as well. */
void config_dump(FILE *out, const struct mesh_config *cfg);

#endif
