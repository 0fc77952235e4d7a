/*
 * The wire contracts: rdma_cm private data (fixed, big-endian, checked), peer messages and control
 * requests (protobuf, size-limited and range-checked), and the error names.
 */
#include <endian.h>
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "unit_main.h"
#include "wire.h"

#define WIRE_LEN ((int)sizeof(struct mesh_cm_wire))
#define XPORT_PDATA_MAX_TEST 96 /* an accept event carries this much (node/transport/transport.h) */

static uint64_t rng_state;

/* xorshift64*: deterministic, so a failing seed reproduces. */
static uint64_t rng(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ull;
}

/* ---- rdma_cm private data ------------------------------------------------------------------- */

static struct mesh_cm_pdata sample_pdata(void)
{
	struct mesh_cm_pdata pd = {
		.version = MESH_CM_VERSION,
		.kind = MESH_CM_CONNECT,
		.qp_index = 3,
		.qp_count = 4,
		.cluster_hash = 0x01020304u,
		.src_node = 0xa1b2u,
		.dst_node = 0xc3d4u,
		.link_epoch = 0x1122334455667788ull,
		.boot_epoch = 0x99aabbccddeeff00ull,
	};

	for (size_t i = 0; i < sizeof(pd.nonce); i++)
		pd.nonce[i] = (uint8_t)(0xf0 + i);
	return pd;
}

static void encode_sample(uint8_t *buf, size_t len)
{
	struct mesh_cm_pdata pd = sample_pdata();

	assert_int_equal(mesh_cm_pdata_encode(&pd, buf, len), WIRE_LEN);
}

static void mesh_cm_wire__size__fits_rc_private_data(void **state)
{
	(void)state;
	assert_true(sizeof(struct mesh_cm_wire) <= 56);
	assert_true(sizeof(struct mesh_cm_wire) <= MESH_CM_PDATA_MAX);
	assert_int_equal(sizeof(struct mesh_cm_wire), 56);
	/* With the acceptor's proof after it, an accept fits an IB CM REP (196 bytes). */
	assert_int_equal(sizeof(struct mesh_cm_wire) + MESH_AUTH_MAC_LEN, MESH_CM_ACCEPT_PDATA_MAX);
	assert_true(MESH_CM_ACCEPT_PDATA_MAX <= 196);
}

static void mesh_cm_pdata_encode__all_fields__round_trip(void **state)
{
	struct mesh_cm_pdata in = sample_pdata(), out;
	uint8_t buf[MESH_CM_PDATA_MAX];

	(void)state;
	memset(&out, 0x5a, sizeof(out));
	assert_int_equal(mesh_cm_pdata_encode(&in, buf, sizeof(buf)), WIRE_LEN);
	assert_int_equal(mesh_cm_pdata_decode(buf, WIRE_LEN, &out), 0);
	assert_int_equal(out.version, MESH_CM_VERSION);
	assert_int_equal(out.kind, MESH_CM_CONNECT);
	assert_int_equal(out.qp_index, 3);
	assert_int_equal(out.qp_count, 4);
	assert_int_equal(out.cluster_hash, 0x01020304u);
	assert_int_equal(out.src_node, 0xa1b2u);
	assert_int_equal(out.dst_node, 0xc3d4u);
	assert_true(out.link_epoch == 0x1122334455667788ull);
	assert_true(out.boot_epoch == 0x99aabbccddeeff00ull);
	assert_int_equal(out.reason, 0);
	assert_memory_equal(out.nonce, in.nonce, sizeof(in.nonce));
}

static void mesh_cm_pdata_encode__fields__big_endian_on_wire(void **state)
{
	static const uint8_t want[56] = {
		'M', 'E', 'S', 'H',                             /* magic */
		2, MESH_CM_CONNECT, 3, 4,                       /* version kind qp_index qp_count */
		0x01, 0x02, 0x03, 0x04,                         /* cluster_hash */
		0xa1, 0xb2, 0xc3, 0xd4,                         /* src dst */
		0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, /* link_epoch */
		0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x00, /* boot_epoch */
		0, 0,                                           /* reason */
		0, 0, 0, 0, 0, 0,                               /* rail rail_count rail_gen flags reserved */
		0xf0, 0xf1, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, /* nonce */
		0xf8, 0xf9, 0xfa, 0xfb, 0xfc, 0xfd, 0xfe, 0xff,
	};
	uint8_t buf[MESH_CM_PDATA_MAX + 8];

	(void)state;
	memset(buf, 0xee, sizeof(buf));
	encode_sample(buf, sizeof(buf));
	assert_memory_equal(buf, "MESH", 4);
	assert_memory_equal(buf, want, sizeof(want));
	/* Nothing past the struct is written. */
	for (size_t i = sizeof(want); i < sizeof(buf); i++)
		assert_int_equal(buf[i], 0xee);
}

static void mesh_cm_pdata_encode__buffer_too_small__enospc_untouched(void **state)
{
	struct mesh_cm_pdata pd = sample_pdata();
	uint8_t buf[MESH_CM_PDATA_MAX];

	(void)state;
	for (int len = 0; len < WIRE_LEN; len++) {
		memset(buf, 0xee, sizeof(buf));
		assert_int_equal(mesh_cm_pdata_encode(&pd, buf, (size_t)len), -ENOSPC);
		for (size_t i = 0; i < sizeof(buf); i++)
			assert_int_equal(buf[i], 0xee);
	}
	assert_int_equal(mesh_cm_pdata_encode(&pd, buf, (size_t)WIRE_LEN), WIRE_LEN);
}

static void mesh_cm_pdata_decode__truncated__ebadmsg(void **state)
{
	uint8_t buf[MESH_CM_PDATA_MAX];
	struct mesh_cm_pdata out, untouched;

	(void)state;
	encode_sample(buf, sizeof(buf));
	memset(&untouched, 0x5a, sizeof(untouched));
	for (int len = 0; len < WIRE_LEN; len++) {
		out = untouched;
		assert_int_equal(mesh_cm_pdata_decode(buf, (size_t)len, &out), -EBADMSG);
		assert_memory_equal(&out, &untouched, sizeof(out));
	}
	assert_int_equal(mesh_cm_pdata_decode(NULL, 0, &out), -EBADMSG);
	assert_int_equal(mesh_cm_pdata_decode(NULL, 56, &out), -EBADMSG);
}

