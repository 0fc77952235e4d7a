/*
 * Frames of the tcp provider (private to it). Every frame is a fixed 32-byte big-endian header and
 * payload_len bytes of payload. The header is decoded and checked by tcp_frame_parse() before any
 * of it is used; payload bytes are copied only after the region lookup and bounds check.
 */
#ifndef MESH_TRANSPORT_TCP_WIRE_H
#define MESH_TRANSPORT_TCP_WIRE_H

#include <stddef.h>
#include <stdint.h>

enum tcp_frame_type {
	TCP_F_CONNECT = 1,  /* payload: private data (<= 56) */
	TCP_F_ACCEPT = 2,   /* payload: private data (<= 96) */
	TCP_F_REJECT = 3,   /* payload: private data (<= 56) */
	TCP_F_SEND = 4,     /* payload: message, consumes a posted receive */
	TCP_F_WRITE = 5,    /* payload to raddr in region rkey */
	TCP_F_WRITE_IMM = 6, /* as WRITE, then consumes a posted receive with imm = arg */
	TCP_F_READ_REQ = 7, /* read arg bytes at raddr in region rkey; reply READ_RESP with id */
	TCP_F_READ_RESP = 8, /* payload: the bytes read, id of the request */
	TCP_F_DISCONNECT = 9,
	TCP_F_ACK = 10,     /* the receiver applied arg more SEND/WRITE/WRITE_IMM frames */
};

#define TCP_FRAME_HDR_LEN 32u
#define TCP_FRAME_PAYLOAD_MAX (16u << 20) /* one RDMA operation; larger is a protocol error */
#define TCP_FRAME_PDATA_MAX 56u         /* CONNECT, REJECT (XPORT_CONNECT_PDATA_MAX) */
#define TCP_FRAME_ACCEPT_PDATA_MAX 96u  /* ACCEPT (XPORT_PDATA_MAX) */

struct tcp_frame_wire {
	uint8_t type;
	uint8_t flags;
	uint16_t reserved;
	uint32_t payload_len;
	uint64_t raddr;
	uint64_t id;
	uint32_t rkey;
	uint32_t arg;
};
_Static_assert(sizeof(struct tcp_frame_wire) == TCP_FRAME_HDR_LEN, "tcp frame header layout changed");

struct tcp_frame {
	uint8_t type;
	uint32_t payload_len;
	uint64_t raddr;
	uint64_t id;
	uint32_t rkey;
	uint32_t arg;
	const uint8_t *payload; /* points into the parsed buffer */
};

/* Decodes and checks the header at the start of buf, before its payload arrives: 1 with f filled
 * (f->payload NULL), 0 when fewer than 32 bytes are there, or -EPROTO with *why. */
int tcp_frame_peek(const uint8_t *buf, size_t len, struct tcp_frame *f, const char **why);
/* Parses the frame at the start of buf. Returns its total length (header + payload) when complete,
 * 0 when more bytes are needed, or -EPROTO with *why naming the problem. Never reads past len. */
long tcp_frame_parse(const uint8_t *buf, size_t len, struct tcp_frame *f, const char **why);
/* Writes the 32-byte header of f into out. */
void tcp_frame_header(const struct tcp_frame *f, uint8_t out[TCP_FRAME_HDR_LEN]);

#endif
