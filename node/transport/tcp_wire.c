#include <endian.h>
#include <errno.h>
#include <string.h>

#include "tcp_wire.h"

int tcp_frame_peek(const uint8_t *buf, size_t len, struct tcp_frame *f, const char **why)
{
	struct tcp_frame_wire w;
	uint32_t plen;

	*why = NULL;
	if (len < TCP_FRAME_HDR_LEN)
		return 0;
	memcpy(&w, buf, sizeof(w));
	plen = be32toh(w.payload_len);
	if (w.type < TCP_F_CONNECT || w.type > TCP_F_ACK) {
		*why = "unknown frame type";
		return -EPROTO;
	}
	if (w.flags || w.reserved) {
		*why = "reserved header bits set";
		return -EPROTO;
	}
	if (plen > TCP_FRAME_PAYLOAD_MAX) {
		*why = "payload longer than 16 MiB";
		return -EPROTO;
	}
	switch (w.type) {
	case TCP_F_CONNECT:
	case TCP_F_REJECT:
		if (plen > TCP_FRAME_PDATA_MAX) {
			*why = "private data longer than 56 bytes";
			return -EPROTO;
		}
		break;
	case TCP_F_ACCEPT:
		if (plen > TCP_FRAME_ACCEPT_PDATA_MAX) {
			*why = "accept private data longer than 96 bytes";
			return -EPROTO;
		}
		break;
	case TCP_F_READ_REQ:
		if (plen) {
			*why = "read request with payload";
			return -EPROTO;
		}
		if (be32toh(w.arg) > TCP_FRAME_PAYLOAD_MAX) {
			*why = "read request longer than 16 MiB";
			return -EPROTO;
		}
		break;
	case TCP_F_DISCONNECT:
	case TCP_F_ACK:
		if (plen) {
			*why = w.type == TCP_F_ACK ? "ack with payload" : "disconnect with payload";
			return -EPROTO;
		}
		break;
	default:
		break;
	}
	f->type = w.type;
	f->payload_len = plen;
	f->raddr = be64toh(w.raddr);
	f->id = be64toh(w.id);
	f->rkey = be32toh(w.rkey);
	f->arg = be32toh(w.arg);
	f->payload = NULL;
	return 1;
}

long tcp_frame_parse(const uint8_t *buf, size_t len, struct tcp_frame *f, const char **why)
{
	int ret = tcp_frame_peek(buf, len, f, why);

	if (ret <= 0)
		return ret;
	if (len - TCP_FRAME_HDR_LEN < f->payload_len)
		return 0;
	f->payload = buf + TCP_FRAME_HDR_LEN;
	return (long)(TCP_FRAME_HDR_LEN + f->payload_len);
}

void tcp_frame_header(const struct tcp_frame *f, uint8_t out[TCP_FRAME_HDR_LEN])
{
	struct tcp_frame_wire w = {
		.type = f->type,
		.payload_len = htobe32(f->payload_len),
		.raddr = htobe64(f->raddr),
		.id = htobe64(f->id),
		.rkey = htobe32(f->rkey),
		.arg = htobe32(f->arg),
	};

	memcpy(out, &w, sizeof(w));
}