static void mesh_cm_pdata_decode__padded_to_56__decodes(void **state)
{
	uint8_t buf[MESH_CM_PDATA_MAX];
	struct mesh_cm_pdata out;

	(void)state;
	memset(buf, 0xff, sizeof(buf)); /* the CM pads with whatever: the tail must not matter */
	encode_sample(buf, sizeof(buf));
	assert_int_equal(mesh_cm_pdata_decode(buf, sizeof(buf), &out), 0);
	assert_int_equal(out.src_node, 0xa1b2u);
	assert_int_equal(out.qp_index, 3);
	assert_true(out.boot_epoch == 0x99aabbccddeeff00ull);
}

static void mesh_cm_pdata_decode__bad_magic__ebadmagic(void **state)
{
	uint8_t buf[MESH_CM_PDATA_MAX];
	struct mesh_cm_pdata out;

	(void)state;
	for (int i = 0; i < 4; i++) {
		encode_sample(buf, sizeof(buf));
		buf[i] ^= 0x20; /* "mESH", "MeSH", ...: case matters */
		assert_int_equal(mesh_cm_pdata_decode(buf, sizeof(buf), &out), -MESH_EBADMAGIC);
	}
	/* Host-order magic on the wire is not the magic. */
	encode_sample(buf, sizeof(buf));
	memcpy(buf, "HSEM", 4);
	assert_int_equal(mesh_cm_pdata_decode(buf, sizeof(buf), &out), -MESH_EBADMAGIC);
}

/* Another version is MESH_EPROTOVER whatever its length: a version-1 peer sends 40 bytes. */
static void mesh_cm_pdata_decode__other_version__eprotover(void **state)
{
	uint8_t buf[MESH_CM_PDATA_MAX];
	struct mesh_cm_pdata out;

	(void)state;
	encode_sample(buf, sizeof(buf));
	buf[4] = 1;
	assert_int_equal(mesh_cm_pdata_decode(buf, sizeof(buf), &out), -MESH_EPROTOVER);
	assert_int_equal(mesh_cm_pdata_decode(buf, 40, &out), -MESH_EPROTOVER);
	buf[4] = 3;
	assert_int_equal(mesh_cm_pdata_decode(buf, sizeof(buf), &out), -MESH_EPROTOVER);
	buf[4] = 0;
	assert_int_equal(mesh_cm_pdata_decode(buf, sizeof(buf), &out), -MESH_EPROTOVER);
}

/* MESH_CM_F_PROOF: the acceptor's proof follows the struct in an accept, and only there. */
static void mesh_cm_pdata__proof__accept_only_round_trip_truncated_eproto(void **state)
{
	struct mesh_cm_pdata pd = sample_pdata(), out;
	uint8_t buf[XPORT_PDATA_MAX_TEST];

	(void)state;
	pd.kind = MESH_CM_ACCEPT;
	pd.flags = MESH_CM_F_PROOF;
	for (size_t i = 0; i < sizeof(pd.mac); i++)
		pd.mac[i] = (uint8_t)(i * 7 + 1);
	assert_int_equal(mesh_cm_pdata_encode(&pd, buf, MESH_CM_PDATA_MAX), -ENOSPC);
	assert_int_equal(mesh_cm_pdata_encode(&pd, buf, sizeof(buf)), MESH_CM_ACCEPT_PDATA_MAX);
	assert_memory_equal(buf + WIRE_LEN, pd.mac, sizeof(pd.mac));
	assert_int_equal(mesh_cm_pdata_decode(buf, MESH_CM_ACCEPT_PDATA_MAX, &out), 0);
	assert_true(out.flags & MESH_CM_F_PROOF);
	assert_memory_equal(out.mac, pd.mac, sizeof(pd.mac));
	assert_memory_equal(out.nonce, pd.nonce, sizeof(pd.nonce));
	/* The REP pads: more bytes decode the same. */
	assert_int_equal(mesh_cm_pdata_decode(buf, sizeof(buf), &out), 0);
	/* Cut short: the proof is missing. */
	assert_int_equal(mesh_cm_pdata_decode(buf, MESH_CM_ACCEPT_PDATA_MAX - 1, &out), -EPROTO);
	/* On a connect or a reject the flag is refused. */
	buf[5] = MESH_CM_CONNECT;
	assert_int_equal(mesh_cm_pdata_decode(buf, MESH_CM_ACCEPT_PDATA_MAX, &out), -EPROTO);
	buf[5] = MESH_CM_REJECT;
	assert_int_equal(mesh_cm_pdata_decode(buf, MESH_CM_ACCEPT_PDATA_MAX, &out), -EPROTO);
	/* Without the flag nothing is written after the struct. */
	pd.flags = 0;
	memset(buf, 0xee, sizeof(buf));
	assert_int_equal(mesh_cm_pdata_encode(&pd, buf, sizeof(buf)), WIRE_LEN);
	assert_int_equal(buf[WIRE_LEN], 0xee);
}

static void mesh_cm_pdata_decode__kind_0_or_4__eproto(void **state)
{
	static const uint8_t kinds[] = {0, 4, 0xff};
	uint8_t buf[MESH_CM_PDATA_MAX];
	struct mesh_cm_pdata out;

	(void)state;
	for (size_t i = 0; i < sizeof(kinds); i++) {
		encode_sample(buf, sizeof(buf));
		buf[5] = kinds[i];
		assert_int_equal(mesh_cm_pdata_decode(buf, sizeof(buf), &out), -EPROTO);
	}
	for (uint8_t k = MESH_CM_CONNECT; k <= MESH_CM_REJECT; k++) {
		encode_sample(buf, sizeof(buf));
		buf[5] = k;
		assert_int_equal(mesh_cm_pdata_decode(buf, sizeof(buf), &out), 0);
		assert_int_equal(out.kind, k);
	}
}

static void mesh_cm_pdata_decode__bad_qp_count_or_index__eproto(void **state)
{
	static const struct {
		uint8_t index, count;
		int want;
	} cases[] = {
		{0, 0, -EPROTO}, {0, 17, -EPROTO}, {2, 2, -EPROTO}, {16, 16, -EPROTO}, {255, 1, -EPROTO},
		{0, 1, 0},       {15, 16, 0},      {1, 2, 0},
	};
	uint8_t buf[MESH_CM_PDATA_MAX];
	struct mesh_cm_pdata out;

	(void)state;
	for (uint8_t kind = MESH_CM_CONNECT; kind <= MESH_CM_ACCEPT; kind++) {
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			encode_sample(buf, sizeof(buf));
			buf[5] = kind;
			buf[6] = cases[i].index;
			buf[7] = cases[i].count;
			if (mesh_cm_pdata_decode(buf, sizeof(buf), &out) != cases[i].want)
				fail_msg("kind %u qp_index %u qp_count %u: expected %d", kind, cases[i].index, cases[i].count,
					 cases[i].want);
		}
	}
}

