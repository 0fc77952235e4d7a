/*
 * Writes the hand-made seeds of the fuzz corpora, deterministically, with the project's own
 * encoders, so that every seed is a valid message of the current wire format:
 *
 *   make_seeds TCP_FRAME_DIR PEER_DECODERS_DIR
 *
 * The files are named seed-*; tests/fuzz/run.sh adds them to the working corpus of every run, and
 * the committed corpora (tests/fuzz/corpus/) hold them next to what fuzzing found.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <mesh/mesh.h>

#include "tcp_wire.h"
#include "wire.h"

#define SEED_MAX 4096

struct seed {
	uint8_t data[SEED_MAX];
	size_t len;
};

static int seed_write(const char *dir, const char *name, const struct seed *s)
{
	char path[4096];
	FILE *f;

	if ((size_t)snprintf(path, sizeof(path), "%s/seed-%s", dir, name) >= sizeof(path)) {
		fprintf(stderr, "make_seeds: %s/seed-%s: path too long\n", dir, name);
		return -ENAMETOOLONG;
	}
	f = fopen(path, "wb");
	if (!f) {
		fprintf(stderr, "make_seeds: %s: %s\n", path, strerror(errno));
		return -errno;
	}
	if (fwrite(s->data, 1, s->len, f) != s->len || fclose(f)) {
		fprintf(stderr, "make_seeds: %s: write failed\n", path);
		return -EIO;
	}
	return 0;
}

static void seed_append(struct seed *s, const void *p, size_t len)
{
	if (len > SEED_MAX - s->len)
		len = SEED_MAX - s->len; /* never with the seeds below */
	if (len)
		memcpy(s->data + s->len, p, len);
	s->len += len;
}

/* ---- message samples ----------------------------------------------------------------------- */

static struct mesh_cm_pdata sample_pdata(uint8_t kind)
{
	struct mesh_cm_pdata pd = {
		.version = MESH_CM_VERSION,
		.kind = kind,
		.qp_index = 1,
		.qp_count = 4,
		.cluster_hash = mesh_cluster_hash("fuzz"),
		.src_node = 7,
		.dst_node = 3,
		.link_epoch = 0x0001020304050607ull,
		.boot_epoch = 0x1716151413121110ull,
		.reason = kind == MESH_CM_REJECT ? -MESH_ESTALE : 0,
	};

	for (size_t i = 0; i < sizeof(pd.nonce); i++)
		pd.nonce[i] = (uint8_t)(0xa0 + i);
	if (kind == MESH_CM_ACCEPT) { /* with the acceptor's proof */
		pd.flags = MESH_CM_F_PROOF;
		for (size_t i = 0; i < sizeof(pd.mac); i++)
			pd.mac[i] = (uint8_t)(0x30 + i);
	}
	return pd;
}

/* kind 0: a rail's join (a connect with MESH_CM_F_RAIL_JOIN) */
static size_t pdata_bytes(uint8_t kind, uint8_t *out, size_t len)
{
	struct mesh_cm_pdata pd = sample_pdata(kind ? kind : MESH_CM_CONNECT);
	int n;

	if (!kind) {
		pd.rail = 1;
		pd.rail_count = 2;
		pd.flags = MESH_CM_F_RAIL_JOIN;
		pd.rail_gen = 3;
	}
	n = mesh_cm_pdata_encode(&pd, out, len);

	return n < 0 ? 0 : (size_t)n;
}

/* Encodes one PeerMsg with the given body (PEER_MSG__BODY_*). */
static size_t peer_msg_bytes(PeerMsg__BodyCase body, uint8_t *out, size_t len)
{
	PeerMsg m = PEER_MSG__INIT;
	Hello hello = HELLO__INIT;
	Ready ready = READY__INIT;
	Keepalive ka = KEEPALIVE__INIT;
	KeepaliveAck ack = KEEPALIVE_ACK__INIT;
	Goodbye bye = GOODBYE__INIT;
	RailDown down = RAIL_DOWN__INIT;
	RailUp up = RAIL_UP__INIT;
	LinkAck lack = LINK_ACK__INIT;
	int n;

	m.body_case = body;
	switch (body) {
	case PEER_MSG__BODY_HELLO:
		hello.node_id = 7;
		hello.cluster_hash = mesh_cluster_hash("fuzz");
		hello.boot_epoch = 1700000000000000ull;
		hello.link_epoch = 0x0001020304050607ull;
		hello.features = MESH_FEAT_ALL;
		hello.qp_count = 4;
		hello.mailbox_addr = 0x7f0000001000ull;
		hello.mailbox_len = 4096;
		hello.mailbox_rkey = 0x1234;
		m.hello = &hello;
		break;
	case PEER_MSG__BODY_READY:
		ready.link_epoch = 0x0001020304050607ull;
		m.ready = &ready;
		break;
	case PEER_MSG__BODY_KEEPALIVE:
		ka.seq = 42;
		ka.sent_us = 123456789;
		m.keepalive = &ka;
		break;
	case PEER_MSG__BODY_KEEPALIVE_ACK:
		ack.seq = 42;
		ack.sent_us = 123456789;
		m.keepalive_ack = &ack;
		break;
	case PEER_MSG__BODY_RAIL_DOWN: /* sequenced control: seq and ack around the body */
		down.rail = 1;
		down.gen = 3;
		down.reason = -104;
		m.rail_down = &down;
		m.seq = 17;
		m.ack = 16;
		break;
	case PEER_MSG__BODY_RAIL_UP:
		up.rail = 1;
		up.gen = 3;
		up.link_epoch = 0x0001020304050607ull;
		m.rail_up = &up;
		break;
	case PEER_MSG__BODY_LINK_ACK:
		m.link_ack = &lack;
		m.ack = 16;
		break;
	default:
		bye.reason = 1;
		m.goodbye = &bye;
		break;
	}
	n = mesh_peer_msg_encode(&m, out, len);
	return n < 0 ? 0 : (size_t)n;
}

