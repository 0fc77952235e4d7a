/*
 * What a failed connect to meshd's control socket means, in words that say what to do: shared by
 * libmesh (mesh_session_error) and meshctl, which link it (mesh_errors). Not exported: the only header
 * of meshlib/src that meshctl sees.
 */
#ifndef MESH_LIB_SOCKERR_H
#define MESH_LIB_SOCKERR_H

#include <stddef.h>

/* A sentence for connect(2)'s error err (negative) on the socket at path, into out: "meshd is not
 * running at PATH (no such socket)", "no permission for PATH: join group rdmamesh (the socket is
 * root:rdmamesh 0660)" with the owner, group and mode the file really has. */
void mesh_sock_explain(const char *path, int err, char *out, size_t len);

#endif