static void mesh_cm_pdata__rails__round_trip_old_senders_one_rail_bad_ones_eproto(void **state)
{
	static const struct {
		uint8_t rail, count;
		int want;
	} cases[] = {
		{0, 0, 0}, {0, 1, 0}, {1, 2, 0}, {3, 4, 0}, {1, 0, -EPROTO}, {2, 2, -EPROTO}, {0, 5, -EPROTO},
		{255, 255, -EPROTO},
	};
	uint8_t buf[MESH_CM_PDATA_MAX];
	struct mesh_cm_pdata pd = sample_pdata(), out;
	size_t r = offsetof(struct mesh_cm_wire, rail), n = offsetof(struct mesh_cm_wire, rail_count);

	(void)state;
	pd.rail = 2;
	pd.rail_count = 3;
	assert_int_equal(mesh_cm_pdata_encode(&pd, buf, sizeof(buf)), (int)sizeof(struct mesh_cm_wire));
	assert_int_equal(buf[r], 2);
	assert_int_equal(buf[n], 3);
	assert_int_equal(mesh_cm_pdata_decode(buf, sizeof(buf), &out), 0);
	assert_int_equal(out.rail, 2);
	assert_int_equal(out.rail_count, 3);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		buf[r] = cases[i].rail;
		buf[n] = cases[i].count;
		memset(&out, 0, sizeof(out));
		if (mesh_cm_pdata_decode(buf, sizeof(buf), &out) != cases[i].want)
			fail_msg("rail %u of %u: expected %d", cases[i].rail, cases[i].count, cases[i].want);
		/* A sender of before the rails wrote zeros: one rail. */
		if (!cases[i].want)
			assert_int_equal(out.rail_count, cases[i].count ? cases[i].count : 1);
	}
}

static void mesh_cm_pdata_decode__reject_reason__round_trips_as_negative_code(void **state)
{
	uint8_t buf[MESH_CM_PDATA_MAX];
	struct mesh_cm_pdata pd = sample_pdata(), out;
	uint16_t wire_reason;

	(void)state;
	/* A reject carries no QP numbers: they are not checked. */
	pd.kind = MESH_CM_REJECT;
	pd.qp_index = 0;
	pd.qp_count = 0;
	for (int code = MESH_ERRNO_BASE + 1; code < MESH_ERRNO_LAST; code++) {
		pd.reason = -code;
		assert_int_equal(mesh_cm_pdata_encode(&pd, buf, sizeof(buf)), WIRE_LEN);
		memcpy(&wire_reason, buf + 32, sizeof(wire_reason));
		assert_int_equal(be16toh(wire_reason), code - MESH_ERRNO_BASE);
		assert_int_equal(mesh_cm_pdata_decode(buf, sizeof(buf), &out), 0);
		assert_int_equal(out.kind, MESH_CM_REJECT);
		assert_int_equal(out.reason, -code);
	}
	/* Plain errno values and positive numbers do not fit the field: no reason travels. */
	pd.reason = -EPROTO;
	assert_int_equal(mesh_cm_pdata_encode(&pd, buf, sizeof(buf)), WIRE_LEN);
	assert_int_equal(mesh_cm_pdata_decode(buf, sizeof(buf), &out), 0);
	assert_int_equal(out.reason, 0);
	pd.reason = MESH_ECLUSTER;
	assert_int_equal(mesh_cm_pdata_encode(&pd, buf, sizeof(buf)), WIRE_LEN);
	assert_int_equal(mesh_cm_pdata_decode(buf, sizeof(buf), &out), 0);
	assert_int_equal(out.reason, 0);
}

static void mesh_cluster_hash__known_values__fnv1a(void **state)
{
	(void)state;
	assert_int_equal(mesh_cluster_hash(""), 2166136261u);
	/* Published FNV-1a 32-bit test vectors. */
	assert_int_equal(mesh_cluster_hash("a"), 0xe40c292cu);
	assert_int_equal(mesh_cluster_hash("foobar"), 0xbf9cf968u);
	assert_int_not_equal(mesh_cluster_hash("a"), mesh_cluster_hash("b"));
	assert_int_not_equal(mesh_cluster_hash("lab"), mesh_cluster_hash("lab2"));
	/* Bytes above 0x7f hash as unsigned. */
	assert_int_equal(mesh_cluster_hash("\xff"), (2166136261u ^ 0xffu) * 16777619u);
}

/* ---- peer messages -------------------------------------------------------------------------- */

static Hello sample_hello(void)
{
	Hello h = HELLO__INIT;

	h.node_id = 65535;
	h.cluster_hash = 0xdeadbeefu;
	h.boot_epoch = 1700000000000000ull;
	h.link_epoch = 1700000000123456ull;
	h.features = MESH_FEAT_ALL;
	h.qp_count = 16;
	h.mailbox_addr = 0x7f0012340000ull;
	h.mailbox_len = 4096;
	h.mailbox_rkey = 0x12345678u;
	return h;
}

static int encode_hello(const Hello *h, uint8_t *buf, size_t len)
{
	PeerMsg m = PEER_MSG__INIT;

	m.body_case = PEER_MSG__BODY_HELLO;
	m.hello = (Hello *)h;
	return mesh_peer_msg_encode(&m, buf, len);
}

/* What a successful decode promises: a known body and, for Hello, every field in range. */
static void assert_peer_msg_in_range(const PeerMsg *m)
{
	switch (m->body_case) {
	case PEER_MSG__BODY_HELLO:
		assert_non_null(m->hello);
		assert_true(m->hello->node_id <= MESH_NODE_ID_MAX);
		assert_true(m->hello->qp_count >= 1 && m->hello->qp_count <= MESH_QPS_PER_LINK_MAX);
		assert_true(m->hello->mailbox_len >= MESH_MAILBOX_MIN);
		assert_true(m->hello->mailbox_addr != 0);
		assert_true(m->hello->mailbox_addr + m->hello->mailbox_len >= m->hello->mailbox_addr);
		break;
	case PEER_MSG__BODY_READY:
		assert_non_null(m->ready);
		break;
	case PEER_MSG__BODY_KEEPALIVE:
		assert_non_null(m->keepalive);
		break;
	case PEER_MSG__BODY_KEEPALIVE_ACK:
		assert_non_null(m->keepalive_ack);
		break;
	case PEER_MSG__BODY_GOODBYE:
		assert_non_null(m->goodbye);
		break;
	default:
		fail_msg("decoded a message with body_case %d", (int)m->body_case);
	}
}

