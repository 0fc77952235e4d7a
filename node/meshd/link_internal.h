/*
 * What the files of the link layer share, and nothing outside them sees: mesh.c (links, rails,
 * messages, keepalives, the tick) and link_admit.c (admission of our dials). Everything here works on
 * struct mesh and struct link of mesh.h; the rest of meshd goes through mesh.h alone.
 */
#ifndef MESH_MESHD_LINK_INTERNAL_H
#define MESH_MESHD_LINK_INTERNAL_H

#include <stdint.h>

#include "mesh.h"

/* link_admit.c: admission of our dials (struct mesh_admission). */
void mesh_adm_init(struct mesh *m);
void mesh_adm_on_up(struct mesh *m, uint64_t sample_ms);
void mesh_adm_on_congestion(struct mesh *m, uint64_t t);
uint64_t mesh_adm_no_answer_ms(const struct mesh *m);
void mesh_admit(struct mesh *m, uint64_t t);

/* mesh.c */
void link_dial(struct link *l);

#endif