static size_t ctl_req_bytes(CtlObject object, uint8_t *out, size_t len)
{
	CtlRequest r = CTL_REQUEST__INIT;

	r.version = MESH_CTL_VERSION;
	r.object = object;
	if (ctl_request__get_packed_size(&r) > len)
		return 0;
	return ctl_request__pack(&r, out);
}

/* ---- tcp frames ---------------------------------------------------------------------------- */

static void frame_append(struct seed *s, uint8_t type, uint64_t raddr, uint64_t id, uint32_t rkey,
			 uint32_t arg, const uint8_t *payload, uint32_t payload_len)
{
	struct tcp_frame f = {
		.type = type,
		.payload_len = payload_len,
		.raddr = raddr,
		.id = id,
		.rkey = rkey,
		.arg = arg,
	};
	uint8_t hdr[TCP_FRAME_HDR_LEN];

	tcp_frame_header(&f, hdr);
	seed_append(s, hdr, sizeof(hdr));
	seed_append(s, payload, payload_len);
}

/* Appends frame number i of the sample conversation; returns its name, or NULL after the last. */
static const char *tcp_sample_frame(int i, struct seed *s)
{
	uint8_t buf[MESH_PEER_MSG_MAX], data[64];
	size_t n;

	for (size_t k = 0; k < sizeof(data); k++)
		data[k] = (uint8_t)(k * 7 + 1);
	switch (i) {
	case 0:
		n = pdata_bytes(MESH_CM_CONNECT, buf, sizeof(buf));
		frame_append(s, TCP_F_CONNECT, 0, 0, 0, 0, buf, (uint32_t)n);
		return "connect";
	case 1:
		n = pdata_bytes(MESH_CM_ACCEPT, buf, sizeof(buf));
		frame_append(s, TCP_F_ACCEPT, 0, 0, 0, 0, buf, (uint32_t)n);
		return "accept";
	case 2:
		n = peer_msg_bytes(PEER_MSG__BODY_HELLO, buf, sizeof(buf));
		frame_append(s, TCP_F_SEND, 0, 0, 0, 0, buf, (uint32_t)n);
		return "send-hello";
	case 3:
		frame_append(s, TCP_F_WRITE, 0x7f0000001000ull, 0, 0x1234, 0, data, MESH_PROOF_LEN);
		return "write";
	case 4:
		frame_append(s, TCP_F_READ_REQ, 0x7f0000001000ull, 9, 0x1234, MESH_PROOF_LEN, NULL, 0);
		return "read-req";
	case 5:
		frame_append(s, TCP_F_READ_RESP, 0, 9, 0, 0, data, MESH_PROOF_LEN);
		return "read-resp";
	case 6:
		frame_append(s, TCP_F_WRITE_IMM, 0x7f0000001020ull, 0, 0x1234, 0xabcd, data, 16);
		return "write-imm";
	case 7:
		frame_append(s, TCP_F_SEND, 0, 0, 0, 0, NULL, 0);
		return "send-empty";
	case 8:
		frame_append(s, TCP_F_DISCONNECT, 0, 0, 0, 0, NULL, 0);
		return "disconnect";
	case 9:
		frame_append(s, TCP_F_ACK, 0, 0, 0, 3, NULL, 0);
		return "ack";
	case 10:
		n = pdata_bytes(MESH_CM_REJECT, buf, sizeof(buf));
		frame_append(s, TCP_F_REJECT, 0, 0, 0, 0, buf, (uint32_t)n);
		return "reject";
	default:
		return NULL;
	}
}

static int tcp_seeds(const char *dir)
{
	struct seed all = { .len = 0 }, one, cut;
	const char *name;
	int ret;

	for (int i = 0;; i++) {
		one.len = 0;
		name = tcp_sample_frame(i, &one);
		if (!name)
			break;
		ret = seed_write(dir, name, &one);
		if (ret)
			return ret;
		/* One stream of them all, but the reject: it would end the conversation. */
		if (strcmp(name, "reject") != 0)
			seed_append(&all, one.data, one.len);
	}
	ret = seed_write(dir, "stream", &all);
	if (ret)
		return ret;
	/* The stream cut inside its last frame: the parser asks for more bytes. */
	cut = all;
	cut.len -= 5;
	return seed_write(dir, "stream-cut", &cut);
}