/* Decodes and checks the contract: 0 with an in-range message, or a negative code with a reason and
 * *out untouched. Returns the code. */
static int decode_checked(const void *buf, size_t len)
{
	PeerMsg *sentinel = (PeerMsg *)(uintptr_t)0x1, *m = sentinel;
	const char *why = "unset";
	int ret = mesh_peer_msg_decode(buf, len, &m, &why);

	if (ret == 0) {
		assert_ptr_not_equal(m, sentinel);
		assert_non_null(m);
		assert_null(why);
		assert_peer_msg_in_range(m);
		mesh_peer_msg_free(m);
		return 0;
	}
	if (ret != -EBADMSG && ret != -EPROTO && ret != -EMSGSIZE)
		fail_msg("mesh_peer_msg_decode returned %d", ret);
	assert_ptr_equal(m, sentinel);
	assert_non_null(why);
	assert_true(why[0] != '\0');
	return ret;
}

static void mesh_peer_msg__hello__round_trip(void **state)
{
	Hello h = sample_hello();
	uint8_t buf[MESH_PEER_MSG_MAX];
	PeerMsg *m = NULL;
	const char *why;
	int len = encode_hello(&h, buf, sizeof(buf));

	(void)state;
	assert_true(len > 0);
	assert_int_equal(mesh_peer_msg_decode(buf, (size_t)len, &m, &why), 0);
	assert_non_null(m);
	assert_int_equal(m->body_case, PEER_MSG__BODY_HELLO);
	assert_int_equal(m->hello->node_id, h.node_id);
	assert_int_equal(m->hello->cluster_hash, h.cluster_hash);
	assert_true(m->hello->boot_epoch == h.boot_epoch);
	assert_true(m->hello->link_epoch == h.link_epoch);
	assert_true(m->hello->features == h.features);
	assert_int_equal(m->hello->qp_count, h.qp_count);
	assert_true(m->hello->mailbox_addr == h.mailbox_addr);
	assert_int_equal(m->hello->mailbox_len, h.mailbox_len);
	assert_int_equal(m->hello->mailbox_rkey, h.mailbox_rkey);
	mesh_peer_msg_free(m);
	mesh_peer_msg_free(NULL);
}

static void mesh_peer_msg__other_bodies__round_trip(void **state)
{
	uint8_t buf[MESH_PEER_MSG_MAX];
	PeerMsg in = PEER_MSG__INIT, *m;
	Ready r = READY__INIT;
	Keepalive k = KEEPALIVE__INIT;
	KeepaliveAck a = KEEPALIVE_ACK__INIT;
	Goodbye g = GOODBYE__INIT;
	const char *why;
	int len;

	(void)state;
	r.link_epoch = 77;
	in.body_case = PEER_MSG__BODY_READY;
	in.ready = &r;
	len = mesh_peer_msg_encode(&in, buf, sizeof(buf));
	assert_true(len > 0);
	assert_int_equal(mesh_peer_msg_decode(buf, (size_t)len, &m, &why), 0);
	assert_int_equal(m->body_case, PEER_MSG__BODY_READY);
	assert_int_equal(m->ready->link_epoch, 77);
	mesh_peer_msg_free(m);

	k.seq = 5;
	k.sent_us = 123456789;
	in.body_case = PEER_MSG__BODY_KEEPALIVE;
	in.keepalive = &k;
	len = mesh_peer_msg_encode(&in, buf, sizeof(buf));
	assert_int_equal(mesh_peer_msg_decode(buf, (size_t)len, &m, &why), 0);
	assert_int_equal(m->body_case, PEER_MSG__BODY_KEEPALIVE);
	assert_int_equal(m->keepalive->seq, 5);
	assert_int_equal(m->keepalive->sent_us, 123456789);
	mesh_peer_msg_free(m);

	a.seq = 6;
	a.sent_us = 42;
	in.body_case = PEER_MSG__BODY_KEEPALIVE_ACK;
	in.keepalive_ack = &a;
	len = mesh_peer_msg_encode(&in, buf, sizeof(buf));
	assert_int_equal(mesh_peer_msg_decode(buf, (size_t)len, &m, &why), 0);
	assert_int_equal(m->body_case, PEER_MSG__BODY_KEEPALIVE_ACK);
	assert_int_equal(m->keepalive_ack->seq, 6);
	mesh_peer_msg_free(m);

	g.reason = MESH_ESHUTDOWN;
	in.body_case = PEER_MSG__BODY_GOODBYE;
	in.goodbye = &g;
	len = mesh_peer_msg_encode(&in, buf, sizeof(buf));
	assert_int_equal(mesh_peer_msg_decode(buf, (size_t)len, &m, &why), 0);
	assert_int_equal(m->body_case, PEER_MSG__BODY_GOODBYE);
	assert_int_equal(m->goodbye->reason, MESH_ESHUTDOWN);
	mesh_peer_msg_free(m);
}

static void mesh_peer_msg_encode__buffer_too_small__emsgsize(void **state)
{
	Hello h = sample_hello();
	uint8_t buf[MESH_PEER_MSG_MAX];
	int len = encode_hello(&h, buf, sizeof(buf));

	(void)state;
	assert_true(len > 0);
	assert_int_equal(encode_hello(&h, buf, (size_t)len - 1), -EMSGSIZE);
	assert_int_equal(encode_hello(&h, buf, 0), -EMSGSIZE);
	assert_int_equal(encode_hello(&h, buf, (size_t)len), len);
}

static void mesh_peer_msg_decode__truncated_hello__fails_or_in_range(void **state)
{
	Hello h = sample_hello();
	uint8_t buf[MESH_PEER_MSG_MAX];
	int len = encode_hello(&h, buf, sizeof(buf));

	(void)state;
	assert_true(len > 0);
	for (int n = 0; n < len; n++) {
		/* A copy of exactly n bytes: a read past the prefix shows under valgrind/ASan. */
		uint8_t *p = malloc(n ? (size_t)n : 1);

		assert_non_null(p);
		memcpy(p, buf, (size_t)n);
		decode_checked(p, (size_t)n);
		free(p);
	}
	/* The empty message is a valid protobuf without a body: refused as such. */
	assert_int_equal(decode_checked(buf, 0), -EPROTO);
	assert_int_equal(decode_checked(buf, (size_t)len), 0);
}

