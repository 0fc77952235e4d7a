/*
 * meshd --check: everything a start checks, without starting. The file loads and validates, the key
 * file is safe and loads, the control socket is free; with a node id, the node is in the file, its
 * addresses belong to this host, its ports (listen and metrics_listen) are free and, for rdma, a
 * device serves each address. One line per problem, naming file:line or the key.
 */
#ifndef MESH_MESHD_CHECK_H
#define MESH_MESHD_CHECK_H

#include <stdint.h>
#include <stdio.h>

struct mesh_config;
struct xport_ops;

/* Checks cfg_path for node_id (-1: only what holds for every node) and the control socket sock.
 * Problems go to err, one a line; a summary of a good file to out. Returns the number of problems. */
int check_run(const char *cfg_path, long node_id, const char *sock, FILE *out, FILE *err);

/* What to do about a provider's failed listen (a negative errno) on addr port: the words after the
 * error's name, e.g. "10.0.0.9 is not an address of this host: ...". */
void check_listen_why(int err, const struct xport_ops *ops, const char *addr, uint16_t port, uint32_t node_id,
		      char *out, size_t len);

/* cluster.key_file as a path: relative to the configuration file's directory. 0, or -ENAMETOOLONG. */
int check_key_path(const struct mesh_config *cfg, const char *cfg_path, char *out, size_t len);

#endif
