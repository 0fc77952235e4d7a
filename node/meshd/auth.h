/*
 * The cluster key and the proof of it (as NVMe-oF's DH-HMAC-CHAP proves a pre-shared key, without
 * the DH): each side of a link attempt, or of a rail's join, sends a fresh nonce (in the CM private
 * data), then an HMAC-SHA256 (GNU Nettle) under the cluster key over a transcript that binds
 * the cluster name, the prover's role, both node ids, the link epoch, the rail and its incarnation and
 * both nonces: the acceptor's in its accept, the dialler's in an AuthProof once connected. Nothing of
 * the link (mailbox key, channels) is given before the peer's proof verified.
 *
 * The key file (cluster.key_file) holds one key per line, base64 of 32 bytes as `meshctl keygen`
 * prints it; `#` starts a comment. A second key is the next one of a rotation: proofs are made with
 * the first and accepted with either. The file must be a regular file that neither group nor others
 * may read (as ssh insists for its keys).
 */
#ifndef MESH_MESHD_AUTH_H
#define MESH_MESHD_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AUTH_KEY_LEN 32
#define AUTH_KEYS_MAX 2   /* current and next */
#define AUTH_NONCE_LEN 16 /* MESH_AUTH_NONCE_LEN of the private data (proto/wire.h) */
#define AUTH_MAC_LEN 32   /* HMAC-SHA256 */
#define AUTH_KEY_B64_LEN 44 /* base64 of AUTH_KEY_LEN bytes, without the newline */

struct auth_keys {
	uint8_t key[AUTH_KEYS_MAX][AUTH_KEY_LEN];
	unsigned n; /* 0: no key file (anyone who reaches the port may join) */
};

/* Loads path into k. 0, or a negative errno with err naming the file and what is wrong with it:
 * missing, not a regular file, readable or writable by group or others, no key, a line that is not
 * base64 of 32 bytes, more than two keys. */
int auth_load_keys(const char *path, struct auth_keys *k, char *err, size_t errlen);

/* A fresh key (getrandom) in the file's format, NUL-terminated: out holds AUTH_KEY_B64_LEN + 1. */
int auth_keygen(char *out, size_t len);

/* What a proof covers. */
struct auth_transcript {
	const char *cluster;
	bool dialler_proves; /* the prover's role: a proof is never valid in the other direction */
	uint32_t dialler, acceptor;
	uint64_t link_epoch;
	uint32_t rail;
	uint32_t gen; /* the rail's incarnation of a join; 0 for the link's own attempt */
	const uint8_t *nonce_dialler, *nonce_acceptor; /* AUTH_NONCE_LEN each */
};

/* The proof with k's first key. */
int auth_prove(const struct auth_keys *k, const struct auth_transcript *t, uint8_t mac[AUTH_MAC_LEN]);
/* Whether mac proves any of k's keys (compared in constant time). */
bool auth_verify(const struct auth_keys *k, const struct auth_transcript *t, const uint8_t *mac, size_t mac_len);

#endif