/* Appends an unknown length-delimited field 15 so the encoding is exactly `total` bytes. */
static size_t pad_with_unknown_field(uint8_t *buf, size_t len, size_t total)
{
	size_t n = total - len - 4; /* tag of field 100 (2-byte varint) + length (2-byte varint) */

	assert_true(total >= len + 4 + 128 && n < 16384);
	buf[len] = (uint8_t)(0x80 | (((100 << 3) | 2) & 0x7f));
	buf[len + 1] = (uint8_t)(((100 << 3) | 2) >> 7);
	buf[len + 2] = (uint8_t)(0x80 | (n & 0x7f));
	buf[len + 3] = (uint8_t)(n >> 7);
	memset(buf + len + 4, 0xab, n);
	return total;
}

static void mesh_peer_msg_decode__oversized__emsgsize(void **state)
{
	Hello h = sample_hello();
	uint8_t *buf = calloc(1, MESH_PEER_MSG_MAX + 1);
	PeerMsg *m = NULL;
	const char *why;
	int len = encode_hello(&h, buf, MESH_PEER_MSG_MAX);

	(void)state;
	assert_non_null(buf);
	/* Exactly the limit is accepted (unknown fields are skipped)... */
	pad_with_unknown_field(buf, (size_t)len, MESH_PEER_MSG_MAX);
	assert_int_equal(mesh_peer_msg_decode(buf, MESH_PEER_MSG_MAX, &m, &why), 0);
	assert_int_equal(m->hello->node_id, 65535);
	mesh_peer_msg_free(m);
	/* ...one byte more is refused before decoding. */
	pad_with_unknown_field(buf, (size_t)len, MESH_PEER_MSG_MAX + 1);
	assert_int_equal(decode_checked(buf, MESH_PEER_MSG_MAX + 1), -EMSGSIZE);
	free(buf);
}

static void expect_hello_refused(const Hello *h, const char *field)
{
	uint8_t buf[MESH_PEER_MSG_MAX];
	PeerMsg *m = NULL;
	const char *why = NULL;
	int len = encode_hello(h, buf, sizeof(buf));
	int ret;

	assert_true(len > 0);
	ret = mesh_peer_msg_decode(buf, (size_t)len, &m, &why);
	if (ret != -EPROTO)
		fail_msg("Hello with a bad %s: decode returned %d, expected -EPROTO", field, ret);
	assert_null(m);
	assert_non_null(why);
	if (!strstr(why, field))
		fail_msg("why \"%s\" does not name %s", why, field);
}

static void mesh_peer_msg_decode__hello_node_id_70000__eproto_naming_node_id(void **state)
{
	Hello h = sample_hello();

	(void)state;
	h.node_id = 70000;
	expect_hello_refused(&h, "node_id");
	h.node_id = 65536;
	expect_hello_refused(&h, "node_id");
}

static void mesh_peer_msg_decode__hello_qp_count_0_or_17__eproto(void **state)
{
	Hello h = sample_hello();

	(void)state;
	h.qp_count = 0;
	expect_hello_refused(&h, "qp_count");
	h.qp_count = 17;
	expect_hello_refused(&h, "qp_count");
}

static void mesh_peer_msg_decode__hello_small_mailbox__eproto(void **state)
{
	Hello h = sample_hello();
	uint8_t buf[MESH_PEER_MSG_MAX];
	int len;

	(void)state;
	h.mailbox_len = MESH_MAILBOX_MIN - 1;
	expect_hello_refused(&h, "mailbox_len");
	h.mailbox_len = 0;
	expect_hello_refused(&h, "mailbox_len");
	h.mailbox_len = MESH_MAILBOX_MIN;
	len = encode_hello(&h, buf, sizeof(buf));
	assert_int_equal(decode_checked(buf, (size_t)len), 0);
}

static void mesh_peer_msg_decode__hello_bad_mailbox_addr__eproto(void **state)
{
	Hello h = sample_hello();

	(void)state;
	h.mailbox_addr = 0;
	expect_hello_refused(&h, "mailbox_addr");
	h.mailbox_addr = UINT64_MAX - 100; /* + 4096 wraps */
	expect_hello_refused(&h, "mailbox");
}

/* A ChannelAccept with a direct pair at addr under key rkey: the decoder's verdict and reason. */
static int decode_accept_direct(uint64_t addr, uint32_t rkey, const char **why)
{
	PeerMsg in = PEER_MSG__INIT, *m = NULL;
	ChannelAccept a = CHANNEL_ACCEPT__INIT;
	uint8_t buf[MESH_PEER_MSG_MAX];
	int len, ret;

	a.slot = 1;
	a.peer_slot = 2;
	a.rx_addr = 0x10000;
	a.rx_rkey = 7;
	a.credit_addr = 0x20000;
	a.credit_rkey = 8;
	a.direct_addr = addr;
	a.direct_rkey = rkey;
	in.body_case = PEER_MSG__BODY_CHANNEL_ACCEPT;
	in.channel_accept = &a;
	len = mesh_peer_msg_encode(&in, buf, sizeof(buf));
	assert_true(len > 0);
	ret = mesh_peer_msg_decode(buf, (size_t)len, &m, why);
	if (!ret)
		mesh_peer_msg_free(m);
	return ret;
}

static void mesh_peer_msg_decode__channel_direct_pair_bad_addr__eproto(void **state)
{
	const char *why = NULL;

	(void)state;
	assert_int_equal(decode_accept_direct(0, 0, &why), 0); /* none: an older meshd */
	assert_int_equal(decode_accept_direct(0x30800, 9, &why), 0);
	assert_int_equal(decode_accept_direct(0, 9, &why), -EPROTO);
	assert_non_null(strstr(why, "direct pair"));
	assert_int_equal(decode_accept_direct(UINT64_MAX - 8, 9, &why), -EPROTO); /* + 16 wraps */
	assert_non_null(strstr(why, "direct pair"));
}

/* An application's tcp offer as a peer's meshd relays it (token of tlen bytes, and a QP number). */
static int decode_app_tcp_offer(uint32_t port, size_t tlen, uint32_t qpn, const char **why)
{
	PeerMsg in = PEER_MSG__INIT, *m = NULL;
	ChannelAppQp a = CHANNEL_APP_QP__INIT;
	uint8_t buf[MESH_PEER_MSG_MAX], token[32];
	int len, ret;

	memset(token, 0x5a, sizeof(token));
	a.slot = 1;
	a.state = 1;
	a.tcp_port = port;
	a.tcp_token.data = token;
	a.tcp_token.len = tlen;
	a.qpn = qpn;
	in.body_case = PEER_MSG__BODY_CHANNEL_APP_QP;
	in.channel_app_qp = &a;
	len = mesh_peer_msg_encode(&in, buf, sizeof(buf));
	assert_true(len > 0);
	ret = mesh_peer_msg_decode(buf, (size_t)len, &m, why);
	if (!ret) {
		assert_int_equal(m->channel_app_qp->tcp_port, port);
		assert_memory_equal(m->channel_app_qp->tcp_token.data, token, tlen);
		mesh_peer_msg_free(m);
	}
	return ret;
}

