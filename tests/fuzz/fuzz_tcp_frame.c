/*
 * Fuzz target: the tcp provider's frame decoder, tcp_frame_parse(), fed the input as a byte stream
 * the way the provider's receive path consumes it: frame after frame while it returns a length.
 *
 * Checked for every call, against an independent reading of the header (frame_expect):
 *   - the result is the frame length, 0 (more bytes needed) or -EPROTO, as the contract in
 *     tcp_wire.h says, and *why is set exactly when the frame is rejected;
 *   - a parsed frame is 32 + payload_len bytes, its payload lies inside the input, payload_len is
 *     at most TCP_FRAME_PAYLOAD_MAX and at most 56 for connect, accept and reject;
 *   - the parser never reads past len: the input is parsed from an exactly-sized heap copy, and
 *     every complete frame is parsed again cut one byte short, from its own exactly-sized copy;
 *   - tcp_frame_header() of a parsed frame gives back the same 32 header bytes, and header plus
 *     payload parse again to the same fields.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "tcp_wire.h"

/* Frames larger than this are not copied for the round trip (the input limit keeps them small). */
#define FRAME_COPY_MAX (1u << 20)

/* What tcp_frame_parse must return for the bytes at buf, read from the header layout in
 * tcp_wire.h rather than through struct tcp_frame_wire. A malformed header is rejected as soon as
 * its 32 bytes are there, without waiting for the payload. */
static long frame_expect(const uint8_t *buf, size_t len)
{
	uint8_t type;
	uint32_t plen;

	if (len < TCP_FRAME_HDR_LEN)
		return 0;
	type = buf[0];
	plen = fuzz_be32(buf + 4);
	if (type < TCP_F_CONNECT || type > TCP_F_ACK) /* a new type in tcp_wire.h goes here too */
		return -EPROTO;
	if (buf[1] || buf[2] || buf[3]) /* flags, reserved */
		return -EPROTO;
	if (plen > TCP_FRAME_PAYLOAD_MAX)
		return -EPROTO;
	switch (type) {
	case TCP_F_CONNECT:
	case TCP_F_REJECT:
		if (plen > TCP_FRAME_PDATA_MAX)
			return -EPROTO;
		break;
	case TCP_F_ACCEPT:
		if (plen > TCP_FRAME_ACCEPT_PDATA_MAX)
			return -EPROTO;
		break;
	case TCP_F_READ_REQ:
		if (plen || fuzz_be32(buf + 28) > TCP_FRAME_PAYLOAD_MAX)
			return -EPROTO;
		break;
	case TCP_F_DISCONNECT:
	case TCP_F_ACK:
		if (plen)
			return -EPROTO;
		break;
	default:
		break;
	}
	if (len - TCP_FRAME_HDR_LEN < plen)
		return 0;
	return (long)(TCP_FRAME_HDR_LEN + plen);
}

static void check_same_frame(const struct tcp_frame *a, const struct tcp_frame *b)
{
	FUZZ_CHECK(a->type == b->type);
	FUZZ_CHECK(a->payload_len == b->payload_len);
	FUZZ_CHECK(a->raddr == b->raddr);
	FUZZ_CHECK(a->id == b->id);
	FUZZ_CHECK(a->rkey == b->rkey);
	FUZZ_CHECK(a->arg == b->arg);
	FUZZ_CHECK(memcmp(a->payload, b->payload, a->payload_len) == 0);
}

/* A complete frame of n bytes was parsed into f from frame[0..n), which lies in input[0..size). */
static void check_frame(const uint8_t *input, size_t size, const uint8_t *frame, long n,
			const struct tcp_frame *f)
{
	uint8_t hdr[TCP_FRAME_HDR_LEN];
	struct tcp_frame g;
	const char *why;
	uint8_t *copy;

	FUZZ_CHECK(n == (long)(TCP_FRAME_HDR_LEN + f->payload_len));
	FUZZ_CHECK(f->payload_len <= TCP_FRAME_PAYLOAD_MAX);
	FUZZ_CHECK(f->type >= TCP_F_CONNECT && f->type <= TCP_F_ACK);
	if (f->type == TCP_F_CONNECT || f->type == TCP_F_REJECT)
		FUZZ_CHECK(f->payload_len <= TCP_FRAME_PDATA_MAX);
	if (f->type == TCP_F_ACCEPT)
		FUZZ_CHECK(f->payload_len <= TCP_FRAME_ACCEPT_PDATA_MAX);
	if (f->type == TCP_F_READ_REQ || f->type == TCP_F_DISCONNECT || f->type == TCP_F_ACK)
		FUZZ_CHECK(f->payload_len == 0);
	FUZZ_CHECK(f->payload == frame + TCP_FRAME_HDR_LEN);
	FUZZ_CHECK(f->payload >= input && f->payload + f->payload_len <= input + size);

	/* The fields are the header's, in host order. */
	FUZZ_CHECK(f->type == frame[0]);
	FUZZ_CHECK(f->payload_len == fuzz_be32(frame + 4));
	FUZZ_CHECK(f->raddr == fuzz_be64(frame + 8));
	FUZZ_CHECK(f->id == fuzz_be64(frame + 16));
	FUZZ_CHECK(f->rkey == fuzz_be32(frame + 24));
	FUZZ_CHECK(f->arg == fuzz_be32(frame + 28));

	if ((size_t)n > FRAME_COPY_MAX)
		return;

	/* Round trip: the header written back is the one read (flags and reserved are 0 in both),
	 * and it parses again, followed by the payload, to the same frame. */
	tcp_frame_header(f, hdr);
	FUZZ_CHECK(memcmp(hdr, frame, TCP_FRAME_HDR_LEN) == 0);
	copy = malloc((size_t)n);
	FUZZ_CHECK(copy != NULL);
	memcpy(copy, hdr, TCP_FRAME_HDR_LEN);
	memcpy(copy + TCP_FRAME_HDR_LEN, f->payload, f->payload_len);
	FUZZ_CHECK(tcp_frame_parse(copy, (size_t)n, &g, &why) == n);
	FUZZ_CHECK(why == NULL);
	FUZZ_CHECK(g.payload == copy + TCP_FRAME_HDR_LEN);
	check_same_frame(f, &g);
	free(copy);

	/* One byte short, from a buffer that ends there: more bytes needed, nothing read beyond. */
	copy = fuzz_dup(frame, (size_t)n - 1);
	FUZZ_CHECK(tcp_frame_parse(copy, (size_t)n - 1, &g, &why) == 0);
	FUZZ_CHECK(why == NULL);
	free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *buf = fuzz_dup(data, size);
	size_t off = 0;

	for (;;) {
		struct tcp_frame f;
		const char *why = "unset";
		long n, want;

		n = tcp_frame_parse(buf + off, size - off, &f, &why);
		want = frame_expect(buf + off, size - off);
		/* If this fails for a frame type frame_expect does not know, tcp_wire.h gained a type:
		 * add its rules there. */
		FUZZ_CHECK(n == want);
		if (n < 0) {
			FUZZ_CHECK(why != NULL && why[0] != '\0');
			break;
		}
		FUZZ_CHECK(why == NULL);
		if (n == 0)
			break;
		FUZZ_CHECK((size_t)n <= size - off);
		check_frame(buf, size, buf + off, n, &f);
		off += (size_t)n;
	}
	free(buf);
	return 0;
}