/* ---- decoder inputs ------------------------------------------------------------------------ */

static int peer_seed(const char *dir, const char *name, uint8_t selector,
		     size_t (*bytes)(int, uint8_t *, size_t), int what)
{
	struct seed s = { .len = 1 };

	s.data[0] = selector;
	s.len += bytes(what, s.data + 1, sizeof(s.data) - 1);
	return seed_write(dir, name, &s);
}

static size_t peer_bytes(int body, uint8_t *out, size_t len)
{
	return peer_msg_bytes((PeerMsg__BodyCase)body, out, len);
}

static size_t pdata_kind_bytes(int kind, uint8_t *out, size_t len)
{
	return pdata_bytes((uint8_t)kind, out, len);
}

static size_t ctl_bytes(int object, uint8_t *out, size_t len)
{
	return ctl_req_bytes((CtlObject)object, out, len);
}

static void le_append(struct seed *s, uint64_t v, size_t width)
{
	for (size_t i = 0; i < width; i++) {
		uint8_t b = (uint8_t)(v >> (8 * i));

		seed_append(s, &b, 1);
	}
}

/* Modes 3 and 4 of fuzz_peer_decoders.c: a Hello and a CtlRequest as fixed-width little-endian
 * field values, in the order that file reads them. */
static int field_seeds(const char *dir)
{
	struct seed hello = { .data = { 3, 1 }, .len = 2 }, ctl = { .data = { 4 }, .len = 1 };
	int ret;

	le_append(&hello, 7, 4);                          /* node_id */
	le_append(&hello, mesh_cluster_hash("fuzz"), 4);  /* cluster_hash */
	le_append(&hello, 1700000000000000ull, 8);        /* boot_epoch */
	le_append(&hello, 0x0001020304050607ull, 8);      /* link_epoch */
	le_append(&hello, MESH_FEAT_ALL, 8);              /* features */
	le_append(&hello, 4, 4);                          /* qp_count */
	le_append(&hello, 0x7f0000001000ull, 8);          /* mailbox_addr */
	le_append(&hello, MESH_MAILBOX_MIN, 4);           /* mailbox_len */
	le_append(&hello, 0x1234, 4);                     /* mailbox_rkey */
	ret = seed_write(dir, "fields-hello", &hello);
	if (ret)
		return ret;
	le_append(&ctl, MESH_CTL_VERSION, 4);
	le_append(&ctl, CTL_OBJECT__CTL_OBJECT_LINKS, 4);
	return seed_write(dir, "fields-ctl-links", &ctl);
}

static int decoder_seeds(const char *dir)
{
	static const struct {
		const char *name;
		uint8_t selector; /* as in fuzz_peer_decoders.c */
		size_t (*bytes)(int, uint8_t *, size_t);
		int what;
	} seeds[] = {
		{ "peer-hello", 0, peer_bytes, PEER_MSG__BODY_HELLO },
		{ "peer-ready", 0, peer_bytes, PEER_MSG__BODY_READY },
		{ "peer-keepalive", 0, peer_bytes, PEER_MSG__BODY_KEEPALIVE },
		{ "peer-keepalive-ack", 0, peer_bytes, PEER_MSG__BODY_KEEPALIVE_ACK },
		{ "peer-goodbye", 0, peer_bytes, PEER_MSG__BODY_GOODBYE },
		{ "peer-rail-down", 0, peer_bytes, PEER_MSG__BODY_RAIL_DOWN },
		{ "peer-rail-up", 0, peer_bytes, PEER_MSG__BODY_RAIL_UP },
		{ "peer-link-ack", 0, peer_bytes, PEER_MSG__BODY_LINK_ACK },
		{ "pdata-rail-join", 1, pdata_kind_bytes, 0 },
		{ "pdata-connect", 1, pdata_kind_bytes, MESH_CM_CONNECT },
		{ "pdata-accept", 1, pdata_kind_bytes, MESH_CM_ACCEPT },
		{ "pdata-reject", 1, pdata_kind_bytes, MESH_CM_REJECT },
		{ "ctl-links", 2, ctl_bytes, CTL_OBJECT__CTL_OBJECT_LINKS },
		{ "ctl-node", 2, ctl_bytes, CTL_OBJECT__CTL_OBJECT_NODE },
	};

	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
		int ret = peer_seed(dir, seeds[i].name, seeds[i].selector, seeds[i].bytes, seeds[i].what);

		if (ret)
			return ret;
	}
	return field_seeds(dir);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s TCP_FRAME_DIR PEER_DECODERS_DIR\n", argv[0]);
		return 2;
	}
	if (tcp_seeds(argv[1]) || decoder_seeds(argv[2]))
		return 1;
	return 0;
}