static void mesh_peer_msg_decode__channel_app_qp_tcp_offer__port_and_16_byte_token_only(void **state)
{
	const char *why = NULL;

	(void)state;
	assert_int_equal(decode_app_tcp_offer(40000, 16, 0, &why), 0);
	assert_int_equal(decode_app_tcp_offer(40000, 15, 0, &why), -EPROTO);
	assert_non_null(strstr(why, "tcp_token"));
	assert_int_equal(decode_app_tcp_offer(70000, 16, 0, &why), -EPROTO);
	assert_non_null(strstr(why, "tcp_port"));
	assert_int_equal(decode_app_tcp_offer(0, 16, 0, &why), -EPROTO);
	assert_non_null(strstr(why, "tcp offer"));
	assert_int_equal(decode_app_tcp_offer(40000, 16, 0x42, &why), -EPROTO); /* and a QP's words */
	assert_non_null(strstr(why, "tcp offer"));
}

static void mesh_peer_msg_decode__no_body__eproto(void **state)
{
	PeerMsg in = PEER_MSG__INIT;
	uint8_t buf[16];
	int len;

	(void)state;
	len = mesh_peer_msg_encode(&in, buf, sizeof(buf));
	assert_int_equal(len, 0);
	assert_int_equal(decode_checked(buf, (size_t)len), -EPROTO);
	/* Only an unknown field (100, varint 1): still no body. */
	buf[0] = (uint8_t)(0x80 | ((100 << 3) & 0x7f));
	buf[1] = (uint8_t)((100 << 3) >> 7);
	buf[2] = 1;
	assert_int_equal(decode_checked(buf, 3), -EPROTO);
}

static void mesh_peer_msg_decode__random_garbage__never_crashes(void **state)
{
	Hello h = sample_hello();
	uint8_t valid[MESH_PEER_MSG_MAX];
	int vlen = encode_hello(&h, valid, sizeof(valid));
	int counts[3] = {0, 0, 0};

	(void)state;
	assert_true(vlen > 0);
	rng_state = 0x9e3779b97f4a7c15ull;
	for (int it = 0; it < 5000; it++) {
		size_t len;
		uint8_t *p;
		int ret;

		if (it % 2) {
			/* Pure noise of any length up to a little over the limit. */
			len = (size_t)(rng() % (MESH_PEER_MSG_MAX + 64));
			p = malloc(len ? len : 1);
			assert_non_null(p);
			for (size_t i = 0; i < len; i++)
				p[i] = (uint8_t)rng();
		} else {
			/* A valid Hello with a few bytes changed and maybe cut: reaches the range checks. */
			len = (size_t)vlen - (size_t)(rng() % 4);
			p = malloc(len);
			assert_non_null(p);
			memcpy(p, valid, len);
			for (int k = (int)(rng() % 3) + 1; k > 0; k--)
				p[rng() % len] = (uint8_t)rng();
		}
		ret = decode_checked(p, len);
		counts[ret == 0 ? 0 : ret == -EPROTO ? 1 : 2]++;
		free(p);
	}
	/* The mutations exercise all three outcomes. */
	assert_true(counts[0] > 0);
	assert_true(counts[1] > 0);
	assert_true(counts[2] > 0);
}

/* ---- control requests ----------------------------------------------------------------------- */

static int encode_ctl(uint32_t version, int object, uint8_t *buf, size_t len)
{
	CtlRequest r = CTL_REQUEST__INIT;
	size_t n;

	r.version = version;
	r.object = (CtlObject)object;
	n = ctl_request__get_packed_size(&r);
	assert_true(n <= len);
	return (int)ctl_request__pack(&r, buf);
}

static void mesh_ctl_req_decode__valid__decodes(void **state)
{
	uint8_t buf[64];
	CtlRequest *r = NULL;
	const char *why;
	int len;

	(void)state;
	len = encode_ctl(MESH_CTL_VERSION, CTL_OBJECT__CTL_OBJECT_LINKS, buf, sizeof(buf));
	assert_int_equal(mesh_ctl_req_decode(buf, (size_t)len, &r, &why), 0);
	assert_non_null(r);
	assert_null(why);
	assert_int_equal(r->version, MESH_CTL_VERSION);
	assert_int_equal(r->object, CTL_OBJECT__CTL_OBJECT_LINKS);
	mesh_ctl_req_free(r);
	len = encode_ctl(MESH_CTL_VERSION, CTL_OBJECT__CTL_OBJECT_NODE, buf, sizeof(buf));
	assert_int_equal(mesh_ctl_req_decode(buf, (size_t)len, &r, &why), 0);
	assert_int_equal(r->object, CTL_OBJECT__CTL_OBJECT_NODE);
	mesh_ctl_req_free(r);
	mesh_ctl_req_free(NULL);
}

static void expect_ctl_refused(const uint8_t *buf, size_t len, int want, const char *needle)
{
	CtlRequest *sentinel = (CtlRequest *)(uintptr_t)0x1, *r = sentinel;
	const char *why = NULL;
	int ret = mesh_ctl_req_decode(buf, len, &r, &why);

	if (ret != want)
		fail_msg("mesh_ctl_req_decode returned %d, expected %d (%s)", ret, want, why ? why : "");
	assert_ptr_equal(r, sentinel);
	assert_non_null(why);
	if (needle && !strstr(why, needle))
		fail_msg("why \"%s\" does not mention \"%s\"", why, needle);
}

static void mesh_ctl_req_decode__version_2__eproto(void **state)
{
	uint8_t buf[64];
	int len;

	(void)state;
	len = encode_ctl(2, CTL_OBJECT__CTL_OBJECT_LINKS, buf, sizeof(buf));
	expect_ctl_refused(buf, (size_t)len, -EPROTO, "version");
	len = encode_ctl(0, CTL_OBJECT__CTL_OBJECT_LINKS, buf, sizeof(buf));
	expect_ctl_refused(buf, (size_t)len, -EPROTO, "version");
}

static void mesh_ctl_req_decode__unknown_object_7__eproto(void **state)
{
	uint8_t buf[64];
	int len;

	(void)state;
	len = encode_ctl(MESH_CTL_VERSION, 7, buf, sizeof(buf));
	expect_ctl_refused(buf, (size_t)len, -EPROTO, "object");
	len = encode_ctl(MESH_CTL_VERSION, CTL_OBJECT__CTL_OBJECT_UNSPECIFIED, buf, sizeof(buf));
	expect_ctl_refused(buf, (size_t)len, -EPROTO, "object");
}

static void mesh_ctl_req_decode__garbage__ebadmsg(void **state)
{
	static const uint8_t bad_wire_type[] = {0x0f};            /* field 1, wire type 7 */
	static const uint8_t cut_varint[] = {0x08, 0xff};          /* version = <unterminated varint> */
	static const uint8_t cut_bytes[] = {0x1a, 0x10, 'x', 'y'}; /* field 3: 16 bytes announced, 2 given */

	(void)state;
	expect_ctl_refused(bad_wire_type, sizeof(bad_wire_type), -EBADMSG, NULL);
	expect_ctl_refused(cut_varint, sizeof(cut_varint), -EBADMSG, NULL);
	expect_ctl_refused(cut_bytes, sizeof(cut_bytes), -EBADMSG, NULL);
}

/* CTL_OP_PING: every bound of wire.h, just inside and just outside; one table, one loop. */
static void mesh_ctl_req_decode__ping_bounds__checked(void **state)
{
	static const struct {
		uint32_t node, count, interval_ms, timeout_ms;
		bool has_rail;
		uint32_t rail;
		const char *refused; /* NULL: decodes */
	} cases[] = {
		{2, 1, 0, 0, false, 0, NULL},
		{MESH_NODE_ID_MAX, MESH_PING_COUNT_MAX, MESH_PING_INTERVAL_MIN_MS, MESH_PING_TIMEOUT_MAX_MS, true,
		 MESH_RAILS_MAX - 1, NULL},
		{2, 5, MESH_PING_INTERVAL_MAX_MS, 1, false, 0, NULL},
		{MESH_NODE_ID_MAX + 1, 5, 0, 0, false, 0, "node out of range"},
		{2, 0, 0, 0, false, 0, "count out of range"},
		{2, MESH_PING_COUNT_MAX + 1, 0, 0, false, 0, "count out of range"},
		{2, 1000000, 0, 0, false, 0, "count out of range"},
		{2, 5, MESH_PING_INTERVAL_MIN_MS - 1, 0, false, 0, "interval_ms out of range"},
		{2, 5, MESH_PING_INTERVAL_MAX_MS + 1, 0, false, 0, "interval_ms out of range"},
		{2, 5, 0, MESH_PING_TIMEOUT_MAX_MS + 1, false, 0, "timeout_ms out of range"},
		{2, 5, 0, 0, true, MESH_RAILS_MAX, "rail out of range"},
		{2, 5, 0, 0, false, MESH_RAILS_MAX, NULL}, /* a rail without has_rail means nothing */
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		CtlRequest q = CTL_REQUEST__INIT, *r = NULL;
		uint8_t buf[128];
		const char *why;
		size_t len;

		q.version = MESH_CTL_VERSION;
		q.op = CTL_OP__CTL_OP_PING;
		q.node = cases[i].node;
		q.count = cases[i].count;
		q.interval_ms = cases[i].interval_ms;
		q.timeout_ms = cases[i].timeout_ms;
		q.has_rail = cases[i].has_rail;
		q.rail = cases[i].rail;
		assert_true(ctl_request__get_packed_size(&q) <= sizeof(buf));
		len = ctl_request__pack(&q, buf);
		if (cases[i].refused) {
			expect_ctl_refused(buf, len, -EPROTO, cases[i].refused);
			continue;
		}
		if (mesh_ctl_req_decode(buf, len, &r, &why))
			fail_msg("case %zu: refused: %s", i, why);
		assert_int_equal(r->op, CTL_OP__CTL_OP_PING);
		assert_int_equal(r->count, cases[i].count);
		assert_int_equal(r->interval_ms, cases[i].interval_ms);
		mesh_ctl_req_free(r);
	}
}

/* CTL_OP_CONNECT's link_wait_ms: up to a day, over it refused (the waits are held by meshd). */
static void mesh_ctl_req_decode__connect_link_wait__at_most_a_day(void **state)
{
	static const struct {
		uint32_t link_wait_ms;
		const char *refused; /* NULL: decodes */
	} cases[] = {
		{0, NULL},
		{1, NULL},
		{MESH_CONNECT_WAIT_MAX_MS, NULL},
		{MESH_CONNECT_WAIT_MAX_MS + 1, "link_wait_ms over a day"},
		{UINT32_MAX, "link_wait_ms over a day"},
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		CtlRequest q = CTL_REQUEST__INIT, *r = NULL;
		uint8_t buf[128];
		const char *why;
		size_t len;

		q.version = MESH_CTL_VERSION;
		q.op = CTL_OP__CTL_OP_CONNECT;
		q.node = 2;
		q.port = 7000;
		q.link_wait_ms = cases[i].link_wait_ms;
		len = ctl_request__pack(&q, buf);
		if (cases[i].refused) {
			expect_ctl_refused(buf, len, -EPROTO, cases[i].refused);
			continue;
		}
		if (mesh_ctl_req_decode(buf, len, &r, &why))
			fail_msg("case %zu: refused: %s", i, why);
		assert_int_equal(r->link_wait_ms, cases[i].link_wait_ms);
		mesh_ctl_req_free(r);
	}
}

/* A probe's seq (MESH_PING_SEQ): tagged, never one of our keepalives' numbers, id and number back. */
static void mesh_ping_seq__round_trip__tagged(void **state)
{
	static const struct {
		uint32_t id, n;
	} cases[] = {{1, 1}, {0x7fffffffu, 0xffffffffu}, {12345, 0}};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint64_t s = MESH_PING_SEQ(cases[i].id, cases[i].n);

		assert_true(s & MESH_PING_TAG);
		assert_int_equal(MESH_PING_SEQ_ID(s), cases[i].id);
		assert_int_equal(MESH_PING_SEQ_N(s), cases[i].n);
	}
	assert_int_equal(MESH_PING_SEQ_ID(MESH_PING_SEQ(0x80000001u, 7)), 1); /* the id wraps within 31 bits */
}

static void mesh_ctl_req_decode__4097_bytes__emsgsize(void **state)
{
	uint8_t *buf = calloc(1, MESH_CTL_REQ_MAX + 1);
	CtlRequest *r = NULL;
	const char *why;
	int len;

	(void)state;
	assert_non_null(buf);
	len = encode_ctl(MESH_CTL_VERSION, CTL_OBJECT__CTL_OBJECT_NODE, buf, MESH_CTL_REQ_MAX);
	pad_with_unknown_field(buf, (size_t)len, MESH_CTL_REQ_MAX);
	assert_int_equal(mesh_ctl_req_decode(buf, MESH_CTL_REQ_MAX, &r, &why), 0);
	assert_int_equal(r->object, CTL_OBJECT__CTL_OBJECT_NODE);
	mesh_ctl_req_free(r);
	pad_with_unknown_field(buf, (size_t)len, MESH_CTL_REQ_MAX + 1);
	expect_ctl_refused(buf, MESH_CTL_REQ_MAX + 1, -EMSGSIZE, NULL);
	free(buf);
}

/* ---- error names ---------------------------------------------------------------------------- */

static void mesh_strerror__every_mesh_code__distinct_name(void **state)
{
	(void)state;
	for (int a = MESH_ERRNO_BASE + 1; a < MESH_ERRNO_LAST; a++) {
		const char *s = mesh_strerror(-a);

		assert_non_null(s);
		if (!strcmp(s, "unknown error") || !s[0])
			fail_msg("code %d has no name", a);
		for (int b = MESH_ERRNO_BASE + 1; b < a; b++)
			if (!strcmp(s, mesh_strerror(-b)))
				fail_msg("codes %d and %d share the name \"%s\"", a, b, s);
		assert_string_not_equal(s, strerror(a));
	}
}

static void mesh_strerror__errno_values__strerror(void **state)
{
	(void)state;
	assert_string_equal(mesh_strerror(-ENOENT), strerror(ENOENT));
	assert_string_equal(mesh_strerror(-EPROTO), strerror(EPROTO));
	assert_string_equal(mesh_strerror(-ECONNRESET), strerror(ECONNRESET));
	assert_string_equal(mesh_strerror(0), "success");
}

static void mesh_strerror__outside_ranges__unknown_error(void **state)
{
	(void)state;
	assert_string_equal(mesh_strerror(-MESH_ERRNO_BASE), "unknown error");
	assert_string_equal(mesh_strerror(-MESH_ERRNO_LAST), "unknown error");
	assert_string_equal(mesh_strerror(-1999), "unknown error");
	assert_string_equal(mesh_strerror(-99999), "unknown error");
	/* Negating INT_MIN in int would be undefined: UBSan runs this too. */
	assert_string_equal(mesh_strerror(INT_MIN), "unknown error");
	assert_string_equal(mesh_strerror(INT_MAX), "unknown error");
}

/* The library's version at run time is the one mesh.h names (the project's: CMakeLists.txt checks). */
static void mesh_version__runtime__the_headers_major_and_minor(void **state)
{
	char want[32];

	(void)state;
	snprintf(want, sizeof(want), "%d.%d", MESH_VERSION_MAJOR, MESH_VERSION_MINOR);
	assert_string_equal(mesh_version(), want);
}

static const struct CMUnitTest tests[] = {
	cmocka_unit_test(mesh_version__runtime__the_headers_major_and_minor),
	cmocka_unit_test(mesh_cm_wire__size__fits_rc_private_data),
	cmocka_unit_test(mesh_cm_pdata_encode__all_fields__round_trip),
	cmocka_unit_test(mesh_cm_pdata_encode__fields__big_endian_on_wire),
	cmocka_unit_test(mesh_cm_pdata__rails__round_trip_old_senders_one_rail_bad_ones_eproto),
	cmocka_unit_test(mesh_cm_pdata_encode__buffer_too_small__enospc_untouched),
	cmocka_unit_test(mesh_cm_pdata_decode__truncated__ebadmsg),
	cmocka_unit_test(mesh_cm_pdata_decode__padded_to_56__decodes),
	cmocka_unit_test(mesh_cm_pdata_decode__bad_magic__ebadmagic),
	cmocka_unit_test(mesh_cm_pdata_decode__other_version__eprotover),
	cmocka_unit_test(mesh_cm_pdata__proof__accept_only_round_trip_truncated_eproto),
	cmocka_unit_test(mesh_cm_pdata_decode__kind_0_or_4__eproto),
	cmocka_unit_test(mesh_cm_pdata_decode__bad_qp_count_or_index__eproto),
	cmocka_unit_test(mesh_cm_pdata_decode__reject_reason__round_trips_as_negative_code),
	cmocka_unit_test(mesh_cluster_hash__known_values__fnv1a),
	cmocka_unit_test(mesh_peer_msg__hello__round_trip),
	cmocka_unit_test(mesh_peer_msg__other_bodies__round_trip),
	cmocka_unit_test(mesh_peer_msg_encode__buffer_too_small__emsgsize),
	cmocka_unit_test(mesh_peer_msg_decode__truncated_hello__fails_or_in_range),
	cmocka_unit_test(mesh_peer_msg_decode__oversized__emsgsize),
	cmocka_unit_test(mesh_peer_msg_decode__hello_node_id_70000__eproto_naming_node_id),
	cmocka_unit_test(mesh_peer_msg_decode__hello_qp_count_0_or_17__eproto),
	cmocka_unit_test(mesh_peer_msg_decode__hello_small_mailbox__eproto),
	cmocka_unit_test(mesh_peer_msg_decode__hello_bad_mailbox_addr__eproto),
	cmocka_unit_test(mesh_peer_msg_decode__channel_direct_pair_bad_addr__eproto),
	cmocka_unit_test(mesh_peer_msg_decode__channel_app_qp_tcp_offer__port_and_16_byte_token_only),
	cmocka_unit_test(mesh_peer_msg_decode__no_body__eproto),
	cmocka_unit_test(mesh_peer_msg_decode__random_garbage__never_crashes),
	cmocka_unit_test(mesh_ctl_req_decode__valid__decodes),
	cmocka_unit_test(mesh_ctl_req_decode__version_2__eproto),
	cmocka_unit_test(mesh_ctl_req_decode__unknown_object_7__eproto),
	cmocka_unit_test(mesh_ctl_req_decode__garbage__ebadmsg),
	cmocka_unit_test(mesh_ctl_req_decode__4097_bytes__emsgsize),
	cmocka_unit_test(mesh_ctl_req_decode__ping_bounds__checked),
	cmocka_unit_test(mesh_ctl_req_decode__connect_link_wait__at_most_a_day),
	cmocka_unit_test(mesh_ping_seq__round_trip__tagged),
	cmocka_unit_test(mesh_strerror__every_mesh_code__distinct_name),
	cmocka_unit_test(mesh_strerror__errno_values__strerror),
	cmocka_unit_test(mesh_strerror__outside_ranges__unknown_error),
};

UNIT_MAIN("wire", tests, NULL, NULL)
